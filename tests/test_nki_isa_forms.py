"""Both call forms of the `nki.isa` instructions: the current destination-first one
(`nisa.nc_matmul(dst, a, b)`) and the older dialect's value-returning one (`res = nisa.nc_matmul(a, b)`).

Each case runs one instruction both ways in the same kernel: the results must be identical (same
code path), match a NumPy reference (exact for copies, selects and max; rtol 1e-6 for float32
element-wise math, 1e-4 for matmuls and statistics), and leave identical instruction traces
(op, engine, operand shapes, dtypes and buffers), so the cost model sees the same program.
"""

from __future__ import annotations

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(3)
X = RNG.standard_normal((128, 64), dtype=np.float32)
Y = RNG.standard_normal((128, 64), dtype=np.float32)
V = RNG.uniform(0.5, 1.5, (128, 1)).astype(np.float32)
W = RNG.standard_normal((128, 32), dtype=np.float32)


@nki.jit
def _one(build, x, y, v, w):
    """Load the inputs, let `build` produce a tile, bring it to SBUF and return it."""
    tiles = [nl.load(t) for t in (x, y, v, w)]
    res = build(*tiles)
    if res.buffer is nl.psum:
        sb = nl.ndarray(res.shape, dtype=res.dtype)
        nisa.tensor_copy(sb, res)
        res = sb
    out = nl.ndarray(res.shape, dtype=res.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=res)
    return out


def _new(shape, dtype=nl.float32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype=dtype, buffer=buffer)


def _dst(shape, dtype=nl.float32, buffer=nl.sbuf):
    """A destination-form case: allocate dst, run `call(dst)`, return dst."""
    def make(call):
        def build(*tiles):
            dst = _new(shape, dtype, buffer)
            call(dst, *tiles)
            return dst
        return build
    return make


def _scan(a, b, initial):
    out, prev = np.empty_like(a), initial
    for i in range(a.shape[1]):
        prev = out[:, i] = a[:, i] * prev + b[:, i]
    return out


_IP, _IF = nl.mgrid[0:128, 0:64]

# name: (destination form, value-returning form, NumPy reference)
CASES = {
    "nc_matmul": (
        _dst((64, 32), buffer=nl.psum)(lambda d, x, y, v, w: nisa.nc_matmul(d, x, w)),
        lambda x, y, v, w: nisa.nc_matmul(x, w),
        X.T @ W),
    "nc_matmul_keywords": (
        _dst((64, 32), buffer=nl.psum)(lambda d, x, y, v, w: nisa.nc_matmul(dst=d, stationary=x, moving=w)),
        lambda x, y, v, w: nisa.nc_matmul(stationary=x, moving=w),
        X.T @ W),
    "nc_transpose_tensor": (
        _dst((64, 128), buffer=nl.psum)(lambda d, x, y, v, w: nisa.nc_transpose(d, x)),
        lambda x, y, v, w: nisa.nc_transpose(x),
        X.T),
    "nc_transpose_vector": (
        _dst((32, 32))(lambda d, x, y, v, w: nisa.nc_transpose(d, x[0:32, 0:32], engine=nisa.vector_engine)),
        lambda x, y, v, w: nisa.nc_transpose(x[0:32, 0:32], engine=nisa.vector_engine),
        X[:32, :32].T),
    "tensor_copy_cast": (
        _dst((128, 64), nl.bfloat16)(lambda d, x, y, v, w: nisa.tensor_copy(d, x)),
        lambda x, y, v, w: nisa.tensor_copy(x, dtype=nl.bfloat16),
        X.astype(nl.bfloat16)),
    "memset": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.memset(d, 3.5)),
        lambda x, y, v, w: nisa.memset((nl.par_dim(128), 64), 3.5, nl.float32),
        np.full((128, 64), 3.5, np.float32)),
    "tensor_tensor": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.tensor_tensor(d, x, y, op=nl.subtract)),
        lambda x, y, v, w: nisa.tensor_tensor(x, y, op=np.subtract),
        X - Y),
    "tensor_tensor_promotes": (  # no dtype: the more precise input's (float32 over bfloat16)
        _dst((128, 64))(lambda d, x, y, v, w: nisa.tensor_tensor(d, nl.copy(x, dtype=nl.bfloat16), y, nl.add)),
        lambda x, y, v, w: nisa.tensor_tensor(nl.copy(x, dtype=nl.bfloat16), y, nl.add),
        X.astype(nl.bfloat16).astype(np.float32) + Y),
    "tensor_scalar": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.tensor_scalar(d, x, nl.multiply, 2.0, op1=nl.subtract,
                                                                 operand1=v, reverse1=True)),
        lambda x, y, v, w: nisa.tensor_scalar(data=x, op0=np.multiply, operand0=2.0, op1=np.subtract,
                                              operand1=v, reverse1=True),
        V - X * 2.0),
    "scalar_tensor_tensor": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.scalar_tensor_tensor(d, x, nl.multiply, v, nl.add, y)),
        lambda x, y, v, w: nisa.scalar_tensor_tensor(data=x, op0=nl.multiply, operand0=v, op1=nl.add, operand1=y),
        X * V + Y),
    "tensor_reduce": (
        _dst((128, 1))(lambda d, x, y, v, w: nisa.tensor_reduce(d, nl.maximum, x, axis=1, keepdims=True)),
        lambda x, y, v, w: nisa.tensor_reduce(np.max, data=x, axis=(1,), keepdims=True),
        X.max(axis=1, keepdims=True)),
    "tensor_reduce_negate": (
        _dst((128,))(lambda d, x, y, v, w: nisa.tensor_reduce(d, nl.add, x, 1, negate=True)),
        lambda x, y, v, w: nisa.tensor_reduce(nl.add, x, 1, negate=True),
        -X.sum(axis=1)),
    "activation": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.activation(d, nl.exp, x, bias=v, scale=0.5)),
        lambda x, y, v, w: nisa.activation(op=nl.exp, data=x, bias=v, scale=0.5),
        np.exp(X * 0.5 + V)),
    "activation_dtype": (
        _dst((128, 64), nl.bfloat16)(lambda d, x, y, v, w: nisa.activation(d, nl.tanh, x)),
        lambda x, y, v, w: nisa.activation(np.tanh, x, dtype=nl.bfloat16),
        np.tanh(X).astype(nl.bfloat16)),
    "reciprocal": (
        _dst((128, 1))(lambda d, x, y, v, w: nisa.reciprocal(d, v)),
        lambda x, y, v, w: nisa.reciprocal(v),
        1.0 / V),
    "iota": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.iota(d, [[2, 64]], offset=5, channel_multiplier=3)),
        lambda x, y, v, w: nisa.iota(5 + 3 * nl.arange(128)[:, None] + 2 * nl.arange(64)[None, :], dtype=nl.float32),
        5 + 3 * np.arange(128)[:, None] + 2 * np.arange(64)[None, :].astype(np.float32)),
    "affine_select": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.affine_select(d, [[-1, 64]], 0, 1, x, -9.0)),
        lambda x, y, v, w: nisa.affine_select(_IP - _IF >= 0, x, -9.0),
        np.where(np.arange(128)[:, None] >= np.arange(64)[None, :], X, np.float32(-9.0))),
    "tensor_tensor_scan": (
        _dst((128, 64))(lambda d, x, y, v, w: nisa.tensor_tensor_scan(d, x, y, v, nl.multiply, nl.add)),
        lambda x, y, v, w: nisa.tensor_tensor_scan(x, y, v, np.multiply, np.add),
        _scan(X, Y, V[:, 0])),
    "bn_stats_bn_aggr": (
        lambda x, y, v, w: _bn_dst(x),
        lambda x, y, v, w: nisa.bn_aggr(nisa.bn_stats(x)),
        np.stack([X.mean(axis=1), X.var(axis=1)], axis=1)),
}


