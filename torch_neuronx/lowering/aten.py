"""Lowerings of Core ATen ops to jax (see torch_neuronx/lowering/__init__.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_neuronx.lowering import lowering

jax.config.update("jax_enable_x64", True)  # int64 / float64 tensors keep their dtype

aten = torch.ops.aten

_DTYPES = {
    torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
    torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
}


def jax_dtype(dtype: torch.dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} has no jax equivalent") from None


def _dims(dim, ndim):
    if dim is None or dim == []:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(d % ndim if ndim else 0 for d in dim)


def _default_float(x):
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)


# ------------------------------------------------------------------ elementwise
def _unary(fn, floating=False):
    def lower(x):
        return fn(_default_float(x) if floating else x)

    return lower


for _op, _fn, _float in [
    (aten.abs, jnp.abs, False), (aten.neg, jnp.negative, False), (aten.exp, jnp.exp, True),
    (aten.log, jnp.log, True), (aten.sqrt, jnp.sqrt, True), (aten.rsqrt, jax.lax.rsqrt, True),
    (aten.sin, jnp.sin, True), (aten.cos, jnp.cos, True), (aten.tanh, jnp.tanh, True),
    (aten.sigmoid, jax.nn.sigmoid, True), (aten.erf, jax.scipy.special.erf, True),
    (aten.reciprocal, jnp.reciprocal, True), (aten.floor, jnp.floor, False),
    (aten.ceil, jnp.ceil, False), (aten.round, jnp.round, False), (aten.trunc, jnp.trunc, False),
    (aten.sign, jnp.sign, False), (aten.log1p, jnp.log1p, True), (aten.expm1, jnp.expm1, True),
    (aten.log2, jnp.log2, True), (aten.log10, jnp.log10, True), (aten.tan, jnp.tan, True),
    (aten.asin, jnp.arcsin, True), (aten.acos, jnp.arccos, True), (aten.atan, jnp.arctan, True),
    (aten.sinh, jnp.sinh, True), (aten.cosh, jnp.cosh, True), (aten.asinh, jnp.arcsinh, True),
    (aten.acosh, jnp.arccosh, True), (aten.atanh, jnp.arctanh, True),
    (aten.bitwise_not, jnp.invert, False), (aten.logical_not, jnp.logical_not, False),
    (aten.isnan, jnp.isnan, False), (aten.isinf, jnp.isinf, False),
    (aten.erfinv, jax.scipy.special.erfinv, True),
]:
    lowering(_op)(_unary(_fn, _float))


@lowering(aten.relu)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@lowering(aten.add)
def add(x, y, alpha=1):
    return jnp.add(x, y if alpha == 1 else y * alpha)


@lowering(aten.sub)
def sub(x, y, alpha=1):
    return jnp.subtract(x, y if alpha == 1 else y * alpha)


@lowering(aten.rsub)
def rsub(x, y, alpha=1):
    return jnp.subtract(y, x if alpha == 1 else x * alpha)


@lowering(aten.mul)
def mul(x, y):
    return jnp.multiply(x, y)


@lowering(aten.div)
def div(x, y, rounding_mode=None):
    if rounding_mode is None:
        x, y = jnp.asarray(x), jnp.asarray(y)
        if not jnp.issubdtype(jnp.result_type(x, y), jnp.inexact):
            x = x.astype(jnp.float32)
        return jnp.true_divide(x, y)
    if rounding_mode == "floor":
        return jnp.floor_divide(x, y)
    quotient = jnp.true_divide(x, y)
    result = jnp.trunc(quotient)
    return result.astype(jnp.result_type(x, y))


@lowering(aten.pow)
def pow_(x, y):
    return jnp.power(x, y)


@lowering(aten.remainder)
def remainder(x, y):
    return jnp.remainder(x, y)


@lowering(aten.fmod)
def fmod(x, y):
    return jnp.fmod(x, y)


@lowering(aten.atan2)
def atan2(x, y):
    return jnp.arctan2(_default_float(jnp.asarray(x)), y)


@lowering(aten.maximum)
def maximum(x, y):
    return jnp.maximum(x, y)


@lowering(aten.minimum)
def minimum(x, y):
    return jnp.minimum(x, y)


for _op, _fn in [
    (aten.eq, jnp.equal), (aten.ne, jnp.not_equal), (aten.lt, jnp.less), (aten.le, jnp.less_equal),
    (aten.gt, jnp.greater), (aten.ge, jnp.greater_equal), (aten.logical_and, jnp.logical_and),
    (aten.logical_or, jnp.logical_or), (aten.logical_xor, jnp.logical_xor),
    (aten.bitwise_and, jnp.bitwise_and), (aten.bitwise_or, jnp.bitwise_or),
    (aten.bitwise_xor, jnp.bitwise_xor),
]:
    lowering(_op)(lambda x, y, _fn=_fn: _fn(x, y))


@lowering(aten.where)
def where(condition, x=None, y=None):
    return jnp.where(condition, x, y)


@lowering(aten.clamp)
def clamp(x, min=None, max=None):
    return jnp.clip(x, min, max)


@lowering(aten.clamp_min)
def clamp_min(x, min):
    return jnp.maximum(x, jnp.asarray(min, x.dtype))


@lowering(aten.clamp_max)
def clamp_max(x, max):
    return jnp.minimum(x, jnp.asarray(max, x.dtype))


@lowering(aten.gelu)
def gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lowering(aten.silu)
def silu(x):
    return jax.nn.silu(x)


@lowering(aten.leaky_relu)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.hardtanh)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, min_val, max_val)


# ----------------------------------------------------------------- conversions
@lowering(aten._to_copy)
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    return x if dtype is None else x.astype(jax_dtype(dtype))


@lowering(aten.clone, aten.alias, aten.lift_fresh_copy)
def clone(x, memory_format=None):
    return x


# ------------------------------------------------------------------ reductions
@lowering(aten.sum)
def sum_(x, dim=None, keepdim=False, dtype=None):
    out = jnp.sum(x, axis=_dims(dim, x.ndim), keepdims=keepdim,
                  dtype=jax_dtype(dtype) if dtype is not None else None)
    if dtype is None and x.dtype in (jnp.bool_, jnp.int32, jnp.int16, jnp.int8, jnp.uint8):
        out = out.astype(jnp.int64)
    return out


@lowering(aten.mean)
def mean(x, dim=None, keepdim=False, dtype=None):
    return jnp.mean(x, axis=_dims(dim, x.ndim), keepdims=keepdim,
                    dtype=jax_dtype(dtype) if dtype is not None else None)


@lowering(aten.prod)
def prod(x, dim=None, keepdim=False, dtype=None):
    return jnp.prod(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.amax)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.amin)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.argmax)
def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return jnp.argmax(x.reshape(-1)).astype(jnp.int64)
    return jnp.argmax(x, axis=dim, keepdims=keepdim).astype(jnp.int64)


@lowering(aten.argmin)
def argmin(x, dim=None, keepdim=False):
    if dim is None:
        return jnp.argmin(x.reshape(-1)).astype(jnp.int64)
    return jnp.argmin(x, axis=dim, keepdims=keepdim).astype(jnp.int64)


@lowering(aten.any)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.all)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowering(aten.var)
def var(x, dim=None, *, correction=None, keepdim=False):
    ddof = 1 if correction is None else correction
    return jnp.var(x, axis=_dims(dim, x.ndim), ddof=ddof, keepdims=keepdim)


@lowering(aten.cumsum)
def cumsum(x, dim, dtype=None):
    out = jnp.cumsum(x, axis=dim, dtype=jax_dtype(dtype) if dtype is not None else None)
    if dtype is None and not jnp.issubdtype(x.dtype, jnp.inexact):
        out = out.astype(jnp.int64)
    return out


# ------------------------------------------------------------- linear algebra
@lowering(aten.mm, aten.bmm, aten.matmul)
def mm(x, y):
    return jnp.matmul(x, y, preferred_element_type=None)


@lowering(aten.addmm)
def addmm(bias, x, y, beta=1, alpha=1):
    out = jnp.matmul(x, y)
    if alpha != 1:
        out = out * alpha
    return out + (bias if beta == 1 else bias * beta)


@lowering(aten.baddbmm)
def baddbmm(bias, x, y, beta=1, alpha=1):
    return addmm(bias, x, y, beta, alpha)


# ----------------------------------------------------------- shapes and views
@lowering(aten.view, aten._unsafe_view, aten.reshape)
def view(x, shape):
    return jnp.reshape(x, tuple(shape))


@lowering(aten.permute)
def permute(x, dims):
    return jnp.transpose(x, tuple(dims))


@lowering(aten.t)
def t(x):
    return x.T


@lowering(aten.transpose)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1)


@lowering(aten.expand)
def expand(x, shape, implicit=False):
    shape = tuple(x.shape[i - (len(shape) - x.ndim)] if s == -1 else s for i, s in enumerate(shape))
    return jnp.broadcast_to(x, shape)


@lowering(aten.unsqueeze)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowering(aten.squeeze)
def squeeze(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = tuple(d % x.ndim for d in ([dim] if isinstance(dim, int) else dim) if x.shape[d] == 1) if x.ndim else ()
    return jnp.squeeze(x, axis=dims) if dims else x


@lowering(aten.slice)
def slice_(x, dim=0, start=None, end=None, step=1):
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end if end is None or end < 2**62 else None, step)
    return x[tuple(index)]


@lowering(aten.select)
def select(x, dim, index):
    return jnp.take(x, index, axis=dim)


@lowering(aten.cat)
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    return jnp.concatenate(tensors, axis=dim)


@lowering(aten.split_with_sizes)
def split_with_sizes(x, sizes, dim=0):
    offsets = np.cumsum(sizes)[:-1].tolist()
    return tuple(jnp.split(x, offsets, axis=dim))


@lowering(aten.split)
def split(x, split_size, dim=0):
    size = x.shape[dim]
    if isinstance(split_size, int):
        sizes = [split_size] * (size // split_size) + ([size % split_size] if size % split_size else [])
    else:
        sizes = split_size
    return split_with_sizes(x, sizes, dim)


@lowering(aten.index_select)
def index_select(x, dim, index):
    return jnp.take(x, index, axis=dim)


@lowering(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.gather)
def gather(x, dim, index, sparse_grad=False):
    return jnp.take_along_axis(x, index, axis=dim)


@lowering(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        config = [(lo, hi, 0) for lo, hi in widths]
        return jax.lax.pad(x, jnp.asarray(value, x.dtype), config)
    return jnp.pad(x, widths, constant_values=value)


# ------------------------------------------------------------------ creation
@lowering(aten.full)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        dtype = torch.get_default_dtype() if isinstance(fill_value, float) else (
            torch.bool if isinstance(fill_value, bool) else torch.int64)
    return jnp.full(tuple(size), fill_value, jax_dtype(dtype))


@lowering(aten.scalar_tensor)
def scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, jax_dtype(dtype or torch.get_default_dtype()))


@lowering(aten.arange)
def arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype()
    return jnp.arange(start, end, step, dtype=jax_dtype(dtype))


@lowering(aten.zeros_like)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, jax_dtype(dtype) if dtype is not None else x.dtype)


@lowering(aten.ones_like)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, jax_dtype(dtype) if dtype is not None else x.dtype)


@lowering(aten.full_like)
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, fill_value, jax_dtype(dtype) if dtype is not None else x.dtype)


# ---------------------------------------------------------- softmax and norms
@lowering(aten._softmax)
def softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(x, axis=dim)


@lowering(aten._log_softmax)
def log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(x, axis=dim)


@lowering(aten._softmax_backward_data)
def softmax_backward(grad, out, dim, input_dtype):
    return out * (grad - jnp.sum(grad * out, axis=dim, keepdims=True))


@lowering(aten._log_softmax_backward_data)
def log_softmax_backward(grad, out, dim, input_dtype):
    return grad - jnp.exp(out) * jnp.sum(grad, axis=dim, keepdims=True)


@lowering(aten.native_layer_norm)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean_ = jnp.mean(x, axis=axes, keepdims=True)
    var_ = jnp.mean(jnp.square(x - mean_), axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(var_ + eps)
    out = (x - mean_) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean_, rstd


@lowering(aten.copy)
def copy(dst, src, non_blocking=False):
    return jnp.broadcast_to(src, dst.shape).astype(dst.dtype)
