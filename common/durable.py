"""Files that survive a crash: written whole or not at all, and on the disk before the caller goes on."""

from __future__ import annotations

import os
from pathlib import Path


def write_durably(path: Path, data: bytes | str) -> None:
    """Replace `path` with `data` atomically and durably: a temporary file beside it, fsync'ed,
    renamed over `path`, then the directory fsync'ed (the rename itself on the disk). A crash
    leaves the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
