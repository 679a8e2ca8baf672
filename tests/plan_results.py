"""Shared by the artefact tests (tests/test_plan_artefacts*.py, test_plan_layouts.py): screen-only plans (one
run per process), the Kubernetes client round trip, SGLang's documented flags, and the script that parses
`vllm serve` lines with vLLM's own parser."""

from __future__ import annotations

import functools
import json

import pytest

from simulator.plan import parse_plan_request, run_plan
from tests.test_plan import _vl_request


@functools.cache
def screen_plan(connector: str = "nixl", link: str = "roce-400"):
    """A screen-only plan (no simulation needed for artefacts) over NVIDIA and AMD GPUs."""
    req = parse_plan_request(
        {
            "name": "Art Test",
            "model": "Llama-3.1-8B",
            "workload": {
                "arrival": {"kind": "poisson", "rate": 6.0},
                "input_length": {"kind": "fixed", "value": 2000},
                "output_length": {"kind": "fixed", "value": 200},
                "num_requests": 200,
            },
            "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
            "gpus": [{"name": "H100"}, {"name": "H200"}, {"name": "MI300X"}],
            "fabrics": {"connector": connector, "links": [link]},
            "constraints": {"max_gpus": 8, "max_instances_per_pool": 3, "tp": [1, 2]},
            "search": {"verify": 0, "borderline": 0, "verify_front": 0},
        }
    )
    return run_plan(req, workers=1)


@functools.cache
def vl_screen_plan():
    """A screen-only multimodal plan: its EPD candidates carry an encoder pool."""
    req = parse_plan_request(_vl_request(search={"verify": 0, "borderline": 0, "verify_front": 0}))
    return run_plan(req, workers=1)


def epd_id(res) -> str:
    return next(c for c in res.candidates["id"] if c.startswith("epd-") and not c.endswith("invalid"))


def pick(res, family: str, hetero: bool = False, gpu: str = "H") -> str:
    df = res.candidates[
        (res.candidates["family"] == family)
        & (res.candidates["rejected_reason"].str.startswith(("memory", "kv-transfer")).eq(False))
    ]
    for r in df.itertuples():
        c = res.candidate(r.id)
        gpus = {p.gpu for p in c.pools}
        if (len(gpus) > 1) == hetero and all(g.startswith(gpu) for g in gpus) and max(p.tp for p in c.pools) == 2:
            return r.id
    raise AssertionError(f"no {family} candidate to test")


def k8s_roundtrip(doc: dict) -> dict:
    """Deserialize into the client's typed model (required fields enforced, values typed) and back.
    Fields the schema does not know are dropped on the way, so equality means every field is known."""
    kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client (test extra) is not installed")
    api = kubernetes.client.ApiClient()

    kind = {
        "Deployment": "V1Deployment",
        "StatefulSet": "V1StatefulSet",
        "Service": "V1Service",
        "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    }[doc["kind"]]
    try:
        obj = api.deserialize(json.dumps(doc), kind, "application/json")  # client >= 35
    except TypeError:  # older: a response object

        class Response:
            data = json.dumps(doc)

        obj = api.deserialize(Response(), kind)
    return api.sanitize_for_serialization(obj)


# SGLang is not installable here (CUDA-only wheels), so its commands are checked against its documented
# flags: docs/advanced_features/server_arguments.md, pd_disaggregation.md and epd_disaggregation.md of
# sgl-project/sglang, with the documented choices of the flags that have them.
SGLANG_FLAGS = {
    "--model-path": None,
    "--host": None,
    "--port": None,
    "--tp-size": None,
    "--dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"},
    "--context-length": None,
    "--max-running-requests": None,
    "--chunked-prefill-size": None,
    "--mem-fraction-static": None,
    "--kv-cache-dtype": {"auto", "fp8_e5m2", "fp8_e4m3"},
    "--disaggregation-mode": {"null", "prefill", "decode"},
    "--disaggregation-transfer-backend": {"mooncake", "nixl", "ascend", "fake"},
    "--disaggregation-bootstrap-port": None,
    "--disaggregation-ib-device": None,
    "--encoder-only": None,
    "--language-only": None,
    "--encoder-urls": None,
    "--dp-size": None,
    "--enable-dp-attention": None,
    "--ep-size": None,
    "--encoder-transfer-backend": {"zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"},
}


def check_sglang(argv):
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags)) and set(flags) <= set(SGLANG_FLAGS), set(flags) - set(SGLANG_FLAGS)
    for f in flags:
        if SGLANG_FLAGS[f]:
            assert argv[argv.index(f) + 1] in SGLANG_FLAGS[f], (f, argv[argv.index(f) + 1])
    assert argv[argv.index("--port") + 1] == "30000"


VLLM_PARSE_CHECK = """
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
    out.append({"ec": None if ec is None else [ec.ec_connector, ec.ec_role], "encoder_only": ea.mm_encoder_only,
                "model": ns.model_tag, "tp": ea.tensor_parallel_size,
                "dp": ea.data_parallel_size, "ep": ea.enable_expert_parallel, "max_num_seqs": ea.max_num_seqs,
                "max_num_batched_tokens": ea.max_num_batched_tokens, "max_model_len": ea.max_model_len,
                "block_size": ea.block_size, "gpu_memory_utilization": ea.gpu_memory_utilization,
                "kv": None if kv is None else [kv.kv_connector, kv.kv_role],
                "kv_extra": None if kv is None else [kv.kv_port, kv.kv_connector_extra_config],
                "registered": None if kv is None else kv.kv_connector in KVConnectorFactory._registry})
print(json.dumps(out))
"""
