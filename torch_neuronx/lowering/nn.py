"""Lowerings of neural-network ops: convolution, pooling, normalization, softmax,
losses, attention, upsampling, embedding bags (see torch_neuronx/lowering/__init__.py).

float16/bfloat16 inputs are computed in float32 and rounded once at the end,
as PyTorch's CPU kernels do. Backward ops of linear forward ops (convolution,
average pooling, upsampling, padding) are the vjp of the forward lowering, so
forward and backward always agree; max pooling scatters through the saved
indices exactly as PyTorch does.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_neuronx.lowering import lowering
from torch_neuronx.lowering.elementwise import gelu
from torch_neuronx.lowering.common import acc_dtype, as_tuple, jax_dtype

aten = torch.ops.aten


def _acc(x):
    return x.astype(acc_dtype(x.dtype))


# -------------------------------------------------------------------- softmax
@lowering(aten._softmax)
def softmax(x, dim, half_to_float=False):
    out = jnp.float32 if half_to_float else x.dtype
    if x.ndim == 0:
        return jnp.ones((), out)
    v = _acc(x)
    shifted = v - jax.lax.stop_gradient(jnp.max(v, axis=dim, keepdims=True))
    e = jnp.exp(shifted)
    return (e / jnp.sum(e, axis=dim, keepdims=True)).astype(out)


@lowering(aten._log_softmax)
def log_softmax(x, dim, half_to_float=False):
    out = jnp.float32 if half_to_float else x.dtype
    if x.ndim == 0:
        return jnp.zeros((), out)
    v = _acc(x)
    shifted = v - jax.lax.stop_gradient(jnp.max(v, axis=dim, keepdims=True))
    return (shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=dim, keepdims=True))).astype(out)


@lowering(aten._softmax_backward_data)
def softmax_backward(grad, out, dim, input_dtype):
    g, y = _acc(grad), _acc(out)
    if y.ndim == 0:
        return jnp.zeros((), jax_dtype(input_dtype))
    return (y * (g - jnp.sum(g * y, axis=dim, keepdims=True))).astype(jax_dtype(input_dtype))


@lowering(aten._log_softmax_backward_data)
def log_softmax_backward(grad, out, dim, input_dtype):
    g, y = _acc(grad), _acc(out)
    if y.ndim == 0:
        return jnp.zeros((), jax_dtype(input_dtype))
    return (g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)).astype(jax_dtype(input_dtype))


# -------------------------------------------------------------- normalization
@lowering(aten.native_layer_norm)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    v = _acc(x)
    average = jnp.mean(v, axis=axes, keepdims=True)
    centered = v - average
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=axes, keepdims=True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * _acc(weight)
    if bias is not None:
        out = out + _acc(bias)
    return out.astype(x.dtype), average.astype(x.dtype), rstd.astype(x.dtype)


@lowering(aten.native_layer_norm_backward)
def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    g, v, mu, r = _acc(grad_out), _acc(x), _acc(mean), _acc(rstd)
    x_hat = (v - mu) * r
    gw = g * _acc(weight) if weight is not None else g
    count = math.prod(x.shape[a] for a in axes)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = (r / count) * (
            count * gw - jnp.sum(gw, axis=axes, keepdims=True)
            - x_hat * jnp.sum(gw * x_hat, axis=axes, keepdims=True)
        )
        grad_input = grad_input.astype(x.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = jnp.sum(g * x_hat, axis=lead).astype(weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = jnp.sum(g, axis=lead).astype(bias.dtype)
    return grad_input, grad_weight, grad_bias


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    v = _acc(x).reshape(n, group, (c // group) * hxw)
    average = jnp.mean(v, axis=-1, keepdims=True)
    centered = v - average
    rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + eps)
    out = (centered * rstd).reshape(n, c, hxw)
    if weight is not None:
        out = out * _acc(weight).reshape(1, c, 1)
    if bias is not None:
        out = out + _acc(bias).reshape(1, c, 1)
    return out.reshape(x.shape), average.reshape(n, group), rstd.reshape(n, group)


@lowering(aten.native_group_norm)
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    out, average, rstd = _group_norm(x, weight, bias, n, c, hxw, group, eps)
    return out.astype(x.dtype), average.astype(x.dtype), rstd.astype(x.dtype)


@lowering(aten.native_group_norm_backward)
def native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    g = _acc(grad_out).reshape(n, c, hxw)
    v = _acc(x).reshape(n, group, (c // group) * hxw)
    mu = _acc(mean).reshape(n, group, 1)
    r = _acc(rstd).reshape(n, group, 1)
    x_hat = ((v - mu) * r).reshape(n, c, hxw)
    gw = g * _acc(weight).reshape(1, c, 1) if weight is not None else g
    gw_grouped = gw.reshape(n, group, (c // group) * hxw)
    x_hat_grouped = x_hat.reshape(n, group, (c // group) * hxw)
    count = v.shape[-1]
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = (r / count) * (
            count * gw_grouped - jnp.sum(gw_grouped, axis=-1, keepdims=True)
            - x_hat_grouped * jnp.sum(gw_grouped * x_hat_grouped, axis=-1, keepdims=True)
        )
        grad_input = grad_input.reshape(x.shape).astype(x.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = jnp.sum(g * x_hat, axis=(0, 2)).astype(weight.dtype)
    if output_mask[2]:
        grad_bias = jnp.sum(g, axis=(0, 2)).astype(x.dtype if weight is None else weight.dtype)
    return grad_input, grad_weight, grad_bias


def _channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new running mean, new running var)."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _channel_shape(x)
    stats_dtype = running_mean.dtype if running_mean is not None else x.dtype
    v = _acc(x)
    new_mean, new_var = running_mean, running_var
    if training:
        average = jnp.mean(v, axis=axes)
        centered = v - average.reshape(shape)
        variance = jnp.mean(centered * centered, axis=axes)
        invstd = jax.lax.rsqrt(variance + eps)
        count = x.size // x.shape[1]
        if running_mean is not None:
            new_mean = ((1 - momentum) * _acc(running_mean) + momentum * average).astype(running_mean.dtype)
        if running_var is not None:
            unbiased = variance * (count / max(count - 1, 1))
            new_var = ((1 - momentum) * _acc(running_var) + momentum * unbiased).astype(running_var.dtype)
        save_mean, save_invstd = average.astype(stats_dtype), invstd.astype(stats_dtype)
    else:
        average = _acc(running_mean)
        invstd = jax.lax.rsqrt(_acc(running_var) + eps)
        save_mean = save_invstd = jnp.zeros((0,), stats_dtype)
    out = (v - average.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * _acc(weight).reshape(shape)
    if bias is not None:
        out = out + _acc(bias).reshape(shape)
    return out.astype(x.dtype), save_mean, save_invstd, new_mean, new_var


@lowering(aten._native_batch_norm_legit)
def native_batch_norm_legit(x, weight, bias, *args):
    if len(args) == 3:  # .no_stats(input, weight, bias, training, momentum, eps)
        training, momentum, eps = args
        return _batch_norm(x, weight, bias, None, None, True, momentum, eps)[:3]
    running_mean, running_var, training, momentum, eps = args
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_functional)
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering(aten._native_batch_norm_legit_no_training)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering(aten.native_batch_norm)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@lowering(aten.native_batch_norm_backward)
def native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _channel_shape(x)
    g, v = _acc(grad_out), _acc(x)
    if train:
        average, invstd = _acc(save_mean), _acc(save_invstd)
    else:
        average, invstd = _acc(running_mean), jax.lax.rsqrt(_acc(running_var) + eps)
    x_hat = (v - average.reshape(shape)) * invstd.reshape(shape)
    grad_sum = jnp.sum(g, axis=axes)
    dot = jnp.sum(g * x_hat, axis=axes)
    scale = invstd * (_acc(weight) if weight is not None else 1.0)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            count = x.size // x.shape[1]
            centered = g - (grad_sum / count).reshape(shape) - x_hat * (dot / count).reshape(shape)
            grad_input = centered * scale.reshape(shape)
        else:
            grad_input = g * scale.reshape(shape)
        grad_input = grad_input.astype(x.dtype)
    param_dtype = weight.dtype if weight is not None else x.dtype
    if output_mask[1]:
        grad_weight = dot.astype(param_dtype)
    if output_mask[2]:
        grad_bias = grad_sum.astype(param_dtype)
    return grad_input, grad_weight, grad_bias


@lowering(aten.batch_norm_backward)
def batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    return native_batch_norm_backward(grad_out, x, weight, running_mean, running_var, save_mean, save_var,
                                      update, eps, output_mask)


# ---------------------------------------------------------------- convolution
def _dimension_numbers(spatial: int):
    letters = "DHW"[-spatial:] if spatial <= 3 else None
    return ("NC" + letters, "OI" + letters, "NC" + letters)


def _convolution(x, weight, stride, padding, dilation, transposed, output_padding, groups):
    spatial = weight.ndim - 2
    batched = x.ndim == spatial + 2
    if not batched:
        x = x[None]
    stride, padding = as_tuple(stride, spatial), as_tuple(padding, spatial)
    dilation, output_padding = as_tuple(dilation, spatial), as_tuple(output_padding, spatial)
    low = x.dtype in (jnp.float16, jnp.bfloat16)
    preferred = jnp.float32 if low else None
    if not transposed:
        out = jax.lax.conv_general_dilated(
            x, weight, stride, [(p, p) for p in padding], rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(spatial), feature_group_count=groups,
            preferred_element_type=preferred,
        )
    else:
        # A transposed convolution is the gradient of a convolution with respect
        # to its input: dilate the input by the stride, pad by dilation*(k-1)-p
        # (+ output_padding on the high side), flip the kernel, swap in/out channels.
        c_in, c_out_per_group = weight.shape[:2]
        kernel = weight.shape[2:]
        w = weight.reshape((groups, c_in // groups, c_out_per_group) + kernel)
        w = jnp.swapaxes(w, 1, 2).reshape((groups * c_out_per_group, c_in // groups) + kernel)
        w = jnp.flip(w, axis=tuple(range(2, 2 + spatial)))
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(kernel, padding, dilation, output_padding)
        ]
        out = jax.lax.conv_general_dilated(
            x, w, (1,) * spatial, pads, lhs_dilation=stride, rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(spatial), feature_group_count=groups,
            preferred_element_type=preferred,
        )
    return out if batched else out[0]


@lowering(aten.convolution)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _convolution(x, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        channel = 0 if out.ndim == weight.ndim - 1 else 1
        out = out + _acc(bias).reshape((-1,) + (1,) * (out.ndim - channel - 1))
    return out.astype(x.dtype)


@lowering(aten.convolution_backward)
def convolution_backward(grad_output, x, weight, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    def forward(a, b):
        return _convolution(a, b, stride, padding, dilation, transposed, output_padding, groups)

    primal_out, pullback = jax.vjp(forward, x, weight)
    grad_input, grad_weight = pullback(grad_output.astype(primal_out.dtype))
    grad_bias = None
    if output_mask[2]:
        batched = grad_output.ndim == weight.ndim
        axes = tuple(a for a in range(grad_output.ndim) if a != (1 if batched else 0))
        grad_bias = jnp.sum(_acc(grad_output), axis=axes).astype(grad_output.dtype)
    return (
        grad_input.astype(x.dtype) if output_mask[0] else None,
        grad_weight.astype(weight.dtype) if output_mask[1] else None,
        grad_bias,
    )


# -------------------------------------------------------------------- pooling
def _pool_out(size, k, s, p, d, ceil_mode):
    """PyTorch's pooling output size."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_params(spatial, kernel, stride, padding, dilation=1):
    kernel = as_tuple(kernel, spatial)
    stride = as_tuple(stride, spatial) if stride not in (None, [], ()) else kernel
    return kernel, stride, as_tuple(padding, spatial), as_tuple(dilation, spatial)


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf
    return jnp.iinfo(dtype).min


