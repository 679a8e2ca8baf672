"""Downloads of a run (no Streamlit): the full per-request table as CSV or Parquet, the summary as
JSON (summary, run info, the ``vllm bench serve``-style figures and the scenario), the scenario as
YAML, a comparison table as CSV.  Every table is written whole; nothing is cut to what a page shows."""

from __future__ import annotations

import io
import json
import math
from typing import TYPE_CHECKING

import pandas as pd

from app.services.share import portable, portable_yaml
from simulator.serving_summary import serving_summary

if TYPE_CHECKING:
    from simulator.engine.results import Results


def _clean(x):
    """JSON without NaN/Infinity (not JSON): they become null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def scenario_yaml(res) -> str:
    """The scenario that produced ``res``, as YAML that ``epdsim simulate`` reloads (no server paths:
    :func:`app.services.share.portable_yaml`)."""
    return portable_yaml(res.scenario.model_dump(mode="json"))


def requests_csv(res) -> bytes:
    return res.requests.to_csv(index=False).encode()


def requests_parquet(res) -> bytes:
    buf = io.BytesIO()
    res.requests.to_parquet(buf, index=False)
    return buf.getvalue()


def summary_json(res: Results) -> bytes:
    data = {
        "summary": res.summary,
        "info": res.info,
        "serving": serving_summary(res),
        "scenario": portable(res.scenario.model_dump(mode="json")),
    }
    return json.dumps(_clean(data), indent=2, sort_keys=True, default=str).encode()


def comparison_csv(metrics: pd.DataFrame) -> bytes:
    """:func:`app.services.compare.metrics_frame` as CSV (metric rows, one column per scenario, best)."""
    return metrics.rename_axis("metric").to_csv().encode()
