"""Graphs with custom ops (torch.library.custom_op, NKI kernels through
nki_op): the graph is split around each custom op; the pieces between them
are compiled, the custom ops run eagerly on the device in between."""

from __future__ import annotations

import operator

import torch
import torch.fx


def _is_custom_target(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace not in ("aten", "prims")


# AOTAutograd functionalizes a custom op that mutates its arguments
# (mutates_args, as NKI kernels writing their outputs in place) into one of
# these, with the op as first argument; run eagerly, it clones the mutated
# inputs, calls the op on the clones and returns them.
_FUNCTIONALIZED = (torch.ops.higher_order.auto_functionalized, torch.ops.higher_order.auto_functionalized_v2)


def is_custom_op(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in _FUNCTIONALIZED:
        return _is_custom_target(node.args[0])
    return _is_custom_target(node.target)


def split_around_custom_ops(gm: torch.fx.GraphModule, compile_piece) -> torch.fx.GraphModule:
    """Returns a GraphModule that runs compiled pieces and eager custom ops in
    graph order. `compile_piece(submodule)` returns a boxed callable."""
    from torch.fx.passes.split_module import split_module

    partition_of: dict[torch.fx.Node, int] = {}
    state = {"current": 0, "custom": None}

    def assign(node: torch.fx.Node) -> int:
        if node.target is operator.getitem and node.args[0] in partition_of:
            partition_of[node] = partition_of[node.args[0]]
            return partition_of[node]
        custom = is_custom_op(node)
        if state["custom"] is not None and (custom or state["custom"]):
            state["current"] += 1
        state["custom"] = custom
        partition_of[node] = state["current"]
        return state["current"]

    split = split_module(gm, None, assign, keep_original_order=True)
    for name, piece in list(split.named_children()):
        if any(is_custom_op(n) for n in piece.graph.nodes):
            continue  # runs eagerly
        run = compile_piece(piece)
        returns_tuple = isinstance(next(n for n in piece.graph.nodes if n.op == "output").args[0], (tuple, list))

        def call(*args, _run=run, _tuple=returns_tuple):
            out = _run(list(args))
            return tuple(out) if _tuple else out

        delattr(split, name)
        setattr(split, name, call)
    return split
