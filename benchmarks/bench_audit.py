#!/usr/bin/env python
"""The cost of `torch-neuronx audit`: an audited run against the plain run.

    python benchmarks/bench_audit.py            # prints the table
    python benchmarks/bench_audit.py --write    # ... and rewrites its section of benchmarks/RESULTS.md
    python benchmarks/bench_audit.py --quick    # a few seconds, for smoke tests

Two measurements:
1. Recording overhead, in one process: the same training step on the neuron
   device with recording off and on (torch_neuronx.audit.recorder.Recording,
   what every audited process runs, a step marked per iteration), rounds
   interleaved, ratio per round, median and spread reported. Target: <= 1.3.
2. The whole command: `torch-neuronx audit -- examples/porting_audit.py`
   against `python examples/porting_audit.py`, wall time of each (process
   start, the run, writing the record, building the report). Informational:
   it is dominated by start-up and the report's analysis, not by the steps.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch_neuronx
from torch_neuronx.audit import recorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import publish  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGET = 1.3


def mlp_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(64, 512, device="neuron")
    y = torch.randint(0, 10, (64,), device="neuron")

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def transformer_step():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True).to("neuron")
    opt = torch.optim.AdamW(layer.parameters(), foreach=True)
    x = torch.randn(8, 64, 256, device="neuron")

    def step():
        layer(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return step


def small_ops_step():
    """The worst case for per-call recording: 200 tiny element-wise ops per step."""
    a = torch.randn(16, device="neuron")

    def step():
        b = a
        for _ in range(100):
            b = b * 1.0001 + 0.0001
        return b
    return step


CASES = {"mlp training step (3x Linear 512, batch 64, AdamW)": mlp_step,
         "transformer training step (EncoderLayer d=256, batch 8, seq 64, AdamW)": transformer_step,
         "200 tiny element-wise ops (16 floats)": small_ops_step}


def _time(step, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    return (time.perf_counter() - start) / iterations


def measure(build, rounds: int, iterations: int) -> dict:
    step = build()
    for _ in range(3):
        step()  # warm up (first calls, allocator)
    ratios, plain_times, recorded_times = [], [], []
    for index in range(rounds):
        order = (False, True) if index % 2 == 0 else (True, False)
        times = {}
        for recorded in order:
            if recorded:
                rec = recorder.Recording()
                rec.start()
                try:
                    times[True] = _time(lambda: (step(), rec.mark_step()), iterations)
                finally:
                    rec.stop()
            else:
                times[False] = _time(step, iterations)
        plain_times.append(times[False])
        recorded_times.append(times[True])
        ratios.append(times[True] / times[False])
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"plain_s": statistics.median(plain_times), "recorded_s": statistics.median(recorded_times),
            "ratio": statistics.median(ratios), "p25": quartiles[0], "p75": quartiles[2]}


def whole_command(repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_FALLBACK"] = "silent"
    example = str(ROOT / "examples" / "porting_audit.py")
    commands = {"plain": [sys.executable, example],
                "audit": [sys.executable, "-m", "torch_neuronx", "audit", "--quiet", "--", example]}
    times = {name: [] for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            start = time.perf_counter()
            subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True)
            times[name].append(time.perf_counter() - start)
    plain, audit = statistics.median(times["plain"]), statistics.median(times["audit"])
    return {"plain_s": plain, "audit_s": audit, "ratio": audit / plain}


def report(results: dict, command: dict | None, args) -> str:
    load = os.getloadavg()[0]
    lines = [
        "## Audit overhead (`benchmarks/bench_audit.py`)",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Command: `python benchmarks/bench_audit.py{' --write' if args.write else ''}`",
        f"- Machine: {os.cpu_count()} logical cores, load average {load:.2f} at the end; torch threads "
        f"{torch.get_num_threads()}",
        f"- Software: torch {torch.__version__}, torch_neuronx {torch_neuronx.__version__}, Python "
        f"{platform.python_version()}",
        "",
        "Method: the same step on the neuron device with the audit's recording off and on (a "
        "`Recording` started, one step marked per iteration), in one process, rounds interleaved "
        f"({args.rounds} rounds of {args.iterations} iterations, order alternating); ratio = recorded / "
        "plain per round, median and 25th-75th percentile. Target: an audited run costs at most "
        f"{TARGET}x the plain run.",
        "",
        "| case | plain | recorded | ratio | spread p25-p75 | target | result |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        verdict = "PASS" if r["ratio"] <= TARGET else "FAIL"
        lines.append(f"| {name} | {r['plain_s'] * 1e3:.3f} ms | {r['recorded_s'] * 1e3:.3f} ms | "
                     f"{r['ratio']:.3f} | {r['p25']:.3f}-{r['p75']:.3f} | <= {TARGET} | {verdict} |")
    if command:
        lines += ["", "The whole command (informational: process start-up, writing the record and "
                  "building the report included): `torch-neuronx audit -- examples/porting_audit.py` "
                  f"{command['audit_s']:.2f} s against `python examples/porting_audit.py` "
                  f"{command['plain_s']:.2f} s: {command['ratio']:.2f}x (median of {args.repeats} runs each)."]
    lines += ["", "Recording off costs one relaxed atomic load per device call (csrc/Recorder.h); "
              "the eager section above measures the eager path with it in place."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite this section of benchmarks/RESULTS.md")
    parser.add_argument("--quick", action="store_true", help="a few rounds only (smoke test)")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.rounds, args.iterations, args.repeats = (2, 3, 1) if args.quick else (10, 20, 3)
    results = {name: measure(build, args.rounds, args.iterations) for name, build in CASES.items()}
    command = None if args.quick else whole_command(args.repeats)
    publish("audit", report(results, command, args), write=args.write, json_path=args.json,
            payload={"cases": results, "command": command})


if __name__ == "__main__":
    main()
