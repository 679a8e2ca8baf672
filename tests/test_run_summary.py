"""The run summary's declared shape (:class:`simulator.summary_types.RunSummary`) matches what runs produce,
and mypy rejects a key it does not declare.

Runs of shrunk examples (colocated; PD with operations and crashes; E+P+D; colocated with autoscaling) give
summaries whose every key, recursively through the nested TypedDicts, is declared, and whose required keys
are all there."""

from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
import yaml

from simulator.run import simulate
from simulator.scenario import parse_scenario
from simulator.summary_types import RunSummary

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def _example(name: str, **workload) -> dict:
    data = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    data["workload"].update(workload)
    return data


def _scenarios() -> dict[str, dict]:
    pd_ops = _example("fp8_decode_crashes_pd", num_requests=150)
    pd_ops["operations"]["faults"]["fp8_crash"]["rate_per_token_s"] = 1e-4  # crashes within 150 requests
    auto = _example("autoscale_step_load", duration_s=80)
    auto["workload"]["arrival"]["shape"] = {
        "kind": "piecewise",
        "times_s": [0, 10, 10.001, 40, 40.001],
        "rates": [2, 2, 12, 12, 2],
    }
    auto["operations"]["autoscale"]["main"]["scale_down_stabilization_s"] = 10
    return {
        "colocated": _example("llama8b_h100_chat", num_requests=60),
        "pd_operations": pd_ops,
        "epd": _example("epd_images_epd", num_requests=30),
        "autoscale": auto,
    }


def _check(value, tp, where: str, seen: set[str]) -> None:
    """``value`` is of the declared type ``tp``: for a TypedDict, every key declared and every required
    key present, recursing into the values; lists and dicts recursed into their items."""
    origin = typing.get_origin(tp)
    if typing.is_typeddict(tp):
        assert isinstance(value, dict), f"{where}: {type(value).__name__}, not a mapping"
        hints = typing.get_type_hints(tp)
        extra = set(value) - set(hints)
        assert not extra, f"{where}: keys not declared in {tp.__name__}: {sorted(extra)}"
        missing = set(tp.__required_keys__) - set(value)
        assert not missing, f"{where}: required keys of {tp.__name__} missing: {sorted(missing)}"
        seen.add(tp.__name__)
        for k, v in value.items():
            _check(v, hints[k], f"{where}.{k}", seen)
    elif origin is list:
        assert isinstance(value, list), where
        (item,) = typing.get_args(tp)
        for i, v in enumerate(value):
            _check(v, item, f"{where}[{i}]", seen)
    elif origin is dict:
        assert isinstance(value, dict), where
        _, item = typing.get_args(tp)
        for k, v in value.items():
            _check(v, item, f"{where}[{k!r}]", seen)
    elif origin in (typing.Union, types.UnionType):
        if value is not None:
            (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
            _check(value, inner, where, seen)
    elif tp is float:
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{where}: {value!r}"
    elif isinstance(tp, type) and tp is not typing.Any:
        assert isinstance(value, tp), f"{where}: {value!r} is not {tp.__name__}"


def test_summaries_of_example_runs_have_exactly_the_declared_keys():
    seen: set[str] = set()
    sections: set[str] = set()
    for name, data in _scenarios().items():
        res = simulate(parse_scenario(data, name, EXAMPLES))
        _check(res.summary, RunSummary, name, seen)
        sections |= set(res.summary) & set(RunSummary.__optional_keys__)
    # every optional section but the CLI's model_error_band, and every nested TypedDict, was checked
    assert sections == set(RunSummary.__optional_keys__) - {"model_error_band"}
    assert seen == {
        "RunSummary",
        "Percentiles",
        "TTFTBreakdown",
        "PoolStats",
        "LinkStats",
        "Crossover",
        "EncoderSummary",
        "OperationsSummary",
        "ScaleUp",
        "OpsEvent",
        "CrashRecord",
        "InstanceLife",
    }


PLANTED = """
from simulator.engine.results import Results


def read(res: Results) -> float:
    return res.summary["ttft_s"]["p50"] + res.summary["no_such_key"] + res.summary["ttft_s"]["p95"]
"""


def test_mypy_rejects_an_undeclared_summary_key(tmp_path, monkeypatch):
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(REPO)  # this tree's simulator, not an installed copy
    monkeypatch.setenv("MYPYPATH", str(REPO))
    snippet = tmp_path / "planted.py"
    snippet.write_text(PLANTED)
    out, err, status = api.run(
        [
            str(snippet),
            "--config-file=",
            "--follow-imports=silent",
            "--python-version=3.11",
            "--ignore-missing-imports",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-color-output",
        ]
    )
    assert status == 1, out + err
    assert 'TypedDict "RunSummary" has no key "no_such_key"' in out, out
    assert 'TypedDict "Percentiles" has no key "p95"' in out, out
    assert "Found 2 errors in 1 file" in out, out
