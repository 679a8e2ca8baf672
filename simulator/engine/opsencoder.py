"""An encoder pool that autoscales: the autoscaler's view of an EPD run's encoder tier.

The proxy (:class:`simulator.epd.epd_flow.EPDCoordinator`) sends images to its serving encoders
(``coord.encoders``, the list edited here). Scaling is
:class:`~simulator.engine.pool_lifecycle.PoolLifecycle`'s, as for a language-model pool: a new encoder is made
when its start delay has passed, and one taken out of routing finishes the images already queued on it, whose
embeddings still leave from it, and serves no more. Encoders never crash. Each encoder incarnation is billed
as a language-model instance is (:class:`simulator.engine.opsrecord.Life`): from its provisioning to its
removal (the end of its queue), its cancellation or the end of the run.

Start delays: an encoder instance is a vLLM server of the same multimodal checkpoint as the language-model
pool in front of which it runs, so it starts as that pool's instances do (its start times); the queue policy
counts images waiting on serving encoders (not yet in a batch).
"""

from __future__ import annotations

from simulator.engine.opsrecord import Life
from simulator.engine.pool_lifecycle import PoolLifecycle, Start
from simulator.ops.autoscale import Observation


class EncoderPool(PoolLifecycle):
    """The encoder instances of an EPD run over time.  ``events``: the run's operations log; ``starts``: a
    :class:`simulator.ops.opsstart.StartTimes`; ``lives``: every encoder incarnation's billing record (the
    initial ones are already in it), appended at each scale-up; ``gpus``: GPUs of one encoder instance."""

    def __init__(self, env, coord, starts, events: list, lives: list[Life], gpus: int) -> None:
        super().__init__(env, coord.setup.encoder_pool.name, starts, events, coord.encoders)
        self.coord = coord
        self.lives = lives
        self.gpus = gpus

    def _new(self, cause: str, billed_s: float) -> Start:
        life = Life(self.name, len(self.lives), self.gpus, cause, billed_s)
        self.lives.append(life)
        return Start(life)

    def _serve(self, start: Start) -> None:
        enc = start.unit = self.coord.add_encoder()
        enc.life = start.life
        enc.life.ready_s = self.env.now
        self.env.process(enc.run(self.env))
        self.active.append(enc)

    def _retire(self, unit) -> None:
        self.env.process(self._drain(unit))  # keeps encoding what it holds; no new images

    def _drain(self, enc):
        """Out of routing: encodes what it holds, then is removed (billing ends)."""
        while enc.outstanding:
            yield self.env.timeout(1.0)
        enc.life.ended_s, enc.life.end = self.env.now, "removed"

    def observe(self, cfg) -> Observation:
        """The queue policy's view: serving and present encoders and the images waiting on them."""
        act = self.active
        return Observation(
            now=self.env.now,
            serving=len(act),
            present=self.present,
            waiting=sum(len(e.queue) for e in act),
            kv_util=0.0,
            rate_now=0.0,
            rate_prev=0.0,
            window_s=cfg.window_s,
            lead_s=self.starts.new_delay() or 0.0,
            mean_input=0.0,
            mean_output=0.0,
        )
