"""Measured runs made with speculative decoding, which epdsim does not model: found from the campaigns' own
launch configurations, listed, and left out of the scores.

The table's ids carry no speculative-decoding flag, but InferenceX ran some layouts of a campaign only with
MTP (EAGLE-style draft heads): its master configuration (``.github/configs/nvidia-master.yaml``) gives each
benchmark's search space, and an entry with ``spec-decoding: mtp`` launches the server with speculative
decoding.  A row whose campaign, model, GPU, weight format, engine, lengths, layout and concurrency fall in an
MTP entry and in no plain one measured speculative decoding: e.g. Qwen3.5-397B fp8 on B200 with SGLang at TP4
without expert parallelism decodes at 6.3 ms a token for 4 users, where the same campaign's TP4 EP4 runs
without MTP take 9.9 ms.  Rows an MTP and a plain entry both cover are ambiguous (the table lists both runs
under one name) and stay in.

The MTP-only regions are data (``hwdb/data/validation/speculative_runs.yaml``), written from the master
configurations as the campaigns launched them by::

    python -m calibration.e2e.spec --master 2026_03_25=nvidia-master.yaml@12ba0ae --master 2026_04_06=... --write
"""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

import yaml

from calibration.e2e.rows import Row
from simulator.inputs import read_yaml

REGIONS = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "validation" / "speculative_runs.yaml"
# InferenceX's model-prefix -> a name the table's model path contains (case-insensitive)
MODELS = {
    "dsr1": "deepseek-r1",
    "qwen3.5": "qwen3.5",
    "glm5": "glm-5",
    "kimik2.5": "kimi-k2.5",
    "gptoss": "gpt-oss",
    "minimaxm2.5": "minimax-m2.5",
}
PRECISIONS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "int4_wo": "int4", "bf16": "bf16"}
FRAMEWORKS = {"sglang": "sglang", "trt": "trtllm", "vllm": "vllm"}
KEY = ("model", "system", "precision", "backend", "isl", "osl", "tp", "ep", "dp_attention")


def search_space(master: dict) -> list[dict]:
    """Every single-node search-space entry of a master configuration, one dict per (entry, concurrency)."""
    out = []
    for cfg in master.values():
        if not isinstance(cfg, dict) or cfg.get("multinode") or cfg.get("model-prefix") not in MODELS:
            continue
        for seq in cfg.get("seq-len-configs", []):
            for s in seq.get("search-space", []):
                c, hi = int(s["conc-start"]), int(s["conc-end"])
                base = {
                    "model": cfg["model-prefix"],
                    "system": cfg["runner"],
                    "precision": cfg["precision"],
                    "backend": FRAMEWORKS.get(cfg["framework"], cfg["framework"]),
                    "isl": seq["isl"],
                    "osl": seq["osl"],
                    "tp": int(s["tp"]),
                    "ep": int(s.get("ep", 1)),
                    "dp_attention": bool(s.get("dp-attn", False)),
                    "mtp": s.get("spec-decoding") == "mtp",
                }
                while c <= hi:  # the benchmark doubles the users from conc-start to conc-end
                    out.append({**base, "concurrency": c})
                    c *= 2
    return out


def mtp_only(master: dict) -> list[dict]:
    """The layouts and concurrencies the configuration ran with MTP and never without, grouped by layout."""
    runs = search_space(master)
    plain = {tuple(r[k] for k in (*KEY, "concurrency")) for r in runs if not r["mtp"]}
    regions: dict[tuple, set[int]] = {}
    for r in runs:
        key = tuple(r[k] for k in KEY)
        if r["mtp"] and (*key, r["concurrency"]) not in plain:
            regions.setdefault(key, set()).add(r["concurrency"])
    return [{**dict(zip(KEY, key, strict=True)), "concurrency": sorted(c)} for key, c in sorted(regions.items())]


@cache
def regions(path: Path = REGIONS) -> tuple[dict, ...]:
    """The shipped MTP-only regions, each with its ``campaign`` (the table ids' date prefix)."""
    return tuple(read_yaml(path)["regions"])


def speculative(row: Row, table: tuple[dict, ...] | None = None) -> str:
    """'' or why ``row`` measured speculative decoding (its campaign ran that run only with MTP)."""
    if row.disagg:
        return ""
    system = row.system.removesuffix("_sxm")
    precision = PRECISIONS.get(row.quant, row.quant)
    model = row.model.lower()
    for g in regions() if table is None else table:
        if (
            row.id.startswith(g["campaign"])
            and MODELS[g["model"]] in model
            and g["system"] == system
            and g["precision"] == precision
            and g["backend"] == row.backend
            and g["isl"] == row.isl
            and g["osl"] == row.osl
            and g["tp"] == row.tp
            and g["ep"] == row.moe_ep
            and g["dp_attention"] == (row.dp > 1)
            and row.concurrency in g["concurrency"]
        ):
            return "speculative decoding: the campaign ran this layout only with MTP, which is not modelled"
    return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--master",
        action="append",
        required=True,
        metavar="CAMPAIGN=PATH[@COMMIT]",
        help="a campaign's date prefix and the master configuration it launched with",
    )
    ap.add_argument("--write", action="store_true", help=f"write {REGIONS.relative_to(REGIONS.parents[3])}")
    args = ap.parse_args(argv)
    out, sources = [], []
    for spec in args.master:
        campaign, _, where = spec.partition("=")
        path, _, commit = where.partition("@")
        found = mtp_only(yaml.safe_load(Path(path).read_text()))
        out += [{"campaign": campaign, **g} for g in found]
        sources.append(f"{campaign}: InferenceX .github/configs/nvidia-master.yaml at {commit or path}")
        print(f"{campaign}: {len(found)} layouts run only with MTP")
    doc = {
        "source": "; ".join(sources) + " (search-space entries with spec-decoding: mtp that no plain entry "
        "covers; python -m calibration.e2e.spec)",
        "regions": out,
    }
    text = (
        yaml.safe_dump({"source": doc["source"]}, width=120)
        + "regions:\n"
        + "".join("- " + yaml.safe_dump(g, sort_keys=False, width=400, default_flow_style=True) for g in out)
    )
    if args.write:
        REGIONS.write_text(
            "# Generated by `python -m calibration.e2e.spec --write`; rerun it rather than editing.\n" + text
        )
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
