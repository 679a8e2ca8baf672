"""Issue 33, security of the app: hostile calibration bundles, hardware-file keys and scenario dicts.

A bundle's manifest may name files (``launches[].log``, ``attachments[].server_log``, ``model.root``);
"Fit and validate" must open only regular files inside the bundle folder and never block on a FIFO.
``save_to_user_hwdb`` must write only hardware files inside the user's folder and never over a shipped
entry of any kind; ``scenarios.run`` sandboxes by itself; the app's bundle roots leave out its start
folder.  Each refusal is one paragraph naming the field, the value and the fix.  The service-level
tests record every ``open`` with an audit hook and run the call in a thread with a join timeout.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

import hwdb
from app.services import bundles, calibration, scenarios
from calibration import cli
from calibration.fit.inputs import FitInputError, bundle_model, open_bundle, read_head
from tests.conftest import REPO, run_within

SECRET = "device_config=cpu root:x:0:0 the secret line"


@functools.cache
def _opened() -> list[str]:
    """Every path opened after the first call (an audit hook cannot be removed, so it is installed once
    per process; each test clears the list)."""
    seen: list[str] = []

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            seen.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)
    return seen


def _bundle(tmp_path: Path, case: str) -> tuple[Path, str, str, str]:
    """A copy of the shipped sample made hostile by ``case``; returns (bundle, field, value, why).
    Without ``versions.server_python`` the fit looks in the server logs for a CPU server."""
    b = tmp_path / "bundle"
    shutil.copytree(calibration.SAMPLE_BUNDLE, b)
    (tmp_path / "secret.txt").write_text(SECRET)
    m = json.loads((b / "manifest.json").read_text())
    if case != "root":
        del m["versions"]["server_python"]
    field, value, why = "launches[0].log", "server-1.log", "is not a regular file"
    if case == "dotdot":
        value, why = "../secret.txt", "names a file outside the bundle folder"
    elif case == "absolute":
        field, value, why = "attachments[0].server_log", "/etc/passwd", "names a file outside the bundle folder"
    elif case == "link":
        (b / value).symlink_to(tmp_path / "secret.txt")
        why = "is a link to a file outside the bundle folder"
    elif case == "fifo":
        os.mkfifo(b / value)
    elif case == "root":
        field, value, why = "model.root", "/etc", "names a file outside the bundle folder"
        m["model"]["root"] = value
        del m["model"]["config"]
    if field.startswith("attachments"):
        m["attachments"] = [{"url": "http://127.0.0.1:9", "server_log": value}]
    elif field.startswith("launches"):
        m["launches"] = [{"log": value}]
    (b / "manifest.json").write_text(json.dumps(m))
    return b, field, value, why


CASES = ("dotdot", "absolute", "link", "fifo", "root")
FIXES = {
    "launches[0].log": "'server-1.log'",
    "attachments[0].server_log": "Copy the server log into the bundle",
    "model.root": "Pass --model",
}


def _allowed(path: str, roots: tuple[Path, ...]) -> bool:
    real = Path(os.path.realpath(path))
    return real.suffix in (".py", ".pyc") or any(real.is_relative_to(r) for r in roots)


# ============================================================================ calibration bundles
@pytest.mark.parametrize("case", CASES)
def test_fit_refuses_a_manifest_file_outside_the_bundle(tmp_path, capsys, case):
    """`calibrate fit` on each hostile bundle: exit 2, one paragraph with the field, value, reason and fix."""
    b, field, value, why = _bundle(tmp_path, case)
    out = run_within(lambda: cli.main(["fit", str(b), "--out", str(tmp_path / "hw")]))
    err = " ".join(capsys.readouterr().err.split())
    assert out.get("value") == 2, (out, err)
    assert f"{field} = {value!r} {why}" in err and FIXES[field] in err and str(b / "manifest.json") in err
    assert "Traceback" not in err and "secret line" not in err and "root:x" not in err
    assert not (tmp_path / "hw").exists()


@pytest.mark.parametrize("case", CASES)
def test_fit_and_validate_opens_nothing_outside_the_bundle(tmp_path, case):
    """The app's "Fit and validate" on each hostile bundle: returns (no hang on the FIFO) with an input
    error naming the field, and no file outside the bundle, the shipped data and the Python install is
    opened (the audit hook sees every open)."""
    b, field, value, why = _bundle(tmp_path, case)
    seen = _opened()
    seen.clear()
    out = run_within(lambda: calibration.fit_and_validate(str(b), tmp_path / "out"))
    opened = list(seen)
    assert isinstance(out.get("error"), scenarios.InputError), out
    assert f"{field} = {value!r} {why}" in str(out["error"]) and "secret line" not in str(out["error"])
    roots = (
        b.resolve(),
        (tmp_path / "out").resolve(),
        hwdb.db.DATA_DIR.resolve(),
        *{Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)},
    )
    assert [p for p in opened if not _allowed(p, roots)] == []
    hostile = {os.path.realpath(tmp_path / "secret.txt"), "/etc/passwd", os.path.realpath(b / "server-1.log")}
    assert not hostile & {os.path.realpath(p) for p in opened}


def test_model_root_is_read_only_inside_the_bundle(tmp_path):
    """``model.root`` names the server's model folder on the measuring machine: outside the bundle it is
    ignored where the manifest keeps the config.json (as real bundles do), refused where it does not;
    inside, its config.json must be a regular file of the bundle too."""
    b, *_ = _bundle(tmp_path, "dotdot")
    db = hwdb.load()
    m = json.loads((b / "manifest.json").read_text())
    kept = m["model"]["config"]
    m["model"].update(root=str(tmp_path), config_sha256=None)
    (b / "manifest.json").write_text(json.dumps(m))
    (tmp_path / "config.json").write_text(json.dumps(kept))  # a readable folder outside: not read
    seen = _opened()
    seen.clear()
    entry = bundle_model(open_bundle(b), None, db)
    assert entry.config == kept and str(tmp_path / "config.json") not in seen
    (b / "model").mkdir()
    (b / "model" / "config.json").symlink_to(tmp_path / "config.json")
    m["model"]["root"] = "model"
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(
        FitInputError,
        match=r"model.root \(its config.json\) = 'model/config.json' is a link to a "
        r"file outside the bundle folder.*Pass --model",
    ):
        bundle_model(open_bundle(b), None, db)
    (b / "model" / "config.json").unlink()
    (b / "model" / "config.json").write_text(json.dumps(kept))  # a model folder inside the bundle is used
    assert bundle_model(open_bundle(b), None, db).config == kept


def test_a_log_swapped_for_a_fifo_after_the_check_does_not_block(tmp_path):
    """read_head opens without blocking: a FIFO (no writer) gives no bytes at once."""
    os.mkfifo(tmp_path / "log")
    assert run_within(lambda: read_head(tmp_path / "log", 100), 10)["value"] == b""
    (tmp_path / "real.log").write_text("device_config=cpu")
    assert read_head(tmp_path / "real.log", 100) == b"device_config=cpu"


def test_bundle_roots_leave_out_the_app_start_folder(tmp_path, monkeypatch):
    """Started in a folder, the app does not read bundles under it; the refusal lists no server paths."""
    monkeypatch.delenv(calibration.BUNDLE_ROOTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    b, *_ = _bundle(tmp_path, "root")
    assert Path.cwd().resolve() not in calibration.bundle_roots()
    with pytest.raises(scenarios.InputError) as err:
        calibration.overview(str(b))
    msg = str(err.value)
    assert "outside the folders this app reads bundles from" in msg and "upload the bundle as a .zip" in msg
    assert calibration.BUNDLE_ROOTS_ENV in msg
    assert str(REPO) not in msg and str(calibration.SAMPLE_BUNDLE) not in msg
    assert calibration.overview(str(calibration.SAMPLE_BUNDLE))["model"] == "tiny-llama"  # the sample still reads


# ============================================================================ the user's hardware folder
@pytest.mark.parametrize(
    "key",
    [
        "profiles/../../../../x.yaml",
        "/tmp/x.yaml",
        "profiles/sub/x.yaml",
        "nope/x.yaml",
        "profiles/.x.yaml",
        "profiles/x.json",
        "models/m/run.sh",
        "profiles\\..\\x.yaml",
        "profiles/a..b.yaml",
        "models/../config.json",
        "profiles/x\x1b.yaml",
    ],
)
def test_save_refuses_a_key_that_is_not_a_hardware_file(tmp_path, key):
    udir = tmp_path / "a" / "b" / "c" / "u"
    with pytest.raises(scenarios.InputError) as err:
        bundles.save_to_user_hwdb({key: b"name: x\n"}, udir)
    msg = str(err.value)
    assert f"hardware file {key!r}: not a file of a hardware folder" in msg
    assert "<kind>/<name>.yaml" in msg and "links" in msg and "no '..'" in msg
    assert not udir.exists() and not list(tmp_path.rglob("x.yaml"))


@pytest.mark.parametrize("kind", [k for k in bundles.hwdb_kinds() if k != "models"])
def test_save_refuses_to_replace_a_shipped_entry_of_any_kind(tmp_path, kind):
    table = getattr(hwdb.load(), kind)
    if not table:
        pytest.skip(f"no shipped {kind} entry yet")
    shipped = next(iter(table))
    for files in (
        {f"{kind}/{shipped}.yaml": yaml.safe_dump({"name": shipped}).encode()},
        {f"{kind}/mine.yaml": yaml.safe_dump({"name": shipped}).encode()},
    ):
        with pytest.raises(
            scenarios.InputError,
            match=f"is the shipped entry '{re.escape(shipped)}'.*'replace the shipped entry' ticked",
        ):
            bundles.save_to_user_hwdb(files, tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_save_refuses_shipped_aliases_and_models_and_honours_override(tmp_path):
    udir = tmp_path / "u"
    with pytest.raises(scenarios.InputError, match="link 'NDR' is the shipped entry 'ib-ndr'"):
        bundles.save_to_user_hwdb({"links/mine.yaml": b"name: my-ib\naliases: [NDR]\n"}, udir)
    model = next(iter(hwdb.load().models))
    with pytest.raises(scenarios.InputError, match=f"model '{model}' is the shipped entry"):
        bundles.save_to_user_hwdb({f"models/{model}/config.json": b"{}"}, udir)
    assert not udir.exists()
    ndr = (hwdb.db.DATA_DIR / "links" / "ib-ndr.yaml").read_bytes()  # told to: the override mechanism
    written = bundles.save_to_user_hwdb({"links/ib-ndr.yaml": ndr}, udir, override=True)
    assert written == [str(udir / "links" / "ib-ndr.yaml")] and (udir / "links" / "ib-ndr.yaml").read_bytes() == ndr


def test_save_stays_inside_the_user_folder_and_never_blocks(tmp_path):
    """A link inside the folder that points elsewhere, or a FIFO where a file goes, is refused."""
    udir, elsewhere = tmp_path / "u", tmp_path / "elsewhere"
    udir.mkdir()
    elsewhere.mkdir()
    (udir / "profiles").symlink_to(elsewhere)
    with pytest.raises(scenarios.InputError, match="'profiles/x.yaml' would be written outside your hardware folder"):
        bundles.save_to_user_hwdb({"profiles/x.yaml": b"name: x\n"}, udir)
    assert not list(elsewhere.iterdir())
    (udir / "profiles").unlink()
    (udir / "profiles").mkdir()
    os.mkfifo(udir / "profiles" / "x.yaml")
    out = run_within(lambda: bundles.save_to_user_hwdb({"profiles/x.yaml": b"name: x\n"}, udir), 30)
    assert isinstance(out.get("error"), scenarios.InputError) and "not a regular file" in str(out["error"])


# ============================================================================ scenarios.run
def _with_trace(path: str) -> dict:
    d = scenarios.default_scenario()
    return {**d, "workload": {"arrival": {"kind": "trace", "path": path, "format": "plain"}, "num_requests": 5}}


def test_run_sandboxes_by_itself(tmp_path):
    """run() refuses a scenario naming a server file (nothing read), and reads an upload only when told
    the session's upload folder."""
    seen = _opened()
    seen.clear()
    with pytest.raises(scenarios.InputError) as err:
        scenarios.run(_with_trace("/etc/passwd"))
    assert "workload.arrival.path = '/etc/passwd' is outside the files uploaded" in str(err.value)
    assert "upload the file too" in str(err.value) and "root:" not in str(err.value)
    assert "/etc/passwd" not in {os.path.realpath(p) for p in seen}
    folder = tmp_path / "uploads"
    folder.mkdir()
    trace = folder / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{i * 0.1},200,20\n" for i in range(20)))
    d = {**scenarios.default_scenario(), "workload": scenarios.trace_workload(trace, None, 20)}
    with pytest.raises(scenarios.InputError, match="outside the files uploaded"):
        scenarios.run(d)  # no upload folder given: not readable
    res = scenarios.run(d, folder=folder)
    assert res.summary["throughput_rps"] > 0
