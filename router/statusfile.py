"""The router's ready/status file, written off the event loop.

Why a thread: the file is replaced atomically (written as `.tmp`, renamed into place: a reader never
sees half of one), and a rename over an existing file on ext4 first writes the new file's data
(`auto_da_alloc`). Measured on a router at 1,000 msg/s: 2.7 ms per status write on the loop, ten
times that when other processes were writing, twice a second then: a pause of every message in flight
(docs/performance.md, "Latency"). The loop now only encodes the JSON; one thread writes the newest
text. Only the newest matters: a text not written yet is replaced by a newer one. The router looks at
its status once a second and hands a text over only when it changed (router/server.py,
`STATUS_INTERVAL`).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger("oncemesh.router")


def write_atomically(path: Path, text: str, tmp: Path | None = None) -> None:
    """`text` into `path`, replaced whole (through `tmp`, by default `path` + `.tmp`). The directory
    is made if it is missing."""
    if tmp is None:
        tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text)
    except FileNotFoundError:  # (the directory first: not on every write, a stat and a mkdir each)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
    os.replace(tmp, path)


class StatusFile:
    """Writes `path` from a worker thread; `write` never blocks on the disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._text: str | None = None  # the newest text not written yet
        self._busy = False  # the worker is writing a text now
        self._closed = False
        self._thread: threading.Thread | None = None
        self._tmp = path.with_suffix(path.suffix + ".tmp")
        self.written = 0

    def write(self, text: str) -> None:
        """Have `text` written soon (the loop's side: a lock and a notify, no I/O)."""
        with self._cond:
            if self._closed:
                return
            self._text = text
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="status-file", daemon=True)
                self._thread.start()
            self._cond.notify_all()  # (the worker; `flush` waits on the same condition)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._text is None and not self._closed:
                    self._cond.wait()
                text, self._text = self._text, None
                if text is None:  # closed, nothing left
                    return
                self._busy = True
            try:
                write_atomically(self.path, text, self._tmp)
                self.written += 1
            except OSError as exc:  # (a full disk: the next status tries again)
                log.warning("router.status_not_written path=%s error=%s", self.path, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until what was given to `write` is on disk (bounded)."""
        with self._cond:
            self._cond.wait_for(lambda: self._text is None and not self._busy, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is pending, then stop the worker: nothing is written after this returns."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
