"""accelerate on two NeuronCores: ``accelerate launch --num_processes 2`` runs
this file as a worker (``python test_hf_training_accelerate.py worker OUTDIR``)
in two processes; each writes its results to OUTDIR/rank<r>.pt and the test
compares them.

- train: Accelerator (bf16 mixed precision from the launcher) with a tiny
  next-token model, a DataLoader and AdamW through accelerator.prepare, 4
  steps. Checked: the distributed type is MULTI_NEURON, the c10d backend is
  "neuron", rank r runs on neuron:<r> (its LOCAL_RANK), the model is wrapped
  in DDP, Linear outputs are bf16 (autocast), no op fell back to the CPU, the
  final parameters are bitwise equal on both ranks (and differ from the
  initial ones), and accelerator.gather of a 2-D tensor returns both ranks'
  rows in rank order.
- gather: accelerate gathers into a flat world_size * numel output, which NCCL
  accepts; the neuron backend accepts it too (gloo alone would not), so 1-D and
  2-D tensors gather in rank order with every integration patch disabled.
- One process: an optimizer made before accelerator.prepare (which moves the
  model) trains, because Module.to("neuron") keeps the Parameter objects, as
  on CUDA.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from test_hf_training import run_script  # noqa: E402

import torch_neuronx  # noqa: E402

STEPS = 4
VOCAB = 64


# ----------------------------------------------------------------------------- worker side


class TinyLM(torch.nn.Module):
    """Embedding -> MLP -> vocabulary logits: a next-token model small enough that
    the two processes spend their time in accelerate, not in importing transformers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.hidden = torch.nn.Linear(32, 64)
        self.out = torch.nn.Linear(64, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.nn.functional.gelu(self.hidden(self.embed(ids))))


def tiny_lm() -> TinyLM:
    torch.manual_seed(0)  # the same initial weights on every rank
    return TinyLM()


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def train_worker(outdir: Path) -> None:
    import torch.distributed as dist
    from accelerate import Accelerator

    accelerator = Accelerator()  # everything from `accelerate launch`: 2 processes, bf16
    torch_neuronx.clear_op_tracking()
    # Model on the device before the optimizer is made, as accelerate's examples do
    # (see test_optimizer_made_before_prepare_trains for the other order).
    model = tiny_lm().to(accelerator.device)
    autocast_dtypes = []
    model.hidden.register_forward_hook(lambda module, args, out: autocast_dtypes.append(out.dtype))
    starts = torch.randint(0, VOCAB, (16, 1), generator=torch.Generator().manual_seed(1))
    ids = (starts + torch.arange(17)) % VOCAB  # learnable: next token = token + 1
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    losses, batch_devices = [], set()
    for step, (batch,) in enumerate(loader):
        if step == STEPS:
            break
        batch_devices.add(str(batch.device))
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())

    params = flat_params(accelerator.unwrap_model(model))
    rows = accelerator.unwrap_model(model).hidden.weight.detach()[:4]  # 2-D, like gather_for_metrics(logits)
    gathered = accelerator.gather(rows)
    torch.save({
        "rank": accelerator.process_index, "local_rank": accelerator.local_process_index,
        "local_rank_env": int(os.environ["LOCAL_RANK"]), "world": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type), "backend": dist.get_backend(),
        "mixed_precision": accelerator.mixed_precision, "device": str(accelerator.device),
        "current_device": torch.neuron.current_device(), "wrapper": type(model).__name__,
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
        "batch_devices": sorted(batch_devices), "autocast_dtypes": sorted({str(d) for d in autocast_dtypes}),
        "losses": losses, "params": params, "rows": rows.cpu(), "gathered": gathered.cpu(),
        "gathered_device": str(gathered.device), "fallback": torch_neuronx.get_fallback_ops(),
    }, outdir / f"rank{accelerator.process_index}.pt")
    accelerator.end_training()


def gather_worker(outdir: Path) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator()
    rank = accelerator.process_index
    flat = accelerator.gather(torch.full((3,), float(rank), device=accelerator.device))
    try:
        rows = accelerator.gather(torch.full((2, 3), float(rank), device=accelerator.device)).cpu()
        error = None
    except RuntimeError as exc:
        rows, error = None, str(exc)
    torch.save({"flat": flat.cpu(), "rows": rows, "error": error}, outdir / f"rank{rank}.pt")
    accelerator.end_training()


# ----------------------------------------------------------------------------- test side


def launch(mode: str, outdir: Path, env_extra: dict | None = None) -> list[dict]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outdir.mkdir(parents=True, exist_ok=True)
    env = {"HF_HOME": str(outdir / "hf_home"), **(env_extra or {})}  # no user accelerate config
    run_script(["-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "bf16", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1",
                "--main_process_port", str(port), str(HERE), mode, str(outdir)], env, timeout=240)
    return [torch.load(outdir / f"rank{rank}.pt", weights_only=False) for rank in range(2)]


def test_accelerate_launch_trains_ddp_on_two_neuron_cores(tmp_path):
    results = launch("train", tmp_path)
    for rank, result in enumerate(results):
        assert result["rank"] == result["local_rank"] == result["local_rank_env"] == rank
        assert result["world"] == 2
        assert result["distributed_type"] == "DistributedType.MULTI_NEURON"
        assert result["backend"] == "neuron"
        assert result["device"] == f"neuron:{rank}" and result["current_device"] == rank
        assert result["param_devices"] == result["batch_devices"] == [f"neuron:{rank}"]
        assert result["wrapper"] == "DistributedDataParallel"
        assert result["mixed_precision"] == "bf16" and result["autocast_dtypes"] == ["torch.bfloat16"]
        assert result["fallback"] == {}
        assert len(result["losses"]) == STEPS and all(torch.isfinite(torch.tensor(result["losses"])))
        assert result["gathered_device"] == f"neuron:{rank}"
    first, second = results
    assert first["losses"] != second["losses"]  # different shards of the data
    assert torch.equal(first["params"], second["params"])  # DDP kept the replicas identical
    assert not torch.equal(first["params"], flat_params(tiny_lm()))  # and they trained
    want = torch.cat([first["rows"], second["rows"]])
    assert want.shape == (8, 32)
    for result in results:
        assert torch.equal(result["gathered"], want)


def test_gather_of_1d_and_2d_tensors_without_any_patch(tmp_path):
    results = launch("gather", tmp_path, {"TORCH_NEURONX_DISABLE_INTEGRATIONS": "1"})
    for result in results:
        assert result["error"] is None, result["error"]
        assert torch.equal(result["flat"], torch.tensor([0.0] * 3 + [1.0] * 3))
        assert torch.equal(result["rows"], torch.tensor([[0.0] * 3] * 2 + [[1.0] * 3] * 2))


def test_optimizer_made_before_prepare_trains():
    from accelerate import Accelerator

    accelerator = Accelerator()  # one process
    model = tiny_lm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # the usual order in CUDA scripts
    model, optimizer = accelerator.prepare(model, optimizer)
    assert next(model.parameters()).device.type == "neuron"
    before = flat_params(model)
    ids = torch.arange(8, device=accelerator.device)[None]
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:])
    accelerator.backward(loss)
    optimizer.step()
    assert not torch.equal(flat_params(model), before)


if __name__ == "__main__" and len(sys.argv) == 3:
    {"train": train_worker, "gather": gather_worker}[sys.argv[1]](Path(sys.argv[2]))
