"""torch.compile(backend="neuron"): Dynamo -> AOTAutograd (forward and backward
graphs) -> decomposition to Core ATen -> StableHLO via the lowering table ->
XLA executable -> run with DLPack inputs/outputs. No Inductor.

The backend is found by name through the ``torch_dynamo_backends`` entry point,
so importing torch does not import JAX or Dynamo.
"""

from __future__ import annotations

import collections.abc
import functools
import os
import sys
import warnings

import torch

from torch_neuronx.compiler import metrics
from torch_neuronx.compiler.errors import NeuronCompileError

__all__ = ["NeuronCompileError", "get_dynamo_metrics", "neuron_backend", "reset_dynamo_metrics"]

_warned_modes: set[str] = set()


def _fallback_execution_disabled() -> bool:
    return os.environ.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "1").strip() not in ("0", "false", "False")


def _check_inputs(example_inputs) -> None:
    for value in example_inputs:
        if isinstance(value, torch.SymInt) or (
            isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)
        ):
            raise NeuronCompileError(
                "torch.compile(backend='neuron') does not support dynamic shapes (dynamic=True or "
                "mark_dynamic): Neuron compiles one executable per input shape. Remove dynamic=True; "
                "each new shape is compiled once and cached."
            )


def _raise(error: Exception, args) -> None:
    raise error


def _compiler(kind: str):
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        from torch_neuronx.compiler.graph import BoxedOutput, compile_graph, unlowered_ops

        from torch_neuronx.compiler.partition import is_custom_op, split_around_custom_ops

        metrics.record_graph(kind)
        if any(is_custom_op(node) for node in gm.graph.nodes):
            split = split_around_custom_ops(gm, lambda piece: compile_fn(piece, None))
            return BoxedOutput(lambda args: split.forward(*args))
        missing = unlowered_ops(gm)
        if missing:
            listing = "\n".join(f"  {m.op}  at {m.source}" for m in missing)
            if _fallback_execution_disabled():
                error = NeuronCompileError(_unlowered_message(kind, missing, listing))
                if kind == "backward":
                    # Raised when the backward runs: with the AOTAutograd result
                    # cache on, backward graphs arrive with the forward one, and a
                    # forward whose backward never runs (evaluation without
                    # no_grad) must keep working.
                    return BoxedOutput(functools.partial(_raise, error))
                raise error
            warnings.warn(
                f"torch_neuronx: running the {kind} graph eagerly (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0) "
                f"because these ops have no lowering:\n{listing}"
            )
            return BoxedOutput(lambda args: gm.forward(*args))
        return compile_graph(gm, example_inputs, kind)

    return compile_fn


def _unlowered_message(kind: str, missing, listing: str) -> str:
    hints = "".join(f"\n{_UNLOWERED_HINTS[op]}" for op in dict.fromkeys(m.op for m in missing)
                    if op in _UNLOWERED_HINTS)
    dependent = [m for m in missing if m.value_dependent]
    if dependent:  # one cause users meet under fullgraph=True, with its own remedies
        lines = "\n".join(f"  {m.op}  at {m.source}" for m in dependent)
        return (
            f"torch.compile(backend='neuron'): the {kind} graph depends on tensor values at:\n{lines}{hints}\n"
            "Neuron compiles static-shape graphs: a value read on the host (.item(), .tolist(), "
            "int(tensor)) or an op whose output shape depends on the values (nonzero, boolean-mask "
            "indexing x[mask], masked_select, unique, bincount) cannot be part of one. Compile with "
            "fullgraph=False (Dynamo then breaks the graph there and runs that part eagerly), rewrite "
            "with static shapes (torch.where(mask, x, 0) instead of x[mask]), move it out of the "
            "compiled region, or set TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 to run such graphs eagerly."
            + ("" if len(dependent) == len(missing) else f"\nAll ops without a StableHLO lowering:\n{listing}")
        )
    return (
        f"torch.compile(backend='neuron'): {len(missing)} op(s) in the {kind} graph have no "
        f"StableHLO lowering:\n{listing}{hints}\nRewrite the code to avoid them, or set "
        "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 to run such graphs eagerly."
    )


# Why an op cannot be lowered, where the reason is not the op being missing from the table.
_UNLOWERED_HINTS = {
    "while_loop_stack_output": (
        "while_loop_stack_output is torch while_loop under autograd: its backward needs the values of "
        "every iteration, and their number depends on tensor values, which a static-shape graph cannot "
        "hold. Run the loop under torch.no_grad(), or write it as torch scan over a fixed number of steps."
    ),
}


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """The decompositions AOTAutograd applies before lowering (Core ATen's); the
    registry invariant test checks every native op it decomposes.

    Built once per process: core_aten_decompositions() scans every operator
    namespace for CompositeImplicitAutograd ops (~0.25 s), which would
    otherwise be paid again by every graph Dynamo hands to the backend."""
    from torch._decomp import core_aten_decompositions

    return dict(core_aten_decompositions().items())


class _Decompositions(collections.abc.Mapping):
    """decomposition_table(), built on first use: AOTAutogradCache hits
    (compiler/aot_cache.py) never read it."""

    def __getitem__(self, op):
        return decomposition_table()[op]

    def __iter__(self):
        return iter(decomposition_table())

    def __len__(self):
        return len(decomposition_table())


