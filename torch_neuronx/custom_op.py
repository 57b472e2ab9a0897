"""Python functions (that call NKI kernels) as PyTorch custom operators:
``torch_neuronx.nki_op`` and ``torch_neuronx.wrap_nki``. Nothing here imports
the NKI package; this module is about torch.library, signatures and caching.

``nki_op("ns::name", mutates_args=...)`` turns a Python function that allocates
outputs and calls ``@nki.jit`` kernels into a ``torch.library`` custom op, so
that it dispatches like any ATen op, takes ``register_autograd`` for training,
and stays one node of the graph under ``torch.compile(backend="neuron")`` (the
compiler splits the graph around custom ops and runs them eagerly).

Compilation model (as for an NKI kernel on Trainium, see docs/nki.md): the first call for a given signature
(tensor shapes, dtypes and devices, plus the values of the non-tensor
arguments) "compiles" the kernel: on the emulator that is one simulated run,
which validates every hardware rule and records the output metadata. The
record is cached per op; later calls with the same signature hit the cache.
Under torch.compile the op's fake (meta) implementation is served from the same
cache; a signature seen first while tracing is compiled on zero-filled CPU
inputs, so hardware-rule violations surface at compile time, as on Trainium.
"""

from __future__ import annotations

import inspect
import operator
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

from torch_neuronx import patching

__all__ = ["nki_op", "wrap_nki", "WrappedKernel", "KernelCache"]


@dataclass(frozen=True)
class CompiledKernel:
    """What one compile of an op's signature recorded."""

    outputs: object  # pytree: TensorMeta for tensors, the value itself otherwise
    compile_seconds: float


@dataclass
class KernelCache:
    """Per-op cache of compiled signatures, with hit/miss counters."""

    entries: dict = field(default_factory=dict)
    compiles: int = 0
    hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.compiles = self.hits = 0


def _signature(args, kwargs) -> tuple:
    """Cache key: shapes/dtypes/device types of tensors, values of everything else."""

    def key(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), x.dtype, x.device.type)
        try:
            hash(x)
            return x
        except TypeError:
            return repr(x)

    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (str(spec), tuple(key(leaf) for leaf in leaves))


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


