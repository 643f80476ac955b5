"""The documentation site as a reader gets it: built strictly (``make docs``), every
page is read offline, and the references read as prose (no Sphinx roles, no click
sentinels)."""

from __future__ import annotations

import builtins
import enum
import importlib
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What a page loads (not a link the reader follows).
LOADED = re.compile(
    r"<(?:script|link|img|iframe|source|audio|video)\b[^>]*\b(?:src|href)=\"([^\"]*)\""
)
#: A Sphinx role left as text (``:meth:`` before the code it names).
ROLE_TEXT = re.compile(r":(?:meth|func|class|attr|exc|data|mod|obj):(?:<code>|`)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(
        build, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return out


def _pages(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): p.read_text("utf-8") for p in site.glob("**/*.html")}


def test_no_page_loads_anything_from_another_host(site: Path) -> None:
    for name, html in _pages(site).items():
        remote = [url for url in LOADED.findall(html) if "//" in url]
        assert not remote, f"{name} loads {remote}"


def test_the_python_reference_has_no_sphinx_role_left_and_links_the_names(site: Path) -> None:
    api = (site / "reference" / "api.html").read_text("utf-8")
    assert not ROLE_TEXT.findall(api), ROLE_TEXT.findall(api)[:5]
    # Queue.put's ":class:`~delayq.DuplicateId`": the short name, linked to the error.
    assert re.search(
        r'<a [^>]*href="#delayq\.errors\.DuplicateId"[^>]*><code>DuplicateId</code>', api
    )
    for name, html in _pages(site).items():
        assert not ROLE_TEXT.findall(html), name


def test_the_command_line_reference_shows_no_click_sentinel(site: Path) -> None:
    cli = (site / "reference" / "cli.html").read_text("utf-8")
    assert "delayq dead" in cli
    assert "Sentinel" not in cli
    assert "UNSET" not in cli


@pytest.mark.parametrize("package", ["delayq", "delayq.runtime", "delayq.testing"])
def test_every_public_name_has_an_entry_in_the_python_reference(site: Path, package: str) -> None:
    """A name a reader imports (or meets in a signature: ``Task.message`` returns a
    ``TaskMessage``) can be looked up."""
    api = (site / "reference" / "api.html").read_text("utf-8")
    entries = {anchor.rsplit(".", 1)[-1] for anchor in re.findall(r'id="delayq\.([\w.]+)"', api)}
    names = importlib.import_module(package).__all__
    missing = [name for name in names if not name.startswith("__") and name not in entries]
    assert not missing, f"{package}: no entry for {missing}"


def test_the_python_reference_signatures_show_default_values(site: Path) -> None:
    """``Worker(concurrency: int = 8)``, not the name of a constant the reader cannot see."""
    api = (site / "reference" / "api.html").read_text("utf-8")
    signatures = " ".join(re.findall(r'<div class="doc-signature.*?</div>', api, re.DOTALL))
    assert signatures
    text = re.sub(r"<[^>]+>", "", signatures)
    assert not re.findall(r"= [A-Z][A-Z0-9_]{3,}\b", text), re.findall(r"= [A-Z]\w+", text)
    assert 'queue: str = "default"' in text.replace("&quot;", '"')


def test_the_changelog_that_operations_points_to_is_on_the_site(site: Path) -> None:
    operations = (site / "operations.html").read_text("utf-8")
    assert 'href="changelog.html"' in operations
    changelog = (site / "changelog.html").read_text("utf-8")
    versions = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text("utf-8"), re.M)
    assert versions
    shown = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<h2[^>]*>(.*?)</h2>", changelog)]
    assert [h.replace("&para;", "").strip() for h in shown] == [v.strip() for v in versions]


#: The queues whose methods live partly on a base the reader never imports.
_QUEUES = (
    "delayq.durable.Queue",
    "delayq.durable.AsyncQueue",
    "delayq.inproc.DelayQueue",
    "delayq.inproc.AsyncDelayQueue",
)


def test_the_python_reference_names_no_base_a_reader_cannot_look_up(site: Path) -> None:
    """A class's "Bases:" names a class of the page or Python's own (``Exception``,
    ``Protocol``), never a private half such as ``QueueBase``; and each queue shows
    what it has from its bases (``Queue.name``, ``DelayQueue.put``) as its own."""
    api = (site / "reference" / "api.html").read_text("utf-8")
    anchors = set(re.findall(r'id="(delayq\.[\w.]+)"', api))
    entries = {anchor.rsplit(".", 1)[-1] for anchor in anchors}
    python = set(dir(builtins)) | set(dir(typing)) | set(dir(enum))
    shown = [re.sub(r"<[^>]+>", " ", bases) for bases in re.findall(r"Bases:(.*?)</p>", api, re.S)]
    assert shown
    for bases in shown:
        named = bases
        while re.search(r"\[[^\[\]]*\]", named):  # QueueCore[T] -> QueueCore
            named = re.sub(r"\[[^\[\]]*\]", "", named)
        unknown = [name for name in re.findall(r"\w+", named) if name not in entries | python]
        assert not unknown, f"Bases: {' '.join(bases.split())}"
    for path in _QUEUES:
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        public = {
            member
            for member, value in inspect.getmembers(cls)
            if not member.startswith("_") and inspect.getdoc(value)
        }
        missing = sorted(member for member in public if f"{path}.{member}" not in anchors)
        assert not missing, f"{path}: no entry for {missing}"
