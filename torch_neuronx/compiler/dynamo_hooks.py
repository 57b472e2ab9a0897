"""Wrappers of two Dynamo internals, installed once per process (install())."""

from __future__ import annotations

from torch_neuronx import patching
from torch_neuronx.compiler import metrics


def _is_neuron(compiler_fn) -> bool:
    """Whether a backend Dynamo holds (wrapped by torch.compile and Dynamo's
    debug wrapper) is this one."""
    from torch._dynamo.eval_frame import innermost_backend

    from torch_neuronx.compiler.backend import neuron_backend

    fn = innermost_backend(compiler_fn)
    return getattr(fn, "compiler_fn", fn) is neuron_backend


def _compiles_for_neuron(backend, frame_locals: dict) -> bool:
    """Whether Dynamo compiles this frame for neuron: with this backend, or with
    torch.compile's default backend on neuron tensors (compiler/default_backend.py)."""
    from torch_neuronx.compiler import default_backend

    return _is_neuron(backend) or (
        default_backend.is_default_inductor(backend) and default_backend.on_neuron(frame_locals.values()))


def install() -> None:
    """Wraps two Dynamo internals, once per process:

    - frame compilation (convert_frame._compile): frames compiled for this
      backend are traced with automatic dynamic shapes off, so a new shape
      recompiles with static sizes. This is per frame, not a process-wide flag:
      another backend's compile (or a `dynamic=False` call, whose config patch
      restores the old value on exit) has left size history for the same code
      object, which would otherwise make the first neuron trace symbolic.
    - the recompile-reason computation, to record the reasons (guard failures)
      for get_dynamo_metrics()["recompile_reasons"]."""
    from torch._dynamo import config, convert_frame

    def build_compile(compile_frame):
        def compile_static(*args, **kwargs):
            backend = kwargs["compiler_fn"] if "compiler_fn" in kwargs else args[5]
            frame_locals = kwargs["locals"] if "locals" in kwargs else args[2]
            if config.automatic_dynamic_shapes and _compiles_for_neuron(backend, frame_locals):
                with config.patch(automatic_dynamic_shapes=False):
                    return compile_frame(*args, **kwargs)
            return compile_frame(*args, **kwargs)

        return compile_static

    def build_reasons(reasons_of):
        def reasons_and_record(cache_entries, frame, backend, *args, **kwargs):
            reasons = reasons_of(cache_entries, frame, backend, *args, **kwargs)
            if _compiles_for_neuron(backend, frame.f_locals):
                code = frame.f_code
                first = reasons[0].splitlines()[0] if reasons else "unknown guard failure"
                metrics.record_recompile(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): {first}")
            return reasons

        return reasons_and_record

    patching.patch_once(convert_frame, "_compile", build_compile,
                        why="frames compiled for neuron are traced with automatic dynamic shapes off")
    patching.patch_once(convert_frame, "get_and_maybe_log_recompilation_reasons", build_reasons,
                        why="records recompile reasons for torch_neuronx.get_dynamo_metrics()")
