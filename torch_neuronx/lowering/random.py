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


# ------------------------------------------------------------- distributions
# In-place samplers (x.uniform_(), x.normal_(), ...) reach the compiler
# functionalized: the op takes the tensor being filled and returns a new one of
# its shape and dtype. Sampling happens in at least float32 (jax draws
# bfloat16/float16 directly with too few distinct values for the transforms
# below) and is rounded to the tensor's dtype at the end.
def _sample_dtype(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _uniform(shape, dtype, low=0.0, high=1.0):
    dtype = _sample_dtype(dtype)
    return jax.random.uniform(next_key(), tuple(shape), dtype, jnp.asarray(low, dtype), jnp.asarray(high, dtype))


def _normal(shape, dtype):
    return jax.random.normal(next_key(), tuple(shape), _sample_dtype(dtype))


@lowering(aten.uniform)
def uniform(x, low=0.0, high=1.0, generator=None):
    if x.dtype in (jnp.float16, jnp.bfloat16):
        # As PyTorch: a multiple of 2**-digits of the target dtype, so that rounding to
        # bfloat16/float16 cannot reach the excluded upper bound.
        steps = 2.0 ** (jnp.finfo(x.dtype).nmant + 1)
        unit = jnp.floor(_uniform(x.shape, jnp.float32) * steps) / steps
        return (unit * (high - low) + low).astype(x.dtype)
    return _uniform(x.shape, x.dtype, low, high).astype(x.dtype)


@lowering(aten.normal_functional)
def normal_functional(x, mean=0.0, std=1.0, generator=None):
    return (mean + std * _normal(x.shape, x.dtype)).astype(x.dtype)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal(mean, std=1.0, generator=None):
    arrays = [v for v in (mean, std) if isinstance(v, jax.Array)]
    shape = jnp.broadcast_shapes(*[a.shape for a in arrays])
    dtype = jnp.result_type(*arrays)
    return (mean + std * _normal(shape, dtype)).astype(dtype)


@lowering(aten.normal.float_float)
def normal_float_float(mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _float_dtype(dtype)
    return (mean + std * _normal(size, dtype)).astype(dtype)


@lowering(aten.log_normal)
def log_normal(x, mean=1.0, std=2.0, generator=None):
    return jnp.exp(mean + std * _normal(x.shape, x.dtype)).astype(x.dtype)


@lowering(aten.exponential)
def exponential(x, lambd=1.0, generator=None):
    return (jax.random.exponential(next_key(), x.shape, _sample_dtype(x.dtype)) / lambd).astype(x.dtype)


@lowering(aten.cauchy)
def cauchy(x, median=0.0, sigma=1.0, generator=None):
    return (median + sigma * jax.random.cauchy(next_key(), x.shape, _sample_dtype(x.dtype))).astype(x.dtype)


@lowering(aten.geometric)
def geometric(x, p, generator=None):
    """Trials up to and including the first success: 1, 2, ..."""
    return jax.random.geometric(next_key(), p, x.shape, jnp.int64).astype(x.dtype)


@lowering(aten.poisson)
def poisson(rate, generator=None):
    lam = rate.astype(_sample_dtype(rate.dtype))
    return jax.random.poisson(next_key(), lam, rate.shape, jnp.int64).astype(rate.dtype)


def _random_bounds(dtype):
    """random_()'s default range: [0, 2**mantissa_digits] for floats (every integer exactly
    representable), [0, max] for integers, {0, 1} for bool."""
    if dtype == jnp.bool_:
        return 0, 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 0, 2 ** jnp.finfo(dtype).nmant * 2
    return 0, int(jnp.iinfo(dtype).max)


def _integers(x, low, high):
    """Integers in [low, high) of x's shape, in x's dtype."""
    if high > jnp.iinfo(jnp.int64).max:  # random_() on int64: [0, 2**63 - 1]
        bits = jax.random.bits(next_key(), x.shape, jnp.uint64) >> 1
        return bits.astype(jnp.int64).astype(x.dtype)
    return jax.random.randint(next_key(), x.shape, low, high, jnp.int64).astype(x.dtype)


@lowering(aten.random.default)
def random_default(x, generator=None):
    low, high = _random_bounds(x.dtype)
    return _integers(x, low, high + 1)


@lowering(aten.random.to)
def random_to(x, to, generator=None):
    return _integers(x, 0, to)


@lowering(getattr(aten.random, "from"))
def random_from(x, low, to=None, generator=None):
    return _integers(x, low, _random_bounds(x.dtype)[1] + 1 if to is None else to)


@lowering(aten.randperm)
def randperm(n, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None):
    from torch_neuronx.lowering.aten import jax_dtype

    return jax.random.permutation(next_key(), n).astype(jax_dtype(torch.int64 if dtype is None else dtype))


@lowering(aten.multinomial)
def multinomial(weights, num_samples, replacement=False, generator=None):
    """Rows of (unnormalized) weights -> int64 category indices. Without replacement: the
    Gumbel-top-k trick (the k largest of log w + Gumbel noise are a weighted draw without
    replacement); zero weights get -inf and are never drawn."""
    logits = jnp.log(weights.astype(_sample_dtype(weights.dtype)))
    rows = logits if logits.ndim == 2 else logits[None]
    if replacement:
        draws = jax.random.categorical(next_key(), rows, axis=-1, shape=(num_samples, rows.shape[0])).T
    else:
        noisy = rows + jax.random.gumbel(next_key(), rows.shape, rows.dtype)
        draws = jax.lax.top_k(noisy, num_samples)[1]
    draws = draws.astype(jnp.int64)
    return draws if logits.ndim == 2 else draws[0]


def _rrelu(x, lower, upper, training):
    """Training: negative inputs scaled by r ~ U(lower, upper), noise = r (1 elsewhere).
    Evaluation: leaky ReLU with slope (lower + upper) / 2."""
    if not training:
        slope = jnp.asarray((lower + upper) / 2, x.dtype)
        return jnp.where(x >= 0, x, x * slope), None
    r = _uniform(x.shape, x.dtype, lower, upper).astype(x.dtype)
    negative = x <= 0
    return jnp.where(negative, x * r, x), jnp.where(negative, r, jnp.ones((), x.dtype))


@lowering(aten.rrelu_with_noise)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    return _rrelu(x, lower, upper, training)[0]


@lowering(aten.rrelu_with_noise_functional)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    out, new_noise = _rrelu(x, lower, upper, training)
    return out, noise if new_noise is None else new_noise.astype(noise.dtype)
