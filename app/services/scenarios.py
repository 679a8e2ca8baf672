"""Scenarios for the app: defaults, the builder's form values, uploads and cached runs.

Pure Python (never imports Streamlit).  A scenario travels between pages as a plain dict
(the YAML shape of :class:`simulator.scenario.Scenario`); :func:`to_scenario` validates it.
Every user mistake becomes an :class:`InputError` whose message names the field, the value
and the fix, ready for ``st.error``.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import hwdb
from app.services.costs import BILLED, headline, named_costs
from app.services.opsviews import ops_cost
from simulator.errors import WorkloadError
from simulator.inputs import MAX_YAML_BYTES, decode, parse_json, parse_yaml, read_yaml
from simulator.perf import FitError
from simulator.run import simulate
from simulator.scenario import Scenario, ScenarioError, parse_scenario, resolve_relative
from simulator.traces import TraceError

if TYPE_CHECKING:
    from simulator.engine.results import Results

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = REPO / "examples" / "llama8b_h100_chat.yaml"
MAX_UPLOAD_BYTES = 20 * 2**20  # uploads (scenario YAML, trace, config.json) larger than this are refused
USER_ERRORS = (ScenarioError, hwdb.HwdbError, TraceError, WorkloadError, FitError)


class InputError(ValueError):
    """Bad input from the user (one paragraph: field, value, fix)."""


def default_scenario() -> dict:
    """The built-in default scenario (Llama-3.1-8B on 2x H100, Poisson chat load) as a dict."""
    return read_yaml(DEFAULT_SCENARIO)


# Shipped example scenarios the builder offers (file in examples/ -> what it shows); those replaying
# traces from ../shared/data are left out: the app reads only the shipped examples and uploads.
EXAMPLES = {
    "llama8b_h100_chat.yaml": "Llama-3.1-8B chat on 2x H100 (the default)",
    "autoscale_step_load.yaml": "Autoscaling under a step in load (operations)",
    "fp8_decode_crashes_pd.yaml": "FP8 crashes on prefill/decode, requests re-prefilled (operations)",
    "interference_colocated.yaml": "Llama-3.1-70B, 3 colocated TP4 instances",
    "interference_pd.yaml": "Llama-3.1-70B, 1 prefill + 2 decode TP4 instances",
    "epd_images_colocated.yaml": "Qwen3-VL with six images per request, colocated TP8",
    "epd_images_epd.yaml": "Qwen3-VL with six images per request, encoder pool + TP4 (E+PD)",
    "qwen3_moe_h200_closed_loop.yaml": "Qwen3-30B-A3B (MoE) on H200, 64 users in a closed loop",
    "deepseek_v3_h200_tp8_fp8.yaml": "DeepSeek-V3 in fp8 on 8x H200",
    "llama70b_h100_tp4_sharegpt.yaml": "Llama-3.1-70B, 8 TP4 instances, ShareGPT-like lengths",
}


def example(name: str) -> dict:
    """A shipped example scenario (a key of :data:`EXAMPLES`) as a dict, its relative paths resolved."""
    if name not in EXAMPLES:
        raise InputError(f"example {name!r}: choose one of {', '.join(EXAMPLES)}")
    d = read_yaml(REPO / "examples" / name)
    return resolve_relative(d, REPO / "examples") if any(_paths(d)) or d.get("hwdb") else d


def user_hwdb_dir() -> Path:
    """The user's own hardware folder (``$EPDSIM_HWDB`` or ``~/.epdsim/hwdb``); may not exist yet."""
    return Path(os.environ.get("EPDSIM_HWDB") or Path.home() / ".epdsim" / "hwdb")


def check_size(name: str, data: bytes, limit: int = MAX_UPLOAD_BYTES) -> None:
    if len(data) > limit:
        raise InputError(
            f"{name}: the file is {len(data) / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB "
            f"upload limit; trim it (e.g. the first rows of a trace, or set workload.arrival.limit) "
            f"or run it from the command line with `epdsim simulate`"
        )


