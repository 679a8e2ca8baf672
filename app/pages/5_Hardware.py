"""Hardware: browse GPUs, links and models; add your own (validated, saved to your hwdb folder)."""

from __future__ import annotations

import streamlit as st

from app import ui
from app.services import hardware, scenarios

st.set_page_config(page_title="epdsim: hardware", layout="wide")
st.title("Hardware database")
udir = scenarios.user_hwdb_dir()
st.caption(
    f"Shipped data plus your folder {udir} (set EPDSIM_HWDB to move it). Every figure carries its source; "
    "additions are checked by the same schema before they are saved."
)

if "hw-saved" in st.session_state:
    st.success(st.session_state.pop("hw-saved"))


def saved(path) -> None:
    st.session_state["hw-saved"] = f"saved {path}; it is now in the lists (scenarios pick up your folder)"
    st.rerun()


try:
    db = ui.db()
    tabs = st.tabs(["GPUs", "links", "models", "add"])
    for tab, kind in zip(tabs[:3], hardware.KINDS, strict=True):
        with tab:
            df = hardware.table(kind, db=db)
            st.dataframe(df, hide_index=True, key=f"table-{kind}")
            name = st.selectbox(f"details of a {kind[:-1]}", list(df["name"]), key=f"pick-{kind}")
            st.json(hardware.describe(kind, name, db=db), expanded=False)
except scenarios.InputError as exc:
    ui.show_error(exc)
    st.stop()

with tabs[3]:
    st.markdown("**Add a GPU** (other figures — links, power, efficiency defaults — come from the template)")
    gpus = sorted(db.gpus)
    with st.form("add-gpu"):
        c1, c2 = st.columns(2)
        name = c1.text_input("name", "My-GPU", key="gpu-name")
        template = c2.selectbox(
            "template", gpus, index=gpus.index("H100-SXM-80GB") if "H100-SXM-80GB" in gpus else 0, key="gpu-template"
        )
        c1, c2, c3, c4 = st.columns(4)
        mem = c1.number_input("memory (GiB)", 1.0, 4096.0, 80.0, key="gpu-mem")
        bw = c2.number_input("memory bandwidth (TB/s)", 0.1, 100.0, 3.35, key="gpu-bw")
        fl = c3.number_input("dense bf16 (TFLOP/s)", 1.0, 100000.0, 989.0, key="gpu-flops")
        price = c4.number_input("price ($/GPU-hour)", 0.0, 1000.0, 4.0, key="gpu-price")
        source = st.text_input(
            "source of these figures",
            "",
            key="gpu-source",
            placeholder="e.g. vendor datasheet, URL, or our measurement of 2026-11-30",
        )
        if st.form_submit_button("Add GPU"):
            try:
                p = hardware.add_gpu(name, template, mem, bw, fl, price, source)
            except scenarios.InputError as exc:
                ui.show_error(exc)
            else:
                saved(p)
    st.markdown("**Add a link or GPU file** (YAML like those in hwdb/data)")
    kind = st.radio("kind", ["links", "gpus"], horizontal=True, key="yaml-kind")
    replace = st.checkbox(
        "replace the shipped entry of the same name (for every session of this app)",
        key="hw-override",
        help="off: a file naming shipped hardware is refused",
    )
    up = st.file_uploader("YAML file", type=["yaml", "yml"], key="yaml-upload")
    if up is not None:
        try:
            st.success(
                f"saved {hardware.add_yaml(kind, up.name, up.getvalue(), override=replace)}"
                + (" (it replaces the shipped entry)" if replace else "")
            )
        except Exception as exc:  # noqa: BLE001 - every upload error inline, never a traceback on the page
            ui.show_error(exc)
    st.markdown("**Add a model** (its Hugging Face config.json)")
    mname = st.text_input("model name", "", key="model-name")
    msrc = st.text_input("where the config.json comes from", "", key="model-source")
    mup = st.file_uploader("config.json", type=["json"], key="model-upload")
    if mup is not None and mname:
        try:
            st.success(f"saved {hardware.add_model(mname, mup.name, mup.getvalue(), msrc, override=replace)}")
        except Exception as exc:  # noqa: BLE001 - every upload error inline, never a traceback on the page
            ui.show_error(exc)
