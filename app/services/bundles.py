"""Calibration bundles and fitted profiles that come and go through the browser (no Streamlit).

* :func:`extract_zip`: a bundle uploaded as a .zip, unpacked into the session's private upload folder
  with the limits of every upload (no absolute or ``..`` names, no links, bounded size and count);
* :func:`fitted_files`, :func:`zip_files`: the hwdb folder a fit wrote, as files to download;
* :func:`save_to_user_hwdb`: those files into the user's hardware folder, where every page and
  scenario finds them; a key that is not a hardware file name inside that folder, or a name that would
  shadow a shipped entry of any kind, is refused;
* :func:`replay_scenario`: a scenario for the Home page that runs the fitted profile on the bundle's
  load test (its rate and mean lengths), so the fit can be used at once.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import hwdb
from app.services.scenarios import MAX_UPLOAD_BYTES, InputError, check_size, safe_name
from simulator.inputs import decode, parse_yaml, read_text, read_yaml

MAX_UNPACKED_BYTES = 200 * 2**20
MAX_ENTRIES = 5000
FIT_REPORTS = "fits"  # a hardware folder's fit reports (JSON), beside the entries they made
HWDB_KINDS = ("profiles", "engines", "gpus", "models", FIT_REPORTS)


def extract_zip(name: str, data: bytes, folder: Path) -> Path:
    """Unpack an uploaded bundle zip into ``folder``/bundle-NAME; returns the folder holding its
    manifest.json (the top of the archive or one folder down).  InputError names the entry at fault."""
    name = safe_name(name)
    check_size(name, data, MAX_UPLOAD_BYTES)
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InputError(
            f"{name}: not a zip archive ({exc}); zip the folder `epdsim calibrate run --out DIR` "
            f"wrote (e.g. `cd DIR/.. && zip -r bundle.zip DIR`)"
        ) from None
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
        raise InputError(
            f"{name}: {'no' if not tops else 'more than one'} manifest.json at the top of the archive "
            f"or one folder down; zip one bundle folder (it holds manifest.json and records/)"
        )
    return tops[0]


def fitted_files(hw: Path) -> dict[str, bytes]:
    """The files of the hwdb folder a fit wrote (profile, engine, model, derived GPU, fit report), by
    path relative to it."""
    hw = Path(hw)
    return {
        str(p.relative_to(hw)): p.read_bytes()
        for kind in HWDB_KINDS
        for p in sorted((hw / kind).rglob("*"))
        if p.is_file()
    }


def zip_files(files: dict[str, bytes], top: str = "hwdb") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in sorted(files.items()):
            zf.writestr(f"{top}/{rel}", data)
    return buf.getvalue()


def hwdb_kinds() -> tuple[str, ...]:
    """The kinds of entry a hardware folder holds (gpus, links, models, profiles, engines, ...): the
    tables (name -> entry) of :class:`hwdb.HardwareDB`, so a kind added there is covered here; its other
    fields (``notes``) are no folder."""
    empty = hwdb.HardwareDB()
    return tuple(f.name for f in dataclasses.fields(empty) if isinstance(getattr(empty, f.name), dict))


def _plain(name: str) -> bool:
    """A file or folder name that stays where it is put: no separator, no ``..``, no hidden or control
    characters, at most 255 bytes."""
    return (
        bool(name)
        and not name.startswith(".")
        and ".." not in name
        and "\\" not in name
        and all(c.isprintable() for c in name)
        and len(name.encode("utf-8", "surrogatepass")) <= 255
    )


def _entry(rel: str, files: dict[str, bytes]) -> tuple[str, str | None, tuple]:
    """(kind, entry name, aliases) of hardware file key ``rel``; InputError unless it is
    ``<kind>/<name>.yaml``, ``models/<name>/config.json`` or ``epdsim.yaml``, or ``fits/<name>.json``
    (a fit report: no entry, name None).  Models are named by their sidecar, else their folder."""
    kinds = hwdb_kinds()
    parts = rel.split("/") if isinstance(rel, str) else []
    flat = [k for k in kinds if k != "models"]
    ok = (
        len(parts) == 2
        and parts[0] in (*flat, FIT_REPORTS)
        and parts[1].endswith(".json" if parts[0] == FIT_REPORTS else ".yaml")
    ) or (len(parts) == 3 and parts[0] == "models" and parts[2] in ("config.json", "epdsim.yaml"))
    if not ok or not all(_plain(x) for x in parts[1:]):
        raise InputError(
            f"hardware file {rel!r}: not a file of a hardware folder; each is <kind>/<name>.yaml "
            f"(kind one of {', '.join(flat)}), models/<name>/config.json or epdsim.yaml, or "
            f"{FIT_REPORTS}/<name>.json, with a plain name (no '..', no '/' or '\\', not absolute). "
            f"Save the files a fit wrote, as they are listed"
        )
    kind = parts[0]
    if kind == FIT_REPORTS:
        return kind, None, ()
    doc_rel = rel if kind != "models" else f"models/{parts[1]}/epdsim.yaml"
    doc: dict = {}
    if doc_rel in files:
        doc = parse_yaml(decode(files[doc_rel], doc_rel, InputError), doc_rel, InputError) or {}
    doc = doc if isinstance(doc, dict) else {}
    name = doc.get("name") or (parts[1] if kind == "models" else parts[1][: -len(".yaml")])
    listed = doc.get("aliases")
    aliases = listed if isinstance(listed, list) else ()
    return kind, str(name), tuple(a for a in aliases if isinstance(a, str))


def _target(rel: str, udir: Path) -> Path:
    """Where key ``rel`` is written: inside ``udir`` after links, and not a FIFO or device (a write
    would block); InputError otherwise."""
    root = udir.resolve()
    real = (udir / rel).resolve()
    if not real.is_relative_to(root):
        raise InputError(
            f"hardware file {rel!r} would be written outside your hardware folder (a link in it "
            f"points elsewhere); remove the link, or set EPDSIM_HWDB to another folder"
        )
    try:
        mode = os.lstat(real).st_mode
    except FileNotFoundError:
        return real
    if not stat.S_ISREG(mode):
        raise InputError(
            f"hardware file {rel!r}: what your hardware folder holds there is not a regular file (a "
            f"folder, pipe or device); remove it and save again"
        )
    return real


def save_to_user_hwdb(files: dict[str, bytes], udir: Path, override: bool = False) -> list[str]:
    """Write a fit's hwdb files (keys as :func:`fitted_files` gives them) into the user's hardware
    folder ``udir``; returns the paths written.

    Refused (InputError naming the key) when a key is not a hardware file name (:func:`_entry`) or
    would land outside ``udir``; when an entry of any kind has the name or an alias of a shipped one
    (it would replace it for every scenario), unless ``override`` (the Hardware page's 'replace the
    shipped entry'); or when the folder would not load afterwards (the folder is then as before)."""
    udir = Path(udir)
    shipped = hwdb.load()  # the shipped data alone
    targets = {}
    for rel in files:
        kind, name, aliases = _entry(rel, files)
        if name is not None and not override:
            for n in (name, *aliases):
                try:
                    hit = hwdb.db.find(kind[:-1], getattr(shipped, kind), n, "").name
                except hwdb.HwdbError:
                    continue
                raise InputError(
                    f"{rel}: {kind[:-1]} {n!r} is the shipped entry {hit!r}; saving it would replace "
                    f"the shipped one for every scenario. Fit under another served model name, or add "
                    f"it on the Hardware page with 'replace the shipped entry' ticked"
                )
        targets[rel] = _target(rel, udir)
    before = {p: p.read_bytes() if p.is_file() else None for p in targets.values()}
    try:
        for rel, data in files.items():
            targets[rel].parent.mkdir(parents=True, exist_ok=True)
            targets[rel].write_bytes(data)
        hwdb.load([udir])
    except hwdb.HwdbError as exc:
        for p, old in before.items():  # put back what the folder held
            if old is None:
                p.unlink(missing_ok=True)
            else:
                p.write_bytes(old)
        raise InputError(f"the fitted files do not load together with your hardware folder {udir}: {exc}") from None
    return [str(udir / rel) for rel in files]


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
    mean = lambda k: sum(float(r[k]) for r in rows) / len(rows)  # noqa: E731 - a one-line local helper
    wl = {
        "arrival": {"kind": "poisson", "rate": round(rate, 3)},
        "input_length": {
            "kind": "lognormal",
            "mean": round(mean("input_tokens"), 1),
            "cv": 0.5,
            "low": 1,
            "high": int(max(float(r["input_tokens"]) for r in rows) * 4),
        },
        "output_length": {
            "kind": "lognormal",
            "mean": round(mean("output_tokens"), 1),
            "cv": 0.5,
            "low": 1,
            "high": int(max(float(r["output_tokens"]) for r in rows) * 4),
        },
        "num_requests": int(requests),
    }
    return {
        "name": f"{model}-fitted",
        "description": f"{model} on its fitted profile, the bundle's load test as Poisson {rate:.3g} req/s",
        "seed": 0,
        "model": model,
        "pools": d["pools"],
        "workload": wl,
    }
