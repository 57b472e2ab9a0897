"""Small patches that close gaps in third-party libraries for the ``neuron`` device.

Each patch is a function registered with :func:`patches` against the module it
fixes (``"accelerate.utils.modeling"``, ...). It runs right after that module
finishes importing, or at once when the module is already imported, so users
import nothing Neuron-specific: the libraries just work. Importing this
package imports none of the patched libraries.

A patch must be idempotent and as small as possible; docs/huggingface.md lists
every one with the gap it closes. Set TORCH_NEURONX_DISABLE_INTEGRATIONS=1 to
run the libraries unpatched (to check whether a gap still exists).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}
_APPLIED: list[str] = []
_LOCK = threading.RLock()


def patches(module_name: str) -> Callable[[Callable[[ModuleType], None]], Callable[[ModuleType], None]]:
    """Decorator: run ``fn(module)`` once ``module_name`` is imported."""

    def register(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        with _LOCK:
            module = sys.modules.get(module_name)
            if module is not None and getattr(module, "__spec__", None) is not None \
                    and not _is_initializing(module):
                _apply(fn, module)
            else:
                _PENDING.setdefault(module_name, []).append(fn)
        return fn

    return register


_PATCHED_ATTR = "_torch_neuronx_patched"


def mark_patched(fn):
    """Tags a replacement function, so that applying a patch twice is a no-op."""
    setattr(fn, _PATCHED_ATTR, True)
    return fn


def already_patched(fn) -> bool:
    return getattr(fn, _PATCHED_ATTR, False)


def replace_once(owner, name: str, build: Callable[[Callable], Callable]) -> None:
    """Replaces ``owner.<name>`` with ``build(original)``, which takes on the
    original's name, docstring and signature (functools.wraps) and is tagged,
    so that applying the same patch again changes nothing."""
    original = getattr(owner, name)
    if already_patched(original):
        return
    setattr(owner, name, mark_patched(functools.wraps(original)(build(original))))


def neuron_is_the_accelerator() -> bool:
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator is not None and accelerator.type == "neuron"


def applied_patches() -> list[str]:
    """Names (``module:function``) of the patches applied so far, in order."""
    return list(_APPLIED)


def _is_initializing(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _apply(fn: Callable[[ModuleType], None], module: ModuleType) -> None:
    fn(module)
    _APPLIED.append(f"{module.__name__}:{fn.__name__}")


def _run_pending(module: ModuleType) -> None:
    with _LOCK:
        fns = _PENDING.pop(module.__name__, [])
    for fn in fns:
        _apply(fn, module)


class _PatchingLoader(importlib.abc.Loader):
    """Wraps a module's real loader and applies its patches after it executes."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_pending(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with pending patches it asks the other
    finders for the spec and swaps in a loader that patches after execution."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Registers the import hook and every patch module (idempotent)."""
    if os.environ.get("TORCH_NEURONX_DISABLE_INTEGRATIONS", "0") == "1":
        return
    if not any(isinstance(f, _PatchingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder())
    from torch_neuronx.integrations import _registry  # noqa: F401  (imports the patch modules)
