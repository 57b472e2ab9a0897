#!/usr/bin/env python
"""Eager benchmarks: the neuron device against native CPU eager, in one process.

    python benchmarks/bench_eager.py            # full run, prints the table
    python benchmarks/bench_eager.py --write    # ... and rewrites benchmarks/RESULTS.md
    python benchmarks/bench_eager.py --quick    # a few seconds, for smoke tests

Every figure is a ratio against a CPU baseline measured in the same process.
Both sides of a case run the same statement on identical data (same seed,
same weights, same optimizer settings, same thread count). Measurements are
interleaved: each round times one block of many iterations on CPU and one on
neuron (the order alternates between rounds), and the ratio is taken per
round. The report gives the median over rounds and the spread (25th-75th
percentile of the per-round ratios), so that a noisy machine shows as a wide
spread rather than as a wrong median.

The full run also times a set of micro-operations (in-place and out= adds,
views, allocation, ...) that split the per-op overhead of the eager path into
its parts.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import torch_neuronx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import RESULTS_PATH, write_section  # noqa: E402

HERE = Path(__file__).resolve().parent
DEVICES = ("cpu", "neuron")


# ----------------------------------------------------------------- the cases

@dataclass
class Setup:
    """What one device runs: `stmt` is timed in a loop with `namespace` as globals."""

    stmt: str
    namespace: dict
    check: Callable[[], object] | None = None  # result compared across devices


@dataclass
class Case:
    name: str
    label: str
    target: float | None
    make: Callable[[str], Setup]
    compare: str = "allclose"  # how `check` results of the two devices must agree


def _pair(shape, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g)
    b = torch.randn(shape, generator=g)
    return a.to(device), b.to(device)


def make_binary(stmt: str, shape):
    def make(device: str) -> Setup:
        a, b = _pair(shape, device)
        c = torch.empty(shape, device=device)
        ns = {"a": a, "b": b, "c": c, "torch": torch, "dev": torch.device(device)}
        return Setup(stmt, ns, check=lambda: eval(stmt, ns))

    return make


def make_mlp(device: str) -> Setup:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 512, generator=g)
    y = torch.randint(0, 512, (64,), generator=g)
    return _training_setup(model, device, F.cross_entropy, x, y)


def make_transformer(device: str) -> Setup:
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(
        d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 64, 256, generator=g)
    y = torch.randn(8, 64, 256, generator=g)
    return _training_setup(model, device, F.mse_loss, x, y)


def _training_setup(model, device, criterion, x, y) -> Setup:
    # The model is built with the same seed for each device, then moved: both
    # sides start from the very same weights and data.
    model = model.to(device)
    model.train()
    x, y = x.to(device), y.to(device)
    # foreach=True on both sides: PyTorch picks the multi-tensor path by
    # default for PrivateUse1 devices but not for CPU; pinning it keeps the
    # two sides doing the same work.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step():
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    # Checked before timing: the same weights and data give the same loss on
    # both devices (dropout off: the two devices draw from different generators).
    # The fast inference path of nn.TransformerEncoderLayer is kept off: the
    # training step never takes it.
    def check():
        model.eval()
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with torch.no_grad():
                value = criterion(model(x), y).cpu()
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
            model.train()
        return value

    return Setup("step()", {"step": step}, check=check)


CASES = [
    Case("add16", "add, 16 float32 (a + b)", 1.5, make_binary("a + b", (16,))),
    Case("add64x64", "add, 64x64 float32 (a + b)", 1.5, make_binary("a + b", (64, 64))),
    Case("matmul1024", "matmul, 1024x1024 float32 (a @ b)", 1.05,
         make_binary("a @ b", (1024, 1024))),
    Case("mlp_step", "MLP training step (3x Linear 512, batch 64, AdamW)", 1.05, make_mlp,
         compare="loss"),
    Case("transformer_step",
         "Transformer training step (EncoderLayer d=256, 4 heads, batch 8, seq 64, AdamW)", 1.05,
         make_transformer, compare="loss"),
]

# Large cases rerun with a CPU baseline whose malloc keeps freed memory.
RETAINED_CASES = ("matmul1024", "mlp_step", "transformer_step")

# Micro-operations that split the tiny-op overhead into its parts (no target).
MICRO = [
    ("a + b", "binary op, allocates its output", (16,)),
    ("a.add_(b)", "in-place binary op, no allocation", (16,)),
    ("torch.add(a, b, out=c)", "binary op with out= (mutated argument)", (16,)),
    ("a * b", "another binary op", (16,)),
    ("a.neg()", "unary op, allocates its output", (16,)),
    ("a.mul(2.0)", "tensor times Python float (wrapped-number scalar)", (16,)),
    ("a.sum()", "reduction to a 0-dim tensor", (16,)),
    ("a.clone()", "copy into a new tensor", (16,)),
    ("a.view(-1)", "view (metadata only)", (16,)),
    ("a.t()", "transpose view of a 4x4 (composite -> as_strided)", (4, 4)),
    ("a[1:3]", "slice view", (16,)),
    ("torch.empty(16, device=dev)", "allocation only (empty.memory_format)", (16,), "meta"),
    ("torch.empty_like(a)", "allocation via empty_like", (16,), "meta"),
    ("a.item()", "device -> host scalar", (1,)),
    ("a.fill_(1.0)", "in-place fill", (16,)),
]


# --------------------------------------------------------------- measurement

def _sync(device: str) -> Callable[[], None]:
    if device == "neuron":
        return torch.neuron.synchronize
    return lambda: None


def _loop(setup: Setup, device: str) -> Callable[[int], None]:
    """A function running `stmt` n times then synchronizing, with the
    statement compiled inline (no per-iteration call overhead of our own)."""
    ns = dict(setup.namespace)
    ns["_sync"] = _sync(device)
    ns.setdefault("dev", torch.device(device))
    src = f"def _loop(_n):\n    for _ in range(_n):\n        {setup.stmt}\n    _sync()\n"
    exec(compile(src, f"<bench {device}>", "exec"), ns)
    return ns["_loop"]


def _time_block(loop: Callable[[int], None], n: int) -> tuple[float, float, float]:
    """Per iteration over one block of n iterations (GC paused): wall-clock
    seconds, process CPU seconds and minor page faults. CPU time leaves out
    the time the process was preempted, so it is the steadier figure on a
    loaded machine."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        w0, p0 = time.perf_counter(), time.process_time()
        loop(n)
        w1, p1 = time.perf_counter(), time.process_time()
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    finally:
        if enabled:
            gc.enable()
    return (w1 - w0) / n, (p1 - p0) / n, (f1 - f0) / n


