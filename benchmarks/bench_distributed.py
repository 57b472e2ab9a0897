#!/usr/bin/env python
"""torch.distributed benchmarks: the `neuron` c10d backend on neuron tensors
against gloo on CPU tensors, in the same processes and the same run.

    python benchmarks/bench_distributed.py            # 2 and 4 ranks, prints the tables
    python benchmarks/bench_distributed.py --write    # ... and rewrites its RESULTS.md section
    python benchmarks/bench_distributed.py --quick    # small sizes, 2 ranks (smoke test)

all_reduce: bus bandwidth (NCCL's definition: bytes * 2(n-1)/n / time) of a
sum all_reduce of float32 tensors from 1 MiB to 256 MiB. The neuron backend
hands the device tensors' bytes to gloo without a copy, so the target is
>= 0.9x gloo on CPU tensors. Every rank joins one process group created with
backend "neuron"; CPU tensors in that group go to the same gloo backend, so
the two sides share the transport and differ only in the device path.
Rounds alternate between the two sides; the median per side is reported.

DDP: one training step (forward, backward with gradient all-reduce, SGD step)
of an MLP under DistributedDataParallel, on neuron vs on CPU, same weights,
alternating rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from results_file import publish  # noqa: E402
FULL_SIZES_MIB = (1, 4, 16, 64, 256)
QUICK_SIZES_MIB = (1, 4)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _barrier_sync(dist):
    return lambda: dist.barrier()


def _allreduce_case(dist, rank, world, mib, rounds) -> dict:
    numel = mib * 2**20 // 4
    tensors = {"neuron": torch.ones(numel, device="neuron"), "cpu": torch.ones(numel)}
    sync = _barrier_sync(dist)
    times = {"neuron": [], "cpu": []}
    for side in ("neuron", "cpu"):  # warm up both paths (buffers, connections)
        dist.all_reduce(tensors[side])
    for r in range(rounds):
        order = ("neuron", "cpu") if r % 2 == 0 else ("cpu", "neuron")
        for side in order:
            times[side].append(_timed(lambda: dist.all_reduce(tensors[side]), sync))
    factor = 2 * (world - 1) / world
    result = {"mib": mib, "world": world, "rounds": rounds}
    for side, values in times.items():
        median = statistics.median(values)
        result[f"{side}_s"] = median
        result[f"{side}_busbw_gbs"] = mib * 2**20 * factor / median / 1e9
    # Each round times both sides back to back, so the ratio within a round
    # cancels the machine's drift (other ranks, other processes); its median
    # and quartiles are the reported comparison.
    paired = sorted(c / n for c, n in zip(times["cpu"], times["neuron"]))
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    result.update(ratio=statistics.median(paired), ratio_q1=quartiles[0], ratio_q3=quartiles[2])
    return result


def _ddp_case(dist, rank, world, rounds) -> dict:
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                             nn.Linear(1024, 10))

    sides = {}
    for side in ("neuron", "cpu"):
        device = torch.device("neuron", torch.neuron.current_device()) if side == "neuron" else torch.device("cpu")
        net = model().to(device)
        ddp = DDP(net, device_ids=[device.index] if side == "neuron" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(64, 512, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)

        def step(ddp=ddp, opt=opt, x=x, y=y):
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        sides[side] = (step, net)
    sync = _barrier_sync(dist)
    for step, _ in sides.values():
        step()
    times = {"neuron": [], "cpu": []}
    for r in range(rounds):
        for side in (("neuron", "cpu") if r % 2 == 0 else ("cpu", "neuron")):
            times[side].append(_timed(sides[side][0], sync))
    same = all(torch.allclose(a.detach().cpu(), b.detach(), atol=1e-5)
               for a, b in zip(sides["neuron"][1].parameters(), sides["cpu"][1].parameters()))
    result = {"world": world, "params_match": same}
    for side, values in times.items():
        result[f"{side}_s"] = statistics.median(values)
    result["ratio"] = result["neuron_s"] / result["cpu_s"]
    return result


def _worker(rank: int, world: int, port: int, sizes, rounds: int, ddp_rounds: int, out: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("neuron", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        allreduce = [_allreduce_case(dist, rank, world, mib, rounds if mib < 64 else max(3, rounds // 2))
                     for mib in sizes]
        check = torch.full((1024,), float(rank + 1), device="neuron")
        dist.all_reduce(check)
        expected = world * (world + 1) / 2
        correct = bool((check.cpu() == expected).all())
        ddp = _ddp_case(dist, rank, world, ddp_rounds)
        if rank == 0:
            Path(out).write_text(json.dumps({"allreduce": allreduce, "ddp": ddp, "correct": correct}))
    finally:
        dist.destroy_process_group()


def run_world(world: int, sizes, rounds: int, ddp_rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.start_processes(_worker, args=(world, _free_port(), sizes, rounds, ddp_rounds, out),
                           nprocs=world, start_method="spawn")
        return json.loads(Path(out).read_text())


def render(results: dict, command: str) -> str:
    lines = [
        "## torch.distributed: `neuron` backend vs gloo on CPU (`benchmarks/bench_distributed.py`)",
        "",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Command: `{command}`",
        f"- Machine: {os.cpu_count()} cores shared by all ranks (load average at start "
        f"{os.getloadavg()[0]:.1f}); ranks are processes on one host, transport loopback TCP (gloo).",
        "",
        "all_reduce (sum, float32); bus bandwidth = bytes x 2(n-1)/n / time, median over rounds. Each "
        "round runs both sides back to back in alternating order; ratio = median over rounds of "
        "(gloo time / neuron time) in the same round, with its interquartile range. "
        "Target: neuron >= 0.9x gloo on CPU tensors.",
        "",
        "| ranks | size | rounds | gloo on CPU tensors | neuron backend | ratio | ratio IQR |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for world, res in sorted(results.items()):
        for case in res["allreduce"]:
            lines.append(f"| {world} | {case['mib']} MiB | {case['rounds']} | {case['cpu_busbw_gbs']:.2f} GB/s | "
                         f"{case['neuron_busbw_gbs']:.2f} GB/s | {case['ratio']:.2f}x | "
                         f"{case['ratio_q1']:.2f}-{case['ratio_q3']:.2f} |")
    lines += ["", "DDP training step (MLP 512-1024-1024-10, batch 64 per rank, SGD), median over "
              "alternating rounds; ratio = neuron / CPU time (lower is better; 1.0 = parity).", "",
              "| ranks | CPU + gloo | neuron + neuron backend | ratio | parameters equal after the steps |",
              "|---:|---:|---:|---:|---|"]
    for world, res in sorted(results.items()):
        d = res["ddp"]
        lines.append(f"| {world} | {d['cpu_s'] * 1e3:.1f} ms | {d['neuron_s'] * 1e3:.1f} ms | "
                     f"{d['ratio']:.2f} | {'yes' if d['params_match'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB, 2 ranks, few rounds")
    parser.add_argument("--worlds", default=None, help="comma-separated rank counts (default 2,4)")
    parser.add_argument("--write", action="store_true", help="rewrite its section of benchmarks/RESULTS.md")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args(argv)
    worlds = [int(w) for w in (args.worlds or ("2" if args.quick else "2,4")).split(",")]
    sizes = QUICK_SIZES_MIB if args.quick else FULL_SIZES_MIB
    rounds, ddp_rounds = (3, 3) if args.quick else (25, 15)
    results = {w: run_world(w, sizes, rounds, ddp_rounds) for w in worlds}
    command = "python benchmarks/bench_distributed.py" + (" --quick" if args.quick else "") + (
        f" --worlds {args.worlds}" if args.worlds else "")
    publish("distributed", render(results, command), write=args.write, json_path=args.json, payload=results)
    return 0 if all(r["correct"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
