"""Artefact folders a cluster accepts, beyond the vLLM pools (tests/test_plan_artefacts.py): SGLang pools and
router as Kubernetes objects, probes on every proxy and router, EFA device requests on AWS layouts, and
every example plan's folder through the validators (the Kubernetes client's models; vLLM's own parser
where a Python with vLLM is installed; SGLang's documented flags, since SGLang does not install here)."""

from __future__ import annotations

import functools
import json
import shlex
import subprocess

import pytest
import yaml

try:
    import kubernetes_validate
except ImportError:  # optional: the round trip through the client's models still runs
    kubernetes_validate = None

from simulator.plan import artefacts, parse_plan_request, run_plan
from tests.conftest import REPO, VLLM_PY, needs_vllm
from tests.plan_results import VLLM_PARSE_CHECK, check_sglang, epd_id, k8s_roundtrip, pick, screen_plan, vl_screen_plan

EXAMPLES = sorted((REPO / "examples").glob("plan_*.yaml"))


# The oldest Kubernetes release still in vendor support when this was written; the objects use nothing newer.
K8S_VERSION = "1.30"


def _load(files, name):
    """The objects of one manifest, each through the official client's models (round trip) and, where
    ``kubernetes-validate`` is installed (the test extra), the API server's OpenAPI schema, strictly."""
    docs = list(yaml.safe_load_all(files[name]))
    for doc in docs:
        assert k8s_roundtrip(doc) == doc, (name, doc["kind"], doc["metadata"]["name"])
        if kubernetes_validate is not None:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return docs


def _role(doc):
    return doc["metadata"]["labels"].get("epdsim/role")


@pytest.mark.parametrize(
    "family, hetero, gpu, connector, link",
    [
        ("colocated", False, "H", "nixl", "roce-400"),
        ("pd", True, "H", "nixl", "roce-400"),
        ("pd", False, "MI", "mooncake", "roce-400"),
        ("pd", True, "H", "mooncake", "tcp-25gbe"),
        ("epd", False, "H", "nixl", None),
    ],
)
def test_sglang_manifests_match_the_api_schema_and_the_sglang_scripts(family, hetero, gpu, connector, link):
    res = vl_screen_plan() if family == "epd" else screen_plan(connector, link)
    cid = epd_id(res) if family == "epd" else pick(res, family, hetero, gpu)
    cand = res.candidate(cid)
    files = artefacts(res, cid)
    sg, vl = _load(files, "k8s/sglang.yaml"), _load(files, "k8s/deployment.yaml")
    assert sg[0]["kind"] == "PersistentVolumeClaim" and sg[0] == vl[0]
    # the same Service names as the vLLM file: the scripts' URLs resolve whichever file is applied
    assert {d["metadata"]["name"] for d in sg if d["kind"] == "Service"} - {d["metadata"]["name"] for d in vl} == set()
    pools = [d for d in sg if d["kind"] == "Deployment" and _role(d) != "proxy"]
    services = {d["metadata"]["name"]: d for d in sg if d["kind"] == "Service"}
    assert [_role(d) for d in pools] == [p.role for p in cand.pools]
    for pool, dep in zip(cand.pools, pools, strict=True):
        ctr = dep["spec"]["template"]["spec"]["containers"][0]
        assert dep["spec"]["replicas"] == pool.instances
        assert ctr["image"].startswith("rocm/sgl-dev:" if gpu == "MI" else "lmsysorg/sglang:")
        script = shlex.split(files[f"sglang/{pool.role if pool.role != 'colocated' else 'main'}.sh"].splitlines()[-1])
        check_sglang(script)
        assert ctr["command"] == ["python3", "-m", "sglang.launch_server"] and ctr["args"] == script[3:]
        assert ctr["resources"]["limits"]["amd.com/gpu" if gpu == "MI" else "nvidia.com/gpu"] == str(pool.tp)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert ctr[probe]["httpGet"] == {"path": "/health", "port": 30000}
        sp = ctr["startupProbe"]
        assert sp["periodSeconds"] * (sp["failureThreshold"] - 1) >= float(
            dep["metadata"]["annotations"]["epdsim/modelled-start-s"]
        )
        assert not any(e["name"].startswith("VLLM_") for e in ctr.get("env", []))
        ports = {p["port"] for p in services[dep["metadata"]["name"]]["spec"]["ports"]}
        assert ports == ({30000, 8998} if pool.role == "prefill" else {30000})
        tcp = link is not None and link.startswith("tcp")
        assert any(k.startswith("rdma/") for k in ctr["resources"]["limits"]) == (family == "pd" and not tcp)
    routers = [d for d in sg if _role(d) == "proxy"]
    if family != "pd":
        assert routers == []
        return
    dep, svc = routers
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    router_sh = shlex.split(files["sglang/router.sh"].splitlines()[-1])
    assert ctr["command"] == ["python3", "-m", "sglang_router.launch_router"] and ctr["args"] == router_sh[3:]
    assert {p["port"] for p in svc["spec"]["ports"]} == {8000}
    prefill = ctr["args"][ctr["args"].index("--prefill") + 1].split("//")[1].split(":")[0]
    assert prefill in services and 8998 in {p["port"] for p in services[prefill]["spec"]["ports"]}


