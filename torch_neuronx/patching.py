"""Every change torch_neuronx makes to code it does not own, through one helper.

Two mechanisms live here and nowhere else:

- :func:`patch_once` replaces an attribute of PyTorch or of a third-party
  library (a function, a method, a code object) with a replacement built from
  the original, once: the replacement carries one marker (:data:`MARKER`, the
  :class:`Patch` record), so applying the same patch again changes nothing. Each
  patch is recorded (what was replaced, by which torch_neuronx module, and why);
  :func:`applied` lists them, in the order they were applied.
  The integrations (torch_neuronx/integrations) decide *when* a library's patch
  runs (when that library is imported); the replacing itself is this helper.
- :func:`hide_from_dynamo` keeps Dynamo out of a kernel (the op's
  implementation, not user code) and out of everything it calls.

This module imports nothing but the standard library (no torch at import).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

MARKER = "_torch_neuronx_patch"  # set on each replacement: its Patch record


@dataclass(frozen=True)
class Patch:
    target: str  # what was replaced: "torch._tensor_str._Formatter.__init__"
    by: str  # the torch_neuronx module whose code replaced it
    why: str
    owner: Any = field(repr=False, compare=False)
    attribute: str = ""
    original: Any = field(default=None, repr=False, compare=False)
    replacement: Any = field(default=None, repr=False, compare=False)

    def installed(self) -> bool:
        """Whether the replacement is still in place (nobody replaced it since)."""
        return getattr(self.owner, self.attribute, None) is self.replacement

    def __str__(self) -> str:
        return f"{self.target} (by {self.by}): {self.why}"


_PATCHES: list[Patch] = []
_LOCK = threading.RLock()


def _qualified(owner: Any) -> str:
    module = getattr(owner, "__module__", None)
    qualname = getattr(owner, "__qualname__", None)
    if isinstance(owner, type) or callable(owner) and qualname:
        return f"{module}.{qualname}" if module else str(qualname)
    return getattr(owner, "__name__", type(owner).__name__)  # a module


def is_patched(value: Any) -> bool:
    """Whether ``value`` is a replacement installed by :func:`patch_once`."""
    try:
        if isinstance(getattr(value, MARKER, None), Patch):
            return True
    except Exception:  # an object whose __getattr__ raises something else
        pass
    with _LOCK:  # objects that cannot carry the marker (code objects)
        return any(patch.replacement is value for patch in _PATCHES)


def patch_once(owner: Any, attribute: str, build: Callable[[Any], Any], *, why: str,
               wraps: bool = True) -> Patch | None:
    """Replaces ``owner.<attribute>`` with ``build(original)``, once.

    ``wraps``: the replacement takes on the original's name, docstring and
    signature (functools.wraps); pass False for what is not a function (a code
    object). ``build`` returning the original itself means there is nothing to
    change (nothing is recorded). Returns the new record, or None when the
    attribute is already a replacement (patched before) or nothing changed.
    Raises AttributeError naming the target when ``owner`` has no such attribute
    (the patched library changed shape)."""
    target = f"{_qualified(owner)}.{attribute}"
    with _LOCK:
        try:
            original = getattr(owner, attribute)
        except AttributeError:
            raise AttributeError(
                f"torch_neuronx cannot patch {target}: it does not exist in this version "
                f"({_versions(owner)}). torch_neuronx must be updated for it."
            ) from None
        if is_patched(original):
            return None
        replacement = build(original)
        if replacement is original:
            return None
        if wraps:
            replacement = functools.wraps(original)(replacement)
        record = Patch(target, getattr(build, "__module__", "?"), why, owner, attribute, original,
                       replacement)
        try:
            setattr(replacement, MARKER, record)
        except (AttributeError, TypeError):
            pass  # e.g. a code object: recognized by identity (is_patched)
        setattr(owner, attribute, replacement)
        _PATCHES.append(record)
        return record


def _versions(owner: Any) -> str:
    import sys

    root = (getattr(owner, "__module__", None) or getattr(owner, "__name__", "") or "").split(".")[0]
    module = sys.modules.get(root)
    version = getattr(module, "__version__", None)
    return f"{root} {version}" if version else root or "unknown"


def applied() -> list[Patch]:
    """Every patch applied so far in this process (PyTorch and libraries), in order."""
    with _LOCK:
        return list(_PATCHES)


def hide_from_dynamo(kernel: Callable) -> Callable:
    """Marks a kernel so that Dynamo neither traces it nor anything it calls.

    A kernel is an op's implementation, not user code: when it runs eagerly
    inside a torch.compile region (a frame Dynamo fell back on, a collective
    after a graph break), Dynamo must not compile pieces of it (breaking their
    graphs on the device's host-memory calls). Marks the code object the way
    torch.compiler.disable(recursive=True) does, in place and without importing
    Dynamo; returns the kernel itself (register it as it is)."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    set_code_exec_strategy(kernel.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    # A call Dynamo meets while tracing its caller is not inlined either: it breaks
    # the graph there and runs eagerly (the attribute torch.compiler.disable sets).
    kernel._torchdynamo_disable = True
    kernel._torchdynamo_disable_msg = "a torch_neuronx kernel runs eagerly"
    return kernel
