"""Calibration harness (calibration/harness, calibration/cli.py).

Fast tests without vLLM: bundle append/resume/validation, the run plan, and the client, server launcher
and whole runner against ``tests/fixtures/calibration/fake_vllm_server.py``.  The fake server is a
PROTOCOL test double (SSE framing, usage and metrics chunks, process death): it is not a substitute
for the real server and its timings mean nothing.  End-to-end tests against the real vLLM server
live in tests/test_calibration_vllm.py; the parsers of real vLLM start-up logs and /metrics scrapes in
tests/test_calibration_server_logs.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
from pathlib import Path

import pytest

from calibration import cli
from calibration.harness import cli_options
from calibration.harness.bundle import SCHEMA_VERSION, Bundle, BundleError
from calibration.harness.client import CompletionClient, PromptFactory, RequestSpec, SSEDecoder
from calibration.harness.loadgen import poisson_arrivals, run_closed_loop, run_open_loop
from calibration.harness.probes import PHASE_KINDS, PlanOptions, build_plan, resolve_rate, summarize_phase
from calibration.harness.server import Endpoint, EndpointUnreachable, ServerDied, ServerProcess

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "calibration"
FAKE = FIX / "fake_vllm_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_cmd(port: int, *args: str) -> list[str]:
    return [sys.executable, str(FAKE), "--port", str(port), *args]


def manifest(**over) -> dict:
    m = {"mode": "attach", "model": {"served_name": "m1", "max_model_len": 4096}, "plan": []}
    m.update(over)
    return m


# ----------------------------------------------------------------------------- bundle
def test_bundle_append_resume_and_torn_line(tmp_path):
    b = Bundle.create(tmp_path / "b", manifest(plan=[{"name": "prefill", "requests": []}]))
    b.append("prefill", {"kind": "phase_start", "segment": 0})
    b.append("prefill", {"kind": "request", "id": "r0", "ok": True})
    b.append("prefill", {"kind": "request", "id": "r1", "ok": False, "error": "x"})
    # a writer killed in the middle of a line
    with open(tmp_path / "b" / "records" / "prefill.jsonl", "ab") as fh:
        fh.write(b'{"kind":"request","id":"r2","ok":tr')
    b2 = Bundle.open(tmp_path / "b")
    assert b2.completed_ids("prefill") == {"r0"}
    assert not b2.phase_done("prefill")
    assert b2.next_segment("prefill") == 1
    b2.append("prefill", {"kind": "request", "id": "r1", "ok": True})  # fenced off the torn line
    b2.append("prefill", {"kind": "phase_done"})
    b3 = Bundle.open(tmp_path / "b")
    assert b3.completed_ids("prefill") == {"r0", "r1"}
    assert b3.phase_done("prefill")
    assert [r["id"] for r in b3.requests("prefill")] == ["r0", "r1"]
    assert all(r["model"] == "m1" for r in b3.records("prefill", "request"))
    assert b3.manifest["schema_version"] == SCHEMA_VERSION
    with pytest.raises(BundleError, match="already holds a bundle"):
        Bundle.create(tmp_path / "b", manifest())


def test_bundle_validation_errors(tmp_path):
    with pytest.raises(BundleError, match="not a directory"):
        Bundle.open(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="manifest.json is missing"):
        Bundle.open(tmp_path / "empty")
    b = Bundle.create(tmp_path / "b", manifest())
    b.append("decode_c1", {"kind": "request", "id": "x", "ok": True})
    # records of another model slipped into the bundle
    with open(tmp_path / "b" / "records" / "decode_c1.jsonl", "a") as fh:
        fh.write(json.dumps({"kind": "request", "phase": "decode_c1", "id": "y", "ok": True, "model": "other"}) + "\n")
    with pytest.raises(BundleError, match="measured on model 'other'"):
        Bundle.open(tmp_path / "b")
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    m["schema_version"] = 99
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="schema_version 99"):
        Bundle.open(tmp_path / "b")
    del m["model"]
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="lacks model"):
        Bundle.open(tmp_path / "b")
    (tmp_path / "b" / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        Bundle.open(tmp_path / "b")


def test_bundle_refuses_another_model(tmp_path):
    b = Bundle.create(
        tmp_path / "b", manifest(model={"served_name": "m1", "max_model_len": 4096, "config_sha256": "aa"})
    )
    b.check_same_model({"served_name": "m1", "max_model_len": 4096, "config_sha256": "aa"})
    b.check_same_model({"served_name": "m1"})  # unknown fields are not a mismatch
    with pytest.raises(BundleError, match="another model.*served_name"):
        b.check_same_model({"served_name": "m2", "max_model_len": 4096})
    with pytest.raises(BundleError, match="config_sha256"):
        b.check_same_model({"served_name": "m1", "config_sha256": "bb"})


# ----------------------------------------------------------------------------- plan, prompts


def test_plan_is_deterministic_and_fits_the_model():
    a = build_plan(PlanOptions(quick=True, seed=3), max_model_len=300)
    b = build_plan(PlanOptions(quick=True, seed=3), max_model_len=300)
    assert a == b
    pre = a[0]
    assert pre["name"] == "prefill" and max(r[1] for r in pre["requests"]) <= 299
    assert all(r[1] + r[2] <= 300 for ph in a for r in ph["requests"])
    ids = [r[0] for ph in a for r in ph["requests"]]
    assert len(ids) == len(set(ids))
    assert [p["name"] for p in a] == [
        "prefill",
        "decode_c1",
        "decode_c2",
        "decode_c4",
        "decode_c8",
        "decode_c1_p236",
        "decode_c2_p236",
        "decode_c4_p236",
        "decode_c8_p236",
        "load_poisson_0.6",
    ]
    assert {r[1] for r in a[5]["requests"]} == {236}  # 512 shortened to fit max_model_len with its 64 outputs
    # 16-256 of the 7 prompt lengths fit under 300 tokens, 3 repeats each; 4 requests a user at each decode level
    assert len(a[0]["requests"]) == 5 * 3 and len(a[4]["requests"]) == 8 * 4


def test_open_loop_rate_resolution_is_fixed_once(tmp_path):
    plan = build_plan(PlanOptions(kinds=("load",), load_rates=[5.0], load_requests=50, closed_concurrency=[]), 4096)
    b = Bundle.create(tmp_path / "b", manifest(plan=plan))
    ph = resolve_rate(b, b.manifest["plan"][0])
    arr = [r[3] for r in ph["requests"]]
    assert arr[0] == 0 and arr == sorted(arr)
    assert 50 / arr[-1] == pytest.approx(5.0, rel=0.5)
    assert resolve_rate(b, ph)["requests"] == ph["requests"]  # already fixed: unchanged


def test_prompt_factory_exact_lengths_and_stable_per_id():
    pf = PromptFactory(range(100, 300), seed=1)
    p = pf.prompt("req-7", 123)
    assert len(p) == 123 and p == pf.prompt("req-7", 123)
    assert p[:16] != pf.prompt("req-8", 123)[:16]  # no shared prefixes between requests
    assert poisson_arrivals(5, 2.0, 1) == poisson_arrivals(5, 2.0, 1)


def test_sse_decoder():
    d = SSEDecoder()
    out = [d.feed_line(x) for x in [": comment", 'data: {"a":', "data: 1}", "", "", "event: x", "data: [DONE]", ""]]
    assert [o for o in out if o is not None] == ['{"a":\n1}', "[DONE]"]


# ----------------------------------------------------------------------------- fake server
@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    """PROTOCOL test double (not vLLM): two tokens per SSE chunk, usage and metrics chunks."""
    port = free_port()
    log = tmp_path_factory.mktemp("fake") / "server.log"
    srv = ServerProcess(fake_cmd(port, "--tokens-per-chunk", "2"), f"http://127.0.0.1:{port}", log)
    srv.start()
    srv.wait_ready(timeout=30, poll=0.1)
    yield srv
    srv.stop()


def test_client_streams_tokens_usage_and_server_metrics(fake_server):
    async def go():
        async with CompletionClient(fake_server.base_url, "fake-model") as c:
            pf = await PromptFactory.from_server(c)
            r = await c.complete(RequestSpec("a", pf.prompt("a", 37), 9))
            r_text = await c.complete(RequestSpec("b", "one two three", 4))
            c.return_token_ids = False
            r_chunks = await c.complete(RequestSpec("c", pf.prompt("c", 5), 6))
            bad = await CompletionClient(fake_server.base_url, "no-such-model").complete(RequestSpec("d", [1, 2], 2))
            return r, r_text, r_chunks, bad

    r, r_text, r_chunks, bad = asyncio.run(go())
    assert r.ok and r.prompt_tokens == 37 == r.expected_prompt_tokens and r.output_tokens == 9
    assert r.token_count_source == "token_ids" and len(r.token_times_s) == 9 and r.chunks == 5
    assert 0 < r.ttft_s == r.token_times_s[0] <= r.token_times_s[-1] <= r.e2e_s
    assert r.token_times_s[0] == r.token_times_s[1]  # two tokens per chunk share an arrival time
    assert r.finish_reason == "length" and r.server_metrics["time_to_first_token_ms"] > 0
    assert r_text.ok and r_text.prompt_tokens == 3
    # without token_ids every chunk counts as one token; usage still gives the true count
    assert r_chunks.ok and r_chunks.token_count_source == "chunks" and len(r_chunks.token_times_s) == 3
    assert r_chunks.output_tokens == 6
    assert not bad.ok and bad.error_kind == "http" and bad.status == 404
    rec = r.to_record()
    assert rec["kind"] == "request" and json.loads(json.dumps(rec))["id"] == "a"


def test_closed_and_open_loop_generators(fake_server):
    async def go():
        async with CompletionClient(fake_server.base_url, "fake-model") as c:
            specs = [RequestSpec(f"c{i}", [5] * 8, 4) for i in range(9)]
            seen = []
            closed = await run_closed_loop(c, specs, 3, on_result=lambda r: seen.append(r.id))
            arr = poisson_arrivals(8, 20.0, seed=2)
            open_ = await run_open_loop(c, [RequestSpec(f"o{i}", [5] * 8, 2, a) for i, a in enumerate(arr)])
            return closed, seen, open_

    closed, seen, open_ = asyncio.run(go())
    assert sorted(seen) == sorted(f"c{i}" for i in range(9)) and all(r.ok for r in closed)
    assert all(r.ok for r in open_)
    for r in open_:  # sent on schedule (generous bound: 2 shared cores)
        assert r.sent_s == pytest.approx(r.scheduled_s, abs=0.25)


def test_prompt_pool_without_tokenize_endpoint(tmp_path):
    port = free_port()
    with ServerProcess(fake_cmd(port, "--no-tokenize"), f"http://127.0.0.1:{port}", tmp_path / "s.log") as srv:
        srv.wait_ready(timeout=30, poll=0.1)

        async def go():
            async with CompletionClient(srv.base_url, "fake-model") as c:
                pf = await PromptFactory.from_server(c)
                return pf, await c.complete(RequestSpec("a", pf.prompt("a", 20), 3))

        pf, res = asyncio.run(go())
    assert pf.source.startswith("fallback") and res.ok and res.prompt_tokens == 20


def test_server_process_dead_at_start_reports_exit_code_and_log(tmp_path):
    port = free_port()
    srv = ServerProcess(fake_cmd(port, "--exit-at-start", "5"), f"http://127.0.0.1:{port}", tmp_path / "s.log")
    with pytest.raises(ServerDied) as ei:
        srv.wait_ready(timeout=30, poll=0.1)
    msg = str(ei.value)
    assert "exited with code 5 before it was ready" in msg and "fake start-up failure" in msg
    assert "fake start-up failure" in (tmp_path / "s.log").read_text()
    srv.stop()


def test_server_process_lifecycle_and_startup_phases(tmp_path):
    port = free_port()
    srv = ServerProcess(fake_cmd(port), f"http://127.0.0.1:{port}", tmp_path / "s.log")
    models = srv.wait_ready(timeout=30, poll=0.1)
    assert models["data"][0]["id"] == "fake-model"
    st = srv.startup()["summary"]
    assert st["weights_load_s"] == 0.01 and st["kv_cache_tokens"] == 16000 and st["engine_init_s"] == 0.3
    assert 0 <= st["weights_loaded_t"] <= st["api_ready_t"] <= st["ready_s"]
    srv.check()
    assert srv.stop() is not None and not srv.alive()
    with pytest.raises(ServerDied, match="SIGTERM"):
        srv.check()
    with pytest.raises(EndpointUnreachable):
        Endpoint(f"http://127.0.0.1:{port}").wait_ready(timeout=0.5, poll=0.1)


def _run(argv, capsys):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_run_kill_and_resume_against_fake_server(tmp_path, capsys, monkeypatch):
    """The runner's bookkeeping end to end (launch, phases, death, resume) over the fake server."""
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "bundle"
    port = free_port()
    common = [
        "--phases",
        "prefill,load",
        "--prefill-lengths",
        "8,32",
        "--prefill-repeats",
        "1",
        "--load-rates",
        "40",
        "--load-requests",
        "16",
        "--load-prompt",
        "8:24",
        "--load-output",
        "6:12",
        "--url",
        f"http://127.0.0.1:{port}",
        "--ready-timeout",
        "30",
    ]
    # the 8th completion (2 warm-up + 2 prefill + 4 load) kills the server in mid-stream
    rc, _, err = _run(
        ["run", "--out", str(out), "--serve-cmd", " ".join(fake_cmd(port, "--die-after", "8")), *common], capsys
    )
    assert rc == 3, err
    assert "exited with code 17 during phase load_poisson_r40" in err.replace("\n", " ")
    b = Bundle.open(out)
    assert b.phase_done("prefill") and not b.phase_done("load_poisson_r40")
    kept = {r["id"]: r for r in b.requests("load_poisson_r40")}
    assert 1 <= len(kept) < 16
    assert all(r["output_tokens"] == r["max_tokens"] == len(r["token_times_s"]) for r in kept.values())
    assert b.manifest["runs"][-1]["status"] == "server_died"
    assert b.manifest["launches"][-1]["exit_code"] == 17

    # continuing with a server of another model is refused, before any measurement
    rc, _, err = _run(
        ["run", "--out", str(out), "--resume", "--serve-cmd", " ".join(fake_cmd(port, "--model", "other")), *common],
        capsys,
    )
    assert rc == 2 and "another model" in err
    assert len(Bundle.open(out).records("load_poisson_r40", "request")) == len(
        list(b.records("load_poisson_r40", "request"))
    )
    rc, _, err = _run(["run", "--out", str(out), "--resume", "--serve-cmd", " ".join(fake_cmd(port)), *common], capsys)
    assert rc == 0, err
    b = Bundle.open(out)
    recs = {r["id"]: r for r in b.requests("load_poisson_r40")}
    assert len(recs) == 16 and b.phase_done("load_poisson_r40")
    assert all(recs[i]["t_send"] == kept[i]["t_send"] for i in kept)  # measured once, kept as is
    assert {r["segment"] for r in recs.values()} == {0, 1}
    assert [r["status"] for r in b.manifest["runs"]] == ["server_died", "completed"]
    assert len(b.manifest["launches"]) == 2 and (out / "server-1.log").exists()
    metrics = b.records("load_poisson_r40", "metrics")
    assert metrics[-1]["histograms"]["vllm:time_to_first_token_seconds"][0]["count"] == 16 - len(kept)
    summary = summarize_phase(b, "load_poisson_r40")
    assert summary["ok"] == 16 and summary["failed"] == 0 and summary["retried"] >= 1

    rc, show, _ = _run(["show", str(out)], capsys)
    assert rc == 0 and "load_poisson_r40" in show and "16/16" in show
    rc, js, _ = _run(["show", str(out), "--json"], capsys)
    assert json.loads(js)["phases"][1]["ok"] == 16

    # and a fresh run into the same directory needs --resume
    rc, _, err = _run(["run", "--out", str(out), "--attach", "http://127.0.0.1:9"], capsys)
    assert rc == 2 and "--resume" in err


