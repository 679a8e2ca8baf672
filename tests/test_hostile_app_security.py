"""Issue 33, security of the app, held from the outside: what the services open while they handle hostile
input, and the cases tests/test_hostile_input_security.py does not reach.

* One audit hook on ``open`` records every path the process opens while the app's services get a hostile
  bundle ("Fit and validate"), hostile hardware-file keys (``save_to_user_hwdb``) and hostile scenario
  dicts (``scenarios.run``); every path must lie, by prefix after links, in the session's upload folder,
  the user's hardware folder, the shipped hardware data or the Python install and the project's packages.
  A legitimate upload read in the same window shows that the hook sees the service's reads.
* A FIFO where a bundle names a file (a server log, a model's config.json) gives an error at once (the
  call runs in a thread with a join bound; no sleep).
* A model folder inside the bundle whose config.json is a link inside the bundle is read (followed, not
  refused as a link); a hardware-file key of a field that is not an entry table (``notes``) is refused.
* Bundle roots: a folder named in EPDSIM_BUNDLE_ROOTS is readable, anything else is refused with a message
  that lists none of the server's folders.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

import app
import calibration as calibration_pkg
import hwdb
import simulator
from app.services import bundles, calibration, scenarios
from calibration import cli
from calibration.fit.inputs import bundle_model, open_bundle
from tests.conftest import REPO, run_within

SECRET = "device_config=cpu root:x:0:0 the secret line"
_SEEN: list[str] = []


def _hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _SEEN.append(os.fsdecode(args[0]))


sys.addaudithook(_hook)  # cannot be removed: installed once when the module loads, each test clears _SEEN


def _python_and_project() -> tuple[Path, ...]:
    """Where the interpreter, its libraries and the project's own packages (and shipped hwdb data) live:
    reads from there (lazy imports, the shipped hardware) are legitimate."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    paths |= {str(Path(m.__file__).parent) for m in (app, calibration_pkg, hwdb, simulator)}
    return tuple(Path(os.path.realpath(p)) for p in paths) + (hwdb.db.DATA_DIR.resolve(),)


def _outside(opened: list[str], *roots: Path) -> list[str]:
    allowed = (*(Path(os.path.realpath(r)) for r in roots), *_python_and_project())
    return sorted({p for p in opened if not any(Path(os.path.realpath(p)).is_relative_to(r) for r in allowed)})


def _hostile_bundle(folder: Path, name: str, edit, logs: bool = True) -> Path:
    """The shipped sample copied into ``folder``, its manifest changed by ``edit(manifest, bundle)``.
    ``logs``: without ``versions.server_python``, so that the fit reads the server logs to tell a CPU
    server (else it never gets to them); kept for a model.root case, so that the fit reaches the model."""
    b = folder / name
    shutil.copytree(calibration.SAMPLE_BUNDLE, b)
    m = json.loads((b / "manifest.json").read_text())
    if logs:
        del m["versions"]["server_python"]
    edit(m, b)
    (b / "manifest.json").write_text(json.dumps(m))
    return b


@pytest.fixture
def site(tmp_path, monkeypatch):
    """(upload folder, user hardware folder, secret file outside both, beside a model's config.json);
    EPDSIM_HWDB names that user folder."""
    uploads, udir = tmp_path / "uploads", tmp_path / "user-hwdb"
    uploads.mkdir()
    monkeypatch.setenv("EPDSIM_HWDB", str(udir))
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    kept = json.loads((calibration.SAMPLE_BUNDLE / "manifest.json").read_text())["model"]["config"]
    (secret.parent / "config.json").write_text(json.dumps(kept))  # a usable model, were it read
    return uploads, udir, secret


