"""PEFT LoRA and TRL's SFTTrainer on neuron (tiny Llama from a config, random
weights, in-memory data, a word-level tokenizer trained locally), and the
example examples/hf_sft_lora.py.

- LoRA: get_peft_model on the neuron copy of the model, a few AdamW steps;
  losses equal the same steps on a CPU copy within 1e-5 (fp32); the adapter's
  save_pretrained / PeftModel.from_pretrained round trip onto a fresh neuron
  copy of the base gives bitwise identical logits.
- SFTTrainer: pad_to_multiple_of is 128 on neuron (TRL's "auto" rule in
  SFTConfig.__post_init__: ``128 if self.device.type == "neuron"``), every
  batch the model sees is (batch, 128) on neuron:0; in fp32 the losses equal
  the same run on CPU (no padding there) within 1e-5, since padding is masked
  out; with TRL's default bf16 autocast, within 2e-2 of CPU fp32.
- TRL model loading by name under MULTI_NEURON: device_map=None (the patch in
  torch_neuronx/integrations/trl.py; without it TRL asks for "auto", which the
  Trainer refuses in distributed runs), "auto" still in one process.
- The example: 8 steps, loss drops by 10%, fallback report, adapter reloaded
  with identical logits.
"""

from __future__ import annotations

import copy
import math
import re

import torch
from test_hf_training import NEURON0, ROOT, logged_losses, run_script, tiny_llama

import torch_neuronx

EXAMPLE = ROOT / "examples" / "hf_sft_lora.py"
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot today",
             "birds fly over the sea", "we like to read books", "rain falls on the roof"]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(
        special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def lora_config(**overrides):
    from peft import LoraConfig

    kwargs = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                  task_type="CAUSAL_LM", init_lora_weights=False)  # nonzero B: the adapter matters at once
    kwargs.update(overrides)
    return LoraConfig(**kwargs)


def lora_steps(model, device, steps: int = 4):
    """A few AdamW steps of a fresh LoRA adapter; returns (model, input_ids, losses)."""
    from peft import get_peft_model

    torch.manual_seed(1)  # the LoRA initialization
    peft_model = get_peft_model(model.to(device), lora_config())
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(2)).to(device)
    losses = []
    for _ in range(steps):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return peft_model, ids, losses


def test_lora_trains_like_cpu_and_the_adapter_round_trips(tmp_path):
    from peft import PeftModel

    base = tiny_llama()
    pristine = copy.deepcopy(base)
    torch_neuronx.clear_op_tracking()
    trained, ids, neuron_losses = lora_steps(copy.deepcopy(base), "neuron")
    _, _, cpu_losses = lora_steps(copy.deepcopy(base), "cpu")
    assert torch_neuronx.get_fallback_ops() == {}
    torch.testing.assert_close(torch.tensor(neuron_losses), torch.tensor(cpu_losses), rtol=0, atol=1e-5)
    assert neuron_losses[-1] < neuron_losses[0]
    assert {p.device for p in trained.parameters()} == {NEURON0}

    trained.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    reloaded = PeftModel.from_pretrained(pristine.to("neuron"), tmp_path / "adapter")
    assert {p.device for p in reloaded.parameters()} == {NEURON0}
    trained.eval()
    reloaded.eval()
    with torch.no_grad():
        want, got = trained(input_ids=ids).logits, reloaded(input_ids=ids).logits
    assert torch.equal(got, want)
    with torch.no_grad(), reloaded.disable_adapter():
        without_adapter = reloaded(input_ids=ids).logits
    assert not torch.allclose(without_adapter, want)  # the adapter was really loaded


def sft_run(tmp_path, **overrides):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = word_tokenizer()
    model = tiny_llama(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3, logging_steps=1,
                       learning_rate=1e-2, seed=0, report_to=[], save_strategy="no", disable_tqdm=True,
                       **overrides)
    trainer = SFTTrainer(model=model, args=config, train_dataset=Dataset.from_dict({"text": SENTENCES * 2}),
                         processing_class=tokenizer)
    seen = []  # (input_ids shape, device) of every forward
    trainer.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((tuple(kwargs["input_ids"].shape), kwargs["input_ids"].device)),
        with_kwargs=True)
    trainer.train()
    return config, seen, logged_losses(trainer)


