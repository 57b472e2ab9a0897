"""Patches for the transformers ``Trainer`` (see docs/huggingface.md).

``Trainer._save_rng_state`` writes the Python, NumPy and CPU generator states
into each checkpoint's ``rng_state.pth``, plus the state of every accelerator it
knows by name (CUDA, XLA, NPU, HPU, MLU, MUSA); ``_load_rng_state`` restores
them on ``train(resume_from_checkpoint=...)``. Neuron is not among them. Eager
random ops draw from the CPU generator (csrc/Generator.h), which is restored, but
the neuron generators key the random ops compiled graphs draw on the device
(multinomial, poisson, ``x.bernoulli_(probabilities)``): without their state a
resumed run with such ops would draw other numbers than an uninterrupted one.

The patch wraps both methods: after the original writes the file, the neuron
state is added under the key ``"neuron"`` (the layout CUDA uses: the current
core's state alone, or every core's state in distributed runs); after the
original restores the other generators, the neuron state is restored from that
key. Without a neuron device, or when transformers itself already saved a
``"neuron"`` entry, the methods behave exactly as before.
"""

from __future__ import annotations

import os
from types import ModuleType

import torch

from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once

_KEY = "neuron"


def _neuron_available() -> bool:
    return hasattr(torch, "neuron") and torch.neuron.is_available()


def _rng_file(trainer, directory: str) -> str:
    """The file name ``_save_rng_state`` / ``_load_rng_state`` use: one per process
    when the run has several."""
    if trainer.args.world_size <= 1:
        return os.path.join(directory, "rng_state.pth")
    return os.path.join(directory, f"rng_state_{trainer.args.process_index}.pth")


def _is_distributed(module: ModuleType, trainer) -> bool:
    return trainer.args.parallel_mode == module.ParallelMode.DISTRIBUTED


def _read_states(module: ModuleType, path: str) -> dict:
    # The same loader transformers uses for this file (allowlists NumPy's state).
    with module.safe_globals():
        return torch.load(path, weights_only=True)


@patches("transformers.trainer")
def neuron_rng_state_in_checkpoints(module: ModuleType) -> None:
    """Saves and restores the neuron generator state with the other RNG states of a
    Trainer checkpoint, so that resuming reproduces an uninterrupted run."""
    def build_save(save):
        def _save_rng_state(self, output_dir: str) -> None:
            save(self, output_dir)
            if not _neuron_available():
                return
            path = _rng_file(self, output_dir)
            states = _read_states(module, path)
            if _KEY in states:
                return  # transformers saved it itself
            distributed = _is_distributed(module, self)
            states[_KEY] = torch.neuron.get_rng_state_all() if distributed else torch.neuron.get_rng_state()
            torch.save(states, path)

        return _save_rng_state

    def build_load(load):
        def _load_rng_state(self, checkpoint: str | None) -> None:
            load(self, checkpoint)
            if checkpoint is None or not _neuron_available():
                return
            path = _rng_file(self, checkpoint)
            if not os.path.isfile(path):
                return  # the original already logged that reproducibility is not guaranteed
            states = _read_states(module, path)
            if _KEY in states:
                module.set_rng_state_for_device("NEURON", torch.neuron, states, _is_distributed(module, self))

        return _load_rng_state

    why = "Trainer checkpoints save and restore the neuron RNG state, so resuming reproduces a run"
    patch_once(module.Trainer, "_save_rng_state", build_save, why=why)
    patch_once(module.Trainer, "_load_rng_state", build_load, why=why)
