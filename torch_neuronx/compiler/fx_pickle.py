"""An ATen-level FX graph as plain picklable data, and back.

The AOTAutograd result cache (aot_cache.py) stores the graphs this backend
compiled. GraphModule's own pickling stores the generated Python code and
rebuilds the graph by symbolic tracing, which runs every call whose arguments
hold no traced value: in `uniform_(empty([8]))` the allocation and the random
draw would run once at load time and become a constant. Here the graph is
stored node by node (operators by their qualified name, since OpOverloads do
not pickle) and rebuilt with Graph.create_node, exactly as it was.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch
import torch.fx


@dataclass(frozen=True)
class _NodeRef:
    name: str


@dataclass(frozen=True)
class _OpRef:
    namespace: str
    name: str
    overload: str


@dataclass(frozen=True)
class _HigherOrderRef:
    name: str


def _target_state(target):
    if isinstance(target, torch._ops.OpOverload):
        return _OpRef(target.namespace, target._opname, target._overloadname)
    if isinstance(target, torch._ops.HigherOrderOperator):  # torch.cond, scan, ... (their
        return _HigherOrderRef(target.name())                # subgraphs are stored as constants)
    if isinstance(target, str) or callable(target) and getattr(target, "__module__", None) in (
            "_operator", "operator", "builtins"):
        return target
    raise pickle.PicklingError(f"graph target {target!r} is not stored")


def _target(state):
    if isinstance(state, _OpRef):
        return getattr(getattr(getattr(torch.ops, state.namespace), state.name), state.overload)
    if isinstance(state, _HigherOrderRef):
        return getattr(torch.ops.higher_order, state.name)
    return state


def dumps_state(gm: torch.fx.GraphModule) -> dict:
    """The graph's nodes and tensor constants as picklable data."""
    nodes = []
    for node in gm.graph.nodes:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _NodeRef(n.name))
        nodes.append((node.op, node.name, _target_state(node.target), args, kwargs))
    constants, subgraphs = {}, {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if "." in node.target:
                raise pickle.PicklingError(f"graph constant {node.target} is nested")
            if isinstance(value, torch.fx.GraphModule):
                subgraphs[node.target] = dumps_state(value)
            elif type(value) is torch.Tensor:
                constants[node.target] = (value.detach().cpu(), str(value.device))
            else:
                raise pickle.PicklingError(f"graph constant {node.target} is a {type(value).__name__}")
    return {"nodes": nodes, "constants": constants, "subgraphs": subgraphs}


def loads_state(state: dict) -> torch.fx.GraphModule:
    """The GraphModule that dumps_state(gm) described."""
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}

    def resolve(value):
        return env[value.name] if isinstance(value, _NodeRef) else value

    for op, name, target, args, kwargs in state["nodes"]:
        args, kwargs = torch.fx.node.map_aggregate((args, kwargs), resolve)
        env[name] = graph.create_node(op, _target(target), args, kwargs, name=name)
    root = torch.nn.Module()
    for attribute, (value, device) in state["constants"].items():
        setattr(root, attribute, value.to(device))
    for attribute, substate in state.get("subgraphs", {}).items():
        setattr(root, attribute, loads_state(substate))
    return torch.fx.GraphModule(root, graph)
