"""The checker of the references in the docs (issue 36: docs that read as history): every file, module,
symbol and command a text names must exist.  Used by tests/test_docs_references.py (README.md, docs/**/*.md
and the four packages' comments and docstrings) and tests/test_docs_references_rules.py (planted text).

A reference is checked when it is the repository's own:

* a path whose first part is one of the repository's top-level source folders or files (``ROOTS``:
  ``simulator/engine/instance.py``, ``docs/planner.md``, ``.ci/run``); ``hwdb/x.py:name`` and
  ``simulator/step_build.name`` name a top-level name of that file (line numbers, ``run.py:146-154``,
  check the file only); a path without ``.py`` may name a module (``calibration/coldstart_cases``);
* a path relative to the document (``../planner.md``, ``validation/cpu.md`` from docs/, a link target);
* a ``.py`` path under another folder (``engine/instance.py``, ``pages/*.py``): the tail of a file of
  the repository, unless that folder is another project's source root (``EXTERNAL_ROOTS``);
* a bare file name (``engine.py``) only in a list item that opens with a repository folder (README's
  layout: ``- `simulator/` — ... (`engine.py`)``); elsewhere a bare name is as often vLLM's or SGLang's
  (``toy_proxy_server.py``, ``server_args.py``), so it is not checked;
* a dotted name under a package (``simulator.goodput.VerdictWatch``, ``python -m calibration.kernels.mla_fit``):
  the module, and its first attribute among the module's top-level names (read by ast, nothing imported);
* ``epdsim SUBCOMMAND ... --flag`` in code (spans and fenced blocks): the subcommand (and sub-subcommand)
  in the real parser (``simulator.cli.commands.build_parser``), each ``--flag`` among its options.

Not the repository's, so never checked: URLs, absolute paths (``/tmp/...``), generated outputs
(``out/...``: ``out`` is no source root), other projects' files (one whose path starts like ours counts
as theirs where their name comes right before it, "vLLM's ``docs/design/...``": ``ATTRIBUTED``).
``../shared/...`` (the shared data beside the repository, which a fresh clone lacks) is checked only
where ../shared exists.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import re
import shlex
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from simulator.cli.commands import build_parser
from tests.conftest import REPO

# The repository's own top-level folders and files: a path starting with one of them names this repo.
ROOTS = (
    "simulator",
    "hwdb",
    "calibration",
    "app",
    "tests",
    "examples",
    "benchmarks",
    "docs",
    ".ci",
    ".streamlit",
    "README.md",
    "pyproject.toml",
)
PACKAGES = ("simulator", "hwdb", "calibration", "app", "tests")  # importable: dotted names
CODE_PACKAGES = ("simulator", "hwdb", "calibration", "app")  # whose comments are scanned
# Other projects' source roots, which the docs cite by their own paths (vLLM's vllm/v1/...,
# aiconfigurator's collector/..., Vidur's vidur/..., NIXL's nixl/...).  Only a ``.py`` path under a
# folder that is not ours needs this list (a path under one of ours is checked, unless ATTRIBUTED).
EXTERNAL_ROOTS = ("vllm", "collector", "vidur", "nixl")
SHARED_PREFIX = "../shared/"  # beside the repository, whichever document names it

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\]\(([\w./-]+)(?:#[\w-]*)?\)")
FENCE = re.compile(r"^[ \t]*(?:```|~~~)[^\n]*\n(.*?)^[ \t]*(?:```|~~~)", re.M | re.S)
# A path: folders joined by '/', optionally ending in a ``:symbol`` or ``:lines`` suffix.  The look-behind
# keeps out the middle of a longer token (an absolute path, a URL left over, ``owner/repo`` in ``a.b/c``).
PATH = re.compile(r"(?<![\w.@/~$-])((?:\.\.?/)*[\w.*-]+(?:/(?:\n[ \t]*)?[\w.*{},-]*)+)(?::([\w.-]+))?")
BARE_PY = re.compile(r"(?<![\w./-])([\w-]+\.py)\b")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".csv", ".toml", ".txt", ".html", ".sh")
# A list item that opens with a repository folder, and its continuation lines: README's layout.
LAYOUT_ITEM = re.compile(r"^[-*] `([\w.-]+/)`(.*(?:\n[ \t]+\S.*)*)", re.M)
# Another project's path, cited as such: the project's name right before it, possessive (``vLLM's``,
# ``SGLang's documentation (``, ``vLLM's P2P NCCL guide (``), with a version (``vLLM 0.32``) or alone
# (``(vLLM ``, ``SemiAnalysisAI/InferenceX``).  "the vLLM V1 instance process (`...`)" is no citation.
ATTRIBUTED = re.compile(
    r"\b(?:vLLM|SGLang|TensorRT-LLM|InferenceX|aiconfigurator|Vidur|NIXL)"
    r"(?:'s(?:\s+[\w-]+){0,3}|\s+v?\d[\w.]*)?\s*\(?`*$"
)


@dataclass(frozen=True)
class Stale:
    where: str  # file:line
    ref: str
    why: str

    def __str__(self) -> str:
        return f"{self.where}: `{self.ref}`: {self.why}"


# ---- what exists -------------------------------------------------------------------------------------


@cache
def top_names(path: Path) -> frozenset[str] | None:
    """The names a module defines or imports at top level (under ``if``/``try`` too); None when it has a
    module ``__getattr__`` (any name may exist)."""

    def names(body) -> set[str]:
        out: set[str] = set()
        for n in body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    out.update(e.id for e in ast.walk(t) if isinstance(e, ast.Name))
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, (ast.If, ast.Try)):
                out |= names(n.body) | names(n.orelse) | names(getattr(n, "finalbody", []))
                for h in getattr(n, "handlers", []):
                    out |= names(h.body)
        return out

    found = names(ast.parse(path.read_text(), str(path)).body)
    return None if "__getattr__" in found else frozenset(found)


def module_file(parts: list[str]) -> Path | None:
    p = REPO.joinpath(*parts)
    for f in (p.with_suffix(".py"), p / "__init__.py"):
        if f.is_file():
            return f
    return None


def has_name(path: Path, attr: str) -> bool:
    """Whether module ``path`` has ``attr``: a top-level name, or a submodule of a package."""
    names = top_names(path)
    if names is None or attr in names:
        return True
    return path.name == "__init__.py" and module_file([*path.parent.relative_to(REPO).parts, attr]) is not None


def dotted_problem(dotted: str) -> str | None:
    """Why ``pkg.module.attr`` names nothing, or None: the longest module prefix, then its first attribute."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        f = module_file(parts[:k])
        if f is not None:
            if k < len(parts) and not has_name(f, parts[k]):
                return f"{'.'.join(parts[:k])} has no {parts[k]}"
            return None
    return f"no module {dotted}"


