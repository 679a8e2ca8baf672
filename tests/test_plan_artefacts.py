"""Deployable artefacts: Kubernetes YAML checked against the Kubernetes API schema (the official client's
model classes), vLLM command lines parsed by vLLM's own `vllm serve` parser, router configuration."""
from __future__ import annotations

import functools
import json
import shlex
import subprocess

import pytest
import yaml

from simulator.plan import artefacts, parse_plan_request, run_plan
from tests.conftest import REPO, VLLM_PY, needs_vllm


@functools.cache
def _plan(connector: str = "nixl", link: str = "roce-400"):
    """A screen-only plan (no simulation needed for artefacts) over NVIDIA and AMD GPUs."""
    req = parse_plan_request({
        "name": "Art Test", "model": "Llama-3.1-8B",
        "workload": {"arrival": {"kind": "poisson", "rate": 6.0},
                     "input_length": {"kind": "fixed", "value": 2000}, "output_length": {"kind": "fixed", "value": 200},
                     "num_requests": 200},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
        "gpus": [{"name": "H100"}, {"name": "H200"}, {"name": "MI300X"}],
        "fabrics": {"connector": connector, "links": [link]},
        "constraints": {"max_gpus": 8, "max_instances_per_pool": 3, "tp": [1, 2]},
        "search": {"verify": 0, "borderline": 0, "verify_front": 0}})
    return run_plan(req, workers=1)


@functools.cache
def _vl_plan():
    """A screen-only multimodal plan: its EPD candidates carry an encoder pool."""
    from tests.test_plan import _vl_request
    req = parse_plan_request(_vl_request(search={"verify": 0, "borderline": 0, "verify_front": 0}))
    return run_plan(req, workers=1)


def _epd_id(res) -> str:
    return next(c for c in res.candidates["id"] if c.startswith("epd-") and not c.endswith("invalid"))


def _pick(res, family: str, hetero: bool = False, gpu: str = "H") -> str:
    df = res.candidates[(res.candidates["family"] == family) & (res.candidates["rejected_reason"]
                                                                 .str.startswith(("memory", "kv-transfer")) == False)]  # noqa: E712
    for r in df.itertuples():
        c = res.candidate(r.id)
        gpus = {p.gpu for p in c.pools}
        if (len(gpus) > 1) == hetero and all(g.startswith(gpu) for g in gpus) and max(p.tp for p in c.pools) == 2:
            return r.id
    raise AssertionError(f"no {family} candidate to test")


def _k8s_roundtrip(doc: dict) -> dict:
    """Deserialize into the client's typed model (required fields enforced, values typed) and back.
    Fields the schema does not know are dropped on the way, so equality means every field is known."""
    kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client (test extra) is not installed")
    api = kubernetes.client.ApiClient()

    kind = {"Deployment": "V1Deployment", "StatefulSet": "V1StatefulSet", "Service": "V1Service",
            "PersistentVolumeClaim": "V1PersistentVolumeClaim"}[doc["kind"]]
    try:
        obj = api.deserialize(json.dumps(doc), kind, "application/json")      # client >= 35
    except TypeError:                                                        # older: a response object

        class Response:
            data = json.dumps(doc)

        obj = api.deserialize(Response(), kind)
    return api.sanitize_for_serialization(obj)


def _docs(files):
    docs = list(yaml.safe_load_all(files["k8s/deployment.yaml"]))
    pools = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
             and d["metadata"]["labels"]["epdsim/role"] != "proxy"]
    proxy = [d for d in docs if d["metadata"].get("labels", {}).get("epdsim/role") == "proxy"]
    return docs, pools, proxy


@pytest.mark.parametrize("family, hetero, gpu, connector, link", [
    ("colocated", False, "H", "nixl", "roce-400"), ("pd", True, "H", "nixl", "roce-400"),
    ("pd", False, "MI", "nixl", "roce-400"), ("pd", True, "H", "p2pnccl", "ib-ndr"),
    ("pd", True, "H", "mooncake", "roce-400"), ("pd", True, "H", "nixl", "tcp-25gbe"),
    ("pd", False, "H", "p2pnccl", "tcp-100gbe"), ("pd", False, "H", "tcp", "cloud-vpc"),
    ("epd", False, "H", "nixl", None)])
