"""What torch_neuronx.get_dynamo_metrics() reports: one record per compiled
graph, as TorchNeuron's, plus this project's aggregate counters.

The per-graph records (TorchNeuron's ``NeuronCompilationMetrics``: graph_id,
graph_name, model_name, has_collectives, graph_node_count, timestamp and three
phase times in microseconds) are made when a graph the backend compiled gets
its executable, at its first call (compiles here happen at the first call with
each input signature, compiler/executable.py). TorchNeuron's three phases map
to this compiler's as follows:

- ``torch_neuronx_fx_passes``: the backend's FX-level policy on the ATen graph
  AOTAutograd hands it (backend.compile_graph: the FP8/float4 rules, the split
  around custom ops, the host-drawn random ops taken out, the lowerability
  check) and the graph's identity digest (CompiledGraph). 0 for a graph that
  came from AOTAutograd's disk cache (compiler/aot_cache.py), which skips them.
- ``torch_neuronx_lower``: tracing the graph through the lowering table under
  jax.jit into one StableHLO module (``jax.jit(...).lower``).
- ``torch_neuronx_compile``: XLA compiling that module into the executable
  (``Lowered.compile``; TorchNeuron: StableHLO to NEFF).

An executable this process already holds (the same graph compiled again, e.g.
after torch._dynamo.reset()) or loads from the disk cache is not lowered or
compiled again; its record carries the lower and compile times of the build
that produced it (kept with it in memory and in its disk entry), as
TorchNeuron reports its compile cache entry's compile time. What this process
itself compiled is in the counters (``compiles``, ``compile_seconds``,
``cache_hits_*``).

Each record also counts in ``torch._dynamo.utils.counters["neuron"]``
(``compiled_graphs``, ``graphs_with_collectives``) and appends its phase times
(seconds) to ``torch._dynamo.utils.compilation_time_metrics`` under
``torch_neuronx_fx_passes`` / ``torch_neuronx_lower`` / ``torch_neuronx_compile``
(what ``torch._dynamo.utils.compile_times()`` and ``TORCH_LOGS=+dynamo``
print). At exit, with ``TORCH_NEURONX_ENABLED_METRIC_TABLES=graph_stats``, the
records are written to ``$TORCH_NEURONX_METRICS_DIR/metric_table_graph_stats_rank{rank}.csv``.

The aggregate counters (compiles, compile seconds, cache hits, evictions,
graphs, recompiles) are this project's; TORCH_NEURONX_METRICS_ENABLED=0 stops
counting them (read at each event, so it can be switched on or off while the
process runs); the log lines stay. The snapshot's ``enabled`` says whether
counting is on; while it is off the counters keep the values they had (zero
when it was off from the start). The records, ``counters["neuron"]``, the
phase times and the CSV do not depend on it, as in TorchNeuron, where that
variable governs other (runtime) metrics.

All state is in this module, behind one lock.
"""

from __future__ import annotations

import atexit
import csv
import dataclasses
import os
import sys
import threading
import time
from collections import Counter

from torch_neuronx import config
from torch_neuronx.log import get_logger

_log = get_logger("compiler")

_lock = threading.Lock()
_counts: Counter = Counter()
_compile_seconds = [0.0]
_recompile_reasons: list[str] = []


# ------------------------------------------------------------------ per-graph records


@dataclasses.dataclass
class NeuronCompilationMetrics:
    """One compiled graph (TorchNeuron's record, its field names and order).

    graph_id: the executable's key (its disk cache entry's name when it has one).
    graph_name: ``{model_name}_{aot_id}_{graph_type}_{nth}`` (AOTAutograd's
    compile id, graph type forward/backward/inference and its count); a piece
    of a graph split around custom ops has ``{graph_type}_piece{k}`` as type.
    model_name: ``torch.compile(..., options={"model_name": ...})``, else
    ``model_default``. has_collectives: the graph AOTAutograd produced calls
    collectives (functional all_reduce, ...). graph_node_count: nodes of the FX
    graph compiled. timestamp: when the record was made (UTC,
    ``YYYYMMDD_HHMMSS_microseconds``). The three times: see the module's
    docstring, in microseconds.
    """

    graph_id: str
    graph_name: str = ""
    model_name: str = ""
    has_collectives: bool = False
    graph_node_count: int = 0
    timestamp: str = ""
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0