@lru_cache(maxsize=1)
def repo_files() -> tuple[str, ...]:
    return tuple(
        p.relative_to(REPO).as_posix()
        for r in ROOTS
        if (REPO / r).is_dir()
        for p in (REPO / r).rglob("*")
        if "__pycache__" not in p.parts
    )


def expand(path: str) -> list[str]:
    """``a_{x,y}.yaml`` as ``a_x.yaml`` and ``a_y.yaml`` (the docs' shorthand for a family of files)."""
    pieces = re.split(r"\{([^{}]*)\}", path)
    options = [p.split(",") if i % 2 else [p] for i, p in enumerate(pieces)]
    return ["".join(c) for c in itertools.product(*options)]


def exists_at(base: Path, rel: str) -> bool:
    return any(base.glob(rel)) if "*" in rel else (base / rel).exists()


def path_problem(base: Path, rel: str, symbol: str | None) -> str | None:
    """Why ``rel`` (under ``base``), with its ``:symbol`` suffix, names nothing, or None."""
    rel = rel.rstrip("/") or "."
    if exists_at(base, rel):
        if symbol and rel.endswith(".py") and re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", symbol):
            return None if has_name(base / rel, symbol.split(".")[0]) else f"{rel} has no {symbol}"
        return None
    if exists_at(base, rel + ".py"):  # a module written as a path
        return None
    head, _, last = rel.rpartition("/")
    stem, _, attr = last.partition(".")  # simulator/step_build.measured_experts
    f = base / head / f"{stem}.py"
    if attr and not attr.endswith(tuple(s[1:] for s in FILE_SUFFIXES)) and f.is_file():
        return None if has_name(f, attr.split(".")[0]) else f"{head}/{stem}.py has no {attr}"
    return "no such file or folder"


# ---- references in a text ----------------------------------------------------------------------------


def code_parts(text: str, markdown: bool):
    """(offset, code) for each inline code span and each fenced block's command (continuation lines
    joined)."""
    for m in FENCE.finditer(text) if markdown else ():
        offset = m.start(1)
        for command in re.split(r"(?<!\\)\n", m.group(1)):
            yield offset, command.replace("\\\n", " ")
            offset += len(command) + 1
    for m in CODE_SPAN.finditer(FENCE.sub(lambda f: " " * len(f.group()), text) if markdown else text):
        yield m.start(2), m.group(2)


def words_of(code: str) -> list[str]:
    try:
        return shlex.split(code.replace("\\|", " "))  # a quoted --serve-cmd "..." is one word
    except ValueError:  # an unbalanced quote in a fragment
        return code.replace("\\|", " ").split()