def test_sft_trainer_pads_to_128_on_neuron_and_matches_cpu(tmp_path):
    # TRL's defaults on neuron: bf16 autocast, padding to a multiple of 128.
    config, seen, losses = sft_run(tmp_path / "neuron")
    assert config.bf16 and config.pad_to_multiple_of == 128 and config.device == NEURON0
    assert seen == [((4, 128), NEURON0)] * 3
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)

    # fp32 on both: the 128-padding on neuron is masked out, so the losses are the
    # CPU run's (unpadded: the longest sentence, 7 tokens with EOS) within 1e-5.
    cpu_config, cpu_seen, cpu_losses = sft_run(tmp_path / "cpu", use_cpu=True, bf16=False)
    assert cpu_config.pad_to_multiple_of is None
    assert all(shape[1] < 16 for shape, _ in cpu_seen), cpu_seen
    _, fp32_seen, fp32_losses = sft_run(tmp_path / "fp32", bf16=False)
    assert fp32_seen == seen
    torch.testing.assert_close(torch.tensor(fp32_losses), torch.tensor(cpu_losses), rtol=0, atol=1e-5)
    # bf16 autocast against fp32 (8-bit mantissa; the observed difference is ~1e-3).
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=0, atol=2e-2)


class _Architecture:
    """Stands in for a model class: from_pretrained returns the kwargs it got."""

    @staticmethod
    def from_pretrained(model_id, **kwargs):
        return kwargs


def _state(distributed_type: str):
    # All create_model_from_path reads from accelerate's PartialState.
    return type("State", (), {"distributed_type": distributed_type, "device": torch.device("neuron", 0)})


# Unpatched (TORCH_NEURONX_DISABLE_INTEGRATIONS=1): what TRL asks from_pretrained
# for when the run is `accelerate launch` on two NeuronCores.
TRL_GAP_CHECK = """
import sys
import trl.trainer.utils as utils
sys.path.insert(0, {tests!r})
from test_hf_training_peft_trl import _Architecture, _state
utils.PartialState = _state("MULTI_NEURON")
print(repr(utils.create_model_from_path("some/model", _Architecture)["device_map"]))
"""


def test_trl_loads_models_undispatched_in_multi_neuron_runs(monkeypatch):
    import trl.trainer.utils as utils
    from trl.trainer import sft_trainer

    gap = run_script(["-c", TRL_GAP_CHECK.format(tests=str(ROOT / "tests"))],
                     {"TORCH_NEURONX_DISABLE_INTEGRATIONS": "1"})
    assert gap.strip().splitlines()[-1] == "'auto'"  # which the Trainer refuses in distributed runs

    assert sft_trainer.create_model_from_path is utils.create_model_from_path  # the trainers use the patch
    monkeypatch.setattr(utils, "PartialState", _state("MULTI_NEURON"))
    assert utils.create_model_from_path("some/model", _Architecture)["device_map"] is None
    monkeypatch.setattr(utils, "PartialState", _state("NO"))  # one process: TRL's choice stands
    assert utils.create_model_from_path("some/model", _Architecture)["device_map"] == "auto"


def test_example_sft_lora_trains_reports_and_reloads(tmp_path):
    out = run_script([str(EXAMPLE), "--steps", "8", "--output-dir", str(tmp_path)], timeout=300)
    assert re.search(r"^device neuron:0; padded batch \(8, 128\) \(pad_to_multiple_of=128\)$", out, re.M), out
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss ([0-9.]+)$", out, flags=re.M)]
    assert len(losses) == 8, out
    assert losses[-1] < 0.9 * losses[0], out
    assert re.search(r"^loss decreased: ", out, re.M), out
    assert re.search(r"^fallback ops \(ran on CPU copies\): (none|\d+)$", out, re.M), out
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert re.search(r"^reloaded adapter on neuron:0: logits identical \(max \|difference\| 0\.00e\+00\)$",
                     out, re.M), out

