"""Memory API of the neuron device, over the caching allocator in csrc/.

The statistics use CUDA's key names ("allocated_bytes.all.current", ...), read
through torch.accelerator so there is one code path for both APIs.
"""

from __future__ import annotations

import collections
import pickle
from typing import Any

import torch

from torch_neuronx import _C


def _index(device: Any) -> int:
    from torch_neuronx.neuron import _get_device_index

    return _get_device_index(device)


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, Any]":
    index = _index(device)
    if not _C._is_initialized():
        _C._init()
    return torch.accelerator.memory_stats(index)


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
        f"| neuron:{index} memory summary (HBM {_format(total)}, free {_format(free)})".ljust(87) + "|",
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
    """Segments of every core in the format of torch.cuda.memory_snapshot()."""
    segments = []
    for block in _C._memory_snapshot():
        state = "active_allocated" if block["allocated"] else "inactive"
        segments.append(
            {
                "device": block["device"],
                "address": block["address"],
                "total_size": block["size"],
                "allocated_size": block["size"] if block["allocated"] else 0,
                "active_size": block["size"] if block["allocated"] else 0,
                "requested_size": block["requested_size"] if block["allocated"] else 0,
                "stream": 0,
                "segment_type": block["pool"],
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [
                    {
                        "address": block["address"],
                        "size": block["size"],
                        "requested_size": block["requested_size"],
                        "state": state,
                        "frames": [],
                    }
                ],
            }
        )
    return sorted(segments, key=lambda s: (s["device"], s["address"]))


def _snapshot(device: Any = None) -> dict[str, Any]:
    """The dict torch.cuda.memory._snapshot() returns, for PyTorch's memory viz."""
    return {
        "segments": memory_snapshot(),
        "device_traces": [[] for _ in range(_C._device_count())],
    }


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)
