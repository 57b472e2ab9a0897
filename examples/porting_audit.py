"""A small training script with the problems a port to Trainium runs into, for
`torch-neuronx audit` to find (docs/tools.md walks through its report):

    torch-neuronx audit -- examples/porting_audit.py

Each problem is on a line of its own, named in a comment:
- an op the device does not implement (CPU fallback),
- a sequence length that changes every step (shape churn: new kernels every step),
- float64 arithmetic (computed as float32 on Trainium),
- .item() in the loop (a host sync every step),
- a data-dependent branch in a compiled function (a graph break).
"""

import torch
from torch import nn

STEPS = 6

torch.manual_seed(0)
device = "neuron"
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
weight = torch.tensor(0.5, dtype=torch.float64, device=device)


@torch.compile(backend="neuron")
def head(h):
    h = torch.tanh(h)
    if h.sum() > 0:  # GRAPH BREAK: a branch on a tensor's value
        h = h * 2
    return h


total = 0.0
for step in range(STEPS):
    length = 16 + step  # a new sequence length every step
    x = torch.randn(length, 32, device=device)  # SHAPE CHURN: new shapes every step
    y = model(x)
    y = y * torch.special.i0e(y)  # CPU FALLBACK: special_i0e is not a native op
    z = head(y.mean(0))
    loss = (z.double() * weight).float().pow(2).mean()  # FLOAT64
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total += loss.item()  # HOST SYNC: .item() every step

print(f"mean loss {total / STEPS:.4f}")
