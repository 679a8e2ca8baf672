"""Fast analytic screen of candidates, built on the simulator's own step model.

For an instance receiving ``r`` requests/s of mean prompt ``I`` and mean
output ``O`` tokens, the steady state is a fixed point of the mean step time
``t``: by Little's law ``B = r O t`` sequences decode and ``P = r I t``
prompt tokens are prefilled per step.  A colocated instance's steps are
bimodal: a fraction ``f = P / min(I, budget - B)`` carries prompt chunks
(``step_time(B + P / f, ...)``), the rest only decode, and ``t`` is the mean of
the two (the roofline is convex, so this exceeds the step time of the mean
batch).  A PD decode instance's steps are decode-only.  Iterating from an
empty step converges to the smallest fixed point or breaks a limit (token
budget, ``max_num_seqs``, KV blocks): overload.  TPOT is ``t``.  TTFT at the
SLO quantile ``q`` is the prompt's service (chunks of the step budget left by
the decodes, the percentile prompt) plus an M/M/1 waiting-time quantile
``ln(rho / (1 - q)) E[S] / (1 - rho)`` (zero when ``rho <= 1 - q``) with
``rho`` the prefill share of the budget.  PD adds the KV transfer of the
percentile prompt, slowed by ``1 / (1 - rho_link)`` (fair sharing), and the
decode instance's first step.  Images add their encode time (the simulator's
encoder model) inside the colocated or prefill steps, or, with an encoder
pool, an M/M/1 encoder queue plus the embedding transfer.  Goodput is the
highest rate at which both quantiles meet the SLO (bisection).  These are
screening approximations: the discrete-event simulation verifies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from simulator.epd.epd import EPDError, embedding_path, encoder_model
from simulator.epd.epd_config import EmbeddingTransferConfig, EncoderConfig
from simulator.pd.pd import TransferPlan, build_transfer_plan
from simulator.pd.pd_config import KVTransferConfig
from simulator.scenario import PoolConfig

OVERLOAD = math.inf


@dataclass(frozen=True)
class Estimate:
    """Screen figures of a candidate at the target rate (seconds, requests/s)."""

    ttft_s: float
    tpot_s: float
    goodput_rps: float
    limit: str  # "" when the SLO is met at the target rate, else what breaks first


def steady_state(
    step,
    knobs,
    kv_tokens: int,
    r: float,
    I: float,  # noqa: E741 - the docstring's I
    O: float,  # noqa: E741 - the docstring's O
    prefill: bool,
    e: float = 0.0,
) -> tuple[float, float, float, float, str]:
    """The one steady-state estimate of an instance at ``r`` requests/s (see the module docstring):
    ``(t, B, P, t_mix, limit)``: the mean step time, the decoding batch, the prompt tokens per step and
    the step time of a step that carries prompt tokens, or ``OVERLOAD`` and what breaks first.

    ``prefill``: the instance also prefills (colocated): its steps are bimodal, a fraction ``f`` carrying
    prompt chunks, and images encoded inside the steps (``e`` seconds per request) add ``r t e``.
    Otherwise (a PD decode instance) each step recomputes one prompt token per arrival."""
    ctx = I + O / 2.0
    budget, seqs = knobs.max_num_batched_tokens, knobs.max_num_seqs
    t = step.step_time(1.0, 1.0, 0.0, ctx, 0.0, 1, 0)
    for _ in range(200):
        B = r * O * t
        if B > seqs:
            return OVERLOAD, B, 0.0, OVERLOAD, f"max_num_seqs={seqs} reached"
        if B * ctx > 0.95 * kv_tokens:
            return OVERLOAD, B, 0.0, OVERLOAD, f"KV cache full ({kv_tokens:,} tokens)"
        if prefill:
            room = budget - B
            P = r * I * t  # prompt tokens to prefill per step
            if room < 1 or P > room:
                return OVERLOAD, B, P, OVERLOAD, f"token budget {budget} per step exceeded"
            # Steps are bimodal: a fraction f carries C prompt tokens, the rest only decodes
            # (the mean of the two step times, not the step time of the mean: the roofline is convex).
            f = min(1.0, P / min(I, room))
            C = P / f if f > 0 else 0.0
            t_mix = step.step_time(B + C, max(1.0, B), C * I / 2.0, B * ctx, 0.0, int(B) + 1, 0)
            t_dec = step.step_time(max(B, 1.0), max(1.0, B), 0.0, max(B, 1.0) * ctx, 0.0, int(B) + 1, 0)
            t_new = f * t_mix + (1.0 - f) * t_dec + r * t * e
        else:
            P = r * t  # PD decode: one recomputed prompt token per arrival
            if B + P > budget:
                return OVERLOAD, B, P, OVERLOAD, f"token budget {budget} per step exceeded"
            t_mix = t_new = step.step_time(B + P, max(1.0, B), 0.0, B * ctx, 0.0, int(B) + 1, 0)
        if abs(t_new - t) <= 1e-7 + 1e-6 * t:
            return t_new, B, P, t_mix, ""
        t = t_new
    return OVERLOAD, r * O * t, 0.0, OVERLOAD, "step time does not settle (saturated)"


def encode_time(ctx, gpu: str, tp: int) -> float:
    """Seconds to encode one request's images (the workload's mean work, one batch) on ``tp`` GPUs of
    type ``gpu`` with the simulator's encoder model; 0 for a text-only workload."""
    img = ctx.stats.images
    if img is None or img.images == 0:
        return 0.0
    g = ctx.db.gpu(gpu)
    engine = ctx.db.engine("vllm-v1")
    model = encoder_model(
        img.vision, g, engine, ctx.db.profile_for(g.name, engine.engine, engine.version), tp, EncoderConfig()
    )
    return model.batch_time(img.lin_flops, img.attn_flops, img.patches)


