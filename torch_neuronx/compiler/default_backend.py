"""torch.compile(model) with no backend, on the neuron device.

A CUDA script compiles with `torch.compile(model)`: the default backend,
Inductor, which has no code generator for the neuron device (it fails with
"InductorError: KeyError: 'neuron'"). The neuron device has one compiler, so a
graph whose inputs live on neuron is handed to the neuron backend instead, with
one warning per process; graphs on other devices still go to Inductor.

Installed when torch_neuronx is imported: it replaces
torch._TorchCompileInductorWrapper.__call__ (what torch.compile calls for
backend="inductor"), which costs nothing until a graph is compiled.
"""

from __future__ import annotations

import warnings

import torch

from torch_neuronx import patching

_warned = [False]


def on_neuron(values) -> bool:
    """Whether any tensor among values (or a module's first parameter or
    buffer) lives on the neuron device."""
    for value in values:
        if isinstance(value, torch.nn.Module):
            value = next(iter(value.parameters()), None)
            value = next(iter(value.buffers()), None) if value is None else value
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return True
    return False


def is_default_inductor(compiler_fn) -> bool:
    """Whether a backend Dynamo holds is torch.compile's default (Inductor)."""
    from torch._dynamo.eval_frame import innermost_backend

    return isinstance(innermost_backend(compiler_fn), torch._TorchCompileInductorWrapper)


def _warn_once() -> None:
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(
            "torch.compile: Inductor (the default backend) cannot generate code for the neuron "
            "device, so graphs on neuron are compiled with backend='neuron'; Inductor's mode and "
            "options do not apply to them. Pass backend='neuron' to choose it explicitly.",
            stacklevel=3,
        )


def install() -> None:
    def build(inductor_call):
        def __call__(self, model_, inputs_, **kwargs):
            if not on_neuron(inputs_):
                return inductor_call(self, model_, inputs_, **kwargs)
            from torch_neuronx.compiler import neuron_backend

            _warn_once()
            return neuron_backend(model_, inputs_)

        return __call__

    patching.patch_once(
        torch._TorchCompileInductorWrapper, "__call__", build,
        why="torch.compile's default backend (Inductor) cannot generate code for neuron: graphs "
            "with neuron inputs go to the neuron backend")
