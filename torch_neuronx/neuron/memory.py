"""Memory API of the neuron device, over the caching allocator in csrc/.

The statistics use CUDA's key names ("allocated_bytes.all.current", ...), read
through torch.accelerator so there is one code path for both APIs; the dict
also answers TorchNeuron's own names (MemoryStats). Snapshots
and the allocator's history use the format of torch.cuda.memory, so that
PyTorch's memory visualizer (torch.cuda._memory_viz) reads them.
"""

from __future__ import annotations

import atexit
import collections
import inspect
import pickle
import sys
import warnings
from typing import Any

import torch

from torch_neuronx import _C


def _index(device: Any) -> int:
    from torch_neuronx.neuron import _get_device_index

    return _get_device_index(device)


# TorchNeuron's memory_stats() names (torch_neuronx/memory.py on Trainium): a
# byte statistic is a dict of CUDA's four metrics over all pools; the two
# request counters are CUDA's allocation counts.
AWS_BYTE_STATS = ("allocated_bytes", "reserved_bytes", "active_bytes")
AWS_COUNTERS = {"allocation_requests": "allocation.all.allocated", "num_tensor_frees": "allocation.all.freed"}
METRICS = ("current", "peak", "allocated", "freed")


class MemoryStats(collections.OrderedDict):
    """torch.cuda.memory_stats()'s flat dict (every value an int, as code written
    for CUDA sums, logs and compares them), which also answers TorchNeuron's
    names on lookup: ``stats["allocated_bytes"]["current"]``,
    ``stats["num_tensor_frees"]``, ``stats["allocation_requests"]``. Those names
    are not stored keys: iterating, ``len`` and ``==`` see CUDA's keys only."""

    def _aws(self, key: Any) -> Any:
        if key in AWS_BYTE_STATS:
            return {metric: dict.get(self, f"{key}.all.{metric}", 0) for metric in METRICS}
        return dict.get(self, AWS_COUNTERS[key], 0)

    def __missing__(self, key: Any) -> Any:
        if key in AWS_BYTE_STATS or key in AWS_COUNTERS:
            return self._aws(key)
        raise KeyError(key)

    def __contains__(self, key: Any) -> bool:
        return dict.__contains__(self, key) or key in AWS_BYTE_STATS or key in AWS_COUNTERS

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default


def memory_stats(device: Any = None) -> MemoryStats:
    """The allocator's statistics for one core: CUDA's flat keys, sorted
    ("allocated_bytes.all.current", "num_ooms", ...), plus TorchNeuron's nested
    names on lookup (see MemoryStats)."""
    index = _index(device)
    if not _C._is_initialized():
        _C._init()
    return MemoryStats(torch.accelerator.memory_stats(index))


def _stat(device: Any, key: str) -> int:
    return memory_stats(device).get(key, 0)


def memory_allocated(device: Any = None) -> int:
    return _stat(device, "allocated_bytes.all.current")


def max_memory_allocated(device: Any = None) -> int:
    return _stat(device, "allocated_bytes.all.peak")


def memory_reserved(device: Any = None) -> int:
    return _stat(device, "reserved_bytes.all.current")


def max_memory_reserved(device: Any = None) -> int:
    return _stat(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device: Any = None) -> None:
    _C._init()
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _C._init()
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


reset_max_memory_allocated = reset_peak_memory_stats


def empty_cache() -> None:
    """Returns cached, unused blocks of every core to the system."""
    _C._init()
    torch.accelerator.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the core's HBM, as seen by this process."""
    _C._init()
    return torch.accelerator.get_memory_info(_index(device))


