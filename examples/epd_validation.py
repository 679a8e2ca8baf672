"""epdsim's side of docs/validation/epd.md: predictions for the published EPD scenarios.

Run: ``.venv/bin/python examples/epd_validation.py`` (about a minute).  Prints
Markdown tables; the published figures are quoted from ../shared/docs/FACTS.md.
Scenario details the publications do not give (image sizes, text lengths) are
assumptions stated in the note, and are parameters here.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import yaml

import hwdb
from simulator.epd.epd import encoder_model
from simulator.epd.epd_config import EncoderConfig
from simulator.epd.vision import encoder_flops, patches, vision_arch, visual_tokens
from simulator.goodput import find_goodput
from simulator.run import simulate
from simulator.scenario import parse_scenario

# H20 is not in hwdb (no sourced datasheet was read); these figures are the widely reported NVIDIA HGX H20
# specification and are used only for the ViT timing check below.
H20 = {
    "name": "H20",
    "vendor": "nvidia",
    "memory_bytes": {
        "value": 96e9,
        "source": "NVIDIA H20 (96 GB HBM3), widely reported; not verified",
        "empirical": True,
    },
    "memory_bandwidth_Bps": {"value": 4.0e12, "source": "widely reported 4.0 TB/s; not verified", "empirical": True},
    "peak_flops": {
        "bf16": {"value": 148e12, "source": "widely reported 148 TFLOPS dense BF16; not verified", "empirical": True},
        "fp8": {"value": 296e12, "source": "widely reported 296 TFLOPS dense FP8; not verified", "empirical": True},
    },
    "intra_node_link": "nvlink4",
    "intra_node_bandwidth_Bps": {
        "value": 450e9,
        "source": "NVLink 900 GB/s bidirectional, widely reported",
        "empirical": True,
    },
    "scale_out_link": "roce-400",
    "scale_out_bandwidth_Bps": {"value": 50e9, "source": "assumed 400G NIC per GPU", "empirical": True},
    "gpus_per_node": 8,
    "power_W": {"value": 400, "source": "widely reported", "empirical": True},
    "price_usd_per_hour": {"value": 1.0, "source": "placeholder", "empirical": True},
    "compute_efficiency": {"max_eff": 0.8, "half": 16, "source": "H100 default shape", "empirical": True},
    "memory_efficiency": {"max_eff": 0.8, "half": 4.0e6, "source": "H100 default shape", "empirical": True},
}


def vit_tp_table(width=1920, height=1080, images=4) -> list[tuple[int, float, float]]:
    """(tp, predicted ms, published ms) for Qwen2.5-VL-72B's ViT on H20."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "gpus").mkdir()
        (Path(d) / "gpus" / "H20.yaml").write_text(yaml.safe_dump(H20))
        db = hwdb.load([d])
        v = vision_arch(db.model("Qwen2.5-VL-72B"))
        lin, attn = encoder_flops(v, width, height)
        eng = db.engine("sglang")
        out = []
        for tp, ms in ((2, 492), (4, 466), (8, 524)):
            m = encoder_model(v, db.gpu("H20"), eng, None, tp, EncoderConfig())
            out.append((tp, 1e3 * m.batch_time(images * lin, images * attn, images * patches(v, width, height)), ms))
        return out


