"""transformers Trainer on neuron: a tiny Llama built from a config (random
weights), trained on an in-memory dataset of token sequences.

- The Trainer picks neuron:0 by itself; bf16=True runs the model under neuron
  autocast (Linear outputs are bf16); gradient accumulation gives the same
  losses as the equivalent larger batch (fp32, within 1e-6).
- The losses match the same run on CPU: fp32 on both within 1e-5 (the eager
  device runs PyTorch's CPU kernels), bf16 autocast on neuron against fp32 on
  CPU within 2e-2 (bf16 keeps 8 bits of mantissa; the observed difference is
  about 1e-3).
- Checkpoint and resume (mid-epoch, dropout > 0): the resumed run logs exactly
  the losses of the uninterrupted one. Eager dropout draws from the CPU
  generator (as TorchNeuron's), which transformers restores, so this holds
  without torch_neuronx/integrations/trainer.py too (a subprocess with
  TORCH_NEURONX_DISABLE_INTEGRATIONS=1); the patch adds the neuron generators'
  state to rng_state.pth (it keys compiled graphs' device draws).
- torch_compile=True: backend "neuron", forward and backward graphs compiled
  (torch_neuronx.get_dynamo_metrics()), losses within 1e-5 of eager.

Also the shared helpers of tests/test_hf_training_*.py. Running this file as a
script (``python test_hf_training.py resume OUTDIR``) runs the resume scenario
and prints its results as JSON.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

import torch_neuronx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128
SEQ = 16
NEURON0 = torch.device("neuron", 0)


# ----------------------------------------------------------------------------- shared helpers


def tiny_llama(attention_dropout: float = 0.0, vocab_size: int = VOCAB, **config):
    """A 2-layer Llama (hidden 32, 4 heads, 2 KV heads), random weights seeded 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attention_dropout=attention_dropout, **config)
    return LlamaForCausalLM(cfg)


class CountingDataset(torch.utils.data.Dataset):
    """Sequences of consecutive token ids (mod VOCAB) from random starts: learnable
    (the next token is the current one plus one), so the loss must drop."""

    def __init__(self, size: int = 32) -> None:
        starts = torch.randint(0, VOCAB, (size, 1), generator=torch.Generator().manual_seed(1))
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def training_args(output_dir, **overrides):
    from transformers import TrainingArguments

    kwargs = dict(output_dir=str(output_dir), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                  max_steps=4, logging_steps=1, learning_rate=1e-2, seed=0, report_to=[],
                  save_strategy="no", disable_tqdm=True, use_cpu=False)
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def train(output_dir, model=None, resume=None, **overrides):
    """Trains ``model`` (default: tiny_llama()) with training_args(**overrides)."""
    from transformers import Trainer

    trainer = Trainer(model=model if model is not None else tiny_llama(),
                      args=training_args(output_dir, **overrides), train_dataset=CountingDataset())
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def run_script(args: list[str], env_extra: dict | None = None, timeout: float = 240) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_")}
    env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


# ----------------------------------------------------------------------------- device, autocast, accumulation


def test_trainer_trains_on_neuron0_with_bf16_autocast_and_accumulation(tmp_path):
    from transformers import Trainer

    torch_neuronx.clear_op_tracking()
    model = tiny_llama()
    seen = []  # (device of the input, dtype of the output) of one Linear, per forward
    model.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda module, args, out: seen.append((args[0].device, out.dtype)))
    args = training_args(tmp_path, bf16=True, max_steps=8)
    trainer = Trainer(model=model, args=args, train_dataset=CountingDataset())

    assert args.device == NEURON0  # chosen by transformers, not by this test
    trainer.train()
    assert {p.device for p in trainer.model.parameters()} == {NEURON0}
    # 8 optimizer steps x 2 accumulated micro-batches, each under bf16 autocast.
    assert seen == [(NEURON0, torch.bfloat16)] * 16
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # autocast, not a cast
    losses = logged_losses(trainer)
    assert len(losses) == 8 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0], losses
    assert torch_neuronx.get_fallback_ops() == {}


