"""A user's own GPU file and a bare model config work end to end, from YAML and from the CLI."""

from __future__ import annotations

import shutil
import subprocess
import sys

import yaml

from simulator.run import simulate
from simulator.scenario import load_scenario
from tests.conftest import REPO


def _user_folder(tmp_path):
    gpu = yaml.safe_load((REPO / "hwdb/data/gpus/H100-SXM-80GB.yaml").read_text())
    gpu.update(name="Lab-GPU-96", aliases=["labgpu"])
    gpu["memory_bytes"] = {"value": 96 * 2**30, "source": "our lab's card (test)"}
    gpu.pop("visible_memory_bytes")  # CUDA's total of the H100 it was copied from
    (tmp_path / "hw" / "gpus").mkdir(parents=True)
    (tmp_path / "hw" / "gpus" / "lab.yaml").write_text(yaml.safe_dump(gpu))
    (tmp_path / "mymodel").mkdir()
    shutil.copy(REPO / "hwdb/data/models/Qwen2.5-7B/config.json", tmp_path / "mymodel" / "config.json")
    scn = yaml.safe_load((REPO / "examples/llama8b_h100_chat.yaml").read_text())
    scn.update(model="mymodel", hwdb=["hw"])
    scn["pools"][0]["gpu"] = "labgpu"
    scn["workload"]["num_requests"] = 300
    (tmp_path / "scn.yaml").write_text(yaml.safe_dump(scn))
    return tmp_path / "scn.yaml"


def test_user_gpu_and_model_folder_from_yaml(tmp_path):
    res = simulate(load_scenario(_user_folder(tmp_path)))
    assert res.info["gpu"] == "Lab-GPU-96"
    assert res.info["model"] == "mymodel"
    assert res.summary["completed"] == 300
    # More memory than the H100 it was copied from leaves a larger KV cache.
    h100 = load_scenario(REPO / "examples/llama8b_h100_chat.yaml")
    h100 = h100.model_copy(update={"model": str(tmp_path / "mymodel")})
    assert res.info["kv_cache_tokens_per_instance"] > simulate(h100).info["kv_cache_tokens_per_instance"]


def test_user_folder_from_cli(tmp_path):
    path = _user_folder(tmp_path)
    scn = yaml.safe_load(path.read_text())
    scn.pop("hwdb")
    scn["model"] = "Llama-3.1-8B"
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(scn))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator.cli",
            "simulate",
            str(tmp_path / "plain.yaml"),
            "--hwdb",
            str(tmp_path / "hw"),
            "--model",
            str(tmp_path / "mymodel"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "Lab-GPU-96" in out.stdout and "mymodel" in out.stdout