def vllm_goodput(side=640, text=512, out=128, n=600) -> dict[str, float]:
    """Goodput (P99 TTFT < 20 s, P99 TPOT < 100 ms) of DP4 vs 1E3PD, Qwen3-VL-4B on 4 A100, 4 images/request."""
    wl = {
        "arrival": {"kind": "poisson", "rate": 1.0},
        "input_length": {"kind": "fixed", "value": text},
        "output_length": {"kind": "fixed", "value": out},
        "num_requests": n,
        "images": {"count": {"kind": "fixed", "value": 4}, "resolutions": [{"width": side, "height": side}]},
    }
    slo = {"ttft_s": 20.0, "tpot_s": 0.1, "percentile": 99}
    layouts = {
        "DP4 (colocated)": [{"name": "lm", "gpu": "A100", "instances": 4}],
        "1E3PD": [
            {"name": "lm", "gpu": "A100", "instances": 3},
            {"name": "enc", "role": "encoder", "gpu": "A100", "instances": 1},
        ],
    }
    scns = {
        name: parse_scenario(
            {"name": name, "seed": 1, "model": "Qwen3-VL-4B", "pools": pools, "workload": wl, "slo": slo}
        )
        for name, pools in layouts.items()
    }
    db = hwdb.load(next(iter(scns.values())).hwdb)  # once for both layouts' probes
    return {name: find_goodput(scn, 40.0, iterations=7, db=db) for name, scn in scns.items()}


def sglang_ttft(gpu="H100", rate=1.0, n=300) -> dict[str, dict]:
    """Mean and P50 TTFT at 1 QPS, 1-8 1080p images, Qwen3-VL-235B-A22B FP8: colocated TP4 vs 2 TP1 encoders
    + the same TP4 instance (2E1P)."""
    wl = {
        "arrival": {"kind": "poisson", "rate": rate},
        "input_length": {"kind": "fixed", "value": 300},
        "output_length": {"kind": "fixed", "value": 200},
        "num_requests": n,
        "images": {"count": {"kind": "uniform", "low": 1, "high": 8}, "resolutions": [{"width": 1920, "height": 1080}]},
    }
    lm = {"name": "lm", "gpu": gpu, "tp": 4, "dtype": "fp8"}
    layouts = {"colocated TP4": [lm], "2E1P": [lm, {"name": "enc", "role": "encoder", "gpu": gpu, "instances": 2}]}
    out = {}
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "gpus").mkdir()
        (Path(d) / "gpus" / "H20.yaml").write_text(yaml.safe_dump(H20))
        for name, pools in layouts.items():
            s = simulate(
                parse_scenario(
                    {
                        "name": name,
                        "seed": 1,
                        "model": "Qwen3-VL-235B-A22B",
                        "pools": pools,
                        "workload": wl,
                        "hwdb": [d],
                    }
                )
            ).summary
            out[name] = {
                "mean": s["ttft_s"]["mean"],
                "p50": s["ttft_s"]["p50"],
                "gpus": s["gpus"],
                "split": s["ttft_breakdown_mean_s"],
                "util": s["encoder"]["utilisation"],
            }
    return out


def main() -> int:
    db = hwdb.load()
    print(
        f"Qwen3-VL-4B 640x640: {visual_tokens(vision_arch(db.model('Qwen3-VL-4B')), 640, 640)} visual tokens "
        "(published ~400)\n"
    )
    print("| ViT TP | epdsim ms | published ms | error |\n|---|---|---|---|")
    for tp, ms, pub in vit_tp_table():
        print(f"| {tp} | {ms:.0f} | {pub} | {100 * (ms / pub - 1):+.0f}% |")
    for side in (640, 1920):
        g = vllm_goodput(side=side)
        print(f"\nvLLM goodput, 4 images {side}px: " + ", ".join(f"{k}: {v:.2f} QPS" for k, v in g.items()))
    for gpu in ("H100", "H20"):
        t = sglang_ttft(gpu)
        print(
            f"\n{gpu}\n| layout | GPUs | mean TTFT s | P50 TTFT s | encode s | queue s | prefill s |\n"
            "|---|---|---|---|---|---|---|"
        )
        for k, v in t.items():
            sp = v["split"]
            print(
                f"| {k} | {v['gpus']} | {v['mean']:.3f} | {v['p50']:.3f} | {sp['encode']:.3f} | {sp['queue']:.3f} "
                f"| {sp['prefill']:.3f} |"
            )
        a, b = t["colocated TP4"], t["2E1P"]
        print(f"ratio colocated/2E1P: mean {a['mean'] / b['mean']:.2f}x, P50 {a['p50'] / b['p50']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
