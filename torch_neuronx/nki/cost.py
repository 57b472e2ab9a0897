"""Cost model: schedule a recorded instruction trace on one NeuronCore and estimate its latency.

Each compute engine (Tensor, Vector, Scalar, GpSimd) runs its instructions in order; an
instruction starts when its engine is free and every earlier instruction it depends on has ended
(read-after-write, write-after-read and write-after-write on overlapping parts of the same tile).
Cycle counts follow docs/hardware-figures.md#neuroncore-and-nki-figures and are converted with the engine clocks of the target.

DMA: 16 queues; a transfer takes a free queue, pays a fixed setup (~1.3 us, so concurrent transfers
amortize it), then moves its bytes through the core's shared DMA bandwidth (16 x per-queue rate) at an
efficiency set by bytes per partition: 0.9 x bpp / 2 KiB below 2 KiB, reaching 1.0 at 4 KiB.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .targets import ENGINES, Target, get_target

MIN_II = 64
MIN_II_DYNAMIC = 600  # AWS: an instruction with a dynamic source or destination offset
VECTOR_DEPENDENCY_CYCLES = 100
_MERGE_AT = 64


def dma_efficiency(bytes_per_partition: float) -> float:
    """Fraction of peak DMA bandwidth a transfer reaches, from its bytes per partition (row)."""
    b = bytes_per_partition
    if b >= 4096:
        return 1.0
    if b >= 2048:
        return 0.9 + 0.1 * (b - 2048) / 2048
    return max(0.9 * b / 2048, 1e-4)


def instruction_cycles(cost: tuple, target: Target) -> float:
    """Engine cycles of one compute instruction (docs/hardware-figures.md#neuroncore-and-nki-figures; N = elements per partition)."""
    kind = cost[0]
    if kind == "matmul":
        _, m, n, dtype_name = cost
        cycles = max(min(64, m), n)
        if dtype_name in ("float32", "tfloat32"):
            return cycles * 4
        if dtype_name.startswith("float8"):
            return cycles / target.fp8_matmul_speedup
        return cycles
    if kind == "elementwise":  # ("elementwise", N[, extra cycles]), e.g. tensor_scalar_reduce's + MIN_II
        return max(MIN_II, cost[1]) + (cost[2] if len(cost) > 2 else 0)
    if kind == "tensor_tensor":
        _, n, fast = cost
        return max(MIN_II, n if fast else 2 * n)
    if kind == "reduce":
        return cost[1]
    if kind == "reciprocal":
        return max(MIN_II, 8 * cost[1])
    if kind == "gpsimd":
        return 150 + cost[1]
    if kind == "dynamic":  # tensor_copy_dynamic_src/dst: AWS's max(MIN_II_DYNAMIC ~ 600, N)
        return max(MIN_II_DYNAMIC, cost[1])
    if kind == "local_gather":  # AWS: 150 + n_idx * n_elem / C, C = ((28 + t e) / (t e)) / min(4 / size, e), t = 4
        _, indices, elems, size = cost
        c = ((28 + 4 * elems) / (4 * elems)) / min(4 / size, elems)
        return 150 + indices * elems / c
    raise ValueError(f"unknown cost kind {kind!r}")


def dma_time_us(nbytes: float, bytes_per_partition: float, target: Target) -> float:
    """Data-movement time of one transfer through the core's shared DMA bandwidth (no setup)."""
    bandwidth = target.dma_queues * target.dma_queue_bytes_per_ns  # bytes per ns
    return nbytes / (bandwidth * dma_efficiency(bytes_per_partition)) / 1000.0


def _overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]


class _Deps:
    """Per allocation: recent accesses (box, end time, is_write), merged when the list grows."""

    def __init__(self):
        self.table: dict[int, list] = {}

    def ready(self, reads, writes) -> float:
        t = 0.0
        table = self.table
        for aid, bx in reads:
            for e in table.get(aid, ()):
                if e[2] and e[1] > t and _overlaps(bx, e[0]):
                    t = e[1]
        for aid, bx in writes:
            for e in table.get(aid, ()):
                if e[1] > t and _overlaps(bx, e[0]):
                    t = e[1]
        return t

    def add(self, reads, writes, end):
        for accesses, is_write in ((reads, False), (writes, True)):
            for aid, bx in accesses:
                entries = self.table.setdefault(aid, [])
                entries.append((bx, end, is_write))
                if len(entries) > _MERGE_AT:
                    self.table[aid] = _merge(entries)


