"""Patches for Hugging Face accelerate (see docs/huggingface.md).

accelerate recognizes ``neuron`` for device selection, but three places still
only know CUDA-like devices by name:

- ``get_max_memory()`` finds no accelerator memory on neuron, so
  ``device_map="auto"`` (accelerate or transformers) puts the whole model on CPU;
- ``Accelerator(mixed_precision="fp16")`` refuses neuron, although Trainium
  computes in fp16 and the device supports fp16 autocast;
- ``get_grad_scaler()`` falls back to a CUDA ``GradScaler``, which disables
  itself on a machine without CUDA: fp16 would train without loss scaling.

Each patch calls through to accelerate unchanged unless the neuron device is the
accelerator in use.
"""

from __future__ import annotations

from types import ModuleType

import torch

from torch_neuronx.integrations import neuron_is_the_accelerator as _neuron_is_the_accelerator
from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once


@patches("accelerate.utils.modeling")
def neuron_max_memory(module: ModuleType) -> None:
    """``get_max_memory()`` with no argument also reports the free memory of every
    NeuronCore, under integer keys like CUDA devices (accelerate turns an integer
    into ``neuron:<i>`` when it dispatches, and ``torch.device(i)`` is neuron)."""
    def build(original):
        def get_max_memory(max_memory=None):
            if not _neuron_is_the_accelerator():
                return original(max_memory)
            if max_memory is None:
                neuron = {i: torch.neuron.mem_get_info(i)[0] for i in range(torch.neuron.device_count())}
                found = original(None)
            else:
                # accelerate checks integer keys against the CUDA device count (0 here) and warns
                # "Device 0 is not available" for every core: check them against neuron instead.
                neuron = _neuron_budgets(module, {k: v for k, v in max_memory.items() if isinstance(k, int)})
                found = original({k: v for k, v in max_memory.items() if not isinstance(k, int)})
            if any(isinstance(key, int) for key in found):
                return found  # another accelerator was found: leave accelerate's choice alone
            # Devices first: infer_auto_device_map fills them in key order, CPU last.
            return {**neuron, **found}

        return get_max_memory

    patch_once(module, "get_max_memory", build,
               why="get_max_memory() reports NeuronCore memory, so device_map='auto' places on neuron")


def _neuron_budgets(module: ModuleType, budgets: dict) -> dict:
    """User-given per-core budgets ("10GiB" or bytes), sorted, unknown cores warned about."""
    count = torch.neuron.device_count()
    for index in budgets:
        if not 0 <= index < count:
            module.logger.warning(f"Device {index} is not available, available NeuronCores are {list(range(count))}")
    return {index: module.convert_file_size_to_int(size) if isinstance(size, str) else size
            for index, size in sorted(budgets.items())}


@patches("accelerate.utils.modeling")
def neuron_grad_scaler(module: ModuleType) -> None:
    """``get_grad_scaler()`` returns a scaler for the neuron device instead of a
    CUDA one (which would silently disable itself)."""
    def build(original):
        def get_grad_scaler(distributed_type=None, **kwargs):
            if distributed_type != module.DistributedType.FSDP and _neuron_is_the_accelerator():
                return torch.amp.GradScaler("neuron", **kwargs)
            return original(distributed_type, **kwargs)

        return get_grad_scaler

    patch_once(module, "get_grad_scaler", build,
               why="get_grad_scaler() returns a neuron GradScaler instead of a disabled CUDA one")


# The device types Accelerator.__init__ accepts for fp16, a literal tuple in its code.
_FP16_DEVICE_MARKERS = frozenset({"cuda", "xpu", "npu", "mps"})


@patches("accelerate.accelerator")
def neuron_fp16_mixed_precision(module: ModuleType) -> None:
    """Adds ``"neuron"`` to the tuple of device types that ``Accelerator.__init__``
    accepts for fp16 mixed precision.

    The check is inline code around a literal tuple, with no function to wrap, so
    the patch swaps that one constant of ``__init__``'s code object; everything
    else in ``__init__`` runs unchanged. If a future accelerate no longer has the
    tuple, nothing is changed (tests/test_hf_detection.py then fails loudly)."""
    def build(code):
        consts = tuple(
            const + ("neuron",) if _is_fp16_device_tuple(const) else const for const in code.co_consts
        )
        return code.replace(co_consts=consts) if consts != code.co_consts else code

    patch_once(module.Accelerator.__init__, "__code__", build, wraps=False,
               why="Accelerator(mixed_precision='fp16') accepts the neuron device")


def _is_fp16_device_tuple(const) -> bool:
    return (isinstance(const, tuple) and all(isinstance(item, str) for item in const)
            and _FP16_DEVICE_MARKERS <= set(const) and "neuron" not in const)
