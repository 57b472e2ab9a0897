"""Lower bounds for fusing eager ops on `neuron` (issue #28, Adaptive Eager Execution).

    python benchmarks/bench_fusion_bounds.py

Prints, for 1,024 float32 elements on one thread: a chain of 20 elementwise ops on CPU and on
`neuron` (today: one kernel per op), the cost of one op's dispatch and output allocation
(`torch.empty_like`, what queueing an op costs at least), and one call of the same 20 ops jitted as
one JAX program from Python (what a flush through a Python-level XLA call costs at least). Times
are the median of 7 rounds, per call, in microseconds. Informational: no target, nothing written.
"""

from __future__ import annotations

import statistics
import time

import torch

import torch_neuronx  # noqa: F401 - registers the device


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


if __name__ == "__main__":
    main()
