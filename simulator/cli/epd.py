"""``epdsim vision``: visual tokens, encoder cost and embedding bytes of images for a model.

Hooked into ``simulator/cli/commands.py`` by ``add_subparsers(sub)``.  User errors (a
text-only model, a malformed size, an unknown GPU) print one paragraph and
exit with code 2.
"""

from __future__ import annotations

import math
import re

from rich.console import Console
from rich.table import Table

import hwdb
from simulator.console import print_notes, wide_tables
from simulator.epd.encoder import fit_tp_efficiency, tp_speedup
from simulator.epd.epd import encoder_model
from simulator.epd.epd_config import EncoderConfig
from simulator.epd.vision import (
    VisionError,
    embedding_bytes,
    encoder_flops,
    patches,
    resized,
    vision_arch,
    visual_tokens,
)
from simulator.errors import print_user_error
from simulator.inputs import int_arg


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise VisionError(f"--resolution {text!r} is not WIDTHxHEIGHT in pixels, e.g. 1920x1080")
    w, h = int(m.group(1)), int(m.group(2))
    if not (1 <= w <= 65536 and 1 <= h <= 65536):
        raise VisionError(f"--resolution {text!r}: each side must be from 1 to 65536 pixels")
    return w, h


def _tp_times(items: list[str]) -> dict[int, float]:
    out = {}
    for item in items:
        m = re.fullmatch(r"\s*(\d+)\s*=\s*([0-9.eE+-]+)\s*", item)
        tp, secs = 0, math.nan
        if m:
            try:
                tp, secs = int(m.group(1)), float(m.group(2))
            except ValueError:
                pass
        if not m or not (0 < secs < 1e6) or not 1 <= tp <= 64:
            raise VisionError(
                f"--tp-times {item!r} is not TP=SECONDS with TP from 1 to 64 and a positive, finite "
                f"time below 1e6 s, e.g. 2=0.492"
            )
        if tp in out:
            raise VisionError(f"--tp-times gives TP {tp} twice; give each TP degree once")
        out[tp] = secs
    return out


def cmd_vision(args, con: Console) -> int:
    if args.tp_times:
        fitted = fit_tp_efficiency(_tp_times(args.tp_times))
        t = Table(title="encoder TP efficiency fitted to the given encode times (scenario: encoder.tp_efficiency)")
        for col in ("tp", "efficiency", "speed-up over one GPU"):
            t.add_column(col, justify="right")
        for tp, eff in fitted.items():
            t.add_row(str(tp), f"{eff:.3f}", f"{tp * eff:.2f}x")
        con.print(t)
        con.print("tp_efficiency: {" + ", ".join(f"{tp}: {eff:.3f}" for tp, eff in fitted.items()) + "}")
        return 0
    db = hwdb.load(args.hwdb)
    print_notes(db.notes)
    entry = db.model(args.model)
    v = vision_arch(entry)
    gpu = db.gpu(args.gpu)
    engine = db.engine(args.engine)
    cfg = EncoderConfig()
    tp_speedup(args.tp)  # unknown TP degree: a clear error before any table
    model = encoder_model(v, gpu, engine, db.profile_for(gpu.name, engine.engine, engine.version), args.tp, cfg)
    heads = ["image", "encoder\nsees", "visual\ntokens", "patches", "encoder\nTFLOP", "encode\ntime", "embedding\nMB"]
    rows = []
    for text in args.resolution:
        w, h = _size(text)
        rw, rh = resized(v, w, h)
        lin, attn = encoder_flops(v, w, h)
        tok = visual_tokens(v, w, h)
        rows.append(
            [
                f"{w}x{h}",
                f"{rw}x{rh}",
                f"{tok:,}",
                f"{patches(v, w, h):,}",
                f"{(lin + attn) / 1e12:.2f}",
                f"{1e3 * model.batch_time(lin, attn, patches(v, w, h)):.1f} ms",
                f"{embedding_bytes(v, tok) / 1e6:.2f}",
            ]
        )
    # two-line headers keep the seven figures within 80 columns; narrower, the columns split into groups
    for t in wide_tables(
        f"{entry.name} vision encoder ({v.params / 1e9:.2f} B parameters, {v.processor}) on {gpu.name} TP{args.tp}",
        heads,
        rows,
        con.width,
        justify=dict.fromkeys(heads, "right"),
    ):
        con.print(t)
    return 0


def _run(args, con: Console | None = None) -> int:
    con = con or Console()
    try:
        return cmd_vision(args, con)
    except (VisionError, hwdb.HwdbError, ValueError) as exc:
        return print_user_error(exc)


def add_subparsers(sub) -> None:
    """Hook for ``simulator/cli/commands.py``: adds ``epdsim vision``."""
    p = sub.add_parser("vision", help="visual tokens, encoder time and embedding bytes of images for a model")
    p.add_argument("model", help="a vision-language model name or alias (Qwen2.5-VL-7B, Qwen3-VL-4B, ...)")
    p.add_argument(
        "--resolution",
        nargs="+",
        default=["640x480", "1280x720", "1920x1080", "3840x2160"],
        help="image sizes WIDTHxHEIGHT in pixels",
    )
    p.add_argument("--gpu", default="H100")
    p.add_argument("--tp", type=int_arg(1, 64), default=1)
    p.add_argument("--engine", default="vllm-v1")
    p.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    p.add_argument(
        "--tp-times",
        nargs="+",
        metavar="TP=SECONDS",
        help="measured encode times of one workload at several TP degrees (e.g. 2=0.492 4=0.466): "
        "print the fitted encoder.tp_efficiency instead (without TP1, the smallest degree keeps "
        "its default efficiency)",
    )
    p.set_defaults(func=_run)
