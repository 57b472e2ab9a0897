"""Lowerings of views, shape ops, indexing/scatter ops, creation ops and
conversions, and the ``*_copy`` variants of views (register_copy_variants, a post-pass of
lowering.load()) (see torch_neuronx/lowering/__init__.py).

Views become copies: a jax array has no storage to alias, and AOTAutograd's
functionalized graphs never rely on aliasing (mutations come back as
`copy_` into graph inputs, handled by the compiler). Shapes are static;
indexing with boolean masks has a data-dependent shape and is not lowered
(except `index_put` with a mask and a single value, which is a `where`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_neuronx.lowering import LOWERINGS, lowering
from torch_neuronx.lowering.common import (
    KIND, acc_dtype, cast, default_float, is_array, is_float, is_float8, jax_dtype, promote, to_float8,
    torch_dtype,
)

aten = torch.ops.aten


def _axis(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


# ---------------------------------------------------------------- conversions
@lowering(aten._to_copy)
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None, copy=False):
    if dtype is None:
        return x
    target = jax_dtype(dtype)
    if jnp.iscomplexobj(x) and not jnp.issubdtype(target, jnp.complexfloating):
        x = jnp.real(x)
    if target == jnp.bool_:
        return x != 0
    if is_float8(target) and x.dtype != target:
        return to_float8(jnp.real(x) if jnp.iscomplexobj(x) else x, target)
    return x.astype(target)


@lowering(torch.ops.prims.convert_element_type)
def convert_element_type(x, dtype):
    """`x * t.item()` under fullgraph=True: PyTorch keeps the Python float a
    tensor, converting it to float64 and back with this prim."""
    return to_copy(x, dtype=dtype)


@lowering(aten.clone, aten.alias, aten.lift_fresh_copy, aten.lift_fresh, aten.detach, aten.resolve_conj,
          aten.resolve_neg)
def clone(x, memory_format=None):
    """Values are immutable in a traced graph: copies, aliases and the
    materialization of conjugate/negative views all keep x's value."""
    return x


@lowering(aten.copy, aten.copy_)
def copy(dst, src, non_blocking=False):
    return jnp.broadcast_to(to_copy(src, dtype=torch_dtype(dst.dtype)), dst.shape)


@lowering(aten._assert_async, aten._assert_tensor_metadata, aten._assert_scalar)
def assert_(*args, **kwargs):
    """Runtime asserts (and metadata checks already done at trace time): an XLA
    executable cannot raise, so they lower to nothing."""
    return None


# ------------------------------------------------------------ shapes and views
@lowering(aten.view, aten._unsafe_view)
def view(x, shape):
    if isinstance(shape, torch.dtype):
        return _view_dtype(x, jax_dtype(shape))
    return jnp.reshape(x, tuple(shape))


def _view_dtype(x, dtype):
    """view(dtype): the same bytes reinterpreted; the last dim scales with the element size."""
    old, new = np.dtype(x.dtype).itemsize, np.dtype(dtype).itemsize
    if x.dtype == jnp.bool_ or dtype == jnp.bool_:
        x = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
        out = jax.lax.bitcast_convert_type(x, jnp.uint8 if dtype == jnp.bool_ else dtype)
        return out != 0 if dtype == jnp.bool_ else out
    if old == new:
        return jax.lax.bitcast_convert_type(x, dtype)
    if new < old:  # jax appends a dim of old/new elements
        out = jax.lax.bitcast_convert_type(x, dtype)
        return out.reshape(x.shape[:-1] + (x.shape[-1] * (old // new),))
    grouped = x.reshape(x.shape[:-1] + (x.shape[-1] // (new // old), new // old))
    return jax.lax.bitcast_convert_type(grouped, dtype)



@lowering(aten.view_as_complex)
def view_as_complex(x):
    """(..., 2) real pairs -> complex (...); a value copy, as every lowering (graphs are functional)."""
    return jax.lax.complex(x[..., 0], x[..., 1])


@lowering(aten.view_as_real)
def view_as_real(x):
    """complex (...) -> (..., 2) real pairs [real, imag]."""
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)

@lowering(aten.permute)
def permute(x, dims):
    return jnp.transpose(x, tuple(d % x.ndim for d in dims)) if x.ndim else x


@lowering(aten.t)
def t(x):
    return x.T


@lowering(aten.transpose)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, _axis(dim0, x.ndim), _axis(dim1, x.ndim)) if x.ndim else x


@lowering(aten.expand)
def expand(x, shape, implicit=False):
    lead = len(shape) - x.ndim
    target = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(shape))
    return jnp.broadcast_to(x, target)


@lowering(aten.unsqueeze)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowering(aten.squeeze)
def squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    if dim is None:
        return jnp.squeeze(x)
    axes = tuple(sorted({d % x.ndim for d in ([dim] if isinstance(dim, int) else dim) if x.shape[d] == 1}))
    return jnp.squeeze(x, axis=axes) if axes else x


@lowering(aten.slice)
def slice_(x, dim=0, start=None, end=None, step=1):
    axis = _axis(dim, x.ndim)
    first, stop, step = slice(start, end, step).indices(x.shape[axis])
    return jax.lax.slice_in_dim(x, first, max(first, stop), step, axis)


@lowering(aten.select)
def select(x, dim, index):
    axis = _axis(dim, x.ndim)
    return jax.lax.index_in_dim(x, index % x.shape[axis], axis, keepdims=False)


def _cat_dtype(tensors):
    return promote(*tensors, kind=KIND.NO_OPMATH)[1]


@lowering(aten.cat)
def cat(tensors, dim=0):
    dtype = _cat_dtype(tensors)
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0].astype(dtype)
    axis = _axis(dim, kept[0].ndim)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=axis)


