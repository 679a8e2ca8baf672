"""KV an engine keeps free for running requests' future output when it admits a waiting request.

vLLM admits while blocks for the next chunk are free and preempts when decodes run out; SGLang and
TensorRT-LLM first keep back room for what their running requests have still to generate
(:class:`hwdb.engine_schema.AdmissionRule`), so under a burst that fills the cache they run fewer requests
at once and queue the rest.  :class:`Reservation` is that rule for one instance, in O(1) per check: the
instance keeps the sum of its running requests' final lengths (prompt + output), and the blocks it holds
stand for what they have so far.
"""

from __future__ import annotations

import math


class Reservation:
    """One instance's admission reserve (blocks), with the ratio's decay since ``reset_at`` (a step index)."""

    __slots__ = ("init", "min", "decay", "clip", "block", "reset_at")

    def __init__(self, rule, block: int) -> None:
        self.init, self.min = rule.init_ratio.value, rule.min_ratio.value
        self.decay = (self.init - self.min) / rule.decay_steps if rule.decay_steps else 0.0
        self.clip = rule.clip_tokens or math.inf
        self.block = block
        self.reset_at = 0

    def ratio(self, step: int) -> float:
        return max(self.min, self.init - self.decay * (step - self.reset_at))

    def free_needed(self, step: int, future: int, prompt_left: int, out_left: int) -> int:
        """Free blocks a newcomer needs: the ratio's share of the running requests' ``future`` tokens, plus its
        own ``prompt_left`` and ``out_left`` (at most ``clip``)."""
        tokens = self.ratio(step) * max(future, 0) + prompt_left + min(out_left, self.clip)
        return -int(-tokens // self.block)
