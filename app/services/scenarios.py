"""Scenarios for the app: defaults, the builder's form values, uploads and cached runs.

Pure Python (never imports Streamlit).  A scenario travels between pages as a plain dict
(the YAML shape of :class:`simulator.scenario.Scenario`); :func:`to_scenario` validates it.
Every user mistake becomes an :class:`InputError` whose message names the field, the value
and the fix, ready for ``st.error``.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import yaml

import hwdb
from simulator.perf import FitError
from simulator.scenario import Scenario, ScenarioError, parse_scenario
from simulator.traces import TraceError
from simulator.workload import WorkloadError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIO = REPO / "examples" / "llama8b_h100_chat.yaml"
MAX_UPLOAD_BYTES = 20 * 2**20      # uploads (scenario YAML, trace, config.json) larger than this are refused
USER_ERRORS = (ScenarioError, hwdb.HwdbError, TraceError, WorkloadError, FitError)


class InputError(ValueError):
    """Bad input from the user (one paragraph: field, value, fix)."""


def default_scenario() -> dict:
    """The built-in default scenario (Llama-3.1-8B on 2x H100, Poisson chat load) as a dict."""
    return yaml.safe_load(DEFAULT_SCENARIO.read_text())


def user_hwdb_dir() -> Path:
    """The user's own hardware folder (``$EPDSIM_HWDB`` or ``~/.epdsim/hwdb``); may not exist yet."""
    return Path(os.environ.get("EPDSIM_HWDB") or Path.home() / ".epdsim" / "hwdb")


def check_size(name: str, data: bytes, limit: int = MAX_UPLOAD_BYTES) -> None:
    if len(data) > limit:
        raise InputError(f"{name}: the file is {len(data) / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB "
                         f"upload limit; trim it (e.g. the first rows of a trace, or set workload.arrival.limit) "
                         f"or run it from the command line with `epdsim simulate`")


def parse_yaml_upload(name: str, data: bytes) -> dict:
    """An uploaded scenario YAML as a dict, checked (size, syntax with ``yaml.safe_load``, schema)."""
    check_size(name, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text; save the scenario as a plain-text YAML file") from None
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{name}: not valid YAML{where}: {what}; fix the syntax there "
                         f"(compare with examples/llama8b_h100_chat.yaml)") from None
    to_scenario(d, origin=name)       # raises InputError when it is not a valid scenario
    return d


def save_upload(kind: str, name: str, data: bytes, folder: Path | None = None) -> Path:
    """Write an uploaded trace or config.json under a private temp folder; returns its path.

    The file name is reduced to its last component, so an upload cannot write elsewhere.
    """
    check_size(name, data)
    base = folder or Path(tempfile.gettempdir()) / "epdsim-app-uploads"
    digest = hashlib.sha256(data).hexdigest()[:16]
    d = base / kind / digest
    d.mkdir(parents=True, exist_ok=True)
    p = d / (Path(name).name or "upload")
    p.write_bytes(data)
    return p


def model_from_config_upload(name: str, data: bytes) -> str:
    """Store an uploaded Hugging Face ``config.json``; returns the model folder to use as ``model``."""
    check_size(name, data)
    try:
        cfg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{name}: not a JSON file ({exc}); upload the model's config.json from its "
                         f"Hugging Face repository") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{name}: expected a JSON object like a Hugging Face config.json, got a "
                         f"{type(cfg).__name__}")
    stem = str(cfg.get("_name_or_path") or Path(name).stem).replace("/", "_") or "uploaded-model"
    folder = save_upload("models", "config.json", data).parent / stem
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_bytes(data)
    try:
        hwdb.load_model_dir(folder)
    except hwdb.HwdbError as exc:
        raise InputError(f"{name}: {exc}") from None
    return str(folder)


def trace_workload(path: Path, rate: float | None, limit: int | None) -> dict:
    """A workload that replays an uploaded trace (format detected from its header)."""
    arr: dict = {"kind": "trace", "path": str(path), "format": "auto"}
    if rate:
        arr["rate"] = float(rate)
    if limit:
        arr["limit"] = int(limit)
    return {"arrival": arr}


def to_scenario(d: dict, origin: str = "scenario") -> Scenario:
    """Validate a scenario dict; raises :class:`InputError` with the field, the value and the fix."""
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
        return [v for k, v in node.items() if k == "path" and isinstance(v, str)] + \
            [p for v in node.values() for p in _paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in _paths(v)]
    return []


@dataclass(frozen=True)
class Prices:
    """Optional price overrides in USD per GPU-hour, by GPU name as written in the pools."""

    usd_per_gpu_hour: tuple[tuple[str, float], ...] = ()

    def get(self, gpu: str) -> float | None:
        return dict(self.usd_per_gpu_hour).get(gpu)


def cost(results, prices: Prices | None = None, db: hwdb.HardwareDB | None = None) -> dict:
    """Cost per hour and per million output (and total) tokens, with optional price overrides per GPU.

    Without overrides this is the run's own summary (hwdb list prices); with them, GPUs without an
    override keep their list price from ``db`` (loaded from the scenario's folders when not given).
    """
    s = results.summary
    pools = results.info["pools"]
    if prices is None or all(prices.get(p["gpu"]) is None for p in pools):
        per_hour = s["cost_usd_per_hour"]
    else:
        db = db or hwdb.load(results.scenario.hwdb)
        per_hour = 0.0
        for p in pools:
            over = prices.get(p["gpu"])
            unit = over if over is not None else db.gpu(p["gpu"]).price_usd_per_hour.value
            per_hour += p["instances"] * p["tp"] * p["pp"] * unit
    rate = s["output_tokens_per_s"]
    return {"usd_per_hour": per_hour,
            "usd_per_million_output_tokens": per_hour / (rate * 3600.0) * 1e6 if rate > 0 else float("inf"),
            "usd_per_million_total_tokens": (per_hour / (s["total_tokens_per_s"] * 3600.0) * 1e6
                                             if s["total_tokens_per_s"] > 0 else float("inf"))}


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


def run(d: dict, cache: RunCache | None = None, replication: int = 0):
    """Simulate a scenario dict (validated here), using ``cache`` when given.

    Returns :class:`simulator.results.Results`; raises :class:`InputError` for bad input
    (including a model that does not fit the GPUs).
    """
    from simulator.run import simulate
    scn = to_scenario(d)
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