# ============================================================================ one audit over every service
def test_services_open_nothing_outside_the_upload_folder(site):
    uploads, udir, secret = site
    outside = secret.parent
    trace = uploads / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{i * 0.1},200,20\n" for i in range(20)))
    base = scenarios.default_scenario()

    def log(value):
        return lambda m, b: m.update(launches=[{"log": value}])

    def link(m, b):
        (b / "server-1.log").symlink_to(secret)
        m["launches"] = [{"log": "server-1.log"}]

    def root(m, b):
        m["model"].update(root=str(outside), config_sha256=None)
        del m["model"]["config"]

    bundle_cases = {
        "launches[0].log": log(os.path.relpath(secret, uploads / "b1")),
        "link": link,
        "model.root": root,
        "attachments[0].server_log": lambda m, b: m.update(
            attachments=[{"url": "http://127.0.0.1:9", "server_log": str(secret)}]
        ),
    }
    bundle_dirs = {
        k: _hostile_bundle(uploads, f"b{i}", edit, logs=k != "model.root")
        for i, (k, edit) in enumerate(bundle_cases.items(), 1)
    }
    key_cases = ["profiles/../../outside/x.yaml", f"{outside}/x.yaml", "links/ib-ndr.yaml"]
    scenario_cases = {
        "workload.arrival.path": {**base, "workload": scenarios.trace_workload(secret, None, 5)},
        "hwdb[0]": {**base, "hwdb": [str(outside)]},
        "model": {**base, "model": str(outside)},
    }
    _SEEN.clear()
    errors = {}
    for field, b in bundle_dirs.items():
        errors[field] = run_within(lambda b=b: calibration.fit_and_validate(str(b), uploads / "out")).get("error")
    for key in key_cases:
        errors[key] = run_within(lambda key=key: bundles.save_to_user_hwdb({key: b"name: x\n"}, udir)).get("error")
    for field, d in scenario_cases.items():
        errors[field] = run_within(lambda d=d: scenarios.run(d, folder=uploads)).get("error")
    res = run_within(
        lambda: scenarios.run({**base, "workload": scenarios.trace_workload(trace, None, 20)}, folder=uploads), 120
    )
    opened = list(_SEEN)
    assert res.get("value") is not None and res["value"].summary["throughput_rps"] > 0, res
    assert os.path.realpath(trace) in {os.path.realpath(p) for p in opened}  # the hook sees the service's reads
    assert _outside(opened, uploads, udir) == []
    assert os.path.realpath(secret) not in {os.path.realpath(p) for p in opened}
    for what, exc in errors.items():
        assert isinstance(exc, scenarios.InputError), (what, exc)
        assert "secret line" not in str(exc) and "root:x" not in str(exc)
    assert sorted(p.name for p in outside.iterdir()) == ["config.json", "secret.txt"]  # nothing written there


# ============================================================================ FIFOs named by a bundle
def _fifo_log(m, b):
    os.mkfifo(b / "srv.log")
    m["attachments"] = [{"url": "http://127.0.0.1:9", "server_log": "srv.log"}]


def _fifo_config(m, b):
    (b / "model").mkdir()
    os.mkfifo(b / "model" / "config.json")
    m["model"].update(root="model", config_sha256=None)
    del m["model"]["config"]


@pytest.mark.parametrize(
    "edit, field, value, fix",
    [
        (_fifo_log, "attachments[0].server_log", "srv.log", "Copy the server log into the bundle folder"),
        (_fifo_config, "model.root (its config.json)", "model/config.json", "Pass --model with the model's folder"),
    ],
)
def test_a_fifo_the_bundle_names_is_refused_at_once(tmp_path, capsys, edit, field, value, fix):
    """Fit and validate in the app, and `epdsim calibrate fit`, answer with the field, the value and the
    fix instead of waiting for a writer on the FIFO."""
    b = _hostile_bundle(tmp_path, "bundle", edit, logs=edit is _fifo_log)
    out = run_within(lambda: calibration.fit_and_validate(str(b), tmp_path / "out"))
    msg = str(out.get("error"))
    assert isinstance(out.get("error"), scenarios.InputError), out
    assert f"{field} = {value!r} is not a regular file" in msg and "a fit reads only the bundle's own files" in msg
    assert fix in msg
    rc = run_within(lambda: cli.main(["fit", str(b), "--out", str(tmp_path / "hw")]))
    err = " ".join(capsys.readouterr().err.split())
    assert rc.get("value") == 2 and f"{field} = {value!r} is not a regular file" in err, (rc, err)
    assert "Traceback" not in err and not (tmp_path / "hw").exists()


# ============================================================================ model.root inside the bundle
def test_a_model_config_linked_inside_the_bundle_is_read(tmp_path):
    """model/config.json -> shared/config.json, both in the bundle: followed (the link stays inside), and
    the folder's model is the one fitted."""

    def edit(m, b):
        (b / "shared").mkdir()
        (b / "shared" / "config.json").write_text(json.dumps(m["model"].pop("config")))
        (b / "model").mkdir()
        (b / "model" / "config.json").symlink_to(b / "shared" / "config.json")
        m["model"].update(root="model", config_sha256=None)

    b = _hostile_bundle(tmp_path, "bundle", edit, logs=False)
    kept = json.loads((b / "shared" / "config.json").read_text())
    entry = bundle_model(open_bundle(b), None, hwdb.load())
    assert entry.config == kept and entry.name == "tiny-llama"


