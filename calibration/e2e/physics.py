"""Measured serving runs whose own figures need more than the hardware has: listed, and left out of scores.

Two bounds, each a floor no engine can beat, computed from the row's measured means and the deployment
the simulator built for it (:func:`beyond_hardware`):

* **compute**: over a closed-loop run each of the C users completes one request every
  ``TTFT + (osl - 1) x TPOT`` seconds, and a request costs at least ``2 x (linear parameters a token
  multiplies through) x (prompt + output tokens)`` FLOPs (attention left out, so the bound is low).  A
  run whose rate needs more than :data:`PEAK_FRACTION` of the GPUs' dense peak (in the fastest compute
  dtype any of its weight groups uses) cannot have done what the row says (e.g. 100-token outputs whose
  prefills would run at 50-95 % of the fp8 peak);
* **memory**: a decode step reads at least the weights it touches once; a mean TPOT below that
  read at the HBM's full bandwidth (for the average decode batch, by Little's law) is not physical.

Lengths are the benchmark client's means (uniform on [0.8 L, L]: 0.9 L).
"""

from __future__ import annotations

from calibration.e2e.rows import RANGE_RATIO, Row

# Above every GEMM efficiency the kernel tables measured (bf16 ~0.76 of peak on H100/H200, fp8 and fp4
# lower), so a run needing more than this of the dense peak is out of reach of any engine.
PEAK_FRACTION = 0.8


def beyond_hardware(row: Row, dep, step) -> str:
    """'' or why ``row``'s measured means need more than its GPUs can give (colocated runs only).

    ``dep``: the row's :class:`simulator.perf.Deployment`; ``step``: its :class:`simulator.stepmodel.StepModel`."""
    if row.disagg or row.ttft_s <= 0 or row.tpot_s <= 0:
        return ""
    mean_in = (1.0 + RANGE_RATIO) / 2.0 * row.isl
    mean_out = (1.0 + RANGE_RATIO) / 2.0 * row.osl
    cycle = row.ttft_s + max(mean_out - 1.0, 0.0) * row.tpot_s
    flops = 2.0 * dep.arch.linear_params_per_token * (mean_in + mean_out)
    # the fastest tensor cores any of its weight groups runs on: the bound stays a floor
    dense = max({g.compute_dtype for g in dep.linear_groups()}, key=dep.gpu.flops)
    peak = dep.gpus * dep.gpu.flops(dense)
    need = row.concurrency * flops / cycle / peak
    if need > PEAK_FRACTION:
        return (
            f"measured run beyond the hardware: its request rate needs {need:.0%} of the {dep.gpus} GPUs' "
            f"{dense} dense peak (at most {PEAK_FRACTION:.0%} is reachable)"
        )
    decoding = row.concurrency * (mean_out - 1.0) * row.tpot_s / cycle
    per_rank = max(1.0, decoding / dep.dp)
    floor = step.streamed_weight_bytes(int(round(per_rank))) / step.peak_bw
    if row.tpot_s < floor:
        return (
            f"measured run beyond the hardware: TPOT {row.tpot_s * 1e3:.2f} ms is below {floor * 1e3:.2f} ms, one "
            f"read of the weights a step touches at the HBM's full bandwidth"
        )
    return ""