@lowering(aten.stack)
def stack(tensors, dim=0):
    dtype = _cat_dtype(tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim % (tensors[0].ndim + 1))


@lowering(aten.split_with_sizes)
def split_with_sizes(x, sizes, dim=0):
    axis = _axis(dim, x.ndim)
    offsets = np.cumsum([0, *sizes]).tolist()
    return [jax.lax.slice_in_dim(x, offsets[i], offsets[i + 1], 1, axis) for i in range(len(sizes))]


@lowering(aten.split)
def split(x, split_size, dim=0):
    if not isinstance(split_size, int):
        return split_with_sizes(x, split_size, dim)
    size = x.shape[_axis(dim, x.ndim)]
    sizes = [split_size] * (size // split_size) + ([size % split_size] if size % split_size else [])
    return split_with_sizes(x, sizes or [0], dim)


@lowering(aten.unbind)
def unbind(x, dim=0):
    axis = _axis(dim, x.ndim)
    return [jax.lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


@lowering(aten.diagonal)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, _axis(dim1, x.ndim), _axis(dim2, x.ndim))


@lowering(aten.flip)
def flip(x, dims):
    return jnp.flip(x, tuple(d % x.ndim for d in dims)) if x.ndim and dims else x


@lowering(aten.roll)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0] if isinstance(shifts, (list, tuple)) else shifts).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(d % x.ndim for d in dims))


@lowering(aten.repeat)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


@lowering(aten.unfold)
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    axis = _axis(dimension, x.ndim)
    count = (x.shape[axis] - size) // step + 1
    index = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    windows = jnp.take(x, jnp.asarray(index), axis=axis)  # [..., count, size, ...]
    return jnp.moveaxis(windows, axis + 1, -1)


def _strided_index(size, stride, storage_offset):
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = n
        index = index + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return index


@lowering(aten.as_strided)
def as_strided(x, size, stride, storage_offset=None):
    """Assumes `x` is the contiguous base of the view, as AOTAutograd emits it."""
    return jnp.take(x.reshape(-1), jnp.asarray(_strided_index(size, stride, storage_offset)))


@lowering(aten.as_strided_scatter)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    flat = x.reshape(-1).at[jnp.asarray(_strided_index(size, stride, storage_offset))].set(src.astype(x.dtype))
    return flat.reshape(x.shape)


@lowering(aten.tril)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    fill = (value != 0) if x.dtype == jnp.bool_ else value
    return jax.lax.pad(x, jnp.asarray(fill, x.dtype), config)