def _output_meta(result):
    return pytree.tree_map(
        lambda x: TensorMeta(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x, result
    )


def _check_annotations(fn: Callable, name: str) -> None:
    """torch.library infers the op schema from annotations; say so plainly when one is missing."""
    sig = inspect.signature(fn)
    missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    if missing:
        raise TypeError(
            f"nki_op('{name}'): {fn.__qualname__} needs explicit type annotations for "
            f"{', '.join(repr(m) for m in missing)}. The operator schema is built from them: annotate "
            "tensors as torch.Tensor, scalars as int/float/bool, optional ones as Optional[...], and the "
            "return value (torch.Tensor, tuple[torch.Tensor, ...] or None)."
        )


def _zeros_like_on_cpu(x):
    if isinstance(x, torch.Tensor):
        return torch.zeros(x.shape, dtype=x.dtype, device="cpu")
    return x


def _fake_outputs(meta, device: torch.device):
    """Outputs live where the inputs do (a kernel runs on the inputs' core)."""
    return pytree.tree_map(
        lambda leaf: torch.empty(leaf.shape, dtype=leaf.dtype, device=device)
        if isinstance(leaf, TensorMeta) else leaf,
        meta,
    )


def _first_device(args, kwargs) -> torch.device:
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


def _compiling_impl(fn: Callable, cache: KernelCache) -> Callable:
    """The op's implementation: runs ``fn`` and records a compile on a new signature."""

    def impl(*args, **kwargs):
        key = _signature(args, kwargs)
        with cache.lock:
            hit = key in cache.entries
            if hit:
                cache.hits += 1
        if hit:
            return fn(*args, **kwargs)
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        _record(cache, key, result, time.perf_counter() - start)
        return result

    impl.__signature__ = inspect.signature(fn)
    impl.__name__ = fn.__name__
    impl.__qualname__ = fn.__qualname__
    impl.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    return impl


def _record(cache: KernelCache, key, result, seconds: float) -> CompiledKernel:
    compiled = CompiledKernel(_output_meta(result), seconds)
    with cache.lock:
        if key not in cache.entries:
            cache.entries[key] = compiled
            cache.compiles += 1
    return compiled


def _fake_impl(fn: Callable, cache: KernelCache) -> Callable:
    """Meta implementation for tracing: output metadata from the compile cache.

    Fake tensors carry the shape, dtype and device of the tensors they model, so
    a signature compiled by an eager call is a hit here and vice versa."""

    def fake(*args, **kwargs):
        key = _signature(args, kwargs)
        with cache.lock:
            compiled = cache.entries.get(key)
        if compiled is None:
            start = time.perf_counter()
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                real_args, real_kwargs = pytree.tree_map(_zeros_like_on_cpu, (args, kwargs))
                result = fn(*real_args, **real_kwargs)
            compiled = _record(cache, key, result, time.perf_counter() - start)
        return _fake_outputs(compiled.outputs, _first_device(args, kwargs))

    return fake


# The keyword PyTorch's auto_functionalized passes to its own dispatch function when
# torch.compile traces a mutating operator: an argument of that name would arrive twice.
_TRACING_KEYWORDS = frozenset({"mode"})


def _without_tracing_keywords(fn: Callable, mutated: frozenset) -> Callable:
    """fn, or for a mutating op whose parameters use _TRACING_KEYWORDS a wrapper whose
    schema names them with a trailing underscore (positional calls are unchanged)."""
    signature = inspect.signature(fn)
    clash = {p for p in signature.parameters if p in _TRACING_KEYWORDS}
    if not mutated or not clash:
        return fn
    renamed = {old: old + "_" for old in clash}
    original = {new: old for old, new in renamed.items()}

    def call(*args, **kwargs):
        return fn(*args, **{original.get(k, k): v for k, v in kwargs.items()})

    call.__name__, call.__qualname__, call.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    call.__signature__ = signature.replace(
        parameters=[p.replace(name=renamed.get(p.name, p.name)) for p in signature.parameters.values()])
    return call


def nki_op(
    name: str,
    fn: Callable | None = None,
    *,
    mutates_args: Iterable[str] | str = (),
    schema: str | None = None,
):
    """Registers ``fn`` (which calls NKI kernels) as the PyTorch operator ``name`` ("ns::op").

    Use as ``@nki_op("mylib::rmsnorm", mutates_args=())``. ``fn`` must annotate every
    parameter and its return type. The returned object is a
    ``torch.library.CustomOpDef``: call it like a function, give it a backward
    with ``.register_autograd(backward, setup_context=...)``; ``.nki_cache``
    holds the compiled signatures and the hit/miss counters.
    """

    def register(fn: Callable):
        if schema is None:
            _check_annotations(fn, name)
        mutated = frozenset((mutates_args,) if isinstance(mutates_args, str) else mutates_args)
        if schema is None:
            fn = _without_tracing_keywords(fn, mutated)
        cache = KernelCache()
        op = torch.library.custom_op(name, _compiling_impl(fn, cache), mutates_args=mutated,
                                     schema=schema)
        op.register_fake(_fake_impl(fn, cache))
        op.nki_cache = cache
        return op

    return register if fn is None else register(fn)


class WrappedKernel:
    """What ``wrap_nki(kernel)`` returns: TorchNeuron's launcher for an ``@nki.jit``
    kernel on torch tensors. ``wrapped[grid](*args)`` or ``wrapped(*args)`` runs the
    kernel; arguments it writes (TorchNeuron marks them ``nt.mutable_tensor``) are
    updated in place. In code torch.compile traces, the call is one ``nki::launch``
    node of the graph (see _traced_launch). ``wrap_nki(kernel, "ns::name")`` also
    makes the kernel an operator of its own (``self.op``), which a call without a
    grid goes through."""

    def __init__(self, kernel, grid: tuple = (), op=None):
        self.kernel = kernel
        self.grid = grid
        self.op = op

    def __getitem__(self, grid) -> "WrappedKernel":
        grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
        return WrappedKernel(self.kernel, grid, self.op)

    def __call__(self, *args, **kwargs):
        if self.op is not None and not self.grid:
            return self.op(*args, **kwargs)
        if torch.compiler.is_compiling():
            return _traced_launch(self.kernel, self.grid, args, kwargs)
        return _launch(self.kernel, self.grid, args, kwargs)

    def __getattr__(self, name):  # the op's own API (register_autograd, nki_cache, ...)
        op = self.__dict__.get("op")
        if op is None:
            raise AttributeError(f"wrap_nki: {name!r}: this kernel is not an operator (its parameters are not "
                                 "annotated with torch types)")
        return getattr(op, name)


@patching.hide_from_dynamo
def _launch(kernel, grid, args, kwargs):
    """One eager launch."""
    return (kernel[grid] if grid else kernel)(*args, **kwargs)


# ------------------------------------------------- wrap_nki in code torch.compile traces
# TorchNeuron traces a wrapped kernel into the graph as a higher-order op. Here the call
# becomes one node of the generic operator nki::launch (tensors in, tensors the kernel
# writes, a key); the key names a LaunchSpec registered while Dynamo traces (a constant
# for Dynamo: _register_launch is marked as torch._dynamo.assume_constant_result marks).
# What the kernel writes and which outputs are its own arguments come from one simulated
# run on zero-filled CPU tensors of the traced shapes, when the spec is registered.


@dataclass(frozen=True)
class LaunchSpec:
    kernel: object
    grid: tuple
    arg_slots: tuple          # per positional argument: ("T", shape, dtype) or ("C", value)
    kwarg_slots: tuple        # (name, slot) pairs
    mutated: tuple            # indices (among the call's tensors, in order) the kernel writes
    outputs: object           # ("new", i) / ("arg", j) leaves in tuples, lists and dicts
    new_outputs: tuple        # TensorMeta of each new output
    new_leaves: tuple         # positions of the new outputs among the returned tensors, in order


_LAUNCHES: dict[int, LaunchSpec] = {}
_LAUNCH_KEYS: dict[tuple, int] = {}


def _slot(value):
    # operator.index specializes a dynamic size (Dynamo guards on its value): a kernel
    # is simulated, and traced, per concrete shape, as NKI compiles it.
    if isinstance(value, torch.Tensor):
        return ("T", tuple(operator.index(d) for d in value.shape), value.dtype)
    return ("C", operator.index(value) if isinstance(value, torch.SymInt) else value)


def _register_launch(kernel, grid, arg_slots, kwarg_slots):
    """The key of the launch's spec and what the traced code needs of it: (key, the
    written tensors' indices, the output tree, (shape, dtype) of each new output)."""
    identity = (id(kernel), grid, arg_slots, kwarg_slots)
    key = _LAUNCH_KEYS.get(identity)
    if key is None:
        key = len(_LAUNCHES)
        _LAUNCHES[key] = _launch_spec(kernel, grid, arg_slots, kwarg_slots)
        _LAUNCH_KEYS[identity] = key
    spec = _LAUNCHES[key]
    return key, spec.mutated, spec.outputs, tuple((m.shape, m.dtype) for m in spec.new_outputs)


_register_launch._dynamo_marked_constant = True  # what torch._dynamo.assume_constant_result sets


def _launch_spec(kernel, grid, arg_slots, kwarg_slots) -> LaunchSpec:
    from torch_neuronx.nki import kernel as nki_kernel

    def value(slot):
        return torch.zeros(slot[1], dtype=slot[2]) if slot[0] == "T" else slot[1]

    args = [value(slot) for slot in arg_slots]
    kwargs = {name: value(slot) for name, slot in kwarg_slots}
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        result, run = nki_kernel.launch(_as_kernel(kernel), grid, args, kwargs)
    position = {id(t): i for i, t in enumerate(tensors)}
    mutated = tuple(sorted(position[id(t)] for t in run.written_args if id(t) in position))
    new_outputs, new_leaves, leaf = [], [], iter(range(len(run.returned_args)))

    def tree(value, aliases):
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(tree(v, aliases) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, tree(v, aliases)) for k, v in value.items()))
        if not isinstance(value, torch.Tensor):
            return ("const", value)
        source, index = next(aliases), next(leaf)
        if source is not None and id(source) in position:
            return ("arg", position[id(source)])
        new_outputs.append(TensorMeta(tuple(value.shape), value.dtype))
        new_leaves.append(index)
        return ("new", len(new_outputs) - 1)

    outputs = tree(result, iter(run.returned_args))
    return LaunchSpec(kernel, grid, arg_slots, kwarg_slots, mutated, outputs, tuple(new_outputs),
                      tuple(new_leaves))


