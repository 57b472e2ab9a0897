"""RNG of the neuron device, as TorchNeuron's: one default generator per core,
whose state is 16 bytes (an 8-byte seed, then an 8-byte offset). Eager random
ops draw from the CPU's default generator (csrc/Generator.h), so seeded code
gives the CPU's numbers; the neuron generators key what is drawn on the device
(random ops a compiled graph computes, ops given an explicit neuron generator).
``torch.manual_seed`` seeds these too (through ``manual_seed_all``), as it does
CUDA's."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from torch_neuronx import _C


class _DefaultGenerators:
    """``torch.neuron.default_generators``: indexable like CUDA's tuple."""

    def __getitem__(self, index: int) -> torch.Generator:
        if not 0 <= index < _C._device_count():
            raise IndexError(f"neuron:{index} does not exist")
        return _C._default_generator(index)

    def __len__(self) -> int:
        return _C._device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()

# The functions below that read or change a generator. torch.compile runs them
# eagerly behind a graph break, as Dynamo does for torch.cuda's (installed when
# torch._dynamo is imported: torch_neuronx/compiler/dynamo.py).
STATE_FUNCTIONS = (
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
)


def _index(device: Any) -> int:
    from torch_neuronx.neuron import _get_device_index

    return _get_device_index(device)


def manual_seed(seed: int) -> None:
    default_generators[_index(None)].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for generator in default_generators:
        generator.manual_seed(int(seed))


def seed() -> None:
    default_generators[_index(None)].seed()


def seed_all() -> None:
    first = default_generators[0]
    first.seed()
    for generator in list(default_generators)[1:]:
        generator.manual_seed(first.initial_seed())


def initial_seed() -> int:
    return default_generators[_index(None)].initial_seed()


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    return default_generators[_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    default_generators[_index(device)].set_state(new_state.clone())


def get_rng_state_all() -> list[torch.Tensor]:
    return [generator.get_state() for generator in default_generators]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for generator, state in zip(default_generators, new_states):
        generator.set_state(state.clone())
