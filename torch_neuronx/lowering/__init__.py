"""ATen op -> StableHLO lowerings, written with jax.numpy / jax.lax.

One function per op, registered in LOWERINGS by @lowering(...). A lowering
takes the op's arguments with jax arrays in place of tensors (scalars, lists
and dtypes as given by the FX graph) and returns jax arrays (a tuple for ops
with several outputs). Tracing the FX graph through these functions under
jax.jit produces one StableHLO module per graph.

Importing this package does not import JAX; load() (called by lookup) imports
the lowering modules, and JAX with them, on first use by the compiler.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch

LOWERINGS: dict[object, Callable] = {}


def lowering(*targets):
    """Registers a lowering for ops: an OpOverloadPacket (all overloads) or an OpOverload."""

    def register(fn: Callable) -> Callable:
        for target in targets:
            LOWERINGS[target] = fn
        return fn

    return register


_loaded = threading.Event()
_load_lock = threading.Lock()


def load() -> None:
    """Fills LOWERINGS, once per process: imports the per-domain modules (each
    registers its ops), then adds the entries derived from others."""
    if _loaded.is_set():
        return
    with _load_lock:
        if _loaded.is_set():
            return
        import jax

        # int64 / float64 tensors keep their dtype in the traced graphs: with
        # jax's default (x64 off) they would become int32 / float32. The switch
        # is process-wide; it is set here, before any lowering module builds a
        # jax value, and only this compiler uses jax in the process.
        jax.config.update("jax_enable_x64", True)
        # In this order: where two modules register the same op, the later one's entry is kept.
        from torch_neuronx.lowering import aten, nn, reductions, shapes  # noqa: F401
        from torch_neuronx.lowering import random, control_flow, fft, linalg, misc, optim  # noqa: F401

        # Derived entries, once every plain lowering is registered.
        misc.register_copy_variants()
        aten.register_foreach()
        _loaded.set()


def lookup(target) -> Callable | None:
    """The lowering of an FX node target (an OpOverload), if any."""
    load()
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(target.overloadpacket)
    return fn


def lowered_op_names() -> set[str]:
    """Base names ("add", "mm") of every op with a lowering."""
    load()
    names = set()
    for target in LOWERINGS:
        packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
        names.add(packet.__name__.rstrip("_") if not packet.__name__.endswith("__") else packet.__name__)
    return names


# ------------------------------------------------------------------ trace state
_trace = threading.local()


@contextlib.contextmanager
def rng_scope(seed):
    """Random lowerings draw keys split from `seed` (a traced int input)."""
    import jax

    _trace.key = jax.random.key(seed)
    try:
        yield
    finally:
        _trace.key = None


def next_key():
    import jax

    _trace.key, key = jax.random.split(_trace.key)
    return key


@contextlib.contextmanager
def fp64_rule(emulate: bool):
    """While tracing a graph under the fp64 rule, float64 becomes float32."""
    _trace.emulate_fp64 = emulate
    try:
        yield
    finally:
        _trace.emulate_fp64 = False


def emulating_fp64() -> bool:
    return getattr(_trace, "emulate_fp64", False)


def narrow_input(array):
    """Graph inputs under the fp64 rule: float64 arrays enter as float32
    (None, an effect token, passes through)."""
    if emulating_fp64():
        from torch_neuronx.lowering.conversions import narrow_array

        return narrow_array(array)
    return array
