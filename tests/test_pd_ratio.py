"""The best prefill:decode ratio shifts toward prefill as prompts grow relative to outputs."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def _example():
    spec = importlib.util.spec_from_file_location("pd_ratio_sweep", REPO / "examples/pd_ratio_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_best_ratio_moves_toward_prefill_for_long_prompts():
    res = _example().sweep(duration_s=20.0, iterations=8)
    chat, summ = res["chat (512 in / 512 out)"], res["summarise (4096 in / 128 out)"]
    best_chat, best_summ = max(chat, key=chat.get), max(summ, key=summ.get)

    def share(pd):
        return pd[0] / (pd[0] + pd[1])

    assert share(best_summ) > share(best_chat)
    assert summ[(3, 1)] > 1.5 * summ[(1, 3)]  # long prompts: prefill-heavy wins clearly
    assert chat[(1, 3)] > 1.5 * chat[(3, 1)]  # long outputs: decode-heavy wins clearly
    assert all(g > 0 for row in res.values() for g in row.values())
