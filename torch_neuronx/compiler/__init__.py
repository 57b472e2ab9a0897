"""torch.compile(backend="neuron"): Dynamo -> AOTAutograd (forward and backward
graphs) -> decomposition to Core ATen -> StableHLO via the lowering table ->
XLA executable -> run with DLPack inputs/outputs. No Inductor.

The backend is found by name through the ``torch_dynamo_backends`` entry point,
so importing torch does not import JAX or Dynamo.

Modules, one job each: backend.py (the entry point and compile_graph, the
per-graph policy), dynamo.py (every Dynamo patch, applied when torch._dynamo
is imported), aot.py (AOTAutograd and its
decompositions), lowerability.py (which ops cannot be compiled, and the error
text), executable.py (CompiledGraph and the executable cache), runners.py
(the runners AOTAutograd receives and caches), metrics.py, cache.py / aot_cache.py
(disk caches). The FX interpreter and torch<->jax conversions are in
torch_neuronx.lowering (interpreter.py, conversions.py).
"""

from __future__ import annotations

from torch_neuronx.compiler import metrics
from torch_neuronx.compiler.aot import decomposition_table
from torch_neuronx.compiler.backend import neuron_backend
from torch_neuronx.compiler.errors import NeuronCompileError

__all__ = ["NeuronCompileError", "get_dynamo_metrics", "neuron_backend", "reset_dynamo_metrics"]


def get_dynamo_metrics() -> metrics.DynamoMetrics:
    """The per-graph records (TorchNeuron's), answering string keys with the
    aggregate counters: compiles, cache hits (memory/disk), compile seconds,
    graph breaks, recompiles (metrics.py). A wrong TORCH_NEURONX_ENABLED_METRIC_TABLES
    raises here (ValueError naming the available tables) rather than only at exit."""
    metrics.enabled_tables()
    return metrics.get()


def reset_dynamo_metrics() -> None:
    metrics.reset()

