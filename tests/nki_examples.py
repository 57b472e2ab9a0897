"""Loads the sample kernels of examples/nki/ as modules, for the NKI tests."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "nki"


@functools.cache
def load_example(name: str):
    """examples/nki/<name>.py as a module (registered in sys.modules, loaded once)."""
    spec = importlib.util.spec_from_file_location(f"nki_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
