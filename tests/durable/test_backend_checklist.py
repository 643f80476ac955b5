"""docs/backends.md's checklist, held against the code: every backend of the registry
has each thing the page says a backend needs (its driver, its line in the lint
contract and the extras, its entries in the suites, in ``.ci/run`` and in the docs),
so that the page stays true and a new backend that skips a step fails here, naming it."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

from delayq.durable import registry
from delayq.durable.descriptor import BackendDescriptor, BackendDriver

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
DESCRIPTORS = {descriptor.name: descriptor for descriptor in registry.descriptors()}
#: Steps a backend being built has not reached yet, each with where it is planned: its
#: test is an expected failure (strict: once the step is done, the entry must go).
PENDING: dict[tuple[str, str], str] = {}


def _pending(request: pytest.FixtureRequest, backend: BackendDescriptor, step: str) -> None:
    reason = PENDING.get((backend.name, step))
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def _module_of(descriptor: BackendDescriptor) -> str:
    for module in registry.BACKENDS:
        if importlib.import_module(module).DESCRIPTOR is descriptor:
            return module
    raise AssertionError(f"{descriptor.name} is in no entry of registry.BACKENDS")


def _dict_keys(path: Path, name: str) -> set[str]:
    """The string keys of the dict literal assigned to ``name`` at the top of ``path``."""
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name:
            assert isinstance(node.value, ast.Dict), f"{path}: {name} is not a dict literal"
            return {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    raise AssertionError(f"{path} has no {name}")


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def _needs_a_server(descriptor: BackendDescriptor) -> bool:
    """A backend whose client library is an extra talks to a server of its own."""
    return descriptor.extra is not None


@pytest.fixture(params=sorted(DESCRIPTORS))
def backend(request: pytest.FixtureRequest) -> BackendDescriptor:
    return DESCRIPTORS[request.param]


def test_step_1_and_2_its_package_exports_a_descriptor_and_a_driver(
    backend: BackendDescriptor,
) -> None:
    package = Path(importlib.import_module(_module_of(backend)).__file__ or "").parent
    assert (package / "_driver.py").is_file(), f"{package} has no _driver.py"
    assert (package / "_async" / "backend.py").is_file()
    assert (package / "_sync" / "backend.py").is_file(), "the generated sync face"
    assert isinstance(backend.load(), BackendDriver)


def test_step_3_its_line_in_the_lint_contract_and_its_extra(backend: BackendDescriptor) -> None:
    project = _pyproject()
    contracts = project["tool"]["importlinter"]["contracts"]  # type: ignore[index]
    independent = next(c for c in contracts if c["type"] == "independence")
    assert _module_of(backend) in independent["modules"], "the independence contract"
    if backend.extra is None:
        return
    extras = project["project"]["optional-dependencies"]  # type: ignore[index]
    assert backend.extra in extras, f"pyproject.toml has no extra {backend.extra!r}"
    for requirement in extras[backend.extra]:
        assert re.search(r"[<>]=?\s*[\d.]+.*<", requirement) or "<" in requirement, (
            f"{requirement!r}: a declared version range, both ends"
        )
    dev = " ".join(extras["dev"])
    bundled = re.search(r"delayq\[([^\]]*)\]", dev)
    assert bundled is not None
    assert backend.extra in bundled.group(1).split(","), "the dev extra installs it"


def test_tested_1_the_conformance_and_server_suites_take_it(
    backend: BackendDescriptor, request: pytest.FixtureRequest
) -> None:
    _pending(request, backend, "suites")
    assert backend.name in _dict_keys(TESTS / "conformance" / "conftest.py", "BACKENDS")
    assert backend.name in _dict_keys(TESTS / "server" / "conftest.py", "BACKENDS")
    assert backend.name in _dict_keys(TESTS / "durable" / "test_url_options.py", "CASES")


def test_tested_2_and_3_a_missing_extra_and_ci_require_it(backend: BackendDescriptor) -> None:
    if not _needs_a_server(backend):
        return
    assert backend.name in _dict_keys(TESTS / "cli" / "test_missing_extra.py", "BACKENDS")
    ci = (ROOT / ".ci" / "run").read_text()
    required = re.search(r"DELAYQ_REQUIRE=(\S+) make test\b", ci)
    assert required is not None, ".ci/run runs make test with DELAYQ_REQUIRE"
    assert backend.name in required.group(1).split(","), ".ci/run requires its server"


def test_tested_5_and_6_its_own_tests_mistakes_and_worker_processes(
    backend: BackendDescriptor, request: pytest.FixtureRequest
) -> None:
    _pending(request, backend, "suites")
    if backend.name == "memory":  # no server, no file: the conformance suite is all of it
        return
    own = sorted((TESTS / "backends").glob(f"test_{backend.name}*.py"))
    own += sorted((TESTS / "e2e").glob(f"test_{backend.name}*.py"))
    assert own, f"tests/backends/test_{backend.name}*.py"
    assert backend.name in _dict_keys(TESTS / "e2e" / "_apps.py", "STORES")
    if _needs_a_server(backend):
        mistakes = TESTS / "backends" / f"_{backend.name}_mistakes.py"
        assert mistakes.is_file(), f"{mistakes.name}: each way its server refuses, one line"


def test_tested_8_the_docs_name_it(backend: BackendDescriptor) -> None:
    scheme = f"{backend.schemes[0]}://"
    pages = ["architecture.md", "choosing-a-backend.md"]
    if backend.name != "memory":  # nothing to operate, nothing durable
        pages += ["operations.md", "durability.md"]
    for page in pages:
        assert scheme in (ROOT / "docs" / page).read_text(), f"docs/{page} names {scheme}"
