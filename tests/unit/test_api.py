"""The public face: `import oncemesh` gives the client API and the errors, documented; one error tree
whose classes carry their AMQP conditions, and no condition written anywhere else."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import oncemesh
from oncemesh.common import errors, vocab

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("api", "common", "router", "interrouter", "clients", "topology", "spark", "harness")


def test_the_facade_exports_the_client_api_and_the_errors() -> None:
    for name in ("connect", "Client", "Publisher", "Subscriber", "AsyncClient", "AsyncPublisher",
                 "AsyncSubscriber", "Delivered", "Result", "Outcome", "OncemeshError", "ClientError",
                 "LinkRefused", "NoRouterAvailable"):
        assert name in oncemesh.__all__, name
    assert sorted(oncemesh.__all__) == sorted(set(oncemesh.__all__))
    for name in oncemesh.__all__:
        assert getattr(oncemesh, name) is not None
    assert oncemesh.Outcome is vocab.Outcome  # one enum, whatever the path


def test_everything_public_has_a_docstring() -> None:
    missing = []
    for name in oncemesh.__all__:
        obj = getattr(oncemesh, name)
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                # on_* are the engine's callbacks (the adapter interface), not for applications
                if member.startswith(("_", "on_")) or not callable(value):
                    continue
                if not (value.__doc__ or "").strip():
                    missing.append(f"{name}.{member}")
    assert not missing, missing


def test_every_error_carries_its_condition() -> None:
    classes = [c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, errors.OncemeshError)]
    assert len(classes) > 15
    for c in classes:
        assert re.fullmatch(r"(amqp|oncemesh):[a-z-]+(:[a-z-]+)?", c.condition), (c, c.condition)
    assert issubclass(errors.LinkRefused, errors.ClientError) and issubclass(errors.ClientError, errors.OncemeshError)
    refused = errors.LinkRefused("amqp:unauthorized-access", "reserved")
    assert refused.condition == "amqp:unauthorized-access" and errors.LinkRefused.condition == "oncemesh:client-error"


def test_no_condition_is_written_outside_the_error_tree() -> None:
    found = []
    for folder in PACKAGE_FOLDERS:
        for f in (ROOT / folder).rglob("*.py"):
            if f == ROOT / "common" / "errors.py":
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and re.match(r"amqp:[a-z]", node.value)):
                    found.append(f"{f.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "name errors.SomeError.condition instead:\n" + "\n".join(found)


def test_the_readme_example_uses_the_public_api() -> None:
    readme = (ROOT / "README.md").read_text()
    code = readme[readme.index("```python") + len("```python"):]
    code = code[: code.index("```")]
    assert "import oncemesh" in code or "from oncemesh import" in code
    tree = ast.parse(code)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "oncemesh"
                for a in n.names}
    assert imported <= set(oncemesh.__all__), imported - set(oncemesh.__all__)
    assert not re.search(r"\b(from|import) (clients|router|oncemesh\.clients)\b", code)