def _mode_pad(mode, spatial):
    def lower(x, padding):
        widths = [(0, 0)] * x.ndim
        for i in range(spatial):
            widths[x.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
        return jnp.pad(x, widths, mode=mode)

    return lower


def _mode_pad_backward(mode, spatial):
    forward = _mode_pad(mode, spatial)

    def lower(grad, x, padding):
        _, pullback = jax.vjp(lambda v: forward(v, padding), x)
        return pullback(grad.astype(x.dtype))[0]

    return lower


for _n in (1, 2, 3):
    lowering(getattr(aten, f"reflection_pad{_n}d"))(_mode_pad("reflect", _n))
    lowering(getattr(aten, f"replication_pad{_n}d"))(_mode_pad("edge", _n))
    lowering(getattr(aten, f"reflection_pad{_n}d_backward"))(_mode_pad_backward("reflect", _n))
    lowering(getattr(aten, f"replication_pad{_n}d_backward"))(_mode_pad_backward("edge", _n))


# ------------------------------------------------------------------- creation
def _fill_dtype(fill_value, dtype):
    if dtype is not None:
        return jax_dtype(dtype)
    if isinstance(fill_value, bool):
        return jnp.bool_
    if isinstance(fill_value, int):
        return jnp.int64
    if isinstance(fill_value, complex):
        return jnp.complex64
    if is_array(fill_value):
        return fill_value.dtype
    return default_float()


def _filled(shape, fill_value, dtype):
    if dtype == jnp.bool_ and not is_array(fill_value):
        fill_value = bool(fill_value)
    return jnp.full(tuple(shape), cast(fill_value, dtype))


@lowering(aten.full)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled(size, fill_value, _fill_dtype(fill_value, dtype))


@lowering(aten.zeros)
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype) if dtype is not None else default_float())


@lowering(aten.ones)
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), jax_dtype(dtype) if dtype is not None else default_float())


@lowering(aten.empty, aten.empty_permuted, aten.empty_strided)
def empty(size, *args, dtype=None, **kwargs):
    """Uninitialized memory: zeros are as good as anything."""
    return jnp.zeros(tuple(size), jax_dtype(dtype) if dtype is not None else default_float())


def _like_dtype(x, dtype):
    return jax_dtype(dtype) if dtype is not None else x.dtype


@lowering(aten.zeros_like, aten.empty_like)
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, _like_dtype(x, dtype))


@lowering(aten.ones_like)
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, _like_dtype(x, dtype))


@lowering(aten.full_like)
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _filled(x.shape, fill_value, _like_dtype(x, dtype))


@lowering(aten.fill)
def fill(x, value):
    return _filled(x.shape, value, x.dtype)


@lowering(aten.new_empty, aten.new_zeros)
def new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _like_dtype(x, dtype))


@lowering(aten.new_empty_strided)
def new_empty_strided(x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _like_dtype(x, dtype))


@lowering(aten.new_ones)
def new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _like_dtype(x, dtype))


@lowering(aten.new_full)
def new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled(size, fill_value, _like_dtype(x, dtype))


@lowering(aten.scalar_tensor)
def scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return _filled((), value, jax_dtype(dtype) if dtype is not None else default_float())


def _ramp(length, start, step, dtype):
    """start + step * i for i < length, computed in int64 or float64 then cast (as PyTorch)."""
    if jnp.issubdtype(dtype, jnp.integer) and all(isinstance(v, int) for v in (start, step)):
        return (start + step * jax.lax.iota(jnp.int64, length)).astype(dtype)
    wide = jnp.float64
    return (start + step * jax.lax.iota(wide, length)).astype(dtype)


