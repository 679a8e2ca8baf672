"""Helpers for the browser tests: `epdsim app` on a free localhost port and Debian's headless Chromium
driven by Selenium (no browser is ever downloaded; CI installs `chromium` and `chromium-driver`).

Import the fixtures into a test module (``from tests.browser import app_server_fixture, driver_fixture``: pytest
finds them there by their names, ``app_server`` and ``driver``) and mark it with :data:`pytestmark`, which skips
with the reason when Chromium or its driver is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401 - only whether it imports

    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False

pytestmark = pytest.mark.skipif(not HAVE_SELENIUM, reason="selenium is not installed (pip install -e '.[test]')")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="no chromium/chromedriver here (apt-get install chromium chromium-driver; .ci/run installs them)",
)

FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1400",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"epdsim app exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 'ok' within {timeout_s:.0f} s")


@contextlib.contextmanager
def running_app(env: dict, log_path):
    """`epdsim app` on a free localhost port with ``env``, its output in ``log_path``; yields its URL and
    stops it (and everything it started) on exit."""
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "app", "--port", str(port), "--headless"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_health(f"http://localhost:{port}/_stcore/health", proc)
        yield f"http://localhost:{port}/"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module", name="app_server")
def app_server_fixture(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("app")
    env = {**os.environ, "EPDSIM_HWDB": str(tmp_path / "user-hwdb"), "HOME": str(tmp_path)}
    with running_app(env, tmp_path / "app.log") as url:
        yield url


@pytest.fixture(name="driver")
def driver_fixture(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS + [f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        opts.add_argument(f)
    drv = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def body_text(drv) -> str:
    from selenium.webdriver.common.by import By

    return drv.find_element(By.TAG_NAME, "body").text


def alerts(drv) -> str:
    from selenium.webdriver.common.by import By

    return " ".join(e.text for e in drv.find_elements(By.CSS_SELECTOR, "[data-testid='stAlert']"))


def assert_no_traceback(drv) -> None:
    """No Streamlit exception box and no Python traceback anywhere on the page."""
    from selenium.webdriver.common.by import By

    assert not drv.find_elements(By.CSS_SELECTOR, "[data-testid='stException']"), body_text(drv)[:2000]
    assert "Traceback" not in body_text(drv)


def wait(drv, seconds: float = 180):
    """A WebDriverWait that retries through stale elements (a Streamlit rerun redraws what it reads) and,
    when it gives up, fails with what the page showed then (the only clue a CI log keeps)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    class Explained(WebDriverWait):
        def until(self, method, message: str = ""):
            try:
                return super().until(method, message)
            except TimeoutException:
                raise AssertionError(
                    f"not seen within {seconds:.0f} s; the page showed:\n{settled(body_text)(drv)[:4000]}"
                ) from None

    return Explained(drv, seconds, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,))


def idle(drv) -> bool:
    """True when Streamlit shows no script run in progress."""
    from selenium.webdriver.common.by import By

    return not drv.find_elements(By.CSS_SELECTOR, "[data-testid^='stStatusWidgetRunning']")


def send_file(drv, index: int, path, where: str = "[data-testid='stSidebar'] ") -> None:
    """Give ``path`` to the ``index``-th file input under ``where`` once the script run is over: a file
    sent while a rerun rebuilds the sidebar can land in an uploader that the rerun then replaces.

    The uploader lists the file at once, with "<type> files are not allowed" where its browser-side type
    check refused it; Chromium has refused an allowed .yaml so (1 of 2,110 tests in a full run, not
    reproduced alone), so a refused file is sent again, at most three times."""
    from selenium.webdriver.common.by import By

    name = os.path.basename(str(path))

    def refused(d) -> int:
        return settled(body_text)(d).count("files are not allowed")

    for _ in range(3):
        wait(drv, 120).until(idle)
        before = refused(drv)
        inputs = wait(drv, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, where + "input[type='file']"))
        inputs[index].send_keys(str(path))
        wait(drv, 60).until(lambda d: name in settled(body_text)(d))
        if refused(drv) <= before:
            return
    raise AssertionError(f"the uploader refused {name} three times:\n{settled(body_text)(drv)[:2000]}")


def settled(read):
    """``read`` retried while Streamlit replaces the elements it reads (a rerun redraws them)."""

    def wrapped(drv):
        from selenium.common.exceptions import StaleElementReferenceException

        for _ in range(20):
            try:
                return read(drv)
            except StaleElementReferenceException:
                continue
        return read(drv)

    return wrapped


def click(drv, text: str) -> None:
    """Click the button labelled ``text`` once it is there, again if a rerun replaced it meanwhile."""
    from selenium.webdriver.common.by import By

    def press(d) -> bool:
        buttons = [b for b in d.find_elements(By.CSS_SELECTOR, "button") if b.text.strip() == text]
        if buttons and buttons[0].is_enabled():
            buttons[0].click()
            return True
        return False

    wait(drv, 60).until(press)


def metrics(drv) -> dict[str, str]:
    """The page's metric cards, label -> shown value (retried while a rerun redraws them)."""
    from selenium.webdriver.common.by import By

    def read(d) -> dict[str, str]:
        out = {}
        for m in d.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']"):
            label = m.find_elements(By.CSS_SELECTOR, "[data-testid='stMetricLabel']")
            value = m.find_elements(By.CSS_SELECTOR, "[data-testid='stMetricValue']")
            if label and value:
                out[label[0].text.strip()] = value[0].text.strip()
        return out

    return settled(read)(drv)
