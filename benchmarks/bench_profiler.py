#!/usr/bin/env python
"""The cost of torch.profiler's device activity on the neuron device.

    python benchmarks/bench_profiler.py            # prints the table
    python benchmarks/bench_profiler.py --write    # ... and rewrites its section of benchmarks/RESULTS.md
    python benchmarks/bench_profiler.py --quick    # a few seconds, for smoke tests

In one process, the steps of bench_audit.py (an MLP and a transformer training
step, 200 tiny element-wise ops) are timed three ways, rounds interleaved:
plain (no profile), under torch.profiler with CPU activity only (PyTorch's own
cost: RecordFunction, Kineto's CPU events), and with CPU and device activity
(ProfilerActivity.PrivateUse1: a device event per kernel, csrc/Profiler.cpp).
Reported per case: profiled / plain and device / CPU-only (the part this
project adds), medians and spread of the per-round ratios. Only the steps are
timed; the profile's start and its post-processing at exit are reported apart.
With no profile the device hook costs one relaxed atomic load per op, shared
with the audit's recorder (the eager section measures the eager path with it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import torch_neuronx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_audit import CASES  # noqa: E402  (the same steps as the audit's overhead)
from results_file import publish  # noqa: E402

MODES = {"plain": None, "cpu": [ProfilerActivity.CPU],
         "device": [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]}


def _time(step, iterations: int, activities) -> tuple[float, float]:
    """Seconds per step, and seconds of the profile's exit (post-processing)."""
    if activities is None:
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        return (time.perf_counter() - start) / iterations, 0.0
    prof = profile(activities=activities)
    prof.__enter__()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    per_step = (time.perf_counter() - start) / iterations
    start = time.perf_counter()
    prof.__exit__(None, None, None)
    prof.key_averages()  # the events are parsed when first asked for
    return per_step, time.perf_counter() - start


def measure(build, rounds: int, iterations: int) -> dict:
    step = build()
    for _ in range(3):
        step()  # warm up (first calls, allocator)
    times = {mode: [] for mode in MODES}
    exits = {mode: [] for mode in MODES}
    for index in range(rounds):
        order = list(MODES)[index % 3:] + list(MODES)[:index % 3]  # rotate the order per round
        for mode in order:
            per_step, exit_s = _time(step, iterations, MODES[mode])
            times[mode].append(per_step)
            exits[mode].append(exit_s)

    def ratio(a, b):
        values = [x / y for x, y in zip(times[a], times[b])]
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        return {"median": statistics.median(values), "p25": quartiles[0], "p75": quartiles[2]}

    return {**{f"{mode}_s": statistics.median(times[mode]) for mode in MODES},
            "device_exit_s": statistics.median(exits["device"]),
            "cpu_exit_s": statistics.median(exits["cpu"]),
            "device_vs_plain": ratio("device", "plain"), "cpu_vs_plain": ratio("cpu", "plain"),
            "device_vs_cpu": ratio("device", "cpu")}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def report(results: dict, args) -> str:
    load = os.getloadavg()[0]
    lines = [
        "## torch.profiler device activity (`benchmarks/bench_profiler.py`)",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Command: `python benchmarks/bench_profiler.py{' --write' if args.write else ''}`",
        f"- Machine: {os.cpu_count()} logical cores, load average {load:.2f} at the end; torch threads "
        f"{torch.get_num_threads()}",
        f"- Software: torch {torch.__version__}, torch_neuronx {torch_neuronx.__version__}, Python "
        f"{platform.python_version()}",
        "",
        f"Method: the same step timed with no profile, under `torch.profiler` with "
        f"`ProfilerActivity.CPU` only, and with CPU and `PrivateUse1` (device events), in one process, "
        f"{args.rounds} rounds of {args.iterations} iterations with the order rotated per round; "
        f"ratios per round, median and 25th-75th percentile. Only the steps are timed; the exit "
        f"column is the profile's post-processing (stop, parse, `key_averages()`) of "
        f"{args.iterations} steps.",
        "",
        "| case | plain | CPU profile | CPU + device | CPU+device / plain (p25-p75) | "
        "CPU / plain | CPU+device / CPU | exit CPU / CPU+device |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        d, c, dc = r["device_vs_plain"], r["cpu_vs_plain"], r["device_vs_cpu"]
        lines.append(f"| {name} | {_ms(r['plain_s'])} | {_ms(r['cpu_s'])} | {_ms(r['device_s'])} | "
                     f"{d['median']:.3f} ({d['p25']:.3f}-{d['p75']:.3f}) | {c['median']:.3f} | "
                     f"{dc['median']:.3f} | {_ms(r['cpu_exit_s'])} / {_ms(r['device_exit_s'])} |")
    lines += [
        "",
        "With no profile running the device hook is one relaxed atomic load per op, the word the "
        "audit's recorder already loads (csrc/Recorder.h): nothing is added to the eager path, whose "
        "cost the eager section above measures. The emulator runs kernels on the host, so a device "
        "event's duration is host time: the profile's own cost is inside it.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite this section of benchmarks/RESULTS.md")
    parser.add_argument("--quick", action="store_true", help="few rounds (smoke test)")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=10)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.iterations = 2, 1
    torch.set_num_threads(1)
    results = {name: measure(build, args.rounds, args.iterations) for name, build in CASES.items()}
    publish("profiler", report(results, args), write=args.write and not args.quick,
            json_path=args.json, payload=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
