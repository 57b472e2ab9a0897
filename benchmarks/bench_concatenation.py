#!/usr/bin/env python
"""Adaptive Eager Execution (TORCH_NEURONX_ENABLE_CONCATENATION) against native CPU eager (issue #28).

    python benchmarks/bench_concatenation.py            # full run, prints the table
    python benchmarks/bench_concatenation.py --quick    # a few seconds, for smoke tests
    python benchmarks/bench_concatenation.py --json out.json
    python benchmarks/bench_concatenation.py --write    # ... and rewrites its section of benchmarks/RESULTS.md

Each case runs the same statement on CPU tensors and on `neuron` tensors with the queue off, on
with every launch on the calling thread ("sync"), and on with full queues handed to the device thread
(asynchronous execution, the default: "on"), interleaved: a round times one block of iterations on
each of the four (the order rotates between rounds) and takes the ratios per round; the table gives the median over rounds and the spread (25th to
75th percentile of the per-round ratios). A neuron block ends with torch.neuron.synchronize(), so queued
work is inside the time. Before timing, every case checks that the four give the same result
(float32 tolerance). With the queue on, the table also gives the launches and queued ops per
iteration, and the distinct op sequences launched (what a compiled queue would compile: the rest are
cache hits). One thread, as torchrun sets.

The cases are issue #28's item 5: a chain of 20 elementwise ops on 1,024 float32, an optimizer step
with foreach=False over 100 small parameters (SGD with momentum, and AdamW), a LayerNorm+GELU MLP
forward at batch 1, and bench_eager.py's two training steps (MLP, transformer), which must not get
slower with the queue on; and a small ReLU MLP's training step with SGD(foreach=False), where the
queue takes the activations, their gradients, the zeroing of the gradients and the optimizer's arithmetic; and an AdamW step over
100 parameters of 8,192 floats, where the queue's arithmetic is a large share of the time and the device
thread overlaps it with the caller's Python; and two activations written out as models write them
(GPT-2's tanh GELU, Llama's silu(gate) * up), which queue whole with exp/tanh/sigmoid/silu and pow;
and a small Hugging Face Llama's decoding step at batch 1.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import torch_neuronx
from torch_neuronx import _C

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_eager  # noqa: E402  (the training-step cases)
from results_file import publish  # noqa: E402

# CPU eager; neuron without the queue; with it, every launch on the calling thread; with it and the
# device thread (the default)
MODES = ("cpu", "off", "sync", "on")


def _set_mode(mode: str) -> None:
    torch_neuronx.ops.set_concatenation(mode in ("sync", "on"))
    _C._concatenation_async(mode != "sync")


@dataclass
class Case:
    name: str
    label: str
    make: Callable[[str], tuple[Callable[[], object], Callable[[], object]]]  # device -> (step, check)


def _chain(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1024, generator=g).to(device, dtype), torch.randn(1024, generator=g).to(device, dtype))

    def step():
        x = a
        for i in range(20):
            x = x * 1.0001 if i % 2 else x + b
        return x
    return step, step


def _gelu_tanh_written_out(device):
    """GPT-2's activation as Hugging Face writes it (NewGELUActivation): pow, tanh and six arithmetic
    ops, all queued since exp/tanh/sigmoid/silu and pow by formula joined the queue."""
    x = (torch.randn(1024, generator=torch.Generator().manual_seed(0)) * 3).to(device)

    def step():
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    return step, step


def _silu_gate(device):
    """Llama's MLP activation, silu(gate) * up, on 1,024 float32 each."""
    g = torch.Generator().manual_seed(0)
    gate, up = torch.randn(1024, generator=g).to(device), torch.randn(1024, generator=g).to(device)

    def step():
        return torch.nn.functional.silu(gate) * up
    return step, step


def _sigmoid_8k(device):
    """One sigmoid over 8,192 float32: where the device's exp loop (about 0.4 ns per element) costs
    more than the dispatch the queue saves."""
    x = torch.randn(8192, generator=torch.Generator().manual_seed(0)).to(device)

    def step():
        return torch.sigmoid(x)
    return step, step


def _optimizer(kind, size=64, foreach=False):
    def make(device):
        g = torch.Generator().manual_seed(0)
        params = [torch.randn(size, generator=g).to(device).requires_grad_() for _ in range(100)]
        for p in params:
            p.grad = torch.randn(size, generator=g).to(device)
        opt = (torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=foreach) if kind == "sgd"
               else torch.optim.AdamW(params, lr=1e-3, foreach=foreach))
        return opt.step, lambda: params[0].detach()
    return make


