"""Deployable artefacts: Kubernetes YAML checked against the Kubernetes API schema (the official client's
model classes), vLLM command lines parsed by vLLM's own `vllm serve` parser, router configuration."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest
import yaml

from simulator.plan import artefacts
from simulator.plan.manifests import ArtefactOptions
from tests.plan_results import check_sglang, epd_id, k8s_roundtrip, pick, screen_plan, vl_screen_plan


def _docs(files):
    docs = list(yaml.safe_load_all(files["k8s/deployment.yaml"]))
    pools = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["labels"]["epdsim/role"] != "proxy"
    ]
    proxy = [d for d in docs if d["metadata"].get("labels", {}).get("epdsim/role") == "proxy"]
    return docs, pools, proxy


@pytest.mark.parametrize(
    "family, hetero, gpu, connector, link",
    [
        ("colocated", False, "H", "nixl", "roce-400"),
        ("pd", True, "H", "nixl", "roce-400"),
        ("pd", False, "MI", "nixl", "roce-400"),
        ("pd", True, "H", "p2pnccl", "ib-ndr"),
        ("pd", True, "H", "mooncake", "roce-400"),
        ("pd", True, "H", "nixl", "tcp-25gbe"),
        ("pd", False, "H", "p2pnccl", "tcp-100gbe"),
        ("pd", False, "H", "tcp", "cloud-vpc"),
        ("epd", False, "H", "nixl", None),
    ],
)
def test_kubernetes_manifests_parse_and_match_the_api_schema(family, hetero, gpu, connector, link):
    res = vl_screen_plan() if family == "epd" else screen_plan(connector, link)
    cid = epd_id(res) if family == "epd" else pick(res, family, hetero, gpu)
    cand = res.candidate(cid)
    files = artefacts(res, cid)
    docs, deps, proxy = _docs(files)
    assert docs[0]["kind"] == "PersistentVolumeClaim"
    for doc in docs:
        assert k8s_roundtrip(doc) == doc
    assert len(deps) == len(cand.pools)
    # a PD or EPD plan carries its proxy: a Deployment and the Service clients talk to
    assert [d["kind"] for d in proxy] == ([] if family == "colocated" else ["Deployment", "Service"])
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    tcp = link is not None and link.startswith(("tcp", "cloud"))
    for pool, dep in zip(cand.pools, deps, strict=True):
        spec = dep["spec"]
        svc = services[dep["metadata"]["name"]]
        assert spec["replicas"] == pool.instances
        assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"] == svc["spec"]["selector"]
        ctr = spec["template"]["spec"]["containers"][0]
        resource = "amd.com/gpu" if gpu == "MI" else "nvidia.com/gpu"
        assert ctr["image"].startswith("rocm/" if gpu == "MI" else "vllm/vllm-openai")
        if family == "pd" and connector == "p2pnccl":
            assert ctr["image"] != "vllm/vllm-openai:v0.32.0"
        limits = ctr["resources"]["limits"]
        assert limits[resource] == str(pool.tp)
        # RDMA fabrics: the NIC device-plugin resource; TCP fabrics: none
        assert ("rdma/ib" in limits) == (family == "pd" and not tcp)
        # the startup probe tolerates the modelled cold start (with its margin)
        sp = ctr["startupProbe"]
        modelled = float(dep["metadata"]["annotations"]["epdsim/modelled-start-s"])
        assert sp["periodSeconds"] * (sp["failureThreshold"] - 1) >= modelled
        # the container runs exactly the vllm serve line of the pool's script
        role = pool.role if pool.role != "colocated" else "main"
        script = files[f"vllm/{role}.sh"].splitlines()[-1]
        assert shlex.split(script) == ctr["command"] + ctr["args"]
        assert ctr["args"][ctr["args"].index("--tensor-parallel-size") + 1] == str(pool.tp)
        assert ("--mm-encoder-only" in ctr["args"]) == (pool.role == "encoder")
        env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
        if family == "pd" and connector in ("nixl", "tcp"):
            assert env["UCX_TLS"] == ("tcp,cuda_copy" if tcp else "all") and "UCX_NET_DEVICES" in env
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        if family == "pd" and connector == "p2pnccl" and tcp:
            assert env["NCCL_IB_DISABLE"] == "1"
    readme = files["README.md"]
    assert "kubectl -n epdsim apply -f k8s/deployment.yaml" in readme and "storageClassName" in readme
    assert ("TCP fabric" in readme) == tcp


def test_p2pnccl_config_has_the_fields_of_vllms_example_and_a_proxy_to_register_with():
    """docs/design/p2p_nccl_connector.md: kv_buffer_size, kv_port and kv_connector_extra_config
    {proxy_ip, proxy_port, http_port (= --port)}; the proxy serves 10001 and takes registrations on 30001."""
    res = screen_plan("p2pnccl", "ib-ndr")
    files = artefacts(res, pick(res, "pd", True))
    _, _, proxy = _docs(files)
    dep, svc = proxy
    assert {p["port"] for p in svc["spec"]["ports"]} == {10001, 30001}
    assert "disagg_proxy_p2p_nccl_xpyd.py" in dep["spec"]["template"]["spec"]["containers"][0]["args"][0]
    for role in ("prefill", "decode"):
        argv = shlex.split(files[f"vllm/{role}.sh"].splitlines()[-1])
        kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert set(kv) == {"kv_connector", "kv_role", "kv_buffer_size", "kv_port", "kv_connector_extra_config"}
        extra = kv["kv_connector_extra_config"]
        assert extra["proxy_ip"] == svc["metadata"]["name"] and extra["proxy_port"] == "30001"
        assert extra["http_port"] == argv[argv.index("--port") + 1]
        assert float(kv["kv_buffer_size"]) == (10 if role == "prefill" else 1e9)


_MOONCAKE_PROXY = "/vllm-project/vllm/v0.32.0/examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py"


@pytest.mark.parametrize("link", ["roce-400", "tcp-25gbe"])
def test_mooncake_plans_run_vllms_mooncake_proxy_with_each_prefill_pods_bootstrap_port(link):
    """vLLM 0.32's MooncakeConnector needs a transfer_id (prefill skips the send without one) and, on decode,
    the prefill's bootstrap address and engine id: its own proxy (examples/disaggregated/mooncake_connector)
    sends them, given --prefill URL BOOTSTRAP_PORT per prefill instance and --decode URL.  The proxy pins one
    engine id per prefill address, so each prefill pod is addressed on its own: a StatefulSet behind a
    headless Service, pods <svc>-<i>.<svc>; the bootstrap port 8998 is open on the pod and its Service."""
    res = screen_plan("mooncake", link)
    cid = next(
        c
        for c in res.candidates["id"]
        if c.startswith("pd-") and c.endswith("-2p1d") and "MI300X" not in c and f"-{link}-" in c
    )
    cand = res.candidate(cid)
    files = artefacts(res, cid)
    docs, pools, proxy = _docs(files)
    for doc in docs:
        assert k8s_roundtrip(doc) == doc
    by_role = {d["metadata"]["labels"]["epdsim/role"]: d for d in pools}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    pre, dec = by_role["prefill"], by_role["decode"]
    name = pre["metadata"]["name"]
    assert pre["kind"] == "StatefulSet" and dec["kind"] == "Deployment"
    assert pre["spec"]["serviceName"] == name and pre["spec"]["podManagementPolicy"] == "Parallel"
    assert pre["spec"]["replicas"] == cand.pool("prefill").instances == 2
    assert services[name]["spec"]["clusterIP"] == "None"  # headless: DNS per pod
    assert "clusterIP" not in services[dec["metadata"]["name"]]["spec"]
    ctr = pre["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "bootstrap", "containerPort": 8998, "protocol": "TCP"} in ctr["ports"]
    assert {"name": "bootstrap", "port": 8998, "targetPort": "bootstrap", "protocol": "TCP"} in services[name]["spec"][
        "ports"
    ]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998"
    dctr = dec["spec"]["template"]["spec"]["containers"][0]
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in {e["name"] for e in dctr["env"]}
    assert all(p["name"] != "bootstrap" for p in dctr["ports"])
    tcp = link.startswith("tcp")
    for c, role in ((ctr, "prefill"), (dctr, "decode")):
        kv = json.loads(c["args"][c["args"].index("--kv-transfer-config") + 1])
        want = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
        if tcp:
            want["kv_connector_extra_config"] = {"mooncake_protocol": "tcp"}
        assert kv == want
        assert ({e["name"]: e.get("value") for e in c["env"]}.get("MC_FORCE_TCP") == "1") == tcp
    # the proxy: vLLM's Mooncake proxy (not the NIXL toy proxy), one --prefill per pod with its bootstrap port
    dep, svc = proxy
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert _MOONCAKE_PROXY in cmd and "toy_proxy_server" not in cmd
    argv = shlex.split(cmd.split("&& exec ", 1)[1])
    assert argv[:6] == ["python3", "/tmp/proxy.py", "--host", "0.0.0.0", "--port", "8000"]
    prefills = [argv[i + 1 : i + 3] for i, a in enumerate(argv) if a == "--prefill"]
    assert prefills == [[f"http://{name}-{i}.{name}:8000", "8998"] for i in range(2)]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"] == [f"http://{dec['metadata']['name']}:8000"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {8000}
    router = yaml.safe_load(files["router.yaml"])
    assert router["proxy"]["kind"] == "mooncake"
    assert next(p for p in router["pools"] if p["role"] == "prefill")["pods"] == [u for u, _ in prefills]
    readme = files["README.md"]
    assert "mooncake_connector_proxy.py" in readme and "StatefulSet behind a headless Service" in readme


def test_mooncake_proxy_arguments_parse_with_the_proxy_scripts_own_flags():
    """The proxy's argv against the flags of vLLM's Mooncake proxy (--host, --port, --prefill URL [PORT]
    appended, --decode URL appended), rebuilt here with argparse as the script declares them."""
    res = screen_plan("mooncake", "roce-400")
    cid = next(c for c in res.candidates["id"] if c.startswith("pd-") and c.endswith("-2p1d") and "MI300X" not in c)
    _, _, proxy = _docs(artefacts(res, cid))
    cmd = proxy[0]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    argv = shlex.split(cmd.split("&& exec ", 1)[1])[2:]
    ap = argparse.ArgumentParser(exit_on_error=False)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", type=str, default="127.0.0.1")
    ap.add_argument("--prefill", nargs="+", action="append", dest="prefill_raw")
    ap.add_argument("--decode", nargs=1, action="append", dest="decode_raw")
    ns = ap.parse_args(argv)
    assert ns.host == "0.0.0.0" and ns.port == 8000
    assert all(len(p) == 2 and int(p[1]) == 8998 for p in ns.prefill_raw) and len(ns.prefill_raw) == 2
    assert len(ns.decode_raw) == 1


def test_router_config_points_at_the_services():
    res = screen_plan()
    cid = pick(res, "pd", True)
    files = artefacts(res, cid)
    router = yaml.safe_load(files["router.yaml"])
    docs, _, proxy = _docs(files)
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"} - {proxy[1]["metadata"]["name"]}
    assert router["mode"] == "pd" and {p["role"] for p in router["pools"]} == {"prefill", "decode"}
    assert {p["service"].split("//")[1].split(":")[0] for p in router["pools"]} == services
    assert router["kv_transfer"]["connector"] == "NixlConnector"
    assert router["proxy"]["service"].split("//")[1].split(":")[0] == proxy[1]["metadata"]["name"]
    args = proxy[0]["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert "toy_proxy_server.py" in args and all(s in args for s in services)
    for name in services:
        assert len(name) <= 63 and name == name.lower() and " " not in name


def test_options_set_rdma_resource_host_network_and_registry():
    res = screen_plan()
    opts = ArtefactOptions(
        rdma_resource="nvidia.com/hostdev",
        host_network=True,
        registry="reg.example.com/mirror",
        storage_class="nfs-rwx",
    )
    files = artefacts(res, pick(res, "pd", True), opts)
    docs, deps, _ = _docs(files)
    assert docs[0]["spec"]["storageClassName"] == "nfs-rwx"
    for dep in deps:
        pod = dep["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        ctr = pod["containers"][0]
        assert ctr["resources"]["limits"]["nvidia.com/hostdev"] == "1"
        assert ctr["image"].startswith("reg.example.com/mirror/")
        assert k8s_roundtrip(dep) == dep


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
def test_sglang_commands_use_documented_flags_and_ports(connector):
    res = screen_plan(connector)
    files = artefacts(res, pick(res, "pd", True))
    for role in ("prefill", "decode"):
        argv = shlex.split(files[f"sglang/{role}.sh"].splitlines()[-1])
        check_sglang(argv)
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == connector
    router = shlex.split(files["sglang/router.sh"].splitlines()[-1])
    assert router[:4] == ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    pre, dec = (
        router[router.index("--prefill") + 1 : router.index("--prefill") + 3],
        router[router.index("--decode") + 1],
    )
    assert pre[0].endswith(":30000") and pre[1] == "8998" and dec.endswith(":30000")


def test_sglang_epd_has_an_encoder_server_and_a_language_only_server_pointing_at_it():
    vl = vl_screen_plan()
    cand = vl.candidate(epd_id(vl))
    files = artefacts(vl, cand.id)
    enc = shlex.split(files["sglang/encoder.sh"].splitlines()[-1])
    check_sglang(enc)
    assert "--encoder-only" in enc
    lm = next(p for p in cand.pools if p.role in ("colocated", "prefill"))
    argv = shlex.split(files[f"sglang/{'main' if lm.role == 'colocated' else 'prefill'}.sh"].splitlines()[-1])
    check_sglang(argv)
    assert "--language-only" in argv and argv[argv.index("--encoder-urls") + 1].endswith(":30000")
    _, _, proxy = _docs(files)
    assert "disagg_epd_proxy.py" in proxy[0]["spec"]["template"]["spec"]["containers"][0]["args"][0]


def test_artefacts_without_a_recommendation_say_how_to_get_them():
    res = screen_plan()
    assert res.recommended is None  # nothing was simulated
    with pytest.raises(ValueError, match="candidate_id"):
        artefacts(res)