def new_upload_dir() -> Path:
    """A private folder (mode 0700, a fresh random name) for one browser session's uploads."""
    return Path(tempfile.mkdtemp(prefix="epdsim-uploads-"))


def safe_name(name: str) -> str:
    """An uploaded file's name reduced to one harmless path component (InputError if none is left)."""
    raw = str(name or "")
    if "\x00" in raw:
        raise InputError(f"{raw.replace(chr(0), '?')!r}: a file name may not contain a NUL byte; rename the file")
    base = raw.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if len(base.encode("utf-8", "surrogatepass")) > 255:
        raise InputError(f"{base[:40]!r}...: the file name is over 255 bytes; give the file a shorter name")
    if base in ("", ".", "..") or base.startswith(".."):
        raise InputError(f"{raw!r}: not a usable file name; give the file a plain name such as trace.csv")
    return base


def allowed_roots(folder: Path | None) -> tuple[Path, ...]:
    """Where a scenario in the app may read files: this session's uploads and the shipped data."""
    roots = [REPO / "examples", hwdb.db.DATA_DIR, user_hwdb_dir()]
    if folder is not None:
        roots.insert(0, Path(folder))
    return tuple(r.resolve() for r in roots)


def _inside(path: Path, roots: tuple[Path, ...]) -> bool:
    try:
        real = path.resolve()
    except (OSError, RuntimeError):
        return False
    return any(real == r or real.is_relative_to(r) for r in roots)


