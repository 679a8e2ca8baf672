"""A kernel-table fit's result (:class:`FitResult`, what :mod:`calibration.kernels.fit` returns), turned into a
calibration Profile, and read/write Profile YAML.

The Profile records every curve with its source, the fit method and per-curve quality, so a profile
file says by itself where its numbers came from (see docs/kernel_fit.md).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from calibration.kernels.tables import (
    ATTN_HEAD_DIMS,
    ATTN_MIN_HEADS,
    DATASET,
    DATASET_CITE,
    DECODE_MAX_BATCH,
    DECODE_MIN_CTX,
    ENGINE,
    ENGINE_VERSION,
    HELD_OUT_ATTN,
    HELD_OUT_GEMM,
    M_MAX,
    M_MIN,
    MIN_NK,
    PREFILL_MIN_ISL,
    SYSTEMS,
    Curve,
    as_curve,
    table_paths,
)
from hwdb.profiles import FitQuality, Profile
from hwdb.schema import EfficiencyCurve
from simulator.inputs import read_yaml

SIG = 4  # significant figures kept in the written profile


@dataclass
class FitResult:
    """Everything one system's fit produced (curves as (max_eff, half), SI units)."""

    system: str
    peaks: dict[str, float]
    compute_bf16: Curve
    compute_fp8: Curve
    memory: Curve
    prefill: Curve
    decode: Curve
    quality: dict[str, FitQuality]
    held_out_p90: dict[str, float]
    counts: dict[str, int]
    diagnostics: dict[str, float] = field(default_factory=dict)


def fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _notes(r: FitResult, holdout: str) -> str:
    q, dg, pk = r.quality, r.diagnostics, r.peaks

    def ns(key: str) -> str:
        return f"{dg[key] * 1e9:.0f}" if key in dg else "?"

    def held_med(key: str) -> str:
        """Quality ``key``'s held-out median (every curve of a kernel fit is scored on held-out rows)."""
        med = q[key].held_out_median_abs_rel_error
        if med is None:
            raise ValueError(f"fit quality {key!r} has no held-out median")
        return fmt_pct(med)

    held = (
        (
            "real-model shapes: GEMM (n,k) "
            + ", ".join(f"{n}x{k}" for n, k in HELD_OUT_GEMM)
            + "; attention (heads, kv_heads, head_dim) "
            + ", ".join(f"{h}/{kv}/{d}" for h, kv, d in HELD_OUT_ATTN)
        )
        if holdout == "models"
        else "every 5th distinct GEMM (n,k) pair and attention head config"
    )
    return "\n".join(
        [
            f"Peaks used (aiconfigurator systems/{r.system}.yaml): bf16 {pk['bf16']:.4g} FLOP/s, "
            f"fp8 {pk['fp8']:.4g} FLOP/s, HBM {pk['mem_bw']:.4g} B/s; efficiencies are fractions of these.",
            f"fp8 linear layers (CutlassFP8ScaledMMLinearKernel, w=1 byte), compute curve not in the schema: "
            f"max_eff={r.compute_fp8[0]}, half={r.compute_fp8[1]} tokens, with the shared memory curve; "
            f"held-out median {held_med('gemm_fp8')}, "
            f"p90 {fmt_pct(r.held_out_p90['gemm_fp8'])} (quality key gemm_fp8). "
            f"With its own memory curve (compute {dg['fp8_own_memory_compute_max_eff']}/"
            f"{dg['fp8_own_memory_compute_half']}, memory {dg['fp8_own_memory_memory_max_eff']}/"
            f"{dg['fp8_own_memory_memory_half']:.4g} B) the held-out median would be "
            f"{fmt_pct(dg['fp8_own_memory_held_out_median'])}. The fp8 layer has a larger fixed cost than bf16 "
            f"(probably the activation quantisation vLLM runs before the GEMM) and its efficiency depends on "
            f"n,k: the model is too fast for n,k <= 1024 and too slow for n,k > 4096.",
            f"Kernel floor: step_overhead_s is left unset; the memory curve's half already acts as a constant "
            f"per-kernel latency, half/(mem_bw*max_eff) = {dg['gemm_floor_s'] * 1e6:.1f} us for a linear layer "
            f"(smallest measured GEMM {dg['gemm_observed_min_s'] * 1e6:.1f} us) and "
            f"{dg['decode_floor_s'] * 1e6:.1f} us for decode attention.",
            f"Prefill attention: the tokens=batch*isl form is biased by isl (too fast below ~2k tokens per "
            f"sequence, too slow above); fitted on isl >= {PREFILL_MIN_ISL}. Diagnostic alternative "
            f"eff(isl) + constant floor: max_eff={dg['prefill_alt_max_eff']}, half={dg['prefill_alt_half_isl']} "
            f"tokens, floor={dg['prefill_alt_floor_s'] * 1e6:.1f} us, held-out median "
            f"{fmt_pct(dg['prefill_alt_held_out_median'])} vs "
            f"{held_med('attention_prefill_efficiency')} for the form used.",
            f"Decode attention: ctx = step + 1 (aiconfigurator logs isl=1 and step = cached tokens); fitted on "
            f"bf16 KV, ctx >= {DECODE_MIN_CTX}, batch <= {DECODE_MAX_BATCH}; the same curve on fp8 KV (1 byte) "
            f"scores held-out median {held_med('attention_decode_fp8_kv')} "
            f"(key attention_decode_fp8_kv). Not captured: a per-sequence cost (slope at ctx=2 from batch 256 "
            f"to the largest measured: median {ns('decode_per_seq_s_median')} ns per sequence, "
            f"{ns('decode_per_seq_s_min')}-{ns('decode_per_seq_s_max')} ns over head configs) that dominates "
            f"at batch > 256 with short contexts.",
            "Held-out p90 |rel err|: "
            + ", ".join(f"{k} {fmt_pct(v)}" for k, v in sorted(r.held_out_p90.items()))
            + ".",
            f"Held out ({holdout}): {held}. compute_efficiency / memory_efficiency quality keys split the bf16 "
            f"GEMM rows by which bound the fitted model says wins; gemm_bf16 covers all of them.",
        ]
    )


