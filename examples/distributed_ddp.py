"""Data-parallel training on NeuronCores with DistributedDataParallel.

    torchrun --nproc-per-node 2 examples/distributed_ddp.py [--steps 20]

Each process binds its own core (LOCAL_RANK among the visible cores) when the
process group is created with backend="neuron", trains the same MLP on its
slice of every global batch, and DDP averages the gradients. At the end the
ranks check that they hold identical parameters.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
    )


# The target: a fixed random linear map squashed by tanh, the same on every rank.
TARGET = torch.randn(16, 1, generator=torch.Generator().manual_seed(0)) / 4


def batch(step: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step, identical on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(global_batch, 16, generator=g)
    return x, torch.tanh(x @ TARGET)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group(backend="neuron")  # binds torch.neuron.set_device(LOCAL_RANK)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", torch.neuron.current_device())
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by {world} ranks")
    per_rank = args.global_batch // world

    model = DDP(make_model().to(device), device_ids=[device.index])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    print(f"rank {rank}/{world} on {device} "
          f"(core {torch.neuron.get_device_properties(device).physical_core})", flush=True)

    first = last = None
    for step in range(args.steps):
        x, y = batch(step, args.global_batch)
        x = x[rank * per_rank:(rank + 1) * per_rank].to(device)
        y = y[rank * per_rank:(rank + 1) * per_rank].to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # The mean loss over the global batch (each rank's loss covers its slice).
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        first = mean.item() if first is None else first
        last = mean.item()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d} loss {last:.6f}", flush=True)

    # Every rank must hold the same parameters: compare against rank 0's.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    same = torch.equal(flat.cpu(), reference.cpu())
    agree = torch.tensor([1 if same else 0], device=device)
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"loss {first:.6f} -> {last:.6f}", flush=True)
        verdict = "parameters identical on all ranks" if agree.item() else "PARAMETERS DIFFER"
        print(verdict, flush=True)
    dist.destroy_process_group()
    if not agree.item():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
