"""Lowerings of random ops. Keys come from lowering.next_key(), split from a
seed that the compiled graph draws from the core's default generator on every
call: compiled random ops are reproducible under torch.manual_seed, though
their numbers differ from eager's (different generator algorithm)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering, next_key

aten = torch.ops.aten


def _float_dtype(dtype, like=None):
    from torch_neuronx.lowering.aten import jax_dtype

    if dtype is not None:
        return jax_dtype(dtype)
    return like.dtype if like is not None else jax_dtype(torch.get_default_dtype())


@lowering(aten.native_dropout)
def native_dropout(x, p, train):
    if train is False or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(next_key(), 1.0 - p, x.shape)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype)), keep


@lowering(aten.rand)
def rand(size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.uniform(next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.randn)
def randn(size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.normal(next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.rand_like)
def rand_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.uniform(next_key(), x.shape, _float_dtype(dtype, x))


@lowering(aten.randn_like)
def randn_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.normal(next_key(), x.shape, _float_dtype(dtype, x))


@lowering(aten.bernoulli)
def bernoulli(x, p=None, generator=None):
    probability = x if p is None else p
    return jax.random.bernoulli(next_key(), probability, x.shape).astype(x.dtype)
