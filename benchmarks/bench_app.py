"""App responsiveness: time from an input change to the default scenario's results (target < 3 s).

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_app.py [--changes 5] [--no-browser]

Two measurements, each over ``--changes`` new arrival rates (21, 22, ... req/s: every change is a
scenario the run cache has not seen, so each one simulates):

* ``server``: streamlit.testing.v1.AppTest on app/Home.py; the wall time of the script run after
  the change (simulation in the worker process, charts, page elements).
* ``browser``: `epdsim app` on localhost and headless Chromium (Debian's package, via Selenium); the
  time from pressing Enter in the rate field to the headline metrics showing the new run's values, i.e.
  what a user waits for, including the websocket round trip and Plotly drawing in the browser.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def server_side(changes: int) -> list[float]:
    at = AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    out = []
    for i in range(changes):
        at.number_input(key="rate-0").set_value(21.0 + i)
        t0 = time.perf_counter()
        at.run()
        out.append(time.perf_counter() - t0)
        assert not at.exception and at.metric, "no results after the change"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser(changes: int) -> list[float] | None:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        print("browser: skipped (no chromium/chromedriver)")
        return None
    from selenium import webdriver  # noqa: PLC0415 - selenium is optional (the test extra): only the browser measurement needs it
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415 - selenium is optional (the test extra): only the browser measurement needs it
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - selenium is optional (the test extra): only the browser measurement needs it
    from selenium.webdriver.common.keys import Keys  # noqa: PLC0415 - selenium is optional (the test extra): only the browser measurement needs it
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415 - selenium is optional (the test extra): only the browser measurement needs it

    tmp = Path(tempfile.mkdtemp(prefix="bench-app-"))
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "app", "--port", str(port), "--headless"],
        cwd=REPO,
        env={**os.environ, "EPDSIM_HWDB": str(tmp / "hw")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for f in (
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
        f"--user-data-dir={tmp / 'profile'}",
    ):
        opts.add_argument(f)
    drv = None
    try:
        for _ in range(180):
            try:
                if urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
        drv.get(f"http://localhost:{port}/")
        wait = WebDriverWait(drv, 120, poll_frequency=0.02)

        def ttft() -> str:
            """The headline metrics as text ("" until they are shown)."""
            return " | ".join(m.text for m in drv.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']"))

        wait.until(lambda d: ttft() and len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot path.js-line")) >= 4)
        out = []
        for i in range(changes):
            before = ttft()
            box = drv.find_element(By.CSS_SELECTOR, "input[aria-label='rate (req/s)']")
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(f"{21 + i}")
            t0 = time.perf_counter()
            box.send_keys(Keys.ENTER)
            wait.until(lambda d, before=before: ttft() and ttft() != before)
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot path.js-line")) >= 4)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        if drv is not None:
            drv.quit()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def _show(name: str, xs: list[float]) -> None:
    print(
        f"{name}: median {statistics.median(xs):.2f} s, max {max(xs):.2f} s over {len(xs)} changes "
        f"({', '.join(f'{x:.2f}' for x in xs)})"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=5)
    ap.add_argument("--no-browser", action="store_true")
    a = ap.parse_args()
    _show("server (AppTest script run)", server_side(a.changes))
    if not a.no_browser:
        b = browser(a.changes)
        if b:
            _show("browser (Enter -> new metrics, charts drawn)", b)
