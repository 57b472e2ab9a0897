"""Lowerings of reductions, scans, sorting, searching and histograms (see
torch_neuronx/lowering/__init__.py).

PyTorch's dtype rules: sum/prod/cumsum/cumprod of bool and integer tensors give
int64; float16/bfloat16 are accumulated in float32; arg-reductions give int64.
Sorting is stable; NaN sorts as the largest value, as in PyTorch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering
from torch_neuronx.lowering.common import (
    KIND, acc_dtype, cast, dims, is_array, is_float, is_int, jax_dtype, promote,
)

aten = torch.ops.aten


def _sum_dtype(x, dtype):
    if dtype is not None:
        return jax_dtype(dtype)
    return jnp.int64 if is_int(x.dtype) else x.dtype


def _count(shape, axes) -> int:
    return math.prod(shape[a] for a in axes)


@lowering(aten.sum)
def sum_(x, dim=None, keepdim=False, dtype=None):
    out = _sum_dtype(x, dtype)
    return jnp.sum(x.astype(acc_dtype(out)), axis=dims(dim, x.ndim), keepdims=keepdim).astype(out)


@lowering(aten.nansum)
def nansum(x, dim=None, keepdim=False, dtype=None):
    if is_float(x.dtype):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return sum_(x, dim, keepdim, dtype=dtype)


@lowering(aten.mean)
def mean(x, dim=None, keepdim=False, dtype=None):
    out = jax_dtype(dtype) if dtype is not None else x.dtype
    return jnp.mean(x.astype(acc_dtype(out)), axis=dims(dim, x.ndim), keepdims=keepdim).astype(out)


@lowering(aten.prod)
def prod(x, dim=None, keepdim=False, dtype=None):
    if isinstance(dim, torch.dtype):  # prod.default(x, dtype) given positionally
        dim, dtype = None, dim
    out = _sum_dtype(x, dtype)
    return jnp.prod(x.astype(acc_dtype(out)), axis=dims(dim, x.ndim), keepdims=keepdim).astype(out)


@lowering(aten.amax)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.amin)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=dims(dim, x.ndim), keepdims=keepdim)


def _arg(fn, x, dim, keepdim):
    keys = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    if dim is None:
        out = fn(keys.reshape(-1)).astype(jnp.int64)
        return out.reshape((1,) * x.ndim) if keepdim else out
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return fn(keys, axis=dim % x.ndim, keepdims=keepdim).astype(jnp.int64)


@lowering(aten.argmax)
def argmax(x, dim=None, keepdim=False):
    return _arg(jnp.argmax, x, dim, keepdim)


@lowering(aten.argmin)
def argmin(x, dim=None, keepdim=False):
    return _arg(jnp.argmin, x, dim, keepdim)


def _max_min(reduce, arg, binary):
    def lower(x, dim=None, keepdim=False):
        if is_array(dim):  # max.other / min.other
            return binary(x, dim)
        if dim is None:  # max.default: the whole tensor
            return reduce(x)
        return reduce(x, axis=dims(dim, x.ndim), keepdims=keepdim), _arg(arg, x, dim, keepdim)

    return lower


def _elementwise_extreme(fn):
    def lower(x, y):
        computation, result = promote(x, y)
        return fn(cast(x, computation), cast(y, computation)).astype(result)

    return lower


lowering(aten.max)(_max_min(jnp.max, jnp.argmax, _elementwise_extreme(jnp.maximum)))
lowering(aten.min)(_max_min(jnp.min, jnp.argmin, _elementwise_extreme(jnp.minimum)))


@lowering(aten.aminmax)
def aminmax(x, dim=None, keepdim=False):
    return amin(x, () if dim is None else dim, keepdim), amax(x, () if dim is None else dim, keepdim)


def _truthy(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lowering(aten.any)
def any_(x, dim=None, keepdim=False):
    out = jnp.any(_truthy(x), axis=dims(dim, x.ndim), keepdims=keepdim)
    return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out


@lowering(aten.all)
def all_(x, dim=None, keepdim=False):
    out = jnp.all(_truthy(x), axis=dims(dim, x.ndim), keepdims=keepdim)
    return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out


@lowering(aten.count_nonzero)
def count_nonzero(x, dim=None):
    return jnp.sum(_truthy(x), axis=dims(dim, x.ndim)).astype(jnp.int64)


def _variance_args(args, kwargs):
    """(dim, correction, keepdim) of var/std/var_mean/std_mean, any overload."""
    args = list(args)
    dim, correction, keepdim = None, 1, kwargs.get("keepdim", False)
    if args and isinstance(args[0], bool):  # var(x, unbiased)
        correction = int(args.pop(0))
    else:
        if args:
            dim = args.pop(0)
        if args:
            correction = int(args.pop(0))
        if args:
            keepdim = args.pop(0)
    dim = kwargs.get("dim", dim)
    if "unbiased" in kwargs:
        correction = int(kwargs["unbiased"])
    if kwargs.get("correction") is not None:
        correction = kwargs["correction"]
    return dim, correction, keepdim


def _var_mean(x, dim, correction, keepdim):
    axes = dims(dim, x.ndim)
    v = x.astype(acc_dtype(x.dtype))
    average = jnp.mean(v, axis=axes, keepdims=True)
    centered = v - average
    squares = jnp.real(centered * jnp.conj(centered)) if jnp.iscomplexobj(v) else centered * centered
    total = jnp.sum(squares, axis=axes, keepdims=keepdim)
    variance = total / max(0, _count(x.shape, axes) - correction)
    if not keepdim:
        average = jnp.squeeze(average, axis=axes)
    real = jnp.real(x).dtype if jnp.iscomplexobj(x) else x.dtype
    return variance.astype(real), average.astype(x.dtype)


@lowering(aten.var)
def var(x, *args, **kwargs):
    return _var_mean(x, *_variance_args(args, kwargs))[0]


@lowering(aten.std)
def std(x, *args, **kwargs):
    return jnp.sqrt(_var_mean(x, *_variance_args(args, kwargs))[0])


@lowering(aten.var_mean)
def var_mean(x, *args, **kwargs):
    return _var_mean(x, *_variance_args(args, kwargs))


@lowering(aten.std_mean)
def std_mean(x, *args, **kwargs):
    variance, average = _var_mean(x, *_variance_args(args, kwargs))
    return jnp.sqrt(variance), average


@lowering(aten.logsumexp)
def logsumexp(x, dim=(), keepdim=False):
    computation, result = promote(x, kind=KIND.INT_TO_FLOAT)
    v = cast(x, computation)
    axes = dims(dim, x.ndim)
    if not axes and x.ndim:
        axes = tuple(range(x.ndim))
    peak = jnp.max(v, axis=axes, keepdims=True)
    peak = jnp.where(jnp.isinf(peak), jnp.zeros((), peak.dtype), peak)
    out = jnp.log(jnp.sum(jnp.exp(v - peak), axis=axes, keepdims=True)) + peak
    if not keepdim:
        out = jnp.squeeze(out, axis=axes)
    return out.astype(result)


@lowering(aten.linalg_vector_norm)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    out = jax_dtype(dtype) if dtype is not None else (jnp.real(x).dtype if jnp.iscomplexobj(x) else x.dtype)
    magnitude = jnp.abs(x).astype(acc_dtype(out))
    axes = dims(dim, x.ndim)
    if ord == math.inf:
        result = jnp.max(magnitude, axis=axes, keepdims=keepdim)
    elif ord == -math.inf:
        result = jnp.min(magnitude, axis=axes, keepdims=keepdim)
    elif ord == 0:
        result = jnp.sum((magnitude != 0).astype(magnitude.dtype), axis=axes, keepdims=keepdim)
    elif ord == 1:
        result = jnp.sum(magnitude, axis=axes, keepdims=keepdim)
    elif ord == 2:
        result = jnp.sqrt(jnp.sum(magnitude * magnitude, axis=axes, keepdims=keepdim))
    else:
        result = jnp.sum(magnitude ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
    return result.astype(out)


# ----------------------------------------------------------------------- scans
def _scan_dtype(x, dtype):
    return _sum_dtype(x, dtype)


def _scan(accumulate):
    """cumsum/cumprod: PyTorch's result dtype, accumulated in a wide type."""

    def lower(x, dim, dtype=None):
        out = _scan_dtype(x, dtype)
        if x.ndim == 0:
            return x.astype(out)
        return accumulate(x.astype(acc_dtype(out)), axis=dim % x.ndim).astype(out)

    return lower


