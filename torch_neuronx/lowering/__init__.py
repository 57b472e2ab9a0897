"""ATen op -> StableHLO lowerings, written with jax.numpy / jax.lax.

One function per op, registered in LOWERINGS by @lowering(...). A lowering
takes the op's arguments with jax arrays in place of tensors (scalars, lists
and dtypes as given by the FX graph) and returns jax arrays (a tuple for ops
with several outputs). Tracing the FX graph through these functions under
jax.jit produces one StableHLO module per graph.

Importing this package imports JAX; only the compiler does that, on first use.
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


def _load_table() -> None:
    from torch_neuronx.lowering import aten, random  # noqa: F401  (register the lowerings)
    from torch_neuronx.lowering import control_flow, fft, linalg, misc, optim  # noqa: F401


def lookup(target) -> Callable | None:
    """The lowering of an FX node target (an OpOverload), if any."""
    if not LOWERINGS:
        _load_table()
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(target.overloadpacket)
    return fn


def lowered_op_names() -> set[str]:
    """Base names ("add", "mm") of every op with a lowering."""
    _load_table()
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
