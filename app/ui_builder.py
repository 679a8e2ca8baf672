"""The scenario builder (sidebar widgets): model, pools, fabric, workload, SLOs, prices, YAML in/out.

Widgets start from the current scenario dict and write their values back through
:mod:`app.services.builder`; widget keys carry a generation so that loading a YAML file
re-initialises them.
"""

from __future__ import annotations

import streamlit as st

from app import ui
from app.services import builder, glossary, scenarios, share
from app.ui_pools import pools, widget_key


def _upload_scenario() -> None:
    ups = st.file_uploader(
        "Load scenario YAML (with the traces, length files or config.json it names)",
        type=["yaml", "yml", "csv", "jsonl", "json"],
        key=widget_key("upload-yaml"),
        accept_multiple_files=True,
        help=f"at most {scenarios.MAX_UPLOAD_BYTES // 2**20} MiB each; the scenario may name "
        f"only files uploaded with it (by file name) or the shipped examples",
    )
    ups = list(ups or [])
    yamls = [u for u in ups if u.name.lower().endswith((".yaml", ".yml"))]
    if not yamls:
        return
    up = yamls[0]
    sig = tuple((u.name, u.size) for u in ups)
    if st.session_state.get("loaded-yaml") != sig:
        try:
            if len(yamls) > 1:
                raise scenarios.InputError(
                    f"{len(yamls)} YAML files uploaded ({', '.join(u.name for u in yamls)}); "
                    f"upload one scenario at a time, with the data files it names"
                )
            d = scenarios.parse_yaml_upload(
                up.name,
                up.getvalue(),
                folder=ui.upload_dir(),
                files=tuple((u.name, u.getvalue()) for u in ups if u is not up),
            )
        except Exception as exc:  # noqa: BLE001 - every upload error inline, never a traceback on the page
            ui.show_error(exc)
            return
        st.session_state["loaded-yaml"] = sig
        ui.load_scenario(d)
        st.rerun()


def _examples() -> None:
    pick = st.selectbox(
        "Start from an example",
        list(scenarios.EXAMPLES),
        index=None,
        format_func=lambda k: scenarios.EXAMPLES[k],
        placeholder="choose a shipped example…",
        key=widget_key("example"),
        help="replaces the scenario being edited (save it first to keep it)",
    )
    if pick is not None:
        ui.load_scenario(scenarios.example(pick))
        st.rerun()


def _model(d: dict, opts: builder.Options) -> dict:
    models = list(opts.models)
    cur = d.get("model")
    choices = models + ([cur] if cur not in models else [])
    model = st.selectbox("Model", choices, index=choices.index(cur), key=widget_key("model"))
    up = st.file_uploader("…or upload a Hugging Face config.json", type=["json"], key=widget_key("upload-config"))
    if up is not None:
        try:
            model = scenarios.model_from_config_upload(up.name, up.getvalue(), folder=ui.upload_dir())
            st.caption(f"using uploaded model {model.rsplit('/', 1)[-1]}")
        except Exception as exc:  # noqa: BLE001 - every upload error inline, never a traceback on the page
            ui.show_error(exc)
    return {**d, "model": model}


def _images(d: dict, db) -> dict:
    n, w, h = builder.images(d)
    if not builder.has_vision(d["model"], db):
        if n:
            st.caption("images need a vision-language model (e.g. Qwen2.5-VL-7B); they are removed")
            return builder.set_images(d, 0)
        return d
    sizes = ["1920x1080", "1280x720", "1024x1024", "640x480", "448x448"]
    cur = f"{w}x{h}"
    c1, c2 = st.columns(2)
    n = c1.number_input("images per request", 0, 64, n, key=widget_key("images"))
    res = c2.selectbox(
        "image size",
        sizes + ([cur] if cur not in sizes else []),
        index=(sizes + [cur]).index(cur),
        key=widget_key("image-size"),
    )
    w, h = (int(x) for x in res.split("x"))
    return builder.set_images(d, int(n), w, h)


# (path of the uploaded trace being replayed, the workload it replaced); owned by _trace_upload.
TRACE_STATE = "trace-upload"
WORKLOAD_WIDGETS = ("rate", "nreq", "inp", "out", "trace-limit", "arrival", "cv", "users", "think")


def _trace_path(d: dict) -> str | None:
    return ((d.get("workload") or {}).get("arrival") or {}).get("path")


