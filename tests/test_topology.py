"""Network topology as data (kv_transfer.gpus_per_nic, nodes_per_rack, oversubscription, racks_per_pod,
pod_oversubscription, placement): shared node NICs and oversubscribed leaf and spine uplinks are shared fairly
by the transfers that cross them; TCP modes of connectors are evaluated; cross-vendor PD pairs are refused."""

from __future__ import annotations

import pytest
import yaml

import hwdb
from simulator.pd.pd import build_transfer_plan
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario
from tests.test_pd import pd_scenario

_WL = {
    "arrival": {"kind": "closed", "concurrency": 8},
    "input_length": {"kind": "fixed", "value": 4000},
    "output_length": {"kind": "fixed", "value": 4},
    "num_requests": 8,
}


def _run(**topo):
    scn = pd_scenario(
        n_p=8,
        n_d=8,
        kv={"connector": "nixl", "fabric": "ib-ndr", **topo},
        workload=_WL,
        engine={"max_num_batched_tokens": 8192},
    )
    return scn, simulate(scn)


def test_shared_nic_layout_shows_higher_transfer_time_than_one_nic_per_gpu():
    """Eight TP1 prefill and eight TP1 decode instances, eight prompts at once: with one NIC per GPU each
    transfer has its own NICs; with 4 GPUs behind a NIC (2 NICs per 8-GPU node) four transfers share each
    NIC, so each takes four times as long (latency and setup aside)."""
    scn, own = _run()
    _, shared = _run(gpus_per_nic=4)
    rs = resolve(scn)
    db, pools = rs.db, rs.pools
    plan = build_transfer_plan(scn.kv_transfer, db, pools[0].dep, pools[1].dep)
    fixed = 2 * plan.latency_s + plan.setup_s
    t1 = own.requests["transfer_s"].to_numpy() - fixed
    t4 = shared.requests["transfer_s"].to_numpy() - fixed
    assert t4.mean() > 3.9 * t1.mean()
    assert t4 == pytest.approx(4 * t1, rel=1e-6)
    links = set(shared.links["link"])
    assert {"ib-ndr:prefill-nic0:out", "ib-ndr:prefill-nic1:out", "ib-ndr:decode-nic1:in"} <= links
    assert (shared.links["utilisation"] <= 1 + 1e-9).all()


def test_oversubscribed_leaf_switch_slows_cross_rack_transfers():
    """One node per rack, 4:1 oversubscription: the rack uplink carries a quarter of its NICs' rate."""
    _, flat = _run()
    _, over = _run(nodes_per_rack=1, oversubscription=4.0)
    assert over.requests["transfer_s"].mean() > 3.5 * flat.requests["transfer_s"].mean()
    assert any(":prefill-rack0:up" in n for n in over.links["link"])


def test_switch_tiers_and_placement():
    """One node per rack at 2:1, two racks per pod at 4:1 above that: pools in the same racks cross no
    uplink; in other racks the rack uplink halves the eight transfers' rate; in other pods the pod uplink
    (two racks' uplinks / 4) halves it again."""
    tiers = {"nodes_per_rack": 1, "oversubscription": 2.0, "racks_per_pod": 2, "pod_oversubscription": 4.0}
    _, flat = _run()
    _, same = _run(**tiers, placement="same_rack")
    _, rack = _run(**tiers)
    _, pod = _run(**tiers, placement="cross_pod")
    t = {k: r.requests["transfer_s"].mean() for k, r in {"flat": flat, "same": same, "rack": rack, "pod": pod}.items()}
    assert t["same"] == pytest.approx(t["flat"], rel=1e-9)
    assert 1.8 * t["flat"] < t["rack"] < 2.1 * t["flat"]
    assert 1.8 * t["rack"] < t["pod"] < 2.1 * t["rack"]
    assert any(":prefill-pod0:up" in n for n in pod.links["link"])
    assert not any("-pod" in n for n in rack.links["link"])
    assert (pod.links["utilisation"] <= 1 + 1e-9).all()


@pytest.mark.parametrize(
    "kv, needle",
    [
        ({"racks_per_pod": 2}, "racks_per_pod=2 needs nodes_per_rack"),
        ({"nodes_per_rack": 4, "placement": "cross_pod"}, "placement=cross_pod needs racks_per_pod"),
        ({"placement": "same_pod"}, "placement"),
    ],
)
def test_bad_switch_tiers_name_the_field(kv, needle):
    data = pd_scenario().model_dump()
    data["kv_transfer"].update(kv)
    with pytest.raises(ScenarioError, match=needle):
        parse_scenario(data)


@pytest.mark.parametrize("connector", ["p2pnccl", "mooncake", "nixl"])
def test_tcp_modes_are_evaluated_host_staged(connector):
    scn = pd_scenario(kv={"connector": connector, "fabric": "tcp-25gbe"}, workload=_WL | {"num_requests": 4})
    res = simulate(scn)
    rs = resolve(scn)
    db, pools = rs.db, rs.pools
    plan = build_transfer_plan(scn.kv_transfer, db, pools[0].dep, pools[1].dep)
    assert plan.staged_s_per_byte > 0 and res.summary["completed"] == 4
    rdma = build_transfer_plan(
        scn.kv_transfer.model_copy(update={"fabric": "roce-100"}), db, pools[0].dep, pools[1].dep
    )
    assert plan.idle_time(4000) > rdma.idle_time(4000)  # same line rate (12.5 vs 3.1 GB/s aside): TCP loses