def _bn_dst(x):
    stats, out = _new((128, 6)), _new((128, 2))
    nisa.bn_stats(stats, x)
    nisa.bn_aggr(out, stats)
    return out


@nki.jit
def _masked_stats(a, n):
    out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:512]
    x = nl.load(a)
    stats = nl.ndarray((128, 6), dtype=nl.float32)
    stats[...] = nisa.bn_stats(x[i_p, i_f], mask=(i_f < n))
    nl.store(out, value=nisa.bn_aggr(stats))
    return out


def test_masked_bn_stats_counts_only_the_kept_elements():
    a = RNG.standard_normal((128, 512), dtype=np.float32)
    a[:, 300:] = 1e6  # would dominate mean and variance if read
    got = _masked_stats(a, 300)
    np.testing.assert_allclose(got, np.stack([a[:, :300].mean(1), a[:, :300].var(1)], axis=1), rtol=1e-4, atol=1e-5)


def _trace(kernel):
    return [(i.op, i.engine, i.shapes, i.dtypes, i.buffers) for i in kernel.last_trace]


@pytest.mark.parametrize("name", CASES)
def test_both_forms_compute_the_same_and_trace_the_same(name):
    dst_form, value_form, reference = CASES[name]
    by_dst = _one(dst_form, X, Y, V, W)
    trace_dst = _trace(_one)
    by_value = _one(value_form, X, Y, V, W)
    trace_value = _trace(_one)
    np.testing.assert_array_equal(by_value, by_dst)
    assert by_value.dtype == by_dst.dtype
    assert trace_value == trace_dst
    exact = name.startswith(("nc_transpose", "tensor_copy", "memset", "iota", "affine_select", "tensor_reduce"))
    tol = 0 if exact else (1e-4 if name.startswith(("nc_matmul", "bn_")) else 1e-6)
    np.testing.assert_allclose(by_value.astype(np.float32), np.asarray(reference, np.float32).reshape(by_value.shape),
                               rtol=tol, atol=tol)


