"""The engine's tensor-parallel all-reduce as measured, per GPU: latency by message size and TP size.

The step model charged every all-reduce as ``latency + bytes / link bandwidth`` with the
intra-node link's datasheet figures.  The kernel tables measure vLLM's own all-reduce
(``tensor_model_parallel_all_reduce``: its custom one-shot and two-shot kernels for small
messages, NCCL above) under CUDA graphs and eagerly, and disagree with that line both ways:
on B200 at TP8 a 128 KiB message (8 tokens of a 8192-wide model) takes 9 us and a 256 KiB one
26 us, where the line gives 11.3 and 12.5 us; a prefill-sized one (128 MiB, 8192 tokens) takes
442 us, where the line gives 336 us (a bus bandwidth of 530 GB/s measured against the link's
720 GB/s).  So the profile
keeps the measured curve itself (23 sizes x 3 TP sizes x 2 modes, the table's own figures)
and the step model interpolates it (:class:`hwdb.schema.AllReduceCurve`).

Run::

    python -m calibration.kernels.comm_fit [--kernels DIR] [--write]

``--write`` replaces the ``allreduce`` block of each ``hwdb/data/profiles`` file whose GPU
has a table; :mod:`calibration.kernels.fit` adds the same block when it writes a profile.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd
import yaml

from hwdb.schema import AllReduceCurve

KERNELS = Path(__file__).resolve().parents[3] / "shared" / "data" / "kernels" / "aiconfigurator_vllm_0.24.0"
PROFILES = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "profiles"
TABLE_GPUS = {"h100_sxm": "H100-SXM-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB"}
TABLE = "comm/vllm/0.24.0/custom_allreduce_perf.parquet"
MODES = {"vllm_graph": "graph_s", "vllm_eager": "eager_s"}


def curve_for(root: Path, system: str) -> AllReduceCurve | None:
    """The measured all-reduce of one system's table (bf16 messages), or None without a table."""
    path = Path(root) / system / TABLE
    if not path.is_file():
        return None
    d = pd.read_parquet(path)
    d = d[d.allreduce_dtype == "bfloat16"]
    # message_size counts elements: the collector all-reduces a [size // 4096, 4096] bf16 tensor
    # (aiconfigurator collector/collect_all_reduce.py, get_input_shape_and_comm_size), so bytes = 2 x size.
    sizes = sorted(int(s) for s in d.message_size.unique())
    out: dict[str, dict[int, list[float]]] = {"graph_s": {}, "eager_s": {}}
    for backend, field in MODES.items():
        for tp, g in d[d.backend == backend].groupby("num_gpus"):
            lat = g.groupby("message_size").latency.median()
            if len(lat) == len(sizes):
                # Table latencies are milliseconds; four significant figures as in the other profile blocks.
                out[field][int(tp)] = [float(f"{lat[s] * 1e-3:.4g}") for s in sizes]
    if not out["graph_s"]:
        return None
    return AllReduceCurve(
        sizes_bytes=[2.0 * s for s in sizes],
        graph_s=out["graph_s"],
        eager_s=out["eager_s"],
        source=f"vLLM 0.24.0 tensor-parallel all-reduce measured by aiconfigurator-core 0.12.0 (Apache-2.0): "
        f"aiconfigurator_vllm_0.24.0/{system}/{TABLE}, bf16, CUDA-graph and eager "
        "(calibration/kernels/comm_fit.py)",
    )


def block(curve: AllReduceCurve) -> str:
    """The profile YAML block for ``curve``."""
    return yaml.safe_dump(
        {"allreduce": curve.model_dump(mode="json")}, sort_keys=True, width=200, default_flow_style=None
    )


def write_block(profile: Path, text: str) -> None:
    """Replace (or append) the top-level ``allreduce`` block, leaving the rest as written."""
    src = profile.read_text()
    src = re.sub(r"^allreduce:\n(?:[ ].*\n)*", "", src, flags=re.M)
    profile.write_text(src.rstrip("\n") + "\n" + text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=Path, default=KERNELS)
    ap.add_argument("--write", action="store_true", help="write the blocks into hwdb/data/profiles")
    args = ap.parse_args(argv)
    for tname, gname in TABLE_GPUS.items():
        curve = curve_for(args.kernels, tname)
        if curve is None:
            print(f"{tname}: no all-reduce table under {args.kernels}")
            continue
        for tp, lat in sorted(curve.graph_s.items()):
            pick = {s: lat[i] for i, s in enumerate(curve.sizes_bytes) if s in (131072.0, 1048576.0, 134217728.0)}
            print(f"{gname} TP{tp}: " + ", ".join(f"{s / 2**20:g} MiB {t * 1e6:.1f} us" for s, t in pick.items()))
        prof_path = PROFILES / f"{gname}_vllm-0.24.0.yaml"
        if args.write and prof_path.is_file():
            write_block(prof_path, block(curve))
            print(f"  wrote {prof_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
