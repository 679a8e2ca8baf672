"""The import structure, continued: one Registry class for every strategy kind, calibration's
sub-packages and their layering (type-only imports included), and no re-export shims.  The import
graph and its readers are :mod:`tests.test_import_structure`'s."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from simulator.memory import POLICIES as MEMORY_POLICIES
from simulator.ops.autoscale import POLICIES
from simulator.pd.connectors import CONNECTORS
from simulator.pd.flows import FLOWS
from simulator.plan.families import FAMILIES
from simulator.registry import Registry
from simulator.roles import ROLES
from simulator.routing import ROUTERS
from tests.conftest import REPO
from tests.test_import_structure import cycles, imports_of, project_modules

# Every registry of named strategies in simulator/: one Registry class for all (one duplicate check,
# one unknown-name message, registration order everywhere).
REGISTRIES = {
    ("simulator.routing", "ROUTERS"): ROUTERS,
    ("simulator.ops.autoscale", "POLICIES"): POLICIES,
    ("simulator.roles", "ROLES"): ROLES,
    ("simulator.pd.flows", "FLOWS"): FLOWS,
    ("simulator.plan.families", "FAMILIES"): FAMILIES,
    ("simulator.memory", "POLICIES"): MEMORY_POLICIES,
    ("simulator.pd.connectors", "CONNECTORS"): CONNECTORS,
}
REGISTRY_NAME = re.compile(r"(?:^|_)(?:REGISTRY|ROUTERS|POLICIES|ROLES|FLOWS|FAMILIES|AUTOSCALERS|CONNECTORS)$")
# Module-level names that read as a registry but are not a Registry, each with why; none may be added.
ALLOWED_PLAIN_REGISTRIES: dict[tuple[str, str], str] = {}


def test_every_strategy_registry_is_the_one_registry_class():
    """The seven are Registry objects; no other module-level ``Registry(...)`` exists, and no name such as
    ``*_REGISTRY``, ``ROUTERS`` or ``FLOWS`` is bound to a plain dict or comprehension instead."""
    assert all(isinstance(reg, Registry) for reg in REGISTRIES.values())
    built, plain = set(), {}
    for module, path in project_modules().items():
        for node in ast.parse(path.read_text(), str(path)).body if module.startswith("simulator.") else ():
            ann = isinstance(node, ast.AnnAssign)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if ann else []
            for name in (t.id for t in targets if isinstance(t, ast.Name) and node.value is not None):
                call = node.value.func if isinstance(node.value, ast.Call) else None
                if isinstance(call, ast.Name) and call.id == "Registry":
                    built.add((module, name))
                elif REGISTRY_NAME.search(name):
                    plain[module, name] = type(node.value).__name__
    new = sorted(set(plain) - set(ALLOWED_PLAIN_REGISTRIES))
    assert not new, "module-level registries that are not a simulator.registry.Registry: " + ", ".join(
        f"{m}.{n} ({plain[m, n]})" for m, n in new
    )
    gone = sorted(set(ALLOWED_PLAIN_REGISTRIES) - set(plain))
    assert not gone, f"no longer plain: drop them from ALLOWED_PLAIN_REGISTRIES: {gone}"
    assert built == set(REGISTRIES), f"Registry objects not in REGISTRIES, or gone: {sorted(built ^ set(REGISTRIES))}"


# ------------------------------------------------------------------------ calibration's sub-packages

# calibration/ in the order of its flow (calibration/__init__.py says why): the harness measures a real
# vLLM server into a bundle, the fit turns a bundle into a profile, validation replays a bundle against
# it.  pd (a prefill/decode pair: its launch, run, bundle and replay) is built on the harness; kernels,
# coldstart and e2e fit and check published measurements and need none of the others.  calibration.cli
# (`epdsim calibrate`) is on top and may import every one.  Each sub-package may import these besides
# itself (and hwdb and simulator); an import under `if TYPE_CHECKING:` counts like any other.
CALIBRATION_LAYERS: dict[str, set[str]] = {
    "calibration.harness": set(),
    "calibration.pd": {"calibration.harness"},
    "calibration.fit": {"calibration.harness"},
    "calibration.validation": {"calibration.harness", "calibration.fit"},
    "calibration.kernels": {"calibration.harness"},
    "calibration.coldstart": set(),
    "calibration.e2e": set(),
}
CALIBRATION_TOP = ("calibration", "calibration.cli")  # the package's docstring, and the command on top


def calibration_part(module: str) -> str:
    """``calibration.fit.solver`` -> ``calibration.fit``; the two top modules are their own part."""
    return module if module in CALIBRATION_TOP else ".".join(module.split(".")[:2])


@lru_cache(maxsize=1)
def typed_graph() -> dict[str, set[str]]:
    """The import graph with the ``if TYPE_CHECKING:`` imports counted: a type-only cycle is still a
    cycle of the design (the two modules can only be read together)."""
    modules = project_modules()
    return {m: imports_of(m, p, modules, type_only=True) for m, p in modules.items()}


def calibration_edges(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importing part, imported part) for every import between two parts of calibration."""
    return {
        (calibration_part(a), calibration_part(b))
        for a, bs in g.items()
        if a.startswith("calibration")
        for b in bs
        if b.startswith("calibration") and calibration_part(a) != calibration_part(b)
    }


