"""One FX graph (ATen level, after AOTAutograd) -> one jax.jit function -> an
XLA executable, run with inputs and outputs exchanged by DLPack.

The graph is traced through the lowering table under jax.jit, so the whole
graph becomes a single StableHLO module; XLA compiles it once per input
signature (Dynamo already guards on shapes and dtypes, so each compiled graph
sees one signature).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.fx

from torch_neuronx.compiler import metrics
from torch_neuronx.compiler.errors import NeuronCompileError


@dataclass
class UnloweredOp:
    op: str
    source: str


def unlowered_ops(gm: torch.fx.GraphModule) -> list[UnloweredOp]:
    from torch_neuronx.lowering import lookup

    missing = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and lookup(node.target) is None and not _is_getitem(node):
            trace = (node.meta.get("stack_trace") or "").strip().splitlines()
            source = next((line.strip() for line in reversed(trace) if line.strip().startswith("File")), "")
            missing.append(UnloweredOp(str(node.target), source or "(no source line recorded)"))
    return missing


def _is_getitem(node: torch.fx.Node) -> bool:
    import operator

    return node.target is operator.getitem


def _as_jax(value):
    import jax.dlpack

    return jax.dlpack.from_dlpack(value)


@dataclass
class CompiledGraph:
    """A graph compiled for the neuron device; called with a list of inputs."""

    gm: torch.fx.GraphModule
    name: str
    mutated_inputs: dict[int, int] = field(default_factory=dict)  # output slot -> input index
    _jitted: object = None

    def __post_init__(self):
        import jax

        self._jitted = jax.jit(self._interpret)
        self._compiled = {}

    def _interpret(self, *arrays):
        from torch_neuronx.lowering import lookup

        env = {}
        placeholders = iter(arrays)
        results = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "call_function":
                args = torch.fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
                if _is_getitem(node):
                    env[node] = args[0][args[1]]
                else:
                    env[node] = lookup(node.target)(*args, **kwargs)
            elif node.op == "output":
                results = torch.fx.node.map_arg(node.args[0], lambda n: env[n])
        return results

    def __call__(self, args):
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("neuron"))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        host = [_host_input(a) if isinstance(a, torch.Tensor) else a for a in args]
        signature = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        if signature not in self._compiled:
            start = time.perf_counter()
            executable = self._jitted.lower(*[_as_jax(h) if isinstance(h, torch.Tensor) else h for h in host]).compile()
            metrics.record_compile(time.perf_counter() - start)
            self._compiled[signature] = executable
        else:
            metrics.record_cache_hit("memory")
        executable = self._compiled[signature]
        outputs = executable(*[_as_jax(h) for h in host if isinstance(h, torch.Tensor)])
        del tensors
        return _to_torch(outputs, device)


def _host_input(tensor: torch.Tensor) -> torch.Tensor:
    from torch_neuronx import _C

    if tensor.device.type == "neuron":
        tensor = _C._host_view(tensor)
    return tensor.contiguous()


def _to_torch(outputs, device):
    from torch_neuronx import _C

    def convert(value):
        if value is None:
            return None
        return _C._adopt_host(torch.from_dlpack(value), device.index or 0)

    if isinstance(outputs, (list, tuple)):
        return [convert(o) for o in outputs]
    return convert(outputs)


def compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str) -> CompiledGraph:
    for node in gm.graph.nodes:
        for value in node.meta.get("val", ()) if isinstance(node.meta.get("val"), tuple) else [node.meta.get("val")]:
            if isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape):
                raise NeuronCompileError(
                    "torch.compile(backend='neuron') compiles static shapes only (one executable per "
                    "input shape), but this graph has symbolic sizes. Do not pass dynamic=True; "
                    "mark_dynamic is not supported on neuron either."
                )
    missing = unlowered_ops(gm)
    if missing:
        raise NeuronCompileError(missing)
    compiled = CompiledGraph(gm, name)

    def run(args):
        return compiled(args)

    run._boxed_call = True  # AOTAutograd passes the inputs as one list
    run.compiled_graph = compiled
    return run
