"""Patches for Hugging Face TRL (see docs/huggingface.md).

TRL trainers given a model name or path load it with
``trl.trainer.utils.create_model_from_path``, which asks for
``device_map="auto"`` on any accelerator. Multi-process training cannot use a
dispatched model, so each trainer first sets ``device_map=None`` when the run
is ``MULTI_GPU`` or ``DEEPSPEED`` (inline checks in every trainer); ``MULTI_NEURON``
is not in those lists, so under ``accelerate launch`` / ``torchrun`` on neuron
every rank spreads the model over the NeuronCores and the Trainer then refuses
it ("You can't train a model that has been loaded with `device_map='auto'` in
any distributed mode").

The patch wraps ``create_model_from_path``, the one place all trainers (and
their reference models) go through, and applies TRL's own multi-GPU rule for
``MULTI_NEURON``: ``device_map=None``; the Trainer then puts the model on the
process's core. Single-process runs and other distributed types call through
unchanged. The trainers import the function by name from ``trl.trainer.utils``
after this patch has run (it runs as soon as that module finishes executing).
"""

from __future__ import annotations

from types import ModuleType

from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once



@patches("trl.trainer.utils")
def neuron_multi_process_model_loading(module: ModuleType) -> None:
    """``create_model_from_path`` loads with ``device_map=None`` in MULTI_NEURON runs,
    as TRL does for MULTI_GPU."""
    def build(original):
        def create_model_from_path(model_id, architecture=None, **kwargs):
            if module.PartialState().distributed_type == "MULTI_NEURON":
                kwargs["device_map"] = None
            return original(model_id, architecture, **kwargs)

        return create_model_from_path

    patch_once(module, "create_model_from_path", build,
               why="MULTI_NEURON runs load models with device_map=None, as TRL does for MULTI_GPU")