def test_gradient_accumulation_matches_the_larger_batch(tmp_path):
    accumulated = logged_losses(train(tmp_path / "a", per_device_train_batch_size=2,
                                      gradient_accumulation_steps=2))
    single = logged_losses(train(tmp_path / "b", per_device_train_batch_size=4, gradient_accumulation_steps=1))
    torch.testing.assert_close(torch.tensor(accumulated), torch.tensor(single), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- against CPU


def test_losses_match_the_same_run_on_cpu(tmp_path):
    cpu = logged_losses(train(tmp_path / "cpu", use_cpu=True))
    neuron = logged_losses(train(tmp_path / "neuron"))
    neuron_bf16 = logged_losses(train(tmp_path / "bf16", bf16=True))
    assert len(cpu) == 4
    torch.testing.assert_close(torch.tensor(neuron), torch.tensor(cpu), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(neuron_bf16), torch.tensor(cpu), rtol=0, atol=2e-2)
    assert neuron_bf16 != neuron  # autocast really changed the arithmetic


# ----------------------------------------------------------------------------- checkpoint and resume


def resume_scenario(outdir: Path) -> dict:
    """6 steps with a checkpoint every 3 (mid-epoch: 4 steps per epoch), then a
    fresh Trainer resumed from checkpoint-3; attention dropout 0.3 on neuron."""
    full = train(outdir / "full", model=tiny_llama(attention_dropout=0.3), bf16=True, max_steps=6,
                 save_strategy="steps", save_steps=3)
    checkpoint = outdir / "full" / "checkpoint-3"
    resumed = train(outdir / "resumed", model=tiny_llama(attention_dropout=0.3), resume=str(checkpoint),
                    bf16=True, max_steps=6, save_strategy="no")
    states = torch.load(checkpoint / "rng_state.pth", weights_only=False)
    return {"full": logged_losses(full), "resumed": logged_losses(resumed), "rng_keys": sorted(states)}


def test_resume_from_checkpoint_reproduces_the_uninterrupted_run(tmp_path):
    fixed = resume_scenario(tmp_path / "fixed")  # in this process: patched by the import hook
    assert "neuron" in fixed["rng_keys"]
    assert len(fixed["full"]) == len(fixed["resumed"]) == 6
    assert fixed["resumed"] == fixed["full"]  # exact: same masks, same arithmetic

    # Without the patch: no "neuron" entry, and still the same losses, since eager
    # dropout masks come from the CPU generator, which transformers restores.
    # The same arithmetic in the child: Adaptive Eager Execution as in this process (its queued
    # optimizer arithmetic differs from unqueued eager's by float32 roundings: docs/eager-and-fallback.md).
    queue = "1" if torch_neuronx._C._concatenation_enabled() else "0"
    gap = json.loads(run_script([__file__, "resume", str(tmp_path / "gap")],
                                {"TORCH_NEURONX_DISABLE_INTEGRATIONS": "1",
                                 "TORCH_NEURONX_ENABLE_CONCATENATION": queue}).splitlines()[-1])
    assert "neuron" not in gap["rng_keys"]
    assert gap["full"] == fixed["full"]
    assert gap["resumed"] == gap["full"]


def test_rng_patch_is_idempotent_and_leaves_other_devices_alone(tmp_path, monkeypatch):
    import transformers.trainer as trainer_module
    from torch_neuronx.integrations import trainer as patch

    saved = trainer_module.Trainer._save_rng_state
    patch.neuron_rng_state_in_checkpoints(trainer_module)
    assert trainer_module.Trainer._save_rng_state is saved

    # No neuron device: the checkpoint has exactly what transformers writes.
    monkeypatch.setattr(patch, "_neuron_available", lambda: False)
    trainer = train(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    states = torch.load(tmp_path / "checkpoint-1" / "rng_state.pth", weights_only=False)
    assert sorted(states) == ["cpu", "numpy", "python"]

    # A checkpoint without a neuron entry (older, or from CPU) leaves the neuron generator alone.
    monkeypatch.undo()
    before = torch.neuron.get_rng_state()
    trainer._load_rng_state(str(tmp_path / "checkpoint-1"))
    assert torch.equal(torch.neuron.get_rng_state(), before)


def test_rng_patch_in_distributed_runs_saves_every_core(tmp_path):
    """Multi-process layout (as for CUDA): rng_state_<process_index>.pth holds the
    states of all cores; resuming restores all of them. Driven through the
    Trainer methods with only the arguments they read."""
    from types import SimpleNamespace

    from transformers import Trainer
    from transformers.training_args import ParallelMode

    fake = SimpleNamespace(args=SimpleNamespace(world_size=2, process_index=1,
                                                parallel_mode=ParallelMode.DISTRIBUTED))
    for core, generator in enumerate(torch.neuron.default_generators):  # a different state on every core
        generator.manual_seed(123 + core)
        generator.set_offset(core)
    want = torch.neuron.get_rng_state_all()
    Trainer._save_rng_state(fake, str(tmp_path))
    states = torch.load(tmp_path / "rng_state_1.pth", weights_only=False)
    assert len(states["neuron"]) == torch.neuron.device_count()

    torch.neuron.manual_seed_all(7)
    Trainer._load_rng_state(fake, str(tmp_path))
    got = torch.neuron.get_rng_state_all()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# ----------------------------------------------------------------------------- torch.compile


def test_torch_compile_uses_the_neuron_backend(tmp_path):
    eager = logged_losses(train(tmp_path / "eager"))
    torch_neuronx.reset_dynamo_metrics()
    trainer = train(tmp_path / "compiled", torch_compile=True)
    assert trainer.args.torch_compile_backend == "neuron"  # transformers' default on neuron
    metrics = torch_neuronx.get_dynamo_metrics()
    assert metrics["forward_graphs"] >= 1 and metrics["backward_graphs"] >= 1, metrics
    assert metrics["compiles"] + metrics["cache_hits_disk"] >= 2, metrics
    assert metrics["graph_breaks"] == 0, metrics
    compiled = logged_losses(trainer)
    assert all(math.isfinite(v) for v in compiled)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=0, atol=1e-5)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "resume":
    print(json.dumps(resume_scenario(Path(sys.argv[2]))))
