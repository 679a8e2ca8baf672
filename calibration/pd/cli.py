"""The PD (prefill/decode) forms of ``epdsim calibrate``: ``run --pd``, ``show`` and ``validate`` of a PD bundle.

    epdsim calibrate run --pd --out BUNDLE [--connector example|nixl] [--model-dir DIR]
                         [--prefill-bind 0 --decode-bind 1] [--load-requests N] [--load-rates R]
    epdsim calibrate show BUNDLE
    epdsim calibrate validate BUNDLE --profile HWDB_DIR [--tolerance 0.25] [--strict]

``run --pd`` maps the colocated run's options onto :mod:`calibration.pd.run` (``--load-requests``
is the number of requests, ``--load-rates`` its one Poisson rate, ``--load-output LO:HI`` the
output lengths) and refuses those that have no meaning for a pair.  Errors are ``BundleError``
(exit 2) and ``ServerError`` (exit 3), as the colocated commands'.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from calibration.harness.bundle import BundleError
from calibration.harness.interrupt import interruptible
from calibration.pd import run as pd_run
from calibration.pd.bundle import PDReplayError, pd_summary, read_manifest, show_pd
from calibration.pd.replay import part_summary, replay

# calibrate run's options that mean nothing for a PD pair: (attribute, flag, value when not given)
NOT_FOR_PD: tuple[tuple[str, str, bool | list[str] | None], ...] = (
    ("attach", "--attach", None),
    ("resume", "--resume", False),
    ("quick", "--quick", False),
    ("serve_cmd", "--serve-cmd", None),
    ("url", "--url", None),
    ("port", "--port", None),
    ("served_model_name", "--served-model-name", None),
    ("engine_arg", "--engine-arg", []),
    ("env", "--env", []),
    ("model", "--model", None),
    ("api_key", "--api-key", None),
    ("trace", "--trace", None),
    ("load_fractions", "--load-fractions", None),
    ("closed_concurrency", "--closed-concurrency", None),
    ("load_prompt", "--load-prompt", None),
    ("prefill_lengths", "--prefill-lengths", None),
    ("decode_concurrency", "--decode-concurrency", None),
    ("pin", "--pin", None),
)
NOT_FOR_PD_VALIDATE = (
    ("gpu", "--gpu"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("block_size", "--block-size"),
    ("phases", "--phases"),
)


def pd_run_args(a) -> argparse.Namespace:
    """``calibrate run --pd`` options -> ``pd_run run`` options (raises BundleError on one that does not apply)."""
    bad = [flag for attr, flag, unset in NOT_FOR_PD if getattr(a, attr, unset) not in (unset, None)]
    if getattr(a, "phases", "prefill,decode,load") != "prefill,decode,load":
        bad.append("--phases")
    if bad:
        raise BundleError(
            f"{', '.join(bad)}: not an option of `calibrate run --pd` (a PD run launches its own pair "
            f"with --model-dir, or attaches with --prefill-url and --decode-url, and runs one Poisson "
            f"load test: --load-requests, --load-rates, --load-output, --blocks)"
        )
    rates = a.load_rates or [0.8]
    if len(rates) != 1:
        raise BundleError(f"--load-rates {','.join(map(str, rates))}: a PD run has one load test; give one rate")
    lo, hi = a.load_output or (16, 64)
    return argparse.Namespace(
        out=a.out,
        model_dir=a.model_dir,
        vllm_python=a.vllm_python,
        seed=a.seed,
        ready_timeout=min(a.ready_timeout, 900.0),
        requests=a.load_requests or 36,
        rate=rates[0],
        out_min=lo,
        out_max=hi,
        connector=a.connector,
        prefill_url=a.prefill_url,
        decode_url=a.decode_url,
        kv_path=a.kv_path,
        prefill_bind=a.prefill_bind,
        decode_bind=a.decode_bind,
        nixl_progress_thread=a.nixl_progress_thread,
        blocks=a.blocks,
        extra_tokens=a.extra_tokens,
        layers=a.layers,
        kv_bytes_per_token_layer=a.kv_bytes_per_token_layer,
    )


def cmd_run(a, con: Console) -> int:
    args = pd_run_args(a)
    try:
        with interruptible():  # SIGINT and SIGTERM stop the pair, and the manifest says interrupted
            pd_run.cmd_run(args)
    except PDReplayError as exc:
        raise BundleError(str(exc)) from None
    except KeyboardInterrupt:
        Console(stderr=True).print(
            f"[red]interrupted[/]: {escape(str(a.out))}/manifest.json has status interrupted "
            f"(a PD run does not resume: run it again)"
        )
        return 130
    show_pd(pd_summary(a.out), con)
    return 0


def cmd_show(a, con: Console) -> int:
    s = pd_summary(a.bundle)
    if a.json:
        print(json.dumps(s, indent=2, default=str))
    else:
        show_pd(s, con)
    return 0


def _profile(a) -> tuple[list[str], str | None]:
    """hwdb folders and engine of ``--profile`` (a hwdb folder, or a profile YAML in its profiles/)."""
    p = Path(a.profile)
    if p.is_file():
        return [str(p.parent.parent), *a.hwdb], p.stem  # every fit names its engine after its profile
    if not p.is_dir():
        raise BundleError(
            f"--profile {a.profile}: no such folder; give the hwdb folder `epdsim calibrate fit "
            f"FIT_BUNDLE --out HWDB_DIR` wrote"
        )
    return [str(p), *a.hwdb], None


def cmd_validate(a, con: Console) -> int:
    bad = [flag for attr, flag in NOT_FOR_PD_VALIDATE if getattr(a, attr, None) is not None]
    if getattr(a, "without_overhead", False):
        bad.append("--without-overhead")
    if bad:
        raise BundleError(
            f"{', '.join(bad)}: not an option for a PD bundle (its replay uses the engine the fit "
            f"wrote, two CPU-host pools and the measured arrivals)"
        )
    dirs, engine = _profile(a)
    out = Path(a.out) if a.out else Path(a.bundle) / "validation"
    try:
        rep = replay(a.bundle, dirs, engine, a.model, out=out, tolerance=a.tolerance)
    except PDReplayError as exc:
        raise BundleError(str(exc)) from None
    t = Table(
        title=f"{escape(str(a.bundle))}: PD pair ({rep['connector']}), {rep['n']} requests, "
        f"{rep['checks'] - rep['failed']}/{rep['checks']} checks within {rep['tolerance']:.0%}"
    )
    for c in ("metric", "stat", "source", "measured", "predicted", "error", "verdict"):
        t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")

    def ms(x):
        return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.2f} ms"

    for r in rep["table"]:
        err = "-" if not math.isfinite(r["rel_error"]) else f"{r['rel_error'] * 100:+.1f}%"
        verdict = "info" if not r["check"] else ("ok" if r["passed"] else "[red]FAIL[/]")
        t.add_row(r["metric"], r["stat"], r["source"], ms(r["measured_s"]), ms(r["predicted_s"]), err, verdict)
    con.print(t)
    pt = Table(title="part by part (p50 over the requests)")
    for c in ("part", "measured", "simulated", "difference"):
        pt.add_column(c, justify="left" if c == "part" else "right")
    for r in rep["parts"]:
        diff = "-" if not math.isfinite(r["difference_s"]) else f"{r['difference_s'] * 1e3:+.1f} ms"
        pt.add_row(r["part"], ms(r["measured_s"]), ms(r["predicted_s"]) if r["modelled"] else "not modelled", diff)
    con.print(pt)
    con.print(escape(part_summary(rep["parts"])))
    con.print(
        f"transfer bandwidth {rep['bandwidth_Bps'] / 1e9:.3g} GB/s ({rep['bandwidth_source']}); simulated "
        f"{rep['completed_pred']} of {rep['n']}; report: {rep['out']}/report.json, scenario.yaml"
    )
    con.print(
        "information rows are not checked: the simulator has no router and no HTTP hops (client TTFT), and "
        "adds the connector's setup time to the transfer"
    )
    return 1 if a.strict and not rep["passed"] else 0


def is_pd_bundle(path) -> bool:
    return read_manifest(path) is not None
