"""Browse the hardware database and add GPUs, links and models to the user's folder (no Streamlit).

Additions are validated by the same schema as the shipped data (``hwdb.load`` on a copy of the
user folder with the new file) before anything is written; every figure keeps a ``source``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import yaml

import hwdb
from app.services.scenarios import InputError, check_size, safe_name, user_hwdb_dir
from hwdb import listing
from simulator.inputs import decode, parse_json, parse_yaml

KINDS = ("gpus", "links", "models")


def table(kind: str, user_dir: Path | None = None, db: hwdb.HardwareDB | None = None) -> pd.DataFrame:
    """The shipped database plus the user folder (when it exists), one row per item (``db``: already loaded)."""
    rows = {"gpus": listing.gpu_rows, "links": listing.link_rows, "models": listing.model_rows}[kind]
    df = pd.DataFrame(rows(db or load(user_dir)))
    for c in df.columns:  # mixed columns (a bool or None among strings) as text, for display
        if df[c].dtype == object:
            df[c] = df[c].map(lambda v: "" if v is None else str(v))
    return df


def load(user_dir: Path | None = None) -> hwdb.HardwareDB:
    d = user_dir or user_hwdb_dir()
    return hwdb.load([d] if d.is_dir() else [])


def _stamp(dirs: tuple[str, ...]) -> tuple:
    """Names, sizes and modification times of every file under ``dirs`` (changes when a file does)."""
    out = []
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.is_file():
                st = p.stat()
                out.append((str(p), st.st_size, st.st_mtime_ns))
    return tuple(out)


class DbCache:
    """The last loaded database per folder list, reloaded when a file in the user folders changes.

    Loading the shipped YAML costs ~0.1-0.2 s; the builder needs the database on every rerun.
    One instance per app server (held by the page layer).
    """

    def __init__(self):
        self._entries: dict[tuple[str, ...], tuple[tuple, hwdb.HardwareDB]] = {}

    def get(self, dirs: tuple[str, ...] = ()) -> hwdb.HardwareDB:
        dirs = tuple(str(d) for d in dirs)
        stamp = _stamp(dirs)
        hit = self._entries.get(dirs)
        if hit is None or hit[0] != stamp:
            hit = (stamp, hwdb.load(dirs))
            self._entries[dirs] = hit
        return hit[1]


def describe(kind: str, name: str, user_dir: Path | None = None, db: hwdb.HardwareDB | None = None) -> dict:
    try:
        return listing.describe(db or load(user_dir), kind.rstrip("s"), name)
    except hwdb.HwdbError as exc:
        raise InputError(str(exc)) from None


def _safe_name(name: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name or ""):
        raise InputError(f"{what} name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (e.g. Lab-GPU-96)")
    return name


def shipped_clash(kind: str, name: str, aliases=()) -> str | None:
    """The shipped ``kind`` entry (gpus, links, models) that ``name`` or one of ``aliases`` would
    replace, or None.  The app never replaces shipped hardware unless told to (``override``)."""
    shipped = hwdb.load([])
    tables: dict[str, dict] = {"gpus": shipped.gpus, "links": shipped.links, "models": shipped.models}
    table = tables[kind]
    for n in (name, *[a for a in aliases if isinstance(a, str)]):
        try:
            return hwdb.db.find(kind[:-1], table, n, "").name
        except hwdb.HwdbError:
            continue
    return None


def _refuse_clash(kind: str, name: str, aliases, override: bool) -> None:
    hit = shipped_clash(kind, name, aliases)
    if hit is not None and not override:
        raise InputError(
            f"{kind[:-1]} {name!r} would replace the shipped {kind[:-1]} {hit!r} for every session "
            f"of this app; choose another name, or tick 'replace the shipped entry' to override it "
            f"on purpose"
        )


def _validated_write(user_dir: Path, rel: str, content: bytes, label: str | None = None) -> Path:
    """Check the user folder with the new file by loading it, then write it for real; an error about the
    new file names ``label`` (the uploaded file's name), never the trial copy."""
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / "hw"
        if user_dir.is_dir():
            shutil.copytree(user_dir, trial)
        target = trial / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        try:
            hwdb.load([trial])
        except hwdb.HwdbError as exc:
            msg = str(exc).replace(str(target), label) if label else str(exc)
            raise InputError(msg.replace(str(trial), str(user_dir))) from None
    out = user_dir / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(content)
    return out


def add_gpu(
    name: str,
    template: str,
    memory_GiB: float,
    bandwidth_TBps: float,
    bf16_TFLOPS: float,
    price_usd_per_hour: float,
    source: str,
    user_dir: Path | None = None,
    override: bool = False,
) -> Path:
    """A GPU like ``template`` with the given memory, bandwidth, bf16 peak and price, each citing ``source``.

    Figures not given (links, power, efficiency defaults) are the template's, with its sources.
    """
    user_dir = user_dir or user_hwdb_dir()
    _safe_name(name, "GPU")
    _refuse_clash("gpus", name, (), override)
    if not source or not source.strip():
        raise InputError(
            "source: every hardware figure needs its source (a datasheet, a measurement); "
            "write where the numbers come from"
        )
    for field, v in (("memory_GiB", memory_GiB), ("bandwidth_TBps", bandwidth_TBps), ("bf16_TFLOPS", bf16_TFLOPS)):
        if not v or not 0 < v < 1e9:
            raise InputError(f"{field}={v!r} must be a finite number > 0")
    if not 0 <= price_usd_per_hour < 1e6:
        raise InputError(f"price_usd_per_hour={price_usd_per_hour!r} must be a finite number >= 0")
    db = load(user_dir)
    try:
        base = db.gpu(template).model_dump(mode="json", exclude_none=True)
    except hwdb.HwdbError as exc:
        raise InputError(f"template: {exc}") from None
    src = source.strip()
    base.update(name=name, aliases=[])
    base["memory_bytes"] = {"value": float(memory_GiB) * 2**30, "source": src}
    base["memory_bandwidth_Bps"] = {"value": float(bandwidth_TBps) * 1e12, "source": src}
    base["peak_flops"] = {"bf16": {"value": float(bf16_TFLOPS) * 1e12, "source": src}}
    base["price_usd_per_hour"] = {"value": float(price_usd_per_hour), "source": src}
    base["notes"] = f"added in the epdsim app from template {template}; other figures are the template's"
    text = yaml.safe_dump(base, sort_keys=False)
    return _validated_write(user_dir, f"gpus/{name}.yaml", text.encode())


def add_yaml(kind: str, filename: str, data: bytes, user_dir: Path | None = None, override: bool = False) -> Path:
    """An uploaded GPU or link YAML file (``kind``: gpus or links), read by the project's reading layer
    (alias budget, duplicate keys refused).  A name of shipped hardware is refused unless ``override``."""
    user_dir = user_dir or user_hwdb_dir()
    if kind not in ("gpus", "links"):
        raise InputError(f"kind {kind!r}: YAML uploads add gpus or links")
    filename = safe_name(filename)
    check_size(filename, data, 1 * 2**20)
    try:
        d = parse_yaml(decode(data, filename, InputError, "hardware file"), filename, InputError)
    except InputError as exc:
        raise InputError(f"{exc}; compare with hwdb/data/{kind}/ files") from None
    if not isinstance(d, dict) or not isinstance(d.get("name"), str):
        raise InputError(f"{filename}: expected a mapping with a 'name' like the files in hwdb/data/{kind}/")
    name = _safe_name(d["name"], kind[:-1])
    aliases = d.get("aliases") if isinstance(d.get("aliases"), list) else ()
    _refuse_clash(kind, name, aliases, override)
    return _validated_write(user_dir, f"{kind}/{name}.yaml", data, filename)


def add_model(
    name: str, filename: str, data: bytes, source: str, user_dir: Path | None = None, override: bool = False
) -> Path:
    """An uploaded Hugging Face config.json as model ``name`` (a folder with config.json + epdsim.yaml)."""
    user_dir = user_dir or user_hwdb_dir()
    _safe_name(name, "model")
    _refuse_clash("models", name, (), override)
    filename = safe_name(filename)
    check_size(filename, data, 1 * 2**20)
    try:
        cfg = parse_json(decode(data, filename, InputError, "config.json"), filename, InputError, "config.json")
    except InputError as exc:
        raise InputError(f"{exc}; upload the model's config.json") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{filename}: expected a JSON object (a Hugging Face config.json)")
    if not source or not source.strip():
        raise InputError("source: say where the config.json comes from (e.g. the Hugging Face repository)")
    with tempfile.TemporaryDirectory() as tmp:
        trial = Path(tmp) / "hw"
        if user_dir.is_dir():
            shutil.copytree(user_dir, trial)
        m = trial / "models" / name
        m.mkdir(parents=True, exist_ok=True)
        (m / "config.json").write_bytes(data)
        (m / "epdsim.yaml").write_text(yaml.safe_dump({"name": name, "source": source.strip()}))
        try:
            hwdb.load([trial]).model(name)
        except hwdb.HwdbError as exc:
            raise InputError(str(exc).replace(str(trial), str(user_dir))) from None
    out = user_dir / "models" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes(data)
    (out / "epdsim.yaml").write_text(yaml.safe_dump({"name": name, "source": source.strip()}))
    return out
