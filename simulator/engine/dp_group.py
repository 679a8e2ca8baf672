"""Attention data-parallel ranks of one instance stepping in lock-step.

With ``--data-parallel-size D`` (vLLM) or ``--enable-dp-attention --dp-size D`` (SGLang), an instance is
D ranks, each with its own scheduler, batch and KV cache, whose MoE layers run over all D x tp GPUs: a
layer's experts need every rank's tokens, so the ranks run each forward pass together, an idle rank
with an empty (dummy) batch, and a step ends when the slowest rank's part and the shared MoE part are
done.  vLLM's DP coordinator wakes idle ranks into such dummy steps while any rank has work.

:class:`DPGroup` is that barrier.  A rank that has scheduled its batch calls :meth:`step` with its
tokens and its own GPU and host time (:meth:`simulator.stepmodel.StepModel.local_time`); the group
starts the step once every rank that took part in the previous step has either scheduled again or
gone idle (:meth:`leave`), and the step lasts

    combine(max over ranks of their own GPU time + moe_time(routed tokens), max host time)

(`StepModel.moe_time`: the routed experts' roofline and the token exchange).  Under vLLM the ranks run
padded to the busiest rank's token count (``num_tokens_across_dp``) so that the MoE collectives and CUDA
graphs see one shape: dp x the busiest rank's tokens are routed.  An all-to-all dispatch (SGLang's
DeepEP, TensorRT-LLM) routes the tokens the ranks have, summed (``StepModel.moe_pads_dp``).  A rank that
wakes while a step runs joins the next one.  This is the synchronisation cost: a rank that prefills a
long prompt holds every other rank's decodes for as long.
"""

from __future__ import annotations

from simulator.stepmodel import StepModel


class DPGroup:
    """The lock-step barrier of one instance's ``size`` data-parallel ranks (a SimPy helper, one per
    instance, created by :meth:`simulator.engine.opspool.OpsPool.start_initial`)."""

    def __init__(self, env, model: StepModel, size: int, wait_steps: int | None = None) -> None:
        self.env = env
        self.model = model
        self.size = size
        self.members: list = []  # the ranks' instances, in rank order (opspool)
        self.wait_steps = wait_steps  # context wait (EngineProfile.dp_context_wait_steps); None: none
        self.held_steps = 0  # steps since the last release of waiting prompts
        self.decided_at, self.release = -1, True  # the group step the release was decided for, and it
        self.pending: dict[int, tuple[int, float, float]] = {}  # rank -> (tokens, GPU s, host s)
        self.expected = 0  # ranks of the last step that have neither scheduled again nor left
        self.running = False
        self.next_end = env.event()
        self.steps = 0
        self._last: set[int] = set()  # ranks of the last step

    def step(self, rank: int, tokens: int, gpu: float, cpu: float):
        """SimPy generator: schedule ``rank``'s batch into the next group step; returns (start, duration)
        once that step has ended."""
        if self.expected and rank in self._last:
            self.expected -= 1
            self._last.discard(rank)
        self.pending[rank] = (tokens, gpu, cpu)
        end = self.next_end
        self._maybe_start()
        start, dt = yield end
        return start, dt

    def may_prefill(self, rank: int, running: int) -> bool:
        """Whether the ranks admit waiting prompts in the coming step (decided once per group step, the same
        for every rank, as TensorRT-LLM's ADP balance decides from all-gathered counts): always without a
        context wait; else when every rank has a prompt waiting, or some rank has nothing running (nothing
        to protect), or ``wait_steps`` steps have passed since the last release.  Holding prompts back lets
        the ranks prefill in the same step instead of each stalling the others' decodes in turn."""
        if self.wait_steps is None or not running:  # this rank has nothing running: not all ranks have
            return True
        if self.decided_at != self.steps:
            self.decided_at = self.steps
            if all(m.waiting for m in self.members):
                self.held_steps, self.release = 0, True
            else:
                self.held_steps += 1
                self.release = self.held_steps >= self.wait_steps or not all(m.n_running for m in self.members)
                if self.release:
                    self.held_steps = 0
        return self.release

    def leave(self, rank: int) -> None:
        """``rank`` has nothing to schedule: it sits out until woken (an empty batch costs it nothing)."""
        if self.expected and rank in self._last:
            self.expected -= 1
            self._last.discard(rank)
            self._maybe_start()

    def _maybe_start(self) -> None:
        if self.running or self.expected or not self.pending:
            return
        m = self.model
        busiest = max(t for t, _, _ in self.pending.values())
        # vLLM: every rank, an idle one included, runs the step padded to the busiest rank's token count (its
        # DP padding: collectives and CUDA graphs need one shape across ranks), so the experts see size x
        # busiest tokens and a rank's prefill makes every rank's MoE layers that long.  An all-to-all
        # dispatch (SGLang's DeepEP, TensorRT-LLM) routes only the tokens the ranks have; the busiest rank's
        # share still sets the exchange.
        routed = self.size * busiest if m.moe_pads_dp else sum(t for t, _, _ in self.pending.values())
        gpu = max(g for _, g, _ in self.pending.values()) + m.moe_time(routed, busiest)
        cpu = max(c for _, _, c in self.pending.values())
        dt = m.combine(gpu, cpu)
        end, start = self.next_end, self.env.now
        self.next_end = self.env.event()
        self._last = set(self.pending)
        self.pending = {}
        self.running = True
        self.steps += 1

        def done(_event) -> None:
            self.running = False
            self.expected = len(self._last)
            end.succeed((start, dt))

        self.env.timeout(dt).callbacks.append(done)
