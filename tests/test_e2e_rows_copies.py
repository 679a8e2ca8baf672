"""The measurement table's repeated listings count once, and a campaign's launch flags beat its labels.

Built on a small table written here (the real one is checked in tests/test_e2e_validation.py): the
same run listed with rounded figures under another layout encoding is one row kept on the fewest GPUs,
two runs a few percent apart stay two, the database dump's encoding of expert parallelism (attention
dp E, moe_ep T x E) replays on the config's T GPUs, and InferenceX's Kimi-K2.5 vLLM B200 runs, whose launch script
passes no expert-parallel flag, replay with their experts tensor-parallel.
"""

from __future__ import annotations

import pandas as pd

from calibration.e2e.rows import COLUMNS, load_rows


def _row(
    i: str, model: str, tp: int, dp: int, ep: int, batch: int, ttft_ms: float, tpot_ms: float, backend: str = "vllm"
) -> dict:
    r = dict.fromkeys(COLUMNS)
    r.update(
        id=i,
        backend=backend,
        backend_version="0.17.0",
        model_path=model,
        system="b200_sxm",
        precision="fp4",
        mode="agg",
        isl=1024,
        osl=1024,
        gemm_quant_mode="nvfp4",
        batch_size=batch,
        tp_size=tp,
        pp_size=1,
        attention_dp_size=dp,
        moe_tp_size=1,
        moe_ep_size=ep,
        silicon_ttft_ms=ttft_ms,
        silicon_tpot_ms=tpot_ms,
    )
    return r


def _load(tmp_path, rows: list[dict]):
    path = tmp_path / "table.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return load_rows(path)


def test_a_run_listed_with_rounded_figures_counts_once_on_the_fewest_gpus(tmp_path):
    # SGLang Qwen3.5 as the dump lists it (tp16 with moe 4 x 4) and as the gap-analysis file rounds it (tp4 ep4)
    model = "Qwen/Qwen3.5-397B-A17B"
    rows = _load(
        tmp_path,
        [
            _row("dump", model, 16, 1, 4, 16, 481.6891234567, 14.32834567, backend="sglang"),
            _row("gap-analysis", model, 4, 1, 4, 16, 481.69, 14.33, backend="sglang"),
            _row("other-run", model, 4, 1, 4, 16, 491.30, 14.61, backend="sglang"),  # 2 % apart: its own run
        ],
    )
    assert [(r.id, r.copies) for r in rows] == [("gap-analysis", 2), ("other-run", 1)]
    assert (rows[0].tp, rows[0].moe_ep, rows[0].concurrency) == (4, 4, 16)


def test_the_dumps_dp_encoding_of_expert_parallelism_replays_on_tp_gpus(tmp_path):
    """{tp 4, ep 4} listed as attention dp 4, moe_ep 16, batch 2 per rank: 8 users on 4 GPUs with EP 4."""
    (row,) = _load(tmp_path, [_row("dump", "MiniMaxAI/MiniMax-M2.5", 4, 4, 16, 2, 150.0, 12.0)])
    assert (row.tp, row.dp, row.moe_tp, row.moe_ep, row.concurrency) == (4, 1, 1, 4, 8)


def test_kimi_vllm_b200_runs_replay_without_expert_parallelism(tmp_path):
    rows = _load(
        tmp_path,
        [
            _row("kimi", "moonshotai/Kimi-K2.5", 4, 1, 4, 16, 200.0, 14.0),
            _row("minimax", "MiniMaxAI/MiniMax-M2.5", 4, 1, 4, 16, 200.0, 14.0),
        ],
    )
    kimi, minimax = rows
    assert (kimi.tp, kimi.dp, kimi.moe_tp, kimi.moe_ep, kimi.concurrency) == (4, 1, 4, 1, 16)
    assert minimax.moe_ep == 4  # MiniMax's scripts pass --enable-expert-parallel: the label holds
