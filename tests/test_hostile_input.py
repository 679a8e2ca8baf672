"""Hostile input: every file and number the project accepts, given as a careless or hostile user would.

Each case builds its bad input in ``tmp_path`` and runs the CLI in-process (``simulator.cli.main``;
a few through a subprocess): exit code 2, no traceback, the file or field named, under 5 s.  The
classes: files that are folders, binary, UTF-16 or latin-1, too large, billion-laughs YAML, duplicate
keys; numbers that are infinite, NaN, degenerate or outside physical ranges; hardware and model
files with zeros; bounded work; messages printed literally.  The app's upload sandbox is checked
at the end through its services (an uploaded scenario may read only files uploaded with it).
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simulator.cli import commands as cli

REPO = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((REPO / "examples" / "llama8b_h100_chat.yaml").read_text())
PLAN = yaml.safe_load((REPO / "examples" / "plan_llama8b.yaml").read_text())
GPU = (REPO / "hwdb" / "data" / "gpus" / "H100-SXM-80GB.yaml").read_text()
LINK = (REPO / "hwdb" / "data" / "links" / "cloud-vpc.yaml").read_text()
LLAMA = json.loads((REPO / "hwdb" / "data" / "models" / "Llama-3.1-8B" / "config.json").read_text()) \
    if (REPO / "hwdb" / "data" / "models" / "Llama-3.1-8B" / "config.json").exists() else None
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "model: *i\n"


def scenario(**workload) -> dict:
    d = copy.deepcopy(BASE)
    d["workload"]["num_requests"] = 20
    d["workload"].update(workload)
    return d


def put(tmp: Path, name: str, content) -> Path:
    """Write ``content`` (dict/list as YAML, str as text, bytes as is) to ``tmp/name``."""
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content)
    else:
        p.write_text(yaml.safe_dump(content, sort_keys=False))
    return p


def setting(d: dict, dotted: str, value) -> dict:
    d = copy.deepcopy(d)
    node = d
    *head, last = dotted.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    node[last] = value
    return d


def run_main(argv: list[str], capsys) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as exc:          # argparse usage errors
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out + out.err, time.monotonic() - t0


def expect_user_error(argv, words, capsys):
    rc, out, took = run_main(argv, capsys)
    assert rc == 2, f"exit {rc}:\n{out}"
    assert "Traceback" not in out, out
    for w in words:
        assert w in out, f"{w!r} not in:\n{out}"
    assert took < 5.0, f"took {took:.1f} s"
    return out


# ---------------------------------------------------------------- scenario files

FILE_CASES = {
    "directory": (lambda t: (t / "d.yaml").mkdir() or t / "d.yaml", ["d.yaml", "is a directory"]),
    "missing": (lambda t: t / "nope.yaml", ["nope.yaml", "no such file"]),
    "under-a-file": (lambda t: put(t, "f.yaml", "x: 1") / "s.yaml", ["s.yaml", "is a file, not a folder"]),
    "binary": (lambda t: put(t, "b.yaml", b"\x00\x01\x02model: x\xff"), ["b.yaml", "binary"]),
    "utf16": (lambda t: put(t, "u.yaml", "model: x\n".encode("utf-16")), ["u.yaml", "UTF-16"]),
    "latin1": (lambda t: put(t, "l.yaml", "name: caf\xe9\nmodel: x\n".encode("latin-1")), ["l.yaml", "line 1", "UTF-8"]),
    "billion-laughs": (lambda t: put(t, "bl.yaml", LAUGHS), ["bl.yaml", "aliases", "billion laughs"]),
    "recursive-alias": (lambda t: put(t, "r.yaml", "model: &a [1, *a]\n"), ["r.yaml", "recursive"]),
    "huge": (lambda t: put(t, "h.yaml", "# pad\n" * 300_000), ["h.yaml", "MiB", "limit"]),
    "duplicate-top-key": (lambda t: put(t, "k.yaml", yaml.safe_dump(scenario()) + "seed: 3\nseed: 4\n"),
                          ["k.yaml", "duplicate key 'seed'", "line"]),
    "duplicate-nested-key": (lambda t: put(t, "n.yaml", "model: Llama-3.1-8B\npools:\n  - gpu: H100\n    gpu: A100\n"),
                             ["n.yaml", "duplicate key 'gpu'", "line 4"]),
    "deep-nesting": (lambda t: put(t, "deep.yaml", "model: " + "[" * 20000 + "]" * 20000 + "\n"), ["deep.yaml"]),
    "python-tag": (lambda t: put(t, "p.yaml", "model: !!python/object/apply:os.system ['true']\n"),
                   ["p.yaml", "not valid YAML"]),
    "empty": (lambda t: put(t, "e.yaml", ""), ["e.yaml", "empty"]),
    "top-level-list": (lambda t: put(t, "l2.yaml", "- a\n- b\n"), ["l2.yaml", "mapping"]),
    "top-level-scalar": (lambda t: put(t, "s2.yaml", "42\n"), ["s2.yaml", "mapping"]),
    "huge-integer": (lambda t: put(t, "i.yaml", "seed: " + "9" * 5000 + "\n"), ["i.yaml", "4,300 digits"]),
    "syntax": (lambda t: put(t, "x.yaml", "model: [unclosed\n"), ["x.yaml", "not valid YAML", "line"]),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_scenario_file(case, tmp_path, capsys):
    make, words = FILE_CASES[case]
    expect_user_error(["simulate", make(tmp_path)], words, capsys)


# ---------------------------------------------------------------- scenario numbers

NUMBER_CASES = {
    "rate-1e-308": ("workload.arrival", {"kind": "poisson", "rate": 1e-308}, "workload.arrival.rate"),
    "rate-negative": ("workload.arrival", {"kind": "poisson", "rate": -1}, "workload.arrival.rate"),
    "rate-nan": ("workload.arrival", {"kind": "poisson", "rate": float("nan")}, "workload.arrival.rate"),
    "rate-inf": ("workload.arrival", {"kind": "poisson", "rate": float("inf")}, "workload.arrival.rate"),
    "rate-string": ("workload.arrival", {"kind": "poisson", "rate": "fast"}, "workload.arrival.rate"),
    "gamma-cv-1e-200": ("workload.arrival", {"kind": "gamma", "rate": 5, "cv": 1e-200}, "workload.arrival.cv"),
    "gamma-cv-1e300": ("workload.arrival", {"kind": "gamma", "rate": 5, "cv": 1e300}, "workload.arrival.cv"),
    "lognormal-cv-1e300": ("workload.input_length", {"kind": "lognormal", "mean": 100, "cv": 1e300},
                           "workload.input_length.cv"),
    "lognormal-mean-inf": ("workload.input_length", {"kind": "lognormal", "mean": float("inf"), "cv": 1},
                           "workload.input_length.mean"),
    "fixed-length-0": ("workload.output_length", {"kind": "fixed", "value": 0}, "workload.output_length.value"),
    "fixed-length-1e12": ("workload.input_length", {"kind": "fixed", "value": 10**12}, "workload.input_length.value"),
    "uniform-reversed": ("workload.input_length", {"kind": "uniform", "low": 9, "high": 2}, "workload.input_length"),
    "num-requests-0": ("workload.num_requests", 0, "workload.num_requests"),
    "num-requests-1e12": ("workload.num_requests", 10**12, "workload.num_requests"),
    "duration-inf": ("workload.duration_s", float("inf"), "workload.duration_s"),
    "concurrency-0": ("workload.arrival", {"kind": "closed", "concurrency": 0}, "workload.arrival.concurrency"),
    "concurrency-1e15": ("workload.arrival", {"kind": "closed", "concurrency": 10**15}, "workload.arrival.concurrency"),
    "think-time-inf": ("workload.arrival", {"kind": "closed", "concurrency": 4, "think_time_s": float("inf")},
                       "workload.arrival.think_time_s"),
    "warmup-negative": ("workload.arrival", {"kind": "closed", "concurrency": 4, "warmup_requests": -1},
                        "workload.arrival.warmup_requests"),
    "slo-ttft-inf": ("slo.ttft_s", float("inf"), "slo.ttft_s"),
    "slo-tpot-negative": ("slo.tpot_s", -1, "slo.tpot_s"),
    "slo-attainment-2": ("slo.attainment", 2, "slo.attainment"),
    "seed-negative": ("seed", -1, "seed"),
    "seed-2e70": ("seed", 2**70, "seed"),
    "jitter-inf": ("kv_transfer.jitter_mean_s", float("inf"), "kv_transfer.jitter_mean_s"),
    "kv-bandwidth-0": ("kv_transfer.bandwidth_Bps", 0, "kv_transfer.bandwidth_Bps"),
    "max-time-inf": ("simulation.max_time_s", float("inf"), "simulation.max_time_s"),
    "tp-3": ("pools.0.tp", 3, "tp=3"),
    "tp-0": ("pools.0.tp", 0, "pools[0].tp"),
    "pp-0": ("pools.0.pp", 0, "pools[0].pp"),
    "pp-above-layers": ("pools.0.pp", 64, "pp=64"),
    "instances-0": ("pools.0.instances", 0, "pools[0].instances"),
    "gpu-mem-util-0": ("pools.0.engine", {"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
    "block-size-7": ("pools.0.engine", {"block_size": 7}, "block_size"),
    "unknown-key": ("pools.0.gpus", "H100", "pools[0].gpus"),
    "unknown-router": ("pools.0.router", "fastest", "router"),
    "unknown-gpu": ("pools.0.gpu", "H900", "H900"),
    "unknown-model": ("model", "Llama-9-1T", "Llama-9-1T"),
    "rate-true": ("workload.arrival", {"kind": "poisson", "rate": True}, "yes/no value"),
    "tp-true": ("pools.0.tp", True, "tp: true"),
    "num-requests-true": ("workload.num_requests", True, "num_requests: true"),
    "ttft-false": ("slo.ttft_s", False, "ttft_s: false"),
    "time-scale-0": ("workload.arrival", {"kind": "trace", "path": "t.csv", "time_scale": 0}, "time_scale"),
    "trace-limit-0": ("workload.arrival", {"kind": "trace", "path": "t.csv", "limit": 0}, "limit"),
}


@pytest.mark.parametrize("case", sorted(NUMBER_CASES))
def test_scenario_number(case, tmp_path, capsys):
    where, value, words = NUMBER_CASES[case]
    data = setting(scenario(), where, value)
    text = yaml.safe_dump(data, sort_keys=False)   # .inf / .nan as YAML writes them
    path = put(tmp_path, "s.yaml", text)
    expect_user_error(["simulate", path], ["s.yaml" if case not in ("pp-above-layers", "tp-3", "unknown-gpu",
                                                                    "unknown-model") else "", words], capsys)


@pytest.mark.parametrize("example,where,value,words", [
    ("autoscale_step_load", "operations.autoscale.main.interval_s", 1e-308, "interval_s"),
    ("autoscale_step_load", "operations.startup.provisioning_s", float("inf"), "provisioning_s"),
    ("fp8_decode_crashes_pd", "operations.faults.fp8_crash.rate_per_token_s", 1e308, "rate_per_token_s"),
    ("fp8_decode_crashes_pd", "operations.faults.node_failure", {"mtbf_s": 1e-308}, "mtbf_s"),
    ("fp8_decode_crashes_pd", "operations.faults.link_degradation",
     {"mtbf_s": 1e-308, "duration_s": 1, "bandwidth_factor": 0.5}, "mtbf_s"),
], ids=["autoscale-interval-1e-308", "provisioning-inf", "fp8-rate-1e308", "node-mtbf-1e-308", "link-mtbf-1e-308"])
def test_operations_that_could_never_end(example, where, value, words, tmp_path, capsys):
    """Event rates that would keep a run from ending (a tick or a failure every 1e-308 s) are refused."""
    from simulator.scenario import resolve_relative
    ex = REPO / "examples" / f"{example}.yaml"
    d = resolve_relative(yaml.safe_load(ex.read_text()), ex.parent)
    path = put(tmp_path, "ops.yaml", setting(d, where, value))
    expect_user_error(["simulate", path], ["ops.yaml", words], capsys)


@pytest.mark.parametrize("argv,words", [
    (["--seed", "-1"], ["--seed", "-1"]),
    (["--seed", "abc"], ["--seed", "abc"]),
    (["--seed", str(2**64)], ["--seed"]),
    (["--replication", "-3"], ["--replication"]),
], ids=["seed-negative", "seed-text", "seed-2e64", "replication-negative"])
def test_simulate_flags(argv, words, capsys):
    expect_user_error(["simulate", *argv], words, capsys)


def test_out_under_a_file(tmp_path, capsys):
    path = put(tmp_path, "s.yaml", scenario(num_requests=5))
    blocker = put(tmp_path, "blocker", "x")
    expect_user_error(["simulate", path, "--out", blocker / "out", "--format", "csv"], ["blocker"], capsys)


# ---------------------------------------------------------------- traces

def trace_case(tmp: Path, name: str, content, fmt: str = "auto", **arrival) -> Path:
    trace = put(tmp, name, content) if content is not None else tmp / name
    d = scenario()
    d["workload"] = {"arrival": {"kind": "trace", "path": trace.name, "format": fmt, **arrival}, "num_requests": 5}
    return put(tmp, "s.yaml", d)


PLAIN_HEAD = "arrival_s,input_tokens,output_tokens\n"
TRACE_CASES = {
    "directory": (lambda t: (t / "tr.csv").mkdir() or trace_case(t, "tr.csv", None), ["tr.csv", "is a directory"]),
    "missing": (lambda t: trace_case(t, "gone.csv", None), ["gone.csv", "no such file"]),
    "binary": (lambda t: trace_case(t, "b.csv", b"\x00\x9f\x92\x96" * 50), ["b.csv", "binary"]),
    "utf16": (lambda t: trace_case(t, "u.csv", (PLAIN_HEAD + "0,5,5\n").encode("utf-16")), ["u.csv", "UTF-16"]),
    "latin1-csv": (lambda t: trace_case(t, "l.csv", (PLAIN_HEAD + "0,5,5\n1,6,\xe9\n").encode("latin-1"), "plain"),
                   ["l.csv", "line 3", "UTF-8"]),
    "latin1-jsonl": (lambda t: trace_case(t, "l.jsonl", '{"arrival_s": 0, "input_tokens": 5, "output_tokens": 5, '
                                          '"x": "caf\xe9"}\n'.encode("latin-1"), "plain"), ["l.jsonl", "UTF-8"]),
    "mixed-time-zones": (lambda t: trace_case(t, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                              "2023-11-16 18:15:46+00:00,10,5\n2023-11-16 18:15:47+05:00,10,5\n"
                                              "2023-11-16 18:15:48,10,5\n"), ["az.csv", "TIMESTAMP"]),
    "arrivals-1e308": (lambda t: trace_case(t, "big.csv", PLAIN_HEAD + "-1e308,5,5\n1e308,5,5\n"),
                       ["big.csv", "line 2", "arrival_s"]),
    "arrival-nan": (lambda t: trace_case(t, "nan.csv", PLAIN_HEAD + "0,5,5\nnan,5,5\n"), ["nan.csv", "line 3"]),
    "jsonl-nan-constant": (lambda t: trace_case(t, "c.jsonl", '{"arrival_s": NaN, "input_tokens": 5, '
                                                '"output_tokens": 5}\n', "plain"), ["c.jsonl", "line 1", "NaN"]),
    "jsonl-list-line": (lambda t: trace_case(t, "ll.jsonl", "[1, 2, 3]\n", "plain"), ["ll.jsonl", "line 1"]),
    "hash-blocks-outnumber-tokens": (lambda t: trace_case(t, "mc.jsonl", json.dumps(
        {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": list(range(100))}) + "\n"),
        ["mc.jsonl", "line 1", "hash_ids", "100 blocks"]),
    "hash-id-overflow": (lambda t: trace_case(t, "ho.jsonl", json.dumps(
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [10**30]}) + "\n"),
        ["ho.jsonl", "line 1", "hash_ids"]),
    "empty": (lambda t: trace_case(t, "e.csv", ""), ["e.csv", "empty"]),
    "header-only": (lambda t: trace_case(t, "h.csv", PLAIN_HEAD, "plain"), ["h.csv", "no rows"]),
    "missing-column": (lambda t: trace_case(t, "m.csv", "arrival_s,input_tokens\n0,5\n", "plain"),
                       ["m.csv", "output_tokens"]),
    "zero-prompt": (lambda t: trace_case(t, "z.csv", PLAIN_HEAD + "0,0,5\n", "plain"), ["z.csv", "line 2"]),
    "huge-token-count": (lambda t: trace_case(t, "tk.jsonl", '{"arrival_s": 0, "input_tokens": 1e400, '
                                              '"output_tokens": 5}\n', "plain"), ["tk.jsonl", "line 1"]),
    "unknown-format": (lambda t: trace_case(t, "w.csv", "a,b,c\n1,2,3\n"), ["w.csv", "cannot tell the trace format"]),
}


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_trace(case, tmp_path, capsys):
    make, words = TRACE_CASES[case]
    expect_user_error(["simulate", make(tmp_path)], words, capsys)


def test_trace_is_read_only_as_far_as_the_scenario_needs(tmp_path, capsys):
    """num_requests: 20 reads 20 rows; the garbage after them (and the file's size) never matters."""
    rows = "".join(f"{i * 0.1:.1f},50,10\n" for i in range(20))
    trace = put(tmp_path, "t.csv", PLAIN_HEAD + rows + "garbage,x,y\n" * 200_000)
    d = scenario()
    d["workload"] = {"arrival": {"kind": "trace", "path": trace.name, "format": "plain"}, "num_requests": 20}
    rc, out, took = run_main(["simulate", put(tmp_path, "s.yaml", d)], capsys)
    assert rc == 0, out
    assert took < 5.0


# ---------------------------------------------------------------- config.json

def with_cfg(**change) -> dict:
    cfg = dict(LLAMA or {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                         "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256})
    for k, v in change.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


CONFIG_CASES = {
    "zero-heads": (with_cfg(num_attention_heads=0), "num_attention_heads"),
    "zero-kv-heads": (with_cfg(num_key_value_heads=0), "num_kv_heads"),
    "zero-layers": (with_cfg(num_hidden_layers=0), "num_layers"),
    "string-hidden-size": (with_cfg(hidden_size="4096"), "hidden_size"),
    "fractional-hidden-size": (with_cfg(hidden_size=1.9), "hidden_size"),
    "negative-intermediate": (with_cfg(intermediate_size=-14336), "intermediate_size"),
    "bool-vocab": (with_cfg(vocab_size=True), "vocab_size"),
    "missing-vocab": (with_cfg(vocab_size=None), "vocab_size"),
    "experts-per-token-above-experts": (with_cfg(num_local_experts=4, num_experts_per_tok=8,
                                                 moe_intermediate_size=1024), "num_experts_per_tok"),
    "moe-without-top-k": (with_cfg(num_local_experts=4, moe_intermediate_size=1024), "num_experts_per_tok"),
    "text-config-string": (with_cfg(text_config="oops"), "text_config"),
    "layer-types-string": (with_cfg(layer_types="full_attention"), "layer_types"),
    "list": ([1, 2, 3], "JSON object"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_model_config(case, tmp_path, capsys):
    cfg, words = CONFIG_CASES[case]
    path = put(tmp_path, "m/config.json", json.dumps(cfg))
    expect_user_error(["perf", path, "--gpu", "H100"], ["config.json", words], capsys)


RAW_CONFIG_CASES = {
    "nan": (lambda t: put(t, "m/config.json", json.dumps(with_cfg(hidden_size=float("nan")))), ["NaN"]),
    "overflow": (lambda t: put(t, "m/config.json", json.dumps(with_cfg()).replace("4096", "1e999", 1)),
                 ["1e999"]),
    "duplicate-key": (lambda t: put(t, "m/config.json", '{"hidden_size": 4096, "hidden_size": 8}'),
                      ["duplicate key 'hidden_size'"]),
    "binary": (lambda t: put(t, "m/config.json", b"\x00\x00\x01\x02"), ["binary"]),
    "not-json": (lambda t: put(t, "m/config.json", "{hidden_size: 4096"), ["line 1", "not valid JSON"]),
    "folder-without-config": (lambda t: (t / "m").mkdir() or t / "m", ["no config.json"]),
    "missing-path": (lambda t: t / "nothere" / "config.json", ["no such file or folder"]),
}


@pytest.mark.parametrize("case", sorted(RAW_CONFIG_CASES))
def test_model_config_file(case, tmp_path, capsys):
    make, words = RAW_CONFIG_CASES[case]
    expect_user_error(["perf", make(tmp_path), "--gpu", "H100"], ["m" if case != "missing-path" else "nothere",
                                                                 *words], capsys)


# ---------------------------------------------------------------- hardware files

def hw_case(tmp: Path, files: dict[str, object]) -> Path:
    root = tmp / "hw"
    root.mkdir()
    for rel, content in files.items():
        if content is None:
            (root / rel).mkdir(parents=True)
        else:
            put(root, rel, content)
    return root


def gpu_with(**figures) -> str:
    d = yaml.safe_load(GPU)
    d["name"], d["aliases"] = "Lab-GPU", []
    for k, v in figures.items():
        if k == "peak_flops":
            d["peak_flops"]["bf16"]["value"] = v
        elif k == "price":
            d["price_usd_per_hour"]["value"] = v
        else:
            d[k]["value"] = v
    return yaml.safe_dump(d, sort_keys=False)


def link_with(**figures) -> str:
    d = yaml.safe_load(LINK)
    d["name"], d["aliases"] = "lab-link", []
    for k, v in figures.items():
        d[k]["value"] = v
    return yaml.safe_dump(d, sort_keys=False)


HW_CASES = {
    "gpu-zero-bandwidth": ({"gpus/lab.yaml": gpu_with(memory_bandwidth_Bps=0)}, ["lab.yaml", "memory_bandwidth_Bps"]),
    "gpu-zero-flops": ({"gpus/lab.yaml": gpu_with(peak_flops=0)}, ["lab.yaml", "peak_flops"]),
    "gpu-zero-memory": ({"gpus/lab.yaml": gpu_with(memory_bytes=0)}, ["lab.yaml", "memory_bytes"]),
    "gpu-zero-nvlink": ({"gpus/lab.yaml": gpu_with(intra_node_bandwidth_Bps=0)}, ["lab.yaml", "intra_node"]),
    "gpu-infinite-price": ({"gpus/lab.yaml": gpu_with(price=float("inf"))}, ["lab.yaml", "price_usd_per_hour"]),
    "gpu-nan-memory": ({"gpus/lab.yaml": gpu_with(memory_bytes=float("nan"))}, ["lab.yaml", "memory_bytes"]),
    "gpu-memory-1e-308": ({"gpus/lab.yaml": gpu_with(memory_bytes=1e-308)}, ["lab.yaml", "memory_bytes"]),
    "gpu-bandwidth-1e-308": ({"gpus/lab.yaml": gpu_with(memory_bandwidth_Bps=1e-308)},
                             ["lab.yaml", "memory_bandwidth_Bps"]),
    "gpu-flops-1e-308": ({"gpus/lab.yaml": gpu_with(peak_flops=1e-308)}, ["lab.yaml", "peak_flops"]),
    "gpu-memory-in-GB": ({"gpus/lab.yaml": gpu_with(memory_bytes=80)}, ["lab.yaml", "memory_bytes"]),
    "gpu-flops-true": ({"gpus/lab.yaml": gpu_with(peak_flops=True)}, ["lab.yaml", "yes/no value"]),
    "gpu-same-name-twice": ({"gpus/a.yaml": gpu_with(), "gpus/b.yaml": gpu_with()}, ["b.yaml", "Lab-GPU", "a.yaml"]),
    "gpu-duplicate-key": ({"gpus/lab.yaml": gpu_with() + "vendor: amd\n"}, ["lab.yaml", "duplicate key 'vendor'"]),
    "gpu-binary": ({"gpus/lab.yaml": b"\x00\xffGPU"}, ["lab.yaml", "binary"]),
    "gpu-file-is-folder": ({"gpus/lab.yaml": None}, ["lab.yaml", "is a directory"]),
    "gpu-billion-laughs": ({"gpus/lab.yaml": LAUGHS}, ["lab.yaml", "aliases"]),
    "link-zero-bandwidth": ({"links/l.yaml": link_with(bandwidth_Bps=0)}, ["l.yaml", "bandwidth_Bps"]),
    "link-zero-efficiency": ({"links/l.yaml": link_with(efficiency=0)}, ["l.yaml", "efficiency"]),
    "link-efficiency-above-1": ({"links/l.yaml": link_with(efficiency=3)}, ["l.yaml", "efficiency"]),
    "model-zero-heads": ({"models/m/config.json": json.dumps(with_cfg(num_attention_heads=0))},
                         ["config.json", "num_attention_heads"]),
}


@pytest.mark.parametrize("case", sorted(HW_CASES))
def test_hardware_folder(case, tmp_path, capsys):
    files, words = HW_CASES[case]
    expect_user_error(["hw", "list", "gpus", "--hwdb", hw_case(tmp_path, files)], words, capsys)


def test_hwdb_folder_missing_or_a_file(tmp_path, capsys):
    expect_user_error(["hw", "list", "--hwdb", tmp_path / "none"], ["none", "does not exist"], capsys)
    expect_user_error(["hw", "list", "--hwdb", put(tmp_path, "gpu.yaml", GPU)], ["gpu.yaml", "is a file"], capsys)


# ---------------------------------------------------------------- plan

@pytest.mark.parametrize("case,change,words", [
    ("requests-1e9", {"search": {"requests": 10**9}}, ["search.requests"]),
    ("seed-negative", {"search": {"seed": -1}}, ["search.seed"]),
    ("rate-inf", {"workload": {**PLAN["workload"], "arrival": {"kind": "poisson", "rate": float("inf")}}},
     ["workload.arrival.rate"]),
    ("slo-nan", {"slo": {"ttft_s": float("nan"), "tpot_s": 0.05}}, ["slo.ttft_s"]),
    ("no-gpus", {"gpus": []}, ["gpus"]),
], ids=lambda x: x if isinstance(x, str) else "")
def test_plan_request(case, change, words, tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", {**copy.deepcopy(PLAN), **change})
    expect_user_error(["plan", path, "--quiet"], ["plan.yaml", *words], capsys)


@pytest.mark.parametrize("argv,words", [
    (["--workers", "0"], ["--workers"]),
    (["--top", "-1"], ["--top"]),
    (["--workers", "many"], ["--workers"]),
], ids=["workers-0", "top-negative", "workers-text"])
def test_plan_flags(argv, words, capsys):
    expect_user_error(["plan", REPO / "examples" / "plan_llama8b.yaml", *argv], words, capsys)


def test_plan_files(tmp_path, capsys):
    expect_user_error(["plan", tmp_path], [str(tmp_path), "is a directory"], capsys)
    expect_user_error(["plan", put(tmp_path, "bl.yaml", LAUGHS)], ["bl.yaml", "billion laughs"], capsys)


# ---------------------------------------------------------------- regress

def suite(tmp: Path) -> Path:
    put(tmp, "s.yaml", scenario(num_requests=10))
    return put(tmp, "suite.yaml", {"name": "hostile", "entries": [
        {"id": "one", "scenario": "s.yaml", "figures": {"ttft_p50_s": None}}]})


BASELINE_CASES = {
    "list": ([1, 2], "not an epdsim regress baseline"),
    "entries-list": ({"entries": []}, "not an epdsim regress baseline"),
    "entry-number": ({"entries": {"one": 5}}, "entries.one"),
    "figures-string": ({"entries": {"one": {"fingerprint": "x", "figures": "fast"}}}, "entries.one.figures"),
    "figure-string": ({"entries": {"one": {"fingerprint": "x", "figures": {"ttft_p50_s": "low"}}}},
                      "entries.one.figures.ttft_p50_s"),
    "fingerprint-list": ({"entries": {"one": {"fingerprint": [1], "figures": {}}}}, "entries.one.fingerprint"),
}


@pytest.mark.parametrize("case", sorted(BASELINE_CASES))
def test_regress_baseline(case, tmp_path, capsys):
    from simulator.regress.compare import FORMAT
    content, words = BASELINE_CASES[case]
    if isinstance(content, dict) and "format" not in content:
        content = {"format": FORMAT, "suite": "hostile", **content}
    base = put(tmp_path, "base.json", json.dumps(content))
    expect_user_error(["regress", suite(tmp_path), "--baseline", base], ["base.json", words], capsys)


@pytest.mark.parametrize("case", ["directory", "binary", "utf16", "not-json", "nan"])
def test_regress_baseline_file(case, tmp_path, capsys):
    p = tmp_path / "base.json"
    {"directory": lambda: p.mkdir(), "binary": lambda: p.write_bytes(b"\x00\x01"),
     "utf16": lambda: p.write_bytes('{"format": 1}'.encode("utf-16")), "not-json": lambda: p.write_text("{oops"),
     "nan": lambda: p.write_text('{"format": NaN}')}[case]()
    expect_user_error(["regress", suite(tmp_path), "--baseline", p], ["base.json"], capsys)


@pytest.mark.parametrize("case", ["directory", "binary", "duplicate-key", "billion-laughs", "scenario-is-folder"])
def test_regress_suite_file(case, tmp_path, capsys):
    if case == "scenario-is-folder":
        (tmp_path / "s.yaml").mkdir()
        path = put(tmp_path, "suite.yaml", {"name": "x", "entries": [{"id": "a", "scenario": "s.yaml",
                                                                      "figures": {"ttft_p50_s": None}}]})
        expect_user_error(["regress", path], ["s.yaml", "is a directory"], capsys)
        return
    p = tmp_path / "suite.yaml"
    {"directory": lambda: p.mkdir(), "binary": lambda: p.write_bytes(b"\x00name: x"),
     "duplicate-key": lambda: p.write_text("name: a\nname: b\n"), "billion-laughs": lambda: p.write_text(LAUGHS)}[case]()
    expect_user_error(["regress", p], ["suite.yaml"], capsys)


# ---------------------------------------------------------------- calibration bundles

def bundle(tmp: Path, manifest, records: str | None = None) -> Path:
    b = tmp / "bundle"
    (b / "records").mkdir(parents=True)
    put(b, "manifest.json", manifest if isinstance(manifest, (str, bytes)) else json.dumps(manifest))
    if records is not None:
        put(b, "records/p.jsonl", records)
    return b


GOOD_MANIFEST = {"schema_version": 1, "created": "2026-01-01T00:00:00Z", "mode": "attach",
                 "model": {"served_name": "m"}, "plan": [], "runs": []}
BUNDLE_CASES = {
    "not-a-bundle": (lambda t: t, ["manifest.json"]),
    "manifest-binary": (lambda t: bundle(t, b"\x00\x01"), ["manifest.json", "binary"]),
    "manifest-list": (lambda t: bundle(t, [1]), ["manifest.json", "JSON object"]),
    "manifest-folder": (lambda t: (t / "bundle" / "manifest.json").mkdir(parents=True) or t / "bundle",
                        ["manifest.json", "is a directory"]),
    "plan-string": (lambda t: bundle(t, {**GOOD_MANIFEST, "plan": "all"}), ["manifest.json", "plan"]),
    "runs-of-numbers": (lambda t: bundle(t, {**GOOD_MANIFEST, "runs": [1, 2]}), ["manifest.json", "runs[0]"]),
    "plan-without-name": (lambda t: bundle(t, {**GOOD_MANIFEST, "plan": [{"kind": "load"}]}), ["plan[0].name"]),
    "served-name-missing": (lambda t: bundle(t, {**GOOD_MANIFEST, "model": {}}), ["served_name"]),
    "record-list": (lambda t: bundle(t, GOOD_MANIFEST, "[1, 2]\n"), ["p.jsonl"]),
    "request-without-id": (lambda t: bundle(t, GOOD_MANIFEST, '{"kind": "request", "model": "m"}\n'),
                           ["p.jsonl", "id"]),
}


@pytest.mark.parametrize("content,words", [(b"\x00\x01", "binary"), ("- a\n- b\n", "mapping"),
                                           ("name: a\nname: b\n", "duplicate key 'name'")],
                         ids=["binary", "list", "duplicate-key"])
def test_calibration_profile_file(content, words, tmp_path, capsys):
    b = bundle(tmp_path, GOOD_MANIFEST)
    prof = put(tmp_path, "hw/profiles/p.yaml", content)
    expect_user_error(["calibrate", "validate", b, "--profile", prof], ["p.yaml", words], capsys)


@pytest.mark.parametrize("case", sorted(BUNDLE_CASES))
def test_calibration_bundle(case, tmp_path, capsys):
    make, words = BUNDLE_CASES[case]
    expect_user_error(["calibrate", "show", make(tmp_path)], words, capsys)


# ---------------------------------------------------------------- command-line numbers

@pytest.mark.parametrize("argv,words", [
    (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "inf"], ["--horizon"]),
    (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "nan"], ["--horizon"]),
    (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "0"], ["--horizon"]),
    (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "1e300"], ["--horizon"]),
    (["coldstart", "Llama-3.1-8B", "--gpu", "H100", "--tp", "0"], ["--tp"]),
    (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--prompt", "0"], ["--prompt"]),
    (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--prompt", "1000000"], ["--prompt", "max_model_len"]),
    (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--tp", "0"], ["--tp"]),
    (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--tp", "3"], ["tp=3"]),
    (["perf", "Llama-3.1-8B", "--gpu", "H100", "--pp", "0"], ["--pp"]),
    (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=1e999"], ["--tp-times", "2=1e999"]),
    (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=nan"], ["--tp-times"]),
    (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=-1"], ["--tp-times"]),
    (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=0.5", "2=0.4"], ["TP 2 twice"]),
    (["vision", "Qwen2.5-VL-7B", "--resolution", "99999999x99999999"], ["--resolution", "65536"]),
    (["vision", "Qwen2.5-VL-7B", "--tp", "0"], ["--tp"]),
    (["calibrate", "run", "--out", REPO / "README.md" / "bundle", "--attach", "http://127.0.0.1:1"],
     ["README.md", "is a file"]),
], ids=["horizon-inf", "horizon-nan", "horizon-0", "horizon-1e300", "coldstart-tp-0", "crossover-prompt-0",
        "crossover-prompt-above-max-len", "crossover-tp-0", "crossover-tp-3", "perf-pp-0", "tp-times-1e999",
        "tp-times-nan", "tp-times-negative", "tp-times-twice", "vision-resolution-huge", "vision-tp-0",
        "calibrate-out-under-a-file"])
def test_command_line_numbers(argv, words, capsys):
    expect_user_error(argv, words, capsys)


# ---------------------------------------------------------------- messages printed literally

def test_error_text_is_not_markup(tmp_path, capsys):
    path = put(tmp_path, "s.yaml", setting(scenario(), "pools.0.gpu", ":x: [bold]H100[/bold]"))
    out = expect_user_error(["simulate", path], [":x:", "[bold]H100[/bold]"], capsys)
    assert "\u274c" not in out


# ---------------------------------------------------------------- subprocesses (the real entry point)

@pytest.mark.parametrize("case", ["billion-laughs", "binary", "rate-nan", "markup"])
def test_subprocess(case, tmp_path):
    content = {"billion-laughs": LAUGHS, "binary": b"\x00\x01\x02",
               "rate-nan": yaml.safe_dump(setting(scenario(), "workload.arrival.rate", float("nan"))),
               "markup": yaml.safe_dump(setting(scenario(), "pools.0.gpu", ":x:"))}[case]
    path = put(tmp_path, "s.yaml", content)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(path)], cwd=REPO,
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert ("pools[main].gpu" if case == "markup" else "s.yaml") in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30        # includes the interpreter's start and imports
    if case == "markup":
        assert ":x:" in r.stderr and "\u274c" not in r.stderr


# ---------------------------------------------------------------- the app's upload sandbox

def _app_error(fn, *args, **kw) -> str:
    from app.services.scenarios import InputError
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        fn(*args, **kw)
    assert time.monotonic() - t0 < 5.0
    msg = str(info.value)
    assert "root:" not in msg and "Traceback" not in msg      # nothing of /etc/passwd is shown
    return msg


SANDBOX_CASES = {
    "trace-etc-passwd": ("workload", {"arrival": {"kind": "trace", "path": "/etc/passwd"}}, "workload.arrival.path"),
    "trace-dotdot": ("workload", {"arrival": {"kind": "trace", "path": "../../../../etc/passwd"}},
                     "workload.arrival.path"),
    "empirical-lengths": ("workload", {"arrival": {"kind": "poisson", "rate": 1}, "num_requests": 5,
                                       "input_length": {"kind": "empirical", "path": "/etc/passwd", "column": "root"},
                                       "output_length": {"kind": "fixed", "value": 5}}, "workload.input_length.path"),
    "pairs": ("workload", {"arrival": {"kind": "poisson", "rate": 1}, "num_requests": 5,
                           "lengths": {"kind": "pairs", "path": "/etc/passwd", "input_column": "a",
                                       "output_column": "b"}}, "workload.lengths.path"),
    "hwdb-etc": ("hwdb", ["/etc"], "hwdb[0]"),
    "model-etc": ("model", "/etc", "model"),
    "model-json": ("model", "/proc/self/environ.json", "model"),
}


@pytest.mark.parametrize("case", sorted(SANDBOX_CASES))
def test_uploaded_scenario_reads_only_its_own_files(case, tmp_path):
    from app.services import scenarios
    key, value, field = SANDBOX_CASES[case]
    data = yaml.safe_dump({**scenario(), key: value}).encode()
    msg = _app_error(scenarios.parse_yaml_upload, "up.yaml", data, folder=tmp_path)
    assert "up.yaml" in msg and field in msg and "outside the files uploaded" in msg


def test_uploaded_scenario_may_name_a_trace_uploaded_with_it(tmp_path):
    from app.services import scenarios
    d = scenario()
    d["workload"] = {"arrival": {"kind": "trace", "path": "mine.csv"}, "num_requests": 2}
    got = scenarios.parse_yaml_upload("up.yaml", yaml.safe_dump(d).encode(), folder=tmp_path,
                                      files=(("mine.csv", (PLAIN_HEAD + "0,5,5\n1,5,5\n").encode()),))
    assert got["workload"]["arrival"]["path"] == str(tmp_path / "mine.csv")


@pytest.mark.parametrize("name,words", [
    ("..", "not a usable file name"), ("a\x00b.csv", "NUL"), ("x" * 300 + ".csv", "255 bytes"), ("", "not a usable"),
], ids=["dotdot", "nul", "long", "empty"])
def test_upload_file_names(name, words, tmp_path):
    from app.services import scenarios
    assert words in _app_error(scenarios.save_upload, "traces", name, b"x", folder=tmp_path)


@pytest.mark.parametrize("case", ["billion-laughs", "duplicate-key", "utf16", "deep"])
def test_upload_yaml_checks(case, tmp_path):
    from app.services import planning, scenarios
    data = {"billion-laughs": LAUGHS.encode(), "duplicate-key": b"model: a\nmodel: b\n",
            "utf16": "model: a\n".encode("utf-16"), "deep": b"model: " + b"[" * 20000}[case]
    assert "up.yaml" in _app_error(scenarios.parse_yaml_upload, "up.yaml", data, folder=tmp_path)
    assert "up.yaml" in _app_error(planning.parse_upload, "up.yaml", data, folder=tmp_path)


def test_plan_upload_is_sandboxed(tmp_path):
    from app.services import planning
    req = {**copy.deepcopy(PLAN), "hwdb": ["/etc"]}
    assert "hwdb[0]" in _app_error(planning.parse_upload, "plan.yaml", yaml.safe_dump(req).encode(), folder=tmp_path)


def test_config_upload_stays_in_its_folder(tmp_path):
    from app.services import scenarios
    cfg = {**with_cfg(), "_name_or_path": "../../.."}
    path = Path(scenarios.model_from_config_upload("config.json", json.dumps(cfg).encode(), folder=tmp_path))
    assert tmp_path in path.parents
    msg = _app_error(scenarios.model_from_config_upload, "config.json",
                     json.dumps(with_cfg(num_attention_heads=0)).encode(), folder=tmp_path)
    assert "num_attention_heads" in msg


def test_uploads_go_to_a_private_folder_per_session():
    from app.services import scenarios
    a, b = scenarios.new_upload_dir(), scenarios.new_upload_dir()
    try:
        assert a != b and (a.stat().st_mode & 0o077) == 0
    finally:
        a.rmdir()
        b.rmdir()


def test_hardware_upload_cannot_silently_replace_shipped_entries(tmp_path):
    from app.services import hardware
    shipped = GPU.replace("memory_bandwidth_Bps: {value:", "memory_bandwidth_Bps: {value: 0, x:", 0)
    msg = _app_error(hardware.add_yaml, "gpus", "h100.yaml", GPU.encode(), user_dir=tmp_path)
    assert "replace the shipped" in msg and not (tmp_path / "gpus").exists()
    bad = yaml.safe_load(GPU)
    bad["memory_bandwidth_Bps"]["value"] = 0
    msg = _app_error(hardware.add_yaml, "gpus", "h100.yaml", yaml.safe_dump(bad).encode(), user_dir=tmp_path,
                     override=True)
    assert "memory_bandwidth_Bps" in msg
    assert shipped       # the explicit override is the only way, and even then the schema applies
    saved = hardware.add_yaml("gpus", "h100.yaml", GPU.encode(), user_dir=tmp_path, override=True)
    assert saved.exists()


# ---------------------------------------------------------------- what stays allowed

def test_ordinary_anchors_aliases_and_merge_keys_still_load():
    """The alias budget and the duplicate-key check leave ordinary YAML alone: anchors reused a few
    times, and merge keys whose entries an explicit key overrides."""
    from simulator.inputs import parse_yaml
    data = parse_yaml("base: &b {gpu: H100, tp: 1}\npools:\n  - {<<: *b, name: a}\n  - {<<: *b, name: b, tp: 2}\n"
                      "lengths: &l [1, 2, 3]\nagain: *l\n", "ok.yaml")
    assert data["pools"][1] == {"gpu": "H100", "tp": 2, "name": "b"} and data["again"] == [1, 2, 3]
