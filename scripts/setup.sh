#!/usr/bin/env bash
# Creates a virtual environment (Python 3.11), installs torch, then builds and
# installs torch-neuronx (C++ core included) in editable mode.
# Idempotent: a second run only rebuilds what changed.
#
#   TORCH_VERSION  the PyTorch release (default 2.13.0, the CPU build on every machine's
#                  disk; 2.14.1 is supported too: on x86_64 a CUDA build of several GB,
#                  which runs on the CPU)
#   VENV           the environment's folder (default .venv)
# The C++ core is built in place, for one PyTorch at a time: after switching releases,
# rerun this script for the environment you use (it relinks; build/ keeps each one's objects).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VENV="${VENV:-.venv}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade "setuptools>=69" wheel ninja==1.13.2
# torch first: the extension builds against it without build isolation.
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install -q --no-build-isolation -e ".[test,hf,audit,fp8]"
# `import nki` / `import neuronxcc.nki` in kernels written for AWS's packages: the startup hook
# that a wheel installs, which an editable install leaves out (docs/nki.md, "Import styles").
"$VENV/bin/python" -m torch_neuronx._nki_aliases >/dev/null
# Headless Chromium (Debian's package) for tests/test_audit_html.py, which opens the
# audit's HTML report in a browser. Only as root with apt; a no-op once installed.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } \
        || echo "setup.sh: could not install chromium; tests/test_audit_html.py needs it" >&2
fi
