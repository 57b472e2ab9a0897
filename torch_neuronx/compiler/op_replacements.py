"""Custom ops of other libraries that the backend compiles instead of running
them eagerly between compiled pieces.

The backend treats a custom op as opaque: the graph is split around it and it
runs eagerly (partition.py). For a custom op whose meaning is known, that
costs a compiled piece per call site, and when the op's autograd formula
reads tensor values on the host it fails AOTAutograd's tracing, so that
Dynamo breaks the graph at every layer using it. This module replaces such
ops in the Dynamo graph, before AOTAutograd, by an equivalent op of this
package written with static-shape tensor ops (CompositeImplicitAutograd), which
AOTAutograd differentiates and the lowering table compiles.

Replaced:
- transformers::grouped_mm_fallback(input, weight, offs): what transformers'
  mixture-of-experts layers call under torch.compile when the expert weights
  are not bfloat16 (PyTorch's torch._grouped_mm accepts only bfloat16 there).
  Its backward calls offs.tolist().
"""

from __future__ import annotations

import torch

_LIBRARY = torch.library.Library("torch_neuronx", "FRAGMENT")
_LIBRARY.define("grouped_mm_masked(Tensor input, Tensor weight, Tensor offs) -> Tensor")


def _grouped_mm_masked(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Row i of `input` [S, K], in group g when offs[g-1] <= i < offs[g], times
    weight[g] [K, N]: out [S, N]. Rows past offs[-1] are zero (as in
    transformers' version). Every row is multiplied by every group's weight and
    the others masked out: groups times the work, the price of static shapes
    (the bfloat16 path, aten._grouped_mm's lowering, pays the same)."""
    ends = offs.to(torch.int64)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    position = torch.arange(input.shape[0], device=input.device)
    masks = (starts[:, None] <= position) & (position < ends[:, None])  # [G, S]
    products = torch.matmul(input, weight)  # [G, S, N]
    return torch.where(masks[:, :, None], products, 0).sum(0)


_LIBRARY.impl("grouped_mm_masked", _grouped_mm_masked, "CompositeImplicitAutograd")

# Qualified name of the replaced op -> its replacement (same arguments).
REPLACEMENTS = {
    "transformers::grouped_mm_fallback": torch.ops.torch_neuronx.grouped_mm_masked.default,
}


def _qualified_name(target) -> str | None:
    """'namespace::name' of an op (Dynamo records calls as the overload packet
    when the code calls torch.ops.ns.name without an overload)."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return None


def replace_known_custom_ops(gm: torch.fx.GraphModule) -> int:
    """Replaces the custom ops in REPLACEMENTS in a Dynamo graph, in place.
    Returns how many nodes were replaced."""
    replaced = 0
    for node in gm.graph.nodes:
        replacement = REPLACEMENTS.get(_qualified_name(node.target)) if node.op == "call_function" else None
        if replacement is not None:
            node.target = replacement
            replaced += 1
    if replaced:
        gm.recompile()
    return replaced
