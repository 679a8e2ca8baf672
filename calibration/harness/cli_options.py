"""The options of ``epdsim calibrate run`` for one server (the bundle, launch or attach, the probe plan)
and the parsers of their values.  Imports nothing heavy: ``epdsim --help`` builds them; the prefill/decode
pair's own options are :mod:`calibration.pd.options`'s."""

from __future__ import annotations

import argparse

from simulator.inputs import float_arg

# The probe modules (httpx) are imported when a command runs, so that building the ``epdsim`` parser
# stays cheap: hence this copy.
PHASE_KINDS = ("prefill", "decode", "load")  # == calibration.harness.probes.PHASE_KINDS


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _range(s: str) -> tuple[int, int]:
    lo, _, hi = s.partition(":")
    return int(lo), int(hi or lo)


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` items as a mapping (raises argparse.ArgumentTypeError on an item without ``=``)."""
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--env wants KEY=VALUE, got {it!r}")
        out[k] = v
    return out


def add_run_options(r: argparse.ArgumentParser) -> None:
    """The bundle, launch, attach and plan options of a ``run`` parser (in that order in its help)."""
    r.add_argument("--out", required=True, help="bundle directory")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--attach", metavar="URL", help="use a running server (e.g. http://vllm:8000); launch nothing")
    g.add_argument(
        "--launch",
        action="store_true",
        help="start the server here (default): the tiny test model with --vllm-python, or --serve-cmd",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted bundle: skip completed phases and completed requests",
    )
    r.add_argument("--quick", action="store_true", help="a short plan (a few minutes on 2 CPU cores)")
    srv = r.add_argument_group("launch")
    srv.add_argument(
        "--serve-cmd",
        help="full server command, e.g. 'vllm serve meta-llama/Llama-3.1-8B-Instruct "
        "--port 8000 --enable-per-request-metrics' (then give --url)",
    )
    srv.add_argument("--url", help="where the --serve-cmd server listens (default http://127.0.0.1:PORT)")
    srv.add_argument("--port", type=int, help="port (default launch: a free port; --serve-cmd: 8000)")
    srv.add_argument(
        "--vllm-python",
        help="Python with vLLM for the default launch (default: $EPDSIM_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )
    srv.add_argument(
        "--model-dir",
        help="model folder for the default launch (default: BUNDLE/model, a tiny "
        "random-weight Llama made on first use)",
    )
    srv.add_argument("--served-model-name", help="default launch: name to serve the model under")
    srv.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the default launch command (repeatable, e.g. --engine-arg=--max-num-seqs=64)",
    )
    srv.add_argument("--no-enforce-eager", action="store_true", help="default launch without --enforce-eager")
    srv.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="server environment (repeatable)")
    srv.add_argument(
        "--pin",
        metavar="ENGINE:FRONT",
        help="small hosts: the engine core and worker on the ENGINE "
        "CPUs, the API server and this harness on the FRONT CPUs, e.g. 0:1 (docs/calibration.md)",
    )
    srv.add_argument(
        "--ready-timeout",
        type=float_arg(0, 7 * 86400, lo_open=True),
        default=900.0,
        help="seconds to wait for readiness (900)",
    )
    att = r.add_argument_group("attach")
    att.add_argument("--model", help="model id to measure (default: the first of /v1/models)")
    att.add_argument("--api-key", help="bearer token for the server")
    att.add_argument("--server-hardware", help="attach mode: a note on the server's hardware for the manifest")
    att.add_argument(
        "--server-log",
        help="attach mode: the server's saved log (e.g. `kubectl logs POD > f`) to "
        "read start-up phases from (the log's own 1-s clock)",
    )
    pl = r.add_argument_group("plan")
    pl.add_argument("--phases", default=",".join(PHASE_KINDS), help="phase kinds to run (prefill,decode,load)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--prefill-lengths", type=_ints, help="comma list of prompt lengths")
    pl.add_argument("--prefill-repeats", type=int)
    pl.add_argument("--decode-concurrency", type=_ints, help="comma list of concurrency levels")
    pl.add_argument(
        "--decode-prompt",
        type=_ints,
        help="comma list of decode prompt lengths: a decode sweep at "
        "each (two or more let the fit see the KV stream's cost)",
    )
    pl.add_argument("--decode-output", type=int)
    pl.add_argument(
        "--decode-rounds",
        type=int,
        default=None,
        help="requests per user at each decode level (4 with --quick, else 2)",
    )
    pl.add_argument("--load-fractions", type=_floats, help="Poisson rates as fractions of the decode capacity")
    pl.add_argument("--load-rates", type=_floats, help="absolute Poisson rates (req/s); replace the fractions")
    pl.add_argument("--load-requests", type=int)
    pl.add_argument("--load-prompt", type=_range, help="LO:HI prompt lengths of load requests")
    pl.add_argument("--load-output", type=_range, help="LO:HI output lengths of load requests")
    pl.add_argument("--closed-concurrency", type=_ints, help="closed-loop load levels (comma list)")
    pl.add_argument(
        "--trace",
        metavar="FILE",
        help="replay a trace file as the load test (arrivals and lengths as "
        "recorded; the formats `epdsim simulate` reads) instead of the "
        "Poisson and closed-loop loads",
    )
    pl.add_argument("--trace-format", default="auto", help="azure, mooncake, plain or auto (default)")
    pl.add_argument("--trace-limit", type=int, help="replay only the first N requests of the trace")