def _wait_quantile(rho: float, mean_service: float, q: float) -> float:
    """M/M/1 waiting-time quantile: P(W > x) = rho exp(-(1 - rho) x / E[S])."""
    if rho >= 1.0:
        return OVERLOAD
    if rho <= 1.0 - q:
        return 0.0
    return math.log(rho / (1.0 - q)) * mean_service / (1.0 - rho)


class Screen:
    """Analytic estimates for the candidates of one plan (caches per pool layout and rate)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        s = ctx.stats
        self.I, self.O, self.Iq = s.mean_in, s.mean_out, s.q_in
        self.q = ctx.req.quantile
        slo = ctx.req.slo
        self.ttft_slo = slo.ttft_s if slo.ttft_s is not None else math.inf
        self.tpot_slo = slo.tpot_s if slo.tpot_s is not None else math.inf
        self.layout = {lay.key: lay for lay in ctx.layouts}
        self._colocated = lru_cache(maxsize=None)(self._colocated_raw)
        self._prefill = lru_cache(maxsize=None)(self._prefill_raw)
        self._decode = lru_cache(maxsize=None)(self._decode_raw)
        self._plans: dict = {}
        self._enc: dict = {}
        self._paths: dict = {}
        self.images = ctx.stats.images

    def enc(self, gpu: str, tp: int) -> float:
        if (gpu, tp) not in self._enc:
            self._enc[(gpu, tp)] = encode_time(self.ctx, gpu, tp)
        return self._enc[(gpu, tp)]

    # -- per-rank figures at per-rank rate r (an instance of dp ranks takes dp x r): (ttft_part, tpot, limit).
    # A rank's step model prices the MoE layers for the whole group's tokens (ranks equally loaded).
    def _colocated_raw(self, key, r: float, inline: bool = True) -> tuple[float, float, str]:
        lay = self.layout[key]
        k, I, O, step = lay.dep.knobs, self.I, self.O, lay.step  # noqa: E741 - the module docstring's I, O
        e = self.enc(lay.gpu, lay.tp) if inline else 0.0  # images encoded inside this instance's steps
        if r * e >= 1.0:
            return OVERLOAD, OVERLOAD, "encoding images inside the steps saturates the instance"
        t, B, P, t_mix, why = steady_state(step, k, lay.mem.kv_tokens, r, I, O, True, e)
        if why:
            return OVERLOAD, OVERLOAD, why
        budget, ctx = k.max_num_batched_tokens, I + O / 2.0
        room = budget - B
        chunk_q = min(self.Iq, room)
        t_chunk = step.step_time(B + chunk_q, max(1.0, B), chunk_q * self.Iq / 2.0, B * ctx, 0.0, int(B) + 1, 0)
        service_mean = math.ceil(I / room) * t_mix
        wait = _wait_quantile(P / room, service_mean, self.q)
        ttft = wait + math.ceil(self.Iq / room) * t_chunk + 0.5 * t + e
        return ttft, t, "" if wait < OVERLOAD else "prefill queue saturated"

    def _prefill_raw(self, key, r: float, inline: bool = True) -> tuple[float, float, str]:
        lay = self.layout[key]
        k = lay.dep.knobs
        budget = k.max_num_batched_tokens
        e = self.enc(lay.gpu, lay.tp) if inline else 0.0
        s_mean = lay.step.prefill_time(max(1, round(self.I)), budget) + e
        s_q = lay.step.prefill_time(max(1, round(self.Iq)), budget) + e
        per_tok = min(s_mean / self.I, lay.step.step_time(budget, budget / self.I, budget * self.I / 2.0, 0.0) / budget)
        rho = r * (self.I * per_tok + e)
        wait = _wait_quantile(rho, s_mean, self.q)
        return wait + s_q, 0.0, "" if wait < OVERLOAD else "prefill pool saturated"

    def _decode_raw(self, key, r: float) -> tuple[float, float, str]:
        lay = self.layout[key]
        t, _, _, _, why = steady_state(lay.step, lay.dep.knobs, lay.mem.kv_tokens, r, self.I, self.O, False)
        if why:
            return OVERLOAD, OVERLOAD, f"decode: {why}"
        return 1.5 * t, t, ""

    def _plan(self, cand) -> TransferPlan:
        key = (cand.pool("prefill").key, cand.pool("decode").key, cand.fabric)
        if key not in self._plans:
            lp, ld = self.layout[key[0]], self.layout[key[1]]
            cfg = KVTransferConfig(connector=cand.connector, fabric=cand.fabric)
            self._plans[key] = build_transfer_plan(cfg, self.ctx.db, lp.dep, ld.dep)
        return self._plans[key]

    # -- candidate figures at total rate lam
    def _embedding(self, enc, front) -> tuple[float, float]:
        """(seconds to move one request's embeddings on an idle path, path bandwidth) encoder -> LM."""
        key = (enc.gpu, enc.tp, front.gpu, front.tp, front.role)
        if key not in self._paths:
            cfg = EmbeddingTransferConfig(
                connector=self.ctx.req.fabrics.connector, fabric=self.ctx.req.fabrics.links[0]
            )
            e_pool = PoolConfig(name="encoder", role="encoder", gpu=enc.gpu, tp=enc.tp)
            l_pool = PoolConfig(name=front.role, role=front.role, gpu=front.gpu, tp=front.tp)
            path = embedding_path(
                cfg, self.ctx.db, e_pool, self.ctx.db.gpu(enc.gpu), enc.tp, l_pool, self.layout[front.key].dep
            )
            self._paths[key] = (path.idle_time(self.images.emb_bytes), path.per_instance_Bps())
        return self._paths[key]

    def front_end(self, key) -> float:
        """The engine's client-visible way in for the quantile prompt (``frontend_s`` + per prompt token,
        side by side and serial parts alike), which the simulation adds to every TTFT."""
        eng = self.layout[key].dep.engine
        per_token = sum(f.value for f in (eng.frontend_s_per_token, eng.frontend_serial_s_per_token) if f is not None)
        return (eng.frontend_s.value if eng.frontend_s is not None else 0.0) + per_token * self.Iq

    def at(self, cand, lam: float) -> tuple[float, float, str]:
        """(TTFT at the percentile, TPOT, limit) of ``cand`` at ``lam`` requests/s."""
        enc = next((p for p in cand.pools if p.role == "encoder"), None)
        inline = enc is None
        extra = 0.0
        if enc is not None:
            r = lam / enc.instances
            e = self.enc(enc.gpu, enc.tp)
            wait = _wait_quantile(r * e, e, self.q)
            if wait >= OVERLOAD:
                return OVERLOAD, OVERLOAD, "encoder pool saturated"
            front = next(p for p in cand.pools if p.role in ("colocated", "prefill"))
            try:
                idle, bw = self._embedding(enc, front)
            except EPDError as exc:
                return OVERLOAD, OVERLOAD, f"embedding transfer impossible: {exc}"
            rho = lam / (front.instances * front.dp) * self.images.emb_bytes / bw
            if rho >= 1.0:
                return OVERLOAD, OVERLOAD, "embedding transfer saturated"
            extra = wait + e + idle / (1.0 - rho)
        roles = {p.role: p for p in cand.pools}
        if "colocated" in roles:
            p = roles["colocated"]
            ttft, tpot, why = self._colocated(p.key, _r(lam / (p.instances * p.dp)), inline)
            return ttft + extra + self.front_end(p.key), tpot, why
        pp, pd_ = roles["prefill"], roles["decode"]
        t_pre, _, why = self._prefill(pp.key, _r(lam / (pp.instances * pp.dp)), inline)
        if why:
            return OVERLOAD, OVERLOAD, why
        t_dec, tpot, why = self._decode(pd_.key, _r(lam / (pd_.instances * pd_.dp)))
        if why:
            return OVERLOAD, OVERLOAD, why
        plan = self._plan(cand)
        nbytes = plan.bytes_for(self.I)
        rho = max(
            lam / pp.instances * nbytes / plan.per_instance_Bps("prefill"),
            lam / pd_.instances * nbytes / plan.per_instance_Bps("decode"),
        )
        if rho >= 1.0:
            return OVERLOAD, OVERLOAD, f"KV transfer over {plan.link_name} saturated"
        return (
            extra + self.front_end(pp.key) + t_pre + plan.idle_time(max(1, round(self.Iq))) / (1.0 - rho) + t_dec,
            tpot,
            "",
        )

    def meets(self, cand, lam: float) -> bool:
        ttft, tpot, why = self.at(cand, lam)
        return not why and ttft <= self.ttft_slo and tpot <= self.tpot_slo

    def goodput(self, cand, iterations: int = 14) -> float:
        """Highest rate meeting the SLO by the estimate (0 when even a trickle fails)."""
        lo, hi = 0.0, self.ctx.req.target_rate
        if not self.meets(cand, 1e-3):
            return 0.0
        for _ in range(12):
            if not self.meets(cand, hi):
                break
            lo, hi = hi, hi * 2.0
        else:
            return lo
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            if self.meets(cand, mid):
                lo = mid
            else:
                hi = mid
        return lo

    def estimate(self, cand) -> Estimate:
        lam = self.ctx.req.target_rate
        ttft, tpot, why = self.at(cand, lam)
        if not why:
            bad = []
            if ttft > self.ttft_slo:
                bad.append(f"ttft: est p{round(self.q * 100)} TTFT {ttft:.3g} s > {self.ttft_slo:g} s")
            if tpot > self.tpot_slo:
                bad.append(f"tpot: est TPOT {tpot:.3g} s > {self.tpot_slo:g} s")
            why = "; ".join(bad)
        else:
            why = f"overload: {why}"
        return Estimate(ttft, tpot, self.goodput(cand), why)


def _r(x: float) -> float:
    """Round a per-instance rate so that the caches hit across candidates (4 significant digits)."""
    return float(f"{x:.4g}")
