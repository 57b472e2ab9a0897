"""torch_neuronx.utils: the helpers TorchNeuron's ``torch_neuronx.utils`` offers that scripts
and test utilities written for it call (which ops the device registers, the launch mode,
the logical-core setting, dtype mapping, device of a tensor structure).

Only the names with a meaning on this emulator are here; AWS's helpers for its
compiler's caches and its MLIR/StableHLO switches are not (docs/eager-and-fallback.md,
"torch_neuronx.utils").
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "flatten_tensors", "get_device_from_tensors", "get_logical_neuron_cores", "get_neuron_registered_ops",
    "is_sync_mode_enabled", "map_external_dtype_to_torch", "use_mlir_aten_ops",
]


def flatten_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of a tensor, or of nested lists/tuples of them, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in flatten_tensors(item)]
    return []


def get_device_from_tensors(tensors: Any) -> torch.device:
    """The device of the first tensor in ``tensors`` (nested lists/tuples too), or the
    current neuron device when there is none."""
    found = flatten_tensors(tensors)
    if found:
        return found[0].device
    return torch.device("neuron", torch.neuron.current_device())


def is_sync_mode_enabled() -> bool:
    """Whether NEURON_LAUNCH_BLOCKING=1 asked for synchronous launches. The emulator runs every
    op synchronously either way (docs/env-vars.md)."""
    from torch_neuronx import config

    return bool(config.launch_blocking())


def use_mlir_aten_ops() -> bool:
    """True: TorchNeuron lowers eager ops through torch-mlir by default
    (TORCH_NEURONX_MLIR_ATEN_OPS=1, PyTorch's error types and wording), and that is
    the path the emulator models; its older XLA path (`0`) is not emulated
    (docs/env-vars.md)."""
    return True


def get_logical_neuron_cores() -> str:
    """The Logical NeuronCore setting in force, as AWS's helper gives it ("1" or "2"):
    NEURON_LOGICAL_NC_CONFIG, else the instance profile's default."""
    from torch_neuronx import neuron

    return str(neuron._PROFILE.lnc)


def get_neuron_registered_ops(as_sorted: bool = False, keep_variant: bool = False) -> set[str] | list[str]:
    """The ATen ops with a kernel registered for the neuron device: base names ("add"), or with
    ``keep_variant`` the overloads ("add.Tensor"); a sorted list with ``as_sorted``."""
    names = set()
    for registration in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"):
        namespace, _, op = registration.partition("::")
        if namespace == "aten" and op:
            names.add(op if keep_variant else op.split(".")[0])
    return sorted(names) if as_sorted else names


def map_external_dtype_to_torch(dtype: Any) -> torch.dtype:
    """The torch dtype of an NKI or NumPy dtype (``nl.bfloat16``, ``np.float32``, "float16", ...);
    a torch dtype is returned as it is."""
    if isinstance(dtype, torch.dtype):
        return dtype
    from torch_neuronx.lowering import conversions

    name = getattr(dtype, "name", None)
    if name == "tfloat32":  # NKI's matmul input type: stored as float32
        return torch.float32
    try:
        return conversions.torch_dtype(dtype)
    except (KeyError, TypeError) as error:
        raise TypeError(f"map_external_dtype_to_torch: no torch dtype for {dtype!r}") from error
