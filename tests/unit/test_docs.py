"""The docs stand alone: the code map is complete, and every citation leads to a page of the repository.

- docs/architecture.md's code map names every Python file of the product (the folders of pyproject's
  package-dir) and no file that is gone;
- nothing in the repository cites the design notes kept outside it (the sibling `shared` folder of
  the project's work space); the promises are in docs/promises.md;
- a "promise N" that a file cites is one docs/promises.md has (anchor `promise-N`);
- a section that a citation names (`docs/X.md, "Title"` or `X.md ("Title")`) is still in that page.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE_DIRS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"]

# written in two pieces so that this file does not match itself
OUTSIDE = re.compile("DESIG" + r"N\b|\.\./" + "shared")
PROMISE = re.compile(r"promises\.md(?:#promise-|[^\n]{0,30}?\bpromises? )(\d+)")
SECTION = re.compile(r"(?:docs/)?([a-z-]+)\.md(?:,\s*|\s*\()\s*\"([^\"\n]+)\"")
# the CI script names the sibling folder it clones the work space's notes into
SKIP_PREFIXES = (".ci/",)
TEXT_SUFFIXES = (".py", ".md", ".toml", ".txt", ".sh", ".html", ".cfg", ".ini", ".service", ".conf", "")


def product_files() -> set[str]:
    """Every .py file of the product, as a path from the repository's root."""
    out: set[str] = set()
    for folder in PACKAGE_DIRS.values():
        for f in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in f.parts:
                out.add(f.relative_to(ROOT).as_posix())
    return out


def code_map(text: str) -> set[str]:
    """The files named in the fenced block of the "Code map" section: a line `folder/  ...` starts a
    folder, an indented line `  name.py  ...` names a file in it."""
    section = re.search(r"^## Code map\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "docs/architecture.md has no \"## Code map\" section"
    block = section.group(1).split("```", 2)[1]
    named: set[str] = set()
    folder = ""
    for line in block.splitlines():
        head = re.match(r"([a-z_]+(?:/[a-z_]+)*/)(?:\s|$)", line)
        if head:
            folder = head.group(1)
            continue
        file = re.match(r"\s{2}([A-Za-z0-9_]+\.py)(?:\s|$)", line)
        if file:
            named.add(folder + file.group(1))
    return named


def repository_files() -> list[Path]:
    """The files the repository holds (git's index; the work tree when there is no git)."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
        names = listed.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()
                 and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts)]
    return [ROOT / n for n in names
            if not n.startswith(SKIP_PREFIXES) and Path(n).suffix in TEXT_SUFFIXES and (ROOT / n).is_file()]


def texts() -> dict[str, str]:
    out: dict[str, str] = {}
    for f in repository_files():
        try:
            out[f.relative_to(ROOT).as_posix()] = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def test_the_code_map_names_every_product_file_and_no_other() -> None:
    named = code_map((DOCS / "architecture.md").read_text())
    files = product_files()
    assert files, "no product files found: pyproject's package-dir moved?"
    assert not files - named, f"add to docs/architecture.md's code map: {sorted(files - named)}"
    assert not named - files, f"gone, still in docs/architecture.md's code map: {sorted(named - files)}"


def test_a_file_left_out_of_the_code_map_is_seen() -> None:
    text = (DOCS / "architecture.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("  identity.py "))
    assert "router/identity.py" in code_map(text)
    assert product_files() - code_map(text.replace(line + "\n", "")) == {"router/identity.py"}


def test_nothing_cites_notes_outside_the_repository() -> None:
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for name, text in texts().items() for m in OUTSIDE.finditer(text)]
    assert not found, "cite docs/promises.md (or the docs page that says it) instead:\n" + "\n".join(found)


def test_every_cited_promise_is_on_the_promises_page() -> None:
    page = (DOCS / "promises.md").read_text()
    anchors = {int(n) for n in re.findall(r'<a id="promise-(\d+)"></a>', page)}
    assert anchors == set(range(1, 10)), anchors
    cited = {(name, int(m.group(1))) for name, text in texts().items() for m in PROMISE.finditer(text)}
    assert cited, "no file cites a promise: the pattern is stale"
    assert not {(name, n) for name, n in cited if n not in anchors}


def test_every_cited_section_is_still_in_its_page() -> None:
    def norm(s: str) -> str:
        return " ".join(s.replace("`", "").replace("*", "").lower().split())

    pages = {p.stem: norm(p.read_text()) for p in DOCS.glob("*.md")}
    missing = []
    for name, text in texts().items():
        for m in SECTION.finditer(text):
            page, title = m.group(1), m.group(2)
            if page in pages and norm(title) not in pages[page]:
                missing.append(f"{name}: {page}.md, {title!r}")
    assert not missing, "\n".join(missing)
