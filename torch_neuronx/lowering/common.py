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
    "is_int", "jax_dtype", "promote", "torch_dtype",
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
