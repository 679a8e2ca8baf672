"""The PD proxy: hands prompts from prefill to decode instances and moves their KV over the fabric.

One proxy for static pools and for pools whose instances come and go (operations): instances get
their side of the fabric as they are made (:meth:`PDCoordinator.add`), the decode instance is chosen
among the serving ones (requests wait at the proxy while none serves), and a transfer completion
for a request that has since crashed away does nothing (its blocks were freed at the crash; the
bytes already on the wire still occupy the link until they would have arrived).  Without
operations no instance ever crashes and every decode instance serves from the start.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from simulator.ops.faults import link_degradation_process
from simulator.ops.opsconfig import LinkDegradationConfig
from simulator.pd.fabric import Fabric, LinkState
from simulator.pd.flows import FLOWS


class PDCoordinator:
    """The PD proxy over ``prefill`` and ``decode`` instances (lists the caller owns and may grow).

    ``serving``: the decode instances the proxy may pick (default: all of ``decode``), a list edited
    in place as instances start and stop; ``decode_router`` picks among it.  ``rng``: the fabric's
    jitter stream.  ``plan.flow`` names the :class:`PDFlow` that decides when the decode instance is
    chosen and when the KV moves (:data:`FLOWS`)."""

    def __init__(
        self, env, plan, prefill: list, decode: list, decode_router, rec, rng=None, serving: list | None = None
    ) -> None:
        self.env = env
        self.plan = plan
        self.fabric = Fabric(env, rng)
        jitter = None
        if plan.jitter_mean_s > 0:
            mean = plan.jitter_mean_s / 2  # drawn on each of the two sides of the path
            jitter = lambda g, mean=mean: float(g.exponential(mean))  # noqa: E731 - a one-line draw, bound to mean
        self.decode_router = decode_router
        self.rec = rec
        self.src: dict[int, object] = {}  # request -> prefill instance holding its KV
        self._jitter = jitter
        self._groups: dict[str, LinkState] = {}
        self.egress: list[tuple] = []  # per prefill instance: the links of its side
        self.ingress: list[tuple] = []  # per decode instance
        self.decode = decode
        self.serving = decode if serving is None else serving
        self.limbo: deque[int] = deque()  # prefilled requests waiting for a serving decode instance
        self.flow = FLOWS[plan.flow]
        self.reserved: dict[int, object] = {}
        self.bytes_moved = 0.0
        # Receive buffer of each decode instance (P2pNcclConnector's kv_buffer_size): bytes held in it.
        self.in_buffer: list[float] = []
        self._degrade: tuple[LinkDegradationConfig, np.random.Generator, list[tuple]] | None = None
        self._episoded: set = set()
        self.lazy = False  # decode instances step lazily: catch them up before routing
        for inst in prefill:
            self.add(inst)
        for inst in decode:
            self.add(inst)

    def add(self, inst) -> None:
        """A new instance of either pool (the next index of its role): give it its side of the fabric."""
        if inst.role.fabric_side == "out":
            assert inst.index == len(self.egress)
            self.egress.append(self.side_path("prefill", inst.index))
        else:
            assert inst.index == len(self.ingress)
            self.ingress.append(self.side_path("decode", inst.index))
            self.in_buffer.append(0.0)
        if self._degrade is not None:
            for ln in self.egress[-1] if inst.role.fabric_side == "out" else self.ingress[-1]:
                if ln not in self._episoded:  # a NIC shared with an earlier instance has its episodes
                    self._episodes(ln)

    def side_path(self, role: str, i: int) -> tuple:
        """The links instance ``i`` of ``role`` crosses on its side: its NIC group (shared by the instances
        behind one NIC) and the oversubscribed switch uplinks it crosses (``TransferPlan.uplinks``).  Made once,
        then reused."""
        plan = self.plan
        share = plan.prefill_share if role == "prefill" else plan.decode_share
        cap = plan.prefill_side_Bps if role == "prefill" else plan.decode_side_Bps
        d = "out" if role == "prefill" else "in"
        g = i // share
        name = f"{plan.link_name}:{role}{i}:{d}" if share == 1 else f"{plan.link_name}:{role}-nic{g}:{d}"
        links = [self._group(name, cap, plan.latency_s)]
        gpus = plan.prefill_gpus if role == "prefill" else plan.decode_gpus
        for tier, up, nodes in plan.uplinks(role):
            r = int(i * gpus // (plan.gpus_per_node * nodes))
            links.append(self._group(f"{plan.link_name}:{role}-{tier}{r}:{'up' if d == 'out' else 'down'}", up, 0.0))
        return tuple(links)

    def _group(self, name: str, cap: float, latency: float) -> LinkState:
        ln = self._groups.get(name)
        if ln is None:
            ln = self._groups[name] = LinkState(name, cap, latency, self.plan.bandwidth_factor, self._jitter)
        return ln

    def on_arrival(self, rid: int) -> None:
        """``rid`` was sent to a prefill instance."""
        self.flow.arrived(self, rid)

    def catch_up(self, insts, t: float) -> None:
        """Lazy decode instances (static PD runs step them only when asked): bring ``insts`` to time ``t``
        before the proxy reads their state to route a request."""
        if self.lazy:
            for inst in insts:
                inst.catch_up(t)

    def hand_off(self, p_inst, rid: int, now: float) -> None:
        """Prefill done: ``p_inst`` holds the prompt's KV until the transfer has finished."""
        self.src[rid] = p_inst
        self.flow.prefilled(self, p_inst, rid, now)

    def flush(self) -> None:
        """A decode instance began serving: hand it the requests waiting at the proxy."""
        while self.limbo and self.serving:
            rid = self.limbo.popleft()
            self.hand_off(self.src.pop(rid), rid, self.env.now)

    def start_transfer(self, d_inst, rid: int, now: float) -> None:
        """The decode instance has blocks for the prompt."""
        self.flow.blocks_ready(self, d_inst, rid, now)

    def move_kv(self, d_inst, rid: int, now: float) -> None:
        """Send ``rid``'s KV from the prefill instance holding it to ``d_inst`` (layer-wise overlap and
        the receive buffer applied)."""
        plan, rec = self.plan, self.rec
        p_inst = self.src.pop(rid)
        nbytes = plan.bytes_for(rec.input_tokens[rid])
        if plan.layerwise:
            overlap = (rec.t_prefilled[rid] - rec.t_sched[rid]) * min(plan.prefill_side_Bps, plan.decode_side_Bps)
            nbytes = max(nbytes / plan.num_layers, nbytes - overlap)
        spill = 0.0
        if plan.buffer_bytes:
            # What does not fit in the free GPU buffer goes to the host tensor pool (P2pNccl).
            d = d_inst.index
            fit = min(nbytes, max(0.0, plan.buffer_bytes - self.in_buffer[d]))
            self.in_buffer[d] += fit
            spill = nbytes - fit
        self._send(p_inst, d_inst, rid, nbytes, spill)

    def _send(self, p_inst, d_inst, rid: int, nbytes: float, spill: float = 0.0) -> None:
        plan, rec = self.plan, self.rec
        rec.t_kv_start[rid] = self.env.now
        extra = plan.setup_s + nbytes * plan.staged_s_per_byte
        ev = self.fabric.transfer(self.egress[p_inst.index] + self.ingress[d_inst.index], nbytes, extra)
        self.bytes_moved += nbytes
        token = rec.attempt[rid]  # a crash bumps it: this transfer's completion then does nothing

        def arrived(_e, rid=rid, p_inst=p_inst, d_inst=d_inst, nbytes=nbytes, token=token):
            if rec.attempt[rid] == token:
                p_inst.release(rid)

            def land(_t=None):
                """The KV is usable on the decode instance: it copies it out of the buffer into its blocks."""
                if rec.attempt[rid] == token:
                    rec.t_kv_done[rid] = self.env.now
                    if self.lazy:
                        d_inst.catch_up(self.env.now)
                    d_inst.kv_arrived(rid)
                if plan.buffer_bytes and not d_inst.dead:
                    self.in_buffer[d_inst.index] -= nbytes - spill

            if spill > 0:  # the overflow is copied to host memory and back before decode can use it
                self.env.timeout(spill * plan.pool_copy_s_per_byte).callbacks.append(land)
            else:
                land()

        ev.callbacks.append(arrived)

    def degrade(self, cfg: LinkDegradationConfig, rng: np.random.Generator, log: list[tuple]) -> None:
        """Start link-degradation episodes on every link side made so far and later."""
        self._degrade = (cfg, rng, log)
        for ln in dict.fromkeys(ln for path in self.egress + self.ingress for ln in path):
            self._episodes(ln)

    def _episodes(self, link) -> None:
        self._episoded.add(link)
        assert self._degrade is not None, "episodes start after degrade()"
        cfg, rng, log = self._degrade
        self.env.process(
            link_degradation_process(
                self.env, self.fabric, link, cfg, self.plan.bandwidth_factor, rng, lambda t, n, f: log.append((t, n, f))
            )
        )
