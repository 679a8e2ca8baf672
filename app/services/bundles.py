"""Calibration bundles and fitted profiles that come and go through the browser (no Streamlit).

* :func:`extract_zip`: a bundle uploaded as a .zip, unpacked into the session's private upload folder
  with the limits of every upload (no absolute or ``..`` names, no links, bounded size and count);
* :func:`fitted_files`, :func:`zip_files`: the hwdb folder a fit wrote, as files to download;
* :func:`save_to_user_hwdb`: those files into the user's hardware folder, where every page and
  scenario finds them, refused when a name would shadow a shipped entry;
* :func:`replay_scenario`: a scenario for the Home page that runs the fitted profile on the bundle's
  load test (its rate and mean lengths), so the fit can be used at once.
"""
from __future__ import annotations

import io
import json
import shutil
import stat
import zipfile
from pathlib import Path

from app.services.scenarios import MAX_UPLOAD_BYTES, InputError, check_size, safe_name
from simulator.inputs import decode, parse_yaml, read_text, read_yaml
import hwdb

MAX_UNPACKED_BYTES = 200 * 2**20
MAX_ENTRIES = 5000
HWDB_KINDS = ("profiles", "engines", "gpus", "models", "fits")


def extract_zip(name: str, data: bytes, folder: Path) -> Path:
    """Unpack an uploaded bundle zip into ``folder``/bundle-NAME; returns the folder holding its
    manifest.json (the top of the archive or one folder down).  InputError names the entry at fault."""
    name = safe_name(name)
    check_size(name, data, MAX_UPLOAD_BYTES)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InputError(f"{name}: not a zip archive ({exc}); zip the folder `epdsim calibrate run --out DIR` "
                         f"wrote (e.g. `cd DIR/.. && zip -r bundle.zip DIR`)") from None
    if len(infos) > MAX_ENTRIES:
        raise InputError(f"{name}: {len(infos):,} entries, over the {MAX_ENTRIES:,} a bundle has; zip only the bundle")
    if sum(i.file_size for i in infos) > MAX_UNPACKED_BYTES:
        raise InputError(f"{name}: unpacks to over {MAX_UNPACKED_BYTES // 2**20} MiB; a bundle is a few MB")
    dest = Path(folder) / f"bundle-{Path(name).stem}"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for info in infos:
        parts = info.filename.replace("\\", "/").split("/")
        kind = stat.S_IFMT(info.external_attr >> 16)
        if info.filename.startswith("/") or ".." in parts or "\x00" in info.filename or ":" in parts[0]:
            raise InputError(f"{name}: entry {info.filename!r} points outside the archive; zip the bundle folder only")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise InputError(f"{name}: entry {info.filename!r} is a link or special file; zip plain files only")
        target = dest.joinpath(*[p for p in parts if p])
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    tops = [p.parent for p in dest.rglob("manifest.json") if len(p.relative_to(dest).parts) <= 2]
    if len(tops) != 1:
        raise InputError(f"{name}: {'no' if not tops else 'more than one'} manifest.json at the top of the archive "
                         f"or one folder down; zip one bundle folder (it holds manifest.json and records/)")
    return tops[0]


def fitted_files(hw: Path) -> dict[str, bytes]:
    """The files of the hwdb folder a fit wrote (profile, engine, model, derived GPU, fit report), by
    path relative to it."""
    hw = Path(hw)
    return {str(p.relative_to(hw)): p.read_bytes() for kind in HWDB_KINDS for p in sorted((hw / kind).rglob("*"))
            if p.is_file()}


def zip_files(files: dict[str, bytes], top: str = "hwdb") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in sorted(files.items()):
            zf.writestr(f"{top}/{rel}", data)
    return buf.getvalue()


def _names(files: dict[str, bytes]) -> dict[tuple[str, str], str]:
    """(kind, entry name) -> file of the fitted entries (models by their folder)."""
    out = {}
    for rel in files:
        parts = Path(rel).parts
        if parts[0] == "models":
            out["models", parts[1]] = rel
        elif parts[0] in ("profiles", "engines", "gpus") and rel.endswith(".yaml"):
            out[parts[0], str((parse_yaml(decode(files[rel], rel, InputError), rel, InputError) or {}).get("name", Path(rel).stem))] = rel
    return out


def save_to_user_hwdb(files: dict[str, bytes], udir: Path) -> list[str]:
    """Write a fit's hwdb files into the user's hardware folder ``udir``; returns the paths written.

    Refused (InputError) when an entry has the name of a shipped one (it would replace it for every
    scenario) or when the folder would not load afterwards (the files are removed again)."""
    shipped = hwdb.load()                       # the shipped data alone
    tables = {"profiles": shipped.profiles, "engines": shipped.engines, "gpus": shipped.gpus,
              "models": shipped.models}
    for (kind, n), rel in _names(files).items():
        if n in tables[kind]:
            raise InputError(f"{rel}: {kind[:-1]} '{n}' is a shipped entry; saving it would replace the shipped one "
                             f"for every scenario. Fit under another served model name, or add it on the Hardware "
                             f"page with 'replace the shipped entry' ticked")
    udir = Path(udir)
    written = []
    try:
        for rel, data in files.items():
            p = udir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            written.append(str(p))
        hwdb.load([udir])
    except hwdb.HwdbError as exc:
        for p in written:
            Path(p).unlink(missing_ok=True)
        raise InputError(f"the fitted files do not load together with your hardware folder {udir}: {exc}") from None
    return written


def replay_scenario(validation_dir: Path, model: str, requests: int = 300) -> dict:
    """A Home-page scenario running the fitted profile on the bundle's first load test: its pool and
    engine settings as validated, Poisson arrivals at the test's rate, lognormal lengths with its means.
    ``model``: the served model name (saved in the user's hardware folder with the profile)."""
    vdir = Path(validation_dir)
    scns = sorted(vdir.glob("*.scenario.yaml"))
    if not scns:
        raise InputError("the bundle has no load test to replay; add one to its plan (epdsim calibrate run)")
    d = read_yaml(scns[0], InputError)
    path = Path(d["workload"]["arrival"]["path"])
    rows = [json.loads(line) for line in read_text(path, InputError, "trace").splitlines() if line.strip()]
    t = sorted(float(r["arrival_s"]) for r in rows)
    rate = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else 1.0
    mean = lambda k: sum(float(r[k]) for r in rows) / len(rows)  # noqa: E731
    wl = {"arrival": {"kind": "poisson", "rate": round(rate, 3)},
          "input_length": {"kind": "lognormal", "mean": round(mean("input_tokens"), 1), "cv": 0.5, "low": 1,
                           "high": int(max(float(r["input_tokens"]) for r in rows) * 4)},
          "output_length": {"kind": "lognormal", "mean": round(mean("output_tokens"), 1), "cv": 0.5, "low": 1,
                            "high": int(max(float(r["output_tokens"]) for r in rows) * 4)},
          "num_requests": int(requests)}
    return {"name": f"{model}-fitted", "description": f"{model} on its fitted profile, the bundle's load test "
            f"as Poisson {rate:.3g} req/s", "seed": 0, "model": model, "pools": d["pools"], "workload": wl}