def retain_freed_memory() -> bool:
    """Make glibc keep freed memory instead of returning it to the OS (no
    per-call mmap/munmap and page faults for large buffers): the CPU-side
    equivalent of the device's caching allocator. Process-wide."""
    try:
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_trim_threshold, 1 << 30)) and bool(
            libc.mallopt(m_mmap_threshold, 32 << 20))  # 32 MiB: glibc's maximum
    except (OSError, AttributeError):
        return False


def _calibrate(loop: Callable[[int], None], block_s: float) -> int:
    """Iterations per block so that one block takes about block_s."""
    n = 1
    while True:
        per_iter = _time_block(loop, n)[0]
        if per_iter * n >= block_s / 4 or n >= 1 << 24:
            return max(1, int(block_s / per_iter))
        n *= 4


def _quantile(values, q):
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Measurement:
    name: str
    label: str
    target: float | None
    iterations: int
    cpu_rounds: list = field(default_factory=list)
    fallback_ops: dict = field(default_factory=dict)
    note: str = ""
    neuron_rounds: list = field(default_factory=list)
    cpu_rounds_proc: list = field(default_factory=list)  # process CPU time
    neuron_rounds_proc: list = field(default_factory=list)
    cpu_faults: list = field(default_factory=list)  # minor page faults per iteration
    neuron_faults: list = field(default_factory=list)

    @property
    def ratios(self):
        return [n / c for c, n in zip(self.cpu_rounds, self.neuron_rounds)]

    @property
    def ratio_proc(self):
        """Median per-round ratio of process CPU time (all threads)."""
        return statistics.median(
            n / c for c, n in zip(self.cpu_rounds_proc, self.neuron_rounds_proc) if c > 0)

    @property
    def cpu_s(self):
        return statistics.median(self.cpu_rounds)

    @property
    def neuron_s(self):
        return statistics.median(self.neuron_rounds)

    @property
    def ratio(self):
        return statistics.median(self.ratios)

    @property
    def ratio_p25(self):
        return _quantile(self.ratios, 0.25)

    @property
    def ratio_p75(self):
        return _quantile(self.ratios, 0.75)

    @property
    def overhead_us(self):
        """Median over rounds of (neuron - cpu) per iteration, microseconds."""
        return statistics.median(
            (n - c) * 1e6 for c, n in zip(self.cpu_rounds, self.neuron_rounds))

    @property
    def overhead_proc_us(self):
        """Like overhead_us, in process CPU time (preemption left out)."""
        return statistics.median(
            (n - c) * 1e6 for c, n in zip(self.cpu_rounds_proc, self.neuron_rounds_proc))

    @property
    def passed(self):
        return None if self.target is None else self.ratio <= self.target

    def as_dict(self):
        return {
            "name": self.name, "label": self.label, "target": self.target,
            "iterations_per_block": self.iterations, "rounds": len(self.cpu_rounds),
            "cpu_s": self.cpu_s, "neuron_s": self.neuron_s, "ratio": self.ratio,
            "ratio_p25": self.ratio_p25, "ratio_p75": self.ratio_p75,
            "ratio_process_cpu_time": self.ratio_proc,
            "cpu_page_faults": statistics.median(self.cpu_faults),
            "neuron_page_faults": statistics.median(self.neuron_faults),
            "ratio_min": min(self.ratios), "ratio_max": max(self.ratios),
            "overhead_us": self.overhead_us, "overhead_process_cpu_us": self.overhead_proc_us,
            "passed": self.passed,
            "fallback_ops": self.fallback_ops, "note": self.note,
        }


