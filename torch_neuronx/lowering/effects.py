"""Lowerings of the glue that some ATen graphs carry rather than compute:
``with_effects`` (AOTAutograd wraps side-effecting ops such as ``_linalg_check_errors``
in it, threading a token through the graph) and the ops it wraps.
"""

from __future__ import annotations

import torch

from torch_neuronx.lowering import lookup, lowering

aten = torch.ops.aten


# ------------------------------------------------------------------ effects
@lowering(torch.ops.higher_order.with_effects, context=True)
def with_effects(ctx, token, op, *args, **kwargs):
    """(token, result of op): the token passes through unchanged (XLA orders nothing here;
    the ops it guards have no effect a compiled graph can perform)."""
    fn = lookup(op, ctx)
    if fn is None:
        raise NotImplementedError(f"torch.compile(backend='neuron'): effectful op {op} has no lowering")
    result = fn(*args, **kwargs)
    if result is None:
        return (token,)
    return (token, *result) if isinstance(result, (tuple, list)) else (token, result)


@lowering(aten._linalg_check_errors)
def linalg_check_errors(info, api_name, *, is_matrix):
    """Eager PyTorch raises when `info` reports a singular / non positive-definite matrix. A
    compiled graph cannot raise on values: the results then hold inf/NaN instead."""
    return None
