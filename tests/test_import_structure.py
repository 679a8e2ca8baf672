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
from functools import lru_cache
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("hwdb", "simulator", "calibration", "app")
# Packages of simulator/ that form the top layer, above app and calibration: the command line, and
# `epdsim regress`, which runs simulate, plan, goodput and calibration's end-to-end validation.
CLI = "simulator.cli"  # may import lazily (start-up time of `epdsim --help`)
TOP = (CLI, "simulator.regress")
# The input reader (size, encoding and alias limits, line-numbered errors), the strict pydantic base
# and the declared ranges sit below every layer: the hardware database reads its files through them.
# They import no project module (checked below).
FOUNDATION = ("simulator.inputs", "simulator.strict_model", "simulator.bounds")
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
    (
        "The planner's public package loads its runner on first use of run_plan (a module "
        "__getattr__): parsing a request and the checks do not need it."
    ): {("simulator.plan", "simulator.plan.runner")},
    (
        "`epdsim regress` loads what a suite's entries run (simulate, plan, goodput, end-to-end "
        "validation through calibration) when it runs that kind of entry."
    ): {
        ("simulator.regress.runner", "calibration.e2e.score"),
        ("simulator.regress.runner", "calibration.e2e.rows"),
        ("simulator.regress.runner", "simulator.goodput"),
        ("simulator.regress.runner", "simulator.plan"),
        ("simulator.regress.runner", "simulator.run"),
        ("simulator.regress.suite", "calibration.e2e.rows"),
    },
    (
        "Calibration subcommands are hooked into the `epdsim` parser; the fits, harness and "
        "validation they run load when a subcommand runs, not when `epdsim --help` builds the "
        "parser."
    ): {
        ("calibration.cli", "calibration.fit.command"),
        ("calibration.cli", "calibration.harness.probes"),
        ("calibration.cli", "calibration.harness.runner"),
        ("calibration.cli", "calibration.harness.server"),
        ("calibration.cli", "calibration.harness.show"),
        ("calibration.cli", "calibration.harness.trace_plan"),
        ("calibration.cli", "calibration.pd.cli"),
        ("calibration.cli", "calibration.validation.command"),
        ("calibration.e2e.report", "calibration.e2e.score"),
        ("calibration.e2e.report", "calibration.e2e.rows"),
        ("calibration.e2e.report", "simulator.errors"),
        ("calibration.fit.command", "calibration.fit.host"),
        ("calibration.fit.command", "calibration.fit.startup"),
        ("calibration.fit.command", "simulator.scenario"),
        ("calibration.pd.bundle", "calibration.harness.bundle"),
        ("calibration.pd.bundle", "simulator.console"),
    },
    (
        "`epdsim report` and `epdsim app` are hooked into the `epdsim` parser by app.cli; the report "
        "(Plotly), the planner and the scenario load when such a subcommand runs, not when `epdsim "
        "--help` builds the parser."
    ): {("app.cli", "app.report"), ("app.cli", "simulator.plan"), ("app.cli", "simulator.scenario")},
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
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, in_functions: bool = False, type_only: bool = False):
    """Import nodes that run, skipping ``if TYPE_CHECKING:`` bodies (kept with ``type_only``); with
    ``in_functions``, only those inside a function body."""
    stack = [(tree, False)]
    while stack:
        node, inside = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child) and not type_only:
                stack.append((ast.Module(body=child.orelse, type_ignores=[]), inside))  # the else: branch runs
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)) and (inside or not in_functions):
                yield child
            stack.append((child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))))


def imports_of(
    name: str, path: Path, modules: dict[str, Path], in_functions: bool = False, type_only: bool = False
) -> set[str]:
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
            while t and t not in modules:  # `import a.b.c` of a name inside a module: its module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@lru_cache(maxsize=1)  # one parse of the tree for all tests; callers only read it
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def in_cli(module: str) -> bool:
    return module == CLI or module.startswith(CLI + ".")


@lru_cache(maxsize=1)
def local_imports() -> set[tuple[str, str]]:
    """(importer, imported) for each project module imported inside a function, outside the CLI."""
    modules = project_modules()
    return {(m, t) for m, p in modules.items() if not in_cli(m) for t in imports_of(m, p, modules, in_functions=True)}


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
    assert "simulator.run" in g["simulator.goodput"]  # module level
    assert "simulator.engine.opsrun" in g["simulator.run"]  # inside simulate()
    assert "hwdb.db" in g["hwdb"]  # the package's re-exports
    assert len(g) > 100


