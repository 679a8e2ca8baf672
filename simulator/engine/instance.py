"""One serving instance as a SimPy process, scheduled as vLLM V1's ``Scheduler.schedule``.

Each step serves the running requests in admission order (one token per decode, then the next chunk of a
partial prefill), then admits waiting requests FCFS while the token budget, ``max_num_seqs`` and free KV
blocks allow (less an engine's reserve for running requests' future output: ``self.reserve``, SGLang and
TensorRT-LLM).  When blocks run out the newest running request is preempted and later recomputed.
Cost per step is independent of the batch size: decodes are aggregates (count, total context, a histogram
of the step at which each needs a new block, keyed by step modulo the block size), finishes sit in a heap,
the step log holds one row; per-request work happens only at admission, prefill end, preemption and finish.
"""

from __future__ import annotations

import heapq
from typing import cast

from simulator.engine.instance_lifecycle import InstanceLifecycle
from simulator.engine.instance_state import Callback, TimedLog
from simulator.engine.steplog import LogRow
from simulator.step_closures import step_functions

INF = float("inf")


class Instance(InstanceLifecycle):
    """One instance: :class:`InstanceLifecycle` and :meth:`run`, the SimPy process that drives it."""

    def run(self, env):
        """SimPy process: one iteration per engine step, forever."""
        rec = self.rec
        inp, out = rec.input_tokens, rec.output_tokens
        t_sched, t_first = rec.t_sched, rec.t_first
        preempts = rec.preemptions
        lazy = self.lazy
        gaps = rec.resume_gaps if self.gate is None and not lazy else TimedLog(self.gap_log, env)
        waiting, steps, block = self.waiting, self.steps, self.block
        log = steps is not None  # None: a run that builds no step table (simulate_requests)
        log_row = cast(LogRow, steps.add if steps is not None else None)  # called only if log
        step_time, decode_time = step_functions(self.model)
        budget_max, max_seqs, chunked, kv_total = self.budget, self.max_seqs, self.chunked, self.kv_total
        heappush, heappop = heapq.heappush, heapq.heappop
        remote, ready, receiving = self.remote, self.ready, self.receiving
        is_prefill, hand_off = self.role.hands_off, cast(Callback, self.hand_off)  # the PD proxy's (prefill role)
        prefix, reserve = self.prefix, self.reserve
        new_dec: list[int] = []  # decode role: requests whose first token this step makes

        order: dict[int, None] = {}  # running requests in admission order (newest last)
        prefill: dict[int, list] = {}  # rid -> [done, target, generated_before]
        dec_start: dict[int, tuple] = {}  # rid -> (s_d, L_d, generated_at_s_d)
        fin_at: dict[int, int] = {}  # rid -> step at whose end it finishes
        heap: list[tuple[int, int]] = []
        cnt = [0] * block  # decodes needing a new block at step s: cnt[s % block]
        last_tok = self.last_tok
        self._live = (order, prefill, dec_start)  # read by decode_contexts() and crash()
        n_dec = kv_used = s = 0
        sum_l = 0  # sum over decodes of KV length before this step
        pf: list | None  # a prefill's [done, target, generated_before]; None: not requeued
        now, t0 = env.now, -INF  # t0: the start of the step that ended last

        def preempt_newest(s: int, now: float, allocated: bool) -> tuple[int, bool]:
            """Preempt (recompute) the newest running request; returns it and whether it was decoding.

            ``allocated``: this step's new decode blocks are already counted in ``kv_used``.
            """
            nonlocal n_dec, sum_l, kv_used
            vic, _ = order.popitem()
            self.left(vic, s)
            preempts[vic] += 1
            waiting.appendleft(vic)
            pf = prefill.pop(vic, None)
            if pf is not None:
                kv_used -= -(-pf[0] // block)
                self._requeue[vic] = [0, pf[1], pf[2]]
                self.queue_kv(vic, pf[1])
                return vic, False
            sd, ld, g0 = dec_start.pop(vic)
            del fin_at[vic]
            length = ld + s - sd
            cnt[(sd - ld) % block] -= 1
            n_dec -= 1
            sum_l -= length
            kv_used -= -(-(length + allocated) // block)
            g = g0 + s - sd
            self._requeue[vic] = [0, inp[vic] + g, g]
            self.queue_kv(vic, inp[vic] + g)
            if g:
                last_tok[vic] = now
            if vic in new_dec:
                new_dec.remove(vic)
            return vic, True

        def finish_due(s: int, now: float) -> None:
            """Requests whose last token step ``s`` made leave (stale heap entries are skipped)."""
            nonlocal n_dec, sum_l, kv_used
            while heap and heap[0][0] <= s:
                f, rid = heappop(heap)
                if fin_at.get(rid) != f:
                    continue
                del fin_at[rid]
                sd, ld, g0 = dec_start.pop(rid)
                length = ld + s - sd + 1
                cnt[(sd - ld) % block] -= 1
                n_dec -= 1
                sum_l -= length
                kv_used -= -(-length // block)
                self._finish(rid, now, order, g0 + s - sd + 1)

        encode = self.encode_cost
        queue = env._queue  # SimPy's event heap of (time, priority, id, event)
        gate = self.gate
        group, rank = self.group, self.rank  # attention data-parallel ranks step together (dp_group.py)
        local_time = self.model.local_time
        inbox, recv_every, recv_ct, lag = self.inbox, self.recv_every, 0, self.async_lag
        inline = self.inline and group is None and recv_every == 1  # the run's clock policy (stepping.py)
        while True:
            # --- lazy decode-only steps (instance_state.py, catch_up): a decode instance with no KV to pull steps to
            # the time catch_up drives it to and waits, eventless, at the step ending later (the decode router's
            # counters written where it waits, the clock where a finish may read it); a hand-off or KV landing ends it.
            if lazy and n_dec and not (waiting or prefill or ready or remote or self._freed):
                # Every running request decodes here (no prompt chunk), so the batch is n_dec; the
                # next finish's step is heap[0][0], which only finish_due changes.
                limit = self.limit
                due = heap[0][0]
                while True:
                    need = cnt[s % block]
                    if kv_total - kv_used < need:
                        break
                    t0 = now
                    kv_used += need
                    dt = decode_time(n_dec, sum_l + n_dec, n_dec)
                    now = t0 + dt
                    if now >= limit:
                        self.kv_used, self.n_running, self.paused = kv_used, n_dec, now
                        yield self.suspend()
                        self.paused = None
                        limit = self.limit
                    if log:
                        log_row((t0, dt, n_dec, 0, 0, n_dec, 0, kv_used, 0))
                    sum_l += n_dec
                    if due <= s:
                        env._now = now
                        finish_due(s, now)
                        if not n_dec:
                            s += 1
                            break
                        due = heap[0][0]
                    s += 1
                    if remote or ready:
                        break
                env._now = now
            # --- decode-only steps (nothing waiting, no prompt chunk, no KV arriving, blocks for every
            # decode): the general step below with its empty branches left out, so the same state
            # changes in the same order; it leaves for the general path when any condition fails.
            # Every running request decodes (the batch is n_dec).  The steps that end before the next
            # event and make no finish run in the inner loop; nothing else runs meanwhile, so what a
            # pass reads once changes only at its end (a finish's callbacks may schedule events).
            while (
                inline
                and n_dec
                and not (waiting or prefill or ready or remote or self._freed or inbox)
                and (kv_total - kv_used >= cnt[s % block])
            ):
                horizon = gate[0] if gate is not None else queue[0][0] if queue else INF
                due = heap[0][0]
                short = False  # the next step's new blocks do not fit
                while True:
                    t0 = now
                    kv_used += cnt[s % block]
                    dt = decode_time(n_dec, sum_l + n_dec, n_dec)
                    now = t0 + dt
                    if now >= horizon or due <= s:
                        break
                    if log:
                        log_row((t0, dt, n_dec, 0, 0, n_dec, 0, kv_used, 0))
                    sum_l += n_dec
                    s += 1
                    if kv_total - kv_used < cnt[s % block]:
                        short = True
                        break
                self.kv_used, self.n_running = kv_used, n_dec
                if short:
                    env._now = now
                    continue
                if now < horizon:
                    env._now = now  # a finishing step, inline
                else:
                    env._now = t0  # the step ends at or after the next event: a SimPy timeout
                    yield env.timeout(dt)
                if log:
                    log_row((t0, dt, n_dec, 0, 0, n_dec, len(waiting), kv_used, 0))  # queue at the step's end
                sum_l += n_dec
                if heap and heap[0][0] <= s:
                    finish_due(s, now)
                s += 1
            if recv_every > 1 and (recv_ct >= recv_every or not order):  # SGLang reads its socket, empty or not
                self.receive(bool(order), t0)
                recv_ct = 0
            elif lag and inbox and recv_every == 1:  # the step now starting was scheduled when the last began
                self.admit_sent(bool(order), t0)
            extra = 0.0  # encoder time of images admitted this step (front-pool encoding)
            if self._freed:
                kv_used -= self._freed
                self._freed = 0
                self.kv_used = kv_used
            if not order and not waiting and not remote and not ready:
                self.kv_used = kv_used  # what the last step's finishes freed, for routers and metrics
                self.n_running = 0
                if group is not None:
                    group.leave(rank)
                self.wake = self.suspend() if lazy else env.event()
                yield self.wake
                now = env.now
                continue
            t0 = now
            n_pre = 0
            # --- decode role: requests whose KV has arrived start decoding (the first step
            # computes the last prompt token and samples the first output token)
            while ready and len(order) < max_seqs:
                rid = ready.popleft()
                order[rid] = None
                self.final_tokens += inp[rid] + out[rid]
                length = inp[rid] - 1
                dec_start[rid] = (s, length, 0)
                cnt[(s - length) % block] += 1
                n_dec += 1
                sum_l += length
                f = s + out[rid] - 1
                fin_at[rid] = f
                heappush(heap, (f, rid))
                new_dec.append(rid)
            # --- decodes: one token each; preempt newest while blocks are short
            need = cnt[s % block]
            while n_dec and kv_total - kv_used < need:
                preempt_newest(s, now, False)
                n_pre += 1
                need = cnt[s % block]
            kv_used += need
            budget = budget_max - n_dec
            chunks = []
            # --- the partial prefill (at most one: a step's last admission is cut by the budget), next chunk in order
            for rid, pf in list(prefill.items()) if prefill else ():
                if budget <= 0:
                    break
                done, target = pf[0], pf[1]
                c = target - done if target - done < budget else budget
                grow = -(-(done + c) // block) - (-(-done // block))
                if kv_total - kv_used < grow:
                    # V1 preempts from the newest running request until the chunk fits, or
                    # until it has preempted this request itself.
                    vic = None
                    while kv_total - kv_used < grow and vic != rid:
                        vic, was_decode = preempt_newest(s, now, True)
                        n_pre += 1
                        if was_decode:
                            budget += 1
                    if vic == rid:
                        continue
                kv_used += grow
                budget -= c
                chunks.append((rid, pf, c))
            # --- admit waiting requests FCFS (V1 admits none in a step that preempted).  A batch
            # slot is kept for every request whose KV is pulled (receiving or ready), so that KV
            # starts decoding as soon as it lands.
            hold = group is not None and waiting and not group.may_prefill(rank, len(order))
            while (
                not (n_pre or hold) and waiting and budget > 0 and len(order) + len(receiving) + len(ready) < max_seqs
            ):
                rid = waiting[0]
                pf = self._requeue.get(rid)
                target = pf[1] if pf is not None else inp[rid]
                # Prefix-cache hit: the cached prompt prefix is not recomputed (at least the
                # last prompt token is, to produce logits).
                done = self.cached_prefix(rid, target) if prefix is not None else 0
                c = target - done
                c = c if c <= budget else (budget if chunked else 0)
                if c <= 0:
                    break
                grow = -(-(done + c) // block)
                if kv_total - kv_used < grow:
                    break
                if reserve is not None and kv_total - kv_used < reserve.free_needed(
                    s, self.final_tokens - kv_used * block, target - done, out[rid] - (pf[2] if pf else 0)
                ):
                    break
                waiting.popleft()
                self.unqueue(rid)
                if encode is not None:
                    extra += encode(self, rid, now)
                if pf is None:
                    pf = [done, target, 0]
                    t_sched[rid] = now
                    if prefix is not None:
                        rec.cached_tokens[rid] = done
                else:
                    pf[0] = done
                    del self._requeue[rid]
                kv_used += grow
                order[rid] = None
                self.final_tokens += inp[rid] + out[rid]
                prefill[rid] = pf
                budget -= c
                chunks.append((rid, pf, c))
            # --- decode role: blocks for prompts whose KV is remote, behind preempted requests (which
            # head V1's single waiting queue)
            if not n_pre and remote and not waiting:
                kv_used += self.allocate_pulls(kv_total - kv_used, len(order), now)
            # --- the batch: one token per decode plus the scheduled prompt chunks
            tokens = logits = n_dec
            pairs = pctx = 0.0
            for _, pf, c in chunks:
                done = pf[0]
                tokens += c
                pairs += c * done + c * (c + 1) * 0.5
                pctx += done
                if done + c == pf[1]:
                    logits += 1
            self.kv_used = kv_used
            self.n_running = len(order)
            if tokens == 0:
                if n_pre:
                    # The preemptions freed blocks and batch slots; V1's next step admits with them.
                    continue
                if self.held or receiving:
                    # Blocks are held for transfers: a release or an arrival of KV wakes the
                    # instance.  Sleeping on anything else could never end, and the run would
                    # stop with requests silently unfinished.
                    if group is not None:
                        group.leave(rank)
                    self.wake = self.suspend() if lazy else env.event()
                    yield self.wake
                    now = env.now
                    continue
                # Nothing schedulable and nothing in flight: should not happen because the newest
                # is preempted first and a batch slot is kept for pulled KV; fail loudly.
                raise RuntimeError(f"instance {self.index}: no progress possible at t={now}")
            if group is not None:
                gpu, cpu = local_time(tokens, logits, pairs, sum_l + n_dec, pctx, len(order), len(waiting))
                t0, dt = yield from group.step(rank, tokens, gpu + extra, cpu)
                now = env.now
            else:
                dt = step_time(tokens, logits, pairs, sum_l + n_dec, pctx, len(order), len(waiting)) + extra
            t_end = now + dt
            if group is not None:
                pass  # the group's step has already run to its end
            elif lazy and not remote:
                if t_end < self.limit:
                    env._now = now = t_end
                else:
                    self.paused = t_end
                    yield self.suspend()
                    self.paused = None
                    env._now = now = t_end
            elif inline and ((t_end < gate[0]) if gate is not None else (not queue or t_end < queue[0][0])):
                # Nothing that could see this instance is due before this step ends (nor at the same time):
                # advance its clock here, with the timeout's arithmetic (env.now + dt), instead of a timeout.
                env._now = now = t_end
            else:
                yield env.timeout(dt)
                now = env.now
            if log:
                log_row((t0, dt, n_dec, tokens - n_dec, logits - n_dec, len(order), len(waiting), kv_used, n_pre))
            # --- apply the step: decodes grow, chunks advance, finishes leave
            sum_l += n_dec
            if new_dec:
                for rid in new_dec:
                    t_first[rid] = now
                new_dec.clear()
            for rid, pf, c in chunks:
                pf[0] += c
                if pf[0] < pf[1]:
                    continue
                del prefill[rid]
                if prefix is not None:
                    self.remember_prefix(rid)
                if is_prefill:
                    # max_tokens=1: the prompt's KV stays allocated until the decode side has it.
                    del order[rid]
                    self.left(rid)
                    self.outstanding -= 1
                    self.held[rid] = -(-pf[1] // block)
                    rec.t_prefilled[rid] = now
                    hand_off(self, rid, now)
                    continue
                g = pf[2] + 1  # tokens generated after this prefill
                if t_first[rid] != t_first[rid]:  # NaN: first token of this request
                    t_first[rid] = now
                else:
                    gaps.append(now - last_tok.pop(rid))
                remaining = out[rid] - g
                if remaining <= 0:
                    self._finish(rid, now, order, g)
                    kv_used -= -(-pf[1] // block)
                    continue
                length = pf[1]
                dec_start[rid] = (s + 1, length, g)
                cnt[(s + 1 - length) % block] += 1
                n_dec += 1
                sum_l += length
                f = s + remaining
                fin_at[rid] = f
                heappush(heap, (f, rid))
            if heap and heap[0][0] <= s:
                finish_due(s, now)
            recv_ct += recv_every if chunks else 1  # a prefill step is followed by a read (SGLang counts it 1000)
            s += 1
