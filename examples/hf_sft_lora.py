"""Supervised fine-tuning with LoRA on a NeuronCore: TRL's SFTTrainer + PEFT.

    python examples/hf_sft_lora.py [--steps 30] [--output-dir DIR]

A plain Hugging Face script: the Trainer picks the neuron device by itself
(``neuron:0``), trains in bf16 autocast, and TRL pads every batch to a multiple
of 128 tokens on neuron so that the compiled shapes stay few. Nothing is
downloaded: the model is a tiny Llama built from a config (random weights) and
the tokenizer a word-level one trained on the dataset's own sentences.

At the end it prints what ran on the CPU fallback (torch_neuronx's report),
saves the LoRA adapter, loads it back onto a fresh copy of the base model and
checks that the reloaded model gives the same logits as the trained one.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing to download
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig, PeftModel  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import torch_neuronx  # noqa: E402  (only for the fallback report)

DEVICE = "neuron"  # "cuda" on a GPU: the only line that names the device

SENTENCES = [
    "the cat sat on the mat", "the dog ran in the park", "a bird sang in the tree",
    "the sun is warm today", "we read a book at night", "rain fell on the old roof",
    "the boat sailed on the sea", "she drank a cup of tea",
]


def make_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on ``texts`` (no download)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def make_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights (seeded)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config)


def print_fallback_report() -> None:
    fallback = torch_neuronx.get_fallback_ops()
    print(f"fallback ops (ran on CPU copies): {len(fallback) if fallback else 'none'}")
    for name, count in sorted(fallback.items(), key=lambda item: -item[1]):
        print(f"  {name}: {count}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--output-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args()
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="hf_sft_lora_")

    tokenizer = make_tokenizer(SENTENCES)
    base = make_model(tokenizer)
    pristine = copy.deepcopy(base)  # LoRA leaves the base weights alone; kept for the reload check
    dataset = Dataset.from_dict({"text": SENTENCES * 4})

    config = SFTConfig(output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=8,
                       learning_rate=1e-2, logging_steps=1, bf16=True, save_strategy="no",
                       report_to=[], disable_tqdm=True, seed=0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=base, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=lora)
    batch = next(iter(trainer.get_train_dataloader()))
    print(f"device {trainer.args.device}; padded batch {tuple(batch['input_ids'].shape)} "
          f"(pad_to_multiple_of={config.pad_to_multiple_of})")

    torch_neuronx.clear_op_tracking()
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    for step, loss in enumerate(losses, start=1):
        print(f"step {step:3d}  loss {loss:.4f}")
    verdict = "decreased" if losses[-1] < losses[0] else "did NOT decrease"
    print(f"loss {verdict}: {losses[0]:.4f} -> {losses[-1]:.4f}")
    print_fallback_report()

    # Save the adapter, load it onto a fresh copy of the base model, compare logits.
    adapter_dir = os.path.join(output_dir, "adapter")
    trainer.model.save_pretrained(adapter_dir)
    reloaded = PeftModel.from_pretrained(pristine.to(DEVICE), adapter_dir).eval()
    trained = trainer.model.eval()
    probe = tokenizer(SENTENCES[:2], return_tensors="pt", padding=True).to(DEVICE)
    # The trained model's forward still runs under the bf16 autocast accelerate
    # wrapped it in (with fp32 outputs): run the reloaded one the same way.
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        want, got = trained(**probe).logits, reloaded(**probe).logits.float()
    difference = (got - want).abs().max().item()
    same = "identical" if torch.equal(got, want) else "DIFFERENT"
    print(f"adapter saved to {adapter_dir} ({sorted(os.listdir(adapter_dir))})")
    print(f"reloaded adapter on {got.device}: logits {same} (max |difference| {difference:.2e})")


if __name__ == "__main__":
    main()
