"""The demo in examples/ runs end to end in a fresh process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def test_demo_trains_and_reports():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_")}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout

    losses = [(int(step), float(loss)) for step, loss in
              re.findall(r"^step\s+(\d+)\s+loss\s+([0-9.]+)$", out, flags=re.MULTILINE)]
    assert len(losses) >= 5, out
    steps = [step for step, _ in losses]
    assert steps == sorted(steps) and steps[0] == 0
    first, last = losses[0][1], losses[-1][1]
    assert last < 0.8 * first, f"loss did not decrease enough: {first} -> {last}\n{out}"
    assert "loss decreased" in out

    # The reports: fallback ops, top executed ops, memory line, compile status.
    assert re.search(r"^fallback ops \(ran on CPU copies\): (none|\d+)$", out, flags=re.MULTILINE), out
    executed = re.search(r"^executed ops: (\d+) distinct, (\d+) calls", out, flags=re.MULTILINE)
    assert executed and int(executed.group(1)) > 0
    assert re.search(r"^  aten::linear: \d+$", out, flags=re.MULTILINE), out  # one kernel, as on TorchNeuron
    memory = re.search(r"^memory: allocated ([0-9.]+) MiB / peak ([0-9.]+) MiB / reserved ([0-9.]+) MiB$",
                       out, flags=re.MULTILINE)
    assert memory, out
    allocated, peak, reserved = map(float, memory.groups())
    assert 0 < peak <= reserved and allocated <= peak
    assert re.search(r"^compile backend 'neuron': available; max \|compiled - eager\| = ([0-9.e+-]+)$", out,
                     flags=re.MULTILINE), out
    difference = float(re.search(r"max \|compiled - eager\| = ([0-9.e+-]+)$", out, flags=re.MULTILINE).group(1))
    assert difference < 1e-4
    report = re.search(r"^compile report: graphs (\d+) forward / (\d+) backward / (\d+) inference;", out,
                       flags=re.MULTILINE)
    assert report and [int(g) for g in report.groups()] == [1, 1, 1], out
    gap = re.search(r"^compiled training: 5 steps in [0-9.]+ s .*loss eager\| = ([0-9.e+-]+)$", out,
                    flags=re.MULTILINE)
    assert gap and float(gap.group(1)) < 1e-4, out  # compiled training follows eager training
    assert elapsed < 60, f"demo took {elapsed:.1f} s"


def test_profiling_example_writes_a_device_trace_and_a_memory_history(tmp_path):
    import json
    import pickle

    example = DEMO.parent / "profile_training.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_")}
    proc = subprocess.run([sys.executable, str(example), str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Self NEURON" in proc.stdout and "train_step" in proc.stdout, proc.stdout[:700]
    # schedule(wait=1, warmup=1, active=2) over 4 steps: one trace, of the 2 active steps
    traces = sorted(tmp_path.glob("trace_*.json"))
    assert [t.name for t in traces] == ["trace_4.json"]
    events = json.loads(traces[0].read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    names = {e["name"] for e in kernels}
    assert {"aten::linear.default", "aten::linear_backward.default"} <= names, sorted(names)
    assert sum(e.get("cat") == "user_annotation" and e["name"] == "train_step" for e in events) == 2
    snapshot = pickle.loads((tmp_path / "memory.pickle").read_bytes())
    trace = [entry for device in snapshot["device_traces"] for entry in device]
    allocs = [entry for entry in trace if entry["action"] == "alloc"]
    assert allocs and any(frame["filename"].endswith("profile_training.py")
                          for entry in allocs for frame in entry["frames"])
    assert snapshot["segments"]


def test_adaptive_eager_example_shows_the_launches_and_matches_cpu():
    example = DEMO.parent / "adaptive_eager.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_")}
    proc = subprocess.run([sys.executable, str(example), "--iterations", "20"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    # the layer norm, GELU and second linear are one launch; a host read after the layer norm cuts it
    assert "launch: aten::native_layer_norm|aten::gelu|aten::linear x1" in out, out
    assert "launch with a host read between the layers: aten::gelu|aten::linear x1" in out, out
    difference = float(re.search(r"^max \|neuron - cpu\| = ([0-9.e+-]+)$", out, flags=re.MULTILINE).group(1))
    assert difference < 1e-5
    timing = re.search(r"^forward at batch 1: queue off ([0-9.]+) us, queue on ([0-9.]+) us", out, flags=re.MULTILINE)
    assert timing and float(timing.group(1)) > 0 and float(timing.group(2)) > 0, out