def result_to_profile(
    r: FitResult, data_root: Path | str, holdout: str = "models", created: str | None = None
) -> Profile:
    gpu = SYSTEMS.get(r.system, r.system)
    rel = f"{DATASET}/{r.system}"
    paths = {k: str(p.relative_to(Path(data_root))) for k, p in table_paths(Path(data_root), r.system).items()}
    src = f"{DATASET_CITE}; vLLM {ENGINE_VERSION} kernel tables in ../shared/data/kernels/{DATASET}"

    def curve(c: Curve, what: str, key: str) -> EfficiencyCurve:
        q = r.quality[key]
        return EfficiencyCurve(
            max_eff=c[0],
            half=c[1],
            empirical=True,
            source=(
                f"fit to {rel}: {what}; {q.n_points} points, median |rel err| "
                f"{fmt_pct(q.median_abs_rel_error)}, held-out median "
                f"{fmt_pct(q.held_out_median_abs_rel_error or 0.0)} (calibration/kernels/fit.py)"
            ),
        )

    return Profile(
        name=f"{gpu}_{ENGINE}-{ENGINE_VERSION}",
        gpu=gpu,
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        created=created or _dt.date.today().isoformat(),
        source=(
            f"{src}: {paths['gemm']}, {paths['context_attention']}, {paths['generation_attention']}; "
            f"peaks from {DATASET}/{r.system}.yaml"
        ),
        method=(
            "scipy.optimize.least_squares (trf, bounded 0<max_eff<=1, half>=0, soft_l1 loss f_scale=0.1) on "
            "log-latency residuals of the simulator's forms: linear t=max(2mnk/(P*ce(m)), B/(BW*me(B))), "
            "B=(mk+mn)*2+kn*w; bf16 compute and the shared memory curve fitted jointly on "
            "torch.nn.functional.linear, then the fp8 compute curve on CutlassFP8ScaledMMLinearKernel with "
            f"memory fixed; m in [{M_MIN},{M_MAX}], n,k >= {MIN_NK}. Prefill attention "
            f"t=4b(s^2/2)Hd/(P_bf16*pe(b*s)), isl >= {PREFILL_MIN_ISL}; decode attention "
            f"t=B_kv/(BW*de(B_kv)), B_kv=b*ctx*2*H_kv*d*kv_bytes, ctx >= {DECODE_MIN_CTX}, "
            f"batch <= {DECODE_MAX_BATCH}; attention: window 0, head_dim in {list(ATTN_HEAD_DIMS)}, "
            f">= {ATTN_MIN_HEADS} query heads, default vLLM backend per GPU, bf16 KV cache. "
            f"Held-out shapes ({holdout}) excluded from the fit and scored separately; coefficients rounded "
            f"to {SIG} significant figures."
        ),
        compute_efficiency=curve(
            r.compute_bf16,
            "bf16 GEMM (torch.nn.functional.linear) rows where the compute bound wins, x = tokens (m)",
            "compute_efficiency",
        ),
        memory_efficiency=curve(
            r.memory, "bf16 GEMM rows where the memory bound wins, x = bytes moved", "memory_efficiency"
        ),
        attention_prefill_efficiency=curve(
            r.prefill, "prefill attention, x = batch*isl tokens", "attention_prefill_efficiency"
        ),
        attention_decode_efficiency=curve(
            r.decode, "decode attention, x = KV bytes read", "attention_decode_efficiency"
        ),
        compute_efficiency_fp8=EfficiencyCurve(
            max_eff=r.compute_fp8[0],
            half=r.compute_fp8[1],
            empirical=True,
            source=(
                "fp8 linear layers (CutlassFP8ScaledMMLinearKernel) of the same aiconfigurator vLLM "
                f"{ENGINE_VERSION} GEMM table, fitted with the shared memory curve by "
                "calibration/kernels/fit.py (quality key gemm_fp8)"
            ),
        ),
        step_overhead_s=None,
        quality=r.quality,
        notes=_notes(r, holdout),
    )


