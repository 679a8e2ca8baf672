"""Prefill-decode disaggregation: interference, the network gotcha, transfer physics, invariants, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwdb
from simulator.pd.flows import FLOWS
from simulator.pd.pd import build_transfer_plan, crossover_bandwidth
from simulator.pd.pd_config import KVTransferConfig
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError, load_scenario, parse_scenario
from tests.conftest import REPO
from tests.test_invariants import check_invariants


def pd_scenario(
    model="Llama-3.1-8B", gpu="H100", tp=1, n_p=1, n_d=1, kv=None, workload=None, seed=3, engine=None, d_tp=None
):
    pools = [
        {"name": "p", "role": "prefill", "gpu": gpu, "tp": tp, "instances": n_p},
        {"name": "d", "role": "decode", "gpu": gpu, "tp": d_tp or tp, "instances": n_d},
    ]
    if engine:
        for p in pools:
            p["engine"] = engine
    data = {
        "name": "pd",
        "seed": seed,
        "model": model,
        "pools": pools,
        "kv_transfer": kv or {"connector": "nixl", "fabric": "ib-ndr"},
        "workload": workload
        or {
            "arrival": {"kind": "poisson", "rate": 4.0},
            "input_length": {"kind": "uniform", "low": 100, "high": 3000},
            "output_length": {"kind": "uniform", "low": 1, "high": 200},
            "num_requests": 200,
        },
    }
    return parse_scenario(data)


def colocated(model, gpu, tp, n, workload, seed=3):
    return parse_scenario(
        {
            "name": "c",
            "seed": seed,
            "model": model,
            "workload": workload,
            "pools": [{"role": "colocated", "gpu": gpu, "tp": tp, "instances": n}],
        }
    )


def check_pd(res) -> None:
    check_invariants(res)
    req = res.requests[res.requests["outcome"] == "completed"]
    # No request decodes before its KV arrives, nor receives KV before its prefill ends.
    assert (req["decode_admission_s"] > 0).all()
    assert (req["transfer_s"] >= 0).all() and (req["transfer_wait_s"] >= 0).all()
    # KV bytes sent equal KV bytes received: what left the prefill NICs arrived at the decode NICs.
    links = res.summary["links"]
    out = sum(ln["bytes_carried"] for ln in links if ln["link"].endswith(":out"))
    inn = sum(ln["bytes_carried"] for ln in links if ln["link"].endswith(":in"))
    assert out == pytest.approx(res.summary["kv_bytes_moved"], rel=1e-9)
    assert inn == pytest.approx(res.summary["kv_bytes_moved"], rel=1e-9)


def test_interference_colocated_itl_spikes_pd_stays_flat():
    col = simulate(load_scenario(REPO / "examples/interference_colocated.yaml")).summary
    pd = simulate(load_scenario(REPO / "examples/interference_pd.yaml")).summary
    assert col["itl_s"]["p99"] > 5 * pd["itl_s"]["p99"]
    assert col["itl_s"]["p99"] > 5 * col["itl_s"]["p50"]  # the spike is the prompt chunks
    assert pd["itl_s"]["p99"] < 1.3 * pd["itl_s"]["p50"]  # flat
    assert pd["pools"]["decode"]["mean_batch_size"] > 20


@pytest.mark.parametrize("model,tp,rate", [("Llama-3.1-70B", 4, 2.5), ("Llama-3.1-8B", 1, 8.0)])
def test_network_gotcha_tcp_worse_rdma_not(model, tp, rate):
    wl = {
        "arrival": {"kind": "poisson", "rate": rate},
        "input_length": {"kind": "fixed", "value": 4000},
        "output_length": {"kind": "uniform", "low": 200, "high": 600},
        "num_requests": 500,
    }
    base = simulate(colocated(model, "H100", tp, 2, wl)).summary["ttft_s"]["mean"]
    tcp = simulate(
        pd_scenario(model, tp=tp, n_p=2, n_d=2, workload=wl, kv={"connector": "tcp", "fabric": "tcp-10gbe"})
    ).summary
    rdma = simulate(
        pd_scenario(model, tp=tp, n_p=2, n_d=2, workload=wl, kv={"connector": "nixl", "fabric": "roce-400"})
    ).summary
    assert tcp["ttft_s"]["mean"] > 3 * base
    assert rdma["ttft_s"]["mean"] < 1.15 * base
    # The crossover bandwidth lies between the two fabrics' per-instance bandwidths.
    db = hwdb.load()
    dep = resolve(colocated(model, "H100", tp, 1, wl)).pools[0].dep
    x = tcp["crossover"]
    slow = build_transfer_plan(KVTransferConfig(connector="tcp", fabric="tcp-10gbe"), db, dep, dep)
    fast = build_transfer_plan(KVTransferConfig(connector="nixl", fabric="roce-400"), db, dep, dep)
    assert slow.decode_side_Bps < x["crossover_Bps"] < fast.decode_side_Bps
    assert slow.idle_time(4000) > x["prefill_s"] > fast.idle_time(4000)


def _one_request(kv, n=1, model="Llama-3.1-8B", prompt=2000, n_p=None, tp=1):
    wl = {
        "arrival": {"kind": "closed", "concurrency": n},
        "input_length": {"kind": "fixed", "value": prompt},
        "output_length": {"kind": "fixed", "value": 8},
        "num_requests": n,
    }
    scn = pd_scenario(model, tp=tp, n_p=n_p or n, n_d=1, kv=kv, workload=wl, engine={"max_num_batched_tokens": 8192})
    return scn, simulate(scn)


def test_transfer_on_idle_path_is_bytes_over_bandwidth_plus_latency():
    scn, res = _one_request({"connector": "nixl", "fabric": "ib-ndr"})
    rs = resolve(scn)
    db, pools = rs.db, rs.pools
    plan = build_transfer_plan(scn.kv_transfer, db, pools[0].dep, pools[1].dep)
    link = db.link("ib-ndr")
    expect = 2000 * plan.kv_bytes_per_token / (link.effective_Bps * 0.85) + 2 * link.latency_s.value + plan.setup_s
    assert res.requests["transfer_s"].iloc[0] == pytest.approx(expect, rel=1e-9)
    assert plan.idle_time(2000) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4])
def test_n_concurrent_transfers_into_one_decode_take_n_times_longer(n):
    kv = {"connector": "nixl", "fabric": "ib-ndr"}
    scn, one = _one_request(kv)
    _, many = _one_request(kv, n=n)
    rs = resolve(scn)
    db, pools = rs.db, rs.pools
    plan = build_transfer_plan(scn.kv_transfer, db, pools[0].dep, pools[1].dep)
    fixed = 2 * plan.latency_s + plan.setup_s
    t1 = one.requests["transfer_s"].iloc[0] - fixed
    tn = many.requests["transfer_s"].to_numpy() - fixed
    # All n prefills end together and share the decode instance's NIC: the bandwidth part of
    # each transfer takes n times as long (latency and setup do not scale).
    assert tn == pytest.approx(n * t1, rel=1e-6)


def test_layerwise_streaming_hides_transfer_behind_prefill():
    # a buffer large enough for the whole prompt: nothing overflows to host memory here
    fast = {"connector": "p2pnccl", "fabric": "ib-ndr", "kv_buffer_size": 1e10}
    _, lw = _one_request({**fast, "layerwise": True}, model="Llama-3.1-70B", prompt=4000, tp=4)
    _, bulk = _one_request({**fast, "layerwise": False}, model="Llama-3.1-70B", prompt=4000, tp=4)
    # Only the last layer (1/80 of the bytes) and the connector setup remain visible.
    assert lw.requests["transfer_s"].iloc[0] < 0.15 * bulk.requests["transfer_s"].iloc[0]
    # On a link too slow to keep up, streaming hides at most the prefill's duration.
    slow = {**fast, "bandwidth_Bps": 2e9}
    _, lw = _one_request({**slow, "layerwise": True}, model="Llama-3.1-70B", prompt=4000, tp=4)
    _, bulk = _one_request({**slow, "layerwise": False}, model="Llama-3.1-70B", prompt=4000, tp=4)
    saved = bulk.requests["transfer_s"].iloc[0] - lw.requests["transfer_s"].iloc[0]
    prefill = bulk.requests["prefill_s"].iloc[0]
    assert 0.5 * prefill < saved <= prefill * 1.0001


def test_crossover_scales_with_kv_size():
    db = hwdb.load()
    small = resolve(
        colocated(
            "Llama-3.1-8B",
            "H100",
            1,
            1,
            {
                "arrival": {"kind": "poisson", "rate": 1},
                "input_length": {"kind": "fixed", "value": 9},
                "output_length": {"kind": "fixed", "value": 9},
                "num_requests": 1,
            },
        )
    ).pools[0]
    x = crossover_bandwidth(small.step, 131072.0, 4000, 8192)
    assert x["crossover_Bps"] == pytest.approx(x["kv_bytes"] / x["prefill_s"])
    assert crossover_bandwidth(small.step, 2 * 131072.0, 4000, 8192)["crossover_Bps"] == pytest.approx(
        2 * x["crossover_Bps"]
    )
    del db


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_p=st.integers(1, 3),
    n_d=st.integers(1, 3),
    rate=st.floats(1.0, 60.0),
    in_hi=st.integers(1, 3000),
    out_hi=st.integers(1, 400),
    seqs=st.sampled_from([4, 32, 256]),
    util=st.sampled_from([0.25, 0.3, 0.9]),
    fabric=st.sampled_from(["ib-ndr", "roce-100", "tcp-25gbe"]),
    seed=st.integers(0, 1000),
)
def test_pd_invariants_random(n_p, n_d, rate, in_hi, out_hi, seqs, util, fabric, seed):
    kv = {"connector": "tcp" if fabric.startswith("tcp") else "nixl", "fabric": fabric}
    wl = {
        "arrival": {"kind": "poisson", "rate": rate},
        "input_length": {"kind": "uniform", "low": 1, "high": in_hi},
        "output_length": {"kind": "uniform", "low": 1, "high": out_hi},
        "num_requests": 150,
    }
    scn = pd_scenario(
        n_p=n_p,
        n_d=n_d,
        kv=kv,
        workload=wl,
        seed=seed,
        engine={
            "max_num_seqs": seqs,
            "max_num_batched_tokens": 2048,
            "gpu_memory_utilization": util,
            "max_model_len": 4096,
        },
    )
    res = simulate(scn)
    check_pd(res)
    assert res.summary["completed"] == 150


def test_zero_transfer_backpressure_no_drops():
    """A tiny decode KV cache makes prompts wait for blocks on the decode side; none is dropped."""
    wl = {
        "arrival": {"kind": "poisson", "rate": 40.0},
        "input_length": {"kind": "fixed", "value": 3000},
        "output_length": {"kind": "fixed", "value": 300},
        "num_requests": 200,
    }
    res = simulate(pd_scenario(workload=wl, engine={"gpu_memory_utilization": 0.25, "max_model_len": 4096}))
    check_pd(res)
    assert res.summary["completed"] == 200
    assert res.requests["transfer_wait_s"].max() > 1.0  # waited for decode blocks


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda d: d["pools"][1].update(model="Qwen2.5-7B"), ["prefill pool serves", "same model"]),
        (lambda d: d.update(kv_transfer={"connector": "nixl", "fabric": "nvlink4"}), ["intra-node", "same_node"]),
        (lambda d: d["pools"][1].update(gpu="MI300X"), ["NVIDIA H100", "AMD", "one vendor"]),
        (lambda d: (d["pools"][0].update(tp=8), d["pools"][1].update(tp=4)), ["decode TP to be a multiple"]),
        (lambda d: d.update(kv_transfer={"connector": "warp", "fabric": "ib-ndr"}), ["unknown connector", "nixl"]),
        (
            lambda d: (
                d["pools"][0].update(tp=8),
                d["pools"][1].update(tp=8),
                d.update(kv_transfer={"same_node": True}),
            ),
            ["do not fit", "same_node: false"],
        ),
        (lambda d: d["pools"][1].update(role="prefill"), ["one prefill", "decode pool"]),
        (lambda d: d["pools"][1].update(kv_cache_dtype="fp8"), ["same kv_cache_dtype"]),
    ],
)
def test_pd_bad_input(change, words):
    data = {
        "name": "bad",
        "model": "Llama-3.1-8B",
        "pools": [
            {"name": "p", "role": "prefill", "gpu": "H100", "tp": 1},
            {"name": "d", "role": "decode", "gpu": "H100", "tp": 1},
        ],
        "kv_transfer": {"connector": "nixl", "fabric": "ib-ndr"},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 1},
            "input_length": {"kind": "fixed", "value": 9},
            "output_length": {"kind": "fixed", "value": 9},
            "num_requests": 3,
        },
    }
    change(data)
    with pytest.raises(ScenarioError) as exc:
        simulate(parse_scenario(data))
    msg = str(exc.value)
    assert all(w in msg for w in words), msg


def test_heterogeneous_pools_and_link_timeline():
    """H100 TP2 prefill with L40S TP4 decode over RoCE 200: runs, conserves, and logs link rates."""
    wl = {
        "arrival": {"kind": "poisson", "rate": 3.0},
        "input_length": {"kind": "uniform", "low": 500, "high": 4000},
        "output_length": {"kind": "uniform", "low": 50, "high": 300},
        "num_requests": 300,
    }
    data = {
        "name": "het",
        "seed": 2,
        "model": "Llama-3.1-8B",
        "workload": wl,
        "pools": [
            {"name": "p", "role": "prefill", "gpu": "H100", "tp": 2, "instances": 1},
            {"name": "d", "role": "decode", "gpu": "L40S", "tp": 4, "instances": 2, "engine": {"max_model_len": 16384}},
        ],
        "kv_transfer": {"connector": "nixl", "fabric": "roce-200"},
    }
    res = simulate(parse_scenario(data))
    check_pd(res)
    assert {p["gpu"] for p in res.info["pools"]} == {"H100-SXM-80GB", "L40S"}
    links = res.links
    assert set(links["link"]) >= {"roce-200:prefill0:out", "roce-200:decode1:in"}
    assert (links["utilisation"] <= 1 + 1e-9).all() and links["utilisation"].max() > 0.99


def test_degraded_and_jittery_fabric_slows_transfers():
    kv = {"connector": "nixl", "fabric": "ib-ndr"}
    _, healthy = _one_request(kv)
    _, degraded = _one_request({**kv, "bandwidth_factor": 0.25})
    _, jittery = _one_request({**kv, "jitter_mean_s": 0.05}, n=8, n_p=8)
    assert degraded.requests["transfer_s"].iloc[0] > 3.5 * healthy.requests["transfer_s"].iloc[0]
    assert jittery.requests["transfer_s"].std() > 0.01  # identical prompts, different draws


def test_sglang_flow_reserves_decode_blocks_early():
    """SGLang picks the decode instance on arrival: no transfer wait after prefill when decode has room,
    and the invariants hold; under decode memory pressure it still completes everything."""
    wl = {
        "arrival": {"kind": "poisson", "rate": 6.0},
        "input_length": {"kind": "uniform", "low": 500, "high": 3000},
        "output_length": {"kind": "uniform", "low": 20, "high": 200},
        "num_requests": 300,
    }
    vllm = simulate(pd_scenario(workload=wl, kv={"connector": "mooncake", "fabric": "roce-200"}))
    sgl = simulate(pd_scenario(workload=wl, kv={"connector": "mooncake", "fabric": "roce-200", "flow": "sglang"}))
    check_pd(sgl)
    assert sgl.requests["transfer_wait_s"].mean() < 0.2 * vllm.requests["transfer_wait_s"].mean()
    tight = simulate(
        pd_scenario(
            workload={**wl, "arrival": {"kind": "poisson", "rate": 30.0}},
            kv={"connector": "mooncake", "fabric": "roce-200", "flow": "sglang"},
            engine={"gpu_memory_utilization": 0.25, "max_model_len": 4096},
        )
    )
    check_pd(tight)
    assert tight.summary["completed"] == 300


def test_flows_are_a_registry_that_the_config_and_operations_read():
    """``kv_transfer.flow`` names a registered proxy flow; an unknown one is refused with the list, and a
    flow the operations engine does not model (SGLang) is refused with an operations block."""
    assert set(FLOWS) == {"vllm", "sglang"} and FLOWS["vllm"].operations and not FLOWS["sglang"].operations
    with pytest.raises(ScenarioError, match="flow 'nvidia' is not a PD proxy flow; use one of: vllm, sglang"):
        pd_scenario(kv={"fabric": "roce-200", "flow": "nvidia"})
    with pytest.raises(ScenarioError, match="model only these PD proxy flows: vllm; kv_transfer.flow='sglang'"):
        parse_scenario(
            {
                **pd_scenario(kv={"fabric": "roce-200", "flow": "sglang"}).model_dump(),
                "operations": {"faults": {"node_failure": {"mtbf_s": 50.0}}},
            }
        )


def test_p2pnccl_buffer_overflow_goes_to_host_memory_and_makes_decode_wait():
    """The issue's case: a 1.57 GB prompt (12,000 tokens of Llama-3.1-8B) into a 5e8-byte kv_buffer_size.
    What does not fit goes to the decode instance's host tensor pool (vLLM p2p_nccl_connector.md) and is
    copied device->host->device over PCIe before decode can start: the TTFT breakdown's transfer grows by
    that copy; a buffer that holds the prompt changes nothing."""
    kv = {"connector": "p2pnccl", "fabric": "ib-ndr", "layerwise": False}
    scn, big = _one_request({**kv, "kv_buffer_size": 1e10}, prompt=12000)
    _, small = _one_request({**kv, "kv_buffer_size": 5e8}, prompt=12000)
    rs = resolve(scn)
    db, pools = rs.db, rs.pools
    plan = build_transfer_plan(scn.kv_transfer, db, pools[0].dep, pools[1].dep)
    nbytes = plan.bytes_for(12000)
    assert nbytes == pytest.approx(1.57e9, rel=0.01)
    spill = nbytes - 5e8
    wait = small.summary["ttft_breakdown_mean_s"]["transfer"] - big.summary["ttft_breakdown_mean_s"]["transfer"]
    assert wait == pytest.approx(spill * plan.pool_copy_s_per_byte, rel=1e-6)
    assert wait > 0.02
    assert (small.requests["ttft_s"] - big.requests["ttft_s"]).iloc[0] == pytest.approx(wait, rel=1e-6)
    # Four 262 MB prompts into a 300 MB buffer: the first fits, the other three overflow and wait longer.
    _, shared = _one_request({**kv, "kv_buffer_size": 1e10}, n=4)
    _, tight = _one_request({**kv, "kv_buffer_size": 3e8}, n=4)
    assert shared.requests["transfer_s"].std() < 1e-9
    t = np.sort(tight.requests["transfer_s"].to_numpy())
    assert t[0] == pytest.approx(shared.requests["transfer_s"].iloc[0], rel=1e-9) and (t[1:] > t[0] * 1.2).all()
