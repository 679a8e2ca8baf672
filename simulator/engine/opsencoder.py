"""An encoder pool that autoscales: the autoscaler's view of an EPD run's encoder tier.

The proxy (:class:`simulator.epd.epd_flow.EPDCoordinator`) sends images to its serving encoders
(``coord.encoders``, the list edited here).  A scale-up makes new encoder instances that serve after
the pool's start delay; a scale-down cancels starts first (newest first), then takes the newest
serving encoders out of routing (one always stays): each finishes the images already queued on it,
whose embeddings still leave from it, and serves no more.  Encoders never crash.  Each encoder
incarnation is billed as a language-model instance is (:class:`simulator.engine.opsrecord.Life`): from
its provisioning to its removal (the end of its queue), its cancellation or the end of the run.

Start delays: an encoder instance is a vLLM server of the same multimodal checkpoint as the
language-model pool in front of which it runs, so it starts as that pool's instances do (its start
times); the queue policy counts images waiting on serving encoders (not yet in a batch).
"""

from __future__ import annotations

from simulator.engine.opsrecord import Life
from simulator.ops.autoscale import Observation


class EncoderPool:
    """The encoder instances of an EPD run over time.  ``events``: the run's operations log, appended
    ``(time_s, pool, action, count, why)``; ``starts``: a :class:`simulator.ops.opsstart.StartTimes`;
    ``lives``: every encoder incarnation's billing record (the initial ones are already in it), appended
    at each scale-up; ``gpus``: GPUs of one encoder instance."""

    def __init__(self, env, coord, starts, events: list, lives: list[Life], gpus: int) -> None:
        self.env = env
        self.coord = coord
        self.name = coord.setup.encoder_pool.name
        self.starts = starts
        self.events = events
        self.active = coord.encoders  # serving: the proxy routes images to these
        self.starting: list[dict] = []
        self.decisions: list[tuple] = []
        self.scaleups: list[list] = []  # [decided_s, ready_s or None, start token]
        self.lives = lives
        self.gpus = gpus

    @property
    def present(self) -> int:
        return len(self.active) + len(self.starting)

    def scale_up(self, n: int, why: str) -> None:
        now = self.env.now
        delay = self.starts.new_delay()
        for _ in range(n):
            life = Life(self.name, len(self.lives), self.gpus, "scale-up", now + self.starts.provisioning_s)
            self.lives.append(life)
            tok = {"cancelled": False, "life": life}
            self.starting.append(tok)
            self.scaleups.append([now, None, tok])
            self.env.process(self._start(delay, tok))
        self.events.append((now, self.name, "scale-up", n, why))

    def _start(self, delay_s: float | None, tok: dict):
        """One new encoder: serves ``delay_s`` from now unless cancelled first (None: never ready)."""
        if delay_s is None:
            tok["life"].end = "never ready: " + self.starts.never_reason("scale-up")
            return  # crash-looping pod: billed, stays counted as starting
        yield self.env.timeout(delay_s)
        if tok["cancelled"]:
            return
        self.starting.remove(tok)
        enc = self.coord.add_encoder()
        enc.life = tok["life"]
        enc.life.ready_s = self.env.now
        self.env.process(enc.run(self.env))
        self.active.append(enc)
        for su in self.scaleups:
            if su[2] is tok:
                su[1] = self.env.now

    def scale_down(self, n: int, why: str) -> None:
        now = self.env.now
        done = 0
        while done < n and self.starting:
            tok = self.starting.pop()
            tok["cancelled"] = True
            life = tok["life"]
            life.ended_s, life.end = max(now, life.billed_s), "cancelled"
            done += 1
        while done < n and len(self.active) > 1:
            self.env.process(self._drain(self.active.pop()))  # keeps encoding what it holds; no new images
            done += 1
        self.events.append((now, self.name, "scale-down", done, why))

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