def test_kubernetes_manifests_parse_and_match_the_api_schema(family, hetero, gpu, connector, link):
    res = _vl_plan() if family == "epd" else _plan(connector, link)
    cid = _epd_id(res) if family == "epd" else _pick(res, family, hetero, gpu)
    cand = res.candidate(cid)
    files = artefacts(res, cid)
    docs, deps, proxy = _docs(files)
    assert docs[0]["kind"] == "PersistentVolumeClaim"
    for doc in docs:
        assert _k8s_roundtrip(doc) == doc
    assert len(deps) == len(cand.pools)
    # a PD or EPD plan carries its proxy: a Deployment and the Service clients talk to
    assert [d["kind"] for d in proxy] == ([] if family == "colocated" else ["Deployment", "Service"])
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    tcp = link is not None and link.startswith(("tcp", "cloud"))
    for pool, dep in zip(cand.pools, deps):
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
    res = _plan("p2pnccl", "ib-ndr")
    files = artefacts(res, _pick(res, "pd", True))
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
    res = _plan("mooncake", link)
    cid = next(c for c in res.candidates["id"] if c.startswith("pd-") and c.endswith("-2p1d")
               and "MI300X" not in c and f"-{link}-" in c)
    cand = res.candidate(cid)
    files = artefacts(res, cid)
    docs, pools, proxy = _docs(files)
    for doc in docs:
        assert _k8s_roundtrip(doc) == doc
    by_role = {d["metadata"]["labels"]["epdsim/role"]: d for d in pools}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    pre, dec = by_role["prefill"], by_role["decode"]
    name = pre["metadata"]["name"]
    assert pre["kind"] == "StatefulSet" and dec["kind"] == "Deployment"
    assert pre["spec"]["serviceName"] == name and pre["spec"]["podManagementPolicy"] == "Parallel"
    assert pre["spec"]["replicas"] == cand.pool("prefill").instances == 2
    assert services[name]["spec"]["clusterIP"] == "None"                       # headless: DNS per pod
    assert "clusterIP" not in services[dec["metadata"]["name"]]["spec"]
    ctr = pre["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "bootstrap", "containerPort": 8998, "protocol": "TCP"} in ctr["ports"]
    assert {"name": "bootstrap", "port": 8998, "targetPort": "bootstrap", "protocol": "TCP"} in \
        services[name]["spec"]["ports"]
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
    prefills = [argv[i + 1:i + 3] for i, a in enumerate(argv) if a == "--prefill"]
    assert prefills == [[f"http://{name}-{i}.{name}:8000", "8998"] for i in range(2)]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"] == [
        f"http://{dec['metadata']['name']}:8000"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {8000}
    router = yaml.safe_load(files["router.yaml"])
    assert router["proxy"]["kind"] == "mooncake"
    assert next(p for p in router["pools"] if p["role"] == "prefill")["pods"] == [u for u, _ in prefills]
    readme = files["README.md"]
    assert "mooncake_connector_proxy.py" in readme and "StatefulSet behind a headless Service" in readme


def test_mooncake_proxy_arguments_parse_with_the_proxy_scripts_own_flags():
    """The proxy's argv against the flags of vLLM's Mooncake proxy (--host, --port, --prefill URL [PORT]
    appended, --decode URL appended), rebuilt here with argparse as the script declares them."""
    import argparse
    res = _plan("mooncake", "roce-400")
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
    res = _plan()
    cid = _pick(res, "pd", True)
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
    from simulator.plan.manifests import ArtefactOptions
    res = _plan()
    opts = ArtefactOptions(rdma_resource="nvidia.com/hostdev", host_network=True, registry="reg.example.com/mirror",
                           storage_class="nfs-rwx")
    files = artefacts(res, _pick(res, "pd", True), opts)
    docs, deps, _ = _docs(files)
    assert docs[0]["spec"]["storageClassName"] == "nfs-rwx"
    for dep in deps:
        pod = dep["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        ctr = pod["containers"][0]
        assert ctr["resources"]["limits"]["nvidia.com/hostdev"] == "1"
        assert ctr["image"].startswith("reg.example.com/mirror/")
        assert _k8s_roundtrip(dep) == dep


# SGLang is not installable here (CUDA-only wheels), so its commands are checked against its documented
# flags: docs/advanced_features/server_arguments.md, pd_disaggregation.md and epd_disaggregation.md of
# sgl-project/sglang, with the documented choices of the flags that have them.
_SGLANG_FLAGS = {
    "--model-path": None, "--host": None, "--port": None, "--tp-size": None,
    "--dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"}, "--context-length": None,
    "--max-running-requests": None, "--chunked-prefill-size": None, "--mem-fraction-static": None,
    "--kv-cache-dtype": {"auto", "fp8_e5m2", "fp8_e4m3"}, "--disaggregation-mode": {"null", "prefill", "decode"},
    "--disaggregation-transfer-backend": {"mooncake", "nixl", "ascend", "fake"},
    "--disaggregation-bootstrap-port": None, "--disaggregation-ib-device": None, "--encoder-only": None,
    "--language-only": None, "--encoder-urls": None, "--dp-size": None, "--enable-dp-attention": None,
    "--ep-size": None,
    "--encoder-transfer-backend": {"zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"}}


def _check_sglang(argv):
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags)) and set(flags) <= set(_SGLANG_FLAGS), set(flags) - set(_SGLANG_FLAGS)
    for f in flags:
        if _SGLANG_FLAGS[f]:
            assert argv[argv.index(f) + 1] in _SGLANG_FLAGS[f], (f, argv[argv.index(f) + 1])
    assert argv[argv.index("--port") + 1] == "30000"


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
def test_sglang_commands_use_documented_flags_and_ports(connector):
    res = _plan(connector)
    files = artefacts(res, _pick(res, "pd", True))
    for role in ("prefill", "decode"):
        argv = shlex.split(files[f"sglang/{role}.sh"].splitlines()[-1])
        _check_sglang(argv)
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == connector
    router = shlex.split(files["sglang/router.sh"].splitlines()[-1])
    assert router[:4] == ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    pre, dec = router[router.index("--prefill") + 1:router.index("--prefill") + 3], router[router.index("--decode") + 1]
    assert pre[0].endswith(":30000") and pre[1] == "8998" and dec.endswith(":30000")


