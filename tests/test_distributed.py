"""torch.distributed on neuron: the "neuron" c10d backend (gloo over host views).

The multi-process scenarios run as separate processes launched like torchrun
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a
free port) by re-running this file as ``python test_distributed.py worker
<scenario> <outdir>``; each rank saves its results and the tests compare them:

- collectives: every collective on neuron tensors against the same collective
  run by gloo on CPU tensors of the same values, in one process group created
  with "cpu:gloo,neuron:neuron" (CPU tensors go to the gloo backend, neuron
  tensors to the neuron one). Tolerance: exact, since both run gloo's
  algorithm on the same bytes.
- training: backend="neuron" (also used for CPU tensors), binding to
  LOCAL_RANK among NEURON_RT_VISIBLE_CORES, DDP and FSDP2 training against a
  single-process reference trained on the full batch (atol 1e-5), a
  distributed checkpoint round trip of the FSDP2 model, tensor parallel
  (column/row-wise) against the unsharded model, DTensor redistributions,
  pipeline parallel (two stages, GPipe) against the unsplit model.
- compiled: torch.compile(backend="neuron") of DDP and FSDP2 models, and
  functional collectives inside a fullgraph compiled function.
- mesh4 (the one 4-process test): subgroups, uneven all_to_all_single, a 2x2
  DeviceMesh with DTensor and HSDP training against the reference.
  It ends with failures (the group is broken afterwards): rank 1 stalls and
  rank 0 times out (2 s group timeout), then rank 1 dies mid-collective and
  rank 0 fails at once; nothing hangs.
- the DDP example under torchrun.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed_ddp.py"
WORLD = 2
TRAIN_STEPS = 4
LR = 0.1


# ----------------------------------------------------------------------------- launching


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _base_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCH_NEURONX_", "NEURON_RT_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                         "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONWARNINGS"] = "ignore"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def _launch(scenario: str, outdir: Path, world: int = WORLD, env: dict | None = None,
            timeout: float = 120) -> dict:
    """Runs ``scenario`` on ``world`` ranks; returns exit codes, logs and per-rank results."""
    outdir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs, logs = [], []
    for rank in range(world):
        rank_env = _base_env(env)
        rank_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                        WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
        log = open(outdir / f"rank{rank}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "worker", scenario, str(outdir)],
            env=rank_env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    deadline = time.monotonic() + timeout
    timed_out = False
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for log in logs:
        log.close()
    texts = [(outdir / f"rank{r}.log").read_text() for r in range(world)]
    results = []
    for rank in range(world):
        path = outdir / f"rank{rank}.pt"
        results.append(torch.load(path, weights_only=False) if path.exists() else None)
    return {"codes": [p.returncode for p in procs], "logs": texts, "results": results,
            "timed_out": timed_out}


def _tail(run: dict) -> str:
    return "\n".join(f"--- rank {r} (exit {c}):\n{log[-3000:]}"
                     for r, (c, log) in enumerate(zip(run["codes"], run["logs"])))


# ----------------------------------------------------------------------------- worker side


def _values(rank: int, shape, dtype=torch.float32, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + 1)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) + 0.5).to(dtype)  # in [0.5, 1.5): safe products
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def _on(tensor: torch.Tensor, dev: str) -> torch.Tensor:
    return tensor.to(dev)


def _noncontiguous(tensor: torch.Tensor, dev: str) -> torch.Tensor:
    """A transposed view on neuron; the same values, contiguous, on CPU (for gloo)."""
    base = tensor.t().contiguous().to(dev)
    return base.t() if dev != "cpu" else base.t().contiguous()


CASES: dict = {}
ERROR_CASES: set = set()  # cases where gloo on CPU raises: neuron must raise as well


def _case(fn=None, *, error: bool = False):
    def register(fn):
        name = fn.__name__.removeprefix("case_")
        CASES[name] = fn
        if error:
            ERROR_CASES.add(name)
        return fn

    return register(fn) if fn is not None else register


def _all_reduce_case(op_name: str, dtype: torch.dtype, error: bool = False):
    def case(dev, rank, world, ctx):
        import torch.distributed as dist

        t = _on(_values(rank, (5, 3), dtype, salt=len(op_name)), dev)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op_name))
        return [t]

    case.__name__ = f"case_all_reduce_{op_name.lower()}_{str(dtype).removeprefix('torch.')}"
    _case(case, error=error)


for _op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX"):
    _all_reduce_case(_op, torch.float32)
for _op in ("BAND", "BOR", "BXOR", "SUM", "MAX"):
    _all_reduce_case(_op, torch.int64)
for _dtype in (torch.bfloat16, torch.float16, torch.float64, torch.int32, torch.uint8, torch.int8,
               torch.bool, torch.complex64):
    _all_reduce_case("SUM", _dtype)
_all_reduce_case("AVG", torch.int64, error=True)
_all_reduce_case("BAND", torch.float32, error=True)


@_case
def case_all_reduce_async_work(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _on(_values(rank, (64,)), dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    future_value = work.get_future().wait()
    return [t, torch.tensor([work.is_completed()]), future_value[0].cpu()]


@_case
def case_all_reduce_noncontiguous(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _noncontiguous(_values(rank, (4, 6)), dev)
    dist.all_reduce(t)
    return [t, torch.tensor([dev == "cpu" or not t.is_contiguous()])]  # still a transposed view


@_case
def case_all_reduce_slice_of_larger_tensor(dev, rank, world, ctx):
    import torch.distributed as dist

    base = _on(_values(rank, (10,)), dev)
    view = base[3:7]
    dist.all_reduce(view, op=dist.ReduceOp.MAX)
    return [base]


@_case
def case_all_reduce_coalesced(dev, rank, world, ctx):
    import torch.distributed as dist

    tensors = [_on(_values(rank, (3,), salt=1), dev), _on(_values(rank, (2, 2), salt=2), dev)]
    dist.all_reduce_coalesced(tensors)
    return tensors


@_case
def case_broadcast(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _on(_values(rank, (7,)), dev)
    dist.broadcast(t, src=1)
    return [t]


@_case
def case_broadcast_noncontiguous(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _noncontiguous(_values(rank, (3, 5)), dev)
    dist.broadcast(t, src=0)
    return [t]


@_case
def case_reduce_sum(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _on(_values(rank, (6,)), dev)
    dist.reduce(t, dst=0)
    return [t] if rank == 0 else []  # non-root contents are unspecified


@_case
def case_reduce_avg(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _on(_values(rank, (6,)), dev)
    dist.reduce(t, dst=1, op=dist.ReduceOp.AVG)
    return [t] if rank == 1 else []


@_case
def case_all_gather(dev, rank, world, ctx):
    import torch.distributed as dist

    outputs = [torch.zeros(4, device=dev) for _ in range(world)]
    dist.all_gather(outputs, _on(_values(rank, (4,)), dev))
    return outputs


@_case
def case_all_gather_noncontiguous_outputs(dev, rank, world, ctx):
    import torch.distributed as dist

    outputs = [_noncontiguous(torch.zeros(2, 3), dev) for _ in range(world)]
    dist.all_gather(outputs, _noncontiguous(_values(rank, (2, 3)), dev))
    return outputs


@_case
def case_all_gather_into_tensor(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(world * 5, device=dev)
    dist.all_gather_into_tensor(out, _on(_values(rank, (5,)), dev))
    return [out]


@_case
def case_all_gather_into_tensor_2d(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(world * 2, 3, device=dev)
    dist.all_gather_into_tensor(out, _on(_values(rank, (2, 3)), dev))
    return [out]


@_case
def case_all_gather_single(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(world * 3, 2, device=dev)
    dist.all_gather_single(out, _on(_values(rank, (3, 2)), dev))  # 2.13 name of _into_tensor
    return [out]


@_case
def case_reduce_scatter_single(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(3, device=dev)
    dist.reduce_scatter_single(out, _on(_values(rank, (world * 3,)), dev), op=dist.ReduceOp.MAX)
    return [out]


@_case
def case_reduce_scatter(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(3, device=dev)
    inputs = [_on(_values(rank, (3,), salt=i), dev) for i in range(world)]
    dist.reduce_scatter(out, inputs)
    return [out]


@_case
def case_reduce_scatter_tensor_sum(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(4, device=dev)
    dist.reduce_scatter_tensor(out, _on(_values(rank, (world * 4,)), dev))
    return [out]


@_case
def case_reduce_scatter_tensor_avg(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(2, 3, device=dev)
    dist.reduce_scatter_tensor(out, _on(_values(rank, (world * 2, 3)), dev),
                               op=dist.ReduceOp.AVG)
    return [out]


@_case
def case_reduce_scatter_tensor_noncontiguous_output(dev, rank, world, ctx):
    import torch.distributed as dist

    out = _noncontiguous(torch.zeros(3, 2), dev)
    work = dist.reduce_scatter_tensor(out, _on(_values(rank, (world * 3, 2)), dev), async_op=True)
    work.wait()
    return [out]


@_case
def case_all_to_all(dev, rank, world, ctx):
    import torch.distributed as dist

    inputs = [_on(_values(rank, (2, 3), salt=i), dev) for i in range(world)]
    outputs = [torch.zeros(2, 3, device=dev) for _ in range(world)]  # gloo: equal sizes only
    dist.all_to_all(outputs, inputs)
    return outputs


@_case
def case_all_to_all_single_even(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(world * 3, device=dev)
    dist.all_to_all_single(out, _on(_values(rank, (world * 3,)), dev))
    return [out]


@_case
def case_all_to_all_single_uneven(dev, rank, world, ctx):
    import torch.distributed as dist

    # rank r sends (r + 1 + j) rows to rank j: input rows sum_j (r+1+j), output rows sum_i (i+1+r)
    in_splits = [rank + 1 + j for j in range(world)]
    out_splits = [i + 1 + rank for i in range(world)]
    source = _on(_values(rank, (sum(in_splits), 2)), dev)
    out = torch.zeros(sum(out_splits), 2, device=dev)
    dist.all_to_all_single(out, source, out_splits, in_splits)
    return [out]


@_case
def case_gather(dev, rank, world, ctx):
    import torch.distributed as dist

    t = _on(_values(rank, (3,)), dev)
    outputs = [torch.zeros(3, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(t, outputs, dst=0)
    return outputs or []


@_case
def case_scatter(dev, rank, world, ctx):
    import torch.distributed as dist

    out = torch.zeros(4, device=dev)
    inputs = [_on(_values(rank, (4,), salt=i), dev) for i in range(world)] if rank == 1 else None
    dist.scatter(out, inputs, src=1)
    return [out]


@_case
def case_barrier(dev, rank, world, ctx):
    import torch.distributed as dist

    dist.barrier()
    work = dist.barrier(async_op=True)
    work.wait()
    return [torch.ones(1)]


@_case
def case_send_recv(dev, rank, world, ctx):
    import torch.distributed as dist

    if rank == 0:
        dist.send(_on(_values(rank, (5,)), dev), dst=1)
        t = torch.zeros(5, device=dev)
        dist.recv(t, src=1)
    else:
        t = torch.zeros(5, device=dev)
        dist.recv(t, src=0)
        dist.send(t * 2, dst=0)
    return [t]


@_case
def case_isend_irecv_both_ways(dev, rank, world, ctx):
    import torch.distributed as dist

    peer = 1 - rank
    inbox = torch.zeros(8, device=dev)
    recv = dist.irecv(inbox, src=peer, tag=3)
    send = dist.isend(_on(_values(rank, (8,)), dev), dst=peer, tag=3)
    send.wait()
    recv.wait()
    return [inbox]


@_case
def case_recv_noncontiguous(dev, rank, world, ctx):
    import torch.distributed as dist

    peer = 1 - rank
    inbox = _noncontiguous(torch.zeros(3, 4), dev)
    recv = dist.irecv(inbox, src=peer)
    dist.send(_noncontiguous(_values(rank, (3, 4)), dev), dst=peer)
    recv.wait()
    return [inbox]


@_case
def case_recv_any_source(dev, rank, world, ctx):
    import torch.distributed as dist

    if rank == 1:
        dist.send(_on(_values(rank, (4,)), dev), dst=0)
        return []
    t = torch.zeros(4, device=dev)
    source = dist.recv(t)
    return [t, torch.tensor([source])]


@_case
def case_batch_isend_irecv(dev, rank, world, ctx):
    import torch.distributed as dist

    peer = 1 - rank
    inbox = torch.zeros(6, device=dev)
    ops = [dist.P2POp(dist.isend, _on(_values(rank, (6,)), dev), peer),
           dist.P2POp(dist.irecv, inbox, peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return [inbox]


@_case
def case_coalescing_manager_all_gather(dev, rank, world, ctx):
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    outs = [torch.zeros(world * 2, device=dev), torch.zeros(world * 3, device=dev)]
    ins = [_on(_values(rank, (2,), salt=1), dev), _on(_values(rank, (3,), salt=2), dev)]
    with _coalescing_manager(async_ops=True) as manager:
        for out, source in zip(outs, ins):
            dist.all_gather_into_tensor(out, source)
    manager.wait()
    return outs


@_case
def case_coalescing_manager_reduce_scatter(dev, rank, world, ctx):
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    outs = [torch.zeros(2, device=dev), torch.zeros(3, device=dev)]
    ins = [_on(_values(rank, (world * 2,), salt=1), dev),
           _on(_values(rank, (world * 3,), salt=2), dev)]
    with _coalescing_manager(async_ops=True) as manager:
        for out, source in zip(outs, ins):
            dist.reduce_scatter_tensor(out, source, op=dist.ReduceOp.AVG)
    manager.wait()
    return outs


@_case
def case_funcol_all_reduce(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    out = funcol.all_reduce(_on(_values(rank, (5,)), dev), "sum", dist.group.WORLD)
    return [funcol.wait_tensor(out)]


@_case
def case_funcol_all_gather_tensor(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    out = funcol.all_gather_tensor(_on(_values(rank, (2, 3)), dev), 0, dist.group.WORLD)
    return [funcol.wait_tensor(out)]


@_case
def case_funcol_reduce_scatter_tensor(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    # The input is a temporary: the collective must keep its memory alive until done.
    out = funcol.reduce_scatter_tensor(_on(_values(rank, (world * 3,)), dev) * 2, "sum", 0,
                                       dist.group.WORLD)
    return [funcol.wait_tensor(out)]


@_case
def case_funcol_all_to_all_single(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    splits = [[1, 3], [2, 2]]  # splits[i][j]: rows rank i sends to rank j
    in_splits = splits[rank]
    out_splits = [splits[i][rank] for i in range(world)]
    source = _on(_values(rank, (sum(in_splits), 3)), dev)
    out = funcol.all_to_all_single(source, out_splits, in_splits, dist.group.WORLD)
    return [funcol.wait_tensor(out)]


@_case
def case_funcol_all_gather_coalesced(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    ins = [_on(_values(rank, (2,), salt=1), dev), _on(_values(rank, (3, 2), salt=2), dev)]
    outs = funcol.all_gather_into_tensor_coalesced(ins, dist.group.WORLD)
    return [funcol.wait_tensor(out) for out in outs]


@_case
def case_funcol_reduce_scatter_coalesced(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    ins = [_on(_values(rank, (world * 2,), salt=1), dev),
           _on(_values(rank, (world * 3,), salt=2), dev)]
    outs = funcol.reduce_scatter_tensor_coalesced(ins, "sum", [0, 0], dist.group.WORLD)
    return [funcol.wait_tensor(out) for out in outs]


@_case
def case_funcol_broadcast(dev, rank, world, ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    out = funcol.broadcast(_on(_values(rank, (4,)), dev), 1, dist.group.WORLD)
    return [funcol.wait_tensor(out)]


@_case
def case_subgroup_neuron_only_all_reduce(dev, rank, world, ctx):
    import torch.distributed as dist

    group = ctx["neuron_only"] if dev != "cpu" else ctx["gloo_only"]
    t = _on(_values(rank, (6,)), dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [t]


@_case
def case_subgroup_objects(dev, rank, world, ctx):
    import torch.distributed as dist

    # A group whose only backend is neuron: object collectives travel as neuron tensors.
    group = ctx["neuron_only"] if dev != "cpu" else ctx["gloo_only"]
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "payload": list(range(rank + 3))}, group=group)
    listing = [f"obj-from-{rank}", rank * 10]
    dist.broadcast_object_list(listing, src=1, group=group)
    encoded = torch.tensor([o["rank"] * 100 + len(o["payload"]) for o in objects] + [listing[1]])
    return [encoded]


def _scenario_collectives(rank: int, world: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,neuron:neuron", timeout=datetime.timedelta(seconds=30))
    dev = f"neuron:{torch.neuron.current_device()}"
    ctx = {"neuron_only": dist.new_group(backend="neuron:neuron"),
           "gloo_only": dist.new_group(backend="gloo")}
    results = {"device": dev, "backend": dist.get_backend(), "cases": {}}
    for name, case in CASES.items():
        entry = {}
        for label, device in (("gloo", "cpu"), ("neuron", dev)):
            try:
                outs = case(device, rank, world, ctx)
                entry[label] = ("ok", [o.detach().cpu() for o in outs],
                                [str(o.device) for o in outs])
            except Exception as error:  # noqa: BLE001 (reported to the test)
                entry[label] = ("error", f"{type(error).__name__}: {error}"[:500],
                                traceback.format_exc()[-2000:])
        results["cases"][name] = entry
    dist.barrier()
    dist.destroy_process_group()
    return results


# -- training: DDP, FSDP2, DTensor, binding, CPU tensors on backend="neuron"


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _train_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(TRAIN_STEPS, 8, 8, generator=g), torch.randn(TRAIN_STEPS, 8, 4, generator=g)


def _shard(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    per = batch.shape[0] // world
    return batch[rank * per:(rank + 1) * per]


def _train_steps(model, parameters, rank: int, world: int, device, data=None) -> list[float]:
    """TRAIN_STEPS of SGD on this rank's shard of each step's batch (``data()``, default
    _train_data); the losses."""
    optimizer = torch.optim.SGD(parameters, lr=LR)
    X, Y = (data or _train_data)()
    losses = []
    for step in range(TRAIN_STEPS):
        loss = torch.nn.functional.mse_loss(model(_shard(X[step], rank, world).to(device)),
                                            _shard(Y[step], rank, world).to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _scenario_training(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict = {}
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
    device = torch.device("neuron", torch.neuron.current_device())
    out["binding"] = {
        "current_device": torch.neuron.current_device(),
        "physical_core": torch.neuron.get_device_properties(device).physical_core,
        "device_count": torch.neuron.device_count(),
        "backend": dist.get_backend(),
    }
    # CPU tensors and objects on the backend="neuron" group (served by its gloo backend).
    cpu = torch.full((3,), float(rank + 1))
    dist.all_reduce(cpu)
    objects = [None] * world
    dist.all_gather_object(objects, ("rank", rank))
    dist.barrier()
    out["cpu_all_reduce"] = cpu
    out["objects"] = objects
    # As with NCCL, the output of all_gather_into_tensor only needs world * numel elements.
    flat = torch.empty(world * 3, device=device)
    dist.all_gather_into_tensor(flat, torch.full((1, 3), float(rank), device=device))
    out["gather_flat"] = flat.cpu()
    X, Y = _train_data()  # tensor parallel below runs the first step's batch

    def train(model, label):
        out[f"{label}_losses"] = _train_steps(model, model.parameters(), rank, world, device)

    try:
        model = _mlp()
        if rank == 1:  # DDP must broadcast rank 0's initial state
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
        ddp = DDP(model.to(device), device_ids=[device.index], bucket_cap_mb=0.0005)
        train(ddp, "ddp")
        out["ddp_params"] = [p.detach().cpu() for p in ddp.module.parameters()]
        out["ddp_grad_devices"] = sorted({str(p.grad.device) for p in ddp.module.parameters()})
    except Exception:  # noqa: BLE001
        out["ddp_error"] = traceback.format_exc()

    try:  # communication hooks: their futures carry the host views of the buckets
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        for hook in (default_hooks.allreduce_hook, default_hooks.fp16_compress_hook):
            ddp = DDP(_mlp().to(device), device_ids=[device.index])
            ddp.register_comm_hook(None, hook)
            train(ddp, hook.__name__)
            out[f"{hook.__name__}_params"] = [p.detach().cpu() for p in ddp.module.parameters()]
    except Exception:  # noqa: BLE001
        out["hook_error"] = traceback.format_exc()

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("neuron", (world,))
        model = _mlp().to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        out["fsdp_local_shapes"] = [tuple(p.to_local().shape) for p in model.parameters()]
        train(model, "fsdp")
        out["fsdp_params"] = [p.full_tensor().detach().cpu() for p in model.parameters()]
    except Exception:  # noqa: BLE001
        out["fsdp_error"] = traceback.format_exc()

    try:  # distributed checkpoint of the sharded model, loaded into a fresh sharded model
        import torch.distributed.checkpoint as dcp

        checkpoint = Path(sys.argv[3]) / "checkpoint"
        dcp.save(model.state_dict(), checkpoint_id=checkpoint)
        fresh = _mlp().to(device)
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        for layer in fresh:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(fresh, mesh=mesh)
        state = fresh.state_dict()
        dcp.load(state, checkpoint_id=checkpoint)
        fresh.load_state_dict(state)
        out["dcp_params"] = [p.full_tensor().detach().cpu() for p in fresh.parameters()]
        out["dcp_local_devices"] = sorted({str(p.to_local().device) for p in fresh.parameters()})
    except Exception:  # noqa: BLE001
        out["dcp_error"] = traceback.format_exc()

    try:  # tensor parallel: column-wise then row-wise sharded MLP, one forward/backward
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("neuron", (world,))
        model = parallelize_module(_mlp().to(device), mesh,
                                   {"0": ColwiseParallel(), "2": RowwiseParallel()})
        prediction = model(X[0].to(device))
        loss = torch.nn.functional.mse_loss(prediction, Y[0].to(device))
        loss.backward()
        out["tp_prediction"] = prediction.detach().cpu()
        out["tp_loss"] = loss.item()
        out["tp_grads"] = [p.grad.full_tensor().cpu() for p in model.parameters()]
        out["tp_local_weight_shape"] = tuple(model[0].weight.to_local().shape)
    except Exception:  # noqa: BLE001
        out["tp_error"] = traceback.format_exc()

    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("neuron", (world,))
        full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        sharded = distribute_tensor(full.to(device), mesh, [Shard(0)])
        out["dtensor_local"] = sharded.to_local().cpu()
        out["dtensor_full"] = sharded.full_tensor().cpu()
        out["dtensor_replicated"] = sharded.redistribute(mesh, [Replicate()]).to_local().cpu()
        out["dtensor_matmul"] = (sharded @ sharded.T).full_tensor().cpu()
        col = distribute_tensor(full.to(device), mesh, [Shard(1)])
        out["dtensor_row_to_col"] = sharded.redistribute(mesh, [Shard(1)]).to_local().cpu()
        out["dtensor_col_local"] = col.to_local().cpu()
        out["dtensor_sum"] = sharded.sum().full_tensor().cpu()
        out["dtensor_mesh_device"] = mesh.device_type
    except Exception:  # noqa: BLE001
        out["dtensor_error"] = traceback.format_exc()

    try:  # pipeline parallel: the MLP's two layers as two stages, GPipe over 2 microbatches
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        layers = _mlp()
        stage = PipelineStage((layers[:2] if rank == 0 else layers[2:]).to(device), rank, world, device)
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
        losses: list = []
        if rank == 0:
            schedule.step(X[0].to(device))
        else:
            schedule.step(target=Y[0].to(device), losses=losses)
        out["pp_losses"] = [loss.item() for loss in losses]
        out["pp_grads"] = [p.grad.cpu() for p in stage.submod.parameters()]
    except Exception:  # noqa: BLE001
        out["pp_error"] = traceback.format_exc()

    dist.barrier()
    _failure_phase(rank, out)  # last: it breaks the group and ends the process


# -- failure: a stalled rank (timeout) and a dead rank (connection lost)


def _failure_phase(rank: int, out: dict) -> None:
    """Rank 1 stalls (rank 0 must time out), then dies mid-collective (rank 0 must fail)."""
    import torch.distributed as dist

    device = torch.device("neuron", torch.neuron.current_device())
    short = dist.new_group(backend="neuron", timeout=datetime.timedelta(seconds=2))
    t = torch.ones(1 << 16, device=device)
    dist.all_reduce(t, group=short)  # both groups work
    dist.all_reduce(t)
    path = Path(sys.argv[3]) / f"rank{rank}.pt"
    if rank == 1:
        torch.save(out, path)
        time.sleep(4)  # stall: rank 0's all_reduce on `short` times out meanwhile
        dist.all_reduce(t)  # meet rank 0 on the world group
        dist.all_reduce(t, async_op=True)  # ... then die in the middle of the next collective
        os._exit(17)
    start = time.monotonic()
    try:
        dist.all_reduce(t, group=short)
        out["stall"] = ("no error", time.monotonic() - start)
    except Exception as error:  # noqa: BLE001
        out["stall"] = (f"{type(error).__name__}: {error}", time.monotonic() - start)
    dist.all_reduce(t)
    start = time.monotonic()
    try:
        for _ in range(5):
            dist.all_reduce(t)
        out["death"] = ("no error", time.monotonic() - start)
    except Exception as error:  # noqa: BLE001
        out["death"] = (f"{type(error).__name__}: {error}", time.monotonic() - start)
    torch.save(out, path)
    os._exit(0)  # the world group is broken: skip its teardown


# -- four ranks: subgroups, uneven all_to_all, a 2-D mesh (DTensor, HSDP)


def _a2a_rows(src: int, dst: int) -> int:
    return (src + dst) % 3 + 1


def _scenario_mesh4(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
    device = torch.device("neuron", torch.neuron.current_device())
    out: dict = {"current_device": torch.neuron.current_device()}

    pair = dist.new_group([1, 3])
    t = torch.full((3,), float(rank), device=device)
    if rank in (1, 3):
        dist.all_reduce(t, group=pair)
    out["subgroup"] = t.cpu()

    in_splits = [_a2a_rows(rank, j) for j in range(world)]
    out_splits = [_a2a_rows(i, rank) for i in range(world)]
    source = torch.cat([torch.full((_a2a_rows(rank, j), 2), float(10 * rank + j))
                        for j in range(world)])
    received = torch.zeros(sum(out_splits), 2, device=device)
    dist.all_to_all_single(received, source.to(device), out_splits, in_splits)
    out["all_to_all"] = received.cpu()

    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    sharded = distribute_tensor(full.to(device), mesh, [Shard(0), Shard(1)])
    out["dtensor_local"] = sharded.to_local().cpu()
    out["dtensor_full"] = sharded.full_tensor().cpu()

    try:  # HSDP: replicate over "dp", shard over "tp"; each rank trains on a quarter batch
        model = _mlp().to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        out["hsdp_losses"] = _train_steps(model, model.parameters(), rank, world, device)
        out["hsdp_params"] = [p.full_tensor().detach().cpu() for p in model.parameters()]
    except Exception:  # noqa: BLE001
        out["hsdp_error"] = traceback.format_exc()
    dist.barrier()
    dist.destroy_process_group()
    return out


class _UserMLP(torch.nn.Module):
    """_mlp() inside a user-defined module: Dynamo compiles user frames, while a bare
    nn.Sequential wrapped by DDP/FSDP has only torch-internal frames, which it skips."""

    def __init__(self):
        super().__init__()
        self.net = _mlp()

    def forward(self, x):
        return self.net(x)


class _UserLayer(torch.nn.Module):
    """One layer of _mlp() in a user-defined module, the unit that per-layer
    FSDP2 shards and compiles (as a transformer block would be). Dynamo does
    not compile a sharded bare nn.Linear (a torch-internal frame) with any
    backend, so per-layer compile needs user modules like this one."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def _scenario_compiled(rank: int, world: int) -> dict:
    """torch.compile(backend="neuron") of DDP(model), of an FSDP2 (root-sharded)
    model, and of an FSDP2 model sharded and compiled per layer, trained like
    _scenario_training."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_neuronx

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
    device = torch.device("neuron", torch.neuron.current_device())
    out: dict = {}

    def train(model, parameters, label):
        out[f"{label}_losses"] = _train_steps(model, parameters, rank, world, device)

    for label in ("ddp", "fsdp", "fsdp_layers"):
        torch_neuronx.reset_dynamo_metrics()
        try:
            if label == "ddp":
                wrapped = DDP(_UserMLP().to(device), device_ids=[device.index])
                train(torch.compile(wrapped, backend="neuron"), wrapped.parameters(), label)
                out["ddp_params"] = [p.detach().cpu() for p in wrapped.module.parameters()]
            elif label == "fsdp_layers":
                model = torch.nn.Sequential(*(_UserLayer(layer) for layer in _mlp())).to(device)
                for layer in model:
                    fully_shard(layer)
                    layer.compile(backend="neuron")
                fully_shard(model)
                train(model, model.parameters(), label)
                out[f"{label}_params"] = [p.full_tensor().detach().cpu() for p in model.parameters()]
            else:
                model = _UserMLP().to(device)
                fully_shard(model)
                train(torch.compile(model, backend="neuron"), model.parameters(), label)
                out["fsdp_params"] = [p.full_tensor().detach().cpu() for p in model.parameters()]
            metrics = torch_neuronx.get_dynamo_metrics()
            out[f"{label}_graphs"] = metrics["forward_graphs"] + metrics["backward_graphs"]
        except Exception:  # noqa: BLE001
            out[f"{label}_error"] = traceback.format_exc()

    try:  # functional collectives inside a fullgraph compiled function
        import torch.distributed._functional_collectives as funcol

        def reduce_then_gather(x):
            total = funcol.all_reduce(x * 2, "sum", group=dist.group.WORLD)
            return funcol.all_gather_tensor(total + 1, 0, group=dist.group.WORLD) * 3

        x = torch.arange(4.0, device=device) + rank
        torch_neuronx.reset_dynamo_metrics()
        compiled = torch.compile(reduce_then_gather, backend="neuron", fullgraph=True)
        out["funcol_compiled"] = compiled(x).cpu()
        out["funcol_eager"] = reduce_then_gather(x).cpu()
        out["funcol_compiles"] = torch_neuronx.get_dynamo_metrics()["compiles"]
    except Exception:  # noqa: BLE001
        out["funcol_error"] = traceback.format_exc()
    dist.barrier()
    dist.destroy_process_group()
    return out


def _bn_model(norm) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), norm(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))


def _bn_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(TRAIN_STEPS, 8, 3, 6, 6, generator=g), torch.randn(TRAIN_STEPS, 8, 2, generator=g)


def _scenario_sync_batch_norm(rank: int, world: int) -> dict:
    """nn.SyncBatchNorm under DDP: its statistics exchange runs batch_norm_stats,
    batch_norm_gather_stats_with_counts, batch_norm_elemt and, backward,
    batch_norm_backward_reduce / batch_norm_backward_elemt, all on the device."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_neuronx

    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
    device = torch.device("neuron", torch.neuron.current_device())
    torch_neuronx.clear_op_tracking()
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(_bn_model(torch.nn.BatchNorm2d)).to(device)
    ddp = DDP(model, device_ids=[device.index])
    out = {"losses": _train_steps(ddp, ddp.parameters(), rank, world, device, data=_bn_data),
           "params": [p.detach().cpu() for p in model.parameters()],
           "running": [model[1].running_mean.cpu(), model[1].running_var.cpu()],
           "fallback": torch_neuronx.get_fallback_ops(), "executed": torch_neuronx.get_executed_ops()}
    dist.barrier()
    dist.destroy_process_group()
    return out


