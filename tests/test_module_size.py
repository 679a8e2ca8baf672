"""Every project module stays within 400 lines (the house style), a few with a stated ceiling and reason.

The modules are those the import-structure tests read (``tests.test_import_structure.project_modules``).
"""

from __future__ import annotations

from tests.test_import_structure import project_modules

MAX_LINES = 400


# Modules allowed past MAX_LINES, each with its ceiling and why it cannot be split today.
LONGER: dict[str, int] = {
    # Instance.run is one SimPy generator of ~380 lines whose step loop keeps its state in locals (the hot
    # path); it cannot be cut without adding calls to every step.  Issue 35 replaces it with the engine core
    # (a scheduler, one step cost and one driver), which ends this allowance.
    "simulator.engine.instance": 410
}


def test_no_module_over_400_lines():
    long = {m: len(p.read_text().splitlines()) for m, p in project_modules().items()}
    over = {m: n for m, n in long.items() if n > LONGER.get(m, MAX_LINES)}
    assert not over, f"modules over {MAX_LINES} lines (or longer than their allowance): {over}; split them"
    unneeded = sorted(m for m in LONGER if long.get(m, 0) <= MAX_LINES)
    assert not unneeded, f"now within {MAX_LINES} lines: drop them from LONGER: {unneeded}"
