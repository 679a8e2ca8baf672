"""Encoder-prefill-decode, the embedding transfer: over TCP through the connectors' TCP modes (host-staged,
slower than RDMA; refused for a connector without one), through NICs shared by several instances, and a
network layout of another GPU refused for the embedding path.  The scenarios are tests/test_epd.py's."""

from __future__ import annotations

import math

import pytest

import hwdb
from simulator.epd.epd import EPDError, embedding_path
from simulator.epd.epd_config import EmbeddingTransferConfig
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError
from tests.test_epd import EPD, FOUR_1080P, mm, split_sums_to_ttft


def _emb_run(fabric, connector="nixl", pools=EPD, n=1, rate=4.0):
    return simulate(
        mm(pools, FOUR_1080P, n=n, rate=rate, embedding_transfer={"fabric": fabric, "connector": connector})
    )


@pytest.mark.parametrize("connector", ["nixl", "mooncake"])
def test_epd_over_tcp_runs_the_connectors_tcp_mode_host_staged_and_slower_than_rdma(connector):
    """NIXL and Mooncake need GPU-direct RDMA but have TCP modes (hwdb tcp_mode_efficiency): over 25 GbE the
    embeddings are staged through host memory, as KV is (simulator/pd/pd.py), and arrive later than over IB."""
    tcp, rdma = _emb_run("tcp-25gbe", connector), _emb_run("ib-ndr", connector)
    t_tcp, t_rdma = (r.requests["embedding_transfer_s"].iloc[0] for r in (tcp, rdma))
    assert math.isfinite(t_tcp) and t_tcp > 5 * t_rdma > 0
    assert tcp.summary["completed"] == 1
    split_sums_to_ttft(tcp.requests)
    db = hwdb.load()
    scn = mm(EPD, FOUR_1080P, n=1)
    dep = resolve(scn).pools[0].dep
    gpu = db.gpu("H100")
    conn = db.connector(connector)
    path = embedding_path(
        EmbeddingTransferConfig(connector=connector, fabric="tcp-25gbe"), db, scn.pools[1], gpu, 1, scn.pools[0], dep
    )
    link = db.link("tcp-25gbe")
    assert path.host_staged and path.staged_s_per_byte == pytest.approx(
        2 / db.link("pcie-gen5-x16").effective_Bps + 2 * link.cpu_cost_s_per_byte.value
    )
    # one node NIC (TCP) at the link's and the TCP mode's efficiency; the 8 GPUs of a node share it
    assert path.encoder_side_Bps == pytest.approx(link.effective_Bps * conn.tcp_mode_efficiency.value)
    assert path.encoder_share == path.lm_share == 8
    ib = embedding_path(
        EmbeddingTransferConfig(connector=connector, fabric="ib-ndr"), db, scn.pools[1], gpu, 1, scn.pools[0], dep
    )
    assert not ib.host_staged and ib.staged_s_per_byte == 0 and ib.encoder_share == 1


def test_a_connector_without_a_tcp_mode_is_still_refused_over_tcp():
    db = hwdb.load()
    scn = mm(EPD, FOUR_1080P, n=1)
    dep = resolve(scn).pools[0].dep
    rdma_only = db.connector("nixl").model_copy(update={"tcp_mode_efficiency": None})

    class DB:
        def __getattr__(self, name):
            return getattr(db, name)

        def connector(self, name):
            return rdma_only

    with pytest.raises(EPDError, match="needs GPU-direct RDMA but tcp-25gbe has none and no TCP mode"):
        embedding_path(
            EmbeddingTransferConfig(fabric="tcp-25gbe"), DB(), scn.pools[1], db.gpu("H100"), 1, scn.pools[0], dep
        )


def test_a_shared_nic_layout_slows_the_embeddings_of_instances_behind_one_nic():
    """GCP A3 High puts two H100s behind each 200 Gb/s NIC, A3 Mega gives each its own at the same rate: two
    encoders and two language-model instances of one GPU each share one NIC per side on A3 High, so two
    requests encoded side by side send their embeddings through it together and take longer than on A3 Mega."""
    one = {"count": {"kind": "fixed", "value": 1}, "resolutions": [{"width": 1920, "height": 1080}]}
    pools = [
        dict(EPD[0], instances=2, router="round_robin"),
        dict(EPD[1], instances=2, encoder={"max_batch_images": 1}),
    ]
    high, mega = (
        simulate(mm(pools, one, n=2, rate=1000.0, embedding_transfer={"fabric": f}))
        for f in ("gcp-a3-high", "gcp-a3-mega")
    )
    assert {s["link"] for s in high.summary["encoder"]["links"]} == {
        "gcp-a3-high:encoder-nic0:out",
        "gcp-a3-high:lm-nic0:embeddings-in",
    }
    assert len(mega.summary["encoder"]["links"]) == 4  # a NIC per instance and side
    assert list(high.requests["instance"]) == list(mega.requests["instance"]) == [0, 1]
    t_high, t_mega = (r.requests["embedding_transfer_s"].to_numpy() for r in (high, mega))
    assert (t_high > 1.05 * t_mega).all()
    for r in (high, mega):
        split_sums_to_ttft(r.requests)


def test_a_network_layout_of_another_gpu_is_refused_for_the_embedding_path():
    with pytest.raises(ScenarioError, match=r"gcp-a3-high is the network of Google Cloud a3-highgpu-8g .* A100"):
        simulate(mm([EPD[0], dict(EPD[1], gpu="A100")], FOUR_1080P, n=2, embedding_transfer={"fabric": "gcp-a3-high"}))
