"""A new KV connector is one registered strategy class plus one hwdb YAML file (issue 36): a toy connector
added that way is simulated, planned and deployed through the project's own entry points, and every shipped
connector names a registered strategy."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

import hwdb
from calibration.pd import launch as pd_launch
from calibration.pd.bundle import PDReplayError
from calibration.pd.options import DEFAULT_CONNECTOR, harness_connectors, pair_connector
from calibration.pd.replay import transfer_inputs
from simulator.pd import connectors
from simulator.pd.connector_base import CPU_FILES, CPU_NIXL, KVConnector
from simulator.pd.connectors import CONNECTORS, connector_strategy
from simulator.plan import parse_plan_request, run_plan
from simulator.plan.artefacts import artefacts, kv_transfer_json
from simulator.registry import Registry
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario
from tests.conftest import REPO
from tests.plan_results import check_sglang, k8s_roundtrip


class ToyWire(KVConnector):
    """A connector the project does not ship: its own kv-transfer JSON, environment and container port."""

    name = "toy-wire"
    cpu_pair = CPU_FILES  # the CPU calibration pair runs it, its KV through the shared kv_path folder

    def kv_transfer_config(self, role, proxy_host, buffer_bytes, tcp):
        return {
            "kv_connector": self.conn.vllm_name,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"wire": "toy", "side": role, "proxy": proxy_host},
        }

    def env(self, tcp, opts, role):
        return super().env(tcp, opts, role) + [{"name": "TOY_WIRE_SIDE", "value": role}]

    def ports(self, role):
        return [{"name": "toywire", "containerPort": 7777, "protocol": "TCP"}]

    def sglang_backend(self):
        return "fake"  # SGLang's documented test backend: the toy has no SGLang transfer engine

    def sglang_device_args(self, ib_device, tcp):
        return []

    def cpu_kv_transfer_config(self, kv_role, kv_path):
        return {"kv_connector": self.conn.vllm_name, "kv_role": kv_role, "kv_connector_extra_config": {"dir": kv_path}}

    def cpu_env(self, free_port, pinned, progress_thread):
        return {"TOY_WIRE_PORT": str(free_port()), "TOY_WIRE_PINNED": str(int(pinned))}


# The hwdb record: its name differs from the strategy's, which its `strategy` field names.
TOY_YAML = """\
name: toywire
aliases: [ToyWireConnector]
vllm_name: ToyWireConnector
strategy: toy-wire
setup_s: {value: 0.001, source: "test toy"}
efficiency: {value: 0.5, source: "test toy: half of NIXL's 0.85 or so, so that transfers take visibly longer"}
host_staged: false
gpu_direct_required: true
layerwise: false
"""


@pytest.fixture
def toy_hwdb(tmp_path):
    """A user hwdb folder holding the toy connector, with ToyWire registered for the test only."""
    (tmp_path / "connectors").mkdir()
    (tmp_path / "connectors" / "toywire.yaml").write_text(TOY_YAML)
    shipped = connectors.CONNECTORS
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            connectors, "CONNECTORS", Registry(shipped.kind, (*shipped.values(), ToyWire), plural=shipped.plural)
        )
        yield tmp_path
    assert connectors.CONNECTORS is shipped and "toy-wire" not in connectors.CONNECTORS


def test_a_toy_connector_is_simulated_in_a_pd_run(toy_hwdb):
    data = yaml.safe_load((REPO / "examples" / "interference_pd.yaml").read_text())
    data["workload"]["num_requests"] = 40
    nixl = simulate(parse_scenario(data))
    data.update(kv_transfer={**data["kv_transfer"], "connector": "toywire"}, hwdb=[str(toy_hwdb)])
    toy = simulate(parse_scenario(data))
    assert toy.info["kv_transfer"]["connector"] == "toywire"
    assert toy.summary["completed"] == 40
    # the YAML's efficiency (0.5 against NIXL's 0.85) sets the path's bandwidth, and so the transfer times
    nixl_eff = hwdb.load().connector("nixl").efficiency.value
    assert toy.info["kv_transfer"]["prefill_side_Bps"] == pytest.approx(
        nixl.info["kv_transfer"]["prefill_side_Bps"] * 0.5 / nixl_eff
    )
    assert toy.requests["transfer_s"].mean() > 1.5 * nixl.requests["transfer_s"].mean()


def _plan(hwdb_dir):
    req = parse_plan_request(
        {
            "name": "Toy Wire",
            "model": "Llama-3.1-8B",
            "hwdb": [str(hwdb_dir)],
            "workload": {
                "arrival": {"kind": "poisson", "rate": 6.0},
                "input_length": {"kind": "fixed", "value": 2000},
                "output_length": {"kind": "fixed", "value": 200},
                "num_requests": 200,
            },
            "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
            "gpus": [{"name": "H100"}],
            "fabrics": {"connector": "toywire", "links": ["roce-400"]},
            "constraints": {"max_gpus": 4, "max_instances_per_pool": 2, "tp": [1], "families": ["colocated", "pd"]},
            "search": {"verify": 0, "borderline": 0, "verify_front": 0},
        }
    )
    return run_plan(req, workers=1)


def test_a_toy_connector_plans_to_serve_lines_and_kubernetes_manifests(toy_hwdb):
    res = _plan(toy_hwdb)
    df = res.candidates
    # a PD candidate that passed the screen (the toy's transfer model found it feasible)
    cid = next(
        c
        for c, r in zip(df["id"], df["rejected_reason"], strict=True)
        if c.startswith("pd-") and str(r).startswith("unverified: passes the screen")
    )
    files = artefacts(res, cid)
    proxy = "toy-wire-proxy"
    # (b) the serve lines carry the toy's --kv-transfer-config, per role
    for role in ("prefill", "decode"):
        script = files[f"vllm/{role}.sh"]
        argv = shlex.split(script.splitlines()[-1])
        assert argv[:2] == ["vllm", "serve"]
        kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert kv == {
            "kv_connector": "ToyWireConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"wire": "toy", "side": role, "proxy": proxy},
        }
        assert f"export TOY_WIRE_SIDE={role}\n" in script
    # (c) a valid Kubernetes manifest whose PD pods have the toy's environment and port
    docs = list(yaml.safe_load_all(files["k8s/deployment.yaml"]))
    pods = {d["metadata"]["labels"]["epdsim/role"]: d for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    assert set(pods) == {"prefill", "decode", "proxy"}
    for doc in docs:
        assert k8s_roundtrip(doc) == doc
    for role in ("prefill", "decode"):
        ctr = pods[role]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in ctr["env"]}
        assert env["TOY_WIRE_SIDE"] == role and "POD_IP" in env
        assert {"name": "toywire", "containerPort": 7777, "protocol": "TCP"} in ctr["ports"]
        kv = json.loads(ctr["args"][ctr["args"].index("--kv-transfer-config") + 1])
        assert kv["kv_connector_extra_config"]["side"] == role
    assert yaml.safe_load(files["router.yaml"])["kv_transfer"]["connector"] == "ToyWireConnector"
    # (d) the SGLang commands take the toy's transfer backend, and no NIC flag of another backend (on RoCE)
    for role in ("prefill", "decode"):
        argv = shlex.split(files[f"sglang/{role}.sh"].splitlines()[-1])
        check_sglang(argv)
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "fake"
        assert "--disaggregation-ib-device" not in argv


class FakeServer:
    """Records what :func:`calibration.pd.launch.launch_pair` would start, without starting it."""

    started: list[FakeServer] = []

    def __init__(self, cmd, url, log, env, cwd):
        self.cmd, self.env = cmd, env

    def start(self):
        FakeServer.started.append(self)
        return self

    def wait_ready(self, timeout):
        return None


def test_a_toy_connector_drives_the_cpu_calibration_pair(toy_hwdb, tmp_path):
    real_load = hwdb.load
    with pytest.MonkeyPatch.context() as mp:
        # the harness runs any hwdb connector whose strategy has a cpu_pair: the toy's YAML folder is enough
        mp.setattr(hwdb, "load", lambda dirs=(): real_load([*dirs, toy_hwdb]))
        mp.setattr(pd_launch, "ServerProcess", FakeServer)
        FakeServer.started = []
        assert json.loads(pd_launch.kv_transfer_config("kv_consumer", "/kv", "toywire")) == {
            "kv_connector": "ToyWireConnector",
            "kv_role": "kv_consumer",
            "kv_connector_extra_config": {"dir": "/kv"},
        }
        pd_launch.launch_pair(tmp_path, "model", "/kv", vllm_python="py", prefill_bind="0", connector="toywire")
    for srv, kv_role in zip(FakeServer.started, ("kv_producer", "kv_consumer"), strict=True):
        kv = json.loads(srv.cmd[srv.cmd.index("--kv-transfer-config") + 1])
        assert kv["kv_role"] == kv_role and kv["kv_connector_extra_config"] == {"dir": "/kv"}
        assert int(srv.env["TOY_WIRE_PORT"]) > 0 and srv.env["TOY_WIRE_PINNED"] == "1"
        assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in srv.env


def test_the_shipped_harness_connectors_keep_their_cpu_settings(tmp_path):
    assert json.loads(pd_launch.kv_transfer_config("kv_producer", "/kv", "example")) == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": "/kv"},
    }
    assert json.loads(pd_launch.kv_transfer_config("kv_consumer", "/kv", "nixl")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_consumer",
        "kv_buffer_device": "cpu",
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pd_launch, "ServerProcess", FakeServer)
        FakeServer.started = []
        pd_launch.launch_pair(tmp_path, "model", "/kv", vllm_python="py", connector="nixl", nixl_progress_thread=False)
        pre, dec = FakeServer.started
        assert pre.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        assert pre.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != dec.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
        assert pre.env["EPDSIM_NIXL_PROGRESS_THREAD"] == "0" and "EPDSIM_NIXL_KEEP_BINDING" not in pre.env
        FakeServer.started = []
        pd_launch.launch_pair(tmp_path, "model", "/kv", vllm_python="py", connector="example", decode_bind="1")
        assert not any(k.startswith(("VLLM_NIXL", "EPDSIM_NIXL")) for s in FakeServer.started for k in s.env)
        assert FakeServer.started[1].env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_a_yaml_only_connector_reuses_a_registered_strategy(tmp_path):
    (tmp_path / "connectors").mkdir()
    (tmp_path / "connectors" / "moon2.yaml").write_text(
        TOY_YAML.replace("toywire", "moon2").replace("ToyWireConnector", "Moon2").replace("toy-wire", "mooncake")
    )
    conn = hwdb.load([tmp_path]).connector("moon2")
    assert type(connector_strategy(conn)) is CONNECTORS["mooncake"]
    assert kv_transfer_json(conn, "prefill", tcp=True) == {
        "kv_connector": "Moon2",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
    }


def test_a_connector_naming_an_unregistered_strategy_is_refused_with_the_known_ones(tmp_path):
    (tmp_path / "connectors").mkdir()
    (tmp_path / "connectors" / "toywire.yaml").write_text(TOY_YAML)  # ToyWire is not registered here
    data = yaml.safe_load((REPO / "examples" / "interference_pd.yaml").read_text())
    data.update(kv_transfer={"connector": "toywire", "fabric": "ib-ndr"}, hwdb=[str(tmp_path)])
    with pytest.raises(
        ScenarioError,
        match=r"unknown KV connector strategy 'toy-wire'; known KV connector "
        r"strategies: \['example', 'mooncake', 'nixl', 'p2pnccl', 'tcp'\]",
    ):
        simulate(parse_scenario(data))


def test_every_shipped_connector_names_a_registered_strategy():
    db = hwdb.load()
    assert set(db.connectors) == set(CONNECTORS)
    for name, conn in db.connectors.items():
        strategy = connector_strategy(conn)
        assert isinstance(strategy, CONNECTORS[name]) and strategy.conn is conn


def test_the_harness_offers_the_hwdb_connectors_whose_strategy_runs_on_the_cpu_pair(tmp_path):
    assert {n: s.cpu_pair for n, s in harness_connectors().items()} == {"example": CPU_FILES, "nixl": CPU_NIXL}
    assert DEFAULT_CONNECTOR in harness_connectors()
    # a YAML-only connector deployed as NIXL is offered too, and measured as NIXL; a TCP-only one is not
    (tmp_path / "connectors").mkdir()
    (tmp_path / "connectors" / "nixl2.yaml").write_text(
        TOY_YAML.replace("toywire", "nixl2").replace("ToyWireConnector", "Nixl2Connector").replace("toy-wire", "nixl")
    )
    (tmp_path / "connectors" / "tcp2.yaml").write_text(
        TOY_YAML.replace("toywire", "tcp2").replace("ToyWireConnector", "Tcp2").replace("toy-wire", "tcp")
    )
    mine = harness_connectors([tmp_path])
    assert set(mine) == {"example", "nixl", "nixl2"} and mine["nixl2"].cpu_pair == CPU_NIXL
    assert mine["nixl2"].cpu_kv_transfer_config("kv_producer", "/kv") == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
    }


def test_the_harness_refuses_a_connector_its_pair_does_not_run():
    for name in ("tcp", "p2pnccl", "nowhere"):
        with pytest.raises(PDReplayError, match=rf"--connector {name}: unknown; choose example or nixl"):
            pd_launch.harness_connector(name)


def test_a_pd_bundle_is_read_by_the_harness_connector_that_ran_its_vllm_connector():
    assert pair_connector("NixlConnector").conn.name == "nixl"
    assert pair_connector("ExampleConnector").conn.name == "example"
    assert pair_connector(None).conn.name == DEFAULT_CONNECTOR  # bundles written before "connector"
    assert pair_connector("P2pNcclConnector") is None
    nixl_run = {
        "connector": "NixlConnector",
        "nixl_transfers": {"bandwidth_Bps": 2e8, "mean_xfer_s": 0.002},
        "file_bandwidth": {"write_read_Bps": 3e9, "per_transfer_s": 0.01},
    }
    pair, bw, source, per = transfer_inputs(nixl_run, None)
    assert (pair.conn.name, bw, per) == ("nixl", 2e8, 0.002) and "NIXL" in source
    pair, bw, source, per = transfer_inputs({**nixl_run, "connector": "ExampleConnector"}, None)
    assert (pair.conn.name, bw, per) == ("example", 3e9, 0.01) and source == "file write+read probe"
    with pytest.raises(PDReplayError, match="the replay knows ExampleConnector, NixlConnector"):
        transfer_inputs({"connector": "MooncakeConnector"}, None)
