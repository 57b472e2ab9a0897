"""c10d collective kernels for neuron tensors.

Every collective of a ``ProcessGroup`` ends in a ``c10d::*`` dispatcher op
(``c10d::allreduce_``, ``c10d::_allgather_base_``, ...) whose kernel picks the
backend registered for the tensors' device. These are the kernels for the
``PrivateUse1`` (neuron) key: they take the gloo backend that the "neuron"
backend creator registered for the device and run the gloo collective on host
views of the device tensors (``_C._host_alias``: a CPU tensor over the same
bytes, no copy). Going through the dispatcher, not a Python ProcessGroup
subclass, reaches every caller: the ``torch.distributed`` functions, the DDP
reducer, functional collectives (DTensor, FSDP2) and object collectives.

- Contiguous tensors are shared with gloo as they are and the caller gets
  gloo's own ``Work`` (its ``wait``, errors, timeouts, future, source rank).
  A future's value holds the host views (CPU tensors aliasing the device
  tensors), as gloo reports them.
- A non-contiguous tensor is staged in a contiguous CPU copy. Collectives then
  complete before returning (copy-back included) and return a completed work;
  a recv returns a work whose ``wait`` waits for gloo and then copies back.
- Reduce ops go to gloo as they are: this gloo implements ``AVG`` (SUM then a
  division, floating-point tensors only). ``PREMUL_SUM`` is not supported.
- Reduce-scatter works (whose gloo works have no future and never report
  completion) and the coalesced variants that gloo lacks
  (all_gather_into_tensor_coalesced, reduce_scatter_tensor_coalesced: one gloo
  collective per tensor pair) are wrapped in a work whose ``wait`` waits for
  gloo; its future completes then.
- Gloo works are kept referenced here until shortly after they complete, so
  that their tensors are freed on a Python thread, not on gloo's (see
  ``_track``).
- The host tensors given to gloo are ``_C._owning_host_alias``es: CPU tensors over
  the same bytes whose storage holds a reference to the device storage, so the
  device memory lives as long as gloo, a work or a future value needs it, even
  if the caller drops the device tensor early (a temporary passed to a
  functional collective).

No stream sync is needed: execution on the emulated core is synchronous, so a
tensor's bytes are final when the op that wrote them returns.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import functools
import threading
import time
import warnings
from typing import Any, Callable

import torch
from torch._C import _distributed_c10d as c10d

from torch_neuronx import _C, observe, patching

_NEURON = torch.device("neuron")
_RedOpType = c10d.ReduceOp.RedOpType

_lock = threading.Lock()
_library: torch.library.Library | None = None


# --------------------------------------------------------------------------- helpers


def _backend(process_group: Any) -> Any:
    pg = c10d.ProcessGroup.unbox(process_group)
    try:
        return pg._get_backend(_NEURON)
    except RuntimeError as error:
        raise RuntimeError(
            "This process group has no backend for neuron tensors; create it with "
            "backend='neuron' (or 'cpu:gloo,neuron:neuron')."
        ) from error


def _options(cls: type, timeout: int = -1, async_op: bool = True, **fields: Any) -> Any:
    opts = cls()
    if timeout is not None and timeout >= 0:
        opts.timeout = datetime.timedelta(milliseconds=timeout)
    opts.asyncOp = async_op
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


_REDUCE_OPS = {
    int(kind): c10d.ReduceOp(kind)
    for name, kind in _RedOpType.__members__.items() if name != "PREMUL_SUM"
}


def _reduce_op(reduce_op: Any) -> Any:
    """The pybind ReduceOp for the dispatcher's boxed one (a ScriptObject)."""
    op = _REDUCE_OPS.get(reduce_op.op())
    if op is None:
        raise RuntimeError(
            "ReduceOp.PREMUL_SUM is not supported by the neuron backend (its gloo transport "
            "has no such op); scale the tensor and use ReduceOp.SUM."
        )
    return op


