"""Consoles and tables of the command line: within the console's width, never cutting a name.

The width of the results console (``stdout_console``):

* stdout is a terminal: the terminal's width (``COLUMNS`` overrides it, as in every rich console);
* stdout is not a terminal (a pipe, a file, a CI log): ``COLUMNS`` when it is set to a number, else
  ``PIPED_WIDTH`` (120) characters, so a log stays readable in a pager or a CI viewer.

Every table printer keeps its lines within that width: a table of many figures is split into column
groups that fit, each repeating the first (name) column, as pandas prints a wide frame
(``wide_tables``); a long text cell (a layout, a reason, a description) is wrapped at spaces inside
its cell.  Names and figures are never cut with "…"; only a single word longer than its column (a
long path in a description) folds onto the next line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import cast

from rich.console import Console, JustifyMethod
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

# Width of a console that is not a terminal when COLUMNS is not set: wide enough for the tables of
# figures, narrow enough for a pager or a CI log viewer.
PIPED_WIDTH = 120


def is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def piped_width() -> int:
    """The width of a results console that is not a terminal: ``COLUMNS`` if a number, else ``PIPED_WIDTH``."""
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


def stdout_console() -> Console:
    """The console for results: the terminal's width on a terminal, else ``piped_width()``."""
    return Console() if is_tty(sys.stdout) else Console(width=piped_width())


def _cell_width(text: str) -> int:
    """Characters of the widest line of a cell as printed (its markup, e.g. "[red]moved[/]", takes none)."""
    return max((len(line) for line in _plain(text).splitlines()), default=0)


def _plain(text: str) -> str:
    try:
        return Text.from_markup(str(text)).plain
    except MarkupError:  # not markup after all: printed as it is
        return str(text)


def _longest_word(text: str) -> int:
    return max((len(w) for w in _plain(text).split()), default=0)


def wide_tables(
    title: str,
    headers: list[str],
    rows: list[list[str]],
    width: int,
    justify: dict[str, str] | None = None,
    wrap: dict[str, int] | None = None,
) -> list[Table]:
    """``rows`` under ``headers`` as one table, or, when that is wider than ``width`` characters, as
    several tables of consecutive column groups that each fit and repeat the first column.  Cells
    and headers are never cut; when the table does not fit, the columns named in ``wrap`` (header ->
    the most characters they take) wrap their text at spaces, e.g. a layout or a reason; any other
    column wider than ``width`` alone still gets its own group.  A header may hold a line break."""
    justify, wrap = justify or {}, wrap or {}
    natural = [
        max(_cell_width(h), *(_cell_width(r[i]) for r in rows)) if rows else _cell_width(h)
        for i, h in enumerate(headers)
    ]
    # wrap only when the whole table does not fit; a wrapped column is never narrower than its
    # longest word: names wrap at spaces, never inside
    if 1 + sum(n + 3 for n in natural) > width:
        natural = [
            min(n, max(wrap[h], _cell_width(h), *(_longest_word(r[i]) for r in rows))) if h in wrap else n
            for i, (n, h) in enumerate(zip(natural, headers, strict=True))
        ]
    cost = [w + 3 for w in natural]  # padding and the border on each side
    groups: list[list[int]] = []
    cur: list[int] = []
    used = 1 + cost[0]
    for i in range(1, len(headers)):
        if cur and used + cost[i] > width:
            groups.append(cur)
            cur, used = [], 1 + cost[0]
        cur.append(i)
        used += cost[i]
    if cur or not groups:
        groups.append(cur)
    tables = []
    for n, cols in enumerate(groups):
        part = f" ({n + 1}/{len(groups)})" if len(groups) > 1 else ""
        t = Table(title=title + part)
        for i in [0, *cols]:
            # ``justify`` holds rich's names ("right"), typed str by its callers
            align = cast(JustifyMethod, justify.get(headers[i], "left"))
            t.add_column(
                headers[i],
                justify=align,
                no_wrap=headers[i] not in wrap,
                min_width=natural[i],
                max_width=natural[i] if headers[i] in wrap else None,
                overflow="fold",
            )
        for r in rows:
            t.add_row(*(r[i] for i in [0, *cols]))
        tables.append(t)
    return tables


@contextmanager
def elapsed_status(text: str, min_s: float = 1.0):
    """While the block runs, show ``text`` and the elapsed seconds on stderr, but only when stderr is
    a terminal and the block has taken longer than ``min_s`` (a pipe or a CI log gets nothing)."""
    if not is_tty(sys.stderr):
        yield
        return
    con = Console(stderr=True, force_terminal=True)
    stop = threading.Event()
    t0 = time.perf_counter()

    def tick():
        if stop.wait(min_s):
            return
        with con.status(f"{text} ({time.perf_counter() - t0:.0f} s)") as st:
            while not stop.wait(0.5):
                st.update(f"{text} ({time.perf_counter() - t0:.0f} s)")

    th = threading.Thread(target=tick, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


def print_notes(notes) -> None:
    """Each of ``notes`` on stderr as ``note: ...``, literally (no markup), one paragraph each: what a
    run should know that is no error (e.g. a user hwdb folder replacing shipped hardware)."""
    err = Console(stderr=True, emoji=False, markup=False, highlight=False)
    for note in notes:
        err.print(Text("note: ", style="yellow") + Text(note), soft_wrap=True)
