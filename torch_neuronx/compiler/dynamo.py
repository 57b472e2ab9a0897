"""Every change torch_neuronx makes to Dynamo, in one module, applied at one
moment: right after ``torch._dynamo`` is imported (or at once when it already
is), through the import hook of torch_neuronx.integrations. Not earlier:
importing Dynamo costs about a second, which ``import torch`` must not pay.
Not later: each patch must be in place before Dynamo compiles its first frame,
whichever backend that frame is compiled for. The replacing itself is
torch_neuronx.patching's (once, recorded with its reason). These patches are
the backend's own, so TORCH_NEURONX_DISABLE_INTEGRATIONS (third-party
libraries) leaves them on.

The patches, and why each exists:

- ``convert_frame._compile``: frames compiled for neuron are traced with
  automatic dynamic shapes off, so a new shape recompiles with static sizes
  (one executable per shape; the backend refuses symbolic sizes). Per frame,
  not a process-wide flag: another backend's compile (or a ``dynamic=False``
  call, whose config patch restores the old value on exit) may have left size
  history for the same code object, which would make the first neuron trace
  symbolic.
- ``convert_frame.get_and_maybe_log_recompilation_reasons``: records the
  reasons (guard failures) of neuron recompiles for
  ``get_dynamo_metrics()["recompile_reasons"]``; PyTorch only logs them.
- ``torch._TorchCompileInductorWrapper.__call__`` (what ``torch.compile(model)``
  calls for its default backend, Inductor): Inductor has no code generator for
  the neuron device ("InductorError: KeyError: 'neuron'"), so a graph whose
  inputs live on neuron goes to the neuron backend, with one warning per
  process; graphs on other devices still go to Inductor. A CUDA script's plain
  ``torch.compile(model)`` thus runs unchanged.
- ``torch.neuron``'s RNG state functions (``neuron/random.py``
  STATE_FUNCTIONS): Dynamo's trace rules skip ``torch.cuda``'s (a graph break,
  the call runs eagerly) because reading or setting a generator is no ATen op,
  but they name CUDA's only. Traced, ``get_rng_state`` became a fake tensor and
  ``set_rng_state`` received one ("RNG state must be a torch.ByteTensor", or a
  no_dispatch assertion in fake-tensor conversion, e.g. under
  ``torch.random.fork_rng(device_type="neuron")``). Each becomes
  ``torch.compiler.disable(fn)``: a graph break, and under fullgraph=True
  Dynamo's "Skip calling torch.compiler.disable()d function" error (CUDA's:
  "Attempted to call function marked as skipped"). The names are replaced, so
  a reference taken before Dynamo's import keeps the plain function;
  ``torch.neuron.<name>`` and ``torch.get_device_module("neuron").<name>``
  (what ``fork_rng`` uses) are looked up at each call.
"""

from __future__ import annotations

import warnings
from types import ModuleType

import torch

from torch_neuronx import neuron
from torch_neuronx.compiler import metrics
from torch_neuronx.compiler.backend import neuron_backend
from torch_neuronx.integrations import patches
from torch_neuronx.neuron import random
from torch_neuronx.patching import patch_once

_warned = [False]  # the default backend's warning, once per process
_RNG_REASON = "it reads or sets a neuron RNG generator, which is no graph op (as torch.cuda's RNG API)"


# ------------------------------------------------------------------ which frames are neuron's


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


def _is_neuron(compiler_fn) -> bool:
    """Whether a backend Dynamo holds (wrapped by torch.compile and Dynamo's
    debug wrapper) is this one."""
    from torch._dynamo.eval_frame import innermost_backend

    fn = innermost_backend(compiler_fn)
    return getattr(fn, "compiler_fn", fn) is neuron_backend


def _is_default_inductor(compiler_fn) -> bool:
    """Whether a backend Dynamo holds is torch.compile's default (Inductor)."""
    from torch._dynamo.eval_frame import innermost_backend

    return isinstance(innermost_backend(compiler_fn), torch._TorchCompileInductorWrapper)


def _compiles_for_neuron(compiler_fn, frame_locals: dict) -> bool:
    """Whether Dynamo compiles this frame for neuron: with this backend, or with
    torch.compile's default backend on neuron tensors (routed here below)."""
    return _is_neuron(compiler_fn) or (_is_default_inductor(compiler_fn) and on_neuron(frame_locals.values()))


# ------------------------------------------------------------------ the replacements


def _static_shapes_for_neuron(compile_frame):
    # The parameters carry the names of convert_frame._compile's (callers pass
    # some by keyword), so the frame's locals and backend are read by name.
    def compile_static(code, globals, locals, builtins, closure, compiler_fn, *args, **kwargs):  # noqa: A002
        from torch._dynamo import config

        call = (code, globals, locals, builtins, closure, compiler_fn, *args)
        if config.automatic_dynamic_shapes and _compiles_for_neuron(compiler_fn, locals):
            with config.patch(automatic_dynamic_shapes=False):
                return compile_frame(*call, **kwargs)
        return compile_frame(*call, **kwargs)

    return compile_static


def _recording_reasons(reasons_of):
    def reasons_and_record(cache_entries, frame, backend, *args, **kwargs):
        reasons = reasons_of(cache_entries, frame, backend, *args, **kwargs)
        if _compiles_for_neuron(backend, frame.f_locals):
            code = frame.f_code
            first = reasons[0].splitlines()[0] if reasons else "unknown guard failure"
            metrics.record_recompile(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): {first}")
        return reasons

    return reasons_and_record


def _warn_once() -> None:
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(
            "torch.compile: Inductor (the default backend) cannot generate code for the neuron "
            "device, so graphs on neuron are compiled with backend='neuron'; Inductor's mode and "
            "options do not apply to them. Pass backend='neuron' to choose it explicitly.",
            stacklevel=3,
        )


def _neuron_graphs_to_neuron(inductor_call):
    def __call__(self, model_, inputs_, **kwargs):
        if not on_neuron(inputs_):
            return inductor_call(self, model_, inputs_, **kwargs)
        _warn_once()
        return neuron_backend(model_, inputs_)

    return __call__


def _graph_break(rng_function):
    return torch.compiler.disable(rng_function, reason=_RNG_REASON)


# ------------------------------------------------------------------ the one trigger


@patches("torch._dynamo")
def install(module: ModuleType | None = None) -> None:
    """Applies every Dynamo patch (see the module's docstring); applying them
    again changes nothing."""
    from torch._dynamo import convert_frame

    patch_once(convert_frame, "_compile", _static_shapes_for_neuron,
               why="frames compiled for neuron are traced with automatic dynamic shapes off")
    patch_once(convert_frame, "get_and_maybe_log_recompilation_reasons", _recording_reasons,
               why="records recompile reasons for torch_neuronx.get_dynamo_metrics()")
    patch_once(torch._TorchCompileInductorWrapper, "__call__", _neuron_graphs_to_neuron,
               why="torch.compile's default backend (Inductor) cannot generate code for neuron: graphs "
                   "with neuron inputs go to the neuron backend")
    for name in random.STATE_FUNCTIONS:
        for owner in (random, neuron):  # torch.neuron (torch_neuronx.neuron) re-exports them
            patch_once(owner, name, _graph_break,
                       why="Dynamo graph-breaks on torch.neuron's RNG state functions, as on torch.cuda's")
