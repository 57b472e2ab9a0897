"""Patches for Hugging Face PEFT (see docs/huggingface.md).

``peft.utils.other.infer_device()`` names cuda, mps, mlu, xpu and npu but not
neuron, so on neuron it answers ``"cpu"``: adapters loaded with
``PeftModel.from_pretrained`` / ``load_adapter`` are read onto the CPU first and
hotswapping picks the wrong device. The patch answers ``"neuron"`` when neuron
is the accelerator and accelerate's answer would be the CPU.

The modules that do ``from peft.utils.other import infer_device`` import it
after this patch has run (it runs as soon as ``peft.utils.other`` finishes
executing), so they all get the patched function.

Loading an adapter onto neuron then needs a second patch: ``load_peft_weights``
hands the device to safetensors' ``load_file``, whose reader only knows
CUDA-like device names and raises "device neuron is invalid".
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from torch_neuronx.integrations import patches
from torch_neuronx.integrations.accelerate import _already_patched, _mark, _neuron_is_the_accelerator


@patches("peft.utils.other")
def neuron_infer_device(module: ModuleType) -> None:
    original = module.infer_device
    if _already_patched(original):
        return

    @functools.wraps(original)
    def infer_device() -> str:
        found = original()
        if found == "cpu" and _neuron_is_the_accelerator():
            return "neuron"
        return found

    module.infer_device = _mark(infer_device)


@patches("peft.utils.save_and_load")
def neuron_adapter_weights_load(module: ModuleType) -> None:
    """``load_peft_weights(..., device=neuron)`` reads the safetensors file on the
    CPU and copies the tensors to the device (what safetensors does itself for
    devices it knows)."""
    original = module.safe_load_file
    if _already_patched(original):
        return

    @functools.wraps(original)
    def safe_load_file(filename, device="cpu", **kwargs):
        if torch.device(device).type != "neuron":
            return original(filename, device=device, **kwargs)
        on_cpu = original(filename, device="cpu", **kwargs)
        return {name: tensor.to(device) for name, tensor in on_cpu.items()}

    module.safe_load_file = _mark(safe_load_file)
