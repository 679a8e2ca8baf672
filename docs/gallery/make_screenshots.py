"""Screenshots of every page of `epdsim app`, regenerated from the running app so that they stay true.

    .venv/bin/python docs/gallery/make_screenshots.py [--out out/gallery] [--width 1400]

Starts `epdsim app` headless on a free localhost port (with a private hardware folder and HOME), drives
Debian's headless Chromium through Selenium (the helpers of tests/browser.py: `apt-get install chromium
chromium-driver`, `pip install -e '.[test]'`), runs each page's main task (Home's default scenario, Compare's
preset, the planner, the cold start, the sample bundle's fit, the hardware list, the rate sweep), waits until
the page has drawn its result, and writes one full-page PNG per page: home.png, compare.png, plan.png,
operations.png, calibration.png, hardware.png, sweep.png (``--pages`` picks some).  The PNGs are several
hundred kB each, so they go to out/ (not committed); ``--docs`` also writes a 900-pixel-wide WebP of each
(20-70 kB) to docs/gallery/, the gallery docs/app.md shows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.browser import CHROMIUM, DRIVER, FLAGS, body_text, click, idle, running_app, wait  # noqa: E402 - after the sys.path entry (tests/ is not installed)

# page path (after the app's URL), file name, the button that starts its main task (None: it runs on
# opening), and a text the page shows once its result is drawn.
PAGES = [
    ("", "home", None, "output tok/s"),
    ("Compare", "compare", None, "Best value per row highlighted"),
    ("Plan", "plan", "Run the planner", "Pareto front"),
    ("Operations", "operations", None, "Recommended probes"),
    ("Calibration", "calibration", "Fit and validate", "checks within 25%"),
    ("Hardware", "hardware", None, "details of a"),
    ("Sweep", "sweep", "Run the sweep", "sweep CSV"),
]


def _driver(profile: Path, width: int):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},1000"]:
        opts.add_argument(f)
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)


def _charts_drawn(drv) -> bool:
    """Every Plotly chart on the page has drawn its SVG (a chart mid-draw would be a blank box)."""
    plots = drv.find_elements(By.CSS_SELECTOR, "[data-testid='stPlotlyChart']")
    return all(p.find_elements(By.CSS_SELECTOR, ".main-svg") for p in plots)


def shoot(drv, path: Path, width: int) -> int:
    """A full-page PNG: the window grown to the height of Streamlit's scrolling main area; returns its size."""
    height = drv.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]');"
        "return m ? m.scrollHeight : document.body.scrollHeight;"
    )
    drv.set_window_size(width, min(int(height) + 150, 8000))
    # Plotly redraws its charts at the new size: wait for that, then for the page to be idle again.
    wait(drv, 60).until(lambda d: idle(d) and _charts_drawn(d))
    time.sleep(1.0)  # the redraw's transition; nothing is read from the page after it
    drv.save_screenshot(str(path))
    drv.set_window_size(width, 1000)
    return path.stat().st_size


def web_copy(png: Path, dst: Path, width: int = 900) -> int:
    """``png`` scaled to ``width`` pixels and saved as a WebP (quality 70) at ``dst``; returns its size."""
    im = Image.open(png).convert("RGB")
    im.resize((width, round(im.height * width / im.width)), Image.LANCZOS).save(dst, "WEBP", quality=70)
    return dst.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "out" / "gallery"), help="folder for the PNGs (default out/gallery)")
    ap.add_argument("--width", type=int, default=1400, help="browser window width in pixels")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds to wait for a page's result")
    ap.add_argument(
        "--pages",
        nargs="*",
        default=[p[1] for p in PAGES],
        choices=[p[1] for p in PAGES],
        help="which pages (default: all seven)",
    )
    ap.add_argument("--docs", action="store_true", help="also write docs/gallery/<page>.webp (900 px wide)")
    args = ap.parse_args(argv)
    if not (CHROMIUM and DRIVER):
        print("no chromium/chromedriver here: apt-get install chromium chromium-driver", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "EPDSIM_HWDB": str(Path(tmp) / "user-hwdb"), "HOME": tmp}
        with running_app(env, Path(tmp) / "app.log") as url:
            drv = _driver(Path(tmp) / "chromium", args.width)
            try:
                for page, name, button, done in (p for p in PAGES if p[1] in args.pages):
                    drv.get(url + page)
                    wait(drv, 120).until(lambda d: idle(d) and body_text(d).strip())
                    if button:
                        click(drv, button)
                    wait(drv, args.timeout).until(lambda d, t=done: t in body_text(d) and idle(d))
                    size = shoot(drv, out / f"{name}.png", args.width)
                    print(f"{out / (name + '.png')}: {size / 1024:,.0f} kB")
                    if args.docs:
                        web = REPO / "docs" / "gallery" / f"{name}.webp"
                        print(f"{web}: {web_copy(out / (name + '.png'), web) / 1024:,.0f} kB")
            finally:
                drv.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
