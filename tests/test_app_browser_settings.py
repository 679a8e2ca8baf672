"""Issue 32, what it must show: the settings chosen on Home travel to Plan and Operations in a real browser
(`epdsim app` and headless Chromium through Selenium).

On Home a MoE model is set to fp8 weights, an fp8 KV cache, attention DP 2 and EP 2 through the sidebar's
widgets; the Plan page's request and the `vllm serve` line of its artefacts carry every one of them, and
the Operations page shows them (its weights and KV-cache controls start there) and puts them into the
serve line of the instance whose start it models.  Home's cards carry the model error band.
"""

from __future__ import annotations

import re

from tests.browser import (
    alerts,
    app_server_fixture,  # noqa: F401 - a pytest fixture: pytest finds it in this module as `app_server`
    assert_no_traceback,
    body_text,
    driver_fixture,  # noqa: F401 - a pytest fixture: pytest finds it in this module as `driver`
    idle,
    metrics,
    needs_chromium,
)
from tests.browser import click as _click
from tests.browser import pytestmark as _selenium
from tests.browser import settled as _settled
from tests.browser import wait as _wait

pytestmark = [_selenium, needs_chromium]
MODEL = "Qwen3-30B-A3B"
SERVE_FLAGS = ("--quantization fp8", "--kv-cache-dtype fp8", "--data-parallel-size 2", "--enable-expert-parallel")


def _selectbox(drv, label: str, where: str = ""):
    from selenium.webdriver.common.by import By

    for box in drv.find_elements(By.CSS_SELECTOR, where + "[data-testid='stSelectbox']"):
        lab = box.find_elements(By.CSS_SELECTOR, "[data-testid='stWidgetLabel']")
        if lab and lab[0].text.strip() == label and box.is_displayed():
            return box
    return None


def _selected(drv, label: str, where: str = "") -> str | None:
    """The shown value of the selectbox labelled ``label`` (None when there is none)."""
    from selenium.webdriver.common.by import By

    def read(d):
        box = _selectbox(d, label, where)
        if box is None:
            return None
        return box.find_element(By.CSS_SELECTOR, "input[role='combobox']").get_attribute("value")

    return _settled(read)(drv)


def _choose(drv, label: str, option: str, where: str = "[data-testid='stSidebar'] ") -> None:
    """Open the selectbox (a react-aria combobox) labelled ``label`` and click ``option``, then wait until it
    shows it and the rerun it starts is over."""
    from selenium.webdriver.common.by import By

    def pick(d) -> bool:
        if not idle(d):
            return False
        box = _selectbox(d, label, where)
        if box is None:
            return False
        if box.find_element(By.CSS_SELECTOR, "input[role='combobox']").get_attribute("value") == option:
            return True
        options = [o for o in d.find_elements(By.CSS_SELECTOR, "[role='option']") if o.text.strip() == option]
        if options:
            options[0].click()
        else:  # the combobox's "Open" button shows its list of options
            box.find_element(By.CSS_SELECTOR, "button[aria-haspopup='listbox']").click()
        return False

    _wait(drv, 120).until(pick)
    _wait(drv, 180).until(lambda d: idle(d) and _selected(d, label, where) == option)


@_settled
def _code(drv) -> str:
    """Every code block's text, folded ones included (textContent: Selenium's .text skips hidden text)."""
    from selenium.webdriver.common.by import By

    return "\n".join(e.get_attribute("textContent") or "" for e in drv.find_elements(By.CSS_SELECTOR, "pre code"))


def _open_expanders(drv, prefix: str) -> None:
    from selenium.webdriver.common.by import By

    for s in drv.find_elements(By.CSS_SELECTOR, "[data-testid='stExpander'] summary"):
        if s.text.strip().startswith(prefix):
            s.click()


def _page(drv, base: str, name: str) -> None:
    """Go to another page in the same session (the sidebar's page link: a new URL would start a new session
    from the link's scenario, which would hide a setting that only lives in the session)."""
    from selenium.webdriver.common.by import By

    def go(d) -> bool:
        links = [
            a
            for a in d.find_elements(By.CSS_SELECTOR, "[data-testid='stSidebarNav'] a")
            if a.get_attribute("href").rstrip("/").endswith("/" + name)
        ]
        if links and idle(d):
            links[0].click()
            return True
        return False

    _wait(drv, 60).until(go)
    _wait(drv, 60).until(lambda d: d.current_url.split("?")[0].rstrip("/").endswith(name))


def test_fp8_kv_fp8_dp_ep_set_on_home_travel_to_plan_and_operations(app_server, driver):
    driver.get(app_server)
    _wait(driver).until(lambda d: "output tok/s" in metrics(d))
    _choose(driver, "Model", MODEL)
    _choose(driver, "weights", "fp8")
    _choose(driver, "KV cache", "fp8")
    _choose(driver, "attention DP", "2")
    _choose(driver, "EP (experts over GPUs)", "2")
    _wait(driver).until(lambda d: idle(d) and MODEL in body_text(d) and "output tok/s" in metrics(d))
    assert_no_traceback(driver)
    # Home's latency cards carry their model error band under them: "p50 70.0 ms (50–90) · p90 ...".
    assert re.search(r"p50 [\d.]+ ms \([\d.]+–[\d.]+\) · p90 ", body_text(driver)), body_text(driver)[:2000]
    assert "model error band" in body_text(driver)

    _page(driver, app_server, "Plan")
    _wait(driver, 120).until(
        lambda d: _selectbox(d, "GPUs on offer", "") is not None or "Run the planner" in body_text(d)
    )
    _open_expanders(driver, "plan request")
    _wait(driver, 60).until(lambda d: "kv_cache_dtype: fp8" in _code(d))
    request = _code(driver)
    assert f"model: {MODEL}" in request and "- fp8" in request and "kv_cache_dtype: fp8" in request, request
    assert re.search(r"dp:\n\s*- 2", request) and re.search(r"expert_parallel:\n\s*- true", request), request
    _click(driver, "Run the planner")
    _wait(driver, 300).until(lambda d: "Recommended:" in alerts(d) or "No candidate" in alerts(d))
    assert "model error band" in body_text(driver) or "pessimistic edge" in alerts(driver), alerts(driver)
    _wait(driver, 120).until(lambda d: "vllm serve" in _code(d))
    serve = [line for line in _code(driver).splitlines() if line.startswith("vllm serve")]
    assert serve and all(f in serve[0] for f in SERVE_FLAGS), serve
    assert "fp8" in alerts(driver), alerts(driver)  # the recommended layout names it
    assert_no_traceback(driver)

    _page(driver, app_server, "Operations")
    _wait(driver, 120).until(lambda d: "start to API ready" in metrics(d) and "vllm serve" in _code(d))
    assert _selected(driver, "weights") == "fp8" and _selected(driver, "KV cache") == "fp8"
    assert _selected(driver, "model") == MODEL
    assert "DP2 EP2, weights fp8, KV cache fp8" in body_text(driver)
    line = next(x for x in _code(driver).splitlines() if x.startswith("vllm serve"))
    assert all(f in line for f in SERVE_FLAGS), line
    assert_no_traceback(driver)
