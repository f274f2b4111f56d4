"""What the strict decoders of inter-router messages share (`ordercodec`, `lamportcodec`, `codec`):
the error they raise, and checks of one field each that name the field and what came instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


class FrameError(ValueError):
    """A frame that does not parse: the peer is broken or not an oncemesh router."""


def show(v: object) -> str:
    """What we got, briefly, for an error message: garbage may be huge or deeply nested."""
    if isinstance(v, str):
        return f"str {v[:40]!r}"
    if isinstance(v, list | tuple | dict):
        return f"{type(v).__name__} of {len(v)}"
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"int of {v.bit_length()} bits"
    return f"{type(v).__name__} {v!r:.40}"


class Fields:
    """Field checks for one kind of message ("order", "lamport"): each returns the value or raises
    `FrameError("malformed KIND message: WHERE: expected ..., got ...")`; nothing is coerced."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def bad(self, what: str) -> NoReturn:
        raise FrameError(f"malformed {self.kind} message: {what}")

    def int_from(self, low: int) -> Callable[[object, str], int]:
        def dec(v: object, where: str) -> int:
            if type(v) is not int or v < low:
                self.bad(f"{where}: expected an int >= {low}, got {show(v)}")
            return v
        return dec

    def string(self, v: object, where: str) -> str:
        if type(v) is not str:
            self.bad(f"{where}: expected a string, got {show(v)}")
        return v

    def boolean(self, v: object, where: str) -> bool:
        if type(v) is not bool:
            self.bad(f"{where}: expected a bool, got {show(v)}")
        return v

    def seq(self, v: object, where: str, n: int = -1) -> list[Any] | tuple[Any, ...]:
        if not isinstance(v, list | tuple):
            self.bad(f"{where}: expected a list, got {show(v)}")
        if n >= 0 and len(v) != n:
            self.bad(f"{where}: expected {n} elements, got {len(v)}")
        return v
