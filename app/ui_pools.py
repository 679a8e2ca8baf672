"""The scenario builder's deployment widgets (sidebar): layout, pools and the fabrics between them.

:func:`pools` draws the layout (colocated, PD, E+PD, E+P+D), then per pool its GPU, parallelism (TP,
PP, attention DP, EP), weight and KV-cache formats and engine arguments, then the embedding and KV
transfer fabrics, writing each value back through :mod:`app.services.builder`.  :func:`widget_key` is
the key of every builder widget: it carries the scenario's generation, so that loading a YAML file
re-initialises them.
"""

from __future__ import annotations

import streamlit as st

from app import ui
from app.services import builder, glossary


def widget_key(name: str) -> str:
    return f"{name}-{ui.gen()}"


def pools(d: dict, opts: builder.Options) -> dict:
    """``d`` with the deployment the widgets give: its layout, pools and transfer fabrics."""
    mode = st.radio(
        "Deployment",
        builder.LAYOUTS,
        index=builder.LAYOUTS.index(builder.layout(d)),
        format_func=builder.LAYOUT_LABELS.get,
        key=widget_key("layout"),
        help=glossary.help_for("colocated", "PD", "E+PD", "E+P+D"),
    )
    d = builder.with_layout(d, mode)
    for i, pool in enumerate(d["pools"]):
        st.markdown(f"**{pool.get('role', 'colocated')} pool**")
        gpus = list(opts.gpus)
        g = builder.canonical_gpu(pool["gpu"], ui.db(d))
        gi = gpus.index(g) if g in gpus else 0
        gpu = st.selectbox("GPU", gpus, index=gi, key=widget_key(f"gpu-{i}-{mode}"))
        c2, c3 = st.columns(2)
        tp = c2.selectbox(
            "TP",
            [1, 2, 4, 8],
            index=[1, 2, 4, 8].index(pool.get("tp", 1)) if pool.get("tp", 1) in (1, 2, 4, 8) else 0,
            key=widget_key(f"tp-{i}-{mode}"),
        )
        n = c3.number_input("instances", 1, 512, int(pool.get("instances", 1)), key=widget_key(f"inst-{i}-{mode}"))
        c4, c5 = st.columns(2)
        cur = pool.get("dtype", "bf16")
        dtypes = list(builder.DTYPES) + ([cur] if cur not in builder.DTYPES else [])
        dtype = c4.selectbox(
            "weights",
            dtypes,
            index=dtypes.index(cur),
            key=widget_key(f"dtype-{i}-{mode}"),
            help=glossary.help_for("weights (dtype)"),
        )
        pp = c5.selectbox(
            "PP",
            [1, 2, 4, 8],
            index=[1, 2, 4, 8].index(pool.get("pp", 1)) if pool.get("pp", 1) in (1, 2, 4, 8) else 0,
            key=widget_key(f"pp-{i}-{mode}"),
            help=glossary.help_for("TP / PP"),
        )
        c6, c7 = st.columns(2)
        dp = c6.selectbox(
            "attention DP",
            [1, 2, 4, 8],
            index=[1, 2, 4, 8].index(pool.get("dp", 1)) if pool.get("dp", 1) in (1, 2, 4, 8) else 0,
            key=widget_key(f"dp-{i}-{mode}"),
            help=glossary.help_for("DP / EP"),
        )
        eps = sorted({1, int(tp) * int(dp), int(pool.get("ep", 1))})
        ep = c7.selectbox(
            "EP (experts over GPUs)",
            eps,
            index=eps.index(int(pool.get("ep", 1))),
            key=widget_key(f"ep-{i}-{mode}-{tp}-{dp}"),
            help=glossary.help_for("DP / EP"),
        )
        d = builder.set_pool(d, i, dtype=dtype, pp=int(pp), dp=int(dp), ep=int(ep))
        if pool.get("role") == "encoder":
            d = builder.set_pool(d, i, gpu=gpu, tp=int(tp), instances=int(n))
            continue
        kvs = list(builder.KV_DTYPES)
        kvd = st.selectbox(
            "KV cache",
            kvs,
            index=kvs.index(pool.get("kv_cache_dtype", "auto")),
            key=widget_key(f"kv-dtype-{i}-{mode}"),
            help=glossary.help_for("KV cache dtype"),
        )
        d = builder.set_pool(d, i, kv_cache_dtype=kvd)
        eng = pool.get("engine") or {}
        with st.expander("engine arguments"):
            cur = eng.get("engine", "vllm-v1")
            engines = list(opts.engines) + ([cur] if cur not in opts.engines else [])  # shown by validation
            e = st.selectbox("engine", engines, index=engines.index(cur), key=widget_key(f"engine-{i}-{mode}"))
            seqs = st.number_input(
                "max_num_seqs (0 = vLLM default)",
                0,
                4096,
                int(eng.get("max_num_seqs") or 0),
                key=widget_key(f"seqs-{i}-{mode}"),
            )
            toks = st.number_input(
                "max_num_batched_tokens (0 = default)",
                0,
                262144,
                int(eng.get("max_num_batched_tokens") or 0),
                key=widget_key(f"toks-{i}-{mode}"),
            )
            util = st.slider(
                "gpu_memory_utilization",
                0.5,
                0.98,
                float(eng.get("gpu_memory_utilization", 0.9)),
                0.01,
                key=widget_key(f"util-{i}-{mode}"),
            )
        d = builder.set_pool(
            d,
            i,
            gpu=gpu,
            tp=int(tp),
            instances=int(n),
            engine=e,
            max_num_seqs=seqs or None,
            max_num_batched_tokens=toks or None,
            gpu_memory_utilization=None if abs(util - 0.9) < 1e-9 else float(util),
        )
    if mode.startswith("e+"):
        et = d.get("embedding_transfer") or {}
        fabrics = ["(encoder GPU's NIC)", *opts.fabrics]
        fab = st.selectbox(
            "embedding transfer fabric",
            fabrics,
            index=fabrics.index(et["fabric"]) if et.get("fabric") in fabrics else 0,
            key=widget_key("emb-fabric"),
        )
        d = builder.set_embedding_transfer(d, fabric=None if fab.startswith("(") else fab)
    if mode in ("pd", "e+p+d"):
        kv = d.get("kv_transfer") or {}
        c1, c2 = st.columns(2)
        conns = list(opts.connectors)
        conn = c1.selectbox(
            "KV connector",
            conns,
            index=conns.index(kv.get("connector", "nixl")) if kv.get("connector", "nixl") in conns else 0,
            key=widget_key("connector"),
        )
        fabrics = ["(GPU's default NIC)", *opts.fabrics]
        fab = c2.selectbox(
            "fabric",
            fabrics,
            index=fabrics.index(kv["fabric"]) if kv.get("fabric") in fabrics else 0,
            key=widget_key("fabric"),
        )
        same = st.checkbox(
            "prefill and decode on the same node (NVLink)",
            bool(kv.get("same_node", False)),
            key=widget_key("same-node"),
        )
        d = builder.set_kv_transfer(d, connector=conn, fabric=None if fab.startswith("(") else fab, same_node=same)
    return d
