"""Patches for Hugging Face transformers (see docs/huggingface.md).

transformers 5.x knows neuron: detection, ``TrainingArguments`` device and
compile backend, and the *default* ``CompileConfig`` that ``generate()`` uses
with a static cache all pick neuron. One gap is left: an explicit
``CompileConfig(...)`` (as CUDA scripts write, e.g. ``CompileConfig(fullgraph=True)``)
keeps its default ``backend="inductor"`` and ``mode="reduce-overhead"``, and
Inductor cannot generate code for the neuron device, so ``generate()`` fails
inside Inductor. The patch routes such a config to the neuron backend with the
settings transformers itself uses for neuron (static shapes, default mode),
keeping ``fullgraph``.

Pipelines turn an integer device (``device=0``, what CUDA scripts pass, and also
the default when no device is given) into a device of an accelerator they know
by name (cuda, xpu, npu, ...) and into the CPU otherwise: on neuron the model
silently runs on the CPU, and a model loaded with ``device_map="auto"`` gets its
inputs on the CPU. The patch makes those integers neuron core indices.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch

from torch_neuronx.integrations import neuron_is_the_accelerator as _neuron_is_the_accelerator
from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once


@patches("transformers.modeling_utils")
def neuron_compile_config(module: ModuleType) -> None:
    def build(original):
        def get_compiled_call(self, compile_config):
            if compile_config is not None and compile_config.backend == "inductor" \
                    and self.device.type == "neuron":
                # Inductor options mean nothing to the neuron backend, hence dropped.
                compile_config = dataclasses.replace(
                    compile_config, backend="neuron", mode="default", dynamic=False, options=None)
            return original(self, compile_config)

        return get_compiled_call

    patch_once(module.PreTrainedModel, "get_compiled_call", build,
               why="an explicit CompileConfig (backend='inductor') compiles neuron models with backend='neuron'")


# Position of ``device`` among Pipeline.__init__'s arguments after ``model``.
_PIPELINE_DEVICE_POSITION = 6


@patches("transformers.pipelines.base")
def neuron_pipeline_device(module: ModuleType) -> None:
    def build(original):
        def __init__(self, model, *args, **kwargs):
            neuron = _neuron_is_the_accelerator() and len(args) <= _PIPELINE_DEVICE_POSITION
            device_map = getattr(model, "hf_device_map", None)
            if neuron and device_map is None:
                kwargs["device"] = _as_neuron_core(kwargs.get("device"), model)
            original(self, model, *args, **kwargs)
            if neuron and device_map is not None and self.device.type == "cpu":
                # Placed by accelerate: the pipeline feeds its inputs to the first placed module's core.
                first = next(iter(device_map.values()))
                if isinstance(first, int):
                    self.device = torch.device("neuron", first)

        return __init__

    patch_once(module.Pipeline, "__init__", build,
               why="pipelines turn integer devices into neuron cores instead of the CPU")


def _as_neuron_core(device, model):
    """A non-negative ordinal -> that neuron core; None (the default) -> the model's core if it
    is on neuron already (not moved), else core 0; anything else (-1, "cpu", "neuron:1", a
    torch.device) is left for the pipeline to interpret."""
    if device is None:
        on = getattr(model, "device", None)
        return on if isinstance(on, torch.device) and on.type == "neuron" else torch.device("neuron", 0)
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return torch.device("neuron", device)
    return device