@lowering(aten.arange)
def arange(start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    if end is None:
        start, end = 0, start
    if dtype is None:
        floats = any(isinstance(v, float) for v in (start, end, step))
        dtype = torch.get_default_dtype() if floats else torch.int64
    length = max(0, math.ceil((end - start) / step))
    return _ramp(length, start, step, jax_dtype(dtype))


@lowering(aten.linspace)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    target = jax_dtype(dtype) if dtype is not None else default_float()
    if steps == 1:
        return jnp.full((1,), start, target)
    step = (end - start) / (steps - 1)
    i = jax.lax.iota(jnp.float64, steps)
    values = jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
    if jnp.issubdtype(target, jnp.integer):
        values = jnp.trunc(values)
    return values.astype(target)


@lowering(aten.eye)
def eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    if isinstance(m, torch.dtype):
        m, dtype = None, m
    return jnp.eye(n, n if m is None else m, dtype=jax_dtype(dtype) if dtype is not None else default_float())


def _register_iota():
    import torch._prims  # noqa: F401  (defines prims.iota)

    @lowering(torch.ops.prims.iota)
    def iota(length, start=0, step=1, dtype=torch.int64, device=None, requires_grad=False):
        return _ramp(length, start, step, jax_dtype(dtype))


_register_iota()


# ---------------------------------------------------------- indexing, scatter
def _index_tuple(x, indices):
    """A jax index for aten.index-style `indices` (None = whole dim, int arrays advanced)."""
    index = []
    for entry in indices:
        if entry is None:
            index.append(slice(None))
        elif entry.dtype in (jnp.bool_, jnp.uint8):
            raise NotImplementedError(
                "aten.index with a boolean mask has a data-dependent shape; the neuron compiler "
                "needs static shapes (use torch.where or index with integer tensors)"
            )
        else:
            index.append(entry)
    return tuple(index)


@lowering(aten.index, aten._unsafe_index)
def index(x, indices):
    return x[_index_tuple(x, indices)]


def _clamped(x, indices):
    """Indices clamped into range, as PyTorch's masked-index ops do (masked-off entries may be out of range)."""
    return [None if e is None else jnp.clip(e, -x.shape[d], x.shape[d] - 1) for d, e in enumerate(indices)]


@lowering(aten._unsafe_masked_index)
def unsafe_masked_index(x, mask, indices, fill):
    values = x[_index_tuple(x, _clamped(x, indices))]
    return jnp.where(mask, values, cast(fill, x.dtype))


def _mask_put(x, indices, values, accumulate):
    """index_put with boolean masks and one value: a where (static shape)."""
    position = next(i for i, e in enumerate(indices) if e is not None)
    mask = indices[position]
    if any(e is not None for e in indices[position + 1:]) or values.size != 1:
        raise NotImplementedError(
            "index_put with a boolean mask and several values has a data-dependent shape"
        )
    mask = mask.astype(jnp.bool_).reshape((1,) * position + mask.shape + (1,) * (x.ndim - position - mask.ndim))
    value = values.reshape(()).astype(x.dtype)
    return jnp.where(mask, x + value if accumulate else value, x)


@lowering(aten.index_put, aten._unsafe_index_put)
def index_put(x, indices, values, accumulate=False):
    if any(e is not None and e.dtype in (jnp.bool_, jnp.uint8) for e in indices):
        return _mask_put(x, indices, values, accumulate)
    target = x.at[_index_tuple(x, indices)]
    values = values.astype(x.dtype)
    return target.add(values) if accumulate else target.set(values)


@lowering(aten._unsafe_masked_index_put_accumulate)
def unsafe_masked_index_put_accumulate(x, mask, indices, values):
    if x.dtype == jnp.bool_:  # accumulating bools is a logical or
        return unsafe_masked_index_put_accumulate(x.astype(jnp.int32), mask, indices, values.astype(jnp.int32)) != 0
    values = jnp.where(mask, values, jnp.zeros((), values.dtype)).astype(x.dtype)
    return x.at[_index_tuple(x, _clamped(x, indices))].add(values)


def _dim_index(x, dim, index):
    return (slice(None),) * _axis(dim, x.ndim) + (index,)


@lowering(aten.index_select)
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    return jnp.take(x, index.reshape(-1), axis=_axis(dim, x.ndim))


@lowering(aten.index_add)
def index_add(x, dim, index, source, alpha=1):
    if x.ndim == 0:
        return x + (source * alpha).astype(x.dtype).reshape(())
    update = source if alpha == 1 else source * alpha
    return x.at[_dim_index(x, dim, index.reshape(-1))].add(update.astype(x.dtype))


@lowering(aten.index_copy)
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return source.astype(x.dtype).reshape(())
    return x.at[_dim_index(x, dim, index.reshape(-1))].set(source.astype(x.dtype))


@lowering(aten.index_fill)
def index_fill(x, dim, index, value):
    if x.ndim == 0:
        return cast(value, x.dtype).reshape(())
    return x.at[_dim_index(x, dim, index.reshape(-1))].set(cast(value, x.dtype))


def _scatter_coordinates(index, dim):
    """Coordinates for gather/scatter along `dim`: `index` there, the position elsewhere."""
    axis = _axis(dim, index.ndim)
    return tuple(
        index if d == axis else jax.lax.broadcasted_iota(jnp.int64, index.shape, d)
        for d in range(index.ndim)
    )


@lowering(aten.gather)
def gather(x, dim, index, sparse_grad=False):
    if x.ndim == 0 or index.ndim == 0:
        return x.reshape(()) if index.ndim == 0 else jnp.broadcast_to(x, index.shape)
    return x[_scatter_coordinates(index, dim)]


def _source_part(src, index, dtype):
    if not is_array(src):
        return jnp.full(index.shape, cast(src, dtype))
    src = src.astype(dtype)
    if src.ndim == 0:
        return jnp.broadcast_to(src, index.shape)
    return src[tuple(slice(0, n) for n in index.shape)]


def _scatter(x, dim, index, src, reduce):
    if x.dtype == jnp.bool_ and reduce is not None:  # add = or, multiply = and
        return _scatter(x.astype(jnp.int32), dim, index, src if not is_array(src) else src.astype(jnp.int32),
                        reduce) != 0
    if x.ndim == 0:
        value = _source_part(src, index.reshape(()), x.dtype)
        return {"add": x + value, "multiply": x * value}.get(reduce, value) if index.size else x
    updates = _source_part(src, index, x.dtype)
    target = x.at[_scatter_coordinates(index, dim)]
    if reduce in ("add", "sum"):
        return target.add(updates)
    if reduce in ("multiply", "prod"):
        return target.multiply(updates)
    return target.set(updates)


@lowering(aten.scatter)
def scatter(x, dim, index, src, reduce=None):
    return _scatter(x, dim, index, src, reduce)


@lowering(aten.scatter_add)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@lowering(aten.scatter_reduce)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    if x.dtype == jnp.bool_:  # sum = or, prod = and, amax = or, amin = and
        return scatter_reduce(x.astype(jnp.int32), dim, index, src.astype(jnp.int32), reduce, include_self) != 0
    if x.ndim == 0:
        x, index, src = x.reshape(1), index.reshape(1), src.reshape(1)
        return scatter_reduce(x, 0, index, src, reduce, include_self).reshape(())
    coordinates = _scatter_coordinates(index, dim)
    updates = _source_part(src, index, x.dtype)
    if not include_self:
        identity = {
            "sum": 0, "mean": 0, "prod": 1,
            "amax": -jnp.inf if is_float(x.dtype) else jnp.iinfo(x.dtype).min if x.dtype != jnp.bool_ else False,
            "amin": jnp.inf if is_float(x.dtype) else jnp.iinfo(x.dtype).max if x.dtype != jnp.bool_ else True,
        }[reduce]
        x = x.at[coordinates].set(cast(identity, x.dtype))
    target = x.at[coordinates]
    if reduce == "sum":
        return target.add(updates)
    if reduce == "prod":
        return target.multiply(updates)
    if reduce == "amax":
        return target.max(updates)
    if reduce == "amin":
        return target.min(updates)
    total = target.add(updates)
    count = jnp.full(x.shape, 1 if include_self else 0, jnp.int64).at[coordinates].add(1)
    count = jnp.maximum(count, 1)
    if is_float(x.dtype):
        return (total / count.astype(x.dtype)).astype(x.dtype)
    return jnp.floor_divide(total, count.astype(x.dtype))


@lowering(aten.select_scatter)
def select_scatter(x, src, dim, index):
    axis = _axis(dim, x.ndim)
    return x.at[_dim_index(x, axis, index % x.shape[axis])].set(src.astype(x.dtype))


@lowering(aten.slice_scatter)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    axis = _axis(dim, x.ndim)
    first, stop, step = slice(start, end, step).indices(x.shape[axis])
    return x.at[_dim_index(x, axis, slice(first, max(first, stop), step))].set(src.astype(x.dtype))


@lowering(aten.diagonal_scatter)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    a, b = _axis(dim1, x.ndim), _axis(dim2, x.ndim)
    moved = jnp.moveaxis(x, (a, b), (-2, -1))
    length = src.shape[-1]
    rows = np.arange(length) + max(-offset, 0)
    cols = np.arange(length) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (a, b))


@lowering(aten.masked_fill)
def masked_fill(x, mask, value):
    return jnp.where(mask.astype(jnp.bool_), cast(value, x.dtype), x)


@lowering(aten.masked_scatter)
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask.astype(jnp.bool_), shape)
    flat_mask = mask.reshape(-1)
    position = jnp.cumsum(flat_mask.astype(jnp.int64)) - 1
    taken = jnp.take(source.reshape(-1).astype(x.dtype), jnp.clip(position, 0, max(source.size - 1, 0)))
    return jnp.where(flat_mask, taken, x.reshape(-1)).reshape(x.shape)


@lowering(aten.embedding)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    rows = grad.reshape(flat.shape[0], math.prod(grad.shape[indices.ndim:])).astype(acc_dtype(grad.dtype))
    if padding_idx >= 0:
        rows = jnp.where((flat == padding_idx)[:, None], jnp.zeros((), rows.dtype), rows)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), rows.dtype).at[flat].add(1)
        rows = rows / counts[flat][:, None]
    out = jnp.zeros((num_weights, rows.shape[1]), rows.dtype).at[flat].add(rows)
    return out.reshape((num_weights,) + grad.shape[indices.ndim:]).astype(grad.dtype)


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
