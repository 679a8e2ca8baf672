"""The import structure, read from the code's own imports (ast): cycles and back-edges between layers.

Layers, lowest first: ``hwdb`` (data and its loader), ``simulator`` (models, engine, scenario,
planner), ``calibration`` (fits to measurements, which drive the simulator), ``app`` (the Streamlit
planner), and ``simulator.cli`` (the ``epdsim`` command line, on top: it may import all of them).
A back-edge is an import from a lower layer into a higher one.  Every import counts, including
those inside functions: a local import hides a cycle from Python at import time, not from the
design.  ``if TYPE_CHECKING:`` imports do not count (they never run).

Today's cycles and back-edges are listed below with why each exists; the tests fail on any new one,
so the lists can only shrink.  Run this file with ``-s`` to see the current graph's report.
"""
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

PACKAGES = ("hwdb", "simulator", "calibration", "app")
# Packages of simulator/ that form the top layer, above app and calibration: the command line, and
# `epdsim regress`, which runs simulate, plan, goodput and calibration's end-to-end validation.
CLI = "simulator.cli"          # may import lazily (start-up time of `epdsim --help`)
TOP = (CLI, "simulator.regress")
# The input reader (size, encoding and alias limits, line-numbered errors; the strict pydantic base)
# sits below every layer: the hardware database reads its files through it.  It imports no project
# module (checked below).
FOUNDATION = ("simulator.inputs", "simulator.bounds")
LAYER = {p: i for i, p in enumerate((*PACKAGES, "top"))}


def layer(module: str) -> int:
    if module in FOUNDATION:
        return -1
    if any(module == t or module.startswith(t + ".") for t in TOP):
        return LAYER["top"]
    return LAYER[module.split(".")[0]]

# Cycles allowed (strongly connected components of more than one module).  Empty: the three this
# test found when it was written (loadshape <-> workload, plan.candidates <-> plan.families,
# plan.rank <-> plan.runner, each hidden by an import inside a function) were broken by moving code:
# WorkloadError to simulator.errors, the families check to plan.families, PlanResult to plan.rank.
# A cycle that cannot be avoided for now goes here as a set of module names, with why.
ALLOWED_CYCLES: list[set[str]] = []

# Back-edges, (importer, imported): a module of a lower layer reaching up.  None today, and none may be
# added.  (The top layer's imports of app and calibration are no back-edges.)
ALLOWED_BACK_EDGES: set[tuple[str, str]] = set()


# Imports of project modules inside functions, outside the CLI (which keeps its lazy imports so
# that `epdsim --help` stays fast: tests/test_cli_startup.py).  A local import hides a cycle from
# Python and the structure from a reader, so none may be added; today's, each group with its
# reason, can only go.  Third-party imports inside functions are not counted: optional
# dependencies (torch, ray, vllm, transformers) and heavy ones kept off start-up (pandas, pyarrow,
# scipy, plotly).
ALLOWED_LOCAL_IMPORTS: dict[str, set[tuple[str, str]]] = {
    ("The planner's public package loads its runner on first use of run_plan (a module "
     '__getattr__): parsing a request and the checks do not need it.'): {
        ('simulator.plan', 'simulator.plan.runner'),
    },
    ("`epdsim regress` loads what a suite's entries run (simulate, plan, goodput, end-to-end "
     'validation through calibration) when it runs that kind of entry.'): {
        ('simulator.regress.runner', 'calibration.e2e.score'), ('simulator.regress.runner', 'calibration.e2e.rows'),
        ('simulator.regress.runner', 'simulator.goodput'), ('simulator.regress.runner', 'simulator.plan'),
        ('simulator.regress.runner', 'simulator.run'), ('simulator.regress.suite', 'calibration.e2e.rows'),
    },
    ('Calibration subcommands are hooked into the `epdsim` parser; the fits, harness and '
     'validation they run load when a subcommand runs, not when `epdsim --help` builds the '
     'parser.'): {
        ('calibration.cli', 'calibration.fit.command'), ('calibration.cli', 'calibration.harness.probes'),
        ('calibration.cli', 'calibration.harness.runner'), ('calibration.cli', 'calibration.harness.server'),
        ('calibration.cli', 'calibration.harness.trace_plan'),
        ('calibration.cli', 'calibration.pd.cli'),
        ('calibration.cli', 'calibration.validation.command'), ('calibration.e2e.report', 'calibration.e2e.score'),
        ('calibration.e2e.report', 'calibration.e2e.rows'), ('calibration.e2e.report', 'simulator.errors'),
        ('calibration.fit.command', 'calibration.fit.host'), ('calibration.fit.command', 'calibration.fit.startup'),
        ('calibration.fit.command', 'simulator.scenario'), ('calibration.pd.bundle', 'calibration.harness.bundle'),
        ('calibration.pd.bundle', 'simulator.console'),
    },
    ("`epdsim report` and `epdsim app` are hooked into the `epdsim` parser by app.cli; the report "
     "(Plotly), the planner and the scenario load when such a subcommand runs, not when `epdsim "
     "--help` builds the parser."): {
        ('app.cli', 'app.report'), ('app.cli', 'simulator.plan'), ('app.cli', 'simulator.scenario'),
    },
}