class _Staging:
    """Host tensors for the device tensors of one collective (see module doc)."""

    __slots__ = ("writeback",)

    def __init__(self) -> None:
        self.writeback: list[tuple[torch.Tensor, torch.Tensor]] = []

    @staticmethod
    def _view(tensor: torch.Tensor) -> torch.Tensor | None:
        if tensor.device.type != "neuron":
            return None
        if tensor.layout != torch.strided:
            raise RuntimeError(
                f"The neuron backend supports dense tensors only, got layout {tensor.layout}"
            )
        return _C._owning_host_alias(tensor)

    def input(self, tensor: torch.Tensor) -> torch.Tensor:
        view = self._view(tensor)
        if view is None:
            return tensor
        return view if view.is_contiguous() else view.contiguous()

    def inout(self, tensor: torch.Tensor) -> torch.Tensor:
        view = self._view(tensor)
        if view is None or view.is_contiguous():
            return tensor if view is None else view
        staged = view.contiguous()
        self.writeback.append((view, staged))
        return staged

    def output(self, tensor: torch.Tensor) -> torch.Tensor:
        view = self._view(tensor)
        if view is None or view.is_contiguous():
            return tensor if view is None else view
        staged = torch.empty(view.shape, dtype=view.dtype)
        self.writeback.append((view, staged))
        return staged

    def finish(self) -> None:
        for view, staged in self.writeback:
            view.copy_(staged)
        self.writeback = []


# Gloo works in flight. A gloo worker thread drops its reference to a work
# after running it; if that is the last reference, the work's tensors are freed
# on that thread, which then needs the GIL (the host views are Python-made
# tensors), and when that happens while the interpreter shuts down the thread is
# killed inside C++ and the process aborts ("terminate called without an active
# exception"). So this module keeps every work until some time after it
# completed, making the last release happen on a Python thread, and at exit
# waits briefly and leaks the works that are still running.
_inflight_lock = threading.RLock()
_inflight: list[list] = []  # [work, is_done() -> bool, time seen done or None]
_INFLIGHT_CAP = 4096
_RELEASE_AFTER_S = 0.05


def _track(work: Any, is_done: Callable[[], bool] | None = None) -> Any:
    now = time.monotonic()
    with _inflight_lock:
        keep = []
        for entry in _inflight:
            if entry[2] is None:
                if entry[1]():
                    entry[2] = now
            elif now - entry[2] > _RELEASE_AFTER_S:
                continue
            keep.append(entry)
        if len(keep) >= _INFLIGHT_CAP:  # never waited for (their is_done stays False)
            del keep[: len(keep) - _INFLIGHT_CAP + 1]
        keep.append([work, is_done or work.is_completed, None])
        _inflight[:] = keep
    return work


def _release_at_exit() -> None:
    with _inflight_lock:
        entries = list(_inflight)
        _inflight.clear()
    if not entries:
        return
    time.sleep(_RELEASE_AFTER_S)  # gloo's threads let go of the works that just completed
    running = [entry[0] for entry in entries if not entry[1]()]
    if running:  # never freed: a gloo thread may finish them after Python is gone
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(running))
    entries.clear()  # the completed ones are freed here, on this thread


def _completed(works: list[Any], staging: _Staging, result: list[torch.Tensor]) -> Any:
    """Waits now, copies back, returns a completed work (its future's value: ``result``)."""
    for work in works:
        _track(work)
        work.wait()
    staging.finish()
    future = torch.futures.Future()
    future.set_result(result)
    return c10d._create_work_from_future(future).boxed()


def _deferred(works: list[Any], staging: _Staging) -> Any:
    """A work whose ``wait`` waits for the gloo ``works``, then copies back."""
    state = {"done": False}

    def wait(timeout: datetime.timedelta) -> bool:
        if not state["done"]:
            for work in works:
                if timeout:
                    work.wait(timeout)
                else:
                    work.wait()
            staging.finish()
            state["done"] = True
        return True

    for work in works:
        _track(work, lambda: state["done"])
    return c10d.PythonCallbackWork(wait).boxed()


