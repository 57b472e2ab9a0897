"""Where a compiled training step's time goes (issue #28 item 6).

    python benchmarks/profile_compile.py [--quick] [--json PATH]

For bench_compile.py's MLP and transformer-block training steps (same models,
AdamW foreach, torch at 1 thread), in one process:

1. eager step, compiled step and the optimizer step alone (the same eager
   foreach AdamW in both modes), rounds interleaved;
2. per compiled graph: its whole call (Python, DLPack in and out, XLA), XLA's
   time inside the step (the executable is waited for where it is called,
   which the backend otherwise does when taking the outputs) and the same
   executable timed alone on the same inputs (warm caches);
3. per dot of each graph (read from its StableHLO): the dot alone through
   XLA:CPU as the graph's compile options build it, less the dispatch of an
   empty executable, against the same contraction through torch.matmul on the
   CPU (the kernel eager runs) at torch's thread count.

Printed as a table; --json writes the raw numbers. Nothing is asserted about
speed (machines are noisy); docs/compile.md cites the findings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_compile import MODELS, interleaved  # noqa: E402

_DOT = re.compile(
    r"stablehlo\.dot_general %[\w#.]+, %[\w#.]+, (?:batching_dims = \[([\d, ]*)\] x \[([\d, ]*)\], )?"
    r"contracting_dims = \[([\d, ]*)\] x \[([\d, ]*)\].*?: \(tensor<([\dx]+)x(f32|bf16|f16)>, "
    r"tensor<([\dx]+)x(?:f32|bf16|f16)>\)")


def _ints(text: str | None) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",")) if text else ()


def dots_of(stablehlo: str) -> list[dict]:
    """The dot_generals of a StableHLO module: operand shapes, dimension numbers, dtype."""
    found = []
    for m in _DOT.finditer(stablehlo):
        lb, rb, lc, rc, lshape, dtype, rshape = m.groups()
        found.append({"lhs": _ints(lshape.replace("x", ",")), "rhs": _ints(rshape.replace("x", ",")),
                      "contract": (_ints(lc), _ints(rc)), "batch": (_ints(lb), _ints(rb)), "dtype": dtype})
    return found


def _best(fn, n: int, reps: int) -> float:
    """Fastest mean over `reps` blocks of `n` calls, seconds (the least disturbed block)."""
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def _torch_contraction(dot: dict):
    """The dot as eager computes it: operands arranged (batch, free, contracted) and
    (batch, contracted, free), then one torch.matmul (MKL/oneDNN on the CPU)."""
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dot["dtype"]]
    g = torch.Generator().manual_seed(0)
    lhs, rhs = (torch.randn(dot[k], generator=g).to(dtype) for k in ("lhs", "rhs"))
    (lb, rb), (lc, rc) = dot["batch"], dot["contract"]
    lf = [d for d in range(lhs.dim()) if d not in lb + lc]
    rf = [d for d in range(rhs.dim()) if d not in rb + rc]
    a = lhs.permute(*lb, *lf, *lc)
    b = rhs.permute(*rb, *rc, *rf)
    bsz = [lhs.shape[d] for d in lb]
    a = a.reshape(*bsz, math.prod(lhs.shape[d] for d in lf), math.prod(lhs.shape[d] for d in lc))
    b = b.reshape(*bsz, math.prod(rhs.shape[d] for d in rc), math.prod(rhs.shape[d] for d in rf))
    return lambda: torch.matmul(a, b)


def dot_times(dot: dict, n: int, reps: int, dispatch_s: float) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}[dot["dtype"]]
    rng = np.random.default_rng(0)
    lhs, rhs = (jnp.asarray(rng.standard_normal(dot[k], dtype=np.float32)).astype(dtype) for k in ("lhs", "rhs"))
    dims = (dot["contract"], dot["batch"])
    run = jax.jit(lambda a, b: lax.dot_general(a, b, dims)).lower(lhs, rhs).compile()
    xla = max(_best(lambda: run(lhs, rhs).block_until_ready(), n, reps) - dispatch_s, 0.0)
    return {"lhs": list(dot["lhs"]), "rhs": list(dot["rhs"]), "batch": [list(d) for d in dot["batch"]],
            "contract": [list(d) for d in dot["contract"]], "dtype": dot["dtype"],
            "xla_s": xla, "torch_s": _best(_torch_contraction(dot), n, reps)}


class GraphTimer:
    """Times each compiled graph's calls, and the XLA executable inside them."""

    def __init__(self):
        from torch_neuronx.compiler import executable

        self.module = executable
        self.calls: dict[str, list[float]] = {}
        self.xla: dict[str, list[float]] = {}
        self.captured: dict[str, tuple] = {}   # name -> (graph, executable, seed, arrays, other _lower arguments)
        self.on = False
        self._call = executable.CompiledGraph.__call__
        self._executable = executable.CompiledGraph._executable

    def __enter__(self):
        timer = self

        def call(graph, args):
            start = time.perf_counter()
            result = timer._call(graph, args)
            if timer.on:
                timer.calls.setdefault(graph.name, []).append(time.perf_counter() - start)
            return result

        def executable_of(graph, seed, arrays, *rest):
            import jax

            compiled = timer._executable(graph, seed, arrays, *rest)
            timer.captured[graph.name] = (graph, compiled, seed, list(arrays), rest)

            def timed(*a):
                start = time.perf_counter()
                out = jax.block_until_ready(compiled(*a))
                if timer.on:
                    timer.xla.setdefault(graph.name, []).append(time.perf_counter() - start)
                return out
            return timed

        self.module.CompiledGraph.__call__ = call
        self.module.CompiledGraph._executable = executable_of
        return self

    def __exit__(self, *exc):
        self.module.CompiledGraph.__call__ = self._call
        self.module.CompiledGraph._executable = self._executable