def _format(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return str(nbytes)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator's statistics for one core."""
    index = _index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)
    rows = [
        ("Allocated memory", "allocated_bytes", _format),
        ("Active memory", "active_bytes", _format),
        ("Requested memory", "requested_bytes", _format),
        ("Reserved memory", "reserved_bytes", _format),
        ("Allocations", "allocation", str),
        ("Active allocs", "active", str),
        ("Device reserved segments", "segment", str),
    ]
    pools = ("all",) if abbreviated else ("all", "small_pool", "large_pool")
    line = "|" + "-" * 86 + "|"
    out = [
        line,
        # TorchNeuron's title ("Neuron Memory Summary, Device N"), then the core's HBM.
        f"| Neuron Memory Summary, Device {index} (neuron:{index}, HBM {_format(total)}, "
        f"free {_format(free)})".ljust(87) + "|",
        line,
        "| Metric".ljust(36) + "| Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
        line,
    ]
    for title, key, fmt in rows:
        for pool in pools:
            name = title if pool == "all" else f"    from {pool.replace('_', ' ')}"
            values = [stats.get(f"{key}.{pool}.{kind}", 0) for kind in ("current", "peak", "allocated", "freed")]
            out.append(f"| {name}".ljust(36) + "|" + "|".join(f" {fmt(v):>10} " for v in values) + "|")
        out.append(line)
    out.append(
        f"| OOMs: {stats.get('num_ooms', 0)}   alloc retries (cache flushes): "
        f"{stats.get('num_alloc_retries', 0)}".ljust(87) + "|"
    )
    out.append(line)
    return "\n".join(out) + "\n"


def memory_snapshot() -> list[dict[str, Any]]:
    """Segments of every core in the format of torch.cuda.memory_snapshot().

    The "segments" of _snapshot(): one function builds both.
    """
    return _snapshot()["segments"]


# ------------------------------------------------------------ memory history
_stop_stacks_at_exit = False  # whether the atexit handler is registered (see _apply_history)
_settings = (False, False, 1, 0)  # what _apply_history applied last, but the context


def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
    """Records what the allocator does, for torch.neuron.memory._snapshot().

    Same arguments and meaning as torch.cuda.memory._record_memory_history,
    including its legacy form (``enabled`` a bool, ``trace_alloc_max_entries``,
    ...):

    - ``enabled``: None stops recording and clears the history; "state" keeps
      the stacks of live allocations (and a one-entry trace, as CUDA does);
      "all" also keeps a history of every action: alloc, free_requested,
      free_completed (one right after the other: frees are immediate),
      segment_alloc and segment_free (a host allocation of a core taken or
      returned), oom (before torch.OutOfMemoryError is raised), snapshot.
    - ``context``: which actions keep a stack: None, "state" (live allocations),
      "alloc" (also alloc actions), "all" (also frees).
    - ``stacks``: "python" (Python and TorchScript frames) or "all" (also C++).
    - ``max_entries``: the history keeps the newest this many actions.
    - ``clear_history``: drops what was recorded so far.
    - ``skip_actions``: actions not to record.

    Not applicable on neuron: ``device`` (ignored by CUDA too: the history
    covers every core), ``compile_context`` and ``global_record_annotations``
    (Inductor and record_function annotations; the neuron compiler runs
    graphs with XLA, so there is nothing to attach), which warn when set.
    segment_map/segment_unmap never occur (no expandable segments), nor does
    the active_pending_free state (frees never wait for a stream).
    """
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, *args, **kwargs)
    else:
        _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    _check_choice("enabled", enabled, (None, "state", "all"))
    _check_choice("context", context, (None, "state", "alloc", "all"))
    _check_choice("stacks", stacks, ("python", "all"))
    _warn_not_applicable(compile_context=compile_context, global_record_annotations=global_record_annotations)
    _apply_history(
        enabled=enabled is not None,
        context=_context_level(context),
        cpp_frames=stacks == "all",
        # "state" keeps a one-entry trace, as in CUDA.
        max_entries=max_entries if enabled == "all" else 1,
        clear=clear_history,
        skip_actions=_action_mask(skip_actions or ()),
    )


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Any = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    level = "alloc" if trace_alloc_record_context else "state" if record_context else None
    _warn_not_applicable(compile_context=compile_context, global_record_annotations=global_record_annotations)
    _apply_history(
        enabled=enabled,
        context=_context_level(level),
        cpp_frames=record_context_cpp,
        max_entries=trace_alloc_max_entries,
        clear=clear_history,
        skip_actions=_action_mask(skip_actions or ()),
    )


