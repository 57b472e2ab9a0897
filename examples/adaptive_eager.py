"""Adaptive Eager Execution (TorchNeuron's "concatenation") on the neuron device.

    python examples/adaptive_eager.py [--iterations 200]

The same as running any script with TORCH_NEURONX_ENABLE_CONCATENATION=1; here it is switched at
run time with torch_neuronx.ops.set_concatenation. A LayerNorm+GELU MLP forward at batch 1: the
queue holds the layer norm and GELU, and each one-row linear ends a launch (TorchNeuron's
MatMulToMatMul rule) that the device thread computes while Python goes on to the next module. The
script prints each launch as get_executed_ops() names it (the ops joined with "|"), shows that a
host read (.item()) between the layers cuts the sequence, checks the output against CPU, and times
the forward with the queue off and on. docs/eager-and-fallback.md, "Adaptive Eager Execution".
"""

from __future__ import annotations

import argparse
import time

import torch

import torch_neuronx


def mlp(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.LayerNorm(1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 256)).to(device).eval()


def launches(run) -> dict[str, int]:
    """The concatenated launches (names with a "|") of one call of `run`."""
    torch.neuron.synchronize()
    torch_neuronx.clear_op_tracking()
    run()
    torch.neuron.synchronize()
    return {name: n for name, n in torch_neuronx.get_executed_ops().items() if "|" in name}


def per_call_us(run, iterations: int) -> float:
    best = float("inf")
    for _ in range(5):
        torch.neuron.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            run()
        torch.neuron.synchronize()
        best = min(best, (time.perf_counter() - start) / iterations)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()

    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1))
    model, reference = mlp("neuron"), mlp("cpu")
    xd = x.to("neuron")

    def forward():
        with torch.no_grad():
            return model(xd)

    def forward_with_a_host_read():
        with torch.no_grad():
            h = model[1](model[0](xd))
            h.sum().item()  # a host read: runs what is queued, ending the sequence here
            return model[3](model[2](h))

    torch_neuronx.ops.set_concatenation(True)
    for name, count in launches(forward).items():
        print(f"launch: {name} x{count}")
    for name, count in launches(forward_with_a_host_read).items():
        print(f"launch with a host read between the layers: {name} x{count}")
    with torch.no_grad():
        difference = (forward().cpu() - reference(x)).abs().max().item()
    print(f"max |neuron - cpu| = {difference:.3g}")

    torch_neuronx.ops.set_concatenation(False)
    off = per_call_us(forward, args.iterations)
    torch_neuronx.ops.set_concatenation(True)
    on = per_call_us(forward, args.iterations)
    print(f"forward at batch 1: queue off {off:.1f} us, queue on {on:.1f} us (on / off {on / off:.2f})")


if __name__ == "__main__":
    main()