SCENARIOS = {
    "sync_batch_norm": _scenario_sync_batch_norm,
    "compiled": _scenario_compiled,
    "collectives": _scenario_collectives,
    "training": _scenario_training,
    "mesh4": _scenario_mesh4,
}


def _worker_main(scenario: str, outdir: str) -> None:
    warnings.simplefilter("ignore")
    import torch_neuronx  # noqa: F401  (also autoloaded by torch)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = SCENARIOS[scenario](rank, world)
    torch.save(results, Path(outdir) / f"rank{rank}.pt")


# ----------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    run = _launch("compiled", tmp_path_factory.mktemp("compiled"), timeout=240)
    assert not run["timed_out"] and run["codes"] == [0] * WORLD, _tail(run)
    return run["results"]


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    run = _launch("collectives", tmp_path_factory.mktemp("collectives"))
    assert not run["timed_out"] and run["codes"] == [0] * WORLD, _tail(run)
    return run["results"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_collective_matches_gloo_on_cpu(collectives, name):
    for rank, result in enumerate(collectives):
        entry = result["cases"][name]
        gloo, neuron = entry["gloo"], entry["neuron"]
        if name in ERROR_CASES:
            assert gloo[0] == "error", f"rank {rank}: gloo accepted {name}"
            assert neuron[0] == "error", f"rank {rank}: neuron accepted what gloo rejects: {neuron}"
            continue
        assert gloo[0] == "ok", f"rank {rank} gloo: {gloo[1]}\n{gloo[2]}"
        assert neuron[0] == "ok", f"rank {rank} neuron: {neuron[1]}\n{neuron[2]}"
        assert len(neuron[1]) == len(gloo[1])
        for index, (got, want) in enumerate(zip(neuron[1], gloo[1])):
            assert got.dtype == want.dtype and got.shape == want.shape, (rank, index)
            assert torch.equal(got, want), f"rank {rank} output {index}:\n{got}\nvs gloo\n{want}"
        devices = set(neuron[2])
        assert devices <= {result["device"], "cpu"}, devices


def test_collectives_ran_on_neuron_and_multi_backend_group(collectives):
    for rank, result in enumerate(collectives):
        assert result["device"] == f"neuron:{rank}"
        assert result["backend"] == "cpu:gloo,neuron:neuron"
        # Outputs of the neuron runs stay on the rank's core.
        devices = result["cases"]["all_gather"]["neuron"][2]
        assert devices == [f"neuron:{rank}"] * WORLD


def test_collective_sanity_values(collectives):
    """Guards against both sides being wrong the same way: a few closed-form values."""
    ranks = [_values(r, (5, 3), salt=3) for r in range(WORLD)]
    expected = ranks[0] + ranks[1]
    for result in collectives:
        got = result["cases"]["all_reduce_sum_float32"]["neuron"][1][0]
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
        gathered = result["cases"]["all_gather_into_tensor"]["neuron"][1][0]
        assert torch.equal(gathered, torch.cat([_values(r, (5,)) for r in range(WORLD)]))
        encoded = result["cases"]["subgroup_objects"]["neuron"][1][0]
        assert encoded.tolist() == [0 * 100 + 3, 1 * 100 + 4, 10]
    any_source = collectives[0]["cases"]["recv_any_source"]["neuron"][1]
    assert any_source[1].tolist() == [1]


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    run = _launch("training", tmp_path_factory.mktemp("training"),
                  env={"NEURON_RT_VISIBLE_CORES": "1-3"})
    assert not run["timed_out"], "a rank hung:\n" + _tail(run)
    assert run["codes"] == [0, 17], _tail(run)  # rank 1 dies on purpose at the end
    return run["results"]


@functools.cache
def _reference(world: int = WORLD) -> dict:
    """Single process, full batch, on neuron: losses of each rank's shard, and parameters."""
    device = torch.device("neuron", 0)
    model = _mlp().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    X, Y = _train_data()
    per_rank = [[] for _ in range(world)]
    for step in range(TRAIN_STEPS):
        x, y = X[step].to(device), Y[step].to(device)
        with torch.no_grad():
            for rank in range(world):
                part = torch.nn.functional.mse_loss(model(_shard(x, rank, world)),
                                                    _shard(y, rank, world))
                per_rank[rank].append(part.item())
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"losses": per_rank, "params": [p.detach().cpu() for p in model.parameters()]}