# The tables TORCH_NEURONX_ENABLED_METRIC_TABLES can name, each with its columns.
METRIC_TABLES: dict[str, list[str]] = {
    "graph_stats": [field.name for field in dataclasses.fields(NeuronCompilationMetrics)],
}
PHASES = ("torch_neuronx_fx_passes", "torch_neuronx_lower", "torch_neuronx_compile")

_records: list[NeuronCompilationMetrics] = []
_phase_lists: dict[str, list] = {}  # the lists put in Dynamo's compilation_time_metrics


def _dynamo_utils():
    import torch._dynamo.utils

    return torch._dynamo.utils


def _register_phases(utils) -> None:
    """Our lists in compilation_time_metrics (torch._dynamo.reset() empties that dict; the
    lists come back with the times recorded since the last reset_dynamo_metrics())."""
    for phase in PHASES:
        phase_list = _phase_lists.setdefault(phase, [])
        if utils.compilation_time_metrics.get(phase) is not phase_list:
            utils.compilation_time_metrics[phase] = phase_list


def record_compilation(record: NeuronCompilationMetrics) -> None:
    """Adds one record, counts it in Dynamo's counters["neuron"] and its phase
    times in Dynamo's compilation_time_metrics."""
    utils = _dynamo_utils()
    if not record.timestamp:
        now = time.time()
        record.timestamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(now)) + f"_{int(now % 1 * 1e6):06d}"
    with _lock:
        _records.append(record)
        utils.counters["neuron"]["compiled_graphs"] += 1
        if record.has_collectives:
            utils.counters["neuron"]["graphs_with_collectives"] += 1
        _register_phases(utils)
        for phase in PHASES:
            micros = getattr(record, f"{phase}_us")
            _phase_lists[phase].append(micros / 1e6)
            utils.cumulative_time_spent_ns[phase] = utils.cumulative_time_spent_ns.get(phase, 0) + micros * 1000
    _log.debug("graph %s: fx passes %d us, lower %d us, compile %d us", record.graph_name,
               record.torch_neuronx_fx_passes_us, record.torch_neuronx_lower_us,
               record.torch_neuronx_compile_us)


def records() -> list[NeuronCompilationMetrics]:
    with _lock:
        if "torch._dynamo.utils" in sys.modules:
            _register_phases(sys.modules["torch._dynamo.utils"])
        return list(_records)


# ------------------------------------------------------------------ graph names


_naming = threading.local()  # model_name and warm-start aot_id of the compile running in this thread
_model_of_aot_id: dict[int, str] = {}  # a lazily compiled backward graph takes its forward's model name
_unnamed = [0]


class compiling:
    """The model name of one backend compile (torch.compile's options), for the
    graphs AOTAutograd hands the backend during it."""

    def __init__(self, options):
        name = options.get("model_name") if isinstance(options, dict) else None
        self.model_name = str(name) if name is not None else "model_default"

    def __enter__(self):
        self.saved = getattr(_naming, "model_name", None), getattr(_naming, "aot_id", None)
        _naming.model_name, _naming.aot_id = self.model_name, None
        return self

    def __exit__(self, *exc):
        _naming.model_name, _naming.aot_id = self.saved


def warm_start(aot_id: int) -> None:
    """The AOTAutograd compile id of graphs loaded from AOTAutograd's disk cache
    (they are not handed to the backend, so AOTAutograd names none)."""
    _naming.aot_id = aot_id


def graph_name(kind: str) -> tuple[str, str]:
    """(model_name, graph_name) for a graph of `kind` handed to the backend now:
    ``{model_name}_{aot_id}_{kind}_{nth}`` from AOTAutograd's name of the
    graph it is compiling (``model__{aot_id}_{kind}_{nth}``)."""
    from torch._functorch._aot_autograd import logging_utils

    model = getattr(_naming, "model_name", None)
    compiling_now = logging_utils.graph_being_compiled
    if compiling_now:
        aot_part = compiling_now[0]  # "{aot_id}_{forward|backward|inference}"
        aot_id = int(aot_part.split("_", 1)[0]) if aot_part.split("_", 1)[0].isdigit() else None
        suffix = f"{aot_part}_{logging_utils.nth_graph}"
    elif getattr(_naming, "aot_id", None) is not None:
        aot_id = _naming.aot_id
        suffix = f"{aot_id}_{kind}_0"
    else:
        with _lock:
            _unnamed[0] += 1
            aot_id, suffix = None, f"x{_unnamed[0]}_{kind}_0"
    with _lock:
        if model is None:
            model = _model_of_aot_id.get(aot_id, "model_default")
        elif aot_id is not None:
            _model_of_aot_id[aot_id] = model
    return model, f"{model}_{suffix}"


