"""The flat step log (simulator/engine/steplog.py) gives back the steps it was given, in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.steplog import NCOL, StepLog

_count = st.integers(0, 2**40)
_row = st.tuples(st.floats(0, 1e9, allow_nan=False), st.floats(0, 10, allow_nan=False), *[_count] * (NCOL - 2))


@settings(max_examples=200, deadline=None)
@given(st.lists(_row, max_size=40))
def test_rows_come_back_in_order_and_exact(rows):
    log = StepLog()
    for r in rows:
        log.add(r)
    assert len(log) == len(rows)
    assert list(log) == rows
    assert log.flat == [x for r in rows for x in r]
    if rows:
        assert log.end() == rows[-1][0] + rows[-1][1]
    for j in range(NCOL):
        assert log.column(j) == [r[j] for r in rows]
