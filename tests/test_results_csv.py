"""Results.write's CSV (pyarrow's writer) reads back to the same values as pandas' own CSV."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.engine.results import write_csv
from simulator.run import simulate
from simulator.scenario import load_scenario
from tests.conftest import REPO


@pytest.fixture(scope="module")
def pd_run():
    return simulate(load_scenario(REPO / "examples" / "interference_pd.yaml"))


@pytest.mark.parametrize("table", ["requests", "steps", "links"])
def test_csv_reads_back_like_pandas_csv(pd_run, table, tmp_path):
    df = getattr(pd_run, table)
    assert len(df) > 0
    df.to_csv(tmp_path / "pandas.csv", index=False)
    write_csv(df, tmp_path / "arrow.csv")
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "arrow.csv"), pd.read_csv(tmp_path / "pandas.csv"), check_exact=True
    )


def test_csv_quotes_only_values_that_need_it(tmp_path):
    df = pd.DataFrame({"pool": ["main", "a,b", 'say "x"'], "x": [0.1, np.nan, 2.0], "n": [1, 2, 3]})
    write_csv(df, tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text()
    assert text.splitlines()[0] == "pool,x,n"
    assert '"a,b"' in text and '"say ""x"""' in text
    back = pd.read_csv(tmp_path / "t.csv")
    assert back["pool"].tolist() == df["pool"].tolist() and back["x"].isna().tolist() == [False, True, False]


def test_csv_without_special_values_is_unquoted(tmp_path):
    df = pd.DataFrame({"pool": ["main", "decode"], "reason": ["", "too long"]})
    write_csv(df, tmp_path / "t.csv")
    assert '"' not in (tmp_path / "t.csv").read_text()
