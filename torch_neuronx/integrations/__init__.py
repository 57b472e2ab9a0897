"""Small patches that close gaps in third-party libraries for the ``neuron`` device.

Each patch is a function registered with :func:`patches` against the module it
fixes (``"accelerate.utils.modeling"``, ...). It runs right after that module
finishes importing (also when that import was already under way, e.g. a
library imported before torch), or at once when it is already imported, so users
import nothing Neuron-specific: the libraries just work. Importing this
package imports none of the patched libraries.

A patch must be idempotent and as small as possible: it replaces attributes
with torch_neuronx.patching.patch_once (once, recorded with its reason, listed
by patching.applied()); docs/huggingface.md lists every one with the gap it
closes. Set TORCH_NEURONX_DISABLE_INTEGRATIONS=1 to
run the libraries unpatched (to check whether a gap still exists).

The import hook itself (:func:`patches`) also applies the backend's own Dynamo
patches when ``torch._dynamo`` is imported (torch_neuronx/compiler/dynamo.py):
those are no library patch, and stay on under that variable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable
from types import ModuleType

from torch_neuronx import patching

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}
_APPLIED: list[str] = []
_REGISTERED: list[str] = []
_LOCK = threading.RLock()


def patches(module_name: str) -> Callable[[Callable[[ModuleType], None]], Callable[[ModuleType], None]]:
    """Decorator: run ``fn(module)`` once ``module_name`` is imported."""

    def register(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        with _LOCK:
            _REGISTERED.append(f"{module_name}:{fn.__name__}")
            module = sys.modules.get(module_name)
            spec = getattr(module, "__spec__", None)
            if module is not None and spec is not None and not _is_initializing(module):
                _apply(fn, module)
                return fn
            _PENDING.setdefault(module_name, []).append(fn)
            _watch_imports()
            if spec is not None:
                # Mid-import (e.g. `import accelerate` imported torch, which loaded this
                # package, from inside accelerate.accelerator): its finder already ran.
                _run_pending_when_imported(spec)
        return fn

    return register


# The replacing itself (once, marked, recorded) is torch_neuronx.patching's:
# patch modules call patching.patch_once(owner, name, build, why=...).
already_patched = patching.is_patched


def neuron_is_the_accelerator() -> bool:
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator is not None and accelerator.type == "neuron"


def applied_patches() -> list[str]:
    """Names (``module:function``) of the patches applied so far, in order."""
    return list(_APPLIED)


def registered_patches() -> list[str]:
    """Names (``module:function``) of every patch registered, applied or not."""
    return list(_REGISTERED)


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


def _run_pending_when_imported(spec: importlib.machinery.ModuleSpec) -> None:
    """Runs the module's pending patches right after its code has executed.

    The import system marks that moment by setting ``spec._initializing = False``
    (importlib._bootstrap._load_unlocked), whether the import started before or
    after the patch was registered, so the spec's class is swapped (until then) for
    a subclass whose ``_initializing`` setter applies the patches. Wrapping the
    loader instead would miss a module whose ``exec_module`` is already running,
    and re-checking at later imports would miss one that finishes last."""
    cls = type(spec)
    if getattr(cls, "_torch_neuronx_hook", False):
        return
    try:
        spec.__class__ = type(cls.__name__, (cls,), {"_initializing": _FINISH, "_torch_neuronx_hook": True})
    except TypeError:  # a finder's own spec class with a fixed layout (__slots__)
        warnings.warn(f"torch_neuronx: {spec.name} is imported through a {cls.__name__}, which cannot "
                      "be hooked: its neuron patches (docs/huggingface.md) are not applied.", stacklevel=2)


def _get_initializing(spec) -> bool:
    return spec.__dict__.get("_initializing", False)


def _set_initializing(spec, value: bool) -> None:
    spec.__dict__["_initializing"] = value
    if value:
        return
    spec.__class__ = type(spec).__bases__[0]  # back to the plain spec class
    module = sys.modules.get(spec.name)
    if module is not None and module.__spec__ is spec:  # not a failed import (then still pending)
        _run_pending(module)


_FINISH = property(_get_initializing, _set_initializing)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with pending patches it asks the other
    finders for the spec and has it run the patches once the module has executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                _run_pending_when_imported(spec)
                return spec
        return None


def _watch_imports() -> None:
    """Puts the finder first in sys.meta_path, once: from the first pending patch on."""
    if not any(isinstance(f, _PatchingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder())


def install() -> None:
    """Registers every library patch module (idempotent)."""
    from torch_neuronx import config

    if config.disable_integrations():
        return
    from torch_neuronx.integrations import _registry  # noqa: F401  (imports the patch modules)
