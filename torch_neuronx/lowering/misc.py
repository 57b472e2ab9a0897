"""Lowerings of the remaining native ops: elementwise special functions, integer
math, complex numbers, searching and histograms, embedding bags, backward ops
of shrink activations, and the ``*_copy`` variants of view ops.

Also the glue that some ATen graphs carry: ``with_effects`` (AOTAutograd wraps
side-effecting ops such as ``_linalg_check_errors`` in it, threading a token
through the graph).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_neuronx.lowering import LOWERINGS, lookup, lowering

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


# --------------------------------------------------------- *_copy view ops
# Functionalization turns views into these out-of-place copies; the value is the view's.
def _copy_of(view_lowering):
    def lower(*args, **kwargs):
        return view_lowering(*args, **kwargs)

    return lower


def register_copy_variants() -> None:
    """The *_copy entries, from their view ops' (lowering.load() runs it once all are registered)."""
    for name in ("as_strided", "permute", "select", "slice", "split", "unbind", "view"):
        lowering(getattr(aten, name + "_copy"))(_copy_of(LOWERINGS[getattr(aten, name)]))


@lowering(aten.narrow_copy)
def narrow_copy(x, dim, start, length):
    start = start % x.shape[dim] if start < 0 else start
    return LOWERINGS[aten.slice](x, dim, start, start + length)


@lowering(aten._index_put_impl)
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return LOWERINGS[aten.index_put](x, indices, values, accumulate)


@lowering(aten.nonzero_static)
def nonzero_static(x, *, size, fill_value=-1):
    """The first `size` indices of nonzero elements (row-major), padded with fill_value."""
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    coordinates = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coordinates, axis=1).astype(jnp.int64)


def _indices(triangle, row, col, offset, dtype):
    import numpy as np

    from torch_neuronx.lowering.common import jax_dtype

    rows, cols = triangle(row, offset, col)
    return jnp.asarray(np.stack([rows, cols]), jax_dtype(torch.int64 if dtype is None else dtype))


@lowering(aten.tril_indices)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    import numpy as np

    return _indices(np.tril_indices, row, col, offset, dtype)


@lowering(aten.triu_indices)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    import numpy as np

    return _indices(np.triu_indices, row, col, offset, dtype)


# --------------------------------------------------------------- elementwise
def _float_pair(a, b):
    from torch_neuronx.lowering.common import KIND, cast, promote

    computation, result = promote(a, b, kind=KIND.INT_TO_FLOAT)
    return cast(a, computation), cast(b, computation), result


@lowering(aten.igamma)
def igamma(a, x):
    """Regularized lower incomplete gamma P(a, x)."""
    a, x, result = _float_pair(a, x)
    return jax.scipy.special.gammainc(a, x).astype(result)


@lowering(aten.igammac)
def igammac(a, x):
    """Regularized upper incomplete gamma Q(a, x) = 1 - P(a, x)."""
    a, x, result = _float_pair(a, x)
    return jax.scipy.special.gammaincc(a, x).astype(result)


def _integer_pair(a, b):
    from torch_neuronx.lowering.common import cast, promote

    _, result = promote(a, b)
    return cast(a, result), cast(b, result)


@lowering(aten.gcd)
def gcd(a, b):
    return jnp.gcd(*_integer_pair(a, b))


@lowering(aten.lcm)
def lcm(a, b):
    return jnp.lcm(*_integer_pair(a, b))


@lowering(aten.angle)
def angle(x):
    """Complex: arg(x). Real: 0 for x >= 0, pi for x < 0, NaN kept (integers become float)."""
    from torch_neuronx.lowering.common import KIND, cast, promote

    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    _, result = promote(x, kind=KIND.INT_TO_FLOAT)
    x = cast(x, result)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(jnp.pi, result), jnp.zeros((), result)))


@lowering(aten.complex)
def complex_(real, imag):
    return jax.lax.complex(real, imag)


@lowering(aten.polar)
def polar(magnitude, phase):
    return jax.lax.complex(magnitude * jnp.cos(phase), magnitude * jnp.sin(phase))