def profile_case(make, batch, label: str, quick: bool) -> dict:
    import jax
    import jax.numpy as jnp

    rounds, block = (3, 0.2) if quick else (9, 1.0)
    n, reps = (10, 3) if quick else (30, 9)
    eager_model, compiled_model = make().to("neuron"), make().to("neuron")
    x, y = batch("neuron")
    opts = {m: torch.optim.AdamW(p.parameters(), lr=1e-3, foreach=True)
            for m, p in (("eager", eager_model), ("compiled", compiled_model))}
    with GraphTimer() as timer:
        compiled = torch.compile(compiled_model, backend="neuron")

        def step(model, opt):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        # The optimizer alone: a third model whose gradients stay set.
        held = make().to("neuron")
        F.mse_loss(held(x), y).backward()
        held_opt = torch.optim.AdamW(held.parameters(), lr=1e-3, foreach=True)

        def optimizer_only():
            held_opt.step()

        times = interleaved({"eager": lambda: step(eager_model, opts["eager"]),
                             "compiled": lambda: step(compiled, opts["compiled"]),
                             "optimizer": optimizer_only}, rounds, block)
        timer.on = True
        steps = 20 if quick else 100
        for _ in range(steps):
            step(compiled, opts["compiled"])
        timer.on = False

    empty = jax.jit(lambda v: v).lower(jnp.zeros(())).compile()
    zero = jnp.zeros(())
    dispatch_s = _best(lambda: empty(zero).block_until_ready(), n, reps)
    graphs = []
    for name, (graph, executable, seed, arrays, rest) in timer.captured.items():
        alone = _best(lambda: jax.block_until_ready(executable(seed, *arrays)), n, reps)
        stablehlo = graph._lower(seed, arrays, *rest)[0].as_text()
        dots = [dot_times(d, n, reps, dispatch_s) for d in dots_of(stablehlo)]
        graphs.append({
            "graph": name,
            "call_s": statistics.median(timer.calls[name]),
            "xla_in_step_s": statistics.median(timer.xla[name]),
            "xla_alone_s": alone,
            "dots": dots,
            "dots_xla_s": sum(d["xla_s"] for d in dots),
            "dots_torch_s": sum(d["torch_s"] for d in dots),
        })
    # What the compiled step spends outside its graphs' calls and the optimizer: Dynamo's guards,
    # AOTAutograd's wrappers, the loss and its backward, the autograd engine, zero_grad.
    outside = times["compiled"] - times["optimizer"] - sum(g["call_s"] for g in graphs)
    return {"case": label, **{f"{k}_step_s" if k != "optimizer" else "optimizer_s": v for k, v in times.items()},
            "speedup": times["eager"] / times["compiled"], "outside_graphs_s": outside, "dispatch_s": dispatch_s,
            "torch_threads": torch.get_num_threads(), "graphs": graphs}


def render(results: list[dict]) -> str:
    us = lambda s: f"{s * 1e6:.0f} us"  # noqa: E731
    lines = []
    for r in results:
        lines.append(f"{r['case']}: eager {us(r['eager_step_s'])}, compiled {us(r['compiled_step_s'])} "
                     f"({r['speedup']:.2f}x), optimizer alone {us(r['optimizer_s'])}, compiled step outside its "
                     f"graphs and the optimizer {us(r['outside_graphs_s'])}, "
                     f"empty-executable dispatch {us(r['dispatch_s'])}, torch threads {r['torch_threads']}")
        for g in r["graphs"]:
            lines.append(f"  {g['graph']}: call {us(g['call_s'])}, XLA in step {us(g['xla_in_step_s'])}, "
                         f"XLA alone {us(g['xla_alone_s'])}; {len(g['dots'])} dots: XLA {us(g['dots_xla_s'])} "
                         f"vs torch.matmul {us(g['dots_torch_s'])}")
            for d in g["dots"]:
                lines.append(f"    {d['dtype']} {d['lhs']} x {d['rhs']} batch {d['batch']} contract "
                             f"{d['contract']}: XLA {us(d['xla_s'])}, torch {us(d['torch_s'])}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few rounds")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args(argv)
    import torch_neuronx  # noqa: F401

    torch.set_num_threads(1)   # as bench_compile.py
    namespace: dict = {}
    exec(MODELS, namespace)
    results = [profile_case(namespace["mlp"], namespace["mlp_batch"], "MLP training step", args.quick),
               profile_case(namespace["block"], namespace["block_batch"], "Transformer block training step",
                            args.quick)]
    print(render(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
