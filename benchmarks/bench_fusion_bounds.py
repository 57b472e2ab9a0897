"""Lower bounds for fusing eager ops on `neuron` (issue #28, Adaptive Eager Execution).

    python benchmarks/bench_fusion_bounds.py

Prints, for 1,024 float32 elements on one thread: a chain of 20 elementwise ops on CPU and on
`neuron` (today: one kernel per op), the cost of one op's dispatch and output allocation
(`torch.empty_like`, what queueing an op costs at least), and one call of the same 20 ops jitted as
one JAX program from Python (what a flush through a Python-level XLA call costs at least). Then
what compiling the queue into one XLA executable would cost (docs/eager-and-fallback.md gives why
the queue runs loops instead): the 20 ops as one executable called on `neuron` tensors through the
backend's own conversions (torch_neuronx/lowering/conversions.py), returning every op's result (a
queue must: the program holds each one) or only the last, against the queued eager chain (Python
calls included, the queue run to the end). Times are the median of 7 rounds, per call, in
microseconds. Informational: no target, nothing written.
"""

from __future__ import annotations

import statistics
import time

import torch

import torch_neuronx


def per_call_us(fn, n=1000, rounds=7) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        times.append((time.perf_counter_ns() - start) / n / 1000)
    return statistics.median(times)


def chain(a, b):
    x = a
    for i in range(20):
        x = x * 1.0001 if i % 2 else x + b
    return x


def main() -> None:
    torch.set_num_threads(1)
    for device in ("cpu", "neuron"):
        a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
        print(f"{device:6}  20-op chain {per_call_us(lambda: chain(a, b), 300):7.2f} us   "
              f"one add {per_call_us(lambda: a + b):5.2f} us   empty_like {per_call_us(lambda: torch.empty_like(a)):5.2f} us")
    import jax
    import jax.numpy as jnp

    fused = jax.jit(chain)
    xa, ya = jnp.ones(1024, jnp.float32), jnp.ones(1024, jnp.float32)
    fused(xa, ya).block_until_ready()
    print(f"jax     20 ops jitted as one program, one call from Python {per_call_us(lambda: fused(xa, ya).block_until_ready(), 300):7.2f} us")
    compiled_queue()


def every_result(a, b):
    results, x = [], a
    for i in range(20):
        x = x * 1.0001 if i % 2 else x + b
        results.append(x)
    return results


def compiled_queue() -> None:
    import jax

    from torch_neuronx.lowering.conversions import from_jax_all, jax_inputs

    device = torch.device("neuron")
    a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
    for label, fn in (("every result", every_result), ("the last result", chain)):
        executable = jax.jit(fn).lower(*jax_inputs([a, b])).compile()

        def launch(executable=executable):
            outputs = executable(*jax_inputs([a, b]))
            outputs = outputs if isinstance(outputs, list) else [outputs]
            return from_jax_all(outputs, device, [torch.float32] * len(outputs))
        # The executable computes the chain (eager, queue off, is the reference).
        torch.testing.assert_close(launch()[-1].cpu(), chain(a, b).cpu(), rtol=1e-5, atol=1e-5)
        print(f"neuron  20 ops as one XLA executable returning {label:15} {per_call_us(launch, 300):7.2f} us")
    was = torch_neuronx._C._concatenation_enabled()
    torch_neuronx.ops.set_concatenation(True)
    try:
        def queued():
            chain(a, b)
            torch.neuron.synchronize()
        print(f"neuron  20 ops queued (concatenation on), Python calls included {per_call_us(queued, 300):7.2f} us")
    finally:
        torch_neuronx.ops.set_concatenation(was)


if __name__ == "__main__":
    main()
