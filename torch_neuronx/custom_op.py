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
        cache = KernelCache()
        op = torch.library.custom_op(name, _compiling_impl(fn, cache), mutates_args=mutated,
                                     schema=schema)
        op.register_fake(_fake_impl(fn, cache))
        op.nki_cache = cache
        return op

    return register if fn is None else register(fn)


def _makes_a_schema(fn: Callable, mutates_args) -> bool:
    """Whether torch.library can build an op schema from fn's annotations (torch types,
    not NKI's nt.mutable_tensor or none at all)."""
    try:
        torch.library.infer_schema(fn, mutates_args=mutates_args)
    except (ValueError, TypeError):
        return False
    return True


class WrappedKernel:
    """What ``wrap_nki(kernel)`` returns: TorchNeuron's launcher for an ``@nki.jit``
    kernel on torch tensors. ``wrapped[grid](*args)`` or ``wrapped(*args)`` runs the
    kernel (arguments it writes, e.g. those annotated ``nt.mutable_tensor``, are
    updated in place); inside an ``nki_op`` body that is all it needs. A kernel whose
    parameters and return are annotated with torch types is also a custom op
    (``self.op``): a call without a grid goes through it, so it stays one node of a
    graph under ``torch.compile``."""

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
        return _launch(self.kernel, self.grid, args, kwargs)

    def __getattr__(self, name):  # the op's own API (register_autograd, nki_cache, ...)
        op = self.__dict__.get("op")
        if op is None:
            raise AttributeError(f"wrap_nki: {name!r}: this kernel is not an operator (its parameters are not "
                                 "annotated with torch types)")
        return getattr(op, name)


@patching.hide_from_dynamo
def _launch(kernel, grid, args, kwargs):
    """One eager launch. Under torch.compile outside an nki_op Dynamo does not trace
    into the simulator: the call breaks the graph and runs here."""
    return (kernel[grid] if grid else kernel)(*args, **kwargs)


def wrap_nki(kernel, name: str | None = None, *, mutates_args: Iterable[str] | str = ()) -> WrappedKernel:
    """Wraps an ``@nki.jit`` kernel for torch tensors, as TorchNeuron's ``wrap_nki``:
    ``wrap_nki(kernel)[grid](*args)`` (see WrappedKernel). A kernel annotated with torch
    types (tensors ``torch.Tensor``, scalars, return type) is also registered as the
    operator ``name`` (``nki::<kernel name>`` by default); naming the operator requires
    those annotations (a TypeError names the missing ones)."""
    func = getattr(kernel, "func", kernel)
    mutated = frozenset((mutates_args,) if isinstance(mutates_args, str) else mutates_args)
    if name is None and not _makes_a_schema(func, mutated):
        return WrappedKernel(kernel)
    qualified = name or f"nki::{func.__name__}"

    def call_kernel(*args, **kwargs):
        return kernel(*args, **kwargs)

    call_kernel.__signature__ = inspect.signature(func)
    call_kernel.__name__ = func.__name__
    call_kernel.__qualname__ = func.__qualname__
    call_kernel.__annotations__ = dict(getattr(func, "__annotations__", {}))
    return WrappedKernel(kernel, op=nki_op(qualified, call_kernel, mutates_args=mutated))

