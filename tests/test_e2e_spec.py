"""Measured runs made with speculative decoding: found from the campaigns' launch configurations and left out
of the end-to-end scores (calibration/e2e/spec.py)."""

from __future__ import annotations

import dataclasses

import pytest

from calibration.e2e import spec as e2e_spec
from calibration.e2e.rows import DEFAULT_TABLE, Row, load_rows

MASTER = {
    "qwen3.5-fp8-b200-sglang": {
        "model-prefix": "qwen3.5",
        "runner": "b200",
        "precision": "fp8",
        "framework": "sglang",
        "multinode": False,
        "seq-len-configs": [
            {
                "isl": 1024,
                "osl": 1024,
                "search-space": [
                    {"tp": 8, "ep": 1, "conc-start": 4, "conc-end": 16},
                    {"tp": 4, "ep": 4, "conc-start": 16, "conc-end": 128},
                ],
            }
        ],
    },
    "qwen3.5-fp8-b200-sglang-mtp": {
        "model-prefix": "qwen3.5",
        "runner": "b200",
        "precision": "fp8",
        "framework": "sglang",
        "multinode": False,
        "seq-len-configs": [
            {
                "isl": 1024,
                "osl": 1024,
                "search-space": [
                    {"tp": 4, "ep": 1, "conc-start": 4, "conc-end": 256, "spec-decoding": "mtp"},
                    {"tp": 8, "ep": 1, "conc-start": 8, "conc-end": 32, "spec-decoding": "mtp"},
                ],
            }
        ],
    },
    "dsr1-fp8-b200-dynamo-sglang-mtp": {  # multinode: not a single-node campaign row
        "model-prefix": "dsr1",
        "runner": "b200-multinode",
        "precision": "fp8",
        "framework": "sglang",
        "multinode": True,
        "seq-len-configs": [],
    },
    "llama70b-fp8-h100-vllm": {
        "model-prefix": "llama70b",
        "runner": "h100",
        "precision": "fp8",
        "framework": "vllm",
        "seq-len-configs": [],
    },
}

ROW = Row(
    id="2026_03_25_qwen3_5_397b_b200_sxm_sglang_fp8_agg_1024x1024_c4_tp4_0_ep1_0_463",
    backend="sglang",
    version="0.5.9",
    model="Qwen/Qwen3.5-397B-A17B",
    system="b200_sxm",
    quant="fp8",
    precision="fp8",
    isl=1024,
    osl=1024,
    concurrency=4,
    tp=4,
    pp=1,
    dp=1,
    moe_tp=4,
    moe_ep=1,
    ttft_s=0.338,
    tpot_s=0.0063,
    disagg=False,
)


def test_only_concurrencies_no_plain_entry_covers_are_mtp_only():
    regions = {(g["tp"], g["ep"]): g["concurrency"] for g in e2e_spec.mtp_only(MASTER)}
    # TP4 EP1 ran only with MTP; TP8 EP1 also ran plain at 4-16 users, so only 32 is MTP-only there
    assert regions == {(4, 1): [4, 8, 16, 32, 64, 128, 256], (8, 1): [32]}


def test_a_row_in_a_region_is_excluded_and_its_neighbours_are_not():
    table = tuple({"campaign": "2026_03_25", **g} for g in e2e_spec.mtp_only(MASTER))
    assert "only with MTP" in e2e_spec.speculative(ROW, table)
    for change in (
        {"moe_ep": 4},
        {"tp": 8},
        {"concurrency": 512},
        {"isl": 8192},
        {"dp": 2},
        {"backend": "vllm"},
        {"system": "h200_sxm"},
        {"quant": "nvfp4"},
        {"model": "deepseek-ai/DeepSeek-R1"},
        {"id": ROW.id.replace("2026_03_25", "2026_04_06")},
        {"disagg": True},
    ):
        assert e2e_spec.speculative(dataclasses.replace(ROW, **change), table) == "", change
    # TP8 at 8 users ran both ways: ambiguous, so it stays in
    assert e2e_spec.speculative(dataclasses.replace(ROW, tp=8, concurrency=8), table) == ""
    assert e2e_spec.speculative(dataclasses.replace(ROW, tp=8, concurrency=32), table) != ""


def test_the_shipped_regions_name_their_source_and_flag_the_qwen_mtp_campaign():
    assert (
        "nvidia-master.yaml at 12ba0ae07289e3212840f8f59913ddee97b07f73"
        in e2e_spec.read_yaml(e2e_spec.REGIONS)["source"]
    )
    assert "only with MTP" in e2e_spec.speculative(ROW)
    assert e2e_spec.speculative(dataclasses.replace(ROW, moe_ep=4)) == ""


def test_the_generator_writes_what_it_finds(tmp_path, monkeypatch):
    master = tmp_path / "m.yaml"
    master.write_text(e2e_spec.yaml.safe_dump(MASTER))
    out = tmp_path / "regions.yaml"
    monkeypatch.setattr(e2e_spec, "REGIONS", out)
    assert e2e_spec.main(["--master", f"2026_03_25={master}@abc123", "--write"]) == 0
    written = e2e_spec.read_yaml(out)
    assert "2026_03_25: InferenceX .github/configs/nvidia-master.yaml at abc123" in written["source"]
    assert [(g["campaign"], g["tp"], g["concurrency"]) for g in written["regions"]] == [
        ("2026_03_25", 4, [4, 8, 16, 32, 64, 128, 256]),
        ("2026_03_25", 8, [32]),
    ]


@pytest.mark.skipif(not DEFAULT_TABLE.is_file(), reason="needs ../shared/data/e2e/serving_measurements.csv")
def test_the_measured_table_has_44_such_runs_all_decoding_faster_than_their_plain_twins():
    flagged = [r for r in load_rows() if e2e_spec.speculative(r)]
    assert len(flagged) == 44
    assert {r.backend for r in flagged} == {"sglang", "trtllm"}
    # Qwen3.5 fp8 on B200, SGLang: the MTP runs (TP4 EP1) decode faster at few users than the plain TP4 EP4 ones
    qwen = {r.concurrency: r.tpot_s for r in flagged if "Qwen3.5" in r.model and r.isl == r.osl == 1024}
    plain = {
        r.concurrency: r.tpot_s
        for r in load_rows()
        if "Qwen3.5" in r.model
        and r.system == "b200_sxm"
        and r.quant == "fp8"
        and r.backend == "sglang"
        and r.tp == 4
        and r.moe_ep == 4
        and r.isl == r.osl == 1024
    }
    both = sorted(set(qwen) & set(plain))
    assert both and all(qwen[c] < plain[c] for c in both if c <= 64)