def test_binding_follows_local_rank_among_visible_cores(training):
    for rank, result in enumerate(training):
        binding = result["binding"]
        assert binding["device_count"] == 3  # NEURON_RT_VISIBLE_CORES=1-3
        assert binding["current_device"] == rank
        assert binding["physical_core"] == 1 + rank
        assert binding["backend"] == "neuron"


def test_cpu_tensors_and_objects_on_neuron_backend(training):
    for result in training:
        assert torch.equal(result["gather_flat"], torch.tensor([0.0, 0, 0, 1, 1, 1]))
        assert torch.equal(result["cpu_all_reduce"], torch.full((3,), 3.0))
        assert result["objects"] == [("rank", 0), ("rank", 1)]


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_data_parallel_training_matches_single_process(training, kind):
    reference = _reference()
    for rank, result in enumerate(training):
        assert f"{kind}_error" not in result, result.get(f"{kind}_error")
        torch.testing.assert_close(torch.tensor(result[f"{kind}_losses"]),
                                   torch.tensor(reference["losses"][rank]), rtol=0, atol=1e-5)
        for got, want in zip(result[f"{kind}_params"], reference["params"], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # The reference actually trains (a broken all-reduce would not match it).
    assert reference["losses"][0][-1] < reference["losses"][0][0]
    if kind == "ddp":
        assert training[0]["ddp_grad_devices"] == ["neuron:0"]
    else:
        assert training[0]["fsdp_local_shapes"][0] == (8, 8)  # Linear(8, 16).weight, dim 0 halved


def test_sync_batch_norm_trains_like_batch_norm_on_the_whole_batch(tmp_path):
    """Two ranks of SyncBatchNorm under DDP, each on half the batch, match one CPU process
    running BatchNorm2d on the whole batch: losses, parameters and running statistics."""
    run = _launch("sync_batch_norm", tmp_path)
    assert not run["timed_out"] and run["codes"] == [0] * WORLD, _tail(run)
    model = _bn_model(torch.nn.BatchNorm2d)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    X, Y = _bn_data()
    shard_losses = []
    for step in range(TRAIN_STEPS):
        # DDP averages the ranks' gradients: the mean of the shard losses is the whole-batch loss
        per_rank = [torch.nn.functional.mse_loss(out, y) for out, y in
                    zip(model(X[step]).chunk(WORLD), Y[step].chunk(WORLD))]
        shard_losses.append([loss.item() for loss in per_rank])
        optimizer.zero_grad()
        (sum(per_rank) / WORLD).backward()
        optimizer.step()
    for rank, result in enumerate(run["results"]):
        assert result["fallback"] == {}
        for op in ("batch_norm_stats", "batch_norm_gather_stats_with_counts", "batch_norm_elemt",
                   "batch_norm_backward_reduce", "batch_norm_backward_elemt"):
            assert result["executed"].get(f"aten::{op}") == TRAIN_STEPS, op
        torch.testing.assert_close(torch.tensor(result["losses"]),
                                   torch.tensor([losses[rank] for losses in shard_losses]), rtol=0, atol=1e-5)
        for got, want in zip(result["params"], model.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(result["running"], [model[1].running_mean, model[1].running_var],
                                   rtol=0, atol=1e-5)
    assert shard_losses[-1][0] != shard_losses[0][0]


@pytest.mark.parametrize("hook, atol", [("allreduce_hook", 1e-5), ("fp16_compress_hook", 2e-3)])
def test_ddp_comm_hooks(training, hook, atol):
    reference = _reference()
    for rank, result in enumerate(training):
        assert "hook_error" not in result, result.get("hook_error")
        torch.testing.assert_close(torch.tensor(result[f"{hook}_losses"]),
                                   torch.tensor(reference["losses"][rank]), rtol=0, atol=atol)
        for got, want in zip(result[f"{hook}_params"], reference["params"], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=atol)


def test_distributed_checkpoint_round_trip(training):
    for rank, result in enumerate(training):
        assert "dcp_error" not in result, result.get("dcp_error")
        for got, want in zip(result["dcp_params"], result["fsdp_params"], strict=True):
            assert torch.equal(got, want)
        assert result["dcp_local_devices"] == [f"neuron:{rank}"]


def test_tensor_parallel_matches_single_process(training):
    device = torch.device("neuron", 0)
    model = _mlp().to(device)
    X, Y = _train_data()
    prediction = model(X[0].to(device))
    loss = torch.nn.functional.mse_loss(prediction, Y[0].to(device))
    loss.backward()
    grads = [p.grad.cpu() for p in model.parameters()]
    for result in training:
        assert "tp_error" not in result, result.get("tp_error")
        assert result["tp_local_weight_shape"] == (16 // WORLD, 8)
        torch.testing.assert_close(result["tp_prediction"], prediction.detach().cpu(),
                                   rtol=0, atol=1e-5)
        assert abs(result["tp_loss"] - loss.item()) < 1e-5
        for got, want in zip(result["tp_grads"], grads, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_dtensor_on_neuron_mesh(training):
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for rank, result in enumerate(training):
        assert "dtensor_error" not in result, result.get("dtensor_error")
        assert result["dtensor_mesh_device"] == "neuron"
        assert torch.equal(result["dtensor_local"], full[2 * rank:2 * rank + 2])
        assert torch.equal(result["dtensor_full"], full)
        assert torch.equal(result["dtensor_replicated"], full)
        assert torch.equal(result["dtensor_row_to_col"], full[:, 3 * rank:3 * rank + 3])
        assert torch.equal(result["dtensor_col_local"], full[:, 3 * rank:3 * rank + 3])
        torch.testing.assert_close(result["dtensor_matmul"], full @ full.T)
        torch.testing.assert_close(result["dtensor_sum"], full.sum())


def test_failed_rank_makes_others_fail_not_hang(training):
    result = training[0]
    message, elapsed = result["stall"]
    assert message != "no error"
    assert "timed out" in message.lower() or "timeout" in message.lower(), message
    assert 1.5 <= elapsed < 12, (elapsed, message)  # the group's 2 s timeout, not a hang
    message, elapsed = result["death"]
    assert message != "no error"
    assert elapsed < 30, (elapsed, message)  # well before the world group's 60 s timeout


def test_four_ranks_subgroups_all_to_all_and_2d_mesh(tmp_path):
    world = 4
    run = _launch("mesh4", tmp_path, world=world, timeout=150)
    assert not run["timed_out"] and run["codes"] == [0] * world, _tail(run)
    reference = _reference(world)
    full = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    for rank, result in enumerate(run["results"]):
        assert result["current_device"] == rank
        expected = 4.0 if rank in (1, 3) else float(rank)
        assert torch.equal(result["subgroup"], torch.full((3,), expected))
        want = torch.cat([torch.full((_a2a_rows(i, rank), 2), float(10 * i + rank))
                          for i in range(world)])
        assert torch.equal(result["all_to_all"], want)
        dp, tp = divmod(rank, 2)
        assert torch.equal(result["dtensor_local"], full[2 * dp:2 * dp + 2, 4 * tp:4 * tp + 4])
        assert torch.equal(result["dtensor_full"], full)
        assert "hsdp_error" not in result, result.get("hsdp_error")
        torch.testing.assert_close(torch.tensor(result["hsdp_losses"]),
                                   torch.tensor(reference["losses"][rank]), rtol=0, atol=1e-5)
        for got, want in zip(result["hsdp_params"], reference["params"], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_ddp_example_under_torchrun(tmp_path):
    port = _free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), str(EXAMPLE), "--steps", "12"],
        capture_output=True, text=True, env=_base_env(), cwd=ROOT, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    assert "rank 0/2 on neuron:0" in out and "rank 1/2 on neuron:1" in out, out
    assert "parameters identical on all ranks" in out, out
    first, last = (float(v) for v in __import__("re").search(
        r"loss ([0-9.]+) -> ([0-9.]+)", out).groups())
    assert last < 0.5 * first, out


@pytest.mark.parametrize("kind", ["ddp", "fsdp", "fsdp_layers"])
def test_compiled_data_parallel_training_matches_single_process(compiled, kind):
    """torch.compile(backend="neuron") of a DDP / FSDP2 model, and FSDP2 with each
    layer sharded and compiled (forward and backward graphs compiled, collectives
    run eagerly from DDP's and FSDP2's hooks): training still matches the
    single-process reference."""
    reference = _reference()
    for rank, result in enumerate(compiled):
        assert f"{kind}_error" not in result, result.get(f"{kind}_error")
        # The neuron backend really compiled graphs: per layer, each of the three
        # layers has a forward and a backward graph.
        assert result[f"{kind}_graphs"] >= (6 if kind == "fsdp_layers" else 1), result[f"{kind}_graphs"]
        torch.testing.assert_close(torch.tensor(result[f"{kind}_losses"]),
                                   torch.tensor(reference["losses"][rank]), rtol=0, atol=1e-5)
        for got, want in zip(result[f"{kind}_params"], reference["params"], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_functional_collectives_inside_a_fullgraph_compiled_function(compiled):
    """funcol.all_reduce / all_gather_tensor in torch.compile(fullgraph=True): the
    graph is split around the collectives (run eagerly by the neuron backend), the
    pieces between them are compiled."""
    x = [torch.arange(4.0) + r for r in range(WORLD)]
    total = sum(v * 2 for v in x)
    expected = torch.cat([total + 1] * WORLD) * 3
    for rank, result in enumerate(compiled):
        assert "funcol_error" not in result, result.get("funcol_error")
        torch.testing.assert_close(result["funcol_compiled"], expected, rtol=0, atol=0)
        torch.testing.assert_close(result["funcol_eager"], expected, rtol=0, atol=0)
        assert result["funcol_compiles"] >= 2  # compiled pieces on both sides of the collectives


def test_pipeline_parallel_matches_single_process(training):
    """torch.distributed.pipelining: two stages (one rank each), GPipe with two
    microbatches; the last stage's losses and both stages' gradients equal the
    unsplit model's on the same microbatches."""
    model = _mlp()
    X, Y = _train_data()
    losses = []
    for xb, yb in zip(X[0].chunk(2), Y[0].chunk(2)):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        (loss / 2).backward()  # the schedule scales each microbatch's loss by 1/n_microbatches
        losses.append(loss.item())
    grads = [p.grad for p in model.parameters()]
    stage_grads = {0: grads[:2], 1: grads[2:]}
    for rank, result in enumerate(training):
        assert "pp_error" not in result, result.get("pp_error")
        if rank == WORLD - 1:
            assert result["pp_losses"] == pytest.approx(losses, abs=1e-6)
        for got, want in zip(result["pp_grads"], stage_grads[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_two_nodes_on_loopback_with_torchrun_rendezvous(tmp_path):
    """Two torchrun "nodes" (one process each) meet through the c10d rendezvous on localhost."""
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", "neuron-two-nodes", str(EXAMPLE), "--steps", "6"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_base_env(), cwd=ROOT)
        for node in (0, 1)]
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    combined = "\n".join(outputs)
    assert "rank 0/2 on neuron:0" in combined and "rank 1/2 on neuron:0" in combined, combined[-3000:]
    assert "parameters identical on all ranks" in combined, combined[-3000:]


def test_more_ranks_than_cores_is_a_clear_error(monkeypatch):
    from torch_neuronx.distributed import _backend

    cores = torch.neuron.device_count()
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores + 1))
    with pytest.raises(RuntimeError) as info:
        _backend.local_device_index()
    message = str(info.value)
    assert f"{cores + 1} processes" in message and f"only {cores} NeuronCore" in message
    # LOCAL_RANK alone past the last core is the same error.
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("LOCAL_RANK", str(cores))
    with pytest.raises(RuntimeError, match=f"only {cores} NeuronCore"):
        _backend.local_device_index()
    monkeypatch.setenv("LOCAL_RANK", str(cores - 1))
    assert _backend.local_device_index() == cores - 1
    monkeypatch.delenv("LOCAL_RANK")
    assert _backend.local_device_index() is None


def test_init_process_group_reports_too_many_ranks(monkeypatch):
    import torch.distributed as dist

    cores = torch.neuron.device_count()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores + 3))
    with pytest.raises(RuntimeError, match=f"{cores + 3} processes on this node"):
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    assert not dist.is_initialized()


def test_single_process_group_in_process(monkeypatch):
    """world_size=1 in this process: device_id wins over LOCAL_RANK; neuron and CPU tensors."""
    import torch.distributed as dist

    previous = torch.neuron.current_device()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("neuron", 1))
    try:
        assert torch.neuron.current_device() == 1
        t = torch.arange(6.0, device="neuron:1").reshape(2, 3).t()  # non-contiguous
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert torch.equal(t.cpu(), torch.arange(6.0).reshape(2, 3).t())
        out = torch.zeros(3, device="neuron:1")
        dist.all_gather_single(out, torch.tensor([1.0, 2.0, 3.0], device="neuron:1"))
        assert out.tolist() == [1.0, 2.0, 3.0]
        cpu = torch.ones(2)
        dist.all_reduce(cpu)
        assert cpu.tolist() == [1.0, 1.0]
        dist.barrier()
    finally:
        dist.destroy_process_group()
        torch.neuron.set_device(previous)


