"""torch-neuronx demo: train a small transformer classifier on the neuron device.

    python examples/demo.py [--steps 40]

Nothing here is Neuron-specific beyond the device string: the model, the
optimizer and the loop are plain PyTorch. After training it prints what ran
on the device (native ops vs CPU fallback) and the device memory use; then it
trains a few steps with torch.compile(backend="neuron"), compares them with
eager training, and prints the compile report (graphs, executables, disk
cache hits: run the demo twice to see a warm start).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx

VOCAB, SEQ, CLASSES, DIM = 32, 12, 4, 64


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Parameter(torch.zeros(SEQ, DIM))
        self.encoder = nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=128, dropout=0.0,
                                                  batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.position)
        return self.head(self.norm(h.mean(1)))


def synthetic_batch(batch, generator):
    """Label = the most frequent token class (token % CLASSES) in the sequence."""
    tokens = torch.randint(0, VOCAB, (batch, SEQ), generator=generator)
    counts = F.one_hot(tokens % CLASSES, CLASSES).sum(1)
    return tokens, counts.argmax(1)


def mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    device = torch.device("neuron")
    props = torch.neuron.get_device_properties(0)
    print(f"torch {torch.__version__}, torch_neuronx {torch_neuronx.__version__}: "
          f"{torch.neuron.device_count()} NeuronCores ({props.name}, {mib(props.total_memory)} each)")

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = Classifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    eval_tokens, eval_labels = synthetic_batch(512, generator)
    eval_tokens, eval_labels = eval_tokens.to(device), eval_labels.to(device)

    torch_neuronx.clear_op_tracking()
    torch.neuron.reset_peak_memory_stats()
    start = time.perf_counter()
    losses = []
    for step in range(args.steps):
        tokens, labels = synthetic_batch(args.batch, generator)
        tokens, labels = tokens.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        loss = F.cross_entropy(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")
    elapsed = time.perf_counter() - start

    with torch.no_grad():
        accuracy = (model(eval_tokens).argmax(1) == eval_labels).float().mean().item()
    head, tail = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    verdict = "decreased" if tail < head else "did NOT decrease"
    print(f"loss {verdict}: {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(mean of first 5 steps {head:.4f}, last 5 steps {tail:.4f})")
    print(f"eval accuracy {accuracy:.3f} (chance {1 / CLASSES:.3f}); "
          f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")

    print("\n== What ran on the neuron device ==")
    fallback = torch_neuronx.get_fallback_ops()
    if fallback:
        print(f"fallback ops (ran on CPU copies): {len(fallback)}")
        for name, count in sorted(fallback.items(), key=lambda item: -item[1]):
            print(f"  {name}: {count}")
    else:
        print("fallback ops (ran on CPU copies): none")
    executed = torch_neuronx.get_executed_ops()
    print(f"executed ops: {len(executed)} distinct, {sum(executed.values())} calls; top 10:")
    for name, count in sorted(executed.items(), key=lambda item: -item[1])[:10]:
        print(f"  {name}: {count}")
    print(f"memory: allocated {mib(torch.neuron.memory_allocated())} / "
          f"peak {mib(torch.neuron.max_memory_allocated())} / "
          f"reserved {mib(torch.neuron.memory_reserved())}")

    print("\n== torch.compile(model, backend='neuron') ==")
    try:
        compile_report(model, optimizer, generator, eval_tokens)
    except Exception as error:  # noqa: BLE001 - report whatever the backend raises
        # Dynamo wraps a backend's own error in BackendCompilerFailed: report the inner one.
        inner = getattr(error, "inner_exception", None) or error
        lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
        reason = lines[0] if lines else ""
        print(f"compile backend 'neuron': not available yet ({type(inner).__name__}: {reason})")


def compile_report(model, optimizer, generator, eval_tokens) -> None:
    """A few compiled training steps (forward and backward graphs), a compiled
    inference call checked against eager, and the compiler's metrics. A second
    run of the demo loads the compiled graphs from the disk cache."""
    device = eval_tokens.device
    twin = copy.deepcopy(model)  # trained eagerly on the same batches, for comparison
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=3e-3)
    twin_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # own moment buffers
    torch_neuronx.reset_dynamo_metrics()
    compiled = torch.compile(model, backend="neuron")
    batches = [synthetic_batch(64, generator) for _ in range(5)]

    def train(module, opt):
        losses = []
        for tokens, labels in batches:
            loss = F.cross_entropy(module(tokens.to(device)), labels.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    start = time.perf_counter()
    losses = train(compiled, optimizer)
    elapsed = time.perf_counter() - start
    eager_losses = train(twin, twin_optimizer)
    gap = max(abs(a - b) for a, b in zip(losses, eager_losses))
    print(f"compiled training: 5 steps in {elapsed:.2f} s (the first call compiles); "
          f"max |loss compiled - loss eager| = {gap:.2e}")
    with torch.no_grad():
        got, want = compiled(eval_tokens[:8]), model(eval_tokens[:8])
    difference = (got - want).abs().max().item()
    print(f"compile backend 'neuron': available; max |compiled - eager| = {difference:.2e}")
    m = torch_neuronx.get_dynamo_metrics()
    print(f"compile report: graphs {m['forward_graphs']} forward / {m['backward_graphs']} backward / "
          f"{m['inference_graphs']} inference; {m['compiles']} executables built or loaded in "
          f"{m['compile_seconds']:.2f} s; disk cache hits {m['cache_hits_disk']} executables / "
          f"{m['cache_hits_aot']} AOTAutograd results; graph breaks {m['graph_breaks']}; "
          f"recompiles {m['recompiles']}")
    for record in m:  # one per compiled graph, as TorchNeuron's torch.neuron.get_dynamo_metrics()
        print(f"  {record.graph_name}: {record.graph_node_count} nodes, FX passes "
              f"{record.torch_neuronx_fx_passes_us / 1e3:.1f} ms, lowering {record.torch_neuronx_lower_us / 1e3:.1f} ms, "
              f"XLA compile {record.torch_neuronx_compile_us / 1e3:.1f} ms")


if __name__ == "__main__":
    main()
