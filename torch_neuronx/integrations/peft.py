"""Patches for Hugging Face PEFT (see docs/huggingface.md).

``peft.utils.other.infer_device()`` names cuda, mps, mlu, xpu and npu but not
neuron, so on neuron it answers ``"cpu"``: adapters loaded with
``PeftModel.from_pretrained`` / ``load_adapter`` are read onto the CPU first and
hotswapping picks the wrong device. The patch answers ``"neuron"`` when neuron
is the accelerator and accelerate's answer would be the CPU.

The modules that do ``from peft.utils.other import infer_device`` import it
after this patch has run (it runs as soon as ``peft.utils.other`` finishes
executing), so they all get the patched function.

Loading an adapter onto neuron then relies on the safetensors patch
(integrations/safetensors.py): ``load_peft_weights`` hands the device to
safetensors' ``load_file``, whose reader alone rejects "neuron".
"""

from __future__ import annotations

from types import ModuleType

from torch_neuronx.integrations import neuron_is_the_accelerator as _neuron_is_the_accelerator
from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once


@patches("peft.utils.other")
def neuron_infer_device(module: ModuleType) -> None:
    def build(original):
        def infer_device() -> str:
            found = original()
            if found == "cpu" and _neuron_is_the_accelerator():
                return "neuron"
            return found

        return infer_device

    patch_once(module, "infer_device", build,
               why="infer_device() answers 'neuron' (not 'cpu') when neuron is the accelerator")