def _is_neuron(compiler_fn) -> bool:
    """Whether a backend Dynamo holds (wrapped by torch.compile and Dynamo's
    debug wrapper) is this one."""
    from torch._dynamo.eval_frame import innermost_backend

    fn = innermost_backend(compiler_fn)
    return getattr(fn, "compiler_fn", fn) is neuron_backend


def _compiles_for_neuron(backend, frame_locals: dict) -> bool:
    """Whether Dynamo compiles this frame for neuron: with this backend, or with
    torch.compile's default backend on neuron tensors (compiler/default_backend.py)."""
    from torch_neuronx.compiler import default_backend

    return _is_neuron(backend) or (
        default_backend.is_default_inductor(backend) and default_backend.on_neuron(frame_locals.values()))


def _install_dynamo_hooks() -> None:
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

    compile_frame = convert_frame._compile
    if getattr(compile_frame, "_neuron_hook", False):
        return

    def compile_static(*args, **kwargs):
        backend = kwargs["compiler_fn"] if "compiler_fn" in kwargs else args[5]
        frame_locals = kwargs["locals"] if "locals" in kwargs else args[2]
        if config.automatic_dynamic_shapes and _compiles_for_neuron(backend, frame_locals):
            with config.patch(automatic_dynamic_shapes=False):
                return compile_frame(*args, **kwargs)
        return compile_frame(*args, **kwargs)

    reasons_of = convert_frame.get_and_maybe_log_recompilation_reasons

    def reasons_and_record(cache_entries, frame, backend, *args, **kwargs):
        reasons = reasons_of(cache_entries, frame, backend, *args, **kwargs)
        if _compiles_for_neuron(backend, frame.f_locals):
            code = frame.f_code
            first = reasons[0].splitlines()[0] if reasons else "unknown guard failure"
            metrics.record_recompile(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): {first}")
        return reasons

    compile_static._neuron_hook = True
    convert_frame._compile = compile_static
    convert_frame.get_and_maybe_log_recompilation_reasons = reasons_and_record


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None, **kwargs):
    """The Dynamo backend registered as "neuron"."""
    _install_dynamo_hooks()
    if mode not in (None, "default") and mode not in _warned_modes:
        _warned_modes.add(mode)
        warnings.warn(
            f"torch.compile(mode={mode!r}) is ignored on neuron: only mode='default' exists."
        )
    _check_inputs(example_inputs)
    from torch_neuronx.compiler import library_ops

    library_ops.replace_known_custom_ops(gm)  # before AOTAutograd traces their autograd formulas
    options = dict(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=_Decompositions(),
        # AOTAutograd's default partitioner: the min-cut one (Inductor's) added
        # about 1 s to every compile, warm starts included, with no step-time
        # difference measurable here (benchmarks/bench_compile.py, 2 runs each).
        keep_inference_input_mutations=True,
    )
    from torch_neuronx.compiler import aot_cache

    with aot_cache.enabled():  # a graph seen by an earlier process skips AOTAutograd's tracing
        return _aot_autograd(gm, example_inputs, **options)


def _aot_autograd(gm: torch.fx.GraphModule, example_inputs, **options):
    """What PyTorch's aot_autograd() backend helper (torch._dynamo.backends.common)
    does for this backend, without its `torch._inductor.debug` import: that
    import costs every process 0.15 s (Inductor's scheduler and IR modules)
    and serves only TORCH_COMPILE_DEBUG's AOTAutograd logs, so the helper
    itself still runs when that is set, and for graphs with nested inputs
    (compiled autograd), which it flattens first."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo import disable
    from torch._dynamo.utils import counters
    from torch._functorch.aot_autograd import aot_module_simplified

    if os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1" or any(
            isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return aot_autograd(**options)(gm, example_inputs)
    backward = options["bw_compiler"]

    def bw_compiler(*args, **kwargs):
        # As the helper does: Dynamo traces neither the backward compiler nor
        # the backward it returns.
        compiled = disable(backward, reason="do not trace backward compiler function")(*args, **kwargs)
        return disable(compiled, reason="do not trace generated backwards pass")

    counters["aot_autograd"]["total"] += 1
    try:
        compiled = aot_module_simplified(gm, example_inputs, **{**options, "bw_compiler": bw_compiler})
    except Exception:
        counters["aot_autograd"]["not_ok"] += 1
        raise
    counters["aot_autograd"]["ok"] += 1
    return disable(compiled, reason="do not trace AOT-compiled graph")


def get_dynamo_metrics() -> dict:
    """Compiles, cache hits (memory/disk), compile seconds, graph breaks, recompiles."""
    return metrics.snapshot()


def reset_dynamo_metrics() -> None:
    metrics.reset()


# torch.compile looks the backend up (importing this module) before Dynamo
# traces anything; installing the hooks now covers the first frame too. When
# Dynamo is not loaded yet, no frame has size history and the backend's first
# call installs them.
if "torch._dynamo" in sys.modules:
    _install_dynamo_hooks()
