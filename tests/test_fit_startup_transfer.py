"""calibration.fit.startup / fit_transfer on synthetic bundles (no vLLM)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace as N

import pytest

import hwdb
from calibration.fit.startup import fit_startup, launch_phases, write_startup
from calibration.fit.transfer import connector_doc, fit_transfer, write_connector
from hwdb.coldstart import load_coldstart
from simulator.cli.ops import _deployment
from simulator.ops.coldstart import breakdown

CFG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "head_dim": 64,
    "hidden_size": 256,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
}


def _startup(shift: float) -> dict:
    ev = [
        ("version", 8.9),
        ("engine_core_start", 16.1),
        ("model_load_start", 23.9 + shift),
        ("weights_loaded", 23.985 + shift, {"seconds": 0.01}),
        ("kv_cache_size", 24.57 + shift, {"tokens": 1e6}),
        ("engine_init", 26.738 + shift, {"seconds": 2.17}),
        ("api_ready", 27.77 + shift),
    ]
    events = [dict({"phase": e[0], "t": e[1]}, **(e[2] if len(e) > 2 else {})) for e in ev]
    events.insert(1, {"phase": "engine_args", "t": 8.92, "text": "{'enforce_eager': True}"})
    summary = {f"{e['phase']}_t": e["t"] for e in events}
    summary.update(weights_load_s=0.01, engine_init_s=2.17, vllm_version="0.32.0", ready_s=28.1 + shift)
    return {"events": events, "summary": summary}


def _bundle(tmp_path, name, shifts):
    b = tmp_path / name
    b.mkdir()
    mf = {
        "model": {"served_name": "tiny-llama", "root": "/m", "config": CFG},
        "hardware": {"server": {"hostname": "box", "cpu_model": "Xeon", "cpu_count": 2, "gpus": []}},
        "launches": [
            {"index": i, "ready_s": 28.1 + s, "vllm_version": "0.32.0", "startup": _startup(s)}
            for i, s in enumerate(shifts)
        ],
    }
    (b / "manifest.json").write_text(json.dumps(mf))
    return b


def test_launch_phases():
    ph = launch_phases(_startup(0.0))
    assert ph["process_start"] == pytest.approx(23.975)
    assert ph["weights_load"] == pytest.approx(0.01)
    assert ph["kv_profile"] == pytest.approx(26.738 - 23.985)
    assert ph["api_ready"] == pytest.approx(28.1 - 26.738)


def test_startup_yaml_loads_and_breakdown_uses_it(tmp_path):
    b1, b2 = _bundle(tmp_path, "a", [0.0, 1.0]), _bundle(tmp_path, "b", [0.5])
    doc = fit_startup([b1, b2])
    path = write_startup(doc, tmp_path / "hw")
    assert path.parent.name == "coldstart"
    c = load_coldstart([tmp_path / "hw"]).coefficients(doc["name"])
    assert c.coef("process_start", "seconds") == pytest.approx(23.975 + 0.5)
    assert c.coef("kv_profile", "k0_s") == pytest.approx(2.753, abs=1e-3)
    assert c.coef("kv_profile", "k_miss_s_per_layer") == 0.0
    assert len(c.fits["process_start"].rows) == 3
    assert str(b1.resolve()) in c.notes and "dynamo" in c.notes  # provenance + phases kept from the base
    # usable by simulator.ops.coldstart.breakdown through its engine/db arguments
    dep = _deployment(
        N(hwdb=[], model="llama-3.1-8b", gpu="h100", tp=1, pp=1, dtype="bf16", enforce_eager=True, cmd="coldstart")
    )
    bd = breakdown(dep, "hit", storage="page_cache", engine=doc["name"], db=load_coldstart([tmp_path / "hw"]))
    assert bd.seconds("process_start") == pytest.approx(24.475)


def _pd_bundle(tmp_path, setup_s, bw, noise=0.03, n=60, seed=1):
    rng = random.Random(seed)
    b = tmp_path / "pd"
    (b / "records").mkdir(parents=True)
    # 128 KiB / token
    cfg = dict(CFG, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    per_tok = 2 * 32 * 8 * 128 * 2
    mf = {
        "kind": "pd_run",
        "connector": "NixlConnector",
        "block_size": 16,
        "model": {"config": cfg},
        "file_bandwidth": {"write_read_Bps": 3e9},
    }
    (b / "manifest.json").write_text(json.dumps(mf))
    lines = []
    for i in range(n):
        L = rng.choice([256, 512, 1024, 2048, 4096, 8192])
        t = (setup_s + L * per_tok / bw) * (1 + rng.gauss(0, noise))
        pd = {
            "prompt_tokens": L,
            "decode_sent_s": 0.05,
            "decode_first_byte_s": 0.05 + t + 0.001,
            "decode_metrics": {"time_to_first_token_ms": t * 1e3},
        }
        lines.append(json.dumps({"id": f"r{i}", "kind": "request", "ok": True, "prompt_tokens": L, "pd": pd}))
    (b / "records" / "load_pd.jsonl").write_text("\n".join(lines) + "\n")
    return b


def test_transfer_fit_recovers_setup_and_bandwidth(tmp_path):
    setup, bw = 0.02, 20e9  # 20 ms + 7..54 ms of bytes: worst of 40 seeds 3.3% off
    fit = fit_transfer(_pd_bundle(tmp_path, setup, bw))
    f = fit["decode_ttft_s"]
    assert f["resolved"]
    assert f["setup_s"] == pytest.approx(setup, rel=0.10)
    assert f["bandwidth_Bps"] == pytest.approx(bw, rel=0.10)
    assert 0 < f["bandwidth_sigma_Bps"] < 0.1 * bw
    doc = connector_doc(fit)
    path = write_connector(doc, tmp_path / "hw")
    c = hwdb.load([tmp_path / "hw"]).connector("NixlConnector")
    assert c.setup_s.value == pytest.approx(setup, rel=0.10)
    assert str(tmp_path / "pd") in c.setup_s.source and path.parent.name == "connectors"


def test_transfer_unresolved_falls_back_to_file_bandwidth(tmp_path):
    fit = fit_transfer(_pd_bundle(tmp_path, 0.01, 1e15, noise=0.05))  # bytes term far below the noise
    assert not fit["decode_ttft_s"]["resolved"]
    doc = connector_doc(fit)
    assert "3e+09" in doc["efficiency"]["source"] and "not resolved" in doc["efficiency"]["source"]
