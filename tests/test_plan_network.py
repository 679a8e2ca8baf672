"""The planner over real networks: TCP candidates are evaluated and shown with their verdict (not refused),
and a cloud network layout (hwdb networks/) can be planned on like any fabric."""

from __future__ import annotations

import math

import yaml

from simulator.cli import main
from simulator.plan import parse_plan_request, run_plan
from tests.test_plan import _vl_request, request

_SCREEN = {"verify": 0, "borderline": 0, "verify_front": 0}


def _pd_request(links, search=None, gpus=None):
    return request(
        gpus=gpus or [{"name": "H100"}],
        fabrics={"links": links, "connector": "nixl"},
        constraints={"families": ["pd"], "max_gpus": 6, "max_instances_per_pool": 3, "tp": [1]},
        search=search or _SCREEN,
    )


def test_tcp_candidates_are_evaluated_beside_their_rdma_twins_and_lose_by_a_figure():
    """The same PD layouts over RoCE and over 25 GbE TCP: every TCP candidate has screen figures and a verdict
    (never a kv-transfer refusal: NIXL runs over UCX TCP, host-staged), and its TTFT is never better."""
    res = run_plan(parse_plan_request(_pd_request(["roce-400", "tcp-25gbe"])), workers=1)
    df = res.candidates.set_index("id")
    tcp = df[df.index.str.contains("-tcp-25gbe-")]
    assert len(tcp) > 0 and not tcp["rejected_reason"].str.startswith("kv-transfer").any()
    assert tcp["est_ttft_s"].notna().all() and (tcp["layout"].str.endswith("over tcp-25gbe")).all()
    slower = 0
    for cid, row in tcp.iterrows():
        twin = df.loc[cid.replace("-tcp-25gbe-", "-roce-400-")]
        assert row["est_ttft_s"] >= twin["est_ttft_s"] - 1e-12
        slower += row["est_ttft_s"] > twin["est_ttft_s"] * 1.01
    assert slower >= len(tcp) // 2  # host staging and the slower wire show in most of them


def test_plan_command_simulates_a_tcp_candidate_and_prints_its_verdict(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for one line per candidate (no wrapped layout)
    data = _pd_request(
        ["tcp-25gbe"],
        {"verify": 1, "borderline": 0, "verify_front": 0, "replications": 1, "requests": 200, "goodput_iterations": 1},
    )
    path = tmp_path / "req.yaml"
    path.write_text(yaml.safe_dump(data))
    rc = main(["plan", str(path), "--workers", "1", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    simulated = out.split("simulated candidates")[1].split("families")[0]
    rows = [line for line in simulated.splitlines() if "over tcp-25gbe" in line]
    assert rows and all("│ yes │" in r for r in rows)  # simulated, not estimated
    verdicts = [r.rsplit("│", 2)[1].strip() for r in rows]
    assert verdicts[0] == "recommended" and all(v.startswith("cost: $") for v in verdicts[1:])
    assert "recommended:" in out and "over tcp-25gbe" in out.split("recommended:")[1]


def test_a_cloud_layout_is_a_fabric_the_planner_plans_on_and_refuses_for_other_gpus():
    """fabrics.links may name a node type (gcp-a3-high: 8 H100 behind 4 NICs); pools on a GPU that node
    type does not carry are refused with the reason, the others are evaluated over its NICs."""
    res = run_plan(
        parse_plan_request(_pd_request(["gcp-a3-high", "gcp-a3-mega"], gpus=[{"name": "H100"}, {"name": "H200"}])),
        workers=1,
    )
    df = res.candidates
    h100 = df[df["id"].str.startswith("pd-H100-SXM-80GB-tp1-H100-SXM-80GB-tp1-")]
    assert set(h100["layout"].str.rsplit(" over ", n=1).str[1]) == {"gcp-a3-high", "gcp-a3-mega"}
    assert not h100["rejected_reason"].str.startswith("kv-transfer").any()
    h200 = df[df["id"].str.contains("H200") & df["rejected_reason"].str.startswith("kv-transfer")]
    assert len(h200) > 0 and h200["rejected_reason"].str.contains("network of Google Cloud a3-").all()
    # two GPUs per NIC (A3 High) never screen faster than one per NIC (A3 Mega) at the same NIC rate
    for cid, row in h100[h100["id"].str.contains("-gcp-a3-high-")].set_index("id").iterrows():
        twin = df.set_index("id").loc[cid.replace("-gcp-a3-high-", "-gcp-a3-mega-")]
        assert row["est_ttft_s"] >= twin["est_ttft_s"] - 1e-12


def test_epd_candidates_over_tcp_are_evaluated_not_refused_and_slower_than_over_rdma():
    """The same multimodal plan with its embeddings (and KV) over 25 GbE TCP and over RoCE: no EPD candidate is
    refused as "embedding transfer impossible" (NIXL runs host-staged over UCX TCP), each gets a finite screen
    TTFT or a load verdict, and none is faster than its RoCE twin."""
    out = {}
    for link in ("roce-400", "tcp-25gbe"):
        req = _vl_request(search=_SCREEN, fabrics={"connector": "nixl", "links": [link]})
        df = run_plan(parse_plan_request(req), workers=1).candidates
        out[link] = df[df["family"] == "epd"].set_index("id")
    tcp, rdma = out["tcp-25gbe"], out["roce-400"]
    assert len(tcp) > 0 and not tcp["rejected_reason"].str.contains("embedding transfer impossible").any()
    e_pd = tcp[~tcp.index.str.contains("+pd-", regex=False)]  # encoder + colocated: no KV path
    assert len(e_pd) > 0 and e_pd["est_ttft_s"].map(math.isfinite).all()
    for cid, row in tcp.iterrows():
        twin = rdma.loc[cid.replace("-tcp-25gbe-", "-roce-400-")]
        assert row["est_ttft_s"] >= twin["est_ttft_s"] - 1e-12
    assert (e_pd["est_ttft_s"] > rdma.loc[e_pd.index, "est_ttft_s"] * 1.05).all()
