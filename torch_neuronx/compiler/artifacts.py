"""Compilation artifacts under TORCH_NEURONX_DEBUG_DIR (when
TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1): fx_graphs/ and stablehlo/,
in one subdirectory per rank."""

from __future__ import annotations

import itertools
import os

from torch_neuronx import config

_counter = itertools.count()


def directory() -> str | None:
    root = config.debug_dir()
    keep = config.preserve_compilation_artifacts()
    if not root or not keep:
        return None
    return os.path.join(root, f"rank{config.rank()}")


def write(name: str, fx_code: str, stablehlo: str) -> None:
    root = directory()
    if root is None:
        return
    stem = f"{next(_counter):04d}_{name}"
    for sub, suffix, text in (("fx_graphs", ".py", fx_code), ("stablehlo", ".mlir", stablehlo)):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
        with open(os.path.join(root, sub, stem + suffix), "w") as handle:
            handle.write(text)