def _merge(entries):
    """Collapse the older half into one conservative entry per access kind."""
    old, keep = entries[: len(entries) // 2], entries[len(entries) // 2:]
    merged = []
    for kind in (False, True):
        group = [e for e in old if e[2] == kind]
        if group:
            bx = (min(e[0][0] for e in group), max(e[0][1] for e in group),
                  min(e[0][2] for e in group), max(e[0][3] for e in group))
            merged.append((bx, max(e[1] for e in group), kind))
    return merged + keep


@dataclass
class Schedule:
    latency_us: float
    engines: dict
    start_us: list
    end_us: list


def schedule(trace, target: Target) -> Schedule:
    free = {e: 0.0 for e in ENGINES if e != "dma"}
    busy = {e: 0.0 for e in ENGINES}
    queues = [0.0] * target.dma_queues
    bandwidth_free = 0.0
    deps = _Deps()
    prev_vector_writes = []
    starts, ends = [], []
    latency = 0.0
    for ins in trace:
        ready = deps.ready(ins.reads, ins.writes)
        for producer in getattr(ins, "after", ()):  # NkiInstruction.depends_on edges
            ready = max(ready, ends[producer])
        if ins.engine == "dma":
            queue_free = heapq.heappop(queues)
            setup_done = max(queue_free, ready) + target.dma_setup_us
            start = max(setup_done, bandwidth_free)
            duration = dma_time_us(ins.cost[1], ins.cost[2], target)
            end = start + duration
            bandwidth_free = end
            heapq.heappush(queues, end)
            start = setup_done - target.dma_setup_us
        else:
            engine = ins.engine
            cycles = instruction_cycles(ins.cost, target)
            if engine == "vector":
                if any(a == b and _overlaps(x, y) for a, x in ins.reads for b, y in prev_vector_writes):
                    cycles += VECTOR_DEPENDENCY_CYCLES
                prev_vector_writes = ins.writes
            duration = cycles / (target.clock_ghz[engine] * 1e3)
            start = max(free[engine], ready)
            end = start + duration
            free[engine] = end
        busy[ins.engine] += duration
        deps.add(ins.reads, ins.writes, end)
        starts.append(start)
        ends.append(end)
        latency = max(latency, end)
    return Schedule(latency, busy, starts, ends)


def roofline_us(flops: float, dtype="bfloat16", target="trn2") -> float:
    """Time (us) one core's Tensor Engine needs for `flops` at peak rate for `dtype`."""
    from . import dtypes as _dt

    name = dtype if isinstance(dtype, str) else _dt.name(_dt.normalize(dtype))
    return flops / get_target(target).tensor_peak_flops(name) * 1e6


@dataclass
class BenchmarkResult:
    """What `nki.benchmark` returns. Times in microseconds; `utilization` is the Tensor Engine
    roofline time of the kernel's matmul FLOPs divided by the estimated latency."""

    target: str
    latency_us: float
    engines: dict
    utilization: float
    flops: int
    roofline_us: float
    trace: list = field(repr=False)
    outputs: object = field(repr=False)
    schedule: Schedule = field(repr=False)

    @property
    def nc_latency(self) -> "Latency":
        """AWS's `benchmark_result.nc_latency` (microseconds, `get_latency_percentile(p)`)."""
        return Latency(self.latency_us)

    def summary(self) -> str:
        busy = ", ".join(f"{k} {v:.2f} us" for k, v in self.engines.items() if v)
        return (f"{self.target}: {self.latency_us:.2f} us estimated, {len(self.trace)} instructions, "
                f"TensorE utilization {self.utilization:.1%} (roofline {self.roofline_us:.2f} us); busy: {busy}")


@dataclass(frozen=True)
class Latency:
    """The latency statistics AWS's `nki.benchmark` collects over `iters` device runs. The estimate
    is deterministic, so every percentile is the same number."""

    latency_us: float

    def get_latency_percentile(self, percentile) -> float:
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        return self.latency_us


def estimate(trace, target_name: str, outputs=None) -> BenchmarkResult:
    target = get_target(target_name)
    sched = schedule(trace, target)
    flops = 0
    ideal = 0.0
    for ins in trace:
        if ins.flops:
            flops += ins.flops
            ideal += ins.flops / target.tensor_peak_flops(ins.matmul_dtype) * 1e6
    utilization = ideal / sched.latency_us if sched.latency_us > 0 else 0.0
    return BenchmarkResult(target.name, sched.latency_us, sched.engines, utilization, flops, ideal,
                           trace, outputs, sched)
