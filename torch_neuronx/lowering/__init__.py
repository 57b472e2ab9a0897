"""ATen op -> StableHLO lowerings, written with jax.numpy / jax.lax.

One function per op, registered in LOWERINGS by @lowering(...). A lowering
takes the op's arguments with jax arrays in place of tensors (scalars, lists
and dtypes as given by the FX graph) and returns jax arrays (a tuple for ops
with several outputs); one registered with @lowering(..., context=True) takes
the trace's TraceContext first (as JAX passes `ctx` to its lowering rules).
Tracing the FX graph through these functions (interpreter.run_graph) under
jax.jit produces one StableHLO module per graph.

Importing this package does not import JAX; load() (called by lookup) imports
the lowering modules, and JAX with them, on first use by the compiler.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable

import torch

LOWERINGS: dict[object, Callable] = {}


def lowering(*targets, context: bool = False):
    """Registers a lowering for ops: an OpOverloadPacket (all overloads) or an
    OpOverload. With context=True it is called with the TraceContext first."""

    def register(fn: Callable) -> Callable:
        if context:
            fn.takes_context = True
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
        # Run each executable on the calling thread (jax's default hands it to a
        # worker thread, and the caller then waits for it). The backend always
        # waits for a graph's outputs right away, so the hand-off overlapped
        # nothing and cost two thread wake-ups per call: a 2-dot graph took
        # 46-110 us between steps instead of 11 us (docs/compile.md). Applies
        # when jax's CPU client is made after this point (the usual case).
        jax.config.update("jax_cpu_enable_async_dispatch", False)
        # In this order: where two modules register the same op, the later one's entry is kept.
        from torch_neuronx.lowering import elementwise, matmul, nn, reductions, shapes  # noqa: F401
        from torch_neuronx.lowering import random, control_flow, fft, linalg, effects, optim  # noqa: F401
        from torch_neuronx.lowering import scaled_mm, ctc  # noqa: F401

        # Derived entries, once every plain lowering is registered.
        shapes.register_copy_variants()
        optim.register_foreach()
        _loaded.set()


def lookup(target, ctx: TraceContext | None = None) -> Callable | None:
    """The lowering of an FX node target (an OpOverload), if any, as a function
    of the op's arguments: one that takes a context comes bound to `ctx`
    (default: the context being traced, current())."""
    load()
    fn = LOWERINGS.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = LOWERINGS.get(target.overloadpacket)
    if fn is not None and getattr(fn, "takes_context", False):
        fn = functools.partial(fn, current() if ctx is None else ctx)
    return fn


def lowered_op_names() -> set[str]:
    """Base names ("add", "mm") of every op with a lowering."""
    load()
    names = set()
    for target in LOWERINGS:
        packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
        names.add(packet.__name__.rstrip("_") if not packet.__name__.endswith("__") else packet.__name__)
    return names


# ------------------------------------------------------------------ trace context
class TraceContext:
    """What the lowerings of one graph trace share: the random key state (keys
    split from the trace's seed, a traced int input) and the fp64 rule.

    The interpreter (interpreter.run_graph) makes one per trace and passes it
    explicitly: as the first argument of the lowerings registered with
    context=True, and to the subgraphs of control-flow ops. It narrows the
    graph's inputs under the fp64 rule (narrow). The dtype helpers that
    lowerings call everywhere (common.jax_dtype, and promote / default_float
    through it) read the rule from the context being traced, current()."""

    def __init__(self, seed=None, emulate_fp64: bool = False):
        self.emulate_fp64 = emulate_fp64
        self._key = None
        if seed is not None:
            import jax

            self._key = jax.random.key(seed)

    def next_key(self):
        """A fresh random key (random lowerings draw one per op)."""
        import jax

        if self._key is None:
            raise RuntimeError("random lowering traced without a seed (TraceContext(seed=...))")
        self._key, key = jax.random.split(self._key)
        return key

    def narrow(self, array):
        """A graph input under the fp64 rule: float64 arrays enter as float32
        (None, an effect token, passes through)."""
        if self.emulate_fp64:
            from torch_neuronx.lowering.conversions import narrow_array

            return narrow_array(array)
        return array

    @contextlib.contextmanager
    def active(self):
        """Makes this the context current() returns, for the duration of a trace."""
        stack = _active.__dict__.setdefault("stack", [])
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()


_active = threading.local()
_OUTSIDE = TraceContext()  # no trace: no fp64 rule, no random keys


def current() -> TraceContext:
    """The context of the trace running on this thread (outside any: no fp64 rule)."""
    stack = getattr(_active, "stack", None)
    return stack[-1] if stack else _OUTSIDE


@contextlib.contextmanager
def rng_scope(seed):
    """For calling random lowerings outside a graph trace (lookup(op)(...)): their
    keys are split from `seed`."""
    with TraceContext(seed).active():
        yield