def naming(kind: str, gm) -> dict:
    """The names of the record of a graph of `kind` handed to the backend now, or
    loaded from AOTAutograd's disk cache; its FX passes' time is 0 until
    backend.compile_graph, which runs them, sets it."""
    model_name, name = graph_name(kind)
    return {"model_name": model_name, "graph_name": name, "has_collectives": has_collectives(gm),
            "fx_passes_seconds": 0.0}


_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d")


def has_collectives(gm) -> bool:
    """Whether an FX graph calls collectives (functional collectives: all_reduce,
    all_gather_into_tensor, reduce_scatter_tensor, ...)."""
    import torch

    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) \
                and target.namespace in _COLLECTIVE_NAMESPACES:
            return True
    return False


# ------------------------------------------------------------------ the CSV tables


def enabled_tables() -> set[str]:
    """TORCH_NEURONX_ENABLED_METRIC_TABLES, checked against METRIC_TABLES."""
    return set(config.enabled_metric_tables())


def _rank() -> int:
    """The process's rank: torch.distributed's when a process group is up, else
    the current neuron device (as TorchNeuron names its files)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return torch.neuron.current_device()
    except Exception:  # noqa: BLE001 - at exit, the runtime may be gone
        return 0


def write_tables() -> list[str]:
    """Writes each enabled table (TORCH_NEURONX_ENABLED_METRIC_TABLES) with at
    least one row to TORCH_NEURONX_METRICS_DIR; returns the paths written.
    Registered with atexit."""
    tables = enabled_tables()
    written = []
    with _lock:
        rows = list(_records)
    if "graph_stats" in tables and rows:
        columns = METRIC_TABLES["graph_stats"]
        path = os.path.join(config.metrics_dir(), f"metric_table_graph_stats_rank{_rank()}.csv")
        try:
            with open(path, "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(columns)
                for record in rows:
                    writer.writerow([getattr(record, column) for column in columns])
            written.append(path)
        except OSError as error:
            _log.warning("could not write the graph_stats metric table to %s (%s); set "
                         "TORCH_NEURONX_METRICS_DIR to a writable directory", path, error)
    return written


def _write_tables_at_exit() -> None:
    try:
        write_tables()
    except ValueError as error:  # a bad TORCH_NEURONX_ENABLED_METRIC_TABLES: said, not raised at exit
        _log.error("%s", error)


atexit.register(_write_tables_at_exit)


# ------------------------------------------------------------------ aggregate counters


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


# ------------------------------------------------------------------ what get_dynamo_metrics() returns


class DynamoMetrics(list):
    """get_dynamo_metrics()'s value: the list of per-graph records
    (NeuronCompilationMetrics, TorchNeuron's API), which also answers string
    keys with this project's aggregate counters (``m["compiles"]``,
    ``m.get("cache_hits_disk")``, ``dict(m)``), as the dict earlier releases of
    this project returned. Integer indexes, slices, iteration and ``len`` are
    the list's."""

    def __init__(self, graph_records, counters: dict):
        super().__init__(graph_records)
        self.counters = counters

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.counters[key]
        return super().__getitem__(key)

    def __contains__(self, item) -> bool:
        if isinstance(item, str):
            return item in self.counters
        return super().__contains__(item)

    def get(self, key: str, default=None):
        return self.counters.get(key, default)

    def keys(self):
        return self.counters.keys()

    def values(self):
        return self.counters.values()

    def items(self):
        return self.counters.items()

    def __repr__(self) -> str:
        return f"DynamoMetrics({list.__repr__(self)}, counters={self.counters!r})"


def get() -> DynamoMetrics:
    return DynamoMetrics(records(), snapshot())


def reset() -> None:
    """Clears the records, the counters (ours, Dynamo's graph breaks and
    counters["neuron"]) and our phase times in compilation_time_metrics."""
    utils = _dynamo_utils()
    with _lock:
        _counts.clear()
        _compile_seconds[0] = 0.0
        _recompile_reasons.clear()
        _records.clear()
        for phase_list in _phase_lists.values():
            phase_list.clear()  # in place: references taken from compilation_time_metrics stay live
        for phase in PHASES:
            utils.cumulative_time_spent_ns.pop(phase, None)
        utils.counters["neuron"].clear()
    utils.counters["graph_break"].clear()
