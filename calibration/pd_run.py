"""A disaggregated (prefill/decode) vLLM pair under load, and its replay in the simulator.

``run`` launches (or attaches to) a prefill server (``kv_role: kv_producer``) and a decode server
(``kv_consumer``) sharing vLLM's file-based ``ExampleConnector`` (KV through safetensors files
in ``--kv-path``), starts our PD router (:mod:`calibration.harness.pd_router`) in-process, and
drives one open-loop Poisson load test through it with the harness's streaming client.  The
output folder looks like a calibration bundle::

    OUT/manifest.json            commands, settings, KV statistics, file bandwidth
    OUT/records/load_pd.jsonl    one line per request: the client's record + "pd" (router timings,
                                 prefill and decode server metrics)
    OUT/prefill.log, decode.log  the servers' logs (launch mode)

ExampleConnector only moves whole blocks (128 tokens on CPU) and the decode server recomputes
what is left: it looks up ``((L - 2) // 128) * 128`` prompt tokens, the prefill stores
``((L - 1) // 128) * 128``.  Prompts of ``128 k + 2`` tokens therefore move ``128 k`` tokens
and leave two to recompute (a prompt of ``128 k + 1`` tokens finds no KV at all).

``replay`` builds a PD scenario (prefill pool + decode pool of ``CPU-host``, ``kv_transfer``
with the ``example`` connector and ``bandwidth_Bps`` = the file write+read bandwidth measured
by ``run``), simulates the same arrivals and lengths, and compares TTFT / TPOT::

    python -m calibration.pd_run run --out pd-run --model-dir cpu-fit/model
    python -m calibration.pd_run replay pd-run --hwdb cpu-hw --engine CPU-host_vllm-0.32.0_tiny-llama

(``cpu-fit`` a colocated bundle of the same model, ``cpu-hw`` what ``epdsim calibrate fit`` wrote
from it; the model folder defaults to ``cpu-hw/models/tiny-llama``.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx

from calibration.harness import env as envinfo
from calibration.harness.bundle import BundleError, proc_start
from calibration.harness.client import (CompletionClient, PromptFactory, RequestSpec, poisson_arrivals,
                                        run_open_loop)
from calibration.harness.pd_router import PDRouter, prompt_hash
from calibration.harness.server import Endpoint, ServerProcess
from calibration.pd_bundle import (PD_KIND, SERVED, PD_SCHEMA_VERSION, PDReplayError, measured_rows, read_manifest,
                                   replay_inputs)
from simulator.run import simulate
from simulator.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[1]
BLOCK = 128
INJECT_RX = re.compile(r"Inject KV cache of (\d+) tokens")
SAVE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_vllm_python() -> str:
    return os.environ.get("EPDSIM_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")


def kv_transfer_config(role: str, kv_path: str) -> str:
    return json.dumps({"kv_connector": "ExampleConnector", "kv_role": role,
                       "kv_connector_extra_config": {"shared_storage_path": kv_path}})


def serve_command(py: str, model_dir: str, port: int, role: str, kv_path: str,
                  extra: list[str] | None = None) -> list[str]:
    return [py, "-m", "calibration.harness.vllm_launcher", "serve", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
            "--enable-per-request-metrics", "--disable-uvicorn-access-log", "--seed", "0",
            "--enforce-eager", "--no-enable-prefix-caching",
            "--kv-transfer-config", kv_transfer_config(role, kv_path), *(extra or [])]


def launch_pair(out: Path, model_dir: str, kv_path: str, *, vllm_python: str | None = None,
                prefill_bind: str | None = None, decode_bind: str | None = None,
                ready_timeout: float = 300.0) -> tuple[ServerProcess, ServerProcess]:
    """Start both servers at once and wait for both (raises ServerDied / ReadyTimeout; the caller stops them)."""
    py = vllm_python or default_vllm_python()
    env = {**SAVE_ENV, "PYTHONPATH": str(REPO)}
    servers = []
    for role, name, bind in (("kv_producer", "prefill", prefill_bind), ("kv_consumer", "decode", decode_bind)):
        port = free_port()
        e = dict(env)
        if bind:
            e["VLLM_CPU_OMP_THREADS_BIND"] = bind
        srv = ServerProcess(serve_command(py, model_dir, port, role, kv_path), f"http://127.0.0.1:{port}",
                            out / f"{name}.log", env=e, cwd=REPO)
        servers.append(srv.start())
    for s in servers:
        s.wait_ready(timeout=ready_timeout)
    return servers[0], servers[1]


def file_bandwidth(folder: Path, bytes_per_file: int, files: int = 4, reps: int = 30) -> dict:
    """Write then read back ``files`` files of ``bytes_per_file`` (page cache, no fsync, as
    ExampleConnector does); bytes moved over write+read time, and the per-transfer time."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(bytes_per_file)
    tw = tr = 0.0
    for r in range(reps):
        d = folder / f"bw{r}"
        d.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        for i in range(files):
            with open(d / f"l{i}", "wb") as fh:
                fh.write(payload)
        t1 = time.perf_counter()
        for i in range(files):
            with open(d / f"l{i}", "rb") as fh:
                fh.read()
        t2 = time.perf_counter()
        tw += t1 - t0
        tr += t2 - t1
        shutil.rmtree(d)
    moved = bytes_per_file * files * reps
    return {"bytes_per_file": bytes_per_file, "files": files, "reps": reps,
            "write_Bps": moved / tw, "read_Bps": moved / tr, "write_read_Bps": moved / (tw + tr),
            "per_transfer_s": (tw + tr) / reps}


