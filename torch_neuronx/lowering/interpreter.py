"""The FX interpreter: an ATen graph traced through the lowering table with jax
values (under jax.jit by compiler/executable.py, one StableHLO module per graph)."""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx

from torch_neuronx import lowering
from torch_neuronx.lowering import conversions


def run_graph(gm: torch.fx.GraphModule, arrays, ctx: lowering.TraceContext,
              replaced=None) -> tuple[object, dict]:
    """Traces an ATen graph through the lowering table with jax values:
    (its outputs, the value of every node). `ctx` is the trace's context (its
    random keys and fp64 rule), handed to the lowerings that take it.
    Subgraphs (the branches and bodies of control-flow ops such as torch.cond)
    are passed to their op's lowering as functions of jax values, traced with
    the same context. `replaced` maps in-place nodes to the node whose value
    they take."""
    with ctx.active():
        return _run(gm, arrays, ctx, replaced)


def _run(gm: torch.fx.GraphModule, arrays, ctx: lowering.TraceContext, replaced) -> tuple[object, dict]:
    env = {}
    placeholders = iter(arrays)
    replaced = replaced or {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = ctx.narrow(next(placeholders))
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.fx.GraphModule):
                env[node] = functools.partial(_run_subgraph, value, ctx)
            else:  # tensor constants made inside the function
                env[node] = ctx.narrow(conversions.as_jax(value.detach().cpu().contiguous()))
        elif node.op == "call_function":
            if node in replaced:
                env[node] = env[replaced[node]]
                continue
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            if node.target is operator.getitem:
                env[node] = args[0][args[1]]
            else:
                env[node] = lowering.lookup(node.target, ctx)(*args, **kwargs)
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return torch.fx.node.map_arg(output, lambda n: env[n]), env


def _run_subgraph(gm: torch.fx.GraphModule, ctx: lowering.TraceContext, *arrays):
    return run_graph(gm, arrays, ctx)[0]