def _trace_upload(d: dict) -> dict:
    """``d`` replaying the uploaded trace; once the file is removed, ``d`` with the workload the trace replaced.

    The replaced workload is held in session state because the scenario dict itself persists between
    reruns: without it, removing a trace (a bad one above all) would leave its workload in place.
    """
    up = st.file_uploader(
        "Replay a trace (Azure CSV, Mooncake JSONL, plain CSV/JSONL)",
        type=["csv", "jsonl", "json"],
        key=widget_key("upload-trace"),
    )
    held = st.session_state.get(TRACE_STATE)
    in_use = held is not None and _trace_path(d) == held[0]  # not when a loaded YAML replaced it since
    if up is None:
        if held is None:
            return d
        del st.session_state[TRACE_STATE]
        if not in_use:
            return d
        for name in WORKLOAD_WIDGETS:  # they re-read the restored workload instead of keeping the trace's
            st.session_state.pop(widget_key(name), None)
        return {**d, "workload": held[1]}
    try:
        path = scenarios.save_upload("traces", up.name, up.getvalue(), folder=ui.upload_dir())
    except Exception as exc:  # noqa: BLE001 - every upload error inline, never a traceback on the page
        ui.show_error(exc)
        return d
    lim = st.number_input("replay at most N requests", 10, 200000, 2000, key=widget_key("trace-limit"))
    st.session_state[TRACE_STATE] = (str(path), held[1] if held is not None and in_use else d.get("workload"))
    return {**d, "workload": scenarios.trace_workload(path, None, int(lim))}


def _workload(d: dict) -> dict:
    d = _trace_upload(d)
    kind = builder.arrival(d).get("kind")
    if kind in builder.ARRIVALS:
        new = st.selectbox(
            "arrivals",
            builder.ARRIVALS,
            index=builder.ARRIVALS.index(kind),
            format_func=lambda k: builder.ARRIVAL_LABELS[k],
            key=widget_key("arrival"),
            help=glossary.help_for("arrival process"),
        )
        if new is not None and new != kind:  # never None: the box has an index
            d, kind = builder.set_arrival(d, new), new
    elif kind != "trace":
        st.caption(f"arrivals: {kind} (as loaded; edit them in the YAML)")
    rate, inp, out = builder.workload_means(d)
    w = d.get("workload") or {}
    c1, c2 = st.columns(2)
    if kind == "closed":
        a = builder.arrival(d)
        users = c1.number_input("users", 1, 100_000, int(a.get("concurrency", 16)), key=widget_key("users"))
        think = c2.number_input(
            "think time (s)", 0.0, 3600.0, float(a.get("think_time_s", 0.0)), key=widget_key("think")
        )
        d = builder.set_arrival(d, "closed", concurrency=int(users), think_time_s=float(think))
        c1, c2 = st.columns(2)
    if kind == "gamma":
        cv = c2.number_input(
            "burstiness (cv)",
            0.1,
            20.0,
            float(builder.arrival(d).get("cv", 2.0)),
            0.1,
            key=widget_key("cv"),
            help="coefficient of variation of the gaps: 1 = Poisson, above 1 = burstier",
        )
        d = builder.set_arrival(d, "gamma", cv=float(cv))
        c1, c2 = st.columns(2)
    if kind in ("poisson", "gamma", "trace"):
        r = c1.number_input(
            "rate (req/s)",
            0.0 if kind == "trace" else 0.01,
            10000.0,
            float(rate or 0.0),
            key=widget_key("rate"),
            help="for a trace: 0 keeps its own timing, otherwise rescaled to this rate",
        )
        if kind != "trace" or r > 0:
            d = builder.set_workload(d, rate=r)
    if w.get("num_requests") is not None:
        n = c2.number_input("requests", 10, 1_000_000, int(w["num_requests"]), key=widget_key("nreq"))
        d = builder.set_workload(d, num_requests=n)
    if inp is not None and out is not None:
        c1, c2 = st.columns(2)
        i = c1.number_input("mean prompt tokens", 1, 1_000_000, int(inp), key=widget_key("inp"))
        o = c2.number_input("mean output tokens", 1, 100_000, int(out), key=widget_key("out"))
        d = builder.set_workload(d, input_mean=i, output_mean=o)
    seed = st.number_input(
        "seed", 0, 2**31 - 1, int(d.get("seed", 0)), key=widget_key("seed"), help=glossary.help_for("seed")
    )
    return builder.set_seed(d, int(seed)) if int(seed) != int(d.get("seed", 0)) else d


