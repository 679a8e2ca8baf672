"""End to end in a real browser: `epdsim app` on localhost, driven by headless Chromium (Selenium).

Uses Debian's `chromium` and `chromium-driver` packages (CI installs them in .ci/run); no browser is
ever downloaded.  The test starts the app on a free port, waits for Streamlit's health endpoint,
loads the page, waits for the default scenario's results, checks that the Plotly charts rendered
(SVG plots with drawn traces) and the headline metrics are shown, and saves a screenshot to
out/app_browser.png; then a long run shows its progress bar and Cancel stops it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
selenium = pytest.importorskip("selenium", reason="selenium is not installed (pip install -e '.[test]')")

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="no chromium/chromedriver here (apt-get install chromium chromium-driver; "
                                       ".ci/run installs them)")

FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1600,1400"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
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


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("app")
    port = _free_port()
    env = {**os.environ, "EPDSIM_HWDB": str(tmp_path / "user-hwdb"), "HOME": str(tmp_path)}
    log = open(tmp_path / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", "app", "--port", str(port), "--headless"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_health(f"http://localhost:{port}/_stcore/health", proc)
        yield f"http://localhost:{port}/"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def driver(tmp_path):
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


def test_default_scenario_renders_charts_in_chromium(app_server, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(app_server)
    wait = WebDriverWait(driver, 120, poll_frequency=0.5)
    # The default view holds four CDF charts; each is a Plotly div with SVG and drawn line traces.
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= 4)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot path.js-line")) >= 4)
    plots = driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
    titles = [t.text for t in driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .gtitle")]
    assert {"TTFT CDF", "TPOT CDF", "ITL CDF", "E2E CDF"} <= set(titles), titles
    assert len(plots) >= 4
    metrics = driver.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']")
    labels = " ".join(m.text for m in metrics)
    assert "TTFT p50" in labels and "ms" in labels and "SLO attainment" in labels
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stException']")
    out = REPO / "out"
    out.mkdir(exist_ok=True)
    assert driver.save_screenshot(str(out / "app_browser.png"))
    assert (out / "app_browser.png").stat().st_size > 10_000


def test_long_run_shows_progress_and_cancels(app_server, driver):
    """A 400,000-request scenario (tens of seconds): the progress bar appears, Cancel stops it, and the
    page says so instead of showing results."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(app_server)
    wait = WebDriverWait(driver, 120, poll_frequency=0.2)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']"))
    box = driver.find_element(By.CSS_SELECTOR, "input[aria-label='requests']")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("400000", Keys.ENTER)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid='stProgress']"))
    assert "simulating" in driver.find_element(By.CSS_SELECTOR, "[data-testid='stProgress']").text
    cancel = next(b for b in driver.find_elements(By.CSS_SELECTOR, "button") if b.text == "Cancel")
    cancel.click()
    wait.until(lambda d: "Run cancelled" in d.find_element(By.TAG_NAME, "body").text)
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stProgress']")
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']")
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stException']")
