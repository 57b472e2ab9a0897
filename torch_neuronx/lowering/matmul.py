"""Lowerings of matrix products: mm, bmm, mv, dot, vdot, addmm and its variants,
addr and the grouped matmul of MoE layers (see torch_neuronx/lowering/__init__.py).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering
from torch_neuronx.lowering.common import acc_dtype, is_float, jax_dtype

aten = torch.ops.aten


# ------------------------------------------------------------- matrix products
def _matmul(x, y):
    dtype = jnp.result_type(x, y)
    if dtype in (jnp.float16, jnp.bfloat16):
        return jnp.matmul(x, y, preferred_element_type=jnp.float32), dtype
    return jnp.matmul(x, y), dtype


@lowering(aten.mm, aten.bmm, aten.mv, aten.dot)
def mm(x, y):
    out, dtype = _matmul(x, y)
    return out.astype(dtype)


@lowering(aten.vdot)
def vdot(x, y):
    return mm(jnp.conj(x), y)


def _add_scaled(product, dtype, bias, beta, alpha):
    if not is_float(dtype):  # PyTorch casts alpha and beta to the integer dtype
        alpha, beta = int(alpha), int(beta)
    out = product if alpha == 1 else product * alpha
    if beta != 0:
        bias = bias.astype(out.dtype)
        out = out + (bias if beta == 1 else bias * beta)
    return out.astype(dtype)


@lowering(aten.addmm, aten.baddbmm, aten.addmv)
def addmm(bias, x, y, beta=1, alpha=1):
    product, dtype = _matmul(x, y)
    return _add_scaled(product, dtype, bias, beta, alpha)


@lowering(aten.addbmm)
def addbmm(bias, x, y, beta=1, alpha=1):
    product, dtype = _matmul(x, y)
    return _add_scaled(product.sum(0), dtype, bias, beta, alpha)


def _group_masks(offs, size):
    """[groups, size] booleans: position i belongs to group g when
    offs[g-1] <= i < offs[g] (offs: the groups' cumulative end offsets).
    Positions past offs[-1] belong to no group; their results are zero
    (PyTorch leaves them uninitialized)."""
    ends = offs.astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    position = jnp.arange(size, dtype=jnp.int32)
    return (starts[:, None] <= position) & (position < ends[:, None])


@lowering(aten._grouped_mm)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm (MoE experts; torch.nn.functional.grouped_mm), in its
    four forms. With offs, one operand is split into groups along one dim:
    2D x 3D: a's rows (group g's rows times b[g]) -> [m, n];
    3D x 2D: b's columns (a[g] times group g's columns) -> [m, n];
    2D x 2D: the contraction dim (one product per group) -> [groups, m, n].
    3D x 3D without offs is a batched product. Each form is one dot over the
    operand masked per group: dense work (groups times the ragged product),
    the price of static shapes."""
    if bias is not None:
        raise NotImplementedError("torch._grouped_mm: bias is not supported (as in PyTorch)")
    dtype = jax_dtype(out_dtype) if out_dtype is not None else a.dtype
    contract = functools.partial(jnp.einsum, preferred_element_type=acc_dtype(a.dtype))
    if offs is None:
        out = contract("gmk,gkn->gmn", a, b)
    elif a.ndim == 2 and b.ndim == 3:
        masked = jnp.where(_group_masks(offs, a.shape[0])[:, :, None], a[None], 0)
        out = contract("gmk,gkn->mn", masked, b)
    elif a.ndim == 3 and b.ndim == 2:
        masked = jnp.where(_group_masks(offs, b.shape[1])[:, None, :], b[None], 0)
        out = contract("gmk,gkn->mn", a, masked)
    else:  # 2D x 2D: groups along the contraction
        masked = jnp.where(_group_masks(offs, a.shape[1])[:, None, :], a[None], 0)
        out = contract("gmk,kn->gmn", masked, b)
    return out.astype(dtype)


@lowering(aten.addr)
def addr(bias, x, y, beta=1, alpha=1):
    return _add_scaled(jnp.outer(x, y), jnp.result_type(x, y), bias, beta, alpha)