def build_specs(pf: PromptFactory, n: int, rate: float, seed: int, blocks: list[int], extra: int,
                out_min: int, out_max: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    arr = poisson_arrivals(n, rate, seed)
    specs = []
    for i, a in enumerate(arr):
        rid = f"pd-{seed}-{i}"
        length = BLOCK * rng.choice(blocks) + extra
        specs.append(RequestSpec(id=rid, prompt=pf.prompt(rid, length), max_tokens=rng.randint(out_min, out_max),
                                 arrival_s=a, meta={"blocks": (length - extra) // BLOCK}))
    return specs


async def warm_up(base_url: str, seed: int = 0) -> None:
    """One plain request (no KV from the connector) straight to a server.

    Seen on this machine (vllm-cpu 0.32.0): a fresh decode server whose first forward loads KV and
    recomputes two tokens lost its worker both times ("Worker proc VllmWorker-0 died unexpectedly",
    no traceback); after one ordinary request the servers served every PD request."""
    async with CompletionClient(base_url, SERVED) as c:
        pf = await PromptFactory.from_server(c, seed=seed)
        res = await c.complete(RequestSpec(id=f"warmup-{seed}", prompt=pf.prompt("warmup", 129), max_tokens=4))
        if not res.ok:
            raise RuntimeError(f"warm-up request to {base_url} failed: {res.error}")


async def drive(router_url_prefill: str, router_url_decode: str, specs_args: dict, out: Path,
                warmup: bool = True) -> dict:
    if warmup:
        # 129 tokens: the decode server looks up 127 -> 0 whole blocks, so no KV is loaded
        await warm_up(router_url_prefill)
        await warm_up(router_url_decode)
    router = PDRouter(router_url_prefill, router_url_decode)
    port = await router.start("127.0.0.1", 0)
    client = CompletionClient(f"http://127.0.0.1:{port}", SERVED)
    try:
        pf = await PromptFactory.from_server(client, seed=specs_args["seed"])
        specs = build_specs(pf, **specs_args)
        t0 = time.time()
        results = await run_open_loop(client, specs)
        wall = time.time() - t0
    finally:
        await client.aclose()
        await router.close()
    routes = {}
    for rec in router.records():
        routes.setdefault(rec["extra"].get("prompt_hash"), rec)
    by_id = {s.id: s for s in specs}
    recs = []
    for res in sorted(results, key=lambda r: r.t_send):
        d = res.to_record()
        d["pd"] = routes.get(prompt_hash(by_id[res.id].prompt))
        recs.append(d)
    (out / "records").mkdir(parents=True, exist_ok=True)
    with open(out / "records" / "load_pd.jsonl", "w") as fh:
        for d in recs:
            fh.write(json.dumps(d) + "\n")
    return {"requests": len(specs), "ok": sum(r["ok"] for r in recs), "wall_s": round(wall, 3),
            "prompt_source": pf.source}


def _server_version(base_url: str) -> str | None:
    try:
        return httpx.get(base_url + "/version", timeout=10).json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def count_injections(log_path: Path) -> list[int]:
    try:
        return [int(m.group(1)) for m in INJECT_RX.finditer(log_path.read_text(errors="replace"))]
    except OSError:
        return []


def cmd_run(a) -> int:
    out = Path(a.out).resolve()   # the servers run in the repository: relative paths would point there
    attach = bool(a.prefill_url and a.decode_url)
    model_dir = Path(a.model_dir).resolve() if a.model_dir else None
    if not attach and (model_dir is None or not (model_dir / "config.json").is_file()):
        raise PDReplayError(f"--model-dir {a.model_dir}: no config.json there; give the model folder of a colocated "
                            f"bundle (e.g. cpu-fit/model, made by `epdsim calibrate run --out cpu-fit --launch`), "
                            f"or attach with --prefill-url and --decode-url")
    out.mkdir(parents=True, exist_ok=True)
    kv_path = str(Path(a.kv_path).resolve()) if a.kv_path else str(out / "kv")
    Path(kv_path).mkdir(parents=True, exist_ok=True)
    servers = []
    manifest: dict = {"kind": PD_KIND, "schema_version": PD_SCHEMA_VERSION,
                      "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "status": "running",
                      "argv": list(sys.argv), "pid": os.getpid(), "hostname": os.uname().nodename,
                      "proc_start": proc_start(), "kv_path": kv_path, "connector": "ExampleConnector", "block_size": BLOCK}
    manifest["host"] = {"hardware": envinfo.hardware(), "conditions": {"before": envinfo.conditions()}}
    # Written at once, so that a run killed before its end still reads as one (status "running").
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    try:
        if attach:
            p, d = Endpoint(a.prefill_url), Endpoint(a.decode_url)
            p.wait_ready(60)
            d.wait_ready(60)
            manifest["mode"] = "attach"
        else:
            p, d = launch_pair(out, str(model_dir), kv_path, vllm_python=a.vllm_python,
                               prefill_bind=a.prefill_bind, decode_bind=a.decode_bind)
            servers = [p, d]
            manifest["mode"] = "launch"
            manifest["commands"] = {"prefill": p.command, "decode": d.command}
            manifest["binds"] = {"prefill": a.prefill_bind, "decode": a.decode_bind}
            manifest["ready_s"] = {"prefill": p.ready_s, "decode": d.ready_s}
        manifest["urls"] = {"prefill": p.base_url, "decode": d.base_url}
        manifest["versions"] = {"vllm": _server_version(p.base_url)}
        blocks = [int(x) for x in a.blocks.split(",")]
        specs_args = dict(n=a.requests, rate=a.rate, seed=a.seed, blocks=blocks, extra=a.extra_tokens,
                          out_min=a.out_min, out_max=a.out_max)
        manifest["load"] = {**specs_args, "kind": "poisson"}
        manifest["result"] = asyncio.run(drive(p.base_url, d.base_url, specs_args, out))
        for s in servers:
            s.check("after the load test")
        if servers:
            inj = count_injections(d.log_path)
            manifest["kv_loaded"] = {"injections": len(inj), "tokens": sum(inj)}
        # bandwidth of the file path: one request of the median prompt, one file per layer
        med_blocks = sorted(blocks)[len(blocks) // 2]
        layer_bytes = med_blocks * BLOCK * a.kv_bytes_per_token_layer
        manifest["file_bandwidth"] = file_bandwidth(Path(kv_path) / "_bw", layer_bytes, files=a.layers)
        manifest["status"] = "completed"
    except BaseException as exc:
        manifest["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
        manifest["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
        raise
    finally:
        for s in servers:
            s.stop()
        manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        manifest["host"]["conditions"]["after"] = envinfo.conditions()
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    print(json.dumps({k: manifest.get(k) for k in ("result", "kv_loaded", "file_bandwidth")}, indent=1))
    return 0


# ---------------------------------------------------------------------------- replay
def _pct(xs, p):
    import numpy as np
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.percentile(xs, p)) if xs else math.nan


def cmd_replay(a) -> int:
    import yaml
    out = Path(a.bundle)
    man = read_manifest(out)
    if man is None:
        raise PDReplayError(f"{out}: not a PD bundle (no manifest.json with kind pd_run); give the --out folder "
                            f"of `python -m calibration.pd_run run`")
    if not (man.get("file_bandwidth") or {}).get("write_read_Bps") and not a.bandwidth_Bps:
        raise PDReplayError(f"{out}: the run measured no file bandwidth (status {man.get('status', 'unknown')}); "
                            f"re-run it, or give --bandwidth-Bps")
    a.engine, a.model = replay_inputs(a.hwdb, a.engine, a.model)
    rows = measured_rows(out)
    bw = a.bandwidth_Bps or man["file_bandwidth"]["write_read_Bps"]
    vdir = out / "replay"
    vdir.mkdir(exist_ok=True)
    trace = vdir / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": round(r["arrival_s"], 6), "input_tokens": r["input_tokens"],
                                         "output_tokens": r["output_tokens"]}) + "\n" for r in rows))
    eng = {"engine": a.engine, "max_num_seqs": 128, "max_num_batched_tokens": 2048, "block_size": BLOCK,
           "enforce_eager": True, "max_model_len": 4096, "num_gpu_blocks_override": 8192,
           "enable_chunked_prefill": True, "enable_prefix_caching": False}
    data = {"name": "replay-pd-cpu", "description": "PD pair on CPU with ExampleConnector (calibration.pd_run)",
            "model": str(Path(a.model).resolve()), "hwdb": [str(Path(h).resolve()) for h in a.hwdb],
            "pools": [{"name": "prefill", "role": "prefill", "gpu": "CPU-host", "engine": dict(eng)},
                      {"name": "decode", "role": "decode", "gpu": "CPU-host", "engine": dict(eng)}],
            "kv_transfer": {"connector": "example", "fabric": a.fabric, "same_node": False, "bandwidth_Bps": bw},
            "workload": {"arrival": {"kind": "trace", "path": str(trace), "format": "plain"}}}
    (vdir / "scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    res = simulate(parse_scenario(data, "pd replay"))
    req = res.requests.sort_values("request_id")
    pred_ttft = req["ttft_s"].tolist()
    pred_tpot = req["tpot_s"].tolist()
    table = []

    def row(metric, stat, meas, pred, source):
        err = pred / meas - 1 if meas and math.isfinite(meas) and math.isfinite(pred) else math.nan
        table.append({"metric": metric, "stat": stat, "source": source, "measured_s": meas,
                      "predicted_s": pred, "rel_error": err})

    for p in (50, 90):
        row("TTFT", f"p{p}", _pct([r["client_ttft_s"] for r in rows], p), _pct(pred_ttft, p), "client via router")
    for p in (50, 90):
        row("TTFT", f"p{p}", _pct([r["servers_ttft_s"] for r in rows], p), _pct(pred_ttft, p), "prefill+decode srv")
    row("TPOT", "p50", _pct([r["decode_server_tpot_s"] for r in rows], 50), _pct(pred_tpot, 50), "decode server")
    row("TPOT", "p50", _pct([r["client_tpot_s"] for r in rows], 50), _pct(pred_tpot, 50), "client")
    parts = {"prefill server TTFT p50": _pct([r["prefill_server_ttft_s"] for r in rows], 50),
             "prefill leg via HTTP p50": _pct([r["prefill_leg_s"] for r in rows], 50),
             "decode server TTFT p50 (KV load + recompute + 1st token)": _pct([r["decode_server_ttft_s"] for r in rows], 50)}
    report = {"bandwidth_Bps": bw, "completed_pred": int((req["outcome"] == "completed").sum()), "n": len(rows),
              "table": table, "measured_parts": parts, "summary_pred": {k: res.summary.get(k) for k in
                                                                        ("ttft_s", "tpot_s") if k in res.summary}}
    (vdir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    for t in table:
        print(f"{t['metric']:5} {t['stat']:4} {t['source']:18} measured {t['measured_s'] * 1e3:8.1f} ms  "
              f"predicted {t['predicted_s'] * 1e3:8.1f} ms  error {t['rel_error'] * 100:+6.1f}%")
    for k, v in parts.items():
        print(f"  measured {k}: {v * 1e3:.1f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.pd_run", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch (or attach to) a prefill+decode pair and load it through the router")
    r.add_argument("--out", required=True)
    r.add_argument("--model-dir", default=None, help="model folder (launch mode)")
    r.add_argument("--vllm-python", default=None)
    r.add_argument("--prefill-url", default=None, help="attach: running kv_producer server")
    r.add_argument("--decode-url", default=None, help="attach: running kv_consumer server")
    r.add_argument("--kv-path", default=None, help="ExampleConnector shared_storage_path (default OUT/kv)")
    r.add_argument("--prefill-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND of the prefill server")
    r.add_argument("--decode-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND of the decode server")
    r.add_argument("--requests", type=int, default=36)
    r.add_argument("--rate", type=float, default=0.8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--blocks", default="1,2,3,4,6", help="prompt lengths in 128-token blocks")
    r.add_argument("--extra-tokens", type=int, default=2, help="tokens beyond the whole blocks (2: all blocks move)")
    r.add_argument("--out-min", type=int, default=16)
    r.add_argument("--out-max", type=int, default=64)
    r.add_argument("--layers", type=int, default=4, help="files per transfer (one per layer) for the bandwidth probe")
    r.add_argument("--kv-bytes-per-token-layer", type=int, default=2 * 2 * 64 * 2,
                   help="K+V bytes per token per layer (tiny Llama: 2 KV heads x 64 x bf16 x 2)")
    r.set_defaults(fn=cmd_run)
    p = sub.add_parser("replay", help="simulate a pd_run folder as a PD scenario and compare")
    p.add_argument("bundle")
    p.add_argument("--hwdb", action="append", default=[], help="hwdb folder with the fitted profile (repeatable)")
    p.add_argument("--engine", default=None, help="engine written by `calibrate fit`, e.g. "
                                                  "CPU-host_vllm-0.32.0_tiny-llama (default: the hwdb's one fit)")
    p.add_argument("--model", default=None, help="model folder with config.json (default: HWDB/models/tiny-llama)")
    p.add_argument("--fabric", default="tcp-100gbe", help="a non-GPU-direct link (its bandwidth is overridden)")
    p.add_argument("--bandwidth-Bps", type=float, default=None, help="override the measured file bandwidth")
    p.set_defaults(fn=cmd_replay)
    a = ap.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (kill, a job scheduler) unwinds like Ctrl-C: the servers stop and the manifest says so
        signal.signal(signal.SIGTERM, _sigterm)
    try:
        return a.fn(a)
    except (PDReplayError, BundleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {getattr(a, 'out', '')}/manifest.json has status interrupted", file=sys.stderr)
        return 130


def _sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


if __name__ == "__main__":
    sys.exit(main())