def test_sglang_epd_has_an_encoder_server_and_a_language_only_server_pointing_at_it():
    vl = _vl_plan()
    cand = vl.candidate(_epd_id(vl))
    files = artefacts(vl, cand.id)
    enc = shlex.split(files["sglang/encoder.sh"].splitlines()[-1])
    _check_sglang(enc)
    assert "--encoder-only" in enc
    lm = next(p for p in cand.pools if p.role in ("colocated", "prefill"))
    argv = shlex.split(files[f"sglang/{'main' if lm.role == 'colocated' else 'prefill'}.sh"].splitlines()[-1])
    _check_sglang(argv)
    assert "--language-only" in argv and argv[argv.index("--encoder-urls") + 1].endswith(":30000")
    _, _, proxy = _docs(files)
    assert "disagg_epd_proxy.py" in proxy[0]["spec"]["template"]["spec"]["containers"][0]["args"][0]


def test_artefacts_without_a_recommendation_say_how_to_get_them():
    res = _plan()
    assert res.recommended is None          # nothing was simulated
    with pytest.raises(ValueError, match="candidate_id"):
        artefacts(res)


_CHECK = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
out = []
for argv in json.load(sys.stdin):
    top = FlexibleArgumentParser(prog="vllm")
    cmd = ServeSubcommand()
    cmd.subparser_init(top.add_subparsers(dest="subparser"))
    ns = top.parse_args(argv)
    cmd.validate(ns)
    ea = AsyncEngineArgs.from_cli_args(ns)
    kv = ea.kv_transfer_config
    ec = ea.ec_transfer_config
    out.append({"ec": None if ec is None else [ec.ec_connector, ec.ec_role], "encoder_only": ea.mm_encoder_only,"model": ns.model_tag, "tp": ea.tensor_parallel_size, "max_num_seqs": ea.max_num_seqs,
                "max_num_batched_tokens": ea.max_num_batched_tokens, "max_model_len": ea.max_model_len,
                "block_size": ea.block_size, "gpu_memory_utilization": ea.gpu_memory_utilization,
                "kv": None if kv is None else [kv.kv_connector, kv.kv_role],
                "kv_extra": None if kv is None else [kv.kv_port, kv.kv_connector_extra_config],
                "registered": None if kv is None else kv.kv_connector in KVConnectorFactory._registry})
