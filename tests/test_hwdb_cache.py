"""The hardware database is parsed once per process; callers get copies they cannot share by accident."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hwdb
from hwdb.db import DATA_DIR
from simulator import inputs

H100_TEXT = (DATA_DIR / "gpus" / "H100-SXM-80GB.yaml").read_text()


def _user_gpu(folder: Path, price: str) -> Path:
    """A user GPU 'My-GPU' whose price text is ``price`` (same length for every price given)."""
    (folder / "gpus").mkdir(exist_ok=True)
    p = folder / "gpus" / "MyGPU.yaml"
    p.write_text(
        H100_TEXT.replace("name: H100-SXM-80GB", "name: My-GPU")
        .replace("aliases: [H100, H100-SXM, h100_sxm]", "aliases: [mine]")
        .replace("value: 4.25", f"value: {price}")
    )
    return p


def test_each_load_is_an_independent_copy():
    a = hwdb.load()
    a.gpus.pop("H100-SXM-80GB")
    a.gpu("H200").peak_flops.clear()  # frozen models still hold dicts: they must not be shared
    a.model("Llama-3.1-8B").config["num_hidden_layers"] = 1
    b = hwdb.load()
    assert "H100-SXM-80GB" in b.gpus
    assert "bf16" in b.gpu("H200").peak_flops
    assert b.model("Llama-3.1-8B").config["num_hidden_layers"] == 32
    assert b.model("Llama-3.1-8B").arch == a.model("Llama-3.1-8B").arch


def test_frozen_entries_refuse_assignment():
    db = hwdb.load()
    with pytest.raises(Exception, match="frozen"):
        db.gpu("H100").name = "other"


def test_an_edited_user_file_is_read_again(tmp_path):
    _user_gpu(tmp_path, "1.99")
    assert hwdb.load([tmp_path]).gpu("mine").price_usd_per_hour.value == 1.99
    _user_gpu(tmp_path, "3.00")  # same size, likely the same time stamp: content decides
    assert hwdb.load([tmp_path]).gpu("mine").price_usd_per_hour.value == 3.00
    (tmp_path / "gpus" / "MyGPU.yaml").unlink()
    assert "My-GPU" not in hwdb.load([tmp_path]).gpus


def test_a_failed_load_is_not_cached(tmp_path):
    p = _user_gpu(tmp_path, "1.99")
    p.write_text(p.read_text().replace("memory_bytes:", "memory_byte:"))
    for _ in range(2):
        with pytest.raises(hwdb.HwdbError, match="memory_byte"):
            hwdb.load([tmp_path])


@pytest.mark.skipif(inputs._FastLoader is None, reason="PyYAML built without libyaml")
@pytest.mark.parametrize("path", sorted(DATA_DIR.rglob("*.yaml")), ids=lambda p: str(p.relative_to(DATA_DIR)))
def test_libyaml_and_python_loaders_agree_on_shipped_files(path):
    text = path.read_text()
    assert inputs._parse_with(inputs._FastLoader, text, str(path), ValueError) == inputs._parse_with(
        inputs._StrictLoader, text, str(path), ValueError
    )


@pytest.mark.parametrize("text", ["a: [1, 2\nb: 3\n", "a: 1\na: 2\n", 'a: "x\n', "a:\n\t- 1\n"])
def test_broken_yaml_keeps_the_python_loaders_message(text):
    with pytest.raises(ValueError) as python_said:
        inputs._parse_with(inputs._StrictLoader, text, "f.yaml", ValueError)
    with pytest.raises(ValueError) as we_say:
        inputs.parse_yaml(text, "f.yaml", ValueError)
    assert str(we_say.value) == str(python_said.value) and "f.yaml" in str(we_say.value)


def test_valid_yaml_reads_the_same_through_either_loader():
    text = "a: &x {b: [1, 2.5, null, true]}\nc: *x\nd: '2026-01-01'\ne: 1e3\n"
    assert inputs.parse_yaml(text, "f.yaml") == yaml.safe_load(text)
