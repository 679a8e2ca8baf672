"""Bad input gets a clear one-paragraph error naming the field, the value and the fix.

Each case is checked twice: through the Python API (``load_scenario`` /
``parse_scenario`` then ``simulate``: the exception type and the words of its
message) and through the CLI as a subprocess (exit code 2, no traceback, the
same words on stderr, one paragraph: a header line plus indented field lines).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hwdb
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "llama8b_h100_chat.yaml"
DB = hwdb.load()


def base(num_requests: int = 50) -> dict:
    """The default example as a dict, with few requests so that any run is quick."""
    data = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    data["workload"]["num_requests"] = num_requests
    return data


def write(tmp_path: Path, data: dict | str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simulator.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "dumb"},
    )


def assert_paragraph(msg: str) -> None:
    """One paragraph: a header line, then only indented field lines, no blank lines."""
    lines = msg.strip().splitlines()
    assert lines, "empty message"
    assert all(line.startswith("  ") and line.strip() for line in lines[1:]), msg


def cli_error(*args: str, words: tuple[str, ...] = (), cwd: Path = REPO) -> str:
    r = cli(*args, cwd=cwd)
    assert r.returncode == 2, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: "), r.stderr
    assert r.stdout == "", r.stdout
    assert_paragraph(r.stderr)
    for w in words:
        assert w in r.stderr, f"{w!r} not in:\n{r.stderr}"
    return r.stderr


def api_error(path: Path, words: tuple[str, ...] = ()) -> str:
    """Load and run ``path``; it must raise ScenarioError (never a traceback of another type)."""
    with pytest.raises(ScenarioError) as info:
        simulate(load_scenario(path))
    msg = str(info.value)
    assert_paragraph(msg)
    for w in words:
        assert w in msg, f"{w!r} not in:\n{msg}"
    return msg


def check(path: Path, *words: str) -> str:
    """Both ways; returns the API message."""
    msg = api_error(path, words)
    cli_error("simulate", path, words=words)
    return msg


# ------------------------------------------------------------------ 1. YAML syntax


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "name: x\nmodel: [Llama-3.1-8B\npools: []\n", "broken.yaml")
    msg = check(path, "broken.yaml", "not valid YAML", "line 2")
    assert "<unicode string>" not in msg


def test_empty_and_non_mapping_files(tmp_path):
    check(write(tmp_path, "", "empty.yaml"), "empty.yaml", "empty", "model, pools and workload")
    check(write(tmp_path, "- 1\n- 2\n", "list.yaml"), "list.yaml", "mapping", "list")


# ------------------------------------------------------------------ 2. unknown keys


def test_unknown_top_level_key(tmp_path):
    data = base()
    data["bogus"] = 1
    check(write(tmp_path, data), "bogus", "unknown key", "workload")


def test_unknown_nested_key_names_the_path(tmp_path):
    data = base()
    data["pools"][0]["tpp"] = 2
    msg = check(write(tmp_path, data), "pools[0].tpp", "unknown key", "valid keys here")
    assert re.search(r"valid keys here:.*\btp\b", msg), msg  # the fix: the key it should have been
    assert "Tuple should have" not in msg  # no noise about the pool list being empty


def test_unknown_keys_via_parse_scenario():
    data = base()
    data["pools"][0]["engine"] = {"max_num_seq": 64}
    data["workload"]["arrival"]["rat"] = 3
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    msg = str(info.value)
    assert msg.startswith("scenario: invalid scenario:")
    assert "pools[0].engine.max_num_seq: unknown key" in msg and "max_num_seqs" in msg
    assert "workload.arrival.rat: unknown key" in msg and "rate" in msg
    assert_paragraph(msg)


def test_missing_required_field(tmp_path):
    data = base()
    del data["model"]
    check(write(tmp_path, data), "model", "required, but absent; add this key")


# ------------------------------------------------------------------ 3. unknown GPU


def test_unknown_gpu_lists_known_gpus(tmp_path):
    data = base()
    data["pools"][0]["gpu"] = "H900"
    check(write(tmp_path, data), "pools[main].gpu", "'H900'", "Known GPUs", "H100-SXM-80GB", "--hwdb")


# ------------------------------------------------------------------ 4. model does not fit

FIXES = ("TP", "fp8", "gpu_memory_utilization")


def _assert_fit_message(msg: str) -> None:
    assert re.search(r"\d+(\.\d+)? GB", msg), msg
    assert "KV cache" in msg
    assert any(f in msg for f in FIXES), msg


@pytest.mark.skipif("Llama-3.1-70B" not in DB.models, reason="Llama-3.1-70B not in hwdb yet")
def test_70b_does_not_fit_one_h100(tmp_path):
    data = base()
    data["model"] = "Llama-3.1-70B"
    msg = check(write(tmp_path, data), "pools[main]", "Llama-3.1-70B", "TP x PP >= ")
    _assert_fit_message(msg)


def test_weights_do_not_fit_at_low_gpu_memory_utilization(tmp_path):
    data = base()
    data["pools"][0]["engine"] = {"gpu_memory_utilization": 0.1}
    msg = check(write(tmp_path, data), "Llama-3.1-8B", "gpu_memory_utilization")
    _assert_fit_message(msg)


# ------------------------------------------------------------------ 5. KV cache < max_model_len


def test_kv_cache_smaller_than_max_model_len_says_what_to_set(tmp_path):
    data = base()
    data["pools"][0]["engine"] = {"gpu_memory_utilization": 0.25}
    msg = check(write(tmp_path, data), "max_model_len=131072", "max_model_len <=")
    n = int(re.search(r"max_model_len <= (\d+)", msg).group(1))
    assert 0 < n < 131072
    # Following the advice works: the same deployment with max_model_len = N resolves.
    data["pools"][0]["engine"]["max_model_len"] = n
    resolve(load_scenario(write(tmp_path, data, "fixed.yaml")))


# ------------------------------------------------------------------ 6. bad workload values


def test_negative_rate_names_the_field(tmp_path):
    data = base()
    data["workload"]["arrival"] = {"kind": "poisson", "rate": -5}
    msg = check(write(tmp_path, data), "workload.arrival.rate", "-5", "from 1e-6 to 1e7 requests/s")
    assert "poisson.rate" not in msg  # the union tag is not a key the user wrote


def test_workload_without_lengths(tmp_path):
    data = base()
    del data["workload"]["output_length"]
    check(write(tmp_path, data), "workload", "output_length")


# ------------------------------------------------------------------ 7. traces


def _trace_scenario(tmp_path: Path, trace: str, body: str) -> Path:
    (tmp_path / trace).write_text(body)
    data = base()
    data["workload"] = {"arrival": {"kind": "trace", "path": trace}}  # relative to the scenario
    return write(tmp_path, data)


def test_plain_trace_bad_row_names_file_and_line(tmp_path):
    path = _trace_scenario(
        tmp_path, "plain.csv", "arrival_s,input_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n1.0,abc,30\n1.5,300,40\n"
    )
    check(path, "plain.csv", "line 4", "input_tokens", "'abc'")


def test_azure_trace_bad_row_names_file_and_line(tmp_path):
    path = _trace_scenario(
        tmp_path,
        "azure.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:47.1000000,120,12\n"
        "2023-11-16 18:15:48.2000000,80,-3\n",
    )
    check(path, "azure.csv", "line 4", "GeneratedTokens", "'-3'")


def test_missing_trace_file(tmp_path):
    data = base()
    data["workload"] = {"arrival": {"kind": "trace", "path": "nowhere.csv"}}
    check(write(tmp_path, data), "nowhere.csv", "no such file")


# ------------------------------------------------------------------ 8. impossible deployments


def test_tp_not_dividing_heads(tmp_path):
    cfg = json.loads((REPO / "hwdb/data/models/Llama-3.1-8B/config.json").read_text())
    cfg.update(num_attention_heads=20, num_key_value_heads=4, hidden_size=2560)
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps(cfg))
    data = base()
    data["model"] = str(tmp_path / "odd" / "config.json")
    data["pools"][0]["tp"] = 8
    check(write(tmp_path, data), "pools[main].tp=8", "20 attention heads", "divisor")


def test_tp_larger_than_node(tmp_path):
    data = base()
    data["pools"][0]["tp"] = 16
    check(write(tmp_path, data), "pools[main].tp=16", "8 GPUs", "lower tp")


def test_tp_that_splits_heads_unevenly(tmp_path):
    """vLLM shards KV heads over TP: tp must divide them or be a multiple of them."""
    data = base()
    data["pools"][0]["tp"] = 3
    check(write(tmp_path, data), "pools[main].tp=3", "8 KV heads", "divisors or multiples")


def test_unknown_router(tmp_path):
    data = base()
    data["pools"][0]["router"] = "magic"
    check(write(tmp_path, data), "pools[0]", "router='magic'", "least_outstanding")


def test_batched_tokens_below_max_num_seqs(tmp_path):
    data = base()
    data["pools"][0]["engine"] = {"max_num_seqs": 256, "max_num_batched_tokens": 128}
    check(write(tmp_path, data), "pools[main].engine", "max_num_batched_tokens=128", "max_num_seqs=256")


def test_unknown_engine(tmp_path):
    data = base()
    data["pools"][0]["engine"] = {"engine": "tgi-9"}
    check(write(tmp_path, data), "pools[main].engine.engine", "'tgi-9'", "vllm-v1")


NO_FP8 = sorted(name for name, g in DB.gpus.items() if "fp8" not in g.peak_flops)


@pytest.mark.skipif(not NO_FP8, reason="no GPU without fp8 (e.g. A100) in hwdb yet")
def test_fp8_on_gpu_without_fp8(tmp_path):
    """vLLM serves fp8 weight-only there (Marlin W8A16); TensorRT-LLM has no such kernel and is refused."""
    gpu = NO_FP8[0]
    data = base()
    data["pools"][0].update(gpu=gpu, dtype="fp8", engine={"engine": "trtllm"})
    check(write(tmp_path, data), "pools[main].dtype=fp8", gpu, "bf16", "trtllm has no weight-only fp8 kernel")


# ------------------------------------------------------------------ 9. files and other commands


def test_missing_scenario_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError, match="nope.yaml: no such file"):
        load_scenario(path)
    cli_error("simulate", path, words=("nope.yaml", "no such file"))


def test_perf_unknown_model():
    cli_error("perf", "NOPE", "--gpu", "H100", words=("unknown model 'NOPE'", "Llama-3.1-8B", "--hwdb"))


def test_perf_bad_options():
    cli_error("perf", "Llama-3.1-8B", "--gpu", "H100", "--tp", "3", words=("tp=3", "KV heads"))
    cli_error("perf", "Llama-3.1-8B", "--gpu", "H900", words=("unknown GPU 'H900'", "H100-SXM-80GB"))


@pytest.mark.skipif("Llama-3.1-70B" not in DB.models, reason="Llama-3.1-70B not in hwdb yet")
def test_perf_model_does_not_fit():
    _assert_fit_message(cli_error("perf", "Llama-3.1-70B", "--gpu", "H100", words=("Llama-3.1-70B",)))


def test_hw_show_unknown_gpu():
    cli_error("hw", "show", "gpu", "NOPE", words=("unknown GPU 'NOPE'", "H100-SXM-80GB"))
