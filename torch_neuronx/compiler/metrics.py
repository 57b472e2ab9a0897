"""Counters behind torch_neuronx.get_dynamo_metrics().

TORCH_NEURONX_METRICS_ENABLED=0 stops the counting (read at each event, so it
can be switched on or off while the process runs); the log lines stay. The
snapshot's ``enabled`` says whether counting is on; while it is off the
counters keep the values they had (zero when it was off from the start).
"""

from __future__ import annotations

import sys
import threading
from collections import Counter

from torch_neuronx import config
from torch_neuronx.log import get_logger

_log = get_logger("compiler")

_lock = threading.Lock()
_counts: Counter = Counter()
_compile_seconds = [0.0]
_recompile_reasons: list[str] = []


def record_compile(seconds: float, name: str = "graph") -> None:
    if config.metrics_enabled():
        with _lock:
            _counts["compiles"] += 1
            _compile_seconds[0] += seconds
    _log.info("compiled the %s graph in %.3f s", name, seconds)


def record_cache_hit(where: str) -> None:
    if config.metrics_enabled():
        with _lock:
            _counts[f"cache_hits_{where}"] += 1
    _log.debug("executable cache hit (%s)", where)


def record_eviction(entries: int, freed: int, folder: str, limit: int) -> None:
    if config.metrics_enabled():
        with _lock:
            _counts["cache_evictions"] += entries
    _log.info("evicted %d cache entries (%.1f MB) from %s to stay under %.1f MB "
              "(TORCH_NEURONX_NEFF_CACHE_MAX_SIZE)", entries, freed / 2**20, folder, limit / 2**20)


def record_graph(kind: str) -> None:
    if config.metrics_enabled():
        with _lock:
            _counts[f"{kind}_graphs"] += 1
    _log.debug("received a %s graph from AOTAutograd", kind)


def record_recompile(reason: str) -> None:
    if config.metrics_enabled():
        with _lock:
            _recompile_reasons.append(reason)
    _log.info("recompiling: %s", reason)


def _graph_breaks() -> int:
    """Dynamo's graph-break count; 0 without importing Dynamo (seconds) when it never ran."""
    utils = sys.modules.get("torch._dynamo.utils")
    return sum(utils.counters["graph_break"].values()) if utils is not None else 0


def snapshot() -> dict:
    enabled = config.metrics_enabled()
    with _lock:
        return {
            "enabled": enabled,
            "compiles": _counts["compiles"],
            "compile_seconds": round(_compile_seconds[0], 6),
            "cache_hits_memory": _counts["cache_hits_memory"],
            "cache_hits_disk": _counts["cache_hits_disk"],
            "cache_hits_corrupt": _counts["cache_hits_corrupt"],
            "cache_hits_aot": _counts["cache_hits_aot"],
            "cache_evictions": _counts["cache_evictions"],
            "forward_graphs": _counts["forward_graphs"],
            "backward_graphs": _counts["backward_graphs"],
            "inference_graphs": _counts["inference_graphs"],
            "graph_breaks": _graph_breaks(),
            "recompiles": len(_recompile_reasons),
            "recompile_reasons": list(_recompile_reasons),
        }


def reset() -> None:
    from torch._dynamo.utils import counters

    with _lock:
        _counts.clear()
        _compile_seconds[0] = 0.0
        _recompile_reasons.clear()
    counters["graph_break"].clear()
