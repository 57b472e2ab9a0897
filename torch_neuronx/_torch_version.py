"""The PyTorch releases this package supports, and the refusal outside them.

The C++ core (torch_neuronx._C) links against PyTorch's C++ libraries, whose ABI
changes between releases: loaded beside another PyTorch than the one it was
built against, it fails with an undefined symbol, or loads and crashes later.
So before anything loads it, the installed PyTorch is checked against the
supported releases and against the one the core was built for (the build writes
that version next to the library, ``_C.torch_version``; setup.py).

Outside the range, ``import torch_neuronx`` raises an ImportError that names the
installed and the supported versions and what to do. When ``import torch``
autoloads the package (its ``torch.backends`` entry point), an error would fail
``import torch`` itself, so there the same message is a warning and ``torch``
imports with the ``neuron`` device unregistered.

This module imports nothing of the package and nothing of PyTorch's beyond its
version string.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

# The PyTorch releases (major.minor) this package is built and tested against: the
# two AWS releases TorchNeuron for (Neuron 2.33 ships torch-neuronx 2.13.3.0 and 2.14.3.0).
# pyproject.toml's dependency range says the same.
SUPPORTED = ("2.13", "2.14")

BUILT_FOR_FILE = "_C.torch_version"  # written by setup.py's build_ext next to _C's library


def release(version: str) -> str:
    """'2.14.1+cu130' -> '2.14'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def built_for() -> str | None:
    """The PyTorch version the C++ core was built against, or None for a build that
    did not record it."""
    path = Path(__file__).with_name(BUILT_FOR_FILE)
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def problem(installed: str, built: str | None) -> str | None:
    """What is wrong with this PyTorch for this package, in words, or None."""
    supported = " and ".join(SUPPORTED)
    if release(installed) not in SUPPORTED:
        return (
            f"torch-neuronx supports PyTorch {supported}; the installed PyTorch is {installed}. "
            f"Install a supported release (e.g. pip install torch=={SUPPORTED[0]}.0, then rebuild "
            "torch-neuronx: pip install --no-build-isolation -e .), or use a torch-neuronx "
            f"release made for PyTorch {release(installed)}."
        )
    if built is not None and release(built) != release(installed):
        return (
            f"torch-neuronx's C++ core was built against PyTorch {built}; the installed PyTorch is "
            f"{installed}. Rebuild it against the installed one: pip install --no-build-isolation -e . "
            "(or bash scripts/setup.sh in a checkout)."
        )
    return None


def _autoloaded(torch_module) -> bool:
    """Whether `import torch` is still running, i.e. its backend autoload imports us."""
    spec = getattr(torch_module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def check(torch_module) -> bool:
    """True when this PyTorch is supported. Otherwise raises ImportError, or, while
    `import torch` autoloads the package, warns and returns False."""
    message = problem(torch_module.__version__, built_for())
    if message is None:
        return True
    if _autoloaded(torch_module):
        warnings.warn(
            f"{message} The 'neuron' device is not registered. "
            "(TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops torch from loading torch-neuronx.)",
            RuntimeWarning,
            stacklevel=2,
        )
        # The half-initialized package is not left for a later `import torch_neuronx`,
        # which should raise the same message rather than find a module without the device.
        return False
    raise ImportError(message)


def forget_package() -> None:
    """Removes the refused package (and its submodules) from sys.modules once the
    autoload has returned, so that a later `import torch_neuronx` runs check() again
    and raises."""
    for name in [n for n in sys.modules if n == "torch_neuronx" or n.startswith("torch_neuronx.")]:
        del sys.modules[name]