def _agree(case_compare: str, cpu_value, neuron_value) -> bool:
    cpu_value = cpu_value.detach().cpu() if isinstance(cpu_value, torch.Tensor) else cpu_value
    neuron_value = (neuron_value.detach().cpu()
                    if isinstance(neuron_value, torch.Tensor) else neuron_value)
    if cpu_value.dtype != neuron_value.dtype or cpu_value.shape != neuron_value.shape:
        return False
    if case_compare == "loss":
        return bool(torch.isfinite(neuron_value).all()) and torch.allclose(
            cpu_value, neuron_value, rtol=1e-4, atol=1e-5)
    return torch.allclose(cpu_value, neuron_value, rtol=1e-4, atol=1e-4)


def _snapshot(value, meta_only=False):
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach().cpu().clone()
    return torch.zeros_like(value) if meta_only else value


def measure(name, label, target, setups: dict, rounds: int, block_s: float,
            compare: str = "allclose", log=print) -> Measurement:
    if all(s.check is not None for s in setups.values()):
        if not _agree(compare, setups["cpu"].check(), setups["neuron"].check()):
            raise RuntimeError(f"{name}: neuron result differs from CPU; not timing a wrong op")
    loops = {device: _loop(setups[device], device) for device in DEVICES}
    started = time.perf_counter()
    torch_neuronx.clear_op_tracking()
    # Warm up both sides (allocator caches, optimizer state, lazy init) for
    # about one block each, then size the blocks on the CPU side.
    for device in DEVICES:
        n = 1
        start = time.perf_counter()
        while time.perf_counter() - start < block_s:
            loops[device](n)
            n = min(n * 2, 1 << 16)
    n = _calibrate(loops["cpu"], block_s)
    # Long-lived objects (torch's modules, the models) leave the GC's view, so
    # a collection is cheap; then start every case from a clean heap.
    gc.collect()
    gc.freeze()
    result = Measurement(name, label, target, n)
    for r in range(rounds):
        order = DEVICES if r % 2 == 0 else DEVICES[::-1]
        times = {device: _time_block(loops[device], n) for device in order}
        result.cpu_rounds.append(times["cpu"][0])
        result.neuron_rounds.append(times["neuron"][0])
        result.cpu_rounds_proc.append(times["cpu"][1])
        result.neuron_rounds_proc.append(times["neuron"][1])
        result.cpu_faults.append(times["cpu"][2])
        result.neuron_faults.append(times["neuron"][2])
    result.fallback_ops = torch_neuronx.get_fallback_ops()
    log(f"  {name:<18} cpu {_fmt_time(result.cpu_s):>10}  neuron {_fmt_time(result.neuron_s):>10}"
        f"  ratio {result.ratio:5.3f} [{result.ratio_p25:.3f}-{result.ratio_p75:.3f}]"
        f" (cpu-time {result.ratio_proc:5.3f})"
        f"  ({rounds} rounds x {n} it, {time.perf_counter() - started:.1f} s)")
    return result