def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every module of the four packages (app pages too: they import like any other module)."""
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            out[module_name(p)] = p
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, in_functions: bool = False, type_only: bool = False):
    """Import nodes that run, skipping ``if TYPE_CHECKING:`` bodies (kept with ``type_only``); with
    ``in_functions``, only those inside a function body."""
    stack = [(tree, False)]
    while stack:
        node, inside = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not type_only:
                stack.append((ast.Module(body=child.orelse, type_ignores=[]), inside))   # the else: branch runs
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)) and (inside or not in_functions):
                yield child
            stack.append((child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))))


def imports_of(name: str, path: Path, modules: dict[str, Path], in_functions: bool = False,
               type_only: bool = False) -> set[str]:
    """Project modules that ``name`` imports: ``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``; relative imports are resolved against the package.  With ``type_only``,
    the imports under ``if TYPE_CHECKING:`` count too."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text(), str(path)), in_functions, type_only):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            while t and t not in modules:        # `import a.b.c` of a name inside a module: its module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@lru_cache(maxsize=1)       # one parse of the tree for all tests; callers only read it
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def in_cli(module: str) -> bool:
    return module == CLI or module.startswith(CLI + ".")


@lru_cache(maxsize=1)
def local_imports() -> set[tuple[str, str]]:
    """(importer, imported) for each project module imported inside a function, outside the CLI."""
    modules = project_modules()
    return {(m, t) for m, p in modules.items() if not in_cli(m)
            for t in imports_of(m, p, modules, in_functions=True)}