def _mlp_forward(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.LayerNorm(1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 256)).to(device)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1)).to(device)

    def step():
        with torch.no_grad():
            return model(x)
    return step, step


def _llama_decode(device):
    """One decoding step of a small Hugging Face Llama (random weights from a config) at batch 1,
    over a 16-token KV cache kept at that length: its RMSNorms, one-row projections, SiLU gate,
    residual adds, rotary embeddings (neg of a slice, cat) and the cache's cat queue; attention
    runs unqueued and cuts the sequences."""
    import transformers  # the HF stack: a dependency of the project

    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval().to(device)
    ids = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    token = ids[:, -1:]

    def step():
        with torch.no_grad():
            logits = model(token, past_key_values=cache, use_cache=True).logits
        cache.crop(-1)  # back to 16 tokens: every step is the same
        return logits
    return step, step


def _small_relu_step(device):
    """A small ReLU MLP's training step with SGD(foreach=False): dispatch-bound on the CPU; the queue
    takes the ReLU, its gradient (threshold_backward), zero_grad's zero_ and the optimizer's arithmetic."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 64)).to(device)
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(8, 64, generator=g).to(device), torch.randn(8, 64, generator=g).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=False)

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(model(x), target).backward()
        opt.step()
    return step, lambda: model[0].weight.detach()


def _training(make):
    def build(device):
        setup = make(device)
        return setup.namespace["step"], setup.check
    return build


CASES = [
    Case("chain20", "20 elementwise ops (x + b, x * 1.0001), 1,024 float32", _chain),
    Case("chain20_bf16", "the same 20 ops on 1,024 bfloat16", lambda device: _chain(device, torch.bfloat16)),
    Case("sgd_step", "SGD step, momentum, foreach=False, 100 x 64 float32 parameters", _optimizer("sgd")),
    Case("adamw_step", "AdamW step, foreach=False, 100 x 64 float32 parameters", _optimizer("adamw")),
    Case("adamw_step_8k", "AdamW step, foreach=False, 100 x 8,192 float32 parameters", _optimizer("adamw", 8192)),
    Case("adamw_foreach", "AdamW step, foreach=True (torch.optim's default on the device), 100 x 64 float32 "
         "parameters", _optimizer("adamw", foreach=True)),
    Case("sgd_foreach", "SGD step, momentum, foreach=True, 100 x 64 float32 parameters",
         _optimizer("sgd", foreach=True)),
    Case("mlp_fwd_b1", "LayerNorm+GELU MLP forward, batch 1 (Linear 256-1024-256)", _mlp_forward),
    Case("gelu_tanh", "GPT-2's GELU written out (pow, tanh, 6 arithmetic ops), 1,024 float32", _gelu_tanh_written_out),
    Case("silu_gate", "silu(gate) * up, 1,024 float32", _silu_gate),
    Case("sigmoid_8k", "sigmoid, 8,192 float32", _sigmoid_8k),
    Case("llama_decode", "Llama decoding step, batch 1 (hidden 256, 4 layers, 16-token cache)", _llama_decode),
    Case("relu_mlp_step", "ReLU MLP 64-128-128-64 training step, batch 8, SGD foreach=False", _small_relu_step),
    Case("mlp_step", "MLP training step (bench_eager.py)", _training(bench_eager.make_mlp)),
    Case("transformer_step", "Transformer training step (bench_eager.py)", _training(bench_eager.make_transformer)),
]


def _time(step, iterations: int, mode: str) -> float:
    """Seconds per iteration of one block in `mode`."""
    if mode != "cpu":
        _set_mode(mode)
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    if mode != "cpu":
        torch.neuron.synchronize()
    return (time.perf_counter() - start) / iterations


def _check(case: Case, steps: dict) -> None:
    """The four modes agree (each mode's step builds its own state, from the same seeds)."""
    results = {}
    for mode in MODES:
        step, check = steps[mode]
        if mode != "cpu":
            _set_mode(mode)
        step()
        results[mode] = check().detach().cpu()
    _set_mode("off")
    for mode in ("off", "sync", "on"):
        torch.testing.assert_close(results[mode], results["cpu"], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, mode=mode: f"{case.name}: {mode} differs from CPU: {m}")


def run_case(case: Case, rounds: int, block_s: float) -> dict:
    case_start = _C._concatenation_stats()
    steps = {mode: case.make("cpu" if mode == "cpu" else "neuron") for mode in MODES}
    _check(case, steps)
    # Iterations per block: about block_s of CPU time.
    probe = _time(steps["cpu"][0], 3, "cpu")
    iterations = max(3, int(block_s / max(probe, 1e-7)))
    for mode in MODES:  # warm-up
        _time(steps[mode][0], iterations, mode)
    times = {mode: [] for mode in MODES}
    on_launches = on_ops = on_iterations = 0
    for r in range(rounds):
        order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
        for mode in order:
            before = _C._concatenation_stats()
            times[mode].append(_time(steps[mode][0], iterations, mode))
            if mode == "on":  # per iteration with the default queue (sync blocks launch the same ops)
                launches, ops = (a - b for a, b in zip(_C._concatenation_stats()[:2], before[:2]))
                on_launches, on_ops, on_iterations = on_launches + launches, on_ops + ops, on_iterations + iterations
    _set_mode("off")
    launches, ops = on_launches, on_ops
    # Over the whole case (check, warm-up, rounds): the op sequences first launched in it (what
    # TorchNeuron would compile: each compiles once) and the share of launches that reuse one.
    case_launches, _, new_sequences, _ = (a - b for a, b in zip(_C._concatenation_stats(), case_start))
    hit_rate = 1 - new_sequences / case_launches if case_launches else None

    def ratio(mode, base):
        values = sorted(t / c for t, c in zip(times[mode], times[base]))
        return statistics.median(values), values[len(values) // 4], values[(3 * len(values)) // 4]

    return {"case": case, "cpu_us": statistics.median(times["cpu"]) * 1e6, "off": ratio("off", "cpu"),
            "sync": ratio("sync", "cpu"), "on": ratio("on", "cpu"), "on_off": ratio("on", "off"),
            "on_sync": ratio("on", "sync"),
            "launches": launches / on_iterations, "ops": ops / on_iterations,
            "new_sequences": new_sequences, "hit_rate": hit_rate}


def report(results: list, rounds: int) -> str:
    """The markdown section: machine, command, the table."""
    import datetime
    import platform

    def fmt(r):
        return f"{r[0]:.2f} [{r[1]:.2f}-{r[2]:.2f}]"

    lines = [
        "## Adaptive Eager Execution: the queue on and off vs CPU eager (`benchmarks/bench_concatenation.py`)",
        "",
        f"- Command: `python benchmarks/bench_concatenation.py {' '.join(sys.argv[1:])}` "
        f"({datetime.date.today().isoformat()}, "
        f"torch {torch.__version__}, {platform.machine()}, 1 thread, {rounds} interleaved rounds)",
        "- Ratios: median [25th-75th percentile] of per-round time / CPU eager time; lower is faster. "
        "`on / off`: the queue's own effect; `on / sync`: the device thread's (asynchronous execution: "
        "a full queue runs on it while the caller goes on; `sync`: every launch on the calling thread). "
        "Launches and queued ops are per iteration, queue on. "
        "Sequences: distinct op sequences first launched in the case (each one a compilation on "
        "TorchNeuron, none here: the queue runs C++ loops); reuse: the share of the case's launches "
        "that run a sequence launched before (TorchNeuron's compile-cache hit rate over the run).",
        "",
        "| Case | CPU eager (us) | neuron, queue off | neuron, queue on, sync | neuron, queue on | on / off "
        "| on / sync | launches | queued ops | sequences | reuse |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        reuse = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.3f}"
        lines.append(f"| {r['case'].label} | {r['cpu_us']:.1f} | {fmt(r['off'])} | {fmt(r['sync'])} | "
                     f"{fmt(r['on'])} | {fmt(r['on_off'])} | {fmt(r['on_sync'])} | {r['launches']:.2f} | {r['ops']:.1f} | {r['new_sequences']} | {reuse} |")
    lines += ["", f"Distinct op sequences launched in the run: {_C._concatenation_stats()[2]}."]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two rounds of short blocks (smoke test)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block", type=float, default=0.05, help="seconds of CPU work per block")
    parser.add_argument("--only", nargs="*", help="run only these case names")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--write", action="store_true", help="rewrite this benchmark's section of RESULTS.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds, block = (2, 0.005) if args.quick else (args.rounds, args.block)
    results = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        results.append(run_case(case, rounds, block))
        print(f"{case.name}: done", file=sys.stderr, flush=True)

    def ratio(r):
        return {"median": r[0], "p25": r[1], "p75": r[2]}
    payload = [{"name": r["case"].name, "cpu_us": r["cpu_us"], "off": ratio(r["off"]), "sync": ratio(r["sync"]),
                "on": ratio(r["on"]), "on_off": ratio(r["on_off"]), "on_sync": ratio(r["on_sync"]), "launches": r["launches"], "ops": r["ops"],
                "new_sequences": r["new_sequences"], "hit_rate": r["hit_rate"]} for r in results]
    publish("concatenation", report(results, rounds), write=args.write and not args.quick,
            json_path=args.json, payload=payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
