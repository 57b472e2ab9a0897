"""The ``torch.neuron`` module: devices, streams, events, memory and RNG.

Shaped like ``torch.cuda``: short functions over the C++ core, lazy
initialization (the runtime starts at the first device use; seeding before
that is fine because the generators exist from the start).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from torch_neuronx import _C
from torch_neuronx.neuron import profiles
from torch_neuronx.neuron.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from torch_neuronx.neuron.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_neuronx.neuron.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
)

__all__ = [
    "Event", "Stream", "StreamContext", "current_device", "current_stream", "default_generators",
    "default_stream", "device", "device_count", "device_of", "empty_cache", "get_amp_supported_dtype",
    "get_device_capability", "get_device_name", "get_device_properties", "get_dynamo_metrics", "get_rng_state",
    "get_rng_state_all", "init", "initial_seed", "is_available", "is_bf16_supported",
    "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_snapshot", "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_dynamo_metrics", "reset_max_memory_allocated", "reset_peak_memory_stats", "seed", "seed_all",
    "set_device",
    "set_rng_state", "set_rng_state_all", "set_stream", "stream", "synchronize",
]


# The instance profile (under its LNC) and visible cores this process was configured with. Read
# once, here, when torch_neuronx registers the device (it imports this module
# and sizes the runtime from these two values): like the C++ core, the
# properties do not follow later changes to the environment.
_PROFILE = profiles.active_profile()
_VISIBLE_CORES = tuple(profiles.visible_cores(_PROFILE))


def is_available() -> bool:
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def is_initialized() -> bool:
    """True once the runtime started in this process (False in a forked child, as for CUDA)."""
    return _C._is_initialized() and not _C._is_in_bad_fork()


def init() -> None:
    """Starts the runtime now instead of at the first device use."""
    _C._init()


_lazy_init = init


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def _get_device_index(device: Any = None, optional: bool = True) -> int:
    """Resolves None / int / "neuron:1" / torch.device to a core index."""
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, got {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, int):
        return device
    raise TypeError(f"Cannot interpret {device!r} as a neuron device")


def _existing(index: int) -> int:
    """``index`` when that core exists, else AWS's ValueError (set_device, device(),
    get_device_properties), then where the core count comes from."""
    count = device_count()
    if not 0 <= index < count:
        raise ValueError(
            f"Invalid device id: {index}. Valid range is 0 to {count - 1} (this process sees {count} "
            "NeuronCore(s): see TORCH_NEURONX_INSTANCE, NEURON_LOGICAL_NC_CONFIG, "
            "NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES)")
    return index


def current_device() -> int:
    return _C._current_device()


def set_device(device: Any) -> None:
    """Makes ``device`` the current core; a negative index is a no-op (as for CUDA)."""
    index = _get_device_index(device)
    if index >= 0:
        _C._set_device(_existing(index))


class device:
    """Context manager that makes ``device`` the current NeuronCore."""

    def __init__(self, device: Any):
        self.index = -1 if device is None else _get_device_index(device)
        self.previous = -1

    def __enter__(self):
        if self.index >= 0:
            self.previous = _C._exchange_device(_existing(self.index))

    def __exit__(self, *exc):
        if self.index >= 0:
            _C._exchange_device(self.previous)
        return False


class device_of(device):
    """Context manager that makes the core holding ``tensor`` current."""

    def __init__(self, tensor: torch.Tensor):
        super().__init__(tensor.device if tensor.device.type == "neuron" else None)


@dataclass(frozen=True)
class NeuronDeviceProperties:
    name: str
    total_memory: int
    instance: str
    platform: str
    core_generation: str
    physical_core: int  # the core's id on the instance (NEURON_RT_VISIBLE_CORES counts these)
    lnc: int  # physical NeuronCores per logical core (NEURON_LOGICAL_NC_CONFIG)
    multi_processor_count: int = 1
    major: int = 0
    minor: int = 0

    def __repr__(self) -> str:
        return (
            f"NeuronDeviceProperties(name='{self.name}', total_memory="
            f"{self.total_memory // 1024**2}MB, instance='{self.instance}', "
            f"core_generation='{self.core_generation}', physical_core={self.physical_core}, lnc={self.lnc})"
        )


def get_device_properties(device: Any = None) -> NeuronDeviceProperties:
    index = _existing(_get_device_index(device))
    profile = _PROFILE
    physical = _VISIBLE_CORES[index]
    generation = int(profile.core_generation.rsplit("v", 1)[1])
    return NeuronDeviceProperties(
        name=profile.core_generation,
        total_memory=_C._device_capacity(index),
        instance=profile.name,
        platform=profile.platform,
        core_generation=profile.core_generation,
        physical_core=physical,
        lnc=profile.lnc,
        major=generation,
    )


def get_device_name(device: Any = None) -> str:
    """The device's name as TorchNeuron gives it, ``"neuron:<index>"`` (the current core's
    for None); the core's generation is ``get_device_properties(device).name``. As on
    Trainium, only an int or a torch.device is accepted."""
    if device is None or isinstance(device, (int, torch.device)):
        return f"neuron:{_get_device_index(device)}"
    raise ValueError(
        "Incorrect device argument found, expected torch.device or int type, found "
        f"{type(device)} (pass the core's index or torch.device('neuron:<index>'))")


def get_device_capability(device: Any = None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16, torch.float32]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# get_dynamo_metrics / reset_dynamo_metrics (in __all__) read the compiler's records; this
# module sits below the compiler (tests/test_layers.py), so the package root, which sits
# above both, defines them and sets them here at import (torch_neuronx/__init__.py).