def cycles(g: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.add(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
                continue
            if w not in index:
                index[w] = low[w] = counter
                counter += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(g.get(w, ())))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def back_edges(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, bs in g.items() for b in bs if layer(b) > layer(a)}


def report(g: dict[str, set[str]]) -> str:
    lines = [f"{len(g)} modules, {sum(map(len, g.values()))} imports"]
    lines += ["cycle: " + " <-> ".join(sorted(c)) for c in cycles(g)]
    lines += [f"back-edge: {a} -> {b}" for a, b in sorted(back_edges(g))]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- the checks

def test_the_graph_is_read_from_the_code():
    """The reader sees imports at module level, inside functions and relative ones, not TYPE_CHECKING."""
    g = graph()
    print(report(g))
    assert "simulator.run" in g["simulator.goodput"]                     # module level
    assert "simulator.engine.opsrun" in g["simulator.run"]               # inside simulate()
    assert "hwdb.db" in g["hwdb"]                                        # the package's re-exports
    assert len(g) > 100


def test_cycle_finder_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [{"a", "b", "c"}]
    assert back_edges({"hwdb.x": {"simulator.y"}, "app.z": {"hwdb.x"}}) == {("hwdb.x", "simulator.y")}
    # the CLI package is above app: it may import app, and app (or the rest of simulator) may not import it
    assert back_edges({"simulator.cli.x": {"app.y", "calibration.z"}, "app.y": {"simulator.cli.x"},
                       "simulator.run": {"simulator.cli"}}) == {("app.y", "simulator.cli.x"),
                                                                ("simulator.run", "simulator.cli")}
    # the input reader is below every layer, and sub-package prefixes are whole names
    assert back_edges({"simulator.inputs": {"hwdb.db"}, "hwdb.db": {"simulator.inputs"},
                       "simulator.regressions": {"calibration.x"}}) == {("simulator.inputs", "hwdb.db"),
                                                                        ("simulator.regressions", "calibration.x")}


def test_no_new_import_cycles():
    found = cycles(graph())
    new = [sorted(c) for c in found if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not new, ("new import cycle(s): " + "; ".join(" <-> ".join(c) for c in new)
                     + ". Move the shared code to the lower module instead of importing both ways.")
    gone = [sorted(a) for a in ALLOWED_CYCLES if not any(a & c for c in found)]
    assert not gone, f"cycles no longer present: drop them from ALLOWED_CYCLES: {gone}"


def test_no_new_back_edges():
    found = back_edges(graph())
    new = sorted(found - ALLOWED_BACK_EDGES)
    assert not new, ("a lower layer imports a higher one (hwdb < simulator < calibration < app < simulator.cli): "
                     + ", ".join(f"{a} -> {b}" for a, b in new))
    gone = sorted(ALLOWED_BACK_EDGES - found)
    assert not gone, f"back-edges no longer present: drop them from ALLOWED_BACK_EDGES: {gone}"


def test_no_new_imports_inside_functions():
    found = local_imports()
    allowed = set().union(*ALLOWED_LOCAL_IMPORTS.values())
    new = sorted(found - allowed)
    assert not new, ("project modules imported inside a function (outside simulator.cli): "
                     + ", ".join(f"{a} -> {b}" for a, b in new)
                     + ". Import at module level; if that makes a cycle, move the shared code down.")
    gone = sorted(allowed - found)
    assert not gone, f"local imports no longer present: drop them from ALLOWED_LOCAL_IMPORTS: {gone}"


def test_local_import_reader_sees_only_function_bodies(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import c\n"
                   "def f():\n    import b\n    if TYPE_CHECKING:\n        import d\n"
                   "class K:\n    def g(self):\n        from e import x\n")
    modules = dict.fromkeys(("m", "a", "b", "c", "d", "e"), src)
    assert imports_of("m", src, modules, in_functions=True) == {"b", "e"}
    assert imports_of("m", src, modules) == {"a", "b", "e"}


MAX_LINES = 400


def test_no_module_over_400_lines():
    long = {m: len(p.read_text().splitlines()) for m, p in project_modules().items()}
    over = {m: n for m, n in long.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (or longer than their allowance): {over}; split them"


def test_fixed_cycles_stay_fixed():
    """The pairs that imported each other (behind function-level imports) no longer do, either way."""
    g = graph()
    for a, b in (("simulator.loadshape", "simulator.workload"), ("simulator.plan.rank", "simulator.plan.runner"),
                 ("simulator.plan.candidates", "simulator.plan.families")):
        assert not (b in g[a] and a in g[b]), f"{a} and {b} import each other again"


def package_of(module: str) -> str:
    """The sub-package a module belongs to (``simulator.pd.pd`` -> ``simulator.pd``); a module directly
    under a top package (``simulator.scenario``) is its own node, since the top packages hold several
    layers of such modules."""
    parts = module.split(".")
    for pkg in PACKAGES:
        path = REPO.joinpath(*parts[:2])
        if parts[0] == pkg and len(parts) > 2 and path.is_dir():
            return ".".join(parts[:2])
    return module


def test_no_cycles_between_subpackages():
    """A sub-package (``simulator.pd``, ``simulator.ops``, ``calibration.harness``, ...) and the modules
    around it never import each other both ways, even through different modules."""
    g: dict[str, set[str]] = {}
    for a, bs in graph().items():
        pa = package_of(a)
        g.setdefault(pa, set()).update(package_of(b) for b in bs if package_of(b) != pa)
    found = [sorted(c) for c in cycles(g) if any(n.count(".") == 1 and REPO.joinpath(*n.split(".")).is_dir()
                                                  for n in c)]
    assert not found, "sub-packages in an import cycle: " + "; ".join(" <-> ".join(c) for c in found)


# Private names one module takes from another, each with its reason (none today); none may be added.
ALLOWED_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


def private_imports() -> set[tuple[str, str, str]]:
    """(module, project module, name) for every ``from module import _name`` between project modules
    (an alias such as ``import x as _x`` of a public name is not counted)."""
    modules = project_modules()
    out = set()
    for name, path in modules.items():
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "") in modules:
                out |= {(name, node.module, a.name) for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")}
    return out


def test_no_private_names_across_modules():
    found = private_imports()
    new = sorted(found - ALLOWED_PRIVATE_IMPORTS)
    assert not new, ("private names imported from another module: "
                     + ", ".join(f"{a} <- {b}.{n}" for a, b, n in new) + ". Make the name public (no leading "
                     "underscore) where it is defined, or move the code that needs it.")
    gone = sorted(ALLOWED_PRIVATE_IMPORTS - found)
    assert not gone, f"private imports no longer present: drop them from ALLOWED_PRIVATE_IMPORTS: {gone}"


def test_the_foundation_imports_no_project_module():
    g = graph()
    for m in FOUNDATION:
        assert not g[m], f"{m} is below every layer and may import no project module; it imports {sorted(g[m])}"


# ------------------------------------------------------------------------------------ registries

# Every registry of named strategies in simulator/: one Registry class for all (one duplicate check,
# one unknown-name message, registration order everywhere).
REGISTRIES = {("simulator.routing", "ROUTERS"): ROUTERS, ("simulator.ops.autoscale", "POLICIES"): POLICIES,
              ("simulator.roles", "ROLES"): ROLES, ("simulator.pd.flows", "FLOWS"): FLOWS,
              ("simulator.plan.families", "FAMILIES"): FAMILIES, ("simulator.memory", "POLICIES"): MEMORY_POLICIES,
              ("simulator.pd.connectors", "CONNECTORS"): CONNECTORS}
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
    assert not new, ("module-level registries that are not a simulator.registry.Registry: "
                     + ", ".join(f"{m}.{n} ({plain[m, n]})" for m, n in new))
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
CALIBRATION_TOP = ("calibration", "calibration.cli")     # the package's docstring, and the command on top


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
    return {(calibration_part(a), calibration_part(b)) for a, bs in g.items() if a.startswith("calibration")
            for b in bs if b.startswith("calibration") and calibration_part(a) != calibration_part(b)}


def test_calibration_is_sub_packages():
    """No flat room again: every calibration module sits in a listed sub-package (with its __init__.py),
    except the package's own __init__ and the command line."""
    parts = {calibration_part(m) for m in project_modules() if m.startswith("calibration")}
    listed = {*CALIBRATION_LAYERS, *CALIBRATION_TOP}
    assert parts == listed, (f"calibration modules outside the listed sub-packages: {sorted(parts - listed)}"
                             f"; sub-packages gone: {sorted(listed - parts)}")
    for part in CALIBRATION_LAYERS:
        assert REPO.joinpath(*part.split("."), "__init__.py").is_file(), f"{part} has no __init__.py"


def test_calibration_layering():
    """Each sub-package imports only those below it (the harness no fit, pd or validation; the fit no
    validation; kernels, coldstart and e2e nothing of the others); nothing imports the command line."""
    bad = sorted((a, b) for a, b in calibration_edges(typed_graph())
                 if a != "calibration.cli" and (a == "calibration" or b not in CALIBRATION_LAYERS[a]))
    assert not bad, ("calibration sub-packages importing across their layers: "
                     + ", ".join(f"{a} -> {b}" for a, b in bad))
    assert not calibration_edges({"calibration.harness.x": {"calibration.harness.y"}})     # within: no edge
    assert calibration_edges({"calibration.fit.a": {"calibration.validation.b"}}) == {
        ("calibration.fit", "calibration.validation")}


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
    for a, b in (("calibration.fit.command", "calibration.fit.report"),
                 ("calibration.kernels.fit", "calibration.kernels.profile")):
        assert not (b in g[a] and a in g[b]), f"{a} and {b} import each other again"


def test_type_only_reader_sees_type_checking_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import c\n"
                   "    from b import x\nelse:\n    import d\n")
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
        named = re.search(rf"(?<![\w.]){re.escape(m)}(?![\w])", docs) or \
            (path.relative_to(REPO).as_posix() in docs)
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
    out = [f"line {i}: noqa F401" for i, line in enumerate(src.splitlines(), 1)
           if re.search(r"noqa:[^#]*\bF401\b", line)]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out.append(f"line {node.lineno}: __all__")
        if isinstance(node, ast.ImportFrom | ast.Import):
            out += [f"line {node.lineno}: `as {a.asname}`" for a in node.names
                    if a.asname is not None and a.asname == a.name.rsplit(".", 1)[-1]]
    return out


def test_no_reexports():
    """No module imports a name only to hand it on (issue 36): import it from where it is defined."""
    found = {m: marks for m, p in project_modules().items() if (marks := _reexport_markers(p))}
    new = {m: marks for m, marks in found.items() if m not in ALLOWED_REEXPORTS}
    assert not new, (f"re-exports: {new}. Import each name from the module that defines it (and drop it here "
                     "where this module does not use it), or list a package's API in ALLOWED_REEXPORTS with why")
    gone = sorted(set(ALLOWED_REEXPORTS) - set(found))
    assert not gone, f"no re-exports left in {gone}: drop them from ALLOWED_REEXPORTS"


def test_reexport_reader_sees_the_markers(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from a import b  # noqa: F401 - re-exported\nfrom c import d as d\nimport e\n__all__ = ['b']\n")
    assert sorted(_reexport_markers(p)) == ["line 1: noqa F401", "line 2: `as d`", "line 4: __all__"]
