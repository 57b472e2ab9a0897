"""Control-flow higher-order ops -> StableHLO control flow.

torch.cond, torch._higher_order_ops.while_loop, scan and map reach the
backend as higher-order ops whose branches and bodies are subgraphs; the
compiler passes each subgraph here as a function of jax values
(lowering/interpreter.py:run_graph). They become lax.cond / lax.while_loop /
lax.scan / lax.map: the control flow stays inside the one compiled
executable, decided on the device by tensor values, as on Trainium, instead
of breaking the graph. AOTAutograd differentiates cond, scan and map itself
(their backward graphs hold the same ops), so training through them compiles
too. invoke_subgraph (torch.compiler.nested_compile_region) is a plain call
of its subgraph, traced inline.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import torch

from torch_neuronx.lowering import lowering

higher_order = torch.ops.higher_order


def _tuple(values) -> tuple:
    return tuple(values) if isinstance(values, (list, tuple)) else (values,)


def _like(values, reference) -> tuple:
    """Loop-carried values keep their dtypes across iterations (XLA requires
    it; a body's arithmetic may come back weakly typed or promoted)."""
    return tuple(jnp.asarray(v).astype(r.dtype) for v, r in zip(values, reference))


def _predicate(value):
    return jnp.asarray(value).reshape(()).astype(jnp.bool_)


@lowering(higher_order.cond)
def cond(pred, true_fn, false_fn, operands):
    operands = _tuple(operands)
    if isinstance(pred, bool):  # decided while tracing
        return _tuple((true_fn if pred else false_fn)(*operands))
    return lax.cond(_predicate(pred), lambda ops: _tuple(true_fn(*ops)),
                    lambda ops: _tuple(false_fn(*ops)), operands)


@lowering(higher_order.while_loop)
def while_loop(cond_fn, body_fn, carried_inputs, additional_inputs):
    carried, extra = tuple(carried_inputs), tuple(additional_inputs)
    return lax.while_loop(lambda state: _predicate(cond_fn(*state, *extra)),
                          lambda state: _like(_tuple(body_fn(*state, *extra)), state), carried)


@lowering(higher_order.scan)
def scan(combine_fn, init, xs, additional_inputs):
    """combine_fn(*carry, *x slices, *additional) -> (*next carry, *y slices),
    along dim 0 of every xs (torch.scan moves the scanned dim there and flips
    for reverse=True in the graph itself): (*final carry, *stacked ys)."""
    count, extra = len(init), tuple(additional_inputs)

    def step(carry, slices):
        out = _tuple(combine_fn(*carry, *slices, *extra))
        return _like(out[:count], carry), out[count:]

    carry, ys = lax.scan(step, tuple(init), tuple(xs))
    return (*carry, *ys)


@lowering(higher_order.map_impl)
def map_impl(body_fn, xs, pos_args):
    """body_fn(*x slices, *pos_args) for every slice along dim 0 of xs, stacked."""
    extra = tuple(pos_args)
    return lax.map(lambda slices: _tuple(body_fn(*slices, *extra)), tuple(xs))


@lowering(higher_order.invoke_subgraph)
def invoke_subgraph(subgraph, identifier, *operands):
    """A region compiled once by PyTorch and called at several places; here
    each call is traced inline into the one module."""
    return _tuple(subgraph(*operands))