def test_calibration_is_sub_packages():
    """No flat room again: every calibration module sits in a listed sub-package (with its __init__.py),
    except the package's own __init__ and the command line."""
    parts = {calibration_part(m) for m in project_modules() if m.startswith("calibration")}
    listed = {*CALIBRATION_LAYERS, *CALIBRATION_TOP}
    assert parts == listed, (
        f"calibration modules outside the listed sub-packages: {sorted(parts - listed)}"
        f"; sub-packages gone: {sorted(listed - parts)}"
    )
    for part in CALIBRATION_LAYERS:
        assert REPO.joinpath(*part.split("."), "__init__.py").is_file(), f"{part} has no __init__.py"


def test_calibration_layering():
    """Each sub-package imports only those below it (the harness no fit, pd or validation; the fit no
    validation; kernels, coldstart and e2e nothing of the others); nothing imports the command line."""
    bad = sorted(
        (a, b)
        for a, b in calibration_edges(typed_graph())
        if a != "calibration.cli" and (a == "calibration" or b not in CALIBRATION_LAYERS[a])
    )
    assert not bad, "calibration sub-packages importing across their layers: " + ", ".join(
        f"{a} -> {b}" for a, b in bad
    )
    assert not calibration_edges({"calibration.harness.x": {"calibration.harness.y"}})  # within: no edge
    assert calibration_edges({"calibration.fit.a": {"calibration.validation.b"}}) == {
        ("calibration.fit", "calibration.validation")
    }


def test_calibration_has_no_cycles_type_only_included():
    """No two calibration modules, and no two of its sub-packages, import each other, counting the
    imports under ``if TYPE_CHECKING:`` (the fit and its report, the kernel fit and its profile, once
    did: the shared types moved down, BundleFit to calibration.fit.result, FitResult to
    calibration.kernels.profile)."""
    g = typed_graph()
    sub = {a: {b for b in bs if b.startswith("calibration")} for a, bs in g.items() if a.startswith("calibration")}
    found = [sorted(c) for c in cycles(sub)]
    assert not found, "calibration modules in an import cycle: " + "; ".join(" <-> ".join(c) for c in found)
    parts: dict[str, set[str]] = {}
    for a, b in calibration_edges(g):
        parts.setdefault(a, set()).add(b)
    found = [sorted(c) for c in cycles(parts)]
    assert not found, "calibration sub-packages in an import cycle: " + "; ".join(" <-> ".join(c) for c in found)
    for a, b in (
        ("calibration.fit.command", "calibration.fit.report"),
        ("calibration.kernels.fit", "calibration.kernels.profile"),
    ):
        assert not (b in g[a] and a in g[b]), f"{a} and {b} import each other again"