@lowering(aten.conj_physical, aten._conj, aten._conj_copy, aten._conj_physical)
def conj_physical(x):
    """The conjugate. `_conj` (the conjugate view, in the backward of complex
    products such as complex rotary embeddings) is the same value in a
    functional graph."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _shrink_backward(grad, x, lambd):
    """Both shrink functions are flat on [-lambd, lambd] and have slope 1 outside."""
    inside = (x >= -lambd) & (x <= lambd)
    return jnp.where(inside, jnp.zeros((), grad.dtype), grad)


lowering(aten.hardshrink_backward, aten.softshrink_backward)(_shrink_backward)


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


# ------------------------------------------------------------ backward ops
@lowering(aten._weight_norm_interface_backward)
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """w = g v / ||v|| (norm over every dim but `dim`): gradients for v and g."""
    from torch_neuronx.lowering.common import acc_dtype

    math_dtype = acc_dtype(saved_v.dtype)
    grad, v = grad_w.astype(math_dtype), saved_v.astype(math_dtype)
    g, norms = saved_g.astype(math_dtype), saved_norms.astype(math_dtype)
    other = tuple(d for d in range(v.ndim) if d != dim % v.ndim)
    per_dim = jnp.sum(grad * v, axis=other, keepdims=True)
    grad_v = (g / norms) * (grad - v * (per_dim / (norms * norms)))
    grad_g = per_dim / norms
    return grad_v.astype(saved_v.dtype), grad_g.astype(saved_g.dtype)


@lowering(aten._pdist_backward)
def pdist_backward(grad, x, p, pdist):
    """d pdist / d x: each pair (i < j) sends grad * d||x_i - x_j||_p / d x_i to row i and its
    negative to row j; pairs at distance 0 send nothing."""
    import numpy as np

    from torch_neuronx.lowering.common import acc_dtype

    math_dtype = acc_dtype(x.dtype)
    rows, cols = np.triu_indices(x.shape[0], 1)
    v = x.astype(math_dtype)
    diff = v[rows] - v[cols]
    dist = pdist.astype(math_dtype)[:, None]
    zero = jnp.zeros((), math_dtype)
    if p == 0:
        local = jnp.zeros_like(diff)
    elif p == 1:
        local = jnp.sign(diff)
    elif p == float("inf"):
        local = jnp.sign(diff) * (jnp.abs(diff) == dist)
    elif p < 2:
        local = jnp.where((dist == 0) | (diff == 0), zero,
                          jnp.sign(diff) * jnp.power(jnp.abs(diff), p - 1) / jnp.power(dist, p - 1))
    elif p == 2:
        local = jnp.where(dist == 0, zero, diff / dist)
    else:
        local = jnp.where(dist == 0, zero, diff * jnp.power(jnp.abs(diff), p - 2) / jnp.power(dist, p - 1))
    contribution = grad.astype(math_dtype)[:, None] * local
    out = jnp.zeros_like(v).at[rows].add(contribution).at[cols].add(-contribution)
    return out.astype(x.dtype)


# ------------------------------------------------------------------- losses
@lowering(aten.multilabel_margin_loss_forward)
def multilabel_margin_loss_forward(x, target, reduction):
    """(loss, is_target). Each row's targets are the entries of `target` before its first -1;
    loss_n = sum over target positions k and non-target classes c of
    max(0, 1 - x[t_k] + x[c]) / C.

    Note: PyTorch 2.13's decomposition of this op (in core_aten_decompositions, which the
    compiler applies first) does not mask the positions after the -1 and disagrees with
    the CPU kernel; this lowering takes over once the op is dropped from that table."""
    vector = x.ndim <= 1  # one sample (a 0-dim input is one sample of one class)
    rows, labels = (x.reshape(1, -1), target.reshape(1, -1)) if vector else (x, target)
    classes = rows.shape[-1]
    valid = jnp.cumprod(labels != -1, axis=-1).astype(jnp.bool_)
    picked = jnp.where(valid, labels, 0)
    hits = valid[..., :, None] & (picked[..., :, None] == jnp.arange(classes))
    is_target = jnp.any(hits, axis=-2)
    scores = jnp.take_along_axis(rows, picked, axis=-1)
    margins = jnp.maximum(1 - scores[..., :, None] + rows[..., None, :], 0)
    counted = valid[..., :, None] & ~is_target[..., None, :]
    loss = jnp.sum(jnp.where(counted, margins, 0), axis=(-2, -1)) / classes
    is_target = is_target.astype(x.dtype)
    if vector:
        loss, is_target = loss[0], is_target[0].reshape(target.shape)
    if reduction == 1:
        loss = jnp.mean(loss)
    elif reduction == 2:
        loss = jnp.sum(loss)
    return loss.astype(x.dtype), is_target


# ----------------------------------------------------------- embedding bags
_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices, offsets, include_last_offset):
    """(number of bags, bag of each index): index i belongs to the last bag starting at or before i."""
    count = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    starts = offsets[:count]
    positions = jnp.arange(indices.shape[0])
    return count, jnp.searchsorted(starts, positions, side="right") - 1


def _segment_sum(values, bag, count):
    return jax.ops.segment_sum(values, bag, num_segments=count)


@lowering(aten._embedding_bag, aten._embedding_bag_forward_only)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """(output, offset2bag, bag_size, max_indices) with PyTorch's CPU conventions: in sum mode
    bag_size and max_indices are zeros, and offset2bag is empty unless padding_idx is set
    (the kernel's fast path); in mean mode max_indices repeats bag_size; empty bags give 0."""
    count, bag = _bags(indices, offsets, include_last_offset)
    itype = indices.dtype
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    rows = jnp.take(weight, indices, axis=0)
    sizes = _segment_sum(keep.astype(itype), bag, count)
    fast_path = mode == _SUM and padding_idx < 0 and weight.dtype in (jnp.float32, jnp.float16, jnp.bfloat16)
    offset2bag = jnp.zeros((0,), itype) if fast_path else bag.astype(itype)
    if mode == _MAX:
        masked = jnp.where(keep[:, None], rows, -jnp.inf)
        best = jax.ops.segment_max(masked, bag, num_segments=count)
        empty = (sizes == 0)[:, None]
        output = jnp.where(empty, 0, best).astype(weight.dtype)
        positions = jnp.arange(indices.shape[0])[:, None]
        first = jax.ops.segment_min(jnp.where(keep[:, None] & (masked == best[bag]), positions, indices.shape[0]),
                                    bag, num_segments=count)
        picked = jnp.take(indices, jnp.clip(first, 0, max(indices.shape[0] - 1, 0)))
        max_indices = jnp.where(empty, 0, picked).astype(itype)
        return output, offset2bag, sizes, max_indices
    scale = keep.astype(weight.dtype)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(weight.dtype)
    total = _segment_sum(rows * scale[:, None], bag, count)
    if mode == _SUM:
        zeros = jnp.zeros((count,), itype)
        return total.astype(weight.dtype), offset2bag, zeros, zeros
    mean = total / jnp.maximum(sizes, 1)[:, None].astype(total.dtype)
    return jnp.where((sizes == 0)[:, None], 0, mean).astype(weight.dtype), offset2bag, sizes, sizes


def _embedding_bag_grad(grad, indices, bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
                        per_sample_weights, padding_idx):
    if mode == _MAX:
        width = grad.shape[1]
        filled = (bag_size > 0)[:, None]
        columns = jnp.broadcast_to(jnp.arange(width), grad.shape)
        out = jnp.zeros((num_weights, width), grad.dtype)
        return out.at[maximum_indices, columns].add(jnp.where(filled, grad, 0))
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    scale = keep.astype(grad.dtype)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(grad.dtype)
    if mode == _MEAN:
        scale = scale / jnp.maximum(bag_size[bag], 1).astype(grad.dtype)
    if scale_grad_by_freq:
        # PyTorch's CPU kernel does not scale by the plain frequency of each index here
        # (its sorted-run bookkeeping gives other factors); not reproduced.
        raise NotImplementedError("EmbeddingBag(scale_grad_by_freq=True) has no lowering: compile without it, "
                                  "or run the embedding bag eagerly")
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[indices].add(grad[bag] * scale[:, None])


@lowering(aten._embedding_bag_backward)
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    """The weight's (dense) gradient; the bags are recomputed from offsets, since the forward's
    offset2bag is empty on its fast path."""
    if sparse:
        raise NotImplementedError("EmbeddingBag(sparse=True) has no lowering (sparse gradients); use sparse=False")
    include_last = offsets.shape[0] == grad.shape[0] + 1
    _, bag = _bags(indices, offsets, include_last)
    return _embedding_bag_grad(grad, indices, bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
                               per_sample_weights, padding_idx)


@lowering(aten._embedding_bag_dense_backward)
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    return _embedding_bag_grad(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
                               mode, per_sample_weights, padding_idx)
