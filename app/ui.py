"""Streamlit glue shared by the pages: session state, the run cache, jobs with progress and Cancel.

Layout helpers only; computations live in :mod:`app.services`.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import streamlit as st

from app.services import costs, exports, glossary, jobs, scenarios, share, views
from app.services.hardware import DbCache
from simulator import fmt
from simulator.confidence import band_caption, error_bands, with_band

if TYPE_CHECKING:
    from simulator.engine.results import Results
    from simulator.summary_types import LatencyKey, Percentiles


@st.cache_resource
def run_cache() -> scenarios.RunCache:
    """One cache of finished runs per app server, keyed by scenario hash."""
    return scenarios.RunCache()


@st.cache_resource
def db_cache():
    return DbCache()


def db(d: dict | None = None):
    """The hardware database for scenario ``d`` (its hwdb folders and the user's folder), cached."""
    dirs = [str(p) for p in (d or {}).get("hwdb", ())]
    udir = scenarios.user_hwdb_dir()
    if udir.is_dir() and str(udir) not in dirs:
        dirs.append(str(udir))
    return db_cache().get(tuple(dirs))


def scenario() -> dict:
    """The scenario being edited (shared by every page of this browser session): at the session's
    start the one in the page's link (``?scenario=...``, see :mod:`app.services.share`) or the default."""
    if "scenario" not in st.session_state:
        d = scenarios.default_scenario()
        link = st.query_params.get(share.URL_PARAM)
        if link:
            try:
                d = share.decode(link)
            except scenarios.InputError as exc:  # shown by the builder; the default scenario meanwhile
                st.session_state["link-error"] = str(exc)
        st.session_state["scenario"] = d
    d = st.session_state["scenario"]
    publish(d)  # every page's link carries it: a refresh on any page keeps the session's edits
    return d


def load_scenario(d: dict) -> None:
    """Replace the edited scenario by a loaded one (YAML, example): the widgets re-read it and its own
    name and description hold until it is edited."""
    set_scenario(d, reset_widgets=True)
    st.session_state.pop(LABEL_BASE, None)
    st.session_state[LABEL_CUSTOM] = {}


LABEL_BASE, LABEL_CUSTOM = "label-base", "label-custom"


def publish(d: dict) -> list[str]:
    """Put scenario ``d`` into the page's link so that a refresh or a shared link restores it.
    Returns the uploaded files it reads (then the link is left without a scenario: it cannot carry them)."""
    files = share.uploaded_files(d)
    if files:
        if share.URL_PARAM in st.query_params:
            del st.query_params[share.URL_PARAM]
        return files
    q = share.encode(d)
    if st.query_params.get(share.URL_PARAM) != q:
        st.query_params[share.URL_PARAM] = q
    return []


def set_scenario(d: dict, reset_widgets: bool = False) -> None:
    st.session_state["scenario"] = d
    if reset_widgets:  # widgets keyed by generation re-read their values from the new scenario
        st.session_state["gen"] = st.session_state.get("gen", 0) + 1


def gen() -> int:
    return st.session_state.get("gen", 0)


def plain(text: str) -> str:
    """``text`` for Streamlit's Markdown shown as written: no emoji codes (``:x:``), no math (``$``), no links.

    A zero-width space breaks ``:word:`` and ``](``; the rest of the text is left as it is, so it reads
    (and copies) the same."""
    out = re.sub(r":(?=[A-Za-z0-9_+-]+:)", ":\u200b", str(text))
    return out.replace("$", "\\$").replace("](", "]\u200b(")


def show_error(exc: Exception) -> None:
    """An error inline, its text never read as Markdown or emoji codes; an error that is not one of the
    user errors the services name (a bug, or input they missed) is labelled with its type."""
    msg = (
        str(exc)
        if isinstance(exc, (scenarios.InputError, *scenarios.USER_ERRORS))
        else f"could not use this input ({type(exc).__name__}): {exc}"
    )
    up = st.session_state.get("upload-dir")
    if up:  # name the user's file, not the server's copy of it
        msg = msg.replace(str(up) + "/", "")
    st.error(plain(msg), icon="🚫")


@overload
def upload_dir(create: Literal[True] = True) -> Path: ...
@overload
def upload_dir(create: bool) -> Path | None: ...
def upload_dir(create: bool = True) -> Path | None:
    """This browser session's private upload folder (``tempfile.mkdtemp``, made on first use; with
    ``create=False`` None until something was uploaded)."""
    p = st.session_state.get("upload-dir")
    if not create and p is None:
        return None
    if p is None or not Path(p).is_dir():
        p = str(scenarios.new_upload_dir())
        st.session_state["upload-dir"] = p
    return Path(p)


def run_job(key: str, fn, args: tuple = (), label: str = "running", kwargs: dict | None = None):
    """Run ``fn(*args, progress=...)`` in a worker process with a progress bar and a Cancel button.

    Returns the result, or None when it was cancelled or failed (the error is shown inline).
    A click on Cancel reruns the page; Streamlit stops this loop at its next call and the
    ``finally`` terminates the worker.
    """
    cancel_key, state_key = f"cancel-{key}", f"cancelled-{key}"
    if st.session_state.get(cancel_key):
        st.session_state[state_key] = True
    if st.session_state.get(state_key):
        st.info("Run cancelled. Change an input or press Run to start it again.")
        if st.button("Run", key=f"rerun-{key}", type="primary"):
            st.session_state[state_key] = False
            st.rerun()
        return None
    job = jobs.Job(fn, args, kwargs or {}).start()
    box = st.empty()
    with box.container():
        bar = st.progress(0.0, text=label)
        st.button("Cancel", key=cancel_key)
    try:
        while job.poll(0.1) == "running":
            frac = job.fraction
            text = f"{label}: {job.stage or 'working'} ({job.elapsed_s:.1f} s)"
            bar.progress(frac if frac is not None else min(0.95, job.elapsed_s / 30.0), text=text)
    finally:
        job.cancel()  # no-op when finished; stops the worker when the page was interrupted
    box.empty()
    if job.state == "failed":
        if job.user_error:
            st.error(job.error, icon="🚫")
        else:
            st.error(f"internal error (please report it): {job.error}", icon="🐞")
        return None
    return job.result if job.state == "done" else None


def run_scenario(d: dict):
    """Results of scenario dict ``d`` from the cache, or simulated now with progress and Cancel.

    Returns (results, key) or (None, key); validation errors are shown inline."""
    try:
        scn = scenarios.to_scenario(d, folder=upload_dir(create=False), sandboxed=True)
    except Exception as exc:  # noqa: BLE001 - every input error inline, never a traceback on the page
        show_error(exc)
        return None, None
    key = scenarios.scenario_hash(scn) + ":0"
    cache = run_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit, key
    t0 = time.perf_counter()
    res = run_job(key, jobs.run_one, (d,), label="simulating", kwargs={"folder": upload_dir(create=False)})
    if res is not None:
        cache.put(key, res)
        st.session_state["last_run_s"] = time.perf_counter() - t0
    return res, key


def _pcts_caption(q: Percentiles, target: float | None, rel: float | None) -> str:
    text = " · ".join(f"{p} {with_band(q[p], rel)}" for p in ("p50", "p90", "p99"))
    return text + (f" · SLO ≤ {fmt.duration(target)}" if target else " · no SLO")


def result_cards(res: Results, c: dict) -> None:
    """The headline cards of a run: TTFT and TPOT p50 with p50, p90, p99 and the SLO target under them, each
    latency there with its model error band in brackets (:func:`simulator.confidence.error_bands`, as `epdsim
    simulate` prints it), output tokens/s, SLO attainment with its target, the named costs; every figure
    through simulator.fmt."""
    s, slo = res.summary, res.scenario.slo
    rel = error_bands(res.info)
    cols = st.columns(6)
    cards: tuple[tuple[LatencyKey, str, float | None], ...] = (
        ("ttft_s", "TTFT p50", slo.ttft_s),
        ("tpot_s", "TPOT p50", slo.tpot_s),
    )
    for col, (key, label, target) in zip(cols[:2], cards, strict=True):
        # The card's value stays short (a six-column card cuts a longer one); the band is in the caption under it.
        col.metric(label, fmt.duration(s[key]["p50"]), help=f"mean {with_band(s[key]['mean'], rel[key])}")
        col.caption(_pcts_caption(s[key], target, rel[key]))
    cols[2].metric("output tok/s", f"{s['output_tokens_per_s']:,.0f}")
    cols[2].caption(f"{s['throughput_rps']:,.2f} req/s completed")
    cols[3].metric("SLO attainment", fmt.percent(s["slo_attainment"]), help=glossary.help_for("SLO attainment"))
    cols[3].caption(f"target {fmt.percent(slo.attainment, 0)} of requests")
    named = c.get("named") or {}
    other = [n for n in named if n != costs.headline(named)]
    top = costs.headline(named) if named else costs.STATIC
    cols[4].metric(
        "cost per hour",
        fmt.usd(c["usd_per_hour"]),
        help=f"{top}: {costs.MEANING[top]} (hwdb list price unless overridden under Prices)",
    )
    cols[5].metric(
        "$ per M output tokens", fmt.usd(c["usd_per_million_output_tokens"], 3), help=f"{top}: {costs.MEANING[top]}"
    )
    if c.get("with_scaling"):
        cols[4].caption(f"{top}: {fmt.usd(c['usd'])} for {c['gpu_hours']:,.2f} GPU-hours")
    else:
        cols[4].caption(f"{top}: {s['gpus']} GPUs")
    for n in other:  # the run's other named cost (static beside mean billed), named as the CLI names it
        cols[4].caption(f"{n}: {fmt.usd(named[n]['usd_per_hour'])}/h ({costs.MEANING[n]})")
        cols[5].caption(f"{n}: {fmt.usd(named[n]['usd_per_million_output_tokens'], 3)}")
    if not other:
        cols[5].caption(top)
    st.caption(band_caption(res.info, rel))


def ops_cards(res: Results) -> None:
    """The operations figures of a run with autoscaling or faults (``summary["operations"]``); nothing
    for a run without."""
    o = res.summary.get("operations")
    if o is None:
        return
    ups = o["scale_ups"]
    cols = st.columns(6)
    cols[0].metric("availability", fmt.percent(o["availability"]), help="completed / (completed + rejected + failed)")
    cols[1].metric("failed requests", f"{o['failed']:,}", help="ended by a crash or with their retries exhausted")
    cols[2].metric("retried requests", f"{o['retried_requests']:,}", help="sent again at least once")
    cols[2].caption(f"{o['retries']:,} re-sends, {o['discarded_tokens']:,} tokens discarded")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(o["crashes_by_kind"].items()))
    cols[3].metric("crashes", f"{o['crashes']:,}", help=kinds or None)
    cols[4].metric("scale-ups", f"{len(ups):,}", help="instances ordered by the autoscaler")
    cols[4].caption("peak serving " + ", ".join(f"{k} {v}" for k, v in o["peak_instances"].items()))
    cols[5].metric("GPU-hours", f"{o['gpu_hours']:,.2f}", help="billed from provisioning to removal, crash or the end")
    cols[5].caption(f"{o['wasted_gpu_s']:,.0f} GPU-s wasted (starting, lost work)")
    if ups:
        st.caption(
            f"{o['slo_violations_during_scale_up']:,} of {o['slo_violations']:,} SLO violations arrived while "
            f"a scale-up was pending"
        )


