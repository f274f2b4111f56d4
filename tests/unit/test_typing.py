"""The type checker's silences in the product: at most MAX_IGNORES `type: ignore` in its folders, each
naming the error it silences and saying why on the same line, after it:

    x = lib.thing  # type: ignore[attr-defined]  # the library's stub lacks `thing`

A `type: ignore` is for what the checker cannot know (a library's wrong or missing annotation); our
own code is typed so that it needs none (final classes and `type(x) is C` for dispatch, typed
helpers, Protocols).
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "common", "router", "interrouter", "clients", "topology", "spark", "harness")
MAX_IGNORES = 10

# `type: ignore` (in a comment), its error codes, and what follows on the line
_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")
_REASON = re.compile(r"^\s*#\s*\S.{9,}")  # a comment of its own, of some words

def ignores_in(source: str) -> list[tuple[int, str, bool]]:
    """(line, the line's text, whether it names its codes and gives a reason) for each `type: ignore`
    comment of `source` (comments only: the words in a string are no silence)."""
    out = []
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        m = _IGNORE.search(tok.string)
        if m is not None:
            ok = m.group("codes") is not None and _REASON.match(m.group("rest")) is not None
            out.append((tok.start[0], lines[tok.start[0] - 1].strip(), ok))
    return out


def product_ignores() -> list[tuple[str, int, str, bool]]:
    out = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            out += [(rel, n, text, ok) for n, text, ok in ignores_in(path.read_text())]
    return out


def test_the_scanner_finds_silences_and_their_reasons() -> None:
    src = (
        "a = f()  # type: ignore[arg-type]  # the library's stub types f's result as None\n"
        "b = g()  # type: ignore[arg-type]\n"
        "c = h()  # type: ignore  # no code named, whatever the reason says\n"
        "d = 'type: ignore in a string is no silence'\n"
        "e = k()  # type: ignore[misc]  # ok\n"
    )
    assert [(n, ok) for n, _, ok in ignores_in(src)] == [(1, True), (2, False), (3, False), (5, False)]


def test_the_product_keeps_at_most_ten_silences() -> None:
    found = product_ignores()
    listing = "\n".join(f"{p}:{n}: {text}" for p, n, text, _ in found)
    assert len(found) <= MAX_IGNORES, f"{len(found)} `type: ignore` in the product (at most {MAX_IGNORES}):\n{listing}"


def test_every_silence_says_what_and_why() -> None:
    found = product_ignores()
    bare = [f"{p}:{n}: {text}" for p, n, text, ok in found if not ok]
    assert not bare, "a `type: ignore` without its error code and a reason after it:\n" + "\n".join(bare)
