"""Issue 32's command-line items: ``hw list --format json|csv``, ``simulate --dtype --slo-ttft --slo-tpot``
with the offered load and each pool's precision in the summary, and the YAML of the docs kept runnable.

The CLI runs in-process (``simulator.cli.main``, as tests/test_cli_plan.py does): a user error returns 2
with one paragraph on stderr, an argparse refusal raises ``SystemExit(2)``.
"""

from __future__ import annotations

import csv
import io
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

import hwdb
from hwdb import listing
from simulator.bounds import range_of
from simulator.cli import main
from simulator.cli.commands import build_parser
from simulator.cli.simulate import DEFAULT_SCENARIO, precision_text
from simulator.plan import parse_plan_request
from simulator.scenario import Scenario, Target, load_scenario, parse_scenario
from simulator.serving_summary import offered_load, offered_load_text

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RECORDS = {"gpus": listing.gpu_records, "links": listing.link_records, "models": listing.model_records}
ROWS = {"gpus": listing.gpu_rows, "links": listing.link_rows, "models": listing.model_rows}


@pytest.fixture(scope="module")
def db() -> hwdb.HardwareDB:
    return hwdb.load()


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return rc, out.out, out.err


def refused_by_argparse(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    assert exc.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------- epdsim hw list --format


@pytest.mark.parametrize("kind", ["gpus", "links", "models"])
def test_hw_list_json_holds_the_table_columns_in_si_units(capsys, db, kind):
    rc, out, _ = run(capsys, "hw", "list", kind, "--format", "json")
    assert rc == 0
    records = json.loads(out)
    assert isinstance(records, list) and [r["name"] for r in records] == [r["name"] for r in ROWS[kind](db)]
    # one key per table column, named with its SI unit, and the table is these figures rounded
    assert [listing.TABLE_COLUMNS.get(k, (k,))[0] for k in records[0]] == list(ROWS[kind](db)[0])
    assert [listing.table_row(r) for r in records] == ROWS[kind](db)
    figures = [k for k in records[0] if k in listing.TABLE_COLUMNS and k != "moe"]
    assert figures and all(r[k] is None or type(r[k]) in (int, float) for r in records for k in figures)


def test_hw_list_json_figures_are_the_hwdb_values(capsys, db):
    gpus = {r["name"]: r for r in json.loads(run(capsys, "hw", "list", "gpus", "--format", "json")[1])}
    h100 = db.gpu("H100")
    g = gpus[h100.name]
    assert g["memory_bytes"] == h100.memory_bytes.value and g["memory_bytes"] > 8e10  # bytes, not GiB
    assert g["memory_bandwidth_Bps"] == h100.memory_bandwidth_Bps.value > 1e12  # bytes/s, not TB/s
    assert g["bf16_FLOPS"] == h100.peak_flops["bf16"].value > 1e14  # FLOP/s, not TFLOPS
    assert g["fp4_FLOPS"] is None and g["price_usd_per_hour"] == h100.price_usd_per_hour.value
    links = {r["name"]: r for r in json.loads(run(capsys, "hw", "list", "links", "--format", "json")[1])}
    ib = db.link("ib-ndr")
    assert links["ib-ndr"]["bandwidth_Bps"] == ib.bandwidth_Bps.value
    assert links["ib-ndr"]["latency_s"] == ib.latency_s.value < 1e-3  # s, not µs
    assert links["ib-ndr"]["effective_Bps"] == pytest.approx(ib.effective_Bps)
    models = {r["name"]: r for r in json.loads(run(capsys, "hw", "list", "models", "--format", "json")[1])}
    llama = db.model("Llama-3.1-8B")
    assert models[llama.name]["params"] == llama.arch.total_params > 7e9  # parameters, not billions
    assert models[llama.name]["moe"] is None and isinstance(models["DeepSeek-V3"]["moe"], str)


@pytest.mark.parametrize("kind", ["gpus", "links", "models"])
def test_hw_list_csv_has_a_header_and_the_json_figures(capsys, kind):
    records = json.loads(run(capsys, "hw", "list", kind, "--format", "json")[1])
    rc, out, _ = run(capsys, "hw", "list", kind, "--format", "csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert out.splitlines()[0].split(",") == list(records[0])
    assert len(rows) == len(records)
    for rec, row in zip(records, rows, strict=True):
        for key, value in rec.items():
            if value is None:
                assert row[key] == ""
            elif isinstance(value, bool) or isinstance(value, str):
                assert row[key] == str(value)
            else:
                assert float(row[key]) == value, (rec["name"], key)


def test_hw_list_formats_for_every_kind_and_refusals(capsys, db):
    rc, out, _ = run(capsys, "hw", "list", "--format", "json")
    assert rc == 0
    everything = json.loads(out)
    assert {k: len(v) for k, v in everything.items()} == {k: len(f(db)) for k, f in RECORDS.items()}
    rc, out, err = run(capsys, "hw", "list", "--format", "csv")
    assert rc == 2 and out == "" and "--format csv" in err and "gpus" in err
    assert "invalid choice: 'xml'" in refused_by_argparse(capsys, "hw", "list", "gpus", "--format", "xml")
    rc, out, err = run(capsys, "hw", "show", "gpu", "H100", "--format", "csv")
    assert rc == 2 and "--format json" in err


def test_hw_table_output_is_the_default_and_show_json_has_the_sources(capsys):
    table = run(capsys, "hw", "list", "links")[1]
    assert run(capsys, "hw", "list", "links", "--format", "table")[1] == table
    assert "bandwidth_GBps" in table and "ib-ndr" in table
    rc, out, _ = run(capsys, "hw", "show", "gpu", "H100", "--format", "json")
    info = json.loads(out)
    assert rc == 0 and info["name"] == "H100-SXM-80GB" and info["memory_bytes"]["source"]


# ---------------------------------------------------------------- epdsim simulate --dtype --slo-ttft --slo-tpot


def small_yaml(tmp_path: Path, name: str = "small.yaml", **edit) -> Path:
    """The default scenario with 60 requests (and ``edit``'s top-level keys; None drops a key)."""
    data = yaml.safe_load(DEFAULT_SCENARIO.read_text())
    data["workload"]["num_requests"] = 60
    for key, value in edit.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_simulate_dtype_and_slo_overrides_equal_the_same_yaml(capsys, tmp_path):
    base = small_yaml(tmp_path)
    rc, out, _ = run(
        capsys, "simulate", base, "--dtype", "fp8", "--slo-ttft", "1", "--out", tmp_path / "flags", "--format", "json"
    )
    assert rc == 0
    rate = load_scenario(base).workload.arrival.rate
    assert f"poisson arrivals at {rate:.2f} req/s" in out
    assert "main: weights fp8, KV cache" in out
    assert "TTFT <= 1.00 s" in out
    info = json.loads((tmp_path / "flags" / "summary.json").read_text())["info"]
    assert info["slo"]["ttft_s"] == 1.0 and [p["dtype"] for p in info["pools"]] == ["fp8"]
    assert info["offered_load"] == {"kind": "poisson", "rate_rps": rate, "rate_source": "scenario"}
    # The same values written in the YAML: the same scenario and, byte for byte, the same summary.json.
    data = yaml.safe_load(base.read_text())
    data["pools"][0]["dtype"] = "fp8"
    data["slo"]["ttft_s"] = 1
    edited = small_yaml(tmp_path, "edited.yaml", pools=data["pools"], slo=data["slo"])
    assert run(capsys, "simulate", edited, "--out", tmp_path / "yaml", "--format", "json")[0] == 0
    assert load_scenario(tmp_path / "flags" / "scenario.yaml") == load_scenario(edited)
    assert (tmp_path / "flags" / "summary.json").read_bytes() == (tmp_path / "yaml" / "summary.json").read_bytes()


def test_simulate_slo_flag_creates_an_absent_slo(capsys, tmp_path):
    path = small_yaml(tmp_path, slo=None)
    assert load_scenario(path).slo.tpot_s is None
    rc, out, _ = run(
        capsys,
        "simulate",
        path,
        "--slo-tpot",
        "0.04",
        "--num-requests",
        "30",
        "--out",
        tmp_path / "run",
        "--format",
        "json",
    )
    assert rc == 0 and "TPOT <= 40.0 ms" in out and "TTFT <=" not in out
    slo = json.loads((tmp_path / "run" / "summary.json").read_text())["info"]["slo"]
    assert slo["tpot_s"] == 0.04 and slo["ttft_s"] is None


@pytest.mark.parametrize(
    "flag, value, shown",
    [
        ("--slo-ttft", "nan", "nan"),
        ("--slo-ttft", "0", "0"),
        ("--slo-tpot", "-1", "-1"),
        ("--slo-tpot", "inf", "inf"),
        ("--slo-ttft", "2e6", "2e+06"),
    ],
)
def test_simulate_bad_slo_is_refused_with_the_flag_value_and_schema_range(capsys, flag, value, shown):
    rc, out, err = run(capsys, "simulate", flag, value, "--num-requests", "20")
    assert rc == 2 and out == ""
    assert f"{flag} {shown}:" in err and range_of(Target).text() in err, err


def test_simulate_bad_dtype_and_tp_are_refused_naming_the_flag(capsys):
    assert "--dtype" in refused_by_argparse(capsys, "simulate", "--dtype", "fp9")
    rc, _, err = run(capsys, "simulate", "--tp", "0", "--num-requests", "20")
    assert rc == 2 and "--tp 0:" in err and "from 1 to 72" in err, err


def test_offered_load_of_open_and_closed_loops():
    closed = load_scenario(REPO / "examples" / "qwen3_moe_h200_closed_loop.yaml").workload
    load = offered_load(closed, [])
    assert load["concurrency"] == closed.arrival.concurrency
    assert offered_load_text(load).startswith(f"closed loop of {closed.arrival.concurrency:,} users")
    at_own_pace = SimpleNamespace(arrival=SimpleNamespace(kind="trace", rate=None))
    load = offered_load(at_own_pace, [4.0, 0.0, 1.0, 2.0])
    assert load == {"kind": "trace", "rate_rps": 0.75, "rate_source": "arrivals"}
    assert offered_load_text(load) == "trace arrivals at 0.75 req/s (mean of the arrivals)"
    pools = [{"name": "prefill", "dtype": "fp8", "kv_cache_dtype": "fp8"}, {"name": "encoder", "dtype": "bf16"}]
    assert precision_text(pools) == "prefill: weights fp8, KV cache fp8; encoder: weights bf16"


# ---------------------------------------------------------------- the YAML of the docs


def yaml_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, partial) of each ```yaml block of ``path``; ``partial``: the line before it is a
    ``<!-- partial ... -->`` comment (a block of keys, not one whole input)."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() in ("```yaml", "```yml"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            partial = i > 0 and lines[i - 1].strip().startswith("<!-- partial")
            out.append((i + 1, "\n".join(lines[i + 1 : end]), partial))
    return out


def input_blocks() -> list:
    """Every docs block that is a scenario (has pools) or a plan request (has gpus)."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        for line, text, partial in yaml_blocks(path):
            data = yaml.safe_load(text)
            if isinstance(data, dict) and "workload" in data and ("gpus" in data or "pools" in data):
                kind = "plan" if "gpus" in data else "scenario"
                found.append(pytest.param(data, kind, partial, id=f"{path.relative_to(DOCS)}:{line}"))
    return found


def test_the_docs_input_blocks_are_found():
    ids = {p.id for p in input_blocks()}
    for doc in ("planner.md", "scenario.md", "validation/tails.md"):
        assert any(i.startswith(doc + ":") for i in ids), f"no scenario or plan request block found in docs/{doc}"


@pytest.mark.parametrize("data, kind, partial", input_blocks())
def test_docs_yaml_block_validates(data, kind, partial):
    if kind == "plan":
        assert not partial, "a plan request block is whole"
        parse_plan_request(data, "docs block", REPO)
    elif not partial:
        parse_scenario(data, "docs block", REPO)
    else:
        # A partial block lists keys of several deployments at once: every key must be known and every
        # value in range; only absent keys and the rules between fields are not checked.
        try:
            Scenario.model_validate(data)
        except ValidationError as err:
            bad = [e for e in err.errors() if e["type"] not in ("missing", "value_error")]
            assert not bad, bad


def planner_reference() -> dict:
    text = (DOCS / "planner.md").read_text().split("## The request", 1)[1]
    return yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])


def test_planner_reference_request_parses():
    req = parse_plan_request(planner_reference(), "docs/planner.md")
    assert req.name == "llama8b-chat" and req.target_rate == 12 and {g.name for g in req.gpus} == {"H100", "H200"}


def test_planner_doc_commands_parse_with_the_cli_parser():
    block = (DOCS / "planner.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.startswith("epdsim ")]
    assert commands
    for words in commands:
        args = build_parser().parse_args(words[1:])
        assert args.cmd == "plan" and args.request


@pytest.mark.slow
def test_planner_reference_request_runs(capsys, tmp_path):
    """About 20-30 s on two cores: the block pasted into a file is what `epdsim plan` runs."""
    path = tmp_path / "request.yaml"
    path.write_text(yaml.safe_dump(planner_reference(), sort_keys=False))
    rc, out, _ = run(capsys, "plan", path, "--workers", "1", "--quiet")
    assert rc == 0 and "recommended:" in out, out