def _as_kernel(kernel):
    from torch_neuronx.nki import kernel as nki_kernel

    return kernel.kernel if isinstance(kernel, nki_kernel.Launcher) else kernel


def _traced_launch(kernel, grid, args, kwargs):
    """Traced by Dynamo: the call as one nki::launch node, its outputs rebuilt. New
    outputs are allocated here and filled by the op (PyTorch functionalizes a mutating
    custom op only if it returns no list)."""
    key, mutated, outputs, new_outputs = _register_launch(
        kernel, tuple(operator.index(g) for g in grid), tuple(_slot(a) for a in args),
        tuple((k, _slot(v)) for k, v in kwargs.items()))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    tensors += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    new = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in new_outputs]
    read = [t for i, t in enumerate(tensors) if i not in mutated]
    torch.ops.nki.launch(read, [tensors[i] for i in mutated] + new, key)
    return _rebuild(outputs, new, tensors)


def _rebuild(node, new, tensors):
    kind, payload = node
    if kind in ("tuple", "list"):
        items = [_rebuild(child, new, tensors) for child in payload]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {k: _rebuild(child, new, tensors) for k, child in payload}
    if kind == "new":
        return new[payload]
    if kind == "arg":
        return tensors[payload]
    return payload


def _spec_call(spec: LaunchSpec, read, written):
    """The launch's arguments with the op's tensors in their slots."""
    tensors, read, written = [], list(read), list(written)
    count = sum(1 for slot in (*spec.arg_slots, *(s for _, s in spec.kwarg_slots)) if slot[0] == "T")
    for i in range(count):
        tensors.append(written.pop(0) if i in spec.mutated else read.pop(0))
    stream = iter(tensors)
    args = [next(stream) if slot[0] == "T" else slot[1] for slot in spec.arg_slots]
    kwargs = {name: next(stream) if slot[0] == "T" else slot[1] for name, slot in spec.kwarg_slots}
    return args, kwargs


