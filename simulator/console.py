"""Consoles and tables of the command line that never truncate a name or fold a word.

On a terminal the console is as wide as the terminal; a table wider than that is split into
column groups that fit, each repeating the first (name) column, as pandas prints a wide frame.
When stdout is not a terminal (a pipe, a file, a CI log) lines are as long as the tables need:
nothing is wrapped, folded or cut with "…", whatever ``COLUMNS`` says.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

# Width of a console that is not a terminal: tables keep their natural width (they never expand).
UNLIMITED = 100_000


def is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def stdout_console() -> Console:
    """The console for results: the terminal's width on a terminal, unlimited otherwise."""
    return Console() if is_tty(sys.stdout) else Console(width=UNLIMITED)


def _cell_width(text: str) -> int:
    return max((len(line) for line in str(text).splitlines()), default=0)


def wide_tables(title: str, headers: list[str], rows: list[list[str]], width: int,
                justify: dict[str, str] | None = None) -> list[Table]:
    """``rows`` under ``headers`` as one table, or, when that is wider than ``width`` characters, as
    several tables of consecutive column groups that each fit and repeat the first column.  Cells
    and headers are never wrapped or cut (a column wider than ``width`` alone still gets its own group)."""
    justify = justify or {}
    natural = [max(_cell_width(h), *(_cell_width(r[i]) for r in rows)) if rows else _cell_width(h)
               for i, h in enumerate(headers)]
    cost = [w + 3 for w in natural]                          # padding and the border on each side
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
            t.add_column(headers[i], justify=justify.get(headers[i], "left"), no_wrap=True,
                         min_width=natural[i], overflow="fold")
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
    from rich.text import Text
    err = Console(stderr=True, emoji=False, markup=False, highlight=False)
    for note in notes:
        err.print(Text("note: ", style="yellow") + Text(note), soft_wrap=True)
