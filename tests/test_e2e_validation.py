"""End-to-end fidelity (issue 14): the step model's physics, the benchmark client, and the validation
against measured serving runs (``../shared/data/e2e``; those tests skip without it)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import hwdb
from calibration.e2e import score as e2e
from calibration.e2e.report import markdown
from calibration.e2e.rows import Row, admission_anomaly, load_rows
from calibration.e2e.scenarios import why_not
from simulator.cli import main as cli_main
from simulator.confidence import BANDS, assess
from simulator.plan import parse_plan_request, run_plan
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario
from simulator.stepmodel import regime
from tests.conftest import SHARED

TABLE = SHARED / "data" / "e2e" / "serving_measurements.csv"
needs_shared = pytest.mark.skipif(not TABLE.is_file(), reason="../shared/data/e2e is absent (CI has it)")


def _closed(
    c: int, n: int, spread: float | None, gpu="B200", tp=8, model="Llama-3.1-70B", dtype="fp8", isl=1024, osl=512, pp=1
):
    def length(v):
        if spread is None:
            return {"kind": "fixed", "value": v}
        return {"kind": "uniform", "low": int(spread * v), "high": v}

    return parse_scenario(
        {
            "model": model,
            "pools": [{"gpu": gpu, "tp": tp, "pp": pp, "dtype": dtype}],
            "workload": {
                "arrival": {"kind": "closed", "concurrency": c},
                "input_length": length(isl),
                "output_length": length(osl),
                "num_requests": n,
            },
        }
    )


def _step(scn):
    return resolve(scn).pools[0].step


# ---------------------------------------------------------------- physics of one step


def test_fp8_decode_at_batch_one_is_memory_bound_and_grows_with_context():
    step = _step(_closed(1, 1, None, gpu="H200", tp=1))
    assert regime(step, 1, 1, 0.0, 1024.0) == "memory"
    short, long_ = step.decode_time(1, 1024), step.decode_time(1, 8192)
    assert long_ > short * 1.01  # the KV read is visible at batch 1


def test_tpot_floor_does_not_shrink_with_tp():
    """A per-layer cost independent of TP: TPOT at TP8 stays above the per-layer floor the fit found,
    while the weight stream shrinks 8x (measured TPOT TP1 -> TP8 on B200: 16.3 -> 6.3 ms, not /8)."""
    t = {tp: _step(_closed(1, 1, None, tp=tp)).decode_time(4, 1500) for tp in (1, 8)}
    assert t[8] > t[1] / 4


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_pipeline_never_beats_one_weight_read_per_token(pp):
    """A token passes every stage: TPOT at batch 1 is at least the time to stream all weights once."""
    scn = _closed(1, 1, None, model="Llama-3.1-8B", gpu="H100", tp=1, dtype="bf16", pp=pp)
    rs = resolve(scn)
    pools = rs.pools
    dep, step = pools[0].dep, pools[0].step
    weights = dep.arch.total_params * 2.0 / dep.tp
    floor = weights / dep.gpu.memory_bandwidth_Bps.value
    assert step.decode_time(1, 1024) >= floor
    one = _step(_closed(1, 1, None, model="Llama-3.1-8B", gpu="H100", tp=1, dtype="bf16"))
    assert step.decode_time(1, 1024) >= 0.95 * one.decode_time(1, 1024)


# ---------------------------------------------------------------- the benchmark client


def test_closed_loop_with_the_benchmark_length_spread_is_not_lock_step():
    """64 users with the random dataset's spread: TTFT a small multiple of a lone request's, as measured
    (Llama-3.1-70B fp8 TP8 B200, 1024/1024: 100 ms at C=4, 219 ms at C=64), never ~64x."""
    lone = simulate(_closed(1, 4, None)).requests["ttft_s"].mean()
    busy = simulate(_closed(64, 640, 0.8)).requests["ttft_s"].mean()
    assert busy < 4 * lone


def test_fixed_lengths_group_only_by_the_token_budget():
    """With fixed lengths, users admitted in one step finish together and re-send together: groups are
    bounded by the step's token budget (8192 / 1024 = 8 prompts), not by the concurrency."""
    lone = simulate(_closed(1, 4, None)).requests["ttft_s"].mean()
    busy = simulate(_closed(64, 640, None)).requests["ttft_s"].mean()
    assert busy < 16 * lone


def test_warmup_requests_leave_the_figures_and_ramp_spreads_first_sends():
    base = _closed(16, 96, 0.8)
    arr = base.workload.arrival.model_copy(update={"warmup_requests": 16, "ramp_up_s": 1.0})
    scn = base.model_copy(update={"workload": base.workload.model_copy(update={"arrival": arr})})
    res = simulate(scn)
    req = res.requests
    assert int(req["warmup"].sum()) == 16
    first = req.sort_values("arrival_s")["arrival_s"].to_numpy()[:16]
    assert first.max() == pytest.approx(15 / 16, rel=1e-9)  # user k starts at k/16 of the ramp
    kept = req[~req["warmup"]]
    assert res.summary["ttft_s"]["mean"] == pytest.approx(kept["ttft_s"].mean(), rel=1e-9)


