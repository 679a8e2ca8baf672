"""The calibration profile ``calibrate validate`` replays (:func:`resolve_profile`: the one a hwdb folder
holds for the bundle's GPU, checked to be the one the simulator would pick) and that profile without its
fitted host cost (:func:`without_overhead_folder`, for ``--without-overhead``)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

import hwdb
from calibration.fit.inputs import CPU_GPU, FitInputError, is_cpu_server
from calibration.harness.bundle import Bundle
from hwdb.profiles import Profile
from simulator.inputs import read_yaml


def _user_profiles(folder: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((folder / "profiles").glob("*.yaml")):
        try:
            d = read_yaml(p, FitInputError, "calibration profile")
        except FitInputError:
            continue  # hwdb.load reports a broken profile file
        if isinstance(d, dict) and d.get("name"):
            out[d["name"]] = {"path": p, "gpu": d.get("gpu"), "created": str(d.get("created"))}
    return out


def resolve_profile(b: Bundle, profile: str | Path, gpu: str | None, hwdb_dirs=()):
    """(db, GPU, Profile, hwdb dirs, fit report or None) for validating ``b`` with ``profile``."""
    p = Path(profile)
    if not p.exists():
        raise FitInputError(
            f"--profile {p}: no such folder; give the hwdb folder `epdsim calibrate fit` wrote "
            f"(default BUNDLE/hwdb) or one of its profile YAML files."
        )
    if p.is_file():
        folder = p.parent.parent if p.parent.name == "profiles" else p.parent
        d = read_yaml(p, FitInputError, "calibration profile") if p.suffix in (".yaml", ".yml") else None
        if d is not None and not isinstance(d, dict):
            raise FitInputError(
                f"--profile {p}: expected a calibration profile (a mapping with name, gpu, ...), "
                f"got a {type(d).__name__}"
            )
        only = d.get("name") if d else None
    else:
        folder, only = p, None
    dirs = [*map(Path, hwdb_dirs), folder]
    try:
        db = hwdb.load(dirs)
    except hwdb.HwdbError as exc:
        raise FitInputError(f"--profile {p}: {exc}") from None
    mine = _user_profiles(folder)
    if only:
        mine = {only: mine[only]} if only in mine else {}
    if not mine:
        raise FitInputError(
            f"{folder} holds no calibration profile (profiles/*.yaml); make one with "
            f"`epdsim calibrate fit FIT_BUNDLE --out {folder}`."
        )
    if gpu:
        try:
            gname = db.gpu(gpu).name
        except hwdb.HwdbError as exc:
            raise FitInputError(f"--gpu: {exc}") from None
    elif is_cpu_server(b):
        gname = CPU_GPU
    elif len({v["gpu"] for v in mine.values()}) == 1:
        gname = next(iter(mine.values()))["gpu"]
    else:
        raise FitInputError(
            f"{folder} has profiles for several GPUs ({sorted({v['gpu'] for v in mine.values()})}) "
            f"and the bundle does not say which one it ran on; pass --gpu NAME."
        )
    cands = [n for n, v in mine.items() if v["gpu"] == gname]
    if not cands:
        raise FitInputError(
            f"{folder} has no profile for GPU {gname} (it has {sorted(mine)}); fit one with "
            f"`epdsim calibrate fit FIT_BUNDLE --gpu {gname} --out {folder}`."
        )
    name = max(cands, key=lambda n: mine[n]["created"])
    prof = db.profiles[name]
    winner = db.profile_for(gname, prof.engine, prof.engine_version, prof.model)
    if winner is not prof:
        used = "no profile" if winner is None else f"profile {winner.name!r}"
        raise FitInputError(
            f"the simulator would use {used} (newest for {gname} under "
            f"{prof.engine} {prof.engine_version}), not "
            f"{prof.name!r} from {p}; put the profile to validate alone in a hwdb folder "
            f"(profiles/{prof.name}.yaml) and pass that folder."
        )
    report = None
    fit_json = folder / "fits" / f"{name}.json"
    if fit_json.exists():
        report = json.loads(fit_json.read_text())
    return db, db.gpu(gname), prof, dirs, report


def without_overhead_folder(prof: Profile, folder: Path) -> Profile:
    """Write ``prof`` without its fitted host cost (``step_overhead_s`` null) as the hwdb folder ``folder``
    (``profiles/<name>.yaml``, same name, so that it overrides the fitted one when loaded after it); the
    simulator then applies the engine profile's default CPU and launch costs.  Returns that profile."""
    stripped = prof.model_copy(
        update={
            "step_overhead_s": None,
            "notes": ((prof.notes + "\n") if prof.notes else "") + "validated WITHOUT the fitted host cost "
            "(step_overhead_s null): the engine profile's default CPU and launch costs apply",
        }
    )
    (folder / "profiles").mkdir(parents=True, exist_ok=True)
    (folder / "profiles" / f"{prof.name}.yaml").write_text(
        "# The profile of the validated folder without its fitted step_overhead_s (calibrate validate "
        "--without-overhead)\n" + yaml.safe_dump(stripped.model_dump(exclude_none=True), sort_keys=False, width=100)
    )
    return stripped