PINNED = "pinned"  # name -> scenario dict, pinned for the Compare page


def pin_button(d: dict) -> None:
    """One click keeps scenario ``d`` for the Compare page, which then shows it against whatever the
    scenario is when you get there ("pinned vs current")."""
    pinned = st.session_state.setdefault(PINNED, {})
    if st.button(
        "Pin for Compare",
        key="pin-home",
        help="keep this configuration; edit the scenario, then open Compare to see both side by side",
    ):
        pinned[str(d.get("name") or f"scenario {len(pinned) + 1}")] = d
    if pinned:
        st.caption(f"pinned for Compare: {', '.join(pinned)}")


SHOWN_ROWS = 1000


def tables_view(res) -> None:
    """Phase means, the per-request table (the first rows on the page, said so) and downloads of the
    whole table (CSV, Parquet), the summary (JSON) and the scenario (YAML)."""
    st.dataframe(views.phase_frame(res.requests), hide_index=True)
    req, name = res.requests, res.scenario.name
    st.dataframe(req.head(SHOWN_ROWS), hide_index=True, key="requests-table", column_config=column_config(req))
    if len(req) > SHOWN_ROWS:
        st.caption(f"Showing the first {SHOWN_ROWS:,} of {len(req):,} requests; the downloads hold all of them.")
    c = st.columns(4)
    c[0].download_button(
        f"requests CSV ({len(req):,} rows)",
        exports.requests_csv(res),
        f"{name}-requests.csv",
        mime="text/csv",
        key="dl-requests-csv",
    )
    c[1].download_button(
        "requests Parquet",
        exports.requests_parquet(res),
        f"{name}-requests.parquet",
        mime="application/octet-stream",
        key="dl-requests-parquet",
    )
    c[2].download_button(
        "summary JSON",
        exports.summary_json(res),
        f"{name}-summary.json",
        mime="application/json",
        key="dl-summary-json",
    )
    c[3].download_button(
        "scenario YAML", exports.scenario_yaml(res), f"{name}.yaml", mime="application/x-yaml", key="dl-scenario-yaml"
    )


def column_config(df) -> dict:
    """Number formats for a results table: fractions (attainment, occupancy, share, utilisation) as
    percentages, dollars, seconds with their unit, so a table reads as the cards above it do."""
    cc = {}
    for c in df.columns:
        name = str(c)
        if name.startswith("cost_usd") or name.startswith("usd"):
            cc[name] = st.column_config.NumberColumn(format="dollar")
        elif name.endswith("_band"):  # a relative model error band
            cc[name] = st.column_config.NumberColumn(format="percent")
        elif any(
            k in name for k in ("attainment", "occupancy", "utilisation", "share", "hit_rate")
        ) and not name.endswith("_ci95_s"):
            cc[name] = st.column_config.NumberColumn(format="percent")
        elif name.endswith("_s") and df[c].dtype.kind == "f":
            cc[name] = st.column_config.NumberColumn(format="%.3f s")
    return cc