def sandbox(d, folder: Path | None, origin: str = "scenario"):
    """``d`` with every file it names (``path`` entries, ``hwdb`` folders, a ``model`` path) taken
    relative to the upload ``folder`` and checked to lie in :func:`allowed_roots`.

    A scenario uploaded to the app may only read what was uploaded with it (or the shipped examples and
    hardware data): a path elsewhere on the server is refused before anything is read, so no message
    can show a server file's contents.  Raises :class:`InputError` naming the field and the value."""
    if not isinstance(d, dict):
        return d
    roots = allowed_roots(folder)
    base = Path(folder) if folder is not None else None

    def place(value: str) -> Path:
        p = Path(value).expanduser() if value.startswith("~") else Path(value)
        return p if p.is_absolute() or base is None else base / p

    def refuse(field: str, value: str):
        return InputError(
            f"{origin}: {field} = {value!r} is outside the files uploaded in this session; the app "
            f"reads only files uploaded with the scenario (and the shipped examples): upload the "
            f"file too and give its name, e.g. path: trace.csv"
        )

    def walk(node, where: str):
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                at = f"{where}.{k}" if where else str(k)
                if k == "path" and isinstance(v, str):
                    p = place(v)
                    if not _inside(p, roots):
                        raise refuse(at, v)
                    out[k] = str(p)
                elif k == "model" and isinstance(v, str) and _looks_like_path(v, base):
                    p = place(v)
                    if not _inside(p, roots):
                        raise refuse(at, v)
                    out[k] = str(p)
                else:
                    out[k] = walk(v, at)
            return out
        if isinstance(node, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    out = walk({k: v for k, v in d.items() if k != "hwdb"}, "")
    if "hwdb" in d:
        dirs = d["hwdb"] if isinstance(d["hwdb"], list) else [d["hwdb"]]
        out["hwdb"] = []
        for i, v in enumerate(dirs):
            if isinstance(v, str):
                p = place(v)
                if not _inside(p, roots):
                    raise refuse(f"hwdb[{i}]", v)
                v = str(p)
            out["hwdb"].append(v)
    return out


def _looks_like_path(value: str, base: Path | None) -> bool:
    """A ``model`` value that names a file or folder rather than a model of the database."""
    if value.endswith(".json") or value.startswith((".", "~", "/")) or "\\" in value:
        return True
    try:
        return Path(value).exists() or (base is not None and (base / value).exists())
    except OSError:
        return True


def _decode(name: str, data: bytes, what: str) -> str:
    return decode(data, name, InputError, what)


def parse_yaml_upload(
    name: str, data: bytes, folder: Path | None = None, files: tuple[tuple[str, bytes], ...] = ()
) -> dict:
    """An uploaded scenario YAML as a dict, checked (size, encoding, YAML with the alias budget and
    duplicate keys refused, the files it names sandboxed by :func:`sandbox`, schema).

    ``files``: (name, bytes) uploaded with it (traces, length files, config.json), saved into the
    session's upload ``folder`` (a new private one when None) where the scenario may name them."""
    name = safe_name(name)
    check_size(name, data, MAX_YAML_BYTES)  # YAML parses at ~1 MB/s: a scenario is a few kB
    text = _decode(name, data, "scenario")
    if folder is None and files:
        folder = new_upload_dir()
    for fname, fdata in files:
        save_upload("files", fname, fdata, folder)
    try:
        d = parse_yaml(text, name, InputError)
    except InputError as exc:
        raise InputError(f"{exc} (compare with examples/llama8b_h100_chat.yaml)") from None
    d = sandbox(d, folder, name)
    to_scenario(d, origin=name)  # raises InputError when it is not a valid scenario
    return d


def save_upload(kind: str, name: str, data: bytes, folder: Path | None = None) -> Path:
    """Write an uploaded file into the session's private upload ``folder``; returns its path.

    ``folder`` None: a new private folder (:func:`new_upload_dir`).  The name is reduced to one
    component by :func:`safe_name`, so an upload cannot write elsewhere; ``kind`` is only for messages."""
    check_size(name, data)
    folder = Path(folder) if folder is not None else new_upload_dir()
    p = folder / safe_name(name)
    if p.is_symlink() or (p.exists() and not p.is_file()):
        raise InputError(f"{p.name}: an upload of this name cannot be stored; rename the file")
    p.write_bytes(data)
    return p


def model_from_config_upload(name: str, data: bytes, folder: Path | None = None) -> str:
    """Store an uploaded Hugging Face ``config.json``; returns the model folder to use as ``model``."""
    name = safe_name(name)
    check_size(name, data)
    try:
        cfg = parse_json(_decode(name, data, "config.json"), name, InputError, "config.json")
    except InputError as exc:
        raise InputError(f"{exc}; upload the model's config.json from its Hugging Face repository") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{name}: expected a JSON object like a Hugging Face config.json, got a {type(cfg).__name__}")
    raw = cfg.get("_name_or_path")
    raw = raw if isinstance(raw, str) else Path(name).stem
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", raw.replace("/", "_"))[:64].lstrip("._-") or "uploaded-model"
    root = (Path(folder) if folder is not None else new_upload_dir()) / "models"
    root.mkdir(exist_ok=True)
    target = root / stem
    target.mkdir(exist_ok=True)
    (target / "config.json").write_bytes(data)
    try:
        hwdb.load_model_dir(target)
    except hwdb.HwdbError as exc:
        raise InputError(str(exc).replace(str(target / "config.json"), name)) from None
    return str(target)


def trace_workload(path: Path, rate: float | None, limit: int | None) -> dict:
    """A workload that replays an uploaded trace (format detected from its header)."""
    arr: dict = {"kind": "trace", "path": str(path), "format": "auto"}
    if rate:
        arr["rate"] = float(rate)
    if limit:
        arr["limit"] = int(limit)
    return {"arrival": arr}


def to_scenario(d: dict, origin: str = "scenario", folder: Path | None = None, sandboxed: bool = False) -> Scenario:
    """Validate a scenario dict; raises :class:`InputError` with the field, the value and the fix.

    ``sandboxed``: first check with :func:`sandbox` that it reads only files of the upload ``folder``
    and the shipped data (the app does, for every scenario it runs)."""
    if sandboxed:
        d = sandbox(d, folder, origin)
    try:
        return parse_scenario(copy.deepcopy(d), origin)
    except ScenarioError as exc:
        raise InputError(str(exc)) from None


def scenario_hash(scn: Scenario) -> str:
    """A stable key for a scenario: its canonical JSON plus the size and mtime of files it reads."""
    blob = scn.model_dump_json()
    stamps = []
    for p in _paths(scn.model_dump(mode="json")):
        try:
            st = Path(p).stat()
            stamps.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            stamps.append(f"{p}:missing")
    return hashlib.sha256((blob + "|".join(stamps)).encode()).hexdigest()[:20]


def _paths(node) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "path" and isinstance(v, str)] + [
            p for v in node.values() for p in _paths(v)
        ]
    if isinstance(node, list):
        return [p for v in node for p in _paths(v)]
    return []


