"""The Dynamo backend registered as "neuron" (neuron_backend) and the per-graph
policy (compile_graph): the lowerability check, then either one executable or
the eager fallback."""

from __future__ import annotations

import functools
import itertools
import time
import warnings

import torch

from torch_neuronx import config, observe
from torch_neuronx.compiler import aot, float8, host_random, metrics
from torch_neuronx.compiler.errors import NeuronCompileError

_warned_modes: set[str] = set()


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


def compile_graph(gm: torch.fx.GraphModule, example_inputs, kind: str, naming: dict | None = None):
    """The per-graph policy, the one place it lives: one ATen graph from
    AOTAutograd (kind: "forward", "backward" or "inference") -> what
    AOTAutograd calls (a boxed callable). In order: the FP8 and float4 rules,
    a split around custom ops (each piece through this policy), the
    random ops drawn on the host taken out (host_random.py), the lowerability
    check (ops with no lowering raise NeuronCompileError, or with
    TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 run the graph eagerly), then
    one executable. `example_inputs` is unused: the executable is compiled at
    the first call with each input signature (compiler/executable.py).
    `naming`: the record names of a piece of a split graph (metrics.py)."""
    from torch_neuronx.compiler.lowerability import unlowered_message, unlowered_ops
    from torch_neuronx.compiler.partition import is_custom_op, split_around_custom_ops
    from torch_neuronx.compiler.runners import BoxedOutput, GraphRunner

    start = time.perf_counter()  # the FX passes (metrics.py): from here to the CompiledGraph
    if naming is None:  # a graph from AOTAutograd (not a piece of one)
        metrics.record_graph(kind)
        naming = metrics.naming(kind, gm)
    float8.check_graph(gm)  # FP8 compute on this profile, float4 casts: refused with the user's line
    if any(is_custom_op(node) for node in gm.graph.nodes):
        pieces = itertools.count(1)
        prefix, _, nth = naming["graph_name"].rpartition("_")

        def compile_piece(piece):
            # Each compiled piece is a graph of its own: {model}_{aot_id}_{kind}_piece{k}_{nth}.
            return compile_graph(piece, None, kind, {**naming, "graph_name": f"{prefix}_piece{next(pieces)}_{nth}"})

        split = split_around_custom_ops(gm, compile_piece)
        return BoxedOutput(lambda args: split.forward(*args))
    draws = host_random.split(gm)  # before the lowerability check: drawn ops need no lowering
    missing = unlowered_ops(gm)
    if missing:
        observe.unlowered(kind, missing)
    if missing:
        listing = "\n".join(f"  {m.op}  at {m.source}" for m in missing)
        if config.disable_fallback_execution():
            error = NeuronCompileError(unlowered_message(kind, missing, listing))
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
        return BoxedOutput(lambda args: gm.forward(*host_random.with_draws(draws, args)))
    from torch_neuronx.compiler.executable import CompiledGraph

    compiled = CompiledGraph(gm, kind, draws)
    compiled.naming = {**naming, "fx_passes_seconds": time.perf_counter() - start}
    return GraphRunner(compiled)


def _compiler(kind: str):
    """AOTAutograd's fw/bw/inference compiler: compile_graph for that kind."""

    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        return compile_graph(gm, example_inputs, kind)

    return compile_fn


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None, **kwargs):
    """The Dynamo backend registered as "neuron"."""
    if mode not in (None, "default") and mode not in _warned_modes:
        _warned_modes.add(mode)
        warnings.warn(
            f"torch.compile(mode={mode!r}) is ignored on neuron: only mode='default' exists."
        )
    _check_inputs(example_inputs)
    from torch_neuronx.compiler import op_replacements

    op_replacements.replace_known_custom_ops(gm)  # before AOTAutograd traces their autograd formulas
    compile_options = options
    options = dict(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=aot.Decompositions(),
        # AOTAutograd's default partitioner: the min-cut one (Inductor's) added
        # about 1 s to every compile, warm starts included, with no step-time
        # difference measurable here (benchmarks/bench_compile.py, 2 runs each).
        keep_inference_input_mutations=True,
    )
    from torch_neuronx.compiler import aot_cache

    # compile_options: torch.compile(options=...); its "model_name" names the graphs' metrics records
    with metrics.compiling(compile_options), aot_cache.enabled():  # a graph seen by an earlier process
        return aot.aot_autograd(gm, example_inputs, **options)     # skips AOTAutograd's tracing
