"""A calibration run: server (launched or attached) -> bundle -> probe phases."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibration.harness import env as envinfo
from calibration.harness.affinity import cpu_list, pin_below
from calibration.harness.bundle import Bundle, BundleError, now_iso, proc_start
from calibration.harness.client import CompletionClient, PromptFactory, RequestSpec, as_interrupt
from calibration.harness.interrupt import run_stoppable
from calibration.harness.launch_env import (
    DEFAULT_LAUNCH_ENV,
    NO_VLLM_PYTHON,
    REPO,
    default_vllm_python,
    ensure_tiny_model,
    free_port,
    repo_pythonpath,
    shebang_python,
)
from calibration.harness.metrics import parse_prometheus
from calibration.harness.phase_run import run_phase
from calibration.harness.probes import PlanOptions, build_plan, resolve_rate
from calibration.harness.server import Endpoint, ServerError, ServerProcess
from calibration.harness.server_log import check_server_log, copy_name, copy_server_log
from calibration.harness.startup_log import parse_startup_log

DEFAULT_SERVED_NAME = "tiny-llama"


@dataclass
class RunOptions:
    out: Path
    attach: str | None = None  # URL of a running server
    serve_cmd: list[str] | None = None  # full launch command (GPU: ["vllm", "serve", ...])
    url: str | None = None  # where a custom-launched server listens
    port: int | None = None  # default launch: free port if None
    host: str = "127.0.0.1"
    vllm_python: str | None = None  # default launch: the Python that has vllm
    model_dir: str | None = None  # default launch: model folder (else BUNDLE/model)
    served_model_name: str | None = None
    engine_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    enforce_eager: bool = True  # default launch only
    ready_timeout: float = 900.0
    model: str | None = None  # which model of /v1/models to use
    api_key: str | None = None
    resume: bool = False
    plan: PlanOptions = field(default_factory=PlanOptions)
    warmup_requests: int = 2
    server_hardware: str | None = None  # attach mode: a note on the server's hardware
    server_log: str | None = None  # attach mode: a saved server log (kubectl logs) to parse
    argv: list[str] | None = None
    pin: tuple[frozenset[int], frozenset[int]] | None = None  # launch: (engine CPUs, front-end CPUs); affinity.py


def default_launch_command(opts: RunOptions, model_dir: Path, port: int) -> list[str]:
    py = opts.vllm_python or default_vllm_python()
    if not py:
        raise ServerError(NO_VLLM_PYTHON)
    cmd = [
        py,
        "-m",
        "calibration.harness.vllm_launcher",
        "serve",
        str(model_dir),
        "--host",
        opts.host,
        "--port",
        str(port),
        "--served-model-name",
        opts.served_model_name or DEFAULT_SERVED_NAME,
        "--enable-per-request-metrics",
        "--disable-uvicorn-access-log",
        "--seed",
        "0",
    ]
    if opts.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + list(opts.engine_args)


def model_identity(models_json: dict, want: str | None) -> dict:
    data = models_json.get("data") or []
    if want:
        pick = next((m for m in data if m.get("id") == want), None)
        if pick is None:
            raise BundleError(
                f"the server does not serve {want!r}; it serves {', '.join(m.get('id', '?') for m in data)}"
            )
    else:
        pick = data[0]
    ident = {"served_name": pick["id"], "root": pick.get("root"), "max_model_len": pick.get("max_model_len")}
    root = Path(str(pick.get("root") or ""))
    cfg = root / "config.json"
    if pick.get("root") and cfg.is_file():
        raw = cfg.read_bytes()
        ident["config_sha256"] = hashlib.sha256(raw).hexdigest()
        try:
            ident["config"] = json.loads(raw)
        except json.JSONDecodeError:
            pass
        gen = root / "epdsim_model.json"
        if gen.is_file():
            ident["generator"] = json.loads(gen.read_text())
    return ident


class CalibrationRun:
    def __init__(self, opts: RunOptions, log: Callable[[str], None] | None = None):
        self.opts = opts
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self.bundle: Bundle | None = None
        self.server: Endpoint | None = None
        self._launch_record: dict | None = None
        self._affinity: set[int] | None = None  # this process's CPUs before --pin moved it
        self._attachment: dict | None = None  # this run's manifest entry for an attached server

    # ------------------------------------------------------------------ server
    def _start_server(self) -> tuple[Endpoint, dict]:
        o = self.opts
        out = Path(o.out)
        if o.attach:
            srv = Endpoint(o.attach)
            self.log(f"attaching to {srv.base_url}")
            return srv, srv.wait_ready(timeout=o.ready_timeout)
        out.mkdir(parents=True, exist_ok=True)
        n = len(list(out.glob("server-*.log")))
        env = dict(o.env)
        if o.serve_cmd:
            cmd = list(o.serve_cmd)
            url = o.url or f"http://{o.host}:{o.port or 8000}"
        else:
            py = o.vllm_python or default_vllm_python()
            if not py:
                raise ServerError(NO_VLLM_PYTHON)
            o.vllm_python = py
            model_dir = Path(o.model_dir) if o.model_dir else out / "model"
            ensure_tiny_model(py, model_dir.resolve(), self.log)
            port = o.port or free_port(o.host)
            cmd = default_launch_command(o, model_dir.resolve(), port)
            url = f"http://{o.host}:{port}"
            env = {**DEFAULT_LAUNCH_ENV, "PYTHONPATH": repo_pythonpath(), **env}
        if not o.pin and not o.serve_cmd and len(os.sched_getaffinity(0)) <= 4:
            self.log(
                f"note: {len(os.sched_getaffinity(0))} CPUs: vLLM's engine core busy-waits beside the API server "
                "and this harness unless pinned apart; --pin 0:1 measured sends within 3 ms of schedule instead "
                "of up to 110 ms late (docs/calibration.md, 'On a small host')"
            )
        if o.pin:
            # the worker's OpenMP threads on the engine's CPUs; the server starts, as this harness now runs,
            # on the front end's
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_list(o.pin[0]))
            self._affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, o.pin[1])
        srv = ServerProcess(cmd, url, out / f"server-{n}.log", env=env, cwd=REPO)
        self.log(f"launching: {shlex.join(cmd)}")
        srv.start()
        assert srv.proc is not None  # start() set it or raised
        self._launch_record = {
            "index": n,
            "command": cmd,
            "env": {k: v for k, v in env.items() if k != "PYTHONPATH"},
            "url": url,
            "pid": srv.proc.pid,
            "started": now_iso(),
            "log": f"server-{n}.log",
        }
        self.server = srv
        models = srv.wait_ready(timeout=o.ready_timeout)
        self.log(f"server ready after {srv.ready_s:.1f} s")
        if o.pin:
            moved = pin_below(srv.proc.pid, set(o.pin[0]))
            self._launch_record["pin"] = {
                "engine_cpus": sorted(o.pin[0]),
                "front_cpus": sorted(o.pin[1]),
                "threads_moved_to_engine_cpus": len(moved),
            }
            self.log(
                f"pinned: the worker and the engine core on CPU {cpu_list(o.pin[0])} ({len(moved)} threads "
                f"moved), the API server and this harness on CPU {cpu_list(o.pin[1])}"
            )
        return srv, models

    # ------------------------------------------------------------------ bundle
    def _open_bundle(self, srv: Endpoint, models: dict, info: dict) -> Bundle:
        o = self.opts
        ident = model_identity(models, o.model)
        if o.resume:
            b = Bundle.open(o.out)
            b.check_same_model(ident)
            return b
        # under --pin: the server's CPUs (both lists), not the front end's that this process runs on now
        hw_local = envinfo.hardware(self._affinity, None if o.attach else o.pin)
        manifest = {
            "mode": "attach" if o.attach else "launch",
            "model": ident,
            "plan": build_plan(o.plan, int(ident.get("max_model_len") or 4096)),
            "plan_options": dict(o.plan.resolved().__dict__),
            "hardware": {
                "server": hw_local if not o.attach else (o.server_hardware or "unknown (attach mode)"),
                "client": hw_local,
            },
            "versions": {
                "vllm": info.get("vllm_version"),
                "server_python": info.get("server_python"),
                "client": envinfo.client_env(),
            },
            "engine": {"cache_config": info.get("cache_config"), "url": srv.base_url},
            "epdsim": envinfo.git_commit(),
            "seed": o.plan.seed,
        }
        return Bundle.create(o.out, manifest)

    async def _server_info(self, client: CompletionClient) -> dict:
        info: dict = {}
        try:
            info["vllm_version"] = (await client.get_json("/version")).get("version")
        except Exception:  # noqa: BLE001 - /version is a nicety: a proxy or another server may lack it
            info["vllm_version"] = None
        try:
            sc = parse_prometheus(await client.metrics_text())
            info["cache_config"] = sc.info("vllm:cache_config_info") or None
        except Exception:  # noqa: BLE001 - a server without /metrics (or that info) is still measurable
            info["cache_config"] = None
        py = self.opts.vllm_python or (shebang_python(self.opts.serve_cmd[0]) if self.opts.serve_cmd else None)
        if py and not self.opts.attach:
            info["server_python"] = await asyncio.to_thread(envinfo.python_env, py)
        return info

    # ------------------------------------------------------------------ run
    def run(self) -> Bundle:
        o = self.opts
        if o.attach and o.server_log:
            check_server_log(o.server_log)  # a FIFO would block the run once measured; refuse it first
        if o.resume:
            b = Bundle.open(o.out)  # fail fast, before a launch, on a missing or broken bundle
            plan = b.manifest["plan"]
            if all(b.phase_done(p["name"]) for p in plan):
                self.log(
                    f"{o.out}: all {len(plan)} phases of the plan are done; nothing to resume (no server "
                    f"started). Measure more into a new --out"
                )
                return b
        elif (Path(o.out) / "manifest.json").exists():
            raise BundleError(f"{o.out} already holds a bundle; pass --resume to continue it, or choose another --out")
        # Load before the launch is other work's; after the run it still holds this run's own (1-min decay).
        # pid, host and process start time let a later reader tell a SIGKILLed run from a live one
        run_rec: dict[str, Any] = {
            "started": now_iso(),
            "argv": o.argv,
            "resume": o.resume,
            "status": "running",
            "pid": os.getpid(),
            "hostname": os.uname().nodename,
            "proc_start": proc_start(),
            "conditions": {"before": envinfo.conditions()},
        }
        try:
            srv, models = self._start_server()
            self.server = srv
            return run_stoppable(self._measure(srv, models, run_rec))
        except BaseException as exc:
            cause = as_interrupt(exc)
            run_rec["status"] = {"ServerDied": "server_died", "KeyboardInterrupt": "interrupted"}.get(
                type(cause).__name__, "error"
            )
            run_rec["error"] = str(cause)[:4000]
            if cause is not exc:
                raise cause from None
            raise
        finally:
            code = self.server.stop() if self.server is not None else None
            if self._affinity is not None:
                os.sched_setaffinity(0, self._affinity)
            if self.bundle is not None:
                if self._launch_record is not None:
                    self._launch_record["exit_code"] = code
                    self._launch_record["stopped"] = now_iso()
                run_rec["finished"] = now_iso()
                run_rec["conditions"]["after"] = envinfo.conditions()
                self._refresh_server_log()
                self.bundle.write_manifest()

    def _refresh_server_log(self) -> None:
        """Copy the attached server's log again at the run's end (or interruption): it logged while measured.

        A failure only warns: the copy made when the attachment was recorded stands (server_log.py
        replaces it whole or not at all), and the run's own outcome must not be masked."""
        att = self._attachment
        if att is None or not att.get("server_log") or self.bundle is None or not self.opts.server_log:
            return
        try:
            copy_server_log(self.opts.server_log, self.bundle.path, att["server_log"])
        except (OSError, BundleError) as exc:
            self.log(
                f"warning: --server-log {self.opts.server_log}: the bundle keeps the copy made at the start "
                f"of the run ({att['server_log']}); copying it again failed: {exc}"
            )

    async def _measure(self, srv: Endpoint, models: dict, run_rec: dict) -> Bundle:
        o = self.opts
        ident_name = model_identity(models, o.model)["served_name"]
        async with CompletionClient(srv.base_url, ident_name, api_key=o.api_key) as client:
            info = await self._server_info(client)
            b = self._open_bundle(srv, models, info)
            self.bundle = b
            b.manifest.setdefault("runs", []).append(run_rec)
            if srv.launched:
                startup = srv.startup()
                launch = self._launch_record
                assert launch is not None  # _start_server recorded the launch
                launch["ready_s"] = round(srv.ready_s or 0.0, 3)
                launch["startup"] = startup
                launch["vllm_version"] = info.get("vllm_version")
                b.manifest.setdefault("launches", []).append(launch)
                if startup["events"]:
                    args = next((e.get("text") for e in startup["events"] if e["phase"] == "engine_args"), None)
                    if args:
                        b.manifest.setdefault("engine", {})["args_logged"] = args
            else:
                att = {"url": srv.base_url, "at": now_iso(), "vllm_version": info.get("vllm_version")}
                attachments = b.manifest.setdefault("attachments", [])
                if o.server_log:
                    # the manifest names a copy inside the bundle: a fit reads no file outside it (server_log.py)
                    name = copy_name(len(attachments))
                    try:
                        data = copy_server_log(o.server_log, b.path, name)
                    except OSError as exc:
                        raise BundleError(f"--server-log {o.server_log}: {exc.strerror or exc}") from None
                    att["server_log"] = name
                    att["server_log_source"] = os.path.abspath(o.server_log)  # where it was copied from
                    att["startup"] = parse_startup_log(data.decode("utf-8", "replace").splitlines())
                attachments.append(att)
                self._attachment = att
            b.write_manifest()
            prompts = await PromptFactory.from_server(client, seed=o.plan.seed)
            if prompts.source != "tokenize":
                self.log(f"warning: prompt token ids: {prompts.source}")
            b.manifest["prompt_pool"] = {"source": prompts.source, "distinct_ids": len(prompts.pool)}
            await self._warmup(client, prompts)
            for phase in b.manifest["plan"]:
                if b.phase_done(phase["name"]):
                    continue
                if phase["mode"] == "open" and any(r[3] is None for r in phase["requests"]):
                    resolve_rate(b, phase)
                    b.write_manifest()
                await run_phase(b, phase, client, srv, prompts, self.log)
            run_rec["status"] = "completed"
            return b

    async def _warmup(self, client: CompletionClient, prompts: PromptFactory) -> None:
        for i in range(self.opts.warmup_requests):
            res = await client.complete(RequestSpec(f"warmup-{i}", prompts.prompt(f"warmup-{i}", 32), 4))
            if not res.ok:
                assert self.server is not None  # run() set it before measuring
                await asyncio.to_thread(self.server.check, "during warm-up")
                raise ServerError(f"warm-up request failed: {res.error}")
