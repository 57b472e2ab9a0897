"""Units of finished work the audit detects by itself, so that the cost table
can say what a token costs without --units-per-step:

- the transformers Trainer: tokens per optimizer step, counted from each
  micro-batch's `attention_mask` (its ones: padding is not work) or, without
  one, the elements of `input_ids` (gradient accumulation sums the micro-batches
  of one step);
- `generate` on the neuron device: new tokens (output length minus prompt
  length, times the batch); each call is a step when no optimizer marks steps,
  and a phase of its own ("generate") when one does (sampling after training);
- the Trainer's `evaluate` and `predict`: phases (recorder.Recording.phase),
  never training steps, with the tokens of their batches as their unit.

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
EVALUATE_SOURCE = "transformers Trainer (attention_mask ones, else input_ids elements, per batch)"
PHASES = {"evaluate": "HF Trainer evaluate", "predict": "HF Trainer predict",
          "generate": "generate after training"}


def register() -> None:
    patches("transformers.trainer")(_count_trainer_tokens)
    patches("transformers.trainer")(_evaluation_phases)
    patches("transformers.generation.utils")(_count_generated_tokens)


def _tokens(inputs) -> int:
    from torch_neuronx.audit.recorder import unrecorded

    if not hasattr(inputs, "get"):
        return 0
    mask = inputs.get("attention_mask")
    if mask is not None and hasattr(mask, "sum"):
        with unrecorded():  # the audit's read of a device value, not the program's host sync
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

    def count(recording, args, kwargs, output) -> None:
        prompt = kwargs.get("input_ids", args[0] if args else None)
        sequences = getattr(output, "sequences", output)
        if hasattr(sequences, "shape") and hasattr(prompt, "shape") and sequences.dim() == 2:
            recording.add_units((sequences.shape[-1] - prompt.shape[-1]) * sequences.shape[0],
                                "new tokens", GENERATE_SOURCE)

    def build(generate):
        def generate_counting_tokens(self, *args, **kwargs):
            recording = recorder.ACTIVE
            if recording is None or getattr(self.device, "type", None) != "neuron":
                return generate(self, *args, **kwargs)
            if recording.step_source not in (None, "generate"):  # training marks the steps
                with recording.phase("generate", PHASES["generate"], GENERATE_SOURCE):
                    output = generate(self, *args, **kwargs)
                    count(recording, args, kwargs, output)
                return output
            output = generate(self, *args, **kwargs)
            count(recording, args, kwargs, output)
            recording.mark_step("generate")
            return output
        return generate_counting_tokens

    patch_once(module.GenerationMixin, "generate", build,
               why="torch-neuronx audit: counts the new tokens of each generate call (units of work)")


def _evaluation_phases(module: ModuleType) -> None:
    """Trainer.evaluate and .predict run as phases (with eval_strategy="steps", between
    training steps); prediction_step counts their batches' tokens."""
    from torch_neuronx.audit import recorder

    def as_phase(name):
        def build(method):
            def method_as_phase(self, *args, **kwargs):
                if recorder.ACTIVE is None:
                    return method(self, *args, **kwargs)
                with recorder.ACTIVE.phase(name, PHASES[name], f"transformers Trainer.{name}"):
                    return method(self, *args, **kwargs)
            return method_as_phase
        return build

    def count_tokens(prediction_step):
        def prediction_step_counting_tokens(self, model, inputs, *args, **kwargs):
            if recorder.ACTIVE is not None and recorder.ACTIVE.in_phase:
                recorder.ACTIVE.add_units(_tokens(inputs), "tokens", EVALUATE_SOURCE)
            return prediction_step(self, model, inputs, *args, **kwargs)
        return prediction_step_counting_tokens

    for name in ("evaluate", "predict"):
        patch_once(module.Trainer, name, as_phase(name),
                   why=f"torch-neuronx audit: Trainer.{name} is a phase of its own, not a training step")
    patch_once(module.Trainer, "prediction_step", count_tokens,
               why="torch-neuronx audit: counts the tokens of each evaluation batch (units of work)")