def test_front_end_is_in_ttft_not_in_the_queue():
    res = simulate(_closed(1, 3, None))
    req = res.requests
    assert (req["frontend_s"] > 0).all()
    assert np.allclose(req["ttft_s"], req["frontend_s"] + req["queue_s"] + req["prefill_s"], rtol=1e-9)


# ---------------------------------------------------------------- validation against measured runs


@needs_shared
def test_every_row_is_expressed_or_counted_with_a_reason():
    rows = load_rows(TABLE)
    db = hwdb.load()
    reasons = [why_not(r, db) for r in rows]
    # Every table row is one of the runs (a run listed under several source files counts once).
    assert sum(r.copies for r in rows) == len(pd.read_csv(TABLE)) and len({r.id for r in rows}) == len(rows)
    expressed = sum(1 for x in reasons if not x)
    assert expressed > 1500 and all(isinstance(x, str) for x in reasons)


@needs_shared
def test_predictions_follow_measured_directions():
    """On pairs of measured vLLM rows that differ in one factor by a clear margin (>15 %), the
    prediction moves the same way: TTFT and TPOT with concurrency, TTFT with input length, TPOT with
    output length (context)."""
    rows = [r for r in load_rows(TABLE) if r.backend == "vllm" and "Llama-3.1-70B" in r.model and r.quant == "fp8"]
    df = e2e.predict(rows, workers=1)
    key = ["tp", "isl", "osl", "concurrency"]
    idx = {tuple(getattr(r, k) for k in key): r for r in df.itertuples()}
    agree = total = 0
    for k, r in idx.items():
        tp, isl, osl, c = k
        for other, metric in (
            ((tp, isl, osl, c * 2), "ttft"),
            ((tp, isl, osl, c * 2), "tpot"),
            ((tp, isl * 8, osl, c), "ttft"),
            ((tp, isl, osl * 8, c), "tpot"),
        ):
            o = idx.get(other)
            if o is None:
                continue
            meas = getattr(o, f"{metric}_s") / getattr(r, f"{metric}_s")
            if abs(meas - 1) < 0.15:
                continue
            pred = getattr(o, f"{metric}_pred_s") / getattr(r, f"{metric}_pred_s")
            total += 1
            agree += (pred > 1) == (meas > 1)
    assert total >= 40 and agree / total >= 0.9, (agree, total)


@needs_shared
def test_held_out_vllm_error_is_bounded(tmp_path):
    """The held-out vLLM families (never used by any end-to-end fit) on every 6th row: errors stay
    within the figures docs/validation/e2e.md reports (bounds a little above them, so that a model
    change that worsens accuracy fails here as in the regress entry)."""
    rows = [r for r in load_rows(TABLE) if r.backend == "vllm" and e2e.split(r) == "held-out"][::6]
    df = e2e.predict(rows, workers=1)
    ok = e2e.scored(df)
    assert len(ok) >= 40
    assert ok["tpot_err"].abs().mean() < 0.35
    assert ok["ttft_err"].abs().mean() < 0.60
    md = markdown(df)
    assert "held-out" in md and "Rows not expressed" in md


@needs_shared
def test_validate_e2e_command_writes_reports_and_gates(tmp_path):
    small = tmp_path / "rows.csv"
    pd.read_csv(TABLE).iloc[::400].to_csv(small, index=False)
    out = tmp_path / "out"
    assert cli_main(["validate-e2e", "--table", str(small), "--workers", "1", "--out", str(out)]) == 0
    assert (out / "e2e.md").read_text().count("|") > 20
    assert "<table" in (out / "e2e.html").read_text()
    assert pd.read_csv(out / "predictions.csv")["copies"].sum() == len(pd.read_csv(small))
    assert cli_main(["validate-e2e", "--table", str(small), "--workers", "1", "--max-tpot-mape", "0.0001"]) == 1


