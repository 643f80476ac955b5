"""The wheel as pip builds it holds every file delayq reads at run time.

Tests that read ``importlib.resources`` run against the source tree, where every file
is there whatever the build keeps: only a built wheel shows a template, a static file,
a Lua script, the SQLite schema or ``py.typed`` left out. The wheel is built by pip
without build isolation (the build backend, hatchling, is in the dev extra), into a
temporary directory, and read as a zip.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "delayq"


def _shipped_files() -> set[str]:
    """Every file of the package in the source tree that a wheel must carry (not
    bytecode), as paths inside the wheel."""
    return {
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    argv += ["--no-index", "--quiet", "--wheel-dir", str(out), str(ROOT)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [built] = out.glob("delayq-*.whl")
    return zipfile.ZipFile(built)


@pytest.mark.timeout(180)
def test_the_wheel_carries_every_file_of_the_package(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    shipped = _shipped_files()
    assert shipped - names == set()
    wanted = {
        "delayq/py.typed",
        "delayq/backends/redis/scripts/lib.lua",
        "delayq/backends/redis/scripts/put.lua",
        "delayq/backends/sqlite/schema.sql",
        "delayq/server/templates/base.html",
        "delayq/server/static/dashboard.js",
        "delayq/server/static/dashboard.css",
    }
    assert wanted <= names
    assert sum(name.endswith(".lua") for name in names) >= 20
    # Nothing of the repository beside the package (tests, docs, caches).
    outside = {n for n in names if not n.startswith(("delayq/", "delayq-"))}
    assert outside == set()
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)


@pytest.mark.timeout(180)
def test_the_wheel_declares_the_command_and_the_extras(wheel: zipfile.ZipFile) -> None:
    [metadata] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    text = wheel.read(metadata).decode()
    for extra in ("redis", "postgres", "amqp", "kafka", "serve", "otel", "dev"):
        assert f"Provides-Extra: {extra}" in text
    [entry_points] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "delayq = delayq.cli:main" in wheel.read(entry_points).decode()
