"""Profile a few training steps on the neuron device as you would on CUDA
(docs/profiling.md):

    python examples/profile_training.py [OUTPUT_DIR]

- torch.profiler with ProfilerActivity.PrivateUse1: a wait/warmup/active
  schedule, the NEURON time columns of key_averages(), a Chrome trace per
  active cycle (open it in https://ui.perfetto.dev);
- the allocator's memory history in CUDA's snapshot format, for PyTorch's
  visualizer: python -m torch.cuda._memory_viz trace_plot OUTPUT_DIR/memory.pickle -o memory.html
"""

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

output = Path(sys.argv[1] if len(sys.argv) > 1 else "profile_output")
output.mkdir(parents=True, exist_ok=True)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).to("neuron")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 256, device="neuron"), torch.randint(0, 10, (32,), device="neuron")


def train_step():
    with record_function("train_step"):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return loss


def save_trace(prof):
    prof.export_chrome_trace(str(output / f"trace_{prof.step_num}.json"))


torch.neuron.memory._record_memory_history(max_entries=10000)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
             schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=save_trace) as prof:
    for _ in range(4):
        train_step()
        prof.step()
torch.neuron.memory._dump_snapshot(str(output / "memory.pickle"))
torch.neuron.memory._record_memory_history(enabled=None)

print(prof.key_averages().table(sort_by="device_time_total", row_limit=8))
print("traces:", ", ".join(sorted(p.name for p in output.glob("trace_*.json"))))
print(f"memory history: python -m torch.cuda._memory_viz trace_plot {output / 'memory.pickle'} -o memory.html")
