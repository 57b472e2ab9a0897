"""Helpers shared by the lowerings: dtypes, PyTorch type promotion, dims.

Values reaching a lowering are jax arrays (tensors) or Python scalars, lists and
dtypes as the FX graph gives them. PyTorch's type promotion (tensors over
zero-dim tensors over Python scalars, int + float scalar -> float, bool ->
int64, low-precision floats computed in float32) is reproduced with
torch._prims_common.elementwise_dtypes on stand-in meta tensors, so the
promotion rules are PyTorch's own rather than JAX's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
from torch._prims_common import elementwise_dtypes

from torch_neuronx.lowering import conversions, current

__all__ = [
    "KIND", "acc_dtype", "as_tuple", "cast", "default_float", "dims", "is_array", "is_float",
    "is_float8", "is_int", "jax_dtype", "promote", "to_float8", "torch_dtype",
]

def jax_dtype(dtype: torch.dtype):
    """The jax dtype of a torch dtype (float64 -> float32 under the fp64 rule)."""
    return conversions.jax_dtype(dtype, narrow=current().emulate_fp64)


torch_dtype = conversions.torch_dtype


def default_float():
    return jax_dtype(torch.get_default_dtype())


def is_array(value) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def is_int(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


def acc_dtype(dtype):
    """Accumulation dtype: float16/bfloat16 are accumulated in float32, as PyTorch does."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _stand_in(value):
    if is_array(value):
        return torch.empty((1,) if value.ndim else (), dtype=torch_dtype(value.dtype), device="meta")
    if isinstance(value, torch.Tensor):
        return value
    return value  # Python bool / int / float / complex


def promote(*values, kind=KIND.DEFAULT):
    """(computation dtype, result dtype) of an elementwise op on `values`, by PyTorch's rules."""
    stand_ins = [_stand_in(v) for v in values if v is not None]
    computation, result = elementwise_dtypes(*stand_ins, type_promotion_kind=kind)
    return jax_dtype(computation), jax_dtype(result)


def cast(value, dtype):
    """A jax array of `dtype` from an array or a Python scalar."""
    if is_array(value):
        return value if value.dtype == dtype else value.astype(dtype)
    return jnp.asarray(value, dtype)


_FLOAT8 = (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e8m0fnu)


def is_float8(dtype) -> bool:
    return dtype in _FLOAT8


def to_float8(x, dtype):
    """x converted to a float8 dtype bit for bit as PyTorch converts (c10's
    Float8_* from float): through float32; float8_e4m3fn saturates to +-448
    (infinities too) where ml_dtypes gives NaN; NaN is 0x7f with x's sign for
    e4m3fn and e5m2 (ml_dtypes keeps another payload); float8_e8m0fnu is
    computed on the bits (_to_e8m0)."""
    f = x.astype(jnp.float32)
    if dtype == jnp.float8_e8m0fnu:
        return jax.lax.bitcast_convert_type(_to_e8m0(f), dtype)
    if dtype == jnp.float8_e4m3fn:
        f8 = jnp.where(jnp.isnan(f), f, jnp.clip(f, -448.0, 448.0)).astype(dtype)
    else:
        f8 = f.astype(dtype)
    nan = jnp.where(jnp.signbit(f), jnp.uint8(0xFF), jnp.uint8(0x7F))
    bits = jnp.where(jnp.isnan(f), nan, jax.lax.bitcast_convert_type(f8, jnp.uint8))
    return jax.lax.bitcast_convert_type(bits, dtype)


def _to_e8m0(f):
    """float32 -> float8_e8m0fnu bits as PyTorch rounds: the sign is dropped, the
    exponent rounds up when the mantissa is above one half (exactly one half:
    up, except for subnormals), NaN and infinity give 0xff (NaN). On the bits:
    XLA on the CPU flushes subnormals to zero, which PyTorch rounds."""
    u = jax.lax.bitcast_convert_type(f, jnp.uint32)
    exponent, mantissa = (u >> 23) & 0xFF, u & 0x7FFFFF
    up = (mantissa > 0x400000) | ((mantissa == 0x400000) & (exponent != 0))
    rounded = jnp.minimum(exponent + up.astype(jnp.uint32), 0xFF)
    return jnp.where(exponent == 0xFF, 0xFF, rounded).astype(jnp.uint8)


def dims(dim, ndim: int) -> tuple[int, ...]:
    """Normalized reduction dims: None or [] means all dims; negative dims wrap."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({d % ndim if ndim else 0 for d in dim})) if ndim else ()


def as_tuple(value, n: int) -> tuple:
    """An int or a list of ints as an n-tuple (kernel sizes, strides, paddings)."""
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    return value * n if len(value) == 1 else value