# ============================================================================ hardware-file keys
def test_hwdb_kinds_are_the_entry_tables_and_notes_is_refused(tmp_path):
    kinds = bundles.hwdb_kinds()
    assert {"gpus", "links", "models", "profiles", "engines"} <= set(kinds)
    assert all(isinstance(getattr(hwdb.load(), k), dict) for k in kinds) and "notes" not in kinds
    with pytest.raises(scenarios.InputError) as err:
        bundles.save_to_user_hwdb({"notes/x.yaml": b"name: x\n"}, tmp_path / "u")
    assert "hardware file 'notes/x.yaml': not a file of a hardware folder" in str(err.value)
    assert "Save the files a fit wrote" in str(err.value) and not (tmp_path / "u").exists()


def test_a_fitted_profile_under_a_new_name_is_saved(tmp_path):
    """The refusals leave the legitimate path: a fit's own files go into the user's folder and load."""
    res = calibration.fit_and_validate(str(calibration.SAMPLE_BUNDLE), tmp_path / "out")
    udir = tmp_path / "u"
    written = bundles.save_to_user_hwdb(res["files"], udir)
    assert sorted(written) == sorted(str(udir / k) for k in res["files"]) and written
    assert res["profile"] in hwdb.load([udir]).profiles


# ============================================================================ bundle roots
def test_configured_bundle_roots_and_a_refusal_without_server_paths(tmp_path, monkeypatch):
    configured, other, uploads = tmp_path / "configured", tmp_path / "elsewhere", tmp_path / "uploads"
    for d in (configured, other, uploads):
        shutil.copytree(calibration.SAMPLE_BUNDLE, d / "bundle")
    monkeypatch.setenv(calibration.BUNDLE_ROOTS_ENV, str(configured))
    monkeypatch.chdir(other)  # the start folder is not a root
    assert calibration.overview(str(configured / "bundle"))["model"] == "tiny-llama"
    assert calibration.overview(str(uploads / "bundle"), extra_roots=(uploads,))["model"] == "tiny-llama"
    for value in (str(other / "bundle"), "bundle", str(uploads / "bundle")):
        with pytest.raises(scenarios.InputError) as err:
            calibration.overview(value)
        msg = str(err.value)
        assert f"bundle folder '{value}' is outside the folders this app reads bundles from" in msg
        assert "upload the bundle as a .zip" in msg and calibration.BUNDLE_ROOTS_ENV in msg
        for server_path in (configured, REPO, calibration.SAMPLE_BUNDLE, Path.home()):
            assert str(server_path) not in msg.replace(value, "")


# ============================================================================ scenarios.run by itself
@pytest.mark.parametrize("field", ["workload.arrival.path", "workload.input_length.path", "hwdb[0]", "model"])
def test_run_refuses_a_server_file_by_itself(tmp_path, field):
    """run() with no upload folder, as a page that forgot to sandbox would call it: every field that
    names a file is checked, and nothing of the file shows in the message."""
    d = scenarios.default_scenario()
    if field == "workload.arrival.path":
        d["workload"] = {"arrival": {"kind": "trace", "path": "/etc/passwd", "format": "plain"}, "num_requests": 5}
    elif field == "workload.input_length.path":
        d["workload"] = {
            **d["workload"],
            "input_length": {"kind": "empirical", "path": "/etc/passwd", "column": "root"},
        }
    elif field == "hwdb[0]":
        d["hwdb"] = ["/etc"]
    else:
        d["model"] = "/etc"
    value = "/etc" if field in ("hwdb[0]", "model") else "/etc/passwd"
    _SEEN.clear()
    with pytest.raises(scenarios.InputError) as err:
        scenarios.run(d)
    assert f"{field} = {value!r} is outside the files uploaded in this session" in str(err.value)
    assert "upload the file too" in str(err.value) and "root:" not in str(err.value)
    assert not [p for p in _SEEN if os.path.realpath(p).startswith("/etc/")]