def test_type_only_reader_sees_type_checking_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import c\n"
        "    from b import x\nelse:\n    import d\n"
    )
    modules = dict.fromkeys(("m", "a", "b", "c", "d"), src)
    assert imports_of("m", src, modules) == {"a", "d"}
    assert imports_of("m", src, modules, type_only=True) == {"a", "b", "c", "d"}


def docs_text() -> str:
    return "\n".join(p.read_text() for p in sorted([*REPO.joinpath("docs").rglob("*.md"), REPO / "README.md"]))


def test_no_calibration_module_is_orphaned():
    """Every calibration module has a user: a project module imports it, or the docs run it
    (``python -m calibration.x``, a ``__main__`` block), or the docs name it as the code behind a check
    (``calibration.validation.perf_check``, run by its tests).  Package __init__ modules are exempt."""
    modules, g, docs = project_modules(), typed_graph(), docs_text()
    imported = set().union(*(bs for a, bs in g.items()))
    orphans = []
    for m, path in sorted(modules.items()):
        if not m.startswith("calibration") or path.name == "__init__.py" or m in imported:
            continue
        entry = '__name__ == "__main__"' in path.read_text() and f"python -m {m}" in docs
        named = re.search(rf"(?<![\w.]){re.escape(m)}(?![\w])", docs) or (path.relative_to(REPO).as_posix() in docs)
        if not (entry or named):
            orphans.append(m)
    assert not orphans, f"calibration modules nothing uses or documents: {orphans}"


# Modules that may hand on names they import (issue 36: no re-export shims).  Every other module imports
# a name only to use it, and its importers import the name from the module that defines it.
ALLOWED_REEXPORTS = {
    # a package's public API, listed in its __all__
    "hwdb": "the hardware database's API: load, HardwareDB, ModelEntry, the schema types",
    "simulator.cli": "`main`, the entry point of `epdsim` (simulator.cli.__main__, pyproject's script)",
    "simulator.plan": "the planner's API: parse/load a plan request, run_plan, its results",
    "simulator.regress": "`epdsim regress`'s API: suites, runner, comparison, reports",
    # a layer's name for another layer's code
    "app.services.planbands": "the app's pages import services only; the band logic is the planner's own "
    "(simulator.plan.bands), which the Plan page reads through this module",
}


def _reexport_markers(path: Path) -> list[str]:
    """The signs of a module that hands on imported names: a ``noqa: F401`` marker (an unused import kept),
    an ``__all__`` (names listed for others), a redundant ``import x as x`` alias (the typing convention
    for an explicit re-export, which ruff then accepts as used)."""
    src = path.read_text()
    out = [
        f"line {i}: noqa F401" for i, line in enumerate(src.splitlines(), 1) if re.search(r"noqa:[^#]*\bF401\b", line)
    ]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out.append(f"line {node.lineno}: __all__")
        if isinstance(node, ast.ImportFrom | ast.Import):
            out += [
                f"line {node.lineno}: `as {a.asname}`"
                for a in node.names
                if a.asname is not None and a.asname == a.name.rsplit(".", 1)[-1]
            ]
    return out


def test_no_reexports():
    """No module imports a name only to hand it on (issue 36): import it from where it is defined."""
    found = {m: marks for m, p in project_modules().items() if (marks := _reexport_markers(p))}
    new = {m: marks for m, marks in found.items() if m not in ALLOWED_REEXPORTS}
    assert not new, (
        f"re-exports: {new}. Import each name from the module that defines it (and drop it here "
        "where this module does not use it), or list a package's API in ALLOWED_REEXPORTS with why"
    )
    gone = sorted(set(ALLOWED_REEXPORTS) - set(found))
    assert not gone, f"no re-exports left in {gone}: drop them from ALLOWED_REEXPORTS"


def test_reexport_reader_sees_the_markers(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from a import b  # noqa: F401 - re-exported\nfrom c import d as d\nimport e\n__all__ = ['b']\n")
    assert sorted(_reexport_markers(p)) == ["line 1: noqa F401", "line 2: `as d`", "line 4: __all__"]
