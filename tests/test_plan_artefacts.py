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
def _plan(connector: str = "nixl"):
    """A screen-only plan (no simulation needed for artefacts) over NVIDIA and AMD GPUs."""
    req = parse_plan_request({
        "name": "Art Test", "model": "Llama-3.1-8B",
        "workload": {"arrival": {"kind": "poisson", "rate": 6.0},
                     "input_length": {"kind": "fixed", "value": 2000}, "output_length": {"kind": "fixed", "value": 200},
                     "num_requests": 200},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
        "gpus": [{"name": "H100"}, {"name": "H200"}, {"name": "MI300X"}],
        "fabrics": {"connector": connector, "links": ["roce-400"]},
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

    kind = {"Deployment": "V1Deployment", "Service": "V1Service"}[doc["kind"]]
    try:
        obj = api.deserialize(json.dumps(doc), kind, "application/json")      # client >= 35
    except TypeError:                                                        # older: a response object

        class Response:
            data = json.dumps(doc)

        obj = api.deserialize(Response(), kind)
    return api.sanitize_for_serialization(obj)


@pytest.mark.parametrize("family, hetero, gpu", [("colocated", False, "H"), ("pd", True, "H"), ("pd", False, "MI"),
                                                 ("epd", False, "H")])
def test_kubernetes_manifests_parse_and_match_the_api_schema(family, hetero, gpu):
    res = _vl_plan() if family == "epd" else _plan()
    cid = _epd_id(res) if family == "epd" else _pick(res, family, hetero, gpu)
    cand = res.candidate(cid)
    files = artefacts(res, cid)
    docs = list(yaml.safe_load_all(files["k8s/deployment.yaml"]))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"] * len(cand.pools)
    for doc in docs:
        assert _k8s_roundtrip(doc) == doc
    for pool, (dep, svc) in zip(cand.pools, zip(docs[::2], docs[1::2])):
        spec = dep["spec"]
        assert spec["replicas"] == pool.instances
        assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"] == svc["spec"]["selector"]
        ctr = spec["template"]["spec"]["containers"][0]
        resource = "amd.com/gpu" if gpu == "MI" else "nvidia.com/gpu"
        assert ctr["resources"]["limits"] == {resource: str(pool.tp)}
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


def test_router_config_points_at_the_services():
    res = _plan()
    cid = _pick(res, "pd", True)
    files = artefacts(res, cid)
    router = yaml.safe_load(files["router.yaml"])
    services = {d["metadata"]["name"] for d in yaml.safe_load_all(files["k8s/deployment.yaml"]) if d["kind"] == "Service"}
    assert router["mode"] == "pd" and {p["role"] for p in router["pools"]} == {"prefill", "decode"}
    assert {p["service"].split("//")[1].split(":")[0] for p in router["pools"]} == services
    assert router["kv_transfer"]["connector"] == "NixlConnector"
    for name in services:
        assert len(name) <= 63 and name == name.lower() and " " not in name


def test_sglang_commands_name_the_disaggregation_role():
    res = _plan("mooncake")
    files = artefacts(res, _pick(res, "pd", True))
    for role in ("prefill", "decode"):
        argv = shlex.split(files[f"sglang/{role}.sh"].splitlines()[-1])
        assert argv[:3] == ["python", "-m", "sglang.launch_server"]
        flags = [a for a in argv if a.startswith("--")]
        assert len(flags) == len(set(flags))
        assert argv[argv.index("--disaggregation-mode") + 1] == role
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "mooncake"


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
                "kv": None if kv is None else [kv.kv_connector, kv.kv_role]})
print(json.dumps(out))
"""


@needs_vllm
def test_vllm_command_lines_parse_with_vllms_own_parser():
    cases = []
    for connector in ("nixl", "mooncake"):
        res = _plan(connector)
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
        elif connector == "nixl":
            assert got["kv"] == ["NixlConnector", "kv_both"]
        else:
            assert got["kv"] == ["MooncakeConnector", "kv_producer" if pool.role == "prefill" else "kv_consumer"]
