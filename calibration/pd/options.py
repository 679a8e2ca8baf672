"""The options of a PD (prefill/decode) run, shared by ``epdsim calibrate run --pd`` and
``python -m calibration.pd.run run``.  Imports nothing heavy: ``epdsim --help`` builds them."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterable
from pathlib import Path

from calibration.harness.bundle import BundleError
from hwdb.files import parse_file
from hwdb.loader import load_kind
from hwdb.schema import Connector
from simulator.pd.connector_base import KVConnector
from simulator.pd.connectors import connector_strategy

# The --connector of a PD run that names none.
DEFAULT_CONNECTOR = "example"


def harness_connectors(user_dirs: Iterable[str | Path] = ()) -> dict[str, KVConnector]:
    """The hwdb connectors the CPU pair runs (their strategy has a ``cpu_pair``), by name: the choices of
    ``--connector``.  Reads only the connectors (``epdsim --help`` builds the option)."""
    tables, _ = load_kind("connectors", functools.partial(parse_file, schema=Connector), user_dirs)
    strategies = {name: connector_strategy(conn) for name, conn in tables.get("connectors", {}).items()}
    return {name: s for name, s in strategies.items() if s.cpu_pair is not None}


def pair_connector(vllm_name: str | None) -> KVConnector | None:
    """The harness connector (:func:`harness_connectors`) whose servers ran vLLM's ``vllm_name`` (what a PD
    bundle's manifest records; None there: the default connector); None when no shipped one did."""
    pairs = harness_connectors()
    if vllm_name is None:
        return pairs[DEFAULT_CONNECTOR]
    return next((s for s in pairs.values() if s.vllm_connector() == vllm_name), None)


def add_pd_options(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Connector, attach URLs, pinning, and the prompt mix of the PD load test."""
    g.add_argument(
        "--connector",
        choices=list(harness_connectors()),
        default=None,
        help="vLLM KV connector of the pair: example (ExampleConnector, KV through files; default) or nixl "
        "(NixlConnector, kv_buffer_device cpu; needs `pip install nixl` in the vLLM Python)",
    )
    g.add_argument(
        "--nixl-progress-thread",
        choices=["on", "off"],
        default=None,
        help="nixl: NIXL's progress thread, which polls with sched_yield on each worker's core: on "
        "(vLLM's default) or off (UCX progresses when the connector polls)",
    )
    g.add_argument("--prefill-url", default=None, help="attach: a running kv_producer server (with --decode-url)")
    g.add_argument("--decode-url", default=None, help="attach: a running kv_consumer server (with --prefill-url)")
    g.add_argument("--kv-path", default=None, help="ExampleConnector shared_storage_path (default OUT/kv)")
    g.add_argument("--prefill-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND of the prefill server, e.g. 0")
    g.add_argument("--decode-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND of the decode server, e.g. 1")
    g.add_argument("--blocks", default=None, help="prompt lengths in 128-token blocks (default 1,2,3,4,6)")
    g.add_argument(
        "--extra-tokens",
        type=int,
        default=2,
        help="tokens beyond the whole blocks (2: all blocks move with ExampleConnector)",
    )
    g.add_argument(
        "--layers",
        type=int,
        default=4,
        help="files per transfer (one per layer) for the file bandwidth probe (ExampleConnector)",
    )
    g.add_argument(
        "--kv-bytes-per-token-layer",
        type=int,
        default=2 * 2 * 64 * 2,
        help="K+V bytes per token per layer for that probe (tiny Llama: 2 KV heads x 64 x bf16 x 2)",
    )


# options only a PD run has: (attribute, flag)
PD_ONLY = (
    ("connector", "--connector"),
    ("nixl_progress_thread", "--nixl-progress-thread"),
    ("prefill_url", "--prefill-url"),
    ("decode_url", "--decode-url"),
    ("kv_path", "--kv-path"),
    ("prefill_bind", "--prefill-bind"),
    ("decode_bind", "--decode-bind"),
    ("blocks", "--blocks"),
)


def check_not_pd_options(a) -> None:
    """A colocated ``calibrate run`` given a PD-only option: say that it needs ``--pd``."""
    given = [flag for attr, flag in PD_ONLY if getattr(a, attr, None) is not None]
    if given:
        raise BundleError(
            f"{', '.join(given)}: options of a prefill/decode pair; add --pd "
            f"(epdsim calibrate run --pd --out BUNDLE ...)"
        )