cumsum = lowering(aten.cumsum)(_scan(jnp.cumsum))
cumprod = lowering(aten.cumprod)(_scan(jnp.cumprod))


@lowering(aten.logcumsumexp)
def logcumsumexp(x, dim):
    if x.ndim == 0:
        return x
    v = x.astype(acc_dtype(x.dtype))
    return jax.lax.associative_scan(jnp.logaddexp, v, axis=dim % x.ndim).astype(x.dtype)


def _cumulative_extreme(greater):
    def lower(x, dim):
        if x.ndim == 0:
            return x, jnp.zeros((), jnp.int64)
        axis = dim % x.ndim
        index = jax.lax.broadcasted_iota(jnp.int64, x.shape, axis)

        def combine(a, b):
            (va, ia), (vb, ib) = a, b
            if is_float(x.dtype):
                take_b = jnp.isnan(vb) | (~jnp.isnan(va) & greater(vb, va))
            else:
                take_b = greater(vb, va)
            return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

        return jax.lax.associative_scan(combine, (x, index), axis=axis)

    return lower


lowering(aten.cummax)(_cumulative_extreme(lambda b, a: b >= a))
lowering(aten.cummin)(_cumulative_extreme(lambda b, a: b <= a))


# --------------------------------------------------------------------- sorting
def sort_with_indices(x, dim=-1, descending=False):
    """Stable sort along dim: (values, int64 indices); NaN sorts as the largest."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = dim % x.ndim
    keys = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    index = jax.lax.broadcasted_iota(jnp.int64, x.shape, axis)
    if not descending:
        values, order = jax.lax.sort((keys, index), dimension=axis, num_keys=1, is_stable=True)
    else:
        # ascending by (key, -index) then reversed: descending keys, equal keys in input order
        values, order = jax.lax.sort((keys, -index), dimension=axis, num_keys=2)
        values, order = jnp.flip(values, axis), -jnp.flip(order, axis)
    return values.astype(x.dtype), order


@lowering(aten.sort)
def sort(x, *args, **kwargs):
    # sort.default(x, dim=-1, descending=False); sort.stable(x, *, stable, dim=-1, descending=False)
    names = ["dim", "descending"]
    options = {"dim": -1, "descending": False, **dict(zip(names, args)), **kwargs}
    return sort_with_indices(x, options["dim"], options["descending"])


@lowering(aten.topk)
def topk(x, k, dim=-1, largest=True, sorted=True):
    values, order = sort_with_indices(x, dim, descending=largest)
    if x.ndim == 0:
        return values, order
    axis = dim % x.ndim
    return jax.lax.slice_in_dim(values, 0, k, axis=axis), jax.lax.slice_in_dim(order, 0, k, axis=axis)


def _pick(values, order, position, axis, keepdim):
    value = jax.lax.dynamic_index_in_dim(values, position, axis, keepdims=keepdim)
    index = jax.lax.dynamic_index_in_dim(order, position, axis, keepdims=keepdim)
    return value, index


@lowering(aten.kthvalue)
def kthvalue(x, k, dim=-1, keepdim=False):
    values, order = sort_with_indices(x, dim)
    if x.ndim == 0:
        return values, order
    return _pick(values, order, k - 1, dim % x.ndim, keepdim)


@lowering(aten.median)
def median(x, dim=None, keepdim=False):
    whole = dim is None
    if whole:
        x = x.reshape(-1)
        dim = 0
    if x.ndim == 0:
        return x if whole else (x, jnp.zeros((), jnp.int64))
    axis = dim % x.ndim
    values, order = sort_with_indices(x, axis)
    size = x.shape[axis]
    position = (size - 1) // 2
    if is_float(x.dtype):  # any NaN makes the median NaN (the first NaN in sorted order)
        nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True)
        position = jnp.where(nans > 0, size - nans, position)
        value = jnp.take_along_axis(values, position, axis=axis)
        index = jnp.take_along_axis(order, position, axis=axis)
        if not keepdim:
            value, index = jnp.squeeze(value, axis), jnp.squeeze(index, axis)
    else:
        value, index = _pick(values, order, position, axis, keepdim)
    return value if whole else (value, index)


# ----------------------------------------------------- searching, histograms
def _search(sorted_sequence, values, right, out_int32):
    side = "right" if right else "left"
    dtype = jnp.int32 if out_int32 else jnp.int64
    if sorted_sequence.ndim <= 1:
        return jnp.searchsorted(sorted_sequence, values, side=side).astype(dtype)
    # One sorted row per leading index: rows of `values` searched in their own row.
    rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    queries = values.reshape(rows.shape[0], -1)
    found = jax.vmap(lambda row, q: jnp.searchsorted(row, q, side=side))(rows, queries)
    return found.reshape(values.shape).astype(dtype)


@lowering(aten.searchsorted)
def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    values = jnp.asarray(values, sorted_sequence.dtype) if not isinstance(values, jax.Array) else values
    return _search(sorted_sequence, values, right or side == "right", out_int32)


@lowering(aten.bucketize)
def bucketize(values, boundaries, *, out_int32=False, right=False):
    """Index i with boundaries[i-1] < v <= boundaries[i] (right=False) or
    boundaries[i-1] <= v < boundaries[i] (right=True)."""
    values = jnp.asarray(values) if not isinstance(values, jax.Array) else values
    return _search(boundaries, values, right, out_int32)


@lowering(aten.histc)
def histc(x, bins=100, min=0, max=0):
    """Counts in `bins` equal bins over [min, max] (the data's range when both are 0; widened
    by 1 each side when that range is empty). Values outside, and NaN, are not counted; a
    value equal to max falls in the last bin."""
    from torch_neuronx.lowering.common import acc_dtype

    math_dtype = acc_dtype(x.dtype)
    v = x.reshape(-1).astype(math_dtype)
    low, high = jnp.asarray(min, math_dtype), jnp.asarray(max, math_dtype)
    if min == 0 and max == 0 and v.size:
        low, high = jnp.min(v), jnp.max(v)
    same = low == high
    low, high = jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
    inside = (v >= low) & (v <= high)
    position = jnp.floor((v - low) * bins / (high - low)).astype(jnp.int64)
    position = jnp.clip(position, 0, bins - 1)
    counts = jnp.zeros(bins, math_dtype).at[position].add(inside.astype(math_dtype))
    return counts.astype(x.dtype)


@lowering(aten.nanmedian)
def nanmedian(x, dim=None, keepdim=False):
    """The lower median of the non-NaN values (NaN if there are none); its index."""
    whole = dim is None
    if x.ndim == 0 and not whole:  # a scalar along "its" dim: itself, index 0
        return x, jnp.zeros((), jnp.int64)
    values = x.reshape(-1) if whole else jnp.moveaxis(x, dim, -1)
    if values.shape[-1] == 0:
        raise NotImplementedError("nanmedian of an empty dimension has no lowering (PyTorch raises)")
    order = jnp.argsort(values, axis=-1, stable=True)  # NaN sorts last
    count = jnp.sum(~jnp.isnan(values), axis=-1, keepdims=True)
    k = jnp.where(count > 0, (count - 1) // 2, 0)
    index = jnp.take_along_axis(order, k, axis=-1)
    median = jnp.take_along_axis(values, index, axis=-1)
    if whole:
        return median.reshape(())
    median, index = median[..., 0], index[..., 0].astype(jnp.int64)
    if keepdim:
        median, index = jnp.expand_dims(median, dim), jnp.expand_dims(index, dim)
    return median, index


@lowering(aten.mode)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest one on a tie) and the index of its
    last occurrence, as PyTorch's CPU kernel returns."""
    values = jnp.moveaxis(x, dim, -1) if x.ndim else x.reshape(1)
    equal = values[..., :, None] == values[..., None, :]
    counts = jnp.sum(equal, axis=-1)
    best = jnp.max(counts, axis=-1, keepdims=True)
    candidates = jnp.where(counts == best, values, _largest(values.dtype))
    winner = jnp.min(candidates, axis=-1, keepdims=True)
    positions = jnp.arange(values.shape[-1])
    last = jnp.max(jnp.where(values == winner, positions, -1), axis=-1, keepdims=True)
    winner, last = winner[..., 0], last[..., 0].astype(jnp.int64)
    if x.ndim == 0:
        return winner.reshape(()), last.reshape(())
    if keepdim:
        winner, last = jnp.expand_dims(winner, dim), jnp.expand_dims(last, dim)
    return winner, last


def _largest(dtype):
    if dtype == jnp.bool_:
        return jnp.asarray(True)
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.asarray(jnp.inf, dtype)
    return jnp.asarray(jnp.iinfo(dtype).max, dtype)
