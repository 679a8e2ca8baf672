"""Issue 33 in a real browser: a hostile calibration bundle uploaded on the Calibration page and fitted makes
the app open no file outside its upload folder, answers with the field, the value and the fix, and shows no
traceback.  The app runs as `epdsim app` with an audit hook on ``open`` installed in every Python process it
starts (a ``sitecustomize`` on PYTHONPATH), which logs each open of the planted secret."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from app.services import calibration
from tests.browser import (
    alerts,
    assert_no_traceback,
    click,
    driver_fixture,  # noqa: F401 - a pytest fixture: pytest finds it in this module as `driver`
    needs_chromium,
    running_app,
    send_file,
    wait,
)
from tests.browser import pytestmark as _selenium

pytestmark = [_selenium, needs_chromium]

HOOK = """
import os, sys
_LOG, _WATCH = os.environ.get("EPDSIM_AUDIT_LOG"), os.environ.get("EPDSIM_AUDIT_WATCH")
def _hook(event, args):
    if event == "open" and _LOG and _WATCH and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path.startswith(_WATCH):
            with open(_LOG, "a") as f:      # the watched folder holds no log: this open is not watched
                f.write(path + "\\n")
if _LOG:
    sys.addaudithook(_hook)
"""


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """(app URL, secret file, audit log): the app under the hook, a secret outside everything it may read."""
    base = tmp_path_factory.mktemp("hostile")
    watch, hook = base / "outside", base / "hook"
    watch.mkdir()
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    secret = watch / "secret.txt"
    secret.write_text("root:x:0:0 the secret line\n")
    log_path = base / "audit.log"
    env = {
        **os.environ,
        "EPDSIM_HWDB": str(base / "user-hwdb"),
        "HOME": str(base),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
        "EPDSIM_AUDIT_LOG": str(log_path),
        "EPDSIM_AUDIT_WATCH": str(watch),
    }
    # The hook sees what a process started this way opens (else the test below could not fail).
    subprocess.run([sys.executable, "-c", f"open({str(secret)!r}).read()"], env=env, check=True)
    assert log_path.read_text().split() == [str(secret)]
    with running_app(env, base / "app.log") as url:
        yield url, secret, log_path


def _zip(tmp_path, secret, case: str):
    """The shipped sample bundle, zipped, its manifest pointing at ``secret`` as ``case`` says."""
    m = json.loads((calibration.SAMPLE_BUNDLE / "manifest.json").read_text())
    if case != "root":  # without it the fit reads the server logs (to tell a CPU server), where the trap is
        m["versions"].pop("server_python", None)
    if case == "dotdot":
        field, value = "launches[0].log", "../" * 12 + str(secret).lstrip("/")
        m["launches"] = [{"log": value}]
    elif case == "absolute":
        field, value = "attachments[0].server_log", str(secret)
        m["attachments"] = [{"url": "http://127.0.0.1:9", "server_log": value}]
    else:
        field, value = "model.root", str(secret.parent)
        m["model"]["root"] = value
        m["model"].pop("config", None)
    path = tmp_path / f"{case}.zip"
    with zipfile.ZipFile(path, "w") as z:
        for f in sorted(calibration.SAMPLE_BUNDLE.rglob("*")):
            if f.is_file() and f.name != "manifest.json":
                z.write(f, f"bundle/{f.relative_to(calibration.SAMPLE_BUNDLE)}")
        z.writestr("bundle/manifest.json", json.dumps(m))
    return path, field, value


@pytest.mark.parametrize("case", ["dotdot", "absolute", "root"])
def test_a_hostile_uploaded_bundle_opens_nothing_outside(audited, driver, tmp_path, case):
    from selenium.webdriver.common.by import By

    url, secret, log_path = audited
    path, field, value = _zip(tmp_path, secret, case)
    before = log_path.read_text() if log_path.exists() else ""
    driver.get(url + "Calibration")
    wait(driver).until(
        lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, "label") if e.text.strip() == "upload a bundle (.zip)"]
    )
    next(
        e for e in driver.find_elements(By.CSS_SELECTOR, "label") if e.text.strip() == "upload a bundle (.zip)"
    ).click()
    send_file(driver, 0, path, where="")
    # The overview reads the manifest (model.root is refused there); the others are refused by the fit.
    wait(driver, 120).until(
        lambda d: (
            field in alerts(d)
            or any(b.text.strip() == "Fit and validate" for b in d.find_elements(By.CSS_SELECTOR, "button"))
        )
    )
    if field not in alerts(driver):
        click(driver, "Fit and validate")
        wait(driver, 240).until(lambda d: field in alerts(d))
    text = " ".join(alerts(driver).split())
    assert field in text and "outside the bundle folder" in text, text
    assert "secret line" not in text and "root:x" not in text
    assert_no_traceback(driver)
    after = log_path.read_text() if log_path.exists() else ""
    assert after == before, f"the app opened files outside its upload folder: {after[len(before) :]}"