@pytest.mark.parametrize(
    "kind, connector, link",
    [
        ("toy", "nixl", "roce-400"),
        ("p2pnccl", "p2pnccl", "ib-ndr"),
        ("epd", None, None),
        ("sglang", "nixl", "roce-400"),
    ],
)
def test_every_proxy_and_router_has_startup_readiness_and_liveness_probes(kind, connector, link):
    res = vl_screen_plan() if kind == "epd" else screen_plan(connector, link)
    files = artefacts(res, epd_id(res) if kind == "epd" else pick(res, "pd", True))
    docs = _load(files, "k8s/sglang.yaml" if kind == "sglang" else "k8s/deployment.yaml")
    dep = next(d for d in docs if d["kind"] == "Deployment" and _role(d) == "proxy")
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    names = {p["name"] for p in ctr["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ctr[probe]["tcpSocket"]["port"] in names, probe
    budget = ctr["startupProbe"]["periodSeconds"] * (ctr["startupProbe"]["failureThreshold"] - 1)
    # the vLLM proxies install and download their script before they listen: five minutes for that
    assert budget >= (120 if kind == "sglang" else 300)
    if kind == "p2pnccl":
        # the proxy script comes from the same vLLM release as the pinned P2pNccl image of the pools
        pools = [d for d in docs if d["kind"] == "Deployment" and _role(d) != "proxy"]
        tag = pools[0]["spec"]["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
        assert f"/vllm-project/vllm/{tag}/examples/" in ctr["args"][0] and tag == "v0.10.1"


def test_an_aws_p5_plan_requests_four_efa_devices_per_gpu():
    res = screen_plan("nixl", "aws-p5")
    cid = next(c for c in res.candidates["id"] if c.startswith("pd-H100-SXM-80GB-tp2-H100-SXM-80GB-tp2-aws-p5-"))
    files = artefacts(res, cid)
    for name in ("k8s/deployment.yaml", "k8s/sglang.yaml"):
        pools = [d for d in _load(files, name) if d["kind"] == "Deployment" and _role(d) != "proxy"]
        for dep in pools:
            limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert limits["vpc.amazonaws.com/efa"] == "8" and "rdma/ib" not in limits  # TP2 x 4 cards
    assert "vpc.amazonaws.com/efa" in files["README.md"] and "p5.48xlarge" in files["README.md"]


@functools.cache
def _example_folders() -> list[tuple[str, str, dict]]:
    """(example, candidate id, files) for each example plan's cheapest screen-accepted candidate of every
    family it has (the screen alone: what the recommendation's family would deploy)."""
    out = []
    for path in EXAMPLES:
        data = yaml.safe_load(path.read_text())
        data["search"] = {**data.get("search", {}), "verify": 0, "borderline": 0, "verify_front": 0}
        res = run_plan(parse_plan_request(data), workers=1)
        df = res.candidates[res.candidates["est_meets_slo"]].sort_values("cost_usd_per_hour")
        for _family, rows in df.groupby("family"):
            out.append((path.name, rows["id"].iloc[0], artefacts(res, rows["id"].iloc[0])))
    return out


def test_schema_validator_refuses_a_wrong_value_type():
    """The schema check is strict: a Service port given as a string is refused, naming the field."""
    if kubernetes_validate is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[test]')")
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": "80"}]}}
    with pytest.raises(kubernetes_validate.ValidationError, match="not of type 'integer'"):
        kubernetes_validate.validate(svc, K8S_VERSION, strict=True)


def test_every_example_plan_folder_passes_the_kubernetes_and_sglang_validators():
    folders = _example_folders()
    assert {e for e, _, _ in folders} == {p.name for p in EXAMPLES}
    assert {c.split("-")[0] for _, c, _ in folders} >= {"colocated", "pd", "epd"}
    for example, cid, files in folders:
        family = cid.split("-")[0]
        for name in ("k8s/deployment.yaml", "k8s/sglang.yaml"):
            docs = _load(files, name)
            assert any(d["kind"] == "Deployment" for d in docs), (example, cid, name)
            # vLLM: PD and EPD carry their proxy; SGLang: PD its router (EPD enters at the language model)
            has_pd = "sglang/prefill.sh" in files
            routed = has_pd or (family == "epd" and name == "k8s/deployment.yaml")
            proxies = [d["kind"] for d in docs if _role(d) == "proxy"]
            assert proxies == (["Deployment", "Service"] if routed else []), (example, cid, name)
        for path, text in files.items():
            if path.startswith("sglang/") and path != "sglang/router.sh":
                check_sglang(shlex.split(text.splitlines()[-1]))
        assert "kubectl -n epdsim apply -f k8s/deployment.yaml" in files["README.md"]


@needs_vllm
def test_every_example_plan_folder_passes_vllms_own_parser():
    cases = [
        (example, path, shlex.split(text.splitlines()[-1])[1:])
        for example, _, files in _example_folders()
        for path, text in files.items()
        if path.startswith("vllm/")
    ]
    assert cases
    r = subprocess.run(
        [VLLM_PY, "-c", VLLM_PARSE_CHECK],
        input=json.dumps([a for _, _, a in cases]),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(parsed) == len(cases)
    for (example, path, argv), got in zip(cases, parsed, strict=True):
        assert got["tp"] == int(argv[argv.index("--tensor-parallel-size") + 1]), (example, path)
        if got["kv"] is not None:
            assert got["registered"] is True, (example, path, got["kv"])