def _collective(work: Any, staging: _Staging, result: list[torch.Tensor]) -> Any:
    """The work to hand back for one gloo collective: gloo's own unless copying back."""
    if staging.writeback:
        return _completed([work], staging, result)
    return _track(work).boxed()


def _uncompleting(work: Any, staging: _Staging, result: list[torch.Tensor]) -> Any:
    """For gloo works whose ``is_completed`` never turns true (reduce-scatter)."""
    if staging.writeback:
        return _completed([work], staging, result)
    return _deferred([work], staging)


# --------------------------------------------------------------------------- kernels


def allreduce_(tensors, process_group, reduce_op, sparse_indices=None, async_op=True, timeout=-1):
    if sparse_indices is not None:
        raise RuntimeError("The neuron backend does not support sparse all_reduce")
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.inout(t) for t in tensors]
    opts = _options(c10d.AllreduceOptions, timeout, async_op, reduceOp=_reduce_op(reduce_op))
    return tensors, _collective(backend.allreduce(hosts, opts), staging, tensors)


def allreduce_coalesced_(tensors, process_group, reduce_op, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.inout(t) for t in tensors]
    opts = _options(c10d.AllreduceCoalescedOptions, timeout, async_op,
                    reduceOp=_reduce_op(reduce_op))
    return _collective(backend.allreduce_coalesced(hosts, opts), staging, tensors)


def broadcast_(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.inout(t) for t in tensors]
    opts = _options(c10d.BroadcastOptions, timeout, async_op, rootRank=root_rank,
                    rootTensor=root_tensor)
    return tensors, _collective(backend.broadcast(hosts, opts), staging, tensors)


def reduce_(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.inout(t) for t in tensors]
    opts = _options(c10d.ReduceOptions, timeout, async_op, reduceOp=_reduce_op(reduce_op),
                    rootRank=root_rank, rootTensor=root_tensor)
    return _collective(backend.reduce(hosts, opts), staging, tensors)


def allgather_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    outputs = [[staging.output(t) for t in group] for group in output_tensors]
    inputs = [staging.input(t) for t in input_tensors]
    work = backend.allgather(outputs, inputs, _options(c10d.AllgatherOptions, timeout, async_op))
    result = [t for group in output_tensors for t in group]
    return output_tensors, _collective(work, staging, result)


def _gather_shaped(output: torch.Tensor, source: torch.Tensor, world: int) -> torch.Tensor:
    """gloo wants the output shaped as the inputs concatenated along dim 0; NCCL only
    counts elements (an output of shape [world * numel] is fine there, and callers
    such as accelerate rely on it). Give gloo a view over the same bytes."""
    if output.numel() == world * source.numel() and source.dim() > 0 \
            and tuple(output.shape) != (world * source.shape[0], *source.shape[1:]):
        return output.view(world * source.shape[0], *source.shape[1:])
    return output