def _fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


# ------------------------------------------------------------------ reporting

def machine_info() -> dict:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "build": _build_info(),
        "cpu_model": model, "logical_cores": os.cpu_count(), "usable_cores": usable,
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "torch_neuronx": getattr(torch_neuronx, "__version__", "?"),
        "python": platform.python_version(), "platform": platform.platform(),
    }


def _build_info() -> str:
    """The commit and the age of the C++ core: numbers depend on both."""
    import subprocess
    import torch_neuronx._C as core
    so = Path(core.__file__)
    built = datetime.datetime.fromtimestamp(so.stat().st_mtime, datetime.timezone.utc)
    try:
        root = Path(torch_neuronx.__file__).resolve().parents[1]
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "csrc"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit = f"{head}{' + uncommitted csrc changes' if dirty else ''}" if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return f"commit {commit}; {so.name} built {built:%Y-%m-%d %H:%M UTC}"


def _case_table(results) -> list:
    lines = [
        "| case | CPU | neuron | ratio neuron/CPU | spread p25-p75 [min-max] | ratio by CPU time "
        "| page faults per it, CPU / neuron | target | result |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in results:
        verdict = "n/a" if m.passed is None else ("PASS" if m.passed else "FAIL")
        lines.append(
            f"| {m.label} | {_fmt_time(m.cpu_s)} | {_fmt_time(m.neuron_s)} | {m.ratio:.3f} | "
            f"{m.ratio_p25:.3f}-{m.ratio_p75:.3f} [{min(m.ratios):.3f}-{max(m.ratios):.3f}] | "
            f"{m.ratio_proc:.3f} | {statistics.median(m.cpu_faults):.0f} / "
            f"{statistics.median(m.neuron_faults):.0f} | <= {m.target} | {verdict} |")
    return lines


def render_markdown(results, micro, retained, info, command, date, fallback_ops) -> str:
    lines = [
        "## Eager: neuron device vs native CPU (`benchmarks/bench_eager.py`)",
        "",
        f"- Date: {date}",
        f"- Command: `{command}`",
        f"- Machine: {info['cpu_model']}, {info['logical_cores']} logical cores "
        f"({info['usable_cores']} usable), shared with other work; torch threads pinned to "
        f"{info['torch_threads']} for both devices",
        f"- Build: {info['build']}",
        f"- Software: torch {info['torch']}, torch_neuronx {info['torch_neuronx']}, "
        f"Python {info['python']}, {info['platform']}",
        "",
        "Method: CPU and neuron run the same statement on identical data in the same process. "
        "Each round times one block of N iterations on each device (order alternating between "
        "rounds); times are per iteration, the ratio is neuron/CPU per round. Reported: median "
        "over rounds, spread = 25th-75th percentile (min-max in brackets) of the per-round ratios. "
        "The pass/fail verdict uses the wall-clock ratio; the process-CPU-time ratio (all "
        "threads, preemption left out) is given as the steadier figure on a loaded machine. "
        "Training steps are forward + backward + AdamW(foreach=True) step + zero_grad.",
        "",
        f"Load average (1 min) at start / end of the run: {info['load_start']:.2f} / "
        f"{info['load_end']:.2f} on {info['logical_cores']} cores.",
        "",
        *_case_table(results),
    ]
    tiny = next((m for m in results if m.name == "add16"), None)
    if tiny is not None:
        lines += [
            "",
            f"Per-op overhead of the neuron eager path on the 16-element add: "
            f"**{tiny.overhead_us:.2f} us** per op (median of neuron minus CPU per round; "
            f"{tiny.overhead_proc_us:.2f} us in process CPU time; CPU alone "
            f"{_fmt_time(tiny.cpu_s)}).",
        ]
    lines += [
        "",
        "Fallback ops hit during the timed cases: "
        + (", ".join(f"`{k}` x{v}" for k, v in sorted(fallback_ops.items())) or "none") + ".",
    ]
    lines += [
        "",
        "Notes:",
        "- The CPU baseline allocates through PyTorch's default CPU allocator (glibc), which "
        "returns large freed buffers to the OS and faults fresh pages in on the next allocation "
        "(a 1024x1024 float32 result: ~512 minor page faults per call; see the page-fault "
        "column). The neuron device's caching allocator reuses its blocks, so allocation-heavy "
        "cases can come out below 1.0; the section below takes that effect out.",
        "- Once the device has run an op, CPU allocations in the process go through the device's "
        "capture wrapper around the CPU allocator (one thread-local check); the CPU baseline "
        "includes it.",
        "- Tiny-op times include the Python interpreter's share (the statement is compiled into "
        "the timing loop, no extra call per iteration); it is the same on both sides.",
    ]
    if retained:
        lines += [
            "",
            "## Large cases against a CPU baseline without allocator page faults",
            "",
            "The same cases rerun (same process, after the runs above) with glibc told to keep "
            "freed memory (`mallopt(M_TRIM_THRESHOLD, 1 GiB)`, `mallopt(M_MMAP_THRESHOLD, "
            "32 MiB)`), the CPU-side counterpart of the device's caching allocator, so that the "
            "ratio measures the eager path itself. Informational: the verdicts above are the "
            "ones that count.",
            "",
            *_case_table(retained),
        ]
    if micro:
        lines += [
            "",
            "## Micro-operations (per-op overhead breakdown, no targets)",
            "",
            "Tensors of 16 float32 (4x4 for `a.t()`), one thread. neuron - CPU is the median "
            "per-round difference per op, in wall-clock and in process CPU time.",
            "",
            "| statement | what it exercises | CPU | neuron | neuron - CPU | neuron - CPU, CPU time "
            "| ratio [p25-p75] | ratio by CPU time | note |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for m in micro:
            lines.append(
                f"| `{m.name}` | {m.label} | {_fmt_time(m.cpu_s)} | {_fmt_time(m.neuron_s)} | "
                f"{m.overhead_us:+.2f} us | {m.overhead_proc_us:+.2f} us | "
                f"{m.ratio:.2f} [{m.ratio_p25:.2f}-{m.ratio_p75:.2f}] | "
                f"{m.ratio_proc:.2f} | {m.note} |")
    lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------ main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="few short rounds (smoke test; numbers are rough)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {RESULTS_PATH}")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, the same for both devices (default 1, as in "
                             "PyTorch's operator_benchmark: on a shared machine multi-threaded "
                             "kernels measure the other tenants more than the op)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--block", type=float, default=None,
                        help="seconds per timed block (per device per round)")
    parser.add_argument("--only", nargs="*", help="run only these case names")
    parser.add_argument("--no-micro", action="store_true", help="skip the micro-operations")
    parser.add_argument("--no-retained", action="store_true",
                        help="skip the rerun of the large cases with glibc retaining freed memory")
    args = parser.parse_args(argv)

    threads = args.threads
    torch.set_num_threads(threads)
    rounds = args.rounds or (5 if args.quick else 31)
    block_s = args.block or (0.01 if args.quick else 0.1)
    run_micro = not args.quick and not args.no_micro
    run_retained = not args.quick and not args.no_retained

    torch.empty(1, device="neuron")  # start the runtime before anything is timed
    torch.set_num_threads(threads)

    load_start = os.getloadavg()[0]
    print(f"bench_eager: {rounds} rounds, {block_s * 1e3:.0f} ms blocks, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    results = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        setups = {device: case.make(device) for device in DEVICES}
        results.append(measure(case.name, case.label, case.target, setups, rounds, block_s,
                               compare=case.compare))
        del setups
    fallback_ops = {}
    for m in results:
        for op, count in m.fallback_ops.items():
            fallback_ops[op] = fallback_ops.get(op, 0) + count

    micro = []
    if run_micro:
        print("micro-operations:")
        for stmt, label, shape, *compare in MICRO:
            setups = {device: make_binary(stmt, shape)(device) for device in DEVICES}
            # Copied now: in-place statements return their (later mutated) input.
            cpu_value, neuron_value = (
                _snapshot(setups[d].check(), meta_only=compare == ["meta"]) for d in DEVICES)
            for setup in setups.values():
                setup.check = None
            m = measure(stmt, label, None, setups, max(rounds // 2, 5), block_s / 2)
            if isinstance(cpu_value, torch.Tensor) and not _agree("allclose", cpu_value,
                                                                  neuron_value):
                m.note = (f"result differs from CPU: {neuron_value.dtype} vs {cpu_value.dtype}"
                          if neuron_value.dtype != cpu_value.dtype else "result differs from CPU")
                print(f"    warning: {m.note}")
            micro.append(m)

    # Last, because it changes the process's malloc settings for good.
    retained = []
    if run_retained and retain_freed_memory():
        print("CPU baseline with glibc retaining freed memory:")
        for case in CASES:
            if case.name not in RETAINED_CASES or (args.only and case.name not in args.only):
                continue
            setups = {device: case.make(device) for device in DEVICES}
            retained.append(measure(case.name, case.label, case.target, setups, rounds, block_s,
                                    compare=case.compare))
            del setups

    if torch.get_num_threads() != threads:
        print(f"warning: torch threads changed to {torch.get_num_threads()} during the run")

    info = machine_info()
    info["load_start"], info["load_end"] = load_start, os.getloadavg()[0]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python " + " ".join(
        shlex.quote(a) for a in [os.path.relpath(sys.argv[0]) if sys.argv[0] else "bench_eager.py",
                                 *(argv if argv is not None else sys.argv[1:])])

    print()
    print(f"{'case':<18} {'cpu':>10} {'neuron':>10} {'ratio':>7} {'p25-p75':>13} "
          f"{'cpu-time':>8} {'target':>7}  result")
    for m in results:
        verdict = "-" if m.passed is None else ("PASS" if m.passed else "FAIL")
        print(f"{m.name:<18} {_fmt_time(m.cpu_s):>10} {_fmt_time(m.neuron_s):>10} {m.ratio:7.3f} "
              f"{m.ratio_p25:6.3f}-{m.ratio_p75:6.3f} {m.ratio_proc:8.3f} {m.target:7.2f}  {verdict}")
    if any(m.name == "add16" for m in results):
        tiny = next(m for m in results if m.name == "add16")
        print(f"tiny-add overhead: {tiny.overhead_us:.2f} us per op (neuron - cpu; "
              f"{tiny.overhead_proc_us:.2f} us in process CPU time)")
    print(f"fallback ops: {fallback_ops or 'none'}")

    if args.json:
        payload = {"date": date, "command": command, "machine": info,
                   "fallback_ops": fallback_ops, "cases": [m.as_dict() for m in results],
                   "micro": [m.as_dict() for m in micro],
                   "retained_malloc": [m.as_dict() for m in retained]}
        Path(args.json).write_text(json.dumps(payload, indent=2))
    if args.write:
        if args.quick or args.only:
            print("note: writing RESULTS.md from a partial or --quick run")
        write_section("eager", render_markdown(results, micro, retained, info, command, date,
                                               fallback_ops))
        print(f"wrote {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