@torch.library.custom_op("nki::launch", mutates_args=("written",))
def _launch_op(read: list[torch.Tensor], written: list[torch.Tensor], key: int) -> None:
    """written: the arguments the kernel writes, then a buffer per new output."""
    spec = _LAUNCHES[key]
    args, kwargs = _spec_call(spec, read, written[:len(spec.mutated)])
    result = _launch(_as_kernel(spec.kernel), spec.grid, args, kwargs)
    leaves = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
    new = [leaves[i] for i in spec.new_leaves]
    with torch.no_grad():
        for buffer, value in zip(written[len(spec.mutated):], new):
            buffer.copy_(value)


@_launch_op.register_fake
def _launch_fake(read, written, key):
    return None


def wrap_nki(kernel, name: str | None = None, *, mutates_args: Iterable[str] | str = ()) -> WrappedKernel:
    """Wraps an ``@nki.jit`` kernel for torch tensors, as TorchNeuron's ``wrap_nki``:
    ``wrap_nki(kernel)[grid](*args)`` (see WrappedKernel); cheap, and traceable by Dynamo.
    With ``name`` ("ns::op") the kernel is also registered as that operator, which
    requires its parameters and return to be annotated with torch types (a TypeError
    names the missing ones)."""
    if name is None:
        return WrappedKernel(kernel)
    func = getattr(kernel, "func", kernel)

    def call_kernel(*args, **kwargs):
        return kernel(*args, **kwargs)

    call_kernel.__signature__ = inspect.signature(func)
    call_kernel.__name__ = func.__name__
    call_kernel.__qualname__ = func.__qualname__
    call_kernel.__annotations__ = dict(getattr(func, "__annotations__", {}))
    mutated = frozenset((mutates_args,) if isinstance(mutates_args, str) else mutates_args)
    return WrappedKernel(kernel, op=nki_op(name, call_kernel, mutates_args=mutated))
