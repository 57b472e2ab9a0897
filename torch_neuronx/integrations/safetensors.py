"""Patch for safetensors (see docs/huggingface.md).

``safetensors.torch.load_file(path, device=...)`` hands the device name to its
Rust reader, which knows CPU and CUDA-like devices only: ``device="neuron"``
raises "device neuron is invalid". CUDA scripts pass their device there
routinely (PEFT's adapter loading does too). The patch reads on the CPU and
moves the tensors, which is what the reader does itself for devices it knows.
Modules that import ``load_file`` by name later get the patched function.
"""

from __future__ import annotations

from types import ModuleType

import torch

from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once


def _is_neuron(device) -> bool:
    if isinstance(device, int):  # an index means a CUDA-style device to safetensors
        return False
    try:
        return torch.device(device).type == "neuron"
    except (RuntimeError, TypeError):
        return False


@patches("safetensors.torch")
def neuron_load_file(module: ModuleType) -> None:
    def build(original):
        def load_file(filename, device="cpu", **kwargs):
            if not _is_neuron(device):
                return original(filename, device=device, **kwargs)
            loaded = original(filename, device="cpu", **kwargs)
            return {name: tensor.to(device) for name, tensor in loaded.items()}

        return load_file

    patch_once(module, "load_file", build,
               why="load_file(device='neuron') reads on the CPU and moves (the reader rejects neuron)")
