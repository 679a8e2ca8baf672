"""Hostile input, part 1: scenario files, scenario numbers, traces and model config.json files, given as
a careless or hostile user would.

Each case builds its bad input in ``tmp_path`` and runs the CLI in-process (``simulator.cli.main``):
exit code 2, no traceback, the file or field named, under 5 s (:func:`tests.hostile.expect_user_error`).
The classes: files that are folders, binary, UTF-16 or latin-1, too large, billion-laughs YAML,
duplicate keys; numbers that are infinite, NaN, degenerate or outside physical ranges; bounded work.
Hardware folders, plans, regress suites, calibration bundles, command-line numbers and subprocesses:
tests/test_hostile_input_tools.py; the app's upload sandbox: tests/test_hostile_input_uploads.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simulator.scenario import resolve_relative
from tests.hostile import LAUGHS, PLAIN_HEAD, REPO, expect_user_error, put, run_main, scenario, setting, with_cfg

# ---------------------------------------------------------------- scenario files

FILE_CASES = {
    "directory": (lambda t: (t / "d.yaml").mkdir() or t / "d.yaml", ["d.yaml", "is a directory"]),
    "missing": (lambda t: t / "nope.yaml", ["nope.yaml", "no such file"]),
    "under-a-file": (lambda t: put(t, "f.yaml", "x: 1") / "s.yaml", ["s.yaml", "is a file, not a folder"]),
    "binary": (lambda t: put(t, "b.yaml", b"\x00\x01\x02model: x\xff"), ["b.yaml", "binary"]),
    "utf16": (lambda t: put(t, "u.yaml", "model: x\n".encode("utf-16")), ["u.yaml", "UTF-16"]),
    "latin1": (
        lambda t: put(t, "l.yaml", "name: caf\xe9\nmodel: x\n".encode("latin-1")),
        ["l.yaml", "line 1", "UTF-8"],
    ),
    "billion-laughs": (lambda t: put(t, "bl.yaml", LAUGHS), ["bl.yaml", "aliases", "billion laughs"]),
    "recursive-alias": (lambda t: put(t, "r.yaml", "model: &a [1, *a]\n"), ["r.yaml", "recursive"]),
    "huge": (lambda t: put(t, "h.yaml", "# pad\n" * 300_000), ["h.yaml", "MiB", "limit"]),
    "duplicate-top-key": (
        lambda t: put(t, "k.yaml", yaml.safe_dump(scenario()) + "seed: 3\nseed: 4\n"),
        ["k.yaml", "duplicate key 'seed'", "line"],
    ),
    "duplicate-nested-key": (
        lambda t: put(t, "n.yaml", "model: Llama-3.1-8B\npools:\n  - gpu: H100\n    gpu: A100\n"),
        ["n.yaml", "duplicate key 'gpu'", "line 4"],
    ),
    "deep-nesting": (lambda t: put(t, "deep.yaml", "model: " + "[" * 20000 + "]" * 20000 + "\n"), ["deep.yaml"]),
    "python-tag": (
        lambda t: put(t, "p.yaml", "model: !!python/object/apply:os.system ['true']\n"),
        ["p.yaml", "not valid YAML"],
    ),
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
    "lognormal-cv-1e300": (
        "workload.input_length",
        {"kind": "lognormal", "mean": 100, "cv": 1e300},
        "workload.input_length.cv",
    ),
    "lognormal-mean-inf": (
        "workload.input_length",
        {"kind": "lognormal", "mean": float("inf"), "cv": 1},
        "workload.input_length.mean",
    ),
    "fixed-length-0": ("workload.output_length", {"kind": "fixed", "value": 0}, "workload.output_length.value"),
    "fixed-length-1e12": ("workload.input_length", {"kind": "fixed", "value": 10**12}, "workload.input_length.value"),
    "uniform-reversed": ("workload.input_length", {"kind": "uniform", "low": 9, "high": 2}, "workload.input_length"),
    "num-requests-0": ("workload.num_requests", 0, "workload.num_requests"),
    "num-requests-1e12": ("workload.num_requests", 10**12, "workload.num_requests"),
    "duration-inf": ("workload.duration_s", float("inf"), "workload.duration_s"),
    "concurrency-0": ("workload.arrival", {"kind": "closed", "concurrency": 0}, "workload.arrival.concurrency"),
    "concurrency-1e15": ("workload.arrival", {"kind": "closed", "concurrency": 10**15}, "workload.arrival.concurrency"),
    "think-time-inf": (
        "workload.arrival",
        {"kind": "closed", "concurrency": 4, "think_time_s": float("inf")},
        "workload.arrival.think_time_s",
    ),
    "warmup-negative": (
        "workload.arrival",
        {"kind": "closed", "concurrency": 4, "warmup_requests": -1},
        "workload.arrival.warmup_requests",
    ),
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
    text = yaml.safe_dump(data, sort_keys=False)  # .inf / .nan as YAML writes them
    path = put(tmp_path, "s.yaml", text)
    expect_user_error(
        ["simulate", path],
        ["s.yaml" if case not in ("pp-above-layers", "tp-3", "unknown-gpu", "unknown-model") else "", words],
        capsys,
    )


@pytest.mark.parametrize(
    "example,where,value,words",
    [
        ("autoscale_step_load", "operations.autoscale.main.interval_s", 1e-308, "interval_s"),
        ("autoscale_step_load", "operations.startup.provisioning_s", float("inf"), "provisioning_s"),
        ("fp8_decode_crashes_pd", "operations.faults.fp8_crash.rate_per_token_s", 1e308, "rate_per_token_s"),
        ("fp8_decode_crashes_pd", "operations.faults.node_failure", {"mtbf_s": 1e-308}, "mtbf_s"),
        (
            "fp8_decode_crashes_pd",
            "operations.faults.link_degradation",
            {"mtbf_s": 1e-308, "duration_s": 1, "bandwidth_factor": 0.5},
            "mtbf_s",
        ),
    ],
    ids=["autoscale-interval-1e-308", "provisioning-inf", "fp8-rate-1e308", "node-mtbf-1e-308", "link-mtbf-1e-308"],
)
def test_operations_that_could_never_end(example, where, value, words, tmp_path, capsys):
    """Event rates that would keep a run from ending (a tick or a failure every 1e-308 s) are refused."""
    ex = REPO / "examples" / f"{example}.yaml"
    d = resolve_relative(yaml.safe_load(ex.read_text()), ex.parent)
    path = put(tmp_path, "ops.yaml", setting(d, where, value))
    expect_user_error(["simulate", path], ["ops.yaml", words], capsys)


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--seed", "-1"], ["--seed", "-1"]),
        (["--seed", "abc"], ["--seed", "abc"]),
        (["--seed", str(2**64)], ["--seed"]),
        (["--replication", "-3"], ["--replication"]),
    ],
    ids=["seed-negative", "seed-text", "seed-2e64", "replication-negative"],
)
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


TRACE_CASES = {
    "directory": (lambda t: (t / "tr.csv").mkdir() or trace_case(t, "tr.csv", None), ["tr.csv", "is a directory"]),
    "missing": (lambda t: trace_case(t, "gone.csv", None), ["gone.csv", "no such file"]),
    "binary": (lambda t: trace_case(t, "b.csv", b"\x00\x9f\x92\x96" * 50), ["b.csv", "binary"]),
    "utf16": (lambda t: trace_case(t, "u.csv", (PLAIN_HEAD + "0,5,5\n").encode("utf-16")), ["u.csv", "UTF-16"]),
    "latin1-csv": (
        lambda t: trace_case(t, "l.csv", (PLAIN_HEAD + "0,5,5\n1,6,\xe9\n").encode("latin-1"), "plain"),
        ["l.csv", "line 3", "UTF-8"],
    ),
    "latin1-jsonl": (
        lambda t: trace_case(
            t,
            "l.jsonl",
            '{"arrival_s": 0, "input_tokens": 5, "output_tokens": 5, "x": "caf\xe9"}\n'.encode("latin-1"),
            "plain",
        ),
        ["l.jsonl", "UTF-8"],
    ),
    "mixed-time-zones": (
        lambda t: trace_case(
            t,
            "az.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:15:46+00:00,10,5\n2023-11-16 18:15:47+05:00,10,5\n"
            "2023-11-16 18:15:48,10,5\n",
        ),
        ["az.csv", "TIMESTAMP"],
    ),
    "arrivals-1e308": (
        lambda t: trace_case(t, "big.csv", PLAIN_HEAD + "-1e308,5,5\n1e308,5,5\n"),
        ["big.csv", "line 2", "arrival_s"],
    ),
    "arrival-nan": (lambda t: trace_case(t, "nan.csv", PLAIN_HEAD + "0,5,5\nnan,5,5\n"), ["nan.csv", "line 3"]),
    "jsonl-nan-constant": (
        lambda t: trace_case(t, "c.jsonl", '{"arrival_s": NaN, "input_tokens": 5, "output_tokens": 5}\n', "plain"),
        ["c.jsonl", "line 1", "NaN"],
    ),
    "jsonl-list-line": (lambda t: trace_case(t, "ll.jsonl", "[1, 2, 3]\n", "plain"), ["ll.jsonl", "line 1"]),
    "hash-blocks-outnumber-tokens": (
        lambda t: trace_case(
            t,
            "mc.jsonl",
            json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": list(range(100))}) + "\n",
        ),
        ["mc.jsonl", "line 1", "hash_ids", "100 blocks"],
    ),
    "hash-id-overflow": (
        lambda t: trace_case(
            t,
            "ho.jsonl",
            json.dumps({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [10**30]}) + "\n",
        ),
        ["ho.jsonl", "line 1", "hash_ids"],
    ),
    "empty": (lambda t: trace_case(t, "e.csv", ""), ["e.csv", "empty"]),
    "header-only": (lambda t: trace_case(t, "h.csv", PLAIN_HEAD, "plain"), ["h.csv", "no rows"]),
    "missing-column": (
        lambda t: trace_case(t, "m.csv", "arrival_s,input_tokens\n0,5\n", "plain"),
        ["m.csv", "output_tokens"],
    ),
    "zero-prompt": (lambda t: trace_case(t, "z.csv", PLAIN_HEAD + "0,0,5\n", "plain"), ["z.csv", "line 2"]),
    "huge-token-count": (
        lambda t: trace_case(t, "tk.jsonl", '{"arrival_s": 0, "input_tokens": 1e400, "output_tokens": 5}\n', "plain"),
        ["tk.jsonl", "line 1"],
    ),
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

CONFIG_CASES = {
    "zero-heads": (with_cfg(num_attention_heads=0), "num_attention_heads"),
    "zero-kv-heads": (with_cfg(num_key_value_heads=0), "num_kv_heads"),
    "zero-layers": (with_cfg(num_hidden_layers=0), "num_layers"),
    "string-hidden-size": (with_cfg(hidden_size="4096"), "hidden_size"),
    "fractional-hidden-size": (with_cfg(hidden_size=1.9), "hidden_size"),
    "negative-intermediate": (with_cfg(intermediate_size=-14336), "intermediate_size"),
    "bool-vocab": (with_cfg(vocab_size=True), "vocab_size"),
    "missing-vocab": (with_cfg(vocab_size=None), "vocab_size"),
    "experts-per-token-above-experts": (
        with_cfg(num_local_experts=4, num_experts_per_tok=8, moe_intermediate_size=1024),
        "num_experts_per_tok",
    ),
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
    "overflow": (lambda t: put(t, "m/config.json", json.dumps(with_cfg()).replace("4096", "1e999", 1)), ["1e999"]),
    "duplicate-key": (
        lambda t: put(t, "m/config.json", '{"hidden_size": 4096, "hidden_size": 8}'),
        ["duplicate key 'hidden_size'"],
    ),
    "binary": (lambda t: put(t, "m/config.json", b"\x00\x00\x01\x02"), ["binary"]),
    "not-json": (lambda t: put(t, "m/config.json", "{hidden_size: 4096"), ["line 1", "not valid JSON"]),
    "folder-without-config": (lambda t: (t / "m").mkdir() or t / "m", ["no config.json"]),
    "missing-path": (lambda t: t / "nothere" / "config.json", ["no such file or folder"]),
}


@pytest.mark.parametrize("case", sorted(RAW_CONFIG_CASES))
def test_model_config_file(case, tmp_path, capsys):
    make, words = RAW_CONFIG_CASES[case]
    expect_user_error(
        ["perf", make(tmp_path), "--gpu", "H100"], ["m" if case != "missing-path" else "nothere", *words], capsys
    )