def profile_filename(profile: Profile) -> str:
    return f"{profile.name}.yaml"


def write_profile(profile: Profile, path: Path | str) -> Path:
    """Write ``profile`` as sorted, human-readable YAML (with a provenance header)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.model_dump(mode="json")
    header = (
        f"# Calibration profile for {profile.gpu} under {profile.engine} {profile.engine_version}.\n"
        f"# Generated by `python -m calibration.kernels.fit`; re-run it rather than editing by hand.\n"
    )
    path.write_text(
        header + yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True, width=100)
    )
    return path


def read_profile(path: Path | str) -> Profile:
    return Profile.model_validate(read_yaml(path))


def fit_summary(p: Profile, r: FitResult, secs: float) -> str:
    q = p.quality

    def row(label, c, key):
        fq = q[key]
        cs = f"max_eff={c[0]:.4g} half={c[1]:.4g}" if c else ""
        return (
            f"  {label:<22} {cs:<34} n={fq.n_points:<6} med={fmt_pct(fq.median_abs_rel_error):>6} "
            f"p90={fmt_pct(fq.p90_abs_rel_error):>6} held-out med="
            f"{fmt_pct(fq.held_out_median_abs_rel_error or 0):>6}"
        )

    lines = [
        f"{p.gpu} ({secs:.1f} s)",
        row("compute (bf16 GEMM)", as_curve(p.compute_efficiency), "compute_efficiency"),
        row("memory (GEMM)", as_curve(p.memory_efficiency), "memory_efficiency"),
        row("GEMM bf16, all", None, "gemm_bf16"),
        row("compute (fp8 GEMM)", r.compute_fp8, "gemm_fp8"),
        row("attention prefill", as_curve(p.attention_prefill_efficiency), "attention_prefill_efficiency"),
        row("attention decode", as_curve(p.attention_decode_efficiency), "attention_decode_efficiency"),
        row("decode, fp8 KV", None, "attention_decode_fp8_kv"),
        "  held-out p90: " + ", ".join(f"{k} {fmt_pct(v)}" for k, v in sorted(r.held_out_p90.items())),
    ]
    return "\n".join(lines)