def _allgather_base_(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    source = staging.input(input_tensor)
    output = _gather_shaped(staging.output(output_tensor), source, backend.size())
    opts = _options(c10d.AllgatherOptions, timeout, async_op)
    work = backend._allgather_base(output, source, opts)
    return output_tensor, _collective(work, staging, [output_tensor])


def allgather_coalesced_(output_lists, input_list, process_group, async_op=True):
    backend = _backend(process_group)
    staging = _Staging()
    outputs = [[staging.output(t) for t in group] for group in output_lists]
    inputs = [staging.input(t) for t in input_list]
    opts = _options(c10d.AllgatherOptions, -1, async_op)
    work = backend.allgather_coalesced(outputs, inputs, opts)
    return _collective(work, staging, [t for group in output_lists for t in group])


def allgather_into_tensor_coalesced_(outputs, inputs, process_group, async_op=True):
    backend = _backend(process_group)
    staging = _Staging()
    works = []
    for output_tensor, input_tensor in zip(outputs, inputs, strict=True):
        source = staging.input(input_tensor)
        output = _gather_shaped(staging.output(output_tensor), source, backend.size())
        opts = _options(c10d.AllgatherOptions, -1, async_op)
        works.append(backend._allgather_base(output, source, opts))
    if staging.writeback:
        return _completed(works, staging, list(outputs))
    return _deferred(works, staging)


def reduce_scatter_(output_tensors, input_tensors, process_group, reduce_op, async_op=True,
                    timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    outputs = [staging.output(t) for t in output_tensors]
    inputs = [[staging.input(t) for t in group] for group in input_tensors]
    opts = _options(c10d.ReduceScatterOptions, timeout, async_op, reduceOp=_reduce_op(reduce_op))
    work = backend.reduce_scatter(outputs, inputs, opts)
    return output_tensors, _uncompleting(work, staging, list(output_tensors))


def _reduce_scatter_base_(output_tensor, input_tensor, process_group, reduce_op, async_op=True,
                          timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    output = staging.output(output_tensor)
    source = staging.input(input_tensor)
    opts = _options(c10d.ReduceScatterOptions, timeout, async_op, reduceOp=_reduce_op(reduce_op))
    work = backend._reduce_scatter_base(output, source, opts)
    return output_tensor, _uncompleting(work, staging, [output_tensor])


def reduce_scatter_tensor_coalesced_(outputs, inputs, process_group, reduce_op, async_op=True,
                                     timeout=-1):
    backend = _backend(process_group)
    op = _reduce_op(reduce_op)
    staging = _Staging()
    works = []
    for output_tensor, input_tensor in zip(outputs, inputs, strict=True):
        output = staging.output(output_tensor)
        source = staging.input(input_tensor)
        opts = _options(c10d.ReduceScatterOptions, timeout, async_op, reduceOp=op)
        works.append(backend._reduce_scatter_base(output, source, opts))
    if staging.writeback:
        return _completed(works, staging, list(outputs))
    return _deferred(works, staging)


def gather_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    outputs = [[staging.output(t) for t in group] for group in output_tensors]
    inputs = [staging.input(t) for t in input_tensors]
    opts = _options(c10d.GatherOptions, timeout, async_op, rootRank=root_rank)
    work = backend.gather(outputs, inputs, opts)
    return _collective(work, staging, [t for group in output_tensors for t in group])


def scatter_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    outputs = [staging.output(t) for t in output_tensors]
    inputs = [[staging.input(t) for t in group] for group in input_tensors]
    opts = _options(c10d.ScatterOptions, timeout, async_op, rootRank=root_rank)
    work = backend.scatter(outputs, inputs, opts)
    return output_tensors, _collective(work, staging, list(output_tensors))


def alltoall_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    outputs = [staging.output(t) for t in output_tensors]
    inputs = [staging.input(t) for t in input_tensors]
    work = backend.alltoall(outputs, inputs, _options(c10d.AllToAllOptions, timeout, async_op))
    return output_tensors, _collective(work, staging, list(output_tensors))


def alltoall_base_(output, input, process_group, output_split_sizes, input_split_sizes,
                   async_op=True, timeout=-1):
    backend = _backend(process_group)
    staging = _Staging()
    out_host = staging.output(output)
    in_host = staging.input(input)
    opts = _options(c10d.AllToAllOptions, timeout, async_op)
    work = backend.alltoall_base(out_host, in_host, list(output_split_sizes),
                                 list(input_split_sizes), opts)
    return _collective(work, staging, [output])


def barrier(tensor, process_group, device_ids, async_op=True, timeout=-1):
    backend = _backend(process_group)
    opts = _options(c10d.BarrierOptions, timeout, async_op, device_ids=list(device_ids))
    return _track(backend.barrier(opts)).boxed()


def send(tensors, process_group, dst, tag):
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.input(t) for t in tensors]
    return _track(backend.send(hosts, dst, tag)).boxed()


def recv_(tensors, process_group, src, tag):
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.output(t) for t in tensors]
    work = backend.recv(hosts, src, tag)
    # Not waited here: the matching send may come after this rank's next op.
    return _deferred([work], staging) if staging.writeback else _track(work).boxed()


def recv_any_source_(tensors, process_group, tag):
    backend = _backend(process_group)
    staging = _Staging()
    hosts = [staging.output(t) for t in tensors]
    if staging.writeback:
        raise RuntimeError(
            "recv from any source into a non-contiguous neuron tensor is not supported; "
            "receive into a contiguous tensor and copy"
        )
    # Gloo's own work: it knows the source rank (dist.recv(src=None) asks it).
    return _track(backend.recv_anysource(hosts, tag)).boxed()


_KERNELS: dict[str, Callable[..., Any]] = {
    "allreduce_": allreduce_,
    "allreduce_coalesced_": allreduce_coalesced_,
    "broadcast_": broadcast_,
    "reduce_": reduce_,
    "allgather_": allgather_,
    "_allgather_base_": _allgather_base_,
    "allgather_coalesced_": allgather_coalesced_,
    "allgather_into_tensor_coalesced_": allgather_into_tensor_coalesced_,
    "reduce_scatter_": reduce_scatter_,
    "_reduce_scatter_base_": _reduce_scatter_base_,
    "reduce_scatter_tensor_coalesced_": reduce_scatter_tensor_coalesced_,
    "gather_": gather_,
    "scatter_": scatter_,
    "alltoall_": alltoall_,
    "alltoall_base_": alltoall_base_,
    "barrier": barrier,
    "send": send,
    "recv_": recv_,
    "recv_any_source_": recv_any_source_,
}


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _first_tensor(value: Any):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    return None


# Collectives whose arguments are (outputs, inputs, ...): the inputs are what a rank sends.
_OUTPUT_FIRST = ("allgather", "_allgather", "reduce_scatter", "_reduce_scatter", "gather_", "scatter_",
                 "alltoall")


def _observed(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`kernel`, reported as device work (torch_neuronx/observe.py: the audit and the profiler
    listen) with the collective's name, the bytes this rank sends and the group's size."""
    data = 1 if name.startswith(_OUTPUT_FIRST) else 0

    @functools.wraps(kernel)
    def run(*args, **kwargs):
        if len(args) <= data or not observe.observed():
            return kernel(*args, **kwargs)
        group = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
        size = c10d.ProcessGroup.unbox(group).size() if group is not None else 1
        tensor = _first_tensor(args[data])
        device = (tensor.device.index or 0) if tensor is not None else 0
        with observe.work("collective", name.strip("_"), device, bytes=_tensor_bytes(args[data]), world_size=size):
            return kernel(*args, **kwargs)

    return run


def install() -> None:
    """Registers the kernels for the neuron key (once per process)."""
    global _library
    with _lock:
        if _library is not None:
            return
        library = torch.library.Library("c10d", "IMPL")  # noqa: TOR901 (overrides PyTorch's)
        with warnings.catch_warnings():
            # PyTorch registers generic PrivateUse1 kernels for these ops (they
            # look up a backend for the device); replacing them warns once.
            warnings.simplefilter("ignore")
            for name, kernel in _KERNELS.items():
                # Dynamo must not trace these: under torch.compile a collective
                # graph-breaks and runs eagerly, and the frames it calls (this
                # kernel) would otherwise be compiled as new frames.
                library.impl(name, patching.hide_from_dynamo(_observed(name, kernel)), "PrivateUse1")
        _library = library
        atexit.register(_release_at_exit)