def test_cycle_finder_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(g) == [{"a", "b", "c"}]
    assert back_edges({"hwdb.x": {"simulator.y"}, "app.z": {"hwdb.x"}}) == {("hwdb.x", "simulator.y")}
    # the CLI package is above app: it may import app, and app (or the rest of simulator) may not import it
    assert back_edges(
        {
            "simulator.cli.x": {"app.y", "calibration.z"},
            "app.y": {"simulator.cli.x"},
            "simulator.run": {"simulator.cli"},
        }
    ) == {("app.y", "simulator.cli.x"), ("simulator.run", "simulator.cli")}
    # the input reader is below every layer, and sub-package prefixes are whole names
    assert back_edges(
        {"simulator.inputs": {"hwdb.db"}, "hwdb.db": {"simulator.inputs"}, "simulator.regressions": {"calibration.x"}}
    ) == {("simulator.inputs", "hwdb.db"), ("simulator.regressions", "calibration.x")}


def test_no_new_import_cycles():
    found = cycles(graph())
    new = [sorted(c) for c in found if not any(c <= allowed for allowed in ALLOWED_CYCLES)]
    assert not new, (
        "new import cycle(s): "
        + "; ".join(" <-> ".join(c) for c in new)
        + ". Move the shared code to the lower module instead of importing both ways."
    )
    gone = [sorted(a) for a in ALLOWED_CYCLES if not any(a & c for c in found)]
    assert not gone, f"cycles no longer present: drop them from ALLOWED_CYCLES: {gone}"


def test_no_new_back_edges():
    found = back_edges(graph())
    new = sorted(found - ALLOWED_BACK_EDGES)
    assert not new, (
        "a lower layer imports a higher one (hwdb < simulator < calibration < app < simulator.cli): "
        + ", ".join(f"{a} -> {b}" for a, b in new)
    )
    gone = sorted(ALLOWED_BACK_EDGES - found)
    assert not gone, f"back-edges no longer present: drop them from ALLOWED_BACK_EDGES: {gone}"


def test_no_new_imports_inside_functions():
    found = local_imports()
    allowed = set().union(*ALLOWED_LOCAL_IMPORTS.values())
    new = sorted(found - allowed)
    assert not new, (
        "project modules imported inside a function (outside simulator.cli): "
        + ", ".join(f"{a} -> {b}" for a, b in new)
        + ". Import at module level; if that makes a cycle, move the shared code down."
    )
    gone = sorted(allowed - found)
    assert not gone, f"local imports no longer present: drop them from ALLOWED_LOCAL_IMPORTS: {gone}"


def test_local_import_reader_sees_only_function_bodies(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import a\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import c\n"
        "def f():\n    import b\n    if TYPE_CHECKING:\n        import d\n"
        "class K:\n    def g(self):\n        from e import x\n"
    )
    modules = dict.fromkeys(("m", "a", "b", "c", "d", "e"), src)
    assert imports_of("m", src, modules, in_functions=True) == {"b", "e"}
    assert imports_of("m", src, modules) == {"a", "b", "e"}


def test_fixed_cycles_stay_fixed():
    """The pairs that imported each other (behind function-level imports) no longer do, either way."""
    g = graph()
    for a, b in (
        ("simulator.loadshape", "simulator.workload"),
        ("simulator.plan.rank", "simulator.plan.runner"),
        ("simulator.plan.candidates", "simulator.plan.families"),
    ):
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
    found = [
        sorted(c) for c in cycles(g) if any(n.count(".") == 1 and REPO.joinpath(*n.split(".")).is_dir() for n in c)
    ]
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
                out |= {
                    (name, node.module, a.name)
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                }
    return out


def test_no_private_names_across_modules():
    found = private_imports()
    new = sorted(found - ALLOWED_PRIVATE_IMPORTS)
    assert not new, (
        "private names imported from another module: "
        + ", ".join(f"{a} <- {b}.{n}" for a, b, n in new)
        + ". Make the name public (no leading "
        "underscore) where it is defined, or move the code that needs it."
    )
    gone = sorted(ALLOWED_PRIVATE_IMPORTS - found)
    assert not gone, f"private imports no longer present: drop them from ALLOWED_PRIVATE_IMPORTS: {gone}"


def test_the_foundation_imports_no_project_module():
    g = graph()
    for m in FOUNDATION:
        assert not g[m], f"{m} is below every layer and may import no project module; it imports {sorted(g[m])}"
