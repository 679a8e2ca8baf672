"""Operations: an instance's cold start and a Kubernetes pod's probes (time to ready or crash loop)."""

from __future__ import annotations

import streamlit as st

from app import tool_charts, ui
from app.services import builder, operations, scenarios

st.set_page_config(page_title="epdsim: operations", layout="wide")
st.title("Operations: cold start and probes")
st.caption(
    "Autoscaling, crashes and retries over a whole run are simulated on the Home page from a scenario's "
    "`operations` section; its Operations view shows instances over time, scale events, crashes, failed and "
    "retried requests, GPU-hours and the cost with scaling."
)
o1, o2 = st.columns(2)
for col, name in ((o1, "autoscale_step_load.yaml"), (o2, "fp8_decode_crashes_pd.yaml")):
    if col.button(f"Open on Home: {scenarios.EXAMPLES[name]}", key=f"ops-open-{name}"):
        ui.load_scenario(scenarios.example(name))
        st.session_state["view"] = "Operations"
        st.switch_page("Home.py")

d = ui.scenario()
opts = builder.options(ui.db(d))
pool = next((p for p in d["pools"] if p.get("role") != "encoder"), d["pools"][-1])
c1, c2, c3, c4 = st.columns(4)
models = list(opts.models)
model = c1.selectbox("model", models, index=models.index(d["model"]) if d["model"] in models else 0, key="ops-model")
gpus = list(opts.gpus)
g0 = builder.canonical_gpu(pool["gpu"], ui.db(d))
gpu = c2.selectbox("GPU", gpus, index=gpus.index(g0) if g0 in gpus else 0, key="ops-gpu")
tp = c3.selectbox("TP", [1, 2, 4, 8], index=[1, 2, 4, 8].index(pool.get("tp", 1)), key="ops-tp")
stores = operations.storages()
storage = c4.selectbox("weights from", stores, index=stores.index("nvme") if "nvme" in stores else 0, key="ops-storage")
c1, c2, c3, c4, c5 = st.columns(5)
# The weights and KV formats start as Home's scenario has them (with its PP/DP/EP and engine arguments).
dtypes = list(dict.fromkeys([*builder.DTYPES, pool.get("dtype", "bf16")]))
dtype = c1.selectbox("weights", dtypes, index=dtypes.index(pool.get("dtype", "bf16")), key="ops-dtype")
kvs = list(builder.KV_DTYPES)
kv = c2.selectbox("KV cache", kvs, index=kvs.index(pool.get("kv_cache_dtype", "auto")), key="ops-kv-dtype")
cache = c3.radio("torch.compile cache", ["miss", "hit"], horizontal=True, key="ops-cache")
image_cached = c4.checkbox("image already on the node", True, key="ops-image")
eager = c5.checkbox(
    "enforce_eager (no compile, no CUDA graphs)", bool((pool.get("engine") or {}).get("enforce_eager")), key="ops-eager"
)
q = operations.query_from_pool(
    pool,
    model,
    gpu,
    int(tp),
    dtype=dtype,
    kv_cache_dtype=kv,
    storage=storage,
    compile_cache=cache,
    image_cached=image_cached,
    enforce_eager=eager,
)
st.caption(
    f"Instance: {operations.settings_text(q)} (PP, DP, EP and engine arguments from the Home page's "
    f"{pool.get('role', 'colocated')} pool)"
)
try:
    cs = operations.cold_start(q, ui.db(d))
    serve = operations.serve_line(q, ui.db(d))
except scenarios.InputError as exc:
    ui.show_error(exc)
    st.stop()

st.subheader("Cold start")
m1, m2, m3 = st.columns(3)
m1.metric("start to API ready", f"{cs['total_s']:,.0f} s")
m2.metric("from container start", f"{cs['container_s']:,.0f} s")
m3.metric("with a warm compile cache", f"{cs['warm_total_s']:,.0f} s")
st.caption(cs["description"])
st.plotly_chart(tool_charts.coldstart_figure(cs["phases"]), key="coldstart")
st.code(serve, language="bash")
st.dataframe(cs["phases"][["case", "label", "seconds", "detail"]], hide_index=True, key="phases")
for n in cs["notes"]:
    st.warning(f"extrapolated: {n}")

st.subheader("Kubernetes probes")


def probe_inputs(label: str, key: str, defaults: tuple[int, int, int, int], on: bool):
    with st.expander(label, expanded=on):
        use = st.checkbox(f"use a {label}", on, key=f"{key}-on")
        cols = st.columns(4)
        vals = tuple(
            int(cols[i].number_input(n, 0, 100000, defaults[i], key=f"{key}-{i}"))
            for i, n in enumerate(("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold"))
        )
    return vals if use else None


startup = probe_inputs("startupProbe", "sp", (0, 10, 5, 30), False)
liveness = probe_inputs("livenessProbe", "lp", (30, 10, 1, 3), True)
readiness = probe_inputs("readinessProbe", "rp", (30, 10, 1, 3), True)
volume = st.checkbox("torch.compile cache on a volume (survives restarts)", False, key="ops-volume")
try:
    pr = operations.probes(q, startup, liveness, readiness, compile_cache_volume=volume, db=ui.db(d))
except scenarios.InputError as exc:
    ui.show_error(exc)
    st.stop()
if pr["never_ready"]:
    st.error(
        f"Crash loop: {pr['summary']} ({pr['restarts']} restarts in {pr['horizon_s']:.0f} s). "
        "Use the recommended probes below.",
        icon="🔁",
    )
else:
    st.success(pr["summary"])
for w in pr["warnings"]:
    st.warning(w)
st.plotly_chart(tool_charts.attempts_figure(pr["attempts"], pr["horizon_s"]), key="attempts")
st.markdown("**Recommended probes** (sized on a cold compile cache, 50% margin)")
st.code(pr["recommended_yaml"], language="yaml")
