#!/usr/bin/env bash
# Developer helper: rebuilds the C++ core and swaps the new library in
# atomically (a new inode), so Python processes already running keep theirs.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python setup.py -q build_ext -b build/swap > build/rebuild.log 2>&1 || { grep -E "error" -A3 build/rebuild.log | head -40; exit 1; }
so=$(ls build/swap/torch_neuronx/_C*.so)
cp "$so" torch_neuronx/.C.so.new
mv torch_neuronx/.C.so.new "torch_neuronx/$(basename "$so")"
echo "swapped in $(basename "$so")"
