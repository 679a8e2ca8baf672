"""Every file, module, symbol and command the docs name exists (issue 36: docs that read as history).

Scanned: README.md and docs/**/*.md, and the comments and docstrings of the four packages.  Which references
are the repository's own and how each is checked: tests/reference_checker.py; its rules on planted text:
tests/test_docs_references_rules.py.  ``../shared/...`` (the shared data beside the repository, which a fresh
clone lacks) is checked only where ../shared exists.
"""

from __future__ import annotations

import ast
import io
import tokenize
from functools import lru_cache
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED
from tests.reference_checker import CODE_PACKAGES, SHARED_PREFIX, Stale, stale_references


def code_texts(path: Path):
    """(first line, text) of each comment block (consecutive comment lines, ``#`` removed) and each
    docstring of a module."""
    src = path.read_text()
    block, first = [], 0
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type != tokenize.COMMENT:
            continue
        if block and tok.start[0] != first + len(block):
            yield first, "\n".join(block)
            block = []
        if not block:
            first = tok.start[0]
        block.append(tok.string.lstrip("#"))
    if block:
        yield first, "\n".join(block)
    todo = [ast.parse(src, str(path))]
    while todo:  # statements only: docstrings are never inside expressions
        node = todo.pop()
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and ast.get_docstring(node) is not None
        ):
            yield node.body[0].lineno, node.body[0].value.value
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo += [n for n in getattr(node, field, ()) if isinstance(n, (ast.stmt, ast.excepthandler))]


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@lru_cache(maxsize=1)  # one scan for both tests; they only read it
def all_stale() -> tuple[Stale, ...]:
    """Every stale reference of the documents and the packages' comments; ../shared's paths checked
    where it exists."""
    shared = SHARED if SHARED.is_dir() else None
    found = []
    for doc in documents():
        found += stale_references(doc.read_text(), doc, shared)
    for pkg in CODE_PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            for first, text in code_texts(path):
                found += stale_references(text, path, shared, markdown=False, first_line=first)
    return tuple(found)


# ---- tests -------------------------------------------------------------------------------------------


def test_every_reference_exists():
    stale = [s for s in all_stale() if not s.ref.startswith(SHARED_PREFIX)]
    assert not stale, "stale references (rename the reference, or fix the rule in this file):\n" + "\n".join(
        map(str, stale)
    )


def test_shared_references_exist():
    if not SHARED.is_dir():
        pytest.skip("../shared is absent: the docs' paths into it cannot be checked")
    stale = [s for s in all_stale() if s.ref.startswith(SHARED_PREFIX)]
    assert not stale, "\n".join(map(str, stale))