def cli_problems(code: str) -> list[tuple[str, str]]:
    """(reference, why) for each ``epdsim`` command in ``code`` whose subcommand or flag does not exist."""
    out = []
    words = words_of(code)
    for i, w in enumerate(words):
        if w != "epdsim" and not w.endswith("/epdsim"):
            continue
        parser, said, rest = cli_tree(), ["epdsim"], []
        for word in words[i + 1 :]:
            if word in ("|", "||", "&&", ";", ">", "2>&1") or word.startswith(("#", "$(")):
                break
            rest.append(word.strip("[](),;`'\""))
        for word in rest:
            subs = parser.subcommands
            if not subs or word.startswith("-") or not re.fullmatch(r"[a-z][a-z0-9-]*", word):
                break
            if word not in subs:
                out.append(
                    (
                        " ".join(said + [word]),
                        f"`{' '.join(said)}` has no subcommand {word} (it has {', '.join(sorted(subs))})",
                    )
                )
                break
            parser, said = subs[word], said + [word]
        for word in rest:
            flag = word.split("=")[0].rstrip(".:")
            if re.fullmatch(r"--?[a-z][\w-]*", flag) and flag not in parser.flags:
                out.append((f"{' '.join(said)} {flag}", f"`{' '.join(said)}` has no option {flag}"))
    return out


@dataclass(frozen=True)
class Cli:
    subcommands: dict
    flags: frozenset


@lru_cache(maxsize=1)
def cli_tree() -> Cli:
    # argparse offers no public listing of a parser's options and subparsers; ``_actions`` has held
    # them unchanged since Python 2.7.
    def walk(p: argparse.ArgumentParser) -> Cli:
        subs = {
            name: walk(sp)
            for a in p._actions
            if isinstance(a.choices, dict)
            for name, sp in a.choices.items()
            if isinstance(sp, argparse.ArgumentParser)
        }
        return Cli(subs, frozenset(o for a in p._actions for o in a.option_strings))

    return walk(build_parser())


def path_refs(text: str, base: Path, markdown: bool):
    """(offset, ref, where it resolves, path, symbol) for each path of ``text`` this file checks: where is
    a folder, "shared" (../shared), or "tail" (a .py path that must end a path of the repository)."""
    for m in PATH.finditer(text):
        ref, symbol = re.sub(r"\s", "", m.group(1)).rstrip(".,;"), m.group(2)
        if symbol and symbol[0].isdigit():
            symbol = None  # run.py:146-154: a line range
        first = ref.split("/")[0]
        if ref == SHARED_PREFIX.rstrip("/") or ref.startswith(SHARED_PREFIX):
            yield m.start(), ref, "shared", ref[len(SHARED_PREFIX) :] or ".", symbol
        elif first in ROOTS:
            yield m.start(), ref, REPO, ref, symbol
        elif first in (".", "..") or (base != REPO and (base / first).is_dir()):
            yield m.start(), ref, base, ref, symbol  # relative to the document
        elif ref.endswith(".py") and first not in EXTERNAL_ROOTS:
            yield m.start(), ref, "tail", ref, symbol
    for m in LINK.finditer(text) if markdown else ():
        if "/" not in m.group(1):  # a link to a sibling (paths are above)
            yield m.start(1), m.group(1), base, m.group(1), None
    for item in LAYOUT_ITEM.finditer(text) if markdown else ():  # a layout list item: its bare names
        for m in BARE_PY.finditer(item.group(2)):
            yield item.start(2) + m.start(), m.group(1), REPO / item.group(1), m.group(1), None


def problem(where, rel: str, symbol: str | None, shared: Path | None) -> str | None:
    if where == "shared":
        return path_problem(shared, rel, symbol) if shared is not None else None
    if where == "tail":
        pattern = re.compile("(^|/)" + re.escape(rel).replace(r"\*", "[^/]*") + "$")
        return None if any(pattern.search(f) for f in repo_files()) else "no file of the repository ends so"
    return path_problem(where, rel, symbol)


def stale_references(
    text: str, source: Path, shared: Path | None = None, markdown: bool = True, first_line: int = 1
) -> list[Stale]:
    """Every reference of ``text`` (the contents of ``source``, a document, or a comment or docstring of it
    starting at ``first_line``) that names nothing.  ``shared``: the ../shared folder, or None to leave
    its paths unchecked."""
    rel = source.relative_to(REPO) if source.is_relative_to(REPO) else source
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def at(offset: int) -> str:
        return f"{rel}:{bisect_right(starts, offset) - 1 + first_line}"

    plain = URL.sub(lambda m: " " * len(m.group()), text)  # same offsets, no URLs
    found = []
    for offset, ref, where, path, symbol in path_refs(plain, source.parent, markdown):
        cited = ATTRIBUTED.search(plain, max(0, offset - 80), offset)  # not ours: never stale
        found += [
            Stale(at(offset), ref, why)
            for one in expand(path)
            if (why := problem(where, one, symbol, shared)) and not cited
        ]
    for m in DOTTED.finditer(plain):
        if not m.group(1).endswith(FILE_SUFFIXES) and (why := dotted_problem(m.group(1))):
            found.append(Stale(at(m.start()), m.group(1), why))
    for offset, code in code_parts(plain, markdown):
        found += [Stale(at(offset), ref, why) for ref, why in cli_problems(code)]
    return sorted(dict.fromkeys(found), key=lambda s: (int(s.where.rpartition(":")[2]), s.ref))
