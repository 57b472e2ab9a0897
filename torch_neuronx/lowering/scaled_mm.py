"""torch._scaled_mm and torch._scaled_grouped_mm (FP8/MX compute) as StableHLO:
the reference of ops/float8.py (dequantize to float32, accumulate in float32,
add the bias, cast to out_dtype) written with jax. float4_e2m1fn_x2 operands
arrive as their uint8 bytes (lowering/conversions.py) and are unpacked here.
The scaling mode is decided by ops/float8.check_scaled_mm on meta stand-ins,
so eager and compiled calls accept the same arguments. Whether the profile may
run them at all is checked before lowering (compiler/float8.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering
from torch_neuronx.lowering.matmul import _group_masks, grouped_mm
from torch_neuronx.lowering.common import is_float8, jax_dtype, to_float8, torch_dtype
from torch_neuronx.ops import float8

aten = torch.ops.aten
_FP4_VALUES = jnp.asarray(float8._FP4_VALUES, jnp.float32)


def _torch_dtype(x):
    return torch.float4_e2m1fn_x2 if x.dtype == jnp.uint8 else torch_dtype(x.dtype)


def _stand_in(x):
    """A meta tensor shaped like a jax value (contiguous), with its torch dtype."""
    return None if x is None else torch.empty(x.shape, dtype=_torch_dtype(x), device="meta")


def _values(x, packed_axis: int):
    """float32 values; float4 bytes unpacked along packed_axis (low nibble first)."""
    if x.dtype != jnp.uint8:
        return x.astype(jnp.float32)
    pair = jnp.stack([_FP4_VALUES[x & 0xF], _FP4_VALUES[x >> 4]], axis=packed_axis + 1)
    shape = list(x.shape)
    shape[packed_axis] *= 2
    return pair.reshape(shape)


def _expand(scale, block_rows: int, block_cols: int, shape):
    full = jnp.repeat(jnp.repeat(scale, block_rows, axis=0), block_cols, axis=1)
    return full[: shape[0], : shape[1]]


def _unblock(scale, rows: int, k_blocks: int):
    """ops/float8.unblock: the (rows, k_blocks) matrix of a blocked scale layout."""
    rb, cb = math.ceil(rows / 128), math.ceil(k_blocks / 4)
    tiles = scale.reshape(rb, cb, 32, 4, 4).transpose(0, 3, 2, 1, 4)
    return tiles.reshape(rb * 128, cb * 4)[:rows, :k_blocks]


def _dequantize(x, scale, mode: str, operand: str):
    values = _values(x, 1 if operand == "a" else 0)
    rows, cols = values.shape
    if mode == float8.TENSORWISE:
        return values * scale.astype(jnp.float32).reshape(())
    if mode == float8.ROWWISE:
        return values * scale.astype(jnp.float32)
    if mode == float8.MX:
        block = float8.mx_block(_torch_dtype(x), _torch_dtype(scale))[0]
        k = cols if operand == "a" else rows
        per_block = _unblock(scale, rows if operand == "a" else cols, math.ceil(k / block)).astype(jnp.float32)
        if operand == "a":
            return values * _expand(per_block, 1, block, values.shape)
        return values * _expand(per_block.T, block, 1, values.shape)
    scale = scale.astype(jnp.float32)
    if operand == "a":
        return values * _expand(scale, 1 if scale.shape[0] == rows else 128, 128, values.shape)
    return values * _expand(scale, 128, 1 if scale.shape[1] == cols else 128, values.shape)


def _cast(out, dtype: torch.dtype):
    if dtype == torch.float4_e2m1fn_x2:
        raise NotImplementedError("\"copy_kernel\" not implemented for 'Float4_e2m1fn_x2'")
    target = jax_dtype(dtype)
    return to_float8(out, target) if is_float8(target) else out.astype(target)


def _dot(a, b):
    return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


@lowering(aten._scaled_mm)
def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    mode = float8.check_scaled_mm(*(_stand_in(v) for v in (a, b, scale_a, scale_b, bias, scale_result)))
    out = _dot(_dequantize(a, scale_a, mode, "a"), _dequantize(b, scale_b, mode, "b"))
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    dtype = out_dtype or _torch_dtype(a)
    if scale_result is not None and dtype in float8.FLOAT8:
        out = out / scale_result.astype(jnp.float32).reshape(())
    return _cast(out, dtype)


@lowering(aten._scaled_grouped_mm)
def scaled_grouped_mm(a, b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None,
                      use_fast_accum=False):
    """Row-wise float32 scales (ops/float8.scaled_grouped_mm_reference): each
    operand dequantized with its scales, then _grouped_mm's lowering in float32;
    2D x 2D (groups along K) has one scale per group and row/column, so it is
    dequantized per group here."""
    dtype = out_dtype or torch.bfloat16
    sa, sb = scale_a.astype(jnp.float32), scale_b.astype(jnp.float32)
    fa, fb = a.astype(jnp.float32), b.astype(jnp.float32)
    if a.ndim == 2 and b.ndim == 2:
        groups, m, n = offs.shape[0], a.shape[0], b.shape[1]
        masked = jnp.where(_group_masks(offs, a.shape[1])[:, None, :], fa[None], 0)
        out = jnp.einsum("gmk,kn->gmn", masked * sa.reshape(groups, m)[:, :, None], fb,
                         precision=jax.lax.Precision.HIGHEST) * sb.reshape(groups, 1, n)
    else:
        fa = fa * (sa[:, None] if a.ndim == 2 else sa[:, :, None])
        fb = fb * (sb[None, :] if b.ndim == 2 else sb[:, None, :])
        out = grouped_mm(fa, fb, offs)
    return _cast(out, dtype)