def test_device_id_as_an_index_binds_the_process(monkeypatch):
    """init_process_group(device_id=i) (an index of the current accelerator) wins over
    LOCAL_RANK too; the recorded device_id is gone once the call returns."""
    import torch.distributed as dist

    from torch_neuronx import distributed

    if torch.neuron.device_count() < 2:
        pytest.skip("needs 2 NeuronCores")
    previous = torch.neuron.current_device()
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1, device_id=1)
    try:
        assert torch.neuron.current_device() == 1
        assert distributed.requested_device() is None
    finally:
        dist.destroy_process_group()
        torch.neuron.set_device(previous)


def test_init_process_group_without_device_id_fails_loudly(monkeypatch):
    """The device_id wrapper relies on init_process_group's public device_id parameter
    and checks for it when installed, naming the PyTorch version."""
    import re

    from torch.distributed import distributed_c10d

    from torch_neuronx import distributed

    monkeypatch.setattr(distributed_c10d, "init_process_group", lambda backend=None, rank=-1: None)
    with pytest.raises(RuntimeError, match=f"no device_id parameter in PyTorch {re.escape(torch.__version__)}"):
        distributed._record_device_id()


def test_backend_is_registered_for_neuron():
    import torch.distributed as dist

    assert "neuron" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["neuron"] == "neuron"
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    assert set(dist.Backend.backend_capability["neuron"]) == {"neuron", "cpu"}


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "worker":
    _worker_main(sys.argv[2], sys.argv[3])