print(json.dumps(out))
"""


@needs_vllm
def test_vllm_command_lines_parse_with_vllms_own_parser():
    cases = []
    for connector, link in (("nixl", "roce-400"), ("mooncake", "roce-400"), ("mooncake", "tcp-25gbe"),
                            ("tcp", "tcp-25gbe")):
        res = _plan(connector, link)
        for family, hetero in (("colocated", False), ("pd", True)):
            cand = res.candidate(_pick(res, family, hetero))
            files = artefacts(res, cand.id)
            for pool in cand.pools:
                role = pool.role if pool.role != "colocated" else "main"
                argv = shlex.split(files[f"vllm/{role}.sh"].splitlines()[-1])
                assert argv[:2] == ["vllm", "serve"]
                cases.append((connector, pool, argv[1:]))
    vl = _vl_plan()
    cand = vl.candidate(_epd_id(vl))
    files = artefacts(vl, cand.id)
    for pool in cand.pools:
        role = pool.role if pool.role != "colocated" else "main"
        cases.append(("epd", pool, shlex.split(files[f"vllm/{role}.sh"].splitlines()[-1])[1:]))
    r = subprocess.run([VLLM_PY, "-c", _CHECK], input=json.dumps([a for _, _, a in cases]), capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(parsed) == len(cases)
    for (connector, pool, argv), got in zip(cases, parsed):
        if connector == "epd":
            assert got["model"] == "Qwen/Qwen3-VL-30B-A3B-Instruct" and got["tp"] == pool.tp
            assert got["encoder_only"] == (pool.role == "encoder")
            assert got["ec"] == ["ECMooncakeConnector", "ec_producer" if pool.role == "encoder" else "ec_consumer"]
            continue
        assert got["ec"] is None and not got["encoder_only"]
        assert got["model"] == "meta-llama/Llama-3.1-8B"
        assert got["tp"] == pool.tp
        assert got["max_num_seqs"] == int(argv[argv.index("--max-num-seqs") + 1])
        assert got["max_num_batched_tokens"] == int(argv[argv.index("--max-num-batched-tokens") + 1])
        assert got["block_size"] == 16 and got["gpu_memory_utilization"] == pytest.approx(0.9)
        if pool.role == "colocated":
            assert got["kv"] is None
        elif connector in ("nixl", "tcp"):
            assert got["kv"] == ["NixlConnector", "kv_both"]
        else:
            assert got["kv"] == ["MooncakeConnector", "kv_producer" if pool.role == "prefill" else "kv_consumer"]
            # over TCP the Mooncake worker reads mooncake_protocol from kv_connector_extra_config (default rdma)
            tcp = '"mooncake_protocol":"tcp"' in argv[argv.index("--kv-transfer-config") + 1]
            assert got["kv_extra"][1] == ({"mooncake_protocol": "tcp"} if tcp else {})
        if got["kv"] is not None:
            assert got["registered"] is True


@needs_vllm
def test_p2pnccl_lines_follow_vllms_p2p_guide_which_vllm_032_no_longer_accepts():
    """The P2pNccl config is in the shape of vLLM's P2P NCCL guide (top-level kv_buffer_size, kv_port);
    vLLM 0.32's KVTransferConfig rejects kv_buffer_size and its registry has no P2pNcclConnector, which is
    why those pools pin an older image.  Checked here so that the pin is dropped if vLLM brings it back."""
    res = _plan("p2pnccl", "ib-ndr")
    files = artefacts(res, _pick(res, "pd", True))
    argv = shlex.split(files["vllm/decode.sh"].splitlines()[-1])[1:]
    r = subprocess.run([VLLM_PY, "-c", _CHECK], input=json.dumps([argv]), capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert r.returncode != 0 and "kv_buffer_size" in r.stderr, r.stderr[-2000:]
    without = argv[:argv.index("--kv-transfer-config") + 1] + [json.dumps(
        {k: v for k, v in json.loads(argv[argv.index("--kv-transfer-config") + 1]).items() if k != "kv_buffer_size"})]
    r = subprocess.run([VLLM_PY, "-c", _CHECK], input=json.dumps([without]), capture_output=True, text=True,
                       timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])[0]
    port, extra = got["kv_extra"]
    assert got["kv"] == ["P2pNcclConnector", "kv_consumer"] and port == 21001 and got["registered"] is False
    assert extra == {"proxy_ip": extra["proxy_ip"], "proxy_port": "30001", "http_port": "8000", "send_type": "PUT_ASYNC"}
