"""Units of finished work the audit detects by itself, so that the cost table
can say what a token costs without --units-per-step:

- the transformers Trainer: tokens per optimizer step, counted from each
  micro-batch's `attention_mask` (its ones: padding is not work) or, without
  one, the elements of `input_ids` (gradient accumulation sums the micro-batches
  of one step);
- `generate` on the neuron device: new tokens (output length minus prompt
  length, times the batch); each call is a step when no optimizer marks steps.

Registered only while the audit records (recorder.Recording.start): the patches
count and call the original, nothing else. They go through the integrations'
import hook, so they apply whether transformers is imported before or after
torch.
"""

from __future__ import annotations

from types import ModuleType

from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once

TRAINER_SOURCE = "transformers Trainer (attention_mask ones, else input_ids elements, per optimizer step)"
GENERATE_SOURCE = "transformers generate (new tokens per call)"


def register() -> None:
    patches("transformers.trainer")(_count_trainer_tokens)
    patches("transformers.generation.utils")(_count_generated_tokens)


def _tokens(inputs) -> int:
    if not hasattr(inputs, "get"):
        return 0
    mask = inputs.get("attention_mask")
    if mask is not None and hasattr(mask, "sum"):
        return int(mask.sum())
    ids = inputs.get("input_ids")
    return int(ids.numel()) if ids is not None and hasattr(ids, "numel") else 0


def _count_trainer_tokens(module: ModuleType) -> None:
    from torch_neuronx.audit import recorder

    def build(training_step):
        def training_step_counting_tokens(self, model, inputs, *args, **kwargs):
            if recorder.ACTIVE is not None:
                recorder.ACTIVE.add_units(_tokens(inputs), "tokens", TRAINER_SOURCE)
            return training_step(self, model, inputs, *args, **kwargs)
        return training_step_counting_tokens

    patch_once(module.Trainer, "training_step", build,
               why="torch-neuronx audit: counts the tokens of each training step (units of work)")


def _count_generated_tokens(module: ModuleType) -> None:
    from torch_neuronx.audit import recorder

    def build(generate):
        def generate_counting_tokens(self, *args, **kwargs):
            output = generate(self, *args, **kwargs)
            if recorder.ACTIVE is not None and getattr(self.device, "type", None) == "neuron":
                prompt = kwargs.get("input_ids", args[0] if args else None)
                sequences = getattr(output, "sequences", output)
                if hasattr(sequences, "shape") and hasattr(prompt, "shape") and sequences.dim() == 2:
                    new = (sequences.shape[-1] - prompt.shape[-1]) * sequences.shape[0]
                    recorder.ACTIVE.add_units(new, "new tokens", GENERATE_SOURCE)
                    recorder.ACTIVE.mark_step("generate")
            return output
        return generate_counting_tokens

    patch_once(module.GenerationMixin, "generate", build,
               why="torch-neuronx audit: counts the new tokens of each generate call (units of work)")