def _slo(d: dict) -> dict:
    slo = d.get("slo") or {}
    c1, c2 = st.columns(2)
    t = c1.number_input(
        "TTFT SLO (ms, 0 = none)", 0.0, 600000.0, float((slo.get("ttft_s") or 0) * 1e3), key=widget_key("ttft")
    )
    p = c2.number_input(
        "TPOT SLO (ms, 0 = none)", 0.0, 60000.0, float((slo.get("tpot_s") or 0) * 1e3), key=widget_key("tpot")
    )
    return builder.set_slo(d, t / 1e3 or None, p / 1e3 or None)


def _prices(d: dict) -> scenarios.Prices:
    out = []
    db = ui.db(d)
    for g in dict.fromkeys(p["gpu"] for p in d["pools"]):
        try:
            listp = db.gpu(g).price_usd_per_hour.value
        except Exception:  # noqa: BLE001 - shown by validation instead
            continue
        v = st.number_input(f"{g} $/GPU-hour", 0.0, 1000.0, float(listp), 0.05, key=widget_key(f"price-{g}"))
        if abs(v - listp) > 1e-9:
            out.append((g, float(v)))
    return scenarios.Prices(tuple(out))


def _custom_label(field: str, key: str) -> None:
    value = str(st.session_state.get(key, "")).strip()
    custom = st.session_state.setdefault(ui.LABEL_CUSTOM, {})
    if value:
        custom[field] = value
    else:  # cleared: the automatic label again
        custom.pop(field, None)


def _label(d: dict) -> dict:
    """``d`` with its name and description: as loaded while it is unchanged, then what it now is
    (:func:`builder.auto_label`), unless the user typed their own."""
    base = st.session_state.get(ui.LABEL_BASE)
    if base is None or base["gen"] != ui.gen():  # the first run since it was loaded: d as the widgets give it
        base = {"gen": ui.gen(), "core": builder.core(d), "name": d.get("name"), "description": d.get("description")}
        st.session_state[ui.LABEL_BASE] = base
    auto_name, auto_desc = builder.auto_label(d)
    same = builder.core(d) == base["core"]
    label = {
        "name": (base["name"] if same and base["name"] else auto_name),
        "description": (base["description"] if same and base["description"] is not None else auto_desc),
    }
    custom = st.session_state.setdefault(ui.LABEL_CUSTOM, {})
    keys = {"name": widget_key("scn-name"), "description": widget_key("scn-desc")}
    for field, key in keys.items():
        if field not in custom:
            st.session_state[key] = label[field]
    st.text_input(
        "Scenario name",
        key=keys["name"],
        on_change=_custom_label,
        args=("name", keys["name"]),
        help="follows your edits until you type your own (clear it to go back)",
    )
    st.text_area(
        "Description",
        key=keys["description"],
        on_change=_custom_label,
        args=("description", keys["description"]),
        height=90,
    )
    return {**d, **label, **custom}


def sidebar() -> tuple[dict, scenarios.Prices]:
    """Draw the builder in the sidebar; returns the edited scenario dict and price overrides."""
    d = ui.scenario()
    with st.sidebar:
        st.header("Scenario")
        _examples()
        _upload_scenario()
        if "link-error" in st.session_state:
            ui.show_error(scenarios.InputError(st.session_state.pop("link-error")))
        d = ui.scenario()
        try:
            db = ui.db(d)
        except Exception as exc:  # noqa: BLE001 - a broken user hwdb folder
            ui.show_error(exc)
            db = ui.db_cache().get(())
        opts = builder.options(db)
        d = _model(d, opts)
        st.subheader("Pools")
        d = pools(d, opts)
        st.subheader("Workload")
        d = _workload(d)
        d = _images(d, db)
        st.subheader("SLO")
        d = _slo(d)
        with st.expander("Prices"):
            prices = _prices(d)
        udir = str(scenarios.user_hwdb_dir())
        if scenarios.user_hwdb_dir().is_dir() and udir not in d.get("hwdb", []):
            d = {**d, "hwdb": [*d.get("hwdb", []), udir]}  # GPUs and models added on the Hardware page
        st.subheader("Save and share")
        d = _label(d)
        ui.set_scenario(d)
        st.download_button(
            "Save scenario YAML",
            share.portable_yaml(d),
            f"{d['name']}.yaml",
            mime="application/x-yaml",
            key="save-yaml",
            help="no server paths: uploaded files are named by their file name",
        )
        files = ui.publish(d)
        if files:
            st.caption(
                f"This page's link cannot carry uploaded files ({', '.join(files)}): save the YAML and "
                f"keep them beside it."
            )
        else:
            st.caption("This page's link holds the scenario: a refresh keeps your edits; bookmark or share it.")
    return d, prices
