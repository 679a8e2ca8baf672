"""Deployable artefacts, vLLM side: the plans' `vllm serve` command lines parsed by vLLM's own parser
(in the vLLM CPU venv; skipped without it)."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from simulator.plan import artefacts
from tests.conftest import REPO, VLLM_PY, needs_vllm
from tests.plan_results import VLLM_PARSE_CHECK, epd_id, pick, screen_plan, vl_screen_plan


@needs_vllm
def test_vllm_command_lines_parse_with_vllms_own_parser():
    cases = []
    for connector, link in (
        ("nixl", "roce-400"),
        ("mooncake", "roce-400"),
        ("mooncake", "tcp-25gbe"),
        ("tcp", "tcp-25gbe"),
    ):
        res = screen_plan(connector, link)
        for family, hetero in (("colocated", False), ("pd", True)):
            cand = res.candidate(pick(res, family, hetero))
            files = artefacts(res, cand.id)
            for pool in cand.pools:
                role = pool.role if pool.role != "colocated" else "main"
                argv = shlex.split(files[f"vllm/{role}.sh"].splitlines()[-1])
                assert argv[:2] == ["vllm", "serve"]
                cases.append((connector, pool, argv[1:]))
    vl = vl_screen_plan()
    cand = vl.candidate(epd_id(vl))
    files = artefacts(vl, cand.id)
    for pool in cand.pools:
        role = pool.role if pool.role != "colocated" else "main"
        cases.append(("epd", pool, shlex.split(files[f"vllm/{role}.sh"].splitlines()[-1])[1:]))
    r = subprocess.run(
        [VLLM_PY, "-c", VLLM_PARSE_CHECK],
        input=json.dumps([a for _, _, a in cases]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(parsed) == len(cases)
    for (connector, pool, argv), got in zip(cases, parsed, strict=True):
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
    res = screen_plan("p2pnccl", "ib-ndr")
    files = artefacts(res, pick(res, "pd", True))
    argv = shlex.split(files["vllm/decode.sh"].splitlines()[-1])[1:]
    r = subprocess.run(
        [VLLM_PY, "-c", VLLM_PARSE_CHECK],
        input=json.dumps([argv]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode != 0 and "kv_buffer_size" in r.stderr, r.stderr[-2000:]
    without = argv[: argv.index("--kv-transfer-config") + 1] + [
        json.dumps(
            {k: v for k, v in json.loads(argv[argv.index("--kv-transfer-config") + 1]).items() if k != "kv_buffer_size"}
        )
    ]
    r = subprocess.run(
        [VLLM_PY, "-c", VLLM_PARSE_CHECK],
        input=json.dumps([without]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])[0]
    port, extra = got["kv_extra"]
    assert got["kv"] == ["P2pNcclConnector", "kv_consumer"] and port == 21001 and got["registered"] is False
    assert extra == {
        "proxy_ip": extra["proxy_ip"],
        "proxy_port": "30001",
        "http_port": "8000",
        "send_type": "PUT_ASYNC",
    }
