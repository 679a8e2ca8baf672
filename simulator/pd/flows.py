"""PD proxy flows: when a request's decode instance is chosen and when its KV moves.

A flow is a small strategy the proxy (:class:`simulator.pd.pd_proxy.PDCoordinator`) calls at three
points of a request's life; :data:`FLOWS` is the registry ``kv_transfer.flow`` names.
"""

from __future__ import annotations

from simulator.registry import Registry


class PDFlow:
    """When a PD request's decode instance is chosen and when its KV moves: one strategy per proxy flow,
    registered in :data:`FLOWS` under the name ``kv_transfer.flow`` takes.  Each hook is called by the
    :class:`PDCoordinator` it is given; ``arrived`` when the request is sent to a prefill instance,
    ``prefilled`` when that instance finished the prompt (its KV is held there), ``blocks_ready`` when
    the chosen decode instance has allocated blocks for the prompt."""

    name = ""
    operations = False  # whether runs with an ``operations`` block (crashes, autoscaling) model it

    def arrived(self, coord, rid: int) -> None:
        pass

    def prefilled(self, coord, p_inst, rid: int, now: float) -> None:
        raise NotImplementedError

    def blocks_ready(self, coord, d_inst, rid: int, now: float) -> None:
        raise NotImplementedError


class VLLMFlow(PDFlow):
    """vLLM's disaggregated-serving proxy: the decode instance is picked among the serving ones once the
    prefill is done (none serving: the request waits at the proxy, :meth:`PDCoordinator.flush`); it pulls
    the KV as soon as it has blocks."""

    name = "vllm"
    operations = True

    def prefilled(self, coord, p_inst, rid, now):
        active = coord.serving
        if not active:
            coord.limbo.append(rid)
            return
        coord.catch_up(active, now)
        d_inst = active[coord.decode_router.choose(rid) % len(active)]
        coord.rec.instance[rid] = d_inst.index
        d_inst.submit_remote(rid)

    def blocks_ready(self, coord, d_inst, rid, now):
        coord.move_kv(d_inst, rid, now)


class SGLangFlow(PDFlow):
    """SGLang's bootstrap handshake: the decode instance is picked when the request arrives and reserves
    blocks for the prompt while the prefill runs; the KV moves once both the prefill and the blocks are
    done, whichever comes last.  Static pools only."""

    name = "sglang"

    def arrived(self, coord, rid):
        coord.catch_up(coord.serving, coord.env.now)
        d = coord.decode_router.choose(rid)
        coord.rec.instance[rid] = d
        coord.decode[d].submit_remote(rid)

    def prefilled(self, coord, p_inst, rid, now):
        d_inst = coord.reserved.pop(rid, None)
        if d_inst is not None:
            coord.move_kv(d_inst, rid, now)

    def blocks_ready(self, coord, d_inst, rid, now):
        if rid not in coord.src:  # prefill still running: the hand-off moves it
            coord.reserved[rid] = d_inst
            return
        coord.move_kv(d_inst, rid, now)


# One shared instance per flow: a flow keeps no state of its own (the coordinator it is given does).
FLOWS: Registry[PDFlow] = Registry("PD proxy flow", (VLLMFlow(), SGLangFlow()))