def _argmax_window(a, b):
    """Reducer over (value, flat index) pairs: the larger value wins, NaN above all,
    ties to the smaller index (the first in PyTorch's scan order)."""
    (av, ai), (bv, bi) = a, b
    if jnp.issubdtype(av.dtype, jnp.floating):
        a_nan, b_nan = jnp.isnan(av), jnp.isnan(bv)
        a_wins = ((av > bv) & ~b_nan) | ((av == bv) & (ai < bi)) | (a_nan & ~b_nan) | (a_nan & b_nan & (ai < bi))
    else:
        a_wins = (av > bv) | ((av == bv) & (ai < bi))
    return jax.lax.select(a_wins, av, bv), jax.lax.select(a_wins, ai, bi)


def _max_pool(spatial):
    def lower(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        kernel, stride, padding, dilation = _pool_params(spatial, kernel_size, stride, padding, dilation)
        sizes = x.shape[-spatial:]
        lead = x.ndim - spatial
        outs = [_pool_out(*args, ceil_mode) for args in zip(sizes, kernel, stride, padding, dilation)]
        high = [max(0, (o - 1) * s + (k - 1) * d + 1 - (n + p))
                for o, s, k, d, n, p in zip(outs, stride, kernel, dilation, sizes, padding)]
        # flat index of each input element within its (spatial) plane
        index = sum(jax.lax.broadcasted_iota(jnp.int64, x.shape, lead + i) * math.prod(sizes[i + 1:])
                    for i in range(spatial))
        values, indices = jax.lax.reduce_window(
            (x, index), (np.asarray(_lowest(x.dtype), x.dtype), np.int64(-1)), _argmax_window,
            (1,) * lead + kernel, (1,) * lead + stride,
            [(0, 0)] * lead + list(zip(padding, high)), window_dilation=(1,) * lead + dilation,
        )
        crop = (Ellipsis,) + tuple(slice(0, o) for o in outs)
        return values[crop], indices[crop]

    return lower


def _scatter_by_indices(grad, x, indices, spatial):
    lead = x.shape[:-spatial]
    size = math.prod(x.shape[-spatial:])
    rows = math.prod(lead)
    per_row = math.prod(grad.shape[-spatial:])
    g = _acc(grad).reshape(rows, per_row)
    idx = indices.reshape(rows, per_row)
    out = jnp.zeros((rows, size), g.dtype).at[jnp.arange(rows)[:, None], idx].add(g)
    return out.reshape(x.shape).astype(x.dtype)


def _max_pool_backward(spatial):
    def lower(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
        return _scatter_by_indices(grad, x, indices, spatial)

    return lower


for _n in (2, 3):
    lowering(getattr(aten, f"max_pool{_n}d_with_indices"))(_max_pool(_n))
    lowering(getattr(aten, f"max_pool{_n}d_with_indices_backward"))(_max_pool_backward(_n))


def _window_sizes(counts):
    """Elements per pooling window: outer product of the per-axis counts."""
    divisor = counts[0]
    for c in counts[1:]:
        divisor = np.multiply.outer(divisor, c)
    return divisor


def _avg_pool(spatial):
    def lower(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
        kernel, stride, padding, _ = _pool_params(spatial, kernel_size, stride, padding)
        sizes = x.shape[-spatial:]
        outs = [_pool_out(n, k, s, p, 1, ceil_mode) for n, k, s, p in zip(sizes, kernel, stride, padding)]
        high = [max(p, (o - 1) * s + k - n - p) for o, s, k, n, p in zip(outs, stride, kernel, sizes, padding)]
        v = _acc(x)
        lead = x.ndim - spatial
        config = [(0, 0, 0)] * lead + [(p, h, 0) for p, h in zip(padding, high)]
        padded = jax.lax.pad(v, jnp.zeros((), v.dtype), config)
        total = jax.lax.reduce_window(padded, np.zeros((), v.dtype), jax.lax.add,
                                      (1,) * lead + kernel, (1,) * lead + stride, "VALID")
        total = total[(Ellipsis,) + tuple(slice(0, o) for o in outs)]
        if divisor_override:
            divisor = np.asarray(float(divisor_override))
        else:
            counts = []
            for n, k, s, p, o in zip(sizes, kernel, stride, padding, outs):
                start = np.arange(o) * s - p
                end = np.minimum(start + k, n + p)
                if count_include_pad:
                    counts.append(end - start)
                else:
                    counts.append(np.minimum(end, n) - np.maximum(start, 0))
            divisor = _window_sizes(counts)
        return (total / jnp.asarray(divisor, v.dtype)).astype(x.dtype)

    return lower


def _avg_pool_backward(spatial):
    forward = _avg_pool(spatial)

    def lower(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        _, pullback = jax.vjp(lambda v: forward(v, kernel_size, stride, padding, ceil_mode,
                                                count_include_pad, divisor_override), x)
        return pullback(grad.astype(x.dtype))[0]

    return lower


for _n in (2, 3):
    lowering(getattr(aten, f"avg_pool{_n}d"))(_avg_pool(_n))
    lowering(getattr(aten, f"avg_pool{_n}d_backward"))(_avg_pool_backward(_n))


def _adaptive_windows(size, out):
    """PyTorch's adaptive pooling windows: [floor(i*n/o), ceil((i+1)*n/o))."""
    start = (np.arange(out) * size) // out
    end = -((-(np.arange(out) + 1) * size) // out)
    return start, end


def _adaptive_avg(spatial):
    def lower(x, output_size):
        outs = as_tuple(output_size, spatial)
        v = _acc(x)
        counts = []
        for i, o in enumerate(outs):
            axis = x.ndim - spatial + i
            n = x.shape[axis]
            start, end = _adaptive_windows(n, o)
            member = ((np.arange(n)[None, :] >= start[:, None]) & (np.arange(n)[None, :] < end[:, None]))
            v = jnp.moveaxis(jnp.tensordot(v, jnp.asarray(member.T, v.dtype), axes=([axis], [0])), -1, axis)
            counts.append(end - start)
        divisor = _window_sizes(counts)
        return (v / jnp.asarray(divisor, v.dtype)).astype(x.dtype)

    return lower


def _adaptive_avg_backward(spatial):
    forward = _adaptive_avg(spatial)

    def lower(grad, x):
        _, pullback = jax.vjp(lambda v: forward(v, grad.shape[-spatial:]), x)
        return pullback(grad.astype(x.dtype))[0]

    return lower


for _n in (2, 3):
    lowering(getattr(aten, f"_adaptive_avg_pool{_n}d"))(_adaptive_avg(_n))
    lowering(getattr(aten, f"_adaptive_avg_pool{_n}d_backward"))(_adaptive_avg_backward(_n))


def _adaptive_max(spatial):
    def lower(x, output_size):
        outs = as_tuple(output_size, spatial)
        sizes = x.shape[-spatial:]
        tables = []
        for n, o in zip(sizes, outs):
            start, end = _adaptive_windows(n, o)
            longest = int((end - start).max())
            tables.append(np.minimum(start[:, None] + np.arange(longest)[None, :], end[:, None] - 1))
        # gather [..., o1, .., on, l1, .., ln] one spatial dim at a time
        lead = x.ndim - spatial
        v = x
        for i, table in enumerate(tables):
            v = jnp.take(v, jnp.asarray(table), axis=lead + i)  # axis -> (o_i, l_i)
            v = jnp.moveaxis(v, lead + i + 1, -1)
        windows = v.reshape(v.shape[:lead + spatial] + (math.prod(t.shape[1] for t in tables),))
        choice = jnp.argmax(windows, axis=-1)
        values = jnp.take_along_axis(windows, choice[..., None], axis=-1)[..., 0]
        strides_flat = [math.prod(sizes[i + 1:]) for i in range(spatial)]
        position = np.zeros(tuple(outs) + tuple(t.shape[1] for t in tables), np.int64)
        for i, (table, sf) in enumerate(zip(tables, strides_flat)):
            shape = [1] * (2 * spatial)
            shape[i], shape[spatial + i] = table.shape
            position = position + table.reshape(shape) * sf
        position = jnp.asarray(position.reshape(tuple(outs) + (-1,)))
        indices = jnp.take_along_axis(jnp.broadcast_to(position, windows.shape), choice[..., None], axis=-1)[..., 0]
        return values, indices

    return lower


def _adaptive_max_backward(spatial):
    def lower(grad, x, indices):
        return _scatter_by_indices(grad, x, indices, spatial)

    return lower


for _n in (2, 3):
    lowering(getattr(aten, f"adaptive_max_pool{_n}d"))(_adaptive_max(_n))
    lowering(getattr(aten, f"adaptive_max_pool{_n}d_backward"))(_adaptive_max_backward(_n))


@lowering(aten.im2col)
def im2col(x, kernel_size, dilation, padding, stride):
    kernel, stride, padding, dilation = _pool_params(2, kernel_size, stride, padding, dilation)
    batched = x.ndim == 4
    if not batched:
        x = x[None]
    sizes = x.shape[-2:]
    outs = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, s, p, d in zip(sizes, kernel, stride, padding, dilation)]
    padded = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    columns = []
    for offsets in itertools.product(*[range(k) for k in kernel]):
        window = padded
        for i, (off, d, o, s) in enumerate(zip(offsets, dilation, outs, stride)):
            window = jax.lax.slice_in_dim(window, off * d, off * d + (o - 1) * s + 1, s, 2 + i)
        columns.append(window.reshape(window.shape[0], window.shape[1], math.prod(outs)))
    out = jnp.stack(columns, axis=2)  # N, C, K, L
    out = out.reshape(out.shape[0], out.shape[1] * out.shape[2], out.shape[3])
    return out if batched else out[0]


@lowering(aten.col2im)
def col2im(x, output_size, kernel_size, dilation, padding, stride):
    batched = x.ndim == 3
    if not batched:
        x = x[None]
    channels = x.shape[1] // math.prod(as_tuple(kernel_size, 2))
    zeros = jnp.zeros((x.shape[0], channels) + tuple(output_size), x.dtype)
    _, pullback = jax.vjp(lambda v: im2col(v, kernel_size, dilation, padding, stride), zeros)
    out = pullback(x)[0]
    return out if batched else out[0]


# ----------------------------------------------------------------- upsampling
def _scale(scale, size_in, size_out, align_corners=False):
    if align_corners:
        return (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else size_in / size_out


def _vec_args(x, spatial, output_size, scale_factors):
    sizes = x.shape[-spatial:]
    if output_size is None:
        output_size = [int(math.floor(n * s)) for n, s in zip(sizes, scale_factors)]
    scales = list(scale_factors) if scale_factors is not None else [None] * spatial
    return list(output_size), scales


def _nearest_source(size_in, size_out, scale, exact):
    ratio = np.float32(_scale(scale, size_in, size_out))
    dst = np.arange(size_out, dtype=np.float32)
    src = np.floor(((dst + np.float32(0.5)) if exact else dst) * ratio).astype(np.int64)
    return np.minimum(src, size_in - 1)


_SCALE_NAMES = ("scales_d", "scales_h", "scales_w", "scales")


def _upsample_args(x, spatial, output_size, args, kwargs):
    """(output sizes, scales) from the .default (per-dim scales) and .vec (scale_factors) overloads."""
    if "scale_factors" in kwargs or (len(args) == 1 and (args[0] is None or isinstance(args[0], (list, tuple)))):
        factors = kwargs.get("scale_factors", args[0] if args else None)
        return _vec_args(x, spatial, output_size, factors)
    scales = list(args) + [kwargs[name] for name in _SCALE_NAMES if name in kwargs]
    return list(output_size), scales + [None] * (spatial - len(scales))


def _upsample_nearest(spatial, exact=False):
    def lower(x, output_size, *args, **kwargs):
        output_size, scales = _upsample_args(x, spatial, output_size, args, kwargs)
        out = x
        for i, (o, s) in enumerate(zip(output_size, scales)):
            axis = x.ndim - spatial + i
            out = jnp.take(out, jnp.asarray(_nearest_source(x.shape[axis], o, s, exact)), axis=axis)
        return out

    return lower


def _linear_weights(size_in, size_out, align_corners, scale):
    """Interpolation matrix (out, in) of PyTorch's linear upsampling along one dim."""
    ratio = np.float32(_scale(scale, size_in, size_out, align_corners))
    dst = np.arange(size_out, dtype=np.float32)
    if align_corners:
        src = ratio * dst
    else:
        src = np.maximum(ratio * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0))
    low = src.astype(np.int64)
    high = low + (low < size_in - 1)
    frac = (src - low).astype(np.float32)
    weights = np.zeros((size_out, size_in), np.float32)
    np.add.at(weights, (np.arange(size_out), low), np.float32(1) - frac)
    np.add.at(weights, (np.arange(size_out), high), frac)
    return weights


def _upsample_linear(spatial):
    def lower(x, output_size, align_corners, *args, **kwargs):
        output_size, scales = _upsample_args(x, spatial, output_size, args, kwargs)
        v = _acc(x)
        for i, (o, s) in enumerate(zip(output_size, scales)):
            axis = x.ndim - spatial + i
            weights = jnp.asarray(_linear_weights(x.shape[axis], o, align_corners, s).T, v.dtype)
            v = jnp.moveaxis(jnp.tensordot(v, weights, axes=([axis], [0])), -1, axis)
        return v.astype(x.dtype)

    return lower


def _upsample_backward(forward):
    def lower(grad, output_size, input_size, *args, **kwargs):
        x = jnp.zeros(tuple(input_size), grad.dtype)
        _, pullback = jax.vjp(lambda v: forward(v, output_size, *args, **kwargs), x)
        return pullback(grad)[0]

    return lower


for _n, _name in [(1, "linear1d"), (2, "bilinear2d"), (3, "trilinear3d")]:
    _forward = _upsample_linear(_n)
    lowering(getattr(aten, f"upsample_{_name}"))(_forward)
    lowering(getattr(aten, f"upsample_{_name}_backward"))(_upsample_backward(_forward))
for _n in (1, 2, 3):
    for _exact, _prefix in [(False, "upsample_nearest"), (True, "_upsample_nearest_exact")]:
        _forward = _upsample_nearest(_n, _exact)
        lowering(getattr(aten, f"{_prefix}{_n}d"))(_forward)
        lowering(getattr(aten, f"{_prefix}{_n}d_backward"))(_upsample_backward(_forward))


# --------------------------------------------------------------------- losses
def _reduce(loss, reduction):
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _nll_parts(x, target, weight, ignore_index):
    """Per-sample weights (0 where ignored) and the class column to pick, for (N, C) input."""
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    w = jnp.take(_acc(weight), safe) if weight is not None else jnp.ones(target.shape, acc_dtype(x.dtype))
    return jnp.where(valid, w, 0), safe


def _nll_flat(x, target):
    """(N, C) input and (N,) target from the 1-D, 2-D and (N, C, d...) layouts."""
    if x.ndim == 1:
        return x[None], target.reshape(1)
    if x.ndim > 2:
        return jnp.moveaxis(x, 1, -1).reshape(-1, x.shape[1]), target.reshape(-1)
    return x, target


def _nll_forward(x, target, weight, reduction, ignore_index):
    flat, flat_target = _nll_flat(x, target)
    w, safe = _nll_parts(flat, flat_target, weight, ignore_index)
    picked = jnp.take_along_axis(_acc(flat), safe[:, None], axis=1)[:, 0]
    losses = -picked * w
    total_weight = jnp.sum(w)
    if reduction == 0:
        return losses.reshape(target.shape).astype(x.dtype), jnp.zeros((), x.dtype)
    loss = jnp.sum(losses) if reduction == 2 else jnp.sum(losses) / total_weight
    return loss.astype(x.dtype), total_weight.astype(x.dtype)


def _nll_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    flat, flat_target = _nll_flat(x, target)
    w, safe = _nll_parts(flat, flat_target, weight, ignore_index)
    g = _acc(grad_output)
    coefficient = -w * (g.reshape(-1) if reduction == 0 else g)
    if reduction == 1:
        coefficient = coefficient / _acc(total_weight)
    rows = jnp.arange(flat.shape[0])
    grad = jnp.zeros(flat.shape, coefficient.dtype).at[rows, safe].set(coefficient)
    if x.ndim > 2:
        grad = jnp.moveaxis(grad.reshape(x.shape[:1] + x.shape[2:] + x.shape[1:2]), -1, 1)
    return grad.reshape(x.shape).astype(x.dtype)


for _name in ("nll_loss_forward", "nll_loss2d_forward"):
    lowering(getattr(aten, _name))(_nll_forward)
for _name in ("nll_loss_backward", "nll_loss2d_backward"):
    lowering(getattr(aten, _name))(_nll_backward)


@lowering(aten.mse_loss)
def mse_loss(x, target, reduction=1):
    d = _acc(x) - _acc(target)
    return _reduce(d * d, reduction).astype(x.dtype)


@lowering(aten.mse_loss_backward)
def mse_loss_backward(grad, x, target, reduction):
    d = _acc(x) - _acc(target)
    scale = 2.0 / x.size if reduction == 1 else 2.0
    return (scale * d * _acc(grad)).astype(x.dtype)


@lowering(aten.smooth_l1_loss)
def smooth_l1_loss(x, target, reduction=1, beta=1.0):
    d = jnp.abs(_acc(x) - _acc(target))
    loss = d if beta == 0 else jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    return _reduce(loss, reduction).astype(x.dtype)


@lowering(aten.smooth_l1_loss_backward)
def smooth_l1_loss_backward(grad, x, target, reduction, beta):
    d = _acc(x) - _acc(target)
    slope = jnp.sign(d) if beta == 0 else jnp.where(jnp.abs(d) < beta, d / beta, jnp.sign(d))
    scale = 1.0 / x.size if reduction == 1 else 1.0
    return (slope * _acc(grad) * scale).astype(x.dtype)


@lowering(aten.huber_loss)
def huber_loss(x, target, reduction=1, delta=1.0):
    d = jnp.abs(_acc(x) - _acc(target))
    loss = jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce(loss, reduction).astype(x.dtype)


@lowering(aten.huber_loss_backward)
def huber_loss_backward(grad, x, target, reduction, delta):
    d = _acc(x) - _acc(target)
    slope = jnp.where(jnp.abs(d) <= delta, d, delta * jnp.sign(d))
    scale = 1.0 / x.size if reduction == 1 else 1.0
    return (slope * _acc(grad) * scale).astype(x.dtype)


@lowering(aten.binary_cross_entropy)
def binary_cross_entropy(x, target, weight=None, reduction=1):
    p, y = _acc(x), _acc(target)
    loss = -(y * jnp.maximum(jnp.log(p), -100.0) + (1 - y) * jnp.maximum(jnp.log1p(-p), -100.0))
    if weight is not None:
        loss = loss * _acc(weight)
    return _reduce(loss, reduction).astype(x.dtype)


@lowering(aten.binary_cross_entropy_backward)
def binary_cross_entropy_backward(grad, x, target, weight=None, reduction=1):
    p, y = _acc(x), _acc(target)
    out = _acc(grad) * (p - y) / jnp.maximum((1 - p) * p, 1e-12)
    if weight is not None:
        out = out * _acc(weight)
    if reduction == 1:
        out = out / x.size
    return out.astype(x.dtype)


# ------------------------------------------------------------------ attention
def _attention(q, k, v, attn_mask, is_causal, scale):
    """Scaled dot-product attention in float32: (output, logsumexp over keys).

    Grouped-query attention (fewer key/value heads than query heads, what
    SDPA's enable_gqa=True hands the CPU kernel) shares each key/value head
    among consecutive query heads, as the kernel does; under jax.vjp the
    gradients of the shared heads are summed back into them. A row with every
    key masked gives zeros, as the CPU kernels do (PyTorch's _safe_softmax)."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        groups = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, groups, axis=-3), jnp.repeat(v, groups, axis=-3)
    scores = jnp.einsum("...le,...se->...ls", _acc(q), _acc(k)) * scale
    length, source = scores.shape[-2:]
    if is_causal:
        causal = np.tril(np.ones((length, source), bool))
        scores = jnp.where(causal, scores, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + _acc(attn_mask)
    peak = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    peak = jnp.where(jnp.isinf(peak), 0.0, peak)
    e = jnp.exp(scores - peak)
    total = jnp.sum(e, axis=-1, keepdims=True)
    out = jnp.einsum("...ls,...se->...le", e / jnp.where(total == 0, 1.0, total), _acc(v))
    return out, (jnp.log(total) + peak)[..., 0]


def _no_dropout(dropout_p):
    if dropout_p:
        raise NotImplementedError("attention with dropout_p > 0 is lowered by the random-op lowerings only")


@lowering(aten._scaled_dot_product_flash_attention_for_cpu)
def sdpa_flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    _no_dropout(dropout_p)
    out, lse = _attention(q, k, v, attn_mask, is_causal, scale)
    return out.astype(q.dtype), lse.astype(jnp.float32)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def sdpa_flash_cpu_backward(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None,
                            scale=None):
    _no_dropout(dropout_p)
    _, pullback = jax.vjp(lambda a, b, c: _attention(a, b, c, attn_mask, is_causal, scale)[0], q, k, v)
    grads = pullback(_acc(grad_out))
    return tuple(g.astype(t.dtype) for g, t in zip(grads, (q, k, v)))


def _check_heads(q, k, v):
    """TorchNeuron's refusal of key/value heads that do not divide the query heads."""
    if any(q.shape[-3] % t.shape[-3] for t in (k, v)):
        raise RuntimeError("Number of heads in key and value must divide the number of heads in query")


@lowering(aten._scaled_dot_product_fused_attention_overrideable)
def sdpa_overrideable(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                      scale=None):
    """The kernel TorchNeuron runs SDPA as (torch_neuronx/ops/attention.py); with
    dropout the compiler decomposes it first (its mask drawn on the host)."""
    _no_dropout(dropout_p)
    _check_heads(q, k, v)
    out, lse = _attention(q, k, v, attn_bias, is_causal, scale)
    empty = jnp.zeros((), jnp.int64)  # philox seed and offset: no dropout, nothing to redraw
    return (out.astype(q.dtype), lse.astype(jnp.float32), None, None, q.shape[-2], k.shape[-2], empty, empty,
            None)


@lowering(aten._scaled_dot_product_fused_attention_overrideable_backward)
def sdpa_overrideable_backward(grad_out, q, k, v, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                               cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset,
                               scale=None):
    """Gradients of the attention recomputed (as the CPU flash backward does), the
    mask's too when grad_input_mask asks for it."""
    _no_dropout(dropout_p)
    _check_heads(q, k, v)
    primals = (q, k, v, attn_bias) if attn_bias is not None and grad_input_mask[3] else (q, k, v)
    _, pullback = jax.vjp(
        lambda a, b, c, *m: _attention(a, b, c, m[0] if m else attn_bias, is_causal, scale)[0], *primals)
    grads = tuple(g.astype(t.dtype) for g, t in zip(pullback(_acc(grad_out)), primals))
    return grads if len(grads) == 4 else (*grads, None)


@lowering(aten._transformer_encoder_layer_fwd)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
                                  mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's inference fast path, as PyTorch's kernel computes it.

    The mask follows ATen's masked softmax: it is made boolean (any nonzero value
    masks, True masks) and broadcast as (L, S) for mask_type 0, (B, S) key padding
    for mask_type 1, (B, H, L, S) for mask_type 2; a row with every key masked
    gives NaN, as the CPU kernel does."""
    x = _acc(src)
    batch, length = x.shape[0], x.shape[1]
    head = embed_dim // num_heads

    def linear(h, weight, bias):
        return h @ _acc(weight).T + _acc(bias)

    def layer_norm(h, weight, bias):
        return native_layer_norm(h, [embed_dim], _acc(weight), _acc(bias), eps)[0]

    def attention(h):
        q, k, v = jnp.split(linear(h, qkv_weight, qkv_bias), 3, axis=-1)
        q, k, v = (t.reshape(batch, length, num_heads, head).transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = jnp.einsum("bhle,bhse->bhls", q, k) / math.sqrt(head)
        if mask is not None:
            masked = mask if mask.dtype == jnp.bool_ else mask != 0
            masked = masked[:, None, None, :] if mask_type == 1 else masked
            scores = jnp.where(masked, -jnp.inf, scores)
        weights = jax.nn.softmax(scores, axis=-1)  # NaN for a row with every key masked
        out = jnp.einsum("bhls,bhse->bhle", weights, v).transpose(0, 2, 1, 3).reshape(batch, length, embed_dim)
        return linear(out, proj_weight, proj_bias)

    def feed_forward(h):
        hidden = linear(h, ffn_weight_1, ffn_bias_1)
        hidden = gelu(hidden) if use_gelu else jnp.maximum(hidden, 0)
        return linear(hidden, ffn_weight_2, ffn_bias_2)

    if norm_first:
        x = x + attention(layer_norm(x, norm_weight_1, norm_bias_1))
        x = x + feed_forward(layer_norm(x, norm_weight_2, norm_bias_2))
    else:
        x = layer_norm(x + attention(x), norm_weight_1, norm_bias_1)
        x = layer_norm(x + feed_forward(x), norm_weight_2, norm_bias_2)
    return x.astype(src.dtype)


# ------------------------------------------------------------------ distances
def _pairwise(a, b, p):
    d = jnp.abs(a - b)
    if p == 0:
        return jnp.sum((d != 0).astype(d.dtype), axis=-1)
    if p == math.inf:
        return jnp.max(d, axis=-1)
    if p == 1:
        return jnp.sum(d, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(d * d, axis=-1))
    return jnp.sum(d ** p, axis=-1) ** (1.0 / p)


@lowering(aten._cdist_forward)
def cdist_forward(x1, x2, p, compute_mode=None):
    a, b = _acc(x1), _acc(x2)
    return _pairwise(a[..., :, None, :], b[..., None, :, :], p).astype(x1.dtype)


@lowering(aten._cdist_backward)
def cdist_backward(grad, x1, x2, p, cdist):
    _, pullback = jax.vjp(lambda a: cdist_forward(a, x2, p), x1)
    return pullback(grad.astype(x1.dtype))[0]


@lowering(aten._pdist_forward)
def pdist_forward(x, p=2.0):
    rows, cols = np.triu_indices(x.shape[0], 1)
    v = _acc(x)
    return _pairwise(v[rows], v[cols], p).astype(x.dtype)


@lowering(aten.pixel_shuffle)
def pixel_shuffle(x, upscale_factor):
    r = upscale_factor
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    y = jnp.transpose(y, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return y.reshape(*lead, c // (r * r), h * r, w * r)


@lowering(aten.pixel_unshuffle)
def pixel_unshuffle(x, downscale_factor):
    r = downscale_factor
    *lead, c, h, w = x.shape
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    n = len(lead)
    y = jnp.transpose(y, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return y.reshape(*lead, c * r * r, h // r, w // r)


# --------------------------------------------------------------- grid sampling
def _reflect(coordinate, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(coordinate)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = jnp.abs(coordinate - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _grid_source(coordinate, size, padding_mode, align_corners):
    """Pixel coordinate of a normalized [-1, 1] grid coordinate, after the padding rule."""
    if align_corners:
        pixel = (coordinate + 1) / 2 * (size - 1)
    else:
        pixel = ((coordinate + 1) * size - 1) / 2
    if padding_mode == 2:  # reflection
        pixel = _reflect(pixel, 0, 2 * (size - 1)) if align_corners else _reflect(pixel, -1, 2 * size - 1)
    if padding_mode in (1, 2):  # border, reflection: clip into the image
        pixel = jnp.clip(pixel, 0, size - 1)
    return pixel


def _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners):
    if interpolation_mode not in (0, 1):
        raise NotImplementedError("grid_sampler_2d: only bilinear (0) and nearest (1) modes are lowered")
    n, c, h, w = x.shape
    v, g = _acc(x), _acc(grid)
    ix = _grid_source(g[..., 0], w, padding_mode, align_corners)
    iy = _grid_source(g[..., 1], h, padding_mode, align_corners)
    batch = jnp.arange(n).reshape(n, 1, 1)

    def tap(yy, xx):
        inside = (yy >= 0) & (yy <= h - 1) & (xx >= 0) & (xx <= w - 1)
        yc = jnp.clip(yy, 0, h - 1).astype(jnp.int64)
        xc = jnp.clip(xx, 0, w - 1).astype(jnp.int64)
        picked = v[batch, :, yc, xc]  # (N, Ho, Wo, C)
        return jnp.where(inside[..., None], picked, 0)

    if interpolation_mode == 1:
        out = tap(jnp.round(iy), jnp.round(ix))
    else:
        x0, y0 = jnp.floor(ix), jnp.floor(iy)
        wx1, wy1 = ix - x0, iy - y0
        wx0, wy0 = 1 - wx1, 1 - wy1
        out = (tap(y0, x0) * (wy0 * wx0)[..., None] + tap(y0, x0 + 1) * (wy0 * wx1)[..., None]
               + tap(y0 + 1, x0) * (wy1 * wx0)[..., None] + tap(y0 + 1, x0 + 1) * (wy1 * wx1)[..., None])
    return jnp.moveaxis(out, -1, 1)


@lowering(aten.grid_sampler_2d)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners).astype(x.dtype)


@lowering(aten.grid_sampler_2d_backward)
def grid_sampler_2d_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, pullback = jax.vjp(lambda a, b: _grid_sample(a, b, interpolation_mode, padding_mode, align_corners),
                          x, grid)
    grad_input, grad_grid = pullback(_acc(grad))
    return (grad_input.astype(x.dtype) if output_mask[0] else None,
            grad_grid.astype(grid.dtype) if output_mask[1] else None)


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


# ------------------------------------------------------------- more losses
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