def test_cli_attach_mode_and_errors(tmp_path, capsys, fake_server):
    out = tmp_path / "att"
    rc, _, err = _run(
        [
            "run",
            "--out",
            str(out),
            "--attach",
            fake_server.base_url + "/v1",
            "--phases",
            "decode",
            "--decode-concurrency",
            "2",
            "--decode-prompt",
            "16",
            "--decode-output",
            "4",
            "--server-log",
            str(FIX / "vllm_cpu_0.32_startup_eager.log"),
        ],
        capsys,
    )
    assert rc == 0, err
    b = Bundle.open(out)
    assert b.manifest["mode"] == "attach" and b.manifest["versions"]["vllm"] == "0.0.0-fake"
    assert b.manifest["attachments"][0]["startup"]["summary"]["engine_init_s"] == 2.41
    assert len(b.requests("decode_c2")) == 4 and "launches" not in b.manifest or not b.manifest["launches"]
    rc, _, err = _run(
        ["run", "--out", str(tmp_path / "x"), "--attach", "http://127.0.0.1:9", "--ready-timeout", "0.5"], capsys
    )
    assert rc == 3 and "did not answer" in err
    rc, _, err = _run(["show", str(tmp_path / "missing")], capsys)
    assert rc == 2 and "no bundle" in err
    rc, _, err = _run(
        ["run", "--out", str(tmp_path / "y"), "--attach", fake_server.base_url, "--phases", "warp"], capsys
    )
    assert rc == 2 and "unknown warp" in err


def test_add_subparser_hook():
    p = argparse.ArgumentParser(prog="epdsim")
    sub = p.add_subparsers(dest="cmd", required=True)
    cli.add_subparser(sub)
    a = p.parse_args(["calibrate", "show", "somewhere"])
    assert a.func is cli.cmd_calibrate and a.bundle == "somewhere"
    assert cli_options.PHASE_KINDS == PHASE_KINDS