def test_validate_e2e_names_a_missing_table(tmp_path, capsys):
    assert cli_main(["validate-e2e", "--table", str(tmp_path / "none.csv")]) == 2
    assert "none.csv" in capsys.readouterr().err
    assert cli_main(["validate-e2e", "--table", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


# ---------------------------------------------------------------- how sure a number is


def test_each_pool_says_what_it_rests_on():
    cal = simulate(_closed(1, 2, None, gpu="H200", tp=8)).info["pools"][0]["confidence"]
    assert cal["gpu"].startswith("kernel-fitted") and cal["engine"] == "e2e-fitted"
    assert cal["model_family"].startswith("validated end to end")  # Llama-3.1-70B is in the table
    assert cal["error_band"] is not None and 0 < cal["error_band"]["tpot_mape"] < 1
    raw = simulate(_closed(1, 2, None, gpu="MI300X", tp=8, dtype="bf16")).info["pools"][0]["confidence"]
    assert raw["gpu"] == "datasheet only" and raw["error_band"] is None


def test_band_follows_the_family_and_widens_without_one():
    """A validated family carries its own band; a model with no measured runs on its engine gets the widest
    band any held-out family showed, never the average (issue 31)."""
    bands = json.loads(BANDS.read_text())["engines"]["vllm"]
    own = assess(resolve(_closed(1, 2, None, gpu="H200", tp=8)).pools[0].dep)["error_band"]
    fam = bands["family_bands"]["Llama-3.1-70B"]
    assert (own["ttft_mape"], own["tpot_mape"]) == (fam["ttft_mape"], fam["tpot_mape"])
    assert "Llama-3.1-70B" in own["basis"]
    band = assess(resolve(_closed(1, 2, None, gpu="H200", tp=1, model="Llama-3.1-8B")).pools[0].dep)["error_band"]
    assert (band["ttft_mape"], band["tpot_mape"]) == (bands["widest"]["ttft_mape"], bands["widest"]["tpot_mape"])
    assert band["tpot_mape"] >= bands["all"]["tpot_mape"] and "widest" in band["basis"]


def _tiny_plan(gpus, **constraints):
    req = parse_plan_request(
        {
            "name": "tiny",
            "model": "Llama-3.1-8B",
            "workload": {
                "arrival": {"kind": "poisson", "rate": 4},
                "input_length": {"kind": "fixed", "value": 512},
                "output_length": {"kind": "fixed", "value": 128},
                "num_requests": 200,
            },
            "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "attainment": 0.9},
            "gpus": [{"name": g} for g in gpus],
            "constraints": {
                "max_gpus": 2,
                "max_instances_per_pool": 2,
                "tp": [1],
                "families": ["colocated"],
                **constraints,
            },
            "search": {
                "verify": 1,
                "borderline": 0,
                "verify_front": 0,
                "replications": 1,
                "requests": 200,
                "goodput_iterations": 2,
            },
        }
    )
    return run_plan(req, workers=1)


def test_planner_warns_on_an_uncalibrated_recommendation_and_can_prefer_calibrated_gpus():
    res = _tiny_plan(["MI300X"])
    assert res.recommended is not None
    assert any(n.startswith("warning: the recommendation rests on MI300X") for n in res.notes)
    pref = _tiny_plan(["MI300X", "H100"], prefer_calibrated=True)
    assert "H100" in pref.recommended["layout"]
    assert any("MI300X" in n and "prefer_calibrated" in n for n in pref.notes)
    assert not any(n.startswith("warning:") for n in pref.notes)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"a,b\n1,2\n", b""])
def test_validate_e2e_refuses_a_table_that_is_not_one(tmp_path, capsys, content):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(content)
    assert cli_main(["validate-e2e", "--table", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "Traceback" not in err


def test_kv_block_override_beyond_memory_is_refused():
    base = _closed(1, 2, None, model="Llama-3.1-8B", gpu="H100", tp=1, dtype="bf16").model_dump()
    base["pools"][0]["engine"]["num_gpu_blocks_override"] = 10**12
    with pytest.raises(ScenarioError, match="num_gpu_blocks_override=1000000000000"):
        resolve(parse_scenario(base))


def test_admission_anomaly_flags_runs_their_settings_cannot_produce():
    """Little's law on the closed loop: a run whose users mostly wait while the server decodes far fewer
    requests than its settings admit is left out of the scores (and listed); a KV-bound queue is not."""

    def row(c, isl, osl, ttft, tpot):
        return Row(
            id="x",
            backend="vllm",
            version="0",
            model="m",
            system="h100_sxm",
            quant="fp8",
            precision="fp8",
            isl=isl,
            osl=osl,
            concurrency=c,
            tp=4,
            pp=1,
            dp=1,
            moe_tp=1,
            moe_ep=1,
            ttft_s=ttft,
            tpot_s=tpot,
            disagg=False,
        )

    # gpt-oss-120b H100 TP4 at C=512 (vLLM 0.11.2 row of the table): 24.3 s TTFT with a 5.5 ms TPOT means
    # ~96 requests decoding; 6.4M KV tokens and max_num_seqs 512 hold all 512.
    stalled = row(512, 8192, 1024, 24.32, 0.005456)
    why = admission_anomaly(stalled, kv_tokens=6_389_008, max_num_seqs=512)
    assert "96 of 512" in why and "room for 512" in why
    # The same figures on a server whose KV holds only 150 such requests: a KV-bound queue, kept.
    assert admission_anomaly(stalled, kv_tokens=150 * 9216, max_num_seqs=512) == ""
    # A run that keeps its users decoding is kept whatever its TTFT.
    assert admission_anomaly(row(64, 1024, 1024, 0.2, 0.012), kv_tokens=10**7, max_num_seqs=1024) == ""
