"""What `pip install .` puts in site-packages: exactly one top-level import package, `oncemesh`, with
its data files, importable without the checkout (the editable install of the test run is another
path to the same names: tests/unit/test_imports.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_one_package_that_works_without_the_checkout(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, timeout=300, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("oncemesh-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"oncemesh"}, tops
    assert "oncemesh/py.typed" in names and "oncemesh/topology/examples/line3.toml" in names
    assert {f"oncemesh/topology/deploy/{f}" for f in ("oncemesh@.service", "Containerfile", "make-pki.sh",
                                                       "mesh-3hosts.toml")} <= set(names)
    assert "oncemesh/router/console/index.html" in names
    assert not any(n.startswith("oncemesh/tests/") for n in names)

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(site), str(wheel)], check=True, timeout=300, cwd=tmp_path)
    probe = ("import json, oncemesh, oncemesh.router.core, oncemesh.interrouter.mesh, oncemesh.spark.job\n"
             "from oncemesh.topology.load import example_path\n"
             "print(json.dumps({'facade': oncemesh.__file__, 'core': oncemesh.router.core.__file__,\n"
             "  'example': str(example_path('line3.toml')), 'exists': example_path('line3.toml').exists(),\n"
             "  'connect': callable(oncemesh.connect)}))\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=env)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    for key in ("facade", "core", "example"):
        assert got[key].startswith(str(site)), got  # not the checkout
    assert got["exists"] and got["connect"]
    cli = subprocess.run([sys.executable, "-m", "oncemesh", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert cli.returncode == 0 and "oncemesh router" not in cli.stderr and "demo" in cli.stdout
