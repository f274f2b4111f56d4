"""What strict decoders of inter-router messages share (`ordercodec`, `lamportcodec`, `codec`)."""

from __future__ import annotations


def show(v: object) -> str:
    """What we got, briefly, for an error message: garbage may be huge or deeply nested."""
    if isinstance(v, str):
        return f"str {v[:40]!r}"
    if isinstance(v, list | tuple | dict):
        return f"{type(v).__name__} of {len(v)}"
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"int of {v.bit_length()} bits"
    return f"{type(v).__name__} {v!r:.40}"