@dataclass(frozen=True)
class Prices:
    """Optional price overrides in USD per GPU-hour, by GPU name as written in the pools."""

    usd_per_gpu_hour: tuple[tuple[str, float], ...] = ()

    def get(self, gpu: str) -> float | None:
        return dict(self.usd_per_gpu_hour).get(gpu)


def cost(results: Results, prices: Prices | None = None, db: hwdb.HardwareDB | None = None) -> dict:
    """Cost per hour and per million output (and total) tokens, with optional price overrides per GPU.

    The headline figures are :func:`app.services.costs.headline`'s: for a run with operations
    (autoscaling, crashes) the billed GPU-hours as a mean per hour, and the dict adds ``with_scaling``
    (True), ``usd`` and ``gpu_hours``.  ``named`` holds every named cost (static, and mean billed where it
    applies) as :func:`app.services.costs.named_costs` gives them, the same function `epdsim simulate` prints.

    Without overrides the figures are the run's own summary (hwdb list prices); with them, GPUs without an
    override keep their list price from ``db`` (loaded from the scenario's folders when not given).
    """
    s = results.summary
    pools = results.info["pools"]
    static = billed = None
    if prices is not None and any(prices.get(p["gpu"]) is not None for p in pools):
        db = db or hwdb.load(results.scenario.hwdb)
        static = sum(
            p["instances"]
            * p["tp"]
            * p["pp"]
            * (prices.get(p["gpu"]) if prices.get(p["gpu"]) is not None else db.gpu(p["gpu"]).price_usd_per_hour.value)
            for p in pools
        )
        if (run_cost := ops_cost(results, prices, db)) is not None:  # a run with operations
            billed = run_cost["usd"]
    named = named_costs(s, static, billed)
    top = named[headline(named)]
    out = {k: top[k] for k in ("usd_per_hour", "usd_per_million_output_tokens", "usd_per_million_total_tokens")}
    if BILLED in named:
        out |= {"with_scaling": True, "usd": top["usd"], "gpu_hours": top["gpu_hours"]}
    return out | {"named": named}


class RunCache:
    """Finished runs by scenario hash (least recently used dropped beyond ``size``).

    One instance per app server; the page layer holds it (``st.cache_resource``).
    """

    def __init__(self, size: int = 32):
        self.size = size
        self._runs: OrderedDict[str, object] = OrderedDict()

    def get(self, key: str):
        if key in self._runs:
            self._runs.move_to_end(key)
            return self._runs[key]
        return None

    def put(self, key: str, results) -> None:
        self._runs[key] = results
        self._runs.move_to_end(key)
        while len(self._runs) > self.size:
            self._runs.popitem(last=False)

    def __contains__(self, key: str) -> bool:
        return key in self._runs

    def __len__(self) -> int:
        return len(self._runs)


def run(d: dict, cache: RunCache | None = None, replication: int = 0, folder: Path | None = None):
    """Simulate a scenario dict (sandboxed and validated here), using ``cache`` when given.

    ``folder``: the session's upload folder, the only place besides the shipped data and the user's
    hardware folder that the scenario may read files from (:func:`sandbox`; None: no uploads).
    Returns :class:`simulator.engine.results.Results`; raises :class:`InputError` for bad input
    (including a file outside those folders, or a model that does not fit the GPUs).
    """
    scn = to_scenario(d, folder=folder, sandboxed=True)
    key = f"{scenario_hash(scn)}:{replication}"
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    try:
        res = simulate(scn, replication=replication)
    except USER_ERRORS as exc:
        raise InputError(str(exc)) from None
    if cache is not None:
        cache.put(key, res)
    return res
