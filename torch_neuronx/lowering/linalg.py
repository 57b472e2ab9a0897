"""Lowerings of the linear-algebra ops (torch.linalg and the older triangular /
Cholesky / QR helpers) with jax.lax.linalg and jnp.linalg.

Conventions reproduced from PyTorch: LU pivots are 1-based int32 row swaps
(LAPACK's getrf), `info` outputs are int32 and 0 on success, outputs that an
option turns off (compute_uv=False, compute_v=False, mode="r") are empty
tensors of shape (0,), and every op broadcasts batch dimensions.

Not reproduced: errors that depend on values (check_errors=True, a singular
or non positive-definite matrix): a compiled graph cannot raise on data, so
results then hold inf/NaN as XLA's factorizations produce them. The `info`
of a failed Cholesky is nonzero but not the order of the failing minor.
linalg_lstsq is not lowered: its outputs' shapes depend on the values (see
DATA_DEPENDENT_SHAPE in torch_neuronx/ops/registry.py). Neither are _linalg_det
and _linalg_slogdet: the LU factors they return (and their backward formulas
read) are those of A or of A^T depending on A's memory layout at trace time,
which a lowering, seeing values only, cannot tell; a wrong choice gives wrong
gradients without an error. They stay off the native set.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax.lax import linalg as lax_linalg

from torch_neuronx.lowering import lowering

aten = torch.ops.aten


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _broadcast_batch(a, b):
    """a and b with their batch dimensions (all but the last two) broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _info(shape):
    return jnp.zeros(shape, jnp.int32)


# ---------------------------------------------------------------- LU family
def _lu(a):
    """(LU, 1-based int32 pivots, permutation) with LAPACK's partial pivoting."""
    lu, pivots, permutation = lax_linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32), permutation


def _lu_info(lu):
    """getrf's info: 1 + index of the first zero pivot of U, 0 if none."""
    if min(lu.shape[-2:]) == 0:
        return _info(lu.shape[:-2])
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diagonal == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)


@lowering(aten.linalg_lu_factor_ex)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg.lu_factor(pivot=False) is not supported (PyTorch's CPU kernel has no "
                                  "unpivoted LU either); use pivot=True")
    lu, pivots, _ = _lu(a)
    return lu, pivots, _lu_info(lu)


@lowering(aten.linalg_lu)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg.lu(pivot=False) is not supported; use pivot=True")
    lu, _, permutation = _lu(a)
    m, n = a.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=a.dtype)
    upper = jnp.triu(lu[..., :k, :])
    # A[permutation] = L U, so A = P L U with P[permutation[i], i] = 1.
    p = jnp.swapaxes(jax.nn.one_hot(permutation, m, dtype=a.dtype), -1, -2)
    return p, lower, upper


def _lu_solve(lu, permutation, b, trans):
    """Solves op(A) X = B from A's LU factors (A[permutation] = L U); trans 0: A, 1: A^T, 2: A^H."""
    if trans == 0:  # L U X = B[permutation]
        y = lax_linalg.triangular_solve(lu, _rows(b, permutation), left_side=True, lower=True, unit_diagonal=True)
        return lax_linalg.triangular_solve(lu, y, left_side=True, lower=False)
    conjugate = trans == 2  # U^H L^H X[permutation] = B
    z = lax_linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=conjugate)
    w = lax_linalg.triangular_solve(lu, z, left_side=True, lower=True, unit_diagonal=True, transpose_a=True,
                                    conjugate_a=conjugate)
    return _rows(w, jnp.argsort(permutation, axis=-1))


def _rows(b, order):
    return jnp.take_along_axis(b, order[..., :, None], axis=-2)


def _solve_with_lu(lu, permutation, b, left, adjoint):
    """X with op(A) X = B (left) or X op(A) = B, op(A) = A or A^H."""
    if left:
        return _lu_solve(lu, permutation, b, 2 if adjoint else 0)
    # X op(A) = B  <=>  op(A)^H X^H = B^H
    return _mH(_lu_solve(lu, permutation, _mH(b), 0 if adjoint else 2))