def test_cross_vendor_pd_pair_is_refused_with_a_reason():
    scn = pd_scenario()
    data = scn.model_dump()
    data["pools"][1]["gpu"] = "MI300X"
    with pytest.raises(ScenarioError, match="one vendor"):
        simulate(parse_scenario(data))


def test_cloud_layout_with_two_gpus_per_nic_shows_longer_transfers_than_one_nic_per_gpu():
    """The shipped cloud layouts (hwdb networks/): gcp-a3-high puts two H100s behind each 200 Gb/s NIC,
    gcp-a3-mega gives each H100 its own 200 Gb/s NIC; same link model (host-staged TCP), same load.  Eight
    concurrent prompts: on A3 High two transfers share every NIC, so the wire part takes twice as long."""
    runs = {}
    for fabric in ("gcp-a3-mega", "gcp-a3-high"):
        scn = pd_scenario(
            n_p=8,
            n_d=8,
            kv={"connector": "nixl", "fabric": fabric},
            workload=_WL,
            engine={"max_num_batched_tokens": 8192},
        )
        rs = resolve(scn)
        db, pools = rs.db, rs.pools
        plan = build_transfer_plan(scn.kv_transfer, db, pools[0].dep, pools[1].dep)
        nbytes = plan.bytes_for(4000)
        fixed = 2 * plan.latency_s + plan.setup_s + nbytes * plan.staged_s_per_byte
        runs[fabric] = (plan, simulate(scn).requests["transfer_s"].to_numpy() - fixed)
    (mega, t1), (high, t2) = runs["gcp-a3-mega"], runs["gcp-a3-high"]
    assert (mega.prefill_share, high.prefill_share) == (1, 2)
    assert mega.prefill_side_Bps == high.prefill_side_Bps  # the same NIC rate per instance
    assert t2 == pytest.approx(2 * t1, rel=1e-6) and t2.mean() > 1.9 * t1.mean()


def test_a_cloud_layout_names_its_link_and_refuses_pools_on_other_gpus():
    rs = resolve(pd_scenario(kv={"connector": "nixl", "fabric": "p5.48xlarge"}))
    db, pools = rs.db, rs.pools
    plan = build_transfer_plan(
        pd_scenario(kv={"connector": "nixl", "fabric": "aws-p5"}).kv_transfer, db, pools[0].dep, pools[1].dep
    )
    # four 100 Gb/s EFA cards per H100, taken together: 400 Gb/s x link and connector efficiencies
    assert plan.link_name == "aws-p5" and plan.prefill_share == 1
    assert plan.prefill_side_Bps == pytest.approx(
        50e9 * db.link("aws-efa").efficiency.value * db.connector("nixl").efficiency.value
    )
    h200 = pd_scenario(gpu="H200", kv={"connector": "nixl", "fabric": "aws-p5"})
    with pytest.raises(ScenarioError, match=r"aws-p5 is the network of AWS p5\.48xlarge .* H200.*aws-p5e"):
        simulate(h200)


def test_every_shipped_network_layout_cites_its_cloud_documentation():
    db = resolve(pd_scenario()).db
    assert {"aws-p5", "aws-p5e", "gcp-a3-high", "gcp-a3-mega", "gcp-a3-ultra", "azure-nd-h100-v5"} <= set(db.networks)
    for lay in db.networks.values():
        assert "https://" in lay.nic_Bps.source, lay.name
        assert lay.fabric in db.links and all(g in db.gpus for g in lay.gpus)
        assert lay.gpus_per_nic * lay.nics_per_node >= lay.gpus_per_node


@pytest.mark.parametrize(
    "change, message",
    [
        ({"nics_per_node": 3}, "gpus_per_node=8 and nics_per_node=3: one must divide the other"),
        ({"fabric": "ib-fast"}, "field 'fabric': link 'ib-fast' is not defined in links/"),
        ({"gpus": ["H100"]}, "field 'gpus': ['H100'] not defined in gpus/ (use canonical names)"),
        ({"nic_Bps": {"value": 400, "source": "400 Gb/s"}}, "give one NIC's line rate in bytes per second"),
    ],
)
def test_a_bad_user_network_layout_names_the_file_field_and_fix(tmp_path, change, message):
    base = {
        "name": "my-node",
        "provider": "on-prem",
        "instance": "dgx",
        "gpus": ["H100-SXM-80GB"],
        "gpus_per_node": 8,
        "fabric": "ib-ndr",
        "nics_per_node": 8,
        "nic_Bps": {"value": 50e9, "source": "ConnectX-7 NDR 400 Gb/s"},
    }
    (tmp_path / "networks").mkdir()
    (tmp_path / "networks" / "my-node.yaml").write_text(yaml.safe_dump({**base, **change}))
    with pytest.raises(hwdb.HwdbError) as err:
        hwdb.load([tmp_path])
    assert "my-node.yaml" in str(err.value) and message in str(err.value)