_record_memory_history.__signature__ = inspect.signature(_record_memory_history_impl)  # as CUDA's


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        shown = ", ".join("None" if c is None else repr(c) for c in choices)
        raise ValueError(f"_record_memory_history: expected {name} to be one of {shown}, got {value!r}")


def _warn_not_applicable(**flags: bool) -> None:
    for name, value in flags.items():
        if value:
            warnings.warn(f"_record_memory_history: {name}=True has no effect on neuron: the neuron "
                          "compiler runs graphs with XLA, without Inductor's compile context or "
                          "record_function annotations to attach.", stacklevel=4)


def _context_level(context: str | None) -> int:
    """The C++ RecordContext of a `context` argument."""
    return _C._record_contexts["never" if context is None else context]


def _action_mask(actions: Any) -> int:
    """One bit per action, at the C++ TraceEntry::Action value."""
    mask = 0
    for action in actions:
        if action not in _C._trace_actions:
            raise ValueError(f"_record_memory_history: unknown action {action!r} in skip_actions; "
                             f"valid actions: {', '.join(_C._trace_actions)}")
        mask |= 1 << _C._trace_actions[action]
    return mask


def _apply_history(*, enabled: bool, context: int, cpp_frames: bool, max_entries: int, clear: bool,
                   skip_actions: int) -> None:
    global _stop_stacks_at_exit, _settings
    _C._init()
    _C._record_memory_history(enabled, context, cpp_frames, max_entries, clear, skip_actions)
    _settings = (enabled, cpp_frames, max_entries, skip_actions)
    if enabled and context != _context_level(None) and not _stop_stacks_at_exit:
        # Gathering a stack takes the GIL, which threads still freeing memory
        # while Python finalizes must not do (see csrc/Shutdown.cpp). Registered
        # after torch_neuronx's own handler, so it runs before it; the trace
        # recorded so far stays readable by handlers that run later.
        _stop_stacks_at_exit = True
        atexit.register(_stop_stacks)


def _stop_stacks() -> None:
    """Keeps recording as it is, without gathering stacks from now on."""
    enabled, cpp_frames, max_entries, skip_actions = _settings
    _C._record_memory_history(enabled, _context_level(None), cpp_frames, max_entries, False, skip_actions)


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The state of the allocator as torch.cuda.memory._snapshot() returns it.

    ``segments`` (every core, as memory_snapshot()), ``device_traces`` (one list
    of actions per core, oldest first, recorded by _record_memory_history),
    ``allocator_settings`` and ``external_annotations``. Like CUDA's, it covers
    every core whatever ``device`` is, and adds a "snapshot" action to each
    recording core's trace.
    """
    if not _C._is_initialized():
        _C._init()
    snapshot = _C._memory_snapshot()
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def install_accelerator_snapshot() -> None:
    """torch.accelerator.memory._snapshot() knows CUDA and XPU only (PyTorch 2.13
    calls torch.cuda's for any other accelerator, which fails here): with neuron
    as the accelerator it returns _snapshot()."""
    import torch.accelerator.memory as accelerator_memory

    from torch_neuronx import patching

    def build(original):
        def snapshot(device=None, augment_with_fx_traces: bool = False):
            accelerator = torch.accelerator.current_accelerator()
            if accelerator is not None and accelerator.type == "neuron":
                return _snapshot(device, augment_with_fx_traces=augment_with_fx_traces)
            return original(device, augment_with_fx_traces=augment_with_fx_traces)

        return snapshot

    patching.patch_once(accelerator_memory, "_snapshot", build,
                        why="torch.accelerator.memory._snapshot() serves only CUDA and XPU")


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickles _snapshot() to ``filename``, for PyTorch's memory visualizer:
    ``python -m torch.cuda._memory_viz trace_plot FILE -o out.html`` (or
    ``segment_plot``), or https://pytorch.org/memory_viz."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)
