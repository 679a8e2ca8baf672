"""End to end in a real browser: `epdsim app` on localhost, driven by headless Chromium (Selenium).

Uses Debian's `chromium` and `chromium-driver` packages (CI installs them in .ci/run); no browser is
ever downloaded.  The test starts the app on a free port, waits for Streamlit's health endpoint,
loads the page, waits for the default scenario's results, checks that the Plotly charts rendered
(SVG plots with drawn traces) and the headline metrics are shown, and saves a screenshot to
out/app_browser.png; then a long run shows its progress bar and Cancel stops it; then a broken
scenario YAML and a malformed trace, uploaded through the page, give inline errors.
"""

from __future__ import annotations

from tests.browser import (
    alerts,
    app_server_fixture,  # noqa: F401 - a pytest fixture: pytest finds it in this module as `app_server`
    body_text,
    click,
    driver_fixture,  # noqa: F401 - a pytest fixture: pytest finds it in this module as `driver`
    idle,
    needs_chromium,
    send_file,
    settled,
    wait,
)
from tests.browser import pytestmark as _selenium
from tests.conftest import REPO

pytestmark = [_selenium, needs_chromium]


def test_default_scenario_renders_charts_in_chromium(app_server, driver):
    from selenium.webdriver.common.by import By

    driver.get(app_server)
    # The default view holds four CDF charts; each is a Plotly div with SVG and drawn line traces.
    wait(driver).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= 4)
    wait(driver).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot path.js-line")) >= 4)
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

    driver.get(app_server)
    wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']"))
    box = driver.find_element(By.CSS_SELECTOR, "input[aria-label='requests']")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("400000", Keys.ENTER)

    @settled
    def progress(d) -> str:
        return " ".join(e.text for e in d.find_elements(By.CSS_SELECTOR, "[data-testid='stProgress']"))

    wait(driver).until(lambda d: "simulating" in progress(d))
    click(driver, "Cancel")
    wait(driver).until(lambda d: "Run cancelled" in settled(body_text)(d))
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stProgress']")
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']")
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stException']")


def test_bad_uploads_show_inline_errors(app_server, driver, tmp_path):
    """An invalid scenario YAML and a malformed trace, uploaded through the browser: each is an inline
    error naming the problem and the fix; no traceback on the page."""
    from selenium.webdriver.common.by import By

    driver.get(app_server)
    wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']"))
    bad_yaml = tmp_path / "broken.yaml"
    bad_yaml.write_text("model: Llama-3.1-8B\npools: [{gpu: H100\n")
    bad_trace = tmp_path / "trace.csv"
    bad_trace.write_text("arrival_s,input_tokens,output_tokens\n0.0,100,20\n0.5,lots,20\n")
    # The metrics can show while a rerun is still rebuilding the sidebar: count the uploaders once it is idle.
    wait(driver).until(idle)
    sidebar_inputs = "[data-testid='stSidebar'] input[type='file']"
    wait(driver, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, sidebar_inputs)) >= 3)
    uploads = driver.find_elements(By.CSS_SELECTOR, sidebar_inputs)
    assert len(uploads) == 3  # scenario YAML, config.json, trace
    send_file(driver, 0, bad_yaml)

    errors = settled(alerts)
    wait(driver).until(lambda d: "not valid YAML" in errors(d))
    assert "broken.yaml" in errors(driver) and "line" in errors(driver)
    send_file(driver, 2, bad_trace)
    wait(driver).until(lambda d: "input_tokens='lots'" in errors(d))
    assert "trace.csv line 3" in errors(driver) and "each row must give" in errors(driver)
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stException']")


def test_upload_naming_a_server_file_is_refused(app_server, driver, tmp_path):
    """A scenario uploaded through the browser that names /etc/passwd as its trace is refused inline
    before anything is read: the page shows the field and the fix, nothing of the file."""
    from selenium.webdriver.common.by import By

    driver.get(app_server)
    wait(driver).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid='stMetric']"))
    evil = tmp_path / "evil.yaml"
    evil.write_text(
        "model: Llama-3.1-8B\npools: [{gpu: H100}]\n"
        "workload: {arrival: {kind: trace, path: /etc/passwd, format: plain}, num_requests: 5}\n"
    )
    send_file(driver, 0, evil)

    errors = settled(alerts)
    wait(driver).until(lambda d: "outside the files uploaded" in errors(d))
    assert "workload.arrival.path" in errors(driver)
    assert "root:" not in driver.find_element(By.TAG_NAME, "body").text
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-testid='stException']")
