"""The older NKI dialect on the simulator: nl.arange / nl.mgrid indexing, mask=, `t[...] = value`,
nl.par_dim block tensors and the two E4M3 types. Each kernel is this project's own, checked
against a NumPy reference (exact for copies and max, rtol 1e-6 for float32 exp/add, 1e-4 for matmuls).
"""

from __future__ import annotations

import linecache

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(27)


def rand(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


def expect_error(fn, *args, rule, token):
    """The kernel must fail with `rule` in the message, located at the kernel line holding `token`."""
    with pytest.raises(nki.NKIError) as info:
        fn(*args)
    err = info.value
    assert rule in str(err), str(err)
    path, line = err.location.rsplit(":", 1)
    assert path == __file__ and token in linecache.getline(path, int(line)), err.location
    return err


# ---------------------------------------------------------------------------- index expressions
def test_arange_and_mgrid_expressions():
    i_p = nl.arange(4)[:, None]
    i_f = nl.arange(3)[None, :]
    expr = 10 + 2 * i_p - i_f
    assert expr.shape == (4, 3)
    np.testing.assert_array_equal(expr.values(), 10 + 2 * np.arange(4)[:, None] - np.arange(3)[None, :])
    assert expr.bounds() == (8, 16)
    np.testing.assert_array_equal(nl.arange(2, 10, 3).values(), [2, 5, 8])
    grid = nl.mgrid[0:4, 1:7:2, 0:2]
    assert [g.shape for g in grid] == [(4, 3, 2)] * 3
    np.testing.assert_array_equal(grid.x.values(), np.mgrid[0:4, 1:7:2, 0:2][1])
    assert grid.p is grid[0] and grid.y is grid[2]
    i, j = nl.mgrid[0:2, 0:5]
    np.testing.assert_array_equal(j.values(), np.mgrid[0:2, 0:5][1])
    mask = (i_p < 2) & ~(i_f == 1)
    np.testing.assert_array_equal(mask.array, (np.arange(4)[:, None] < 2) & (np.arange(3)[None, :] != 1))
    with pytest.raises(nki.NKIError, match="not affine"):
        i_p * i_f
    with pytest.raises(nki.NKIError, match="affine"):
        i_p // 2
    with pytest.raises(nki.NKIError, match="do not broadcast"):
        nl.arange(4)[None, :] + nl.arange(3)[None, :]
    with pytest.raises(nki.NKIError, match="truth value"):
        bool(i_p < 2)


@nki.jit
def _spmd_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ix = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    iy = nl.program_id(1) * 256 + nl.arange(256)[None, :]
    nl.store(out[ix, iy], value=nl.load(a[ix, iy]) + nl.load(b[ix, iy]))
    return out


def test_spmd_tiles_through_affine_indices():
    a, b = rand(256, 512), rand(256, 512)
    np.testing.assert_allclose(_spmd_add[2, 2](a, b), a + b, rtol=1e-6)


@nki.jit
def _transpose_in_partition(x, rows, cols):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    i_p = nl.arange(x.shape[0])[:, None, None]
    i_r = nl.arange(rows)[None, :, None]
    i_c = nl.arange(cols)[None, None, :]
    res = nl.ndarray((x.shape[0], rows * cols), dtype=x.dtype)
    res[i_p, i_c * rows + i_r] = nl.copy(tile[i_p, i_r * cols + i_c])
    nl.store(out, value=res)
    return out


def test_three_axis_access_patterns_read_and_write_a_tile():
    x = np.arange(6 * 3 * 5, dtype=np.float32).reshape(6, 15)
    got = _transpose_in_partition(x, 3, 5)
    np.testing.assert_array_equal(got, x.reshape(6, 3, 5).transpose(0, 2, 1).reshape(6, 15))
    # The copy writes the assigned tile directly (no second copy), as AWS's compiler targets it.
    ops = [ins.op for ins in _transpose_in_partition.last_trace]
    assert ops == ["nisa.dma_copy", "nisa.tensor_copy", "nisa.dma_copy"], ops


@nki.jit
def _load_rank3(a, k):
    out = nl.ndarray(a.shape[1:], dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:a.shape[1], 0:a.shape[2]]
    nl.store(out[i_p, i_f], value=nl.exp(nl.load(a[k, i_p, i_f])))
    return out


def test_rank3_hbm_with_a_loop_index():
    a = rand(3, 64, 32)
    np.testing.assert_allclose(_load_rank3(a, 2), np.exp(a[2]), rtol=1e-6)


@nki.jit
def _out_of_bounds(a):
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(64)[None, :]
    nl.load(a[64 + i_p, i_f])


def test_out_of_bounds_index_names_tensor_and_bound():
    err = expect_error(_out_of_bounds, np.zeros((128, 64), np.float32),
                       rule="index on axis 0 of a (shape (128, 64)) ranges over 64..191, outside its bound "
                            "[0, 128)", token="nl.load")
    assert err.instruction == "nl.load"


# ---------------------------------------------------------------------------- mask=
@nki.jit
def _masked_rows(a, n):
    """Row tiles of 128 over a height that is not a multiple of 128: the last tile is masked."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:a.shape[1]]
    for t in nl.affine_range((n + 127) // 128):
        rows = t * 128 + i_p
        tile = nl.load(a[rows, i_f], mask=(rows < n))
        nl.store(out[rows, i_f], value=nl.exp(tile, mask=(rows < n)), mask=(rows < n))
    return out


def test_mask_lets_an_access_leave_bounds_where_it_excludes_it():
    a = rand(200, 48)
    np.testing.assert_allclose(_masked_rows(a, 200), np.exp(a), rtol=1e-6)


@nki.jit
def _masked_store(a, out):
    i_p, i_f = nl.mgrid[0:a.shape[0], 0:a.shape[1]]
    tile = nl.load(a[i_p, i_f])
    nl.store(out[i_p, i_f], value=tile, mask=(i_p < 100) & (i_f >= 10))
    nl.store(out[i_p, i_f], value=tile, mask=False)


def test_masked_store_leaves_the_rest_unchanged_and_false_issues_nothing():
    a = rand(128, 64)
    out = np.full((128, 64), -7.0, np.float32)
    _masked_store(a, out)
    ref = np.full((128, 64), -7.0, np.float32)
    ref[:100, 10:] = a[:100, 10:]
    np.testing.assert_array_equal(out, ref)
    assert [ins.op for ins in _masked_store.last_trace] == ["nisa.dma_copy", "nisa.dma_copy"]


@nki.jit
def _masked_load_into_zeros(a, rows):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:a.shape[0], 0:a.shape[1]]
    buf = nl.zeros(a.shape, dtype=a.dtype)
    buf[i_p, i_f] = nl.load(a[i_p, i_f], mask=(i_p < rows))
    nl.store(out, value=buf)
    return out


def test_masked_load_assigned_into_a_tile_keeps_masked_rows():
    a = rand(96, 40)
    ref = np.zeros_like(a)
    ref[:50] = a[:50]
    np.testing.assert_array_equal(_masked_load_into_zeros(a, 50), ref)


@nki.jit
def _masked_reductions(a, n):
    out = nl.ndarray((a.shape[0], 2), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.arange(a.shape[0])[:, None], nl.arange(a.shape[1])[None, :]
    tile = nl.load(a)
    res = nl.ndarray((a.shape[0], 2), dtype=a.dtype)
    res[i_p, 0] = nl.sum(tile, axis=1, keepdims=True, mask=(i_f < n))
    res[i_p, 1] = nl.max(tile, axis=1, keepdims=True, mask=(i_f < n))
    nl.store(out, value=res)
    return out


def test_masked_reduction_reads_only_masked_in_elements():
    a = rand(64, 32)
    got = _masked_reductions(a, 5)
    np.testing.assert_allclose(got[:, 0], a[:, :5].sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[:, 1], a[:, :5].max(axis=1))


@nki.jit
def _masked_matmul(lhs_t, rhs, k_valid):
    out = nl.ndarray((lhs_t.shape[1], rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    i_k, i_n = nl.mgrid[0:rhs.shape[0], 0:rhs.shape[1]]
    x = nl.load(lhs_t)
    y = nl.load(rhs)
    res = nl.matmul(x, y, transpose_x=True, mask=(i_k < k_valid))
    nl.store(out, value=nl.copy(res))
    return out


@pytest.mark.parametrize("m", [64, 128])  # M == K must not read the contraction mask as a row mask
def test_masked_matmul_does_not_read_masked_contraction_rows(m):
    lhs_t, rhs = rand(128, m), rand(128, 96)
    got = _masked_matmul(lhs_t, rhs, 40)
    np.testing.assert_allclose(got, lhs_t[:40].T @ rhs[:40], rtol=1e-4, atol=1e-4)


def test_mask_must_be_a_comparison():
    @nki.jit
    def bad(a):
        nl.load(a, mask=3)

    expect_error(bad, np.zeros((4, 4), np.float32), rule="mask must be a comparison", token="nl.load")


# ---------------------------------------------------------------------------- t[...] = value
@nki.jit
def _psum_accumulate(lhs_t, rhs):
    k, m = lhs_t.shape
    out = nl.ndarray((m, rhs.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    i_l = nl.mgrid[0:128, 0:m]
    i_r = nl.mgrid[0:128, 0:rhs.shape[1]]
    res = nl.zeros((m, rhs.shape[1]), nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // 128):
        x = nl.load(lhs_t[kt * 128 + i_l.p, i_l.x])
        y = nl.load(rhs[kt * 128 + i_r.p, i_r.x])
        res[...] += nl.matmul(x, y, transpose_x=True)
    nl.store(out, value=nl.copy(res))
    return out


def test_psum_plus_equals_accumulates_on_the_tensor_engine():
    lhs_t, rhs = rand(384, 128), rand(384, 256)
    np.testing.assert_allclose(_psum_accumulate(lhs_t, rhs), lhs_t.T @ rhs, rtol=1e-4, atol=1e-4)
    ops = [ins.op for ins in _psum_accumulate.last_trace]
    assert ops.count("nisa.nc_matmul") == 3 and "nisa.tensor_tensor" not in ops, ops
    assert nki.benchmark(_psum_accumulate)(lhs_t, rhs).latency_us > 0


@nki.jit
def _assign_forms(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(a.shape, dtype=a.dtype)
    t[...] = 2.0                                   # a number: memset
    x = nl.load(a)
    y = nl.exp(x)
    t[:, 0:8] = x[:, 0:8]                          # an older tile: tensor_copy
    t[:, 8:16] = y[:, 8:16]
    t[:, 16:24] = nl.multiply(x[:, 16:24], 3.0)    # the latest instruction's result: written in place
    nl.store(out, value=t)
    return out


def test_assignment_forms():
    a = rand(32, 32)
    ref = np.full_like(a, 2.0)
    ref[:, :8] = a[:, :8]
    ref[:, 8:16] = np.exp(a[:, 8:16])
    ref[:, 16:24] = 3.0 * a[:, 16:24]
    np.testing.assert_allclose(_assign_forms(a), ref, rtol=1e-6)
    ops = [ins.op for ins in _assign_forms.last_trace]
    assert ops == ["nisa.memset", "nisa.dma_copy", "nisa.activation", "nisa.tensor_copy", "nisa.tensor_copy",
                   "nisa.tensor_scalar", "nisa.dma_copy"], ops


def test_assignment_into_hbm_is_refused():
    @nki.jit
    def bad(a):
        a[0:4, :] = nl.load(a[4:8, :])

    expect_error(bad, np.zeros((8, 4), np.float32), rule="cannot assign into nl.shared_hbm", token="a[0:4")


# ---------------------------------------------------------------------------- nl.par_dim blocks
@nki.jit
def _blocks(a):
    n, f = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.zeros((n // 128, nl.par_dim(128), f), dtype=a.dtype)
    i_p, i_f = nl.mgrid[0:128, 0:f]
    for b in nl.affine_range(n // 128):
        buf[b, i_p, i_f] = nl.load(a[b * 128 + i_p, i_f])
    for b in nl.affine_range(n // 128):
        buf[b, :, :] = nl.exp(buf[b])
        nl.store(out[b * 128 + i_p, i_f], value=buf[b])
    return out


def test_block_tensor_is_one_tile_per_block():
    a = rand(512, 64)
    np.testing.assert_allclose(_blocks(a), np.exp(a), rtol=1e-6)
    # 4 blocks x 64 float32 per partition, plus one [128, 64] temporary at a time.
    assert _blocks.last_run.peak_sbuf == 4 * 64 * 4 + 64 * 4


def test_block_tensor_capacity_is_blocks_times_free_bytes():
    @nki.jit
    def too_big():
        nl.ndarray((30, nl.par_dim(128), 2048), dtype=nl.float32)

    expect_error(too_big, rule="needs 245760 bytes per partition", token="nl.ndarray")

    @nki.jit
    def fits():
        return nl.ndarray((27, nl.par_dim(128), 2048), dtype=nl.float32)  # 216 KiB of 224 KiB

    with pytest.raises(nki.NKIError, match="returned a tensor in nl.sbuf"):
        fits()


def test_block_axes_must_be_indexed_before_an_instruction():
    @nki.jit
    def bad():
        buf = nl.ndarray((2, nl.par_dim(128), 16), dtype=nl.float32)
        nisa.memset(buf, 0.0)

    expect_error(bad, rule="block dimension", token="nisa.memset")


# ---------------------------------------------------------------------------- E4M3 types
@nki.jit
def _cast(a, dtype):
    out = nl.ndarray(a.shape, dtype=dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.load(a), dtype=dtype))
    return out


def test_float8_e4m3_and_e4m3fn_are_different_types():
    assert nl.float8_e4m3 != nl.float8_e4m3fn
    assert nl.finfo(nl.float8_e4m3).max == 240 and nl.finfo(nl.float8_e4m3fn).max == 448
    values = np.array([[1.0, 0.3, 240.0, 300.0, 448.0, 2.0 ** -9]], np.float32)
    for dtype, ref in ((nl.float8_e4m3, ml_dtypes.float8_e4m3), (nl.float8_e4m3fn, ml_dtypes.float8_e4m3fn)):
        got = _cast(values, dtype)
        assert got.dtype == np.dtype(ref)
        np.testing.assert_array_equal(got.astype(np.float32), values.astype(ref).astype(np.float32))
    assert np.isinf(_cast(values, nl.float8_e4m3).astype(np.float32)[0, 3])     # 300 > 240
    assert _cast(values, nl.float8_e4m3fn).astype(np.float32)[0, 3] == 288.0


def test_float8_torch_round_trip():
    torch = pytest.importorskip("torch")
    x = torch.tensor([[1.0, 300.0]]).to(torch.float8_e4m3fn)
    assert _cast(x, nl.float8_e4m3fn).dtype == torch.float8_e4m3fn
    with pytest.raises(nki.NKIError, match="has no torch dtype"):
        _cast(x, nl.float8_e4m3)


@nki.jit
def _normalize_rows(x_ref):
    """x / rowsum(x) through a reduction's [P] result broadcast to [P, F]."""
    out = nl.ndarray(x_ref.shape, x_ref.dtype, buffer=nl.shared_hbm)
    x = nl.load(x_ref)
    total = nisa.tensor_reduce(np.add, data=x, axis=(1,), dtype=np.float32)
    inverse = (1.0 / total).broadcast_to(x_ref.shape)
    nl.store(out, nl.multiply(x, inverse))
    return out


def test_a_partition_vector_broadcasts_along_the_free_axis():
    """A [P] tile is one value per partition: broadcast to [P, F] it repeats along the free axis
    (NumPy's trailing-axis rule would give every partition the whole vector -- a wrong result that
    AWS's SD attention kernel exposed). P == F, so both readings fit the shape."""
    x = np.random.default_rng(3).random((128, 128), dtype=np.float32) + 0.5
    out = nki.simulate_kernel(_normalize_rows, x)
    np.testing.assert_allclose(out, x / x.sum(axis=1, keepdims=True), rtol=1e-5)