def _as_matrix_rhs(a, b, left):
    """PyTorch's vector case: B of shape (*, n) with A (*, n, n) is a batch of vectors."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    if vector:
        b = b[..., :, None] if left else b[..., None, :]
    return b, vector


@lowering(aten._linalg_solve_ex)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    lu, pivots, permutation = _lu(a)
    rhs, vector = _as_matrix_rhs(a, b, left)
    lu_b, rhs = _broadcast_batch(lu, rhs)
    perm_b = jnp.broadcast_to(permutation, lu_b.shape[:-1])
    x = _solve_with_lu(lu_b, perm_b, rhs, left, False)
    if vector:
        x = x[..., 0] if left else x[..., 0, :]
    return x, lu, pivots, _lu_info(lu)


@lowering(aten.linalg_lu_solve)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    permutation = lax_linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, lu.shape[-1])
    lu_b, rhs = _broadcast_batch(lu, b)
    perm_b = jnp.broadcast_to(permutation, lu_b.shape[:-1])
    return _solve_with_lu(lu_b, perm_b, rhs, left, adjoint)


@lowering(aten.linalg_inv_ex)
def linalg_inv_ex(a, *, check_errors=False):
    lu, _, permutation = _lu(a)
    identity = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve(lu, permutation, identity, 0), _lu_info(lu)


# ------------------------------------------------------- triangular solves
def _triangular(a, b, *, upper, left=True, unitriangular=False, transpose=False):
    a, b = _broadcast_batch(a, b)
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=not upper, transpose_a=transpose,
                                       unit_diagonal=unitriangular)


@lowering(aten.linalg_solve_triangular)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    return _triangular(a, b, upper=upper, left=left, unitriangular=unitriangular)


@lowering(aten.triangular_solve)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """torch.triangular_solve(B, A): X with op(A) X = B, and A itself (cloned)."""
    x = _triangular(a, b, upper=upper, unitriangular=unitriangular, transpose=transpose)
    return x, jnp.broadcast_to(a, x.shape[:-2] + a.shape[-2:])


@lowering(aten.cholesky_solve)
def cholesky_solve(b, factor, upper=False):
    """X with A X = B, A = L L^H (upper=False) or U^H U (upper=True)."""
    factor, b = _broadcast_batch(factor, b)
    if upper:
        y = lax_linalg.triangular_solve(factor, b, left_side=True, lower=False, transpose_a=True,
                                        conjugate_a=True)
        return lax_linalg.triangular_solve(factor, y, left_side=True, lower=False)
    y = lax_linalg.triangular_solve(factor, b, left_side=True, lower=True)
    return lax_linalg.triangular_solve(factor, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


# ------------------------------------------------------ factorizations
@lowering(aten.linalg_cholesky_ex)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    lower = lax_linalg.cholesky(a, symmetrize_input=False)
    failed = ~jnp.all(jnp.isfinite(lower), axis=(-2, -1))
    info = jnp.where(failed, 1, 0).astype(jnp.int32)
    return (_mH(lower) if upper else lower), info


@lowering(aten.linalg_qr)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return _empty(a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@lowering(aten.linalg_householder_product)
def linalg_householder_product(a, tau):
    return lax_linalg.householder_product(a, tau)


@lowering(aten.ormqr)
def ormqr(a, tau, other, left=True, transpose=False):
    """op(Q) C or C op(Q), Q (m x m) the product of the Householder reflectors in (a, tau)."""
    m = a.shape[-2]
    k = tau.shape[-1]
    square = jnp.zeros(a.shape[:-2] + (m, m), a.dtype).at[..., :, :k].set(a[..., :, :k])
    taus = jnp.zeros(tau.shape[:-1] + (m,), tau.dtype).at[..., :k].set(tau)
    q = lax_linalg.householder_product(square, taus)
    if transpose:
        q = _mH(q)
    q, other = _broadcast_batch(q, other)
    return jnp.matmul(q, other, precision="highest") if left else jnp.matmul(other, q, precision="highest")


@lowering(aten._linalg_svd)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not compute_uv:
        return _empty(a.dtype), jnp.linalg.svd(a, compute_uv=False).astype(_real(a.dtype)), _empty(a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lowering(aten._linalg_eigh)
def linalg_eigh(a, UPLO="L", compute_v=True):
    vectors, values = lax_linalg.eigh(a, lower=UPLO.upper() == "L", symmetrize_input=False)
    if not compute_v:
        return values, _empty(a.dtype)
    return values, vectors


def _real(dtype):
    return {jnp.dtype(jnp.complex64): jnp.float32, jnp.dtype(jnp.complex128): jnp.float64}.get(jnp.dtype(dtype), dtype)


@lowering(aten.linalg_matrix_exp)
def linalg_matrix_exp(a):
    return jax.scipy.linalg.expm(a)