def test_value_forms_allocate_where_aws_documents():
    seen = {}

    def build(x, y, v, w):
        seen["matmul"] = nisa.nc_matmul(x, w)
        seen["transpose"] = nisa.nc_transpose(x)
        seen["vector_transpose"] = nisa.nc_transpose(x[0:32, 0:32], engine=nisa.vector_engine)
        seen["activation"] = nisa.activation(nl.exp, x.reshape(128, 64))
        seen["stats"] = nisa.bn_stats(nl.copy(x, dtype=nl.bfloat16))
        return seen["activation"]

    _one(build, X, Y, V, W)
    where = {k: (t.buffer, t.dtype, t.shape) for k, t in seen.items()}
    assert where["matmul"] == (nl.psum, nl.float32, (64, 32))
    assert where["transpose"] == (nl.psum, nl.float32, (64, 128))
    assert where["vector_transpose"][0] is nl.sbuf
    assert where["activation"] == (nl.sbuf, nl.float32, (128, 64))
    assert where["stats"] == (nl.sbuf, nl.bfloat16, (128, 6))


@nki.jit
def _older_attention_row(q_t, k_t, n_valid):
    """An older-dialect score block: masked matmul into PSUM by +=, a causal affine_select by
    assignment, row max and exp-sum by value-returning calls."""
    out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:128]
    q, k = nl.load(q_t), nl.load(k_t)
    scores = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
    scores[i_p, i_f] += nisa.nc_matmul(q, k, mask=(i_f < n_valid))
    buf = nl.ndarray((128, 128), dtype=nl.float32)
    buf[i_p, i_f] = nisa.affine_select(i_p - i_f >= 0, nl.copy(scores), -1e9)  # GpSimd: SBUF only
    stats = nl.ndarray((128, 2), dtype=nl.float32)
    stats[:, 0:1] = nisa.tensor_reduce(np.max, data=buf, axis=(1,), keepdims=True)
    exp = nisa.activation(np.exp, data=buf, bias=nisa.tensor_scalar(stats[:, 0:1], np.multiply, -1.0))
    stats[:, 1:2] = nisa.tensor_reduce(np.add, data=exp, axis=(1,), keepdims=True)
    nl.store(out, value=stats)
    return out


def test_older_kernel_with_value_forms_masks_and_assignment():
    q_t, k_t = RNG.standard_normal((64, 128), dtype=np.float32), RNG.standard_normal((64, 128), dtype=np.float32)
    n_valid = 100
    got = _older_attention_row(q_t, k_t, n_valid)
    s = q_t.T @ k_t
    s[:, n_valid:] = 0.0  # never written by the masked matmul: the zeros of nl.zeros
    s = np.where(np.arange(128)[:, None] >= np.arange(128)[None, :], s, -1e9)
    row_max = s.max(axis=1)
    np.testing.assert_allclose(got[:, 0], row_max, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[:, 1], np.exp(s - row_max[:, None]).sum(axis=1), rtol=1e-4)
    ops = [i.op for i in _older_attention_row.last_trace]
    # Assigned results are written in place: no tensor_copy besides the kernel's nl.copy.
    assert ops.count("nisa.tensor_copy") == 1, ops
    assert ops.count("nisa.nc_matmul") == 1 and ops.count("nisa.affine_select") == 1


@nki.jit
def _dropout(x, seed, rate):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.random_seed(seed)
    nl.store(out, value=nl.dropout(nl.load(x), rate))
    return out


def test_dropout_is_seeded_and_drops_at_the_rate():
    x = np.ones((128, 512), np.float32)
    a, b, c = _dropout(x, 7, 0.25), _dropout(x, 7, 0.25), _dropout(x, 8, 0.25)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert set(np.unique(a)) <= {0.0, 1.0}          # kept elements are not rescaled
    assert abs((a == 0).mean() - 0.25) < 0.01         # 65536 draws: 4 sigma is about 0.007
    assert [i.op for i in _dropout.last_trace].count("nisa.dropout") == 1


def test_calls_fitting_neither_form_name_both_signatures():
    def build(x, y, v, w):
        return nisa.tensor_reduce(np.max, x)  # no axis

    with pytest.raises(nki.NKIError, match=r"neither the destination form nisa.tensor_reduce\(dst, op"):
        _one(build, X, Y, V, W)


def test_value_forms_keep_the_hardware_rules():
    def build(x, y, v, w):
        return nisa.nc_matmul(w, x)  # stationary free size 32, moving free size 64: fine
    _one(build, X, Y, V, W)

    def too_wide(x, y, v, w):
        wide = nl.ndarray((128, 640), dtype=nl.float32)
        nisa.memset(wide, 1.0)
        return nisa.nc_matmul(x, wide)

    with pytest.raises(nki.NKIError, match="gemm_moving_fmax"):
        _one(too_wide, X, Y, V, W)

    def psum_gpsimd(x, y, v, w):
        return nisa.tensor_copy(nisa.nc_matmul(x, w), engine=nisa.gpsimd_engine)

    with pytest.raises(nki.NKIError, match="GpSimd Engine cannot read nl.psum"):
        _one(psum_gpsimd, X, Y, V, W)
