"""Lowerings of the glue that some ATen graphs carry rather than compute:
``with_effects`` (AOTAutograd wraps side-effecting ops such as ``_linalg_check_errors``
in it, threading a token through the graph) and the ops it wraps, and the RNG-state
wrappers of ops recomputed under activation checkpointing.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch
import torch._prims.rng_prims

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


# ------------------------------------------------------------------ recomputed seeded ops
# Activation checkpointing under torch.compile recomputes unsaved forward ops in the
# backward graph; AOTAutograd wraps each recomputed op tagged nondeterministic_seeded in
# run_and_save_rng_state (forward) and run_with_rng_state (backward) so that both runs draw
# the same numbers. The device's attention kernels carry the tag for their dropout, which
# the compiler decomposes away before this point (ops/attention.py): what arrives here
# draws nothing, so the state is a placeholder of the CPU generator's state's shape. A
# wrapped op that does draw (a lowering keyed by the trace's random key) is refused: the
# two graphs are traced with different keys.
def _drawless(op, ctx):
    fn = lookup(op, ctx)
    if fn is None or isinstance(fn, functools.partial):
        raise NotImplementedError(f"torch.compile(backend='neuron'): {op} recomputed under activation "
                                  "checkpointing draws random numbers, which the backward graph cannot redraw")
    return fn


@lowering(torch._prims.rng_prims.run_and_save_rng_state, context=True)
def run_and_save_rng_state(ctx, op, *args, **kwargs):
    state = jnp.zeros(torch.get_rng_state().shape, jnp.uint8)
    return state, _drawless(op, ctx)(*args, **kwargs)


@lowering(torch._prims.rng_prims.run_with_rng_state, context=True)
def run_with_rng_state(ctx, rng_state, op, *args, **kwargs):
    return _drawless(op, ctx)(*args, **kwargs)
