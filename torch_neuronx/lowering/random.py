"""Lowerings of random ops. Keys come from the trace context (ctx.next_key()), split from a
seed that each run of the graph takes from the core's neuron generator (its seed and
offset): these draw on the device, with numbers of their own. A compiled graph lowers
only the random ops whose parameters it computes, or that sit in a control-flow body;
the others are drawn on the host from the CPU generator (compiler/host_random.py), as
eager ones are, and reach the graph as inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering

aten = torch.ops.aten


def _float_dtype(dtype, like=None):
    from torch_neuronx.lowering.common import jax_dtype

    if dtype is not None:
        return jax_dtype(dtype)
    return like.dtype if like is not None else jax_dtype(torch.get_default_dtype())


@lowering(aten.native_dropout, context=True)
def native_dropout(ctx, x, p, train):
    if train is False or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(ctx.next_key(), 1.0 - p, x.shape)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype)), keep


@lowering(aten.rand, context=True)
def rand(ctx, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.uniform(ctx.next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.randn, context=True)
def randn(ctx, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.normal(ctx.next_key(), tuple(size), _float_dtype(dtype))


@lowering(aten.rand_like, context=True)
def rand_like(ctx, x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.uniform(ctx.next_key(), x.shape, _float_dtype(dtype, x))


@lowering(aten.randn_like, context=True)
def randn_like(ctx, x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jax.random.normal(ctx.next_key(), x.shape, _float_dtype(dtype, x))


@lowering(aten.bernoulli, context=True)
def bernoulli(ctx, x, p=None, generator=None):
    probability = x if p is None else p
    return jax.random.bernoulli(ctx.next_key(), probability, x.shape).astype(x.dtype)


# ------------------------------------------------------------- distributions
# In-place samplers (x.uniform_(), x.normal_(), ...) reach the compiler
# functionalized: the op takes the tensor being filled and returns a new one of
# its shape and dtype. Sampling happens in at least float32 (jax draws
# bfloat16/float16 directly with too few distinct values for the transforms
# below) and is rounded to the tensor's dtype at the end.
def _sample_dtype(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _uniform(ctx, shape, dtype, low=0.0, high=1.0):
    dtype = _sample_dtype(dtype)
    return jax.random.uniform(ctx.next_key(), tuple(shape), dtype, jnp.asarray(low, dtype), jnp.asarray(high, dtype))


def _normal(ctx, shape, dtype):
    return jax.random.normal(ctx.next_key(), tuple(shape), _sample_dtype(dtype))


@lowering(aten.uniform, context=True)
def uniform(ctx, x, low=0.0, high=1.0, generator=None):
    if x.dtype in (jnp.float16, jnp.bfloat16):
        # As PyTorch: a multiple of 2**-digits of the target dtype, so that rounding to
        # bfloat16/float16 cannot reach the excluded upper bound.
        steps = 2.0 ** (jnp.finfo(x.dtype).nmant + 1)
        unit = jnp.floor(_uniform(ctx, x.shape, jnp.float32) * steps) / steps
        return (unit * (high - low) + low).astype(x.dtype)
    return _uniform(ctx, x.shape, x.dtype, low, high).astype(x.dtype)


@lowering(aten.normal_functional, context=True)
def normal_functional(ctx, x, mean=0.0, std=1.0, generator=None):
    return (mean + std * _normal(ctx, x.shape, x.dtype)).astype(x.dtype)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, context=True)
def normal(ctx, mean, std=1.0, generator=None):
    arrays = [v for v in (mean, std) if isinstance(v, jax.Array)]
    shape = jnp.broadcast_shapes(*[a.shape for a in arrays])
    dtype = jnp.result_type(*arrays)
    return (mean + std * _normal(ctx, shape, dtype)).astype(dtype)


@lowering(aten.normal.float_float, context=True)
def normal_float_float(ctx, mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _float_dtype(dtype)
    return (mean + std * _normal(ctx, size, dtype)).astype(dtype)


@lowering(aten.log_normal, context=True)
def log_normal(ctx, x, mean=1.0, std=2.0, generator=None):
    return jnp.exp(mean + std * _normal(ctx, x.shape, x.dtype)).astype(x.dtype)


@lowering(aten.exponential, context=True)
def exponential(ctx, x, lambd=1.0, generator=None):
    return (jax.random.exponential(ctx.next_key(), x.shape, _sample_dtype(x.dtype)) / lambd).astype(x.dtype)


@lowering(aten.cauchy, context=True)
def cauchy(ctx, x, median=0.0, sigma=1.0, generator=None):
    return (median + sigma * jax.random.cauchy(ctx.next_key(), x.shape, _sample_dtype(x.dtype))).astype(x.dtype)


@lowering(aten.geometric, context=True)
def geometric(ctx, x, p, generator=None):
    """Trials up to and including the first success: 1, 2, ..."""
    return jax.random.geometric(ctx.next_key(), p, x.shape, jnp.int64).astype(x.dtype)


@lowering(aten.poisson, context=True)
def poisson(ctx, rate, generator=None):
    lam = rate.astype(_sample_dtype(rate.dtype))
    return jax.random.poisson(ctx.next_key(), lam, rate.shape, jnp.int64).astype(rate.dtype)


def _random_bounds(dtype):
    """random_()'s default range: [0, 2**mantissa_digits] for floats (every integer exactly
    representable), [0, max] for integers, {0, 1} for bool."""
    if dtype == jnp.bool_:
        return 0, 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 0, 2 ** jnp.finfo(dtype).nmant * 2
    return 0, int(jnp.iinfo(dtype).max)


def _integers(ctx, x, low, high):
    """Integers in [low, high) of x's shape, in x's dtype."""
    if high > jnp.iinfo(jnp.int64).max:  # random_() on int64: [0, 2**63 - 1]
        bits = jax.random.bits(ctx.next_key(), x.shape, jnp.uint64) >> 1
        return bits.astype(jnp.int64).astype(x.dtype)
    return jax.random.randint(ctx.next_key(), x.shape, low, high, jnp.int64).astype(x.dtype)


@lowering(aten.random.default, context=True)
def random_default(ctx, x, generator=None):
    low, high = _random_bounds(x.dtype)
    return _integers(ctx, x, low, high + 1)


@lowering(aten.random.to, context=True)
def random_to(ctx, x, to, generator=None):
    return _integers(ctx, x, 0, to)


@lowering(getattr(aten.random, "from"), context=True)
def random_from(ctx, x, low, to=None, generator=None):
    return _integers(ctx, x, low, _random_bounds(x.dtype)[1] + 1 if to is None else to)


@lowering(aten.randperm, context=True)
def randperm(ctx, n, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    from torch_neuronx.lowering.common import jax_dtype

    return jax.random.permutation(ctx.next_key(), n).astype(jax_dtype(torch.int64 if dtype is None else dtype))


@lowering(aten.multinomial, context=True)
def multinomial(ctx, weights, num_samples, replacement=False, generator=None):
    """Rows of (unnormalized) weights -> int64 category indices. Without replacement: the
    Gumbel-top-k trick (the k largest of log w + Gumbel noise are a weighted draw without
    replacement); zero weights get -inf and are never drawn."""
    logits = jnp.log(weights.astype(_sample_dtype(weights.dtype)))
    rows = logits if logits.ndim == 2 else logits[None]
    if replacement:
        draws = jax.random.categorical(ctx.next_key(), rows, axis=-1, shape=(num_samples, rows.shape[0])).T
    else:
        noisy = rows + jax.random.gumbel(ctx.next_key(), rows.shape, rows.dtype)
        draws = jax.lax.top_k(noisy, num_samples)[1]
    draws = draws.astype(jnp.int64)
    return draws if logits.ndim == 2 else draws[0]


def _rrelu(ctx, x, lower, upper, training):
    """Training: negative inputs scaled by r ~ U(lower, upper), noise = r (1 elsewhere).
    Evaluation: leaky ReLU with slope (lower + upper) / 2."""
    if not training:
        slope = jnp.asarray((lower + upper) / 2, x.dtype)
        return jnp.where(x >= 0, x, x * slope), None
    r = _uniform(ctx, x.shape, x.dtype, lower, upper).astype(x.dtype)
    negative = x <= 0
    return jnp.where(negative, x * r, x), jnp.where(negative, r, jnp.ones((), x.dtype))


@lowering(aten.rrelu_with_noise, context=True)
def rrelu_with_noise(ctx, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return _rrelu(ctx, x, lower, upper, training)[0]


@lowering(aten.rrelu_with_noise_functional, context=True)
def rrelu_with_noise_functional(ctx, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, new_noise = _rrelu(ctx, x, lower, upper, training)
    return out, noise if new_noise is None else new_noise.astype(noise.dtype)
