"""Simulator gaps that AWS's nki-samples kernels found (issue #27; scripts/nki_suite/samples.py).

Each test is a small kernel of this project's own, checked against NumPy: the older dialect's
`t.reshape(shape=...)`, allocation functions called with AWS's keyword names, an int index after
the last nl.arange expression, `mask=False` on a value-returning call assigned or accumulated,
partition-first broadcasting between tiles of different ranks, nl.mod / nl.fmod / nl.where,
automatically allocated PSUM block tensors larger than PSUM, nl.store / nl.matmul / nl.transpose
of a PSUM tile (AWS: "an extra copy will be performed"), and JAX arrays as kernel arguments.
"""

import functools

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.compiler as ncc
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl


# ---------------------------------------------------------------------------- reshape(shape=)
@pytest.mark.parametrize("n,h,w", [(2, 3, 64), (4, 8, 16)])
def test_reshape_shape_keyword(n, h, w):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((n * h, w), a.dtype, buffer=nl.shared_hbm)
        flat = a.reshape(shape=(n * h, w))
        nl.store(out, nl.load(flat))
        return out

    a = np.arange(n * h * w, dtype=np.float32).reshape(n, h, w)
    np.testing.assert_array_equal(kernel(a), a.reshape(n * h, w))


def test_reshape_shape_keyword_and_positional_refused():
    @nki.jit
    def kernel(a):
        a.reshape((4, 4), shape=(4, 4))

    with pytest.raises(nki.NKIError, match="shape as arguments or as shape="):
        kernel(np.zeros((2, 8), np.float32))


# ---------------------------------------------------------------------------- allocation functions
def test_psum_alloc_function_gets_keywords():
    """partial(f, bank_map=...) of f(bank_map, idx, pdim_size, fdim_size) works only with keyword calls."""
    calls = []

    def psum_addr(bank_map, idx, pdim_size, fdim_size):
        calls.append((idx, pdim_size, fdim_size))
        return (bank_map[idx], 0, 0)

    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((2, 128, 512), nl.float32, buffer=nl.shared_hbm)
        xs, ys = nl.load(x), nl.load(y)
        res = nl.ndarray((2, nl.par_dim(128), 512), nl.float32,
                         buffer=ncc.psum.alloc(functools.partial(psum_addr, bank_map={(0,): 3, (1,): 6})))
        for b in range(2):
            nisa.nc_matmul(res[b], xs, ys)
            t = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(t, res[b])
            nl.store(out[b], t)
        return out

    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 128)).astype(np.float32)
    y = rng.standard_normal((128, 512)).astype(np.float32)
    got = kernel(x, y)
    np.testing.assert_allclose(got[0], x.T @ y, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], x.T @ y, rtol=1e-4, atol=1e-3)
    assert ((0,), 128, 2048) in calls and ((1,), 128, 2048) in calls


def test_alloc_function_with_other_names_called_positionally():
    def place(i, p, f):  # not AWS's parameter names: positional
        return (0, 4096 * i[0])

    @nki.jit
    def kernel(a):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((2, nl.par_dim(128), 64), nl.float32, buffer=ncc.sbuf.alloc(place))
        for b in range(2):
            nisa.dma_copy(t[b], a[b])
            nl.store(out[b], t[b])
        return out

    a = np.arange(2 * 128 * 64, dtype=np.float32).reshape(2, 128, 64)
    np.testing.assert_array_equal(kernel(a), a)


# ---------------------------------------------------------------------------- int after the last expression
def test_int_index_after_expression_adds_no_axis():
    seen = {}

    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 32), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((2, nl.par_dim(128), 3), nl.float32, buffer=nl.sbuf)
        ip = nl.arange(128)[:, None]
        t[1] = nl.load(a)
        col = t[1, ip, 2]                      # [128, 1] (NumPy's advanced indexing), not [128, 1, 1]
        seen["shape"] = col.shape
        wide = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(wide, col.broadcast_to((128, 32)))
        nl.store(out, wide)
        return out

    a = np.arange(128 * 3, dtype=np.float32).reshape(128, 3)
    got = kernel(a)
    assert seen["shape"] == (128, 1)
    np.testing.assert_array_equal(got, np.repeat(a[:, 2:3], 32, axis=1))


# ---------------------------------------------------------------------------- mask=False
@pytest.mark.parametrize("steps", [[True, False, True], [False, True, True, False]])
def test_masked_out_matmul_accumulation_adds_nothing(steps):
    """`psum[...] += nisa.nc_matmul(..., mask=False)` (a compile-time False) is not issued."""
    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        xs, ys = nl.load(x), nl.load(y)
        acc = nl.zeros((nl.par_dim(128), 512), nl.float32, buffer=nl.psum)
        for keep in steps:
            acc[...] += nisa.nc_matmul(xs, ys, mask=keep)
        t = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        t[...] = nl.copy(acc)
        nl.store(out, t)
        return out

    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 128)).astype(np.float32)
    y = rng.standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_allclose(kernel(x, y), sum(steps) * (x.T @ y), rtol=1e-4, atol=1e-3)


def test_masked_out_assignment_writes_nothing():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.full((128, 64), 7.0, nl.float32)
        x = nl.load(a)
        t[...] = nl.multiply(x, 2.0, mask=False)
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(kernel(np.ones((128, 64), np.float32)), np.full((128, 64), 7.0))


# ---------------------------------------------------------------------------- partition-first broadcast
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reduction_result_meets_column_tile(dtype):
    """A reduction's [P] result plus a [P, 1] tile is [P, 1] (the partition axis aligns), not [P, P]."""
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        s = nl.sum(x, axis=[1, 2])              # [128]
        acc = nl.full((128, 1), 1.0, nl.float32)
        total = nl.add(acc, s)
        assert total.shape == (128, 1)
        nl.store(out, total)
        return out

    a = np.random.default_rng(2).random((128, 4, 6)).astype(dtype)
    np.testing.assert_allclose(kernel(a)[:, 0], 1.0 + a.astype(np.float64).sum(axis=(1, 2)), rtol=2e-3)


# ---------------------------------------------------------------------------- nl.mod, nl.fmod, nl.where
@pytest.mark.parametrize("op,ref", [(nl.mod, np.mod), (nl.fmod, np.fmod)])
@pytest.mark.parametrize("divisor", [3.0, -4.0])
def test_mod_and_fmod(op, ref, divisor):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, op(nl.load(a), divisor))
        return out

    a = np.arange(-64, 64, dtype=np.float32).reshape(128, 1) * np.ones((1, 8), np.float32)
    np.testing.assert_array_equal(kernel(a), ref(a, np.float32(divisor)))


def test_mod_on_integers():
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nl.mod(nl.load(a), 7, dtype=nl.int32))
        return out

    a = np.arange(128 * 4, dtype=np.int32).reshape(128, 4)
    np.testing.assert_array_equal(kernel(a), a % 7)


@pytest.mark.parametrize("y_is_tile", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.uint32])
def test_where(y_is_tile, dtype):
    @nki.jit
    def kernel(c, x, y):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        other = nl.load(y) if y_is_tile else 99
        nl.store(out, nl.where(nl.load(c), nl.load(x), other, dtype=x.dtype))
        return out

    rng = np.random.default_rng(3)
    c = (rng.random((128, 3, 5)) > 0.5).astype(np.float32)
    x = rng.integers(0, 50, (128, 3, 5)).astype(dtype)
    y = rng.integers(50, 90, (128, 3, 5)).astype(dtype)
    expect = np.where(c != 0, x, y if y_is_tile else 99).astype(dtype)
    np.testing.assert_array_equal(kernel(c, x, y), expect)


def test_where_rules():
    @nki.jit
    def both_psum(x, y):
        xs, ys = nl.load(x), nl.load(y)
        p = nl.matmul(xs, ys, transpose_x=True)   # PSUM
        nl.where(p, p, 0.0)

    x = np.ones((128, 128), np.float32)
    with pytest.raises(nki.NKIError, match="more than one input is in nl.psum"):
        both_psum(x, x)

    @nki.jit
    def bad_operand(c):
        nl.where(nl.load(c), "x", 1.0)

    with pytest.raises(nki.NKIError, match="x must be a tile or a number"):
        bad_operand(np.ones((128, 4), np.float32))


# ---------------------------------------------------------------------------- PSUM block tensors
def test_auto_psum_block_tensor_larger_than_psum_keeps_every_block():
    """32 blocks of one bank each (AWS's attention tutorial v3 at seqlen 4096 has 256): the compiler
    maps them onto fewer physical tiles; every block keeps its own values here."""
    blocks = 32

    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((blocks, 128, 512), nl.float32, buffer=nl.shared_hbm)
        xs, ys = nl.load(x), nl.load(y)
        qk = nl.ndarray((blocks, nl.par_dim(128), 512), nl.float32, buffer=nl.psum)
        for b in nl.affine_range(blocks):
            qk[b] = nisa.nc_matmul(xs, nl.multiply(ys, float(b + 1)))
        for b in nl.affine_range(blocks):
            t = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(t, qk[b])
            nl.store(out[b], t)
        return out

    rng = np.random.default_rng(4)
    x = rng.standard_normal((128, 128)).astype(np.float32)
    y = rng.standard_normal((128, 512)).astype(np.float32)
    got = kernel(x, y)
    for b in (0, 7, 31):
        np.testing.assert_allclose(got[b], (b + 1) * (x.T @ y), rtol=1e-4, atol=1e-2)


def test_psum_tiles_still_limited():
    """Plain tiles (and a block tensor whose one block does not fit) still hit the 8 banks."""
    @nki.jit
    def kernel():
        keep = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        nl.ndarray((2, nl.par_dim(128), 512), nl.float32, buffer=nl.psum)
        return keep

    with pytest.raises(nki.NKIError, match="PSUM capacity exceeded"):
        kernel()


# ---------------------------------------------------------------------------- nl-level PSUM operands
@pytest.mark.parametrize("n", [128, 64])
def test_store_and_matmul_of_psum_tiles_copy_first(n):
    """AWS's older attention tutorial (v1): nl.matmul of an nl.transpose result (PSUM) and nl.store of
    a matmul result (PSUM). The helpers copy to SBUF first (a tensor_copy in the trace)."""
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((n, n), nl.float32, buffer=nl.shared_hbm)
        at = nl.transpose(nl.load(a))                 # PSUM
        prod = nl.matmul(nl.load(b), at)              # b @ a.T, y from PSUM
        nl.store(out, prod)                           # PSUM -> SBUF -> HBM
        return out

    rng = np.random.default_rng(5)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b), b @ a.T, rtol=1e-4, atol=1e-3)
    ops = [i.op for i in kernel.last_trace]
    assert ops[-2:] == ["nisa.tensor_copy", "nisa.dma_copy"]


def test_dma_copy_of_psum_still_refused():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, nl.transpose(nl.load(a)))
        return out

    with pytest.raises(nki.NKIError, match="psum"):
        kernel(np.ones((128, 128), np.float32))


# ---------------------------------------------------------------------------- JAX arrays
def test_jax_arrays_in_and_out():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    for dtype in (jnp.float32, jnp.bfloat16):
        a = jax.random.uniform(jax.random.PRNGKey(0), (128, 64), dtype=dtype)
        b = jnp.ones((128, 64), dtype)
        got = kernel(a, b)
        assert isinstance(got, jax.Array) and got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(a + b, np.float32), rtol=1e-2)


def test_kernel_writing_a_jax_argument_is_refused():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    @nki.jit
    def kernel(a):
        nl.store(a, nl.load(a))

    with pytest.raises(nki.NKIError, match="JAX arrays are immutable"):
        kernel(jnp.ones((128, 8), jnp.float32))
    del jax


# ---------------------------------------------------------------------------- nl.loop_reduce
@pytest.mark.parametrize("op,ref", [(np.add, np.add), (nl.maximum, np.maximum)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_loop_reduce_reduces_into_the_assigned_tile(op, ref, dtype):
    """AWS: "the destination tile is also the rhs input to op": t[...] = loop_reduce(x) is t = t op x."""
    steps = 3

    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((nl.par_dim(128), 64), dtype=a.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(steps):
            x = nl.load(a[k])
            acc[...] = nl.loop_reduce(x, op=op, loop_indices=[k], dtype=a.dtype)
        nl.store(out, acc)
        return out

    a = np.random.default_rng(6).standard_normal((steps, 128, 64)).astype(dtype)
    expect = functools.reduce(ref, [a[k].astype(np.float32) for k in range(steps)], np.zeros((128, 64), np.float32))
    np.testing.assert_allclose(kernel(a).astype(np.float32), expect, rtol=2e-3, atol=2e-3)
    ops = [i.op for i in kernel.last_trace]
    assert ops.count("nisa.tensor_tensor") == steps


def test_loop_reduce_result_is_only_assigned():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        r = nl.loop_reduce(nl.load(a), op=np.add, loop_indices=[0])
        nl.store(out, r)
        return out

    with pytest.raises(nki.NKIError, match=r"pending result of nl.loop_reduce.*acc\[\.\.\.\] = nl.loop_reduce"):
        kernel(np.ones((128, 8), np.float32))


# ---------------------------------------------------------------------------- FP8 double-row matmul
@pytest.mark.parametrize("mode", [nisa.matmul_perf_mode.double_row, "double_row_gen3"])
@pytest.mark.parametrize("m,n", [(128, 512), (64, 256)])
def test_double_row_matmul_contracts_both_rows(mode, m, n):
    """perf_mode double_row with stationary [K, 2, M] and moving [K, 2, N] (AWS's double_row_matmul
    reference kernel's layout): dst = sum over r of st[:, r].T @ mv[:, r], a contraction over 2K rows."""
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        st, mv = nl.load(a), nl.load(b)
        res = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
        res[...] = nisa.nc_matmul(st, mv, perf_mode=mode)          # value form
        t = nl.ndarray((m, n), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(t, res)
        nl.store(out, t)
        dst = nl.ndarray((m, n), nl.float32, buffer=nl.psum)       # destination form
        nisa.nc_matmul(dst, st, mv, perf_mode=mode)
        return out

    rng = np.random.default_rng(7)
    fp8 = nl.float8_e4m3
    a = nl.static_cast(rng.uniform(-4, 4, (128, 2, m)), fp8)
    b = nl.static_cast(rng.uniform(-4, 4, (128, 2, n)), fp8)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    expect = a64[:, 0].T @ b64[:, 0] + a64[:, 1].T @ b64[:, 1]
    np.testing.assert_allclose(kernel(a, b), expect, rtol=1e-5, atol=1e-3)
    assert kernel.last_trace[-1].flops == 2 * 2 * 128 * m * n


def test_double_row_matmul_needs_fp8():
    @nki.jit
    def kernel(a):
        st = nl.load(a)
        nisa.nc_matmul(st, st, perf_mode=nisa.matmul_perf_mode.double_row)

    with pytest.raises(nki.NKIError, match="packs two FP8 rows"):
        kernel(np.ones((128, 2, 64), dtype=nl.bfloat16))


# ---------------------------------------------------------------------------- HBM slices past the end
@pytest.mark.parametrize("rows", [288, 200])
def test_hbm_slice_past_end_under_mask(rows):
    """in[256:384] of `rows` rows, loaded under mask=(i_p < rows) (AWS's adaptive pooling kernel)."""
    tiles = (rows + 127) // 128

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        for t in range(tiles):
            i_p = nl.arange(128)[:, None] + t * 128
            buf = nl.full((128, 16), -1.0, a.dtype)
            nisa.dma_copy(src=a[t * 128:(t + 1) * 128, 0:16], dst=buf, mask=(i_p < rows))
            nl.store(out[t * 128:(t + 1) * 128, 0:16], buf, mask=(i_p < rows))
        return out

    a = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    np.testing.assert_array_equal(kernel(a), a)


def test_hbm_slice_past_end_without_mask_is_refused():
    @nki.jit
    def kernel(a):
        nl.load(a[256:384, :])

    with pytest.raises(nki.NKIError, match="out of bounds"):
        kernel(np.zeros((288, 8), np.float32))


# ---------------------------------------------------------------------------- gathers by a tile of indices
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_rows_by_index_tile(dtype):
    """`src[b, idx_tile, i_f]` with idx_tile an int32 [128, 1] tile: partition p reads row idx[p]."""
    @nki.jit
    def kernel(src, idx):
        out = nl.ndarray((2, 128, 64), src.dtype, buffer=nl.shared_hbm)
        i_f = nl.arange(64)[None, :]
        rows = nl.load(idx)
        for b in range(2):
            nl.store(out[b], nl.load(src[b, rows, i_f]))
        return out

    rng = np.random.default_rng(8)
    src = rng.standard_normal((2, 300, 64)).astype(dtype)
    idx = rng.integers(0, 300, (128, 1)).astype(np.int32)
    got = kernel(src, idx)
    np.testing.assert_array_equal(got, src[:, idx[:, 0], :])


def test_gather_index_out_of_bounds_needs_mask():
    @nki.jit
    def kernel(src, idx, n):
        out = nl.ndarray((128, 8), src.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(8)[None, :]
        rows = nl.load(idx)
        buf = nl.full((128, 8), 0.0, src.dtype)
        buf[i_p, i_f] = nl.load(src[rows, i_f], mask=(i_p < n))
        nl.store(out, buf)
        return out

    src = np.arange(50 * 8, dtype=np.float32).reshape(50, 8)
    idx = np.arange(128, dtype=np.int32).reshape(128, 1)      # rows 50.. are outside
    got = kernel(src, idx, 50)
    np.testing.assert_array_equal(got[:50], src)
    np.testing.assert_array_equal(got[50:], 0.0)
    with pytest.raises(nki.NKIError, match="takes values 0..127"):
        kernel(src, idx, 51)


def test_numpy_mod_as_alu_operator():
    """np.mod (numpy's name: remainder) and np.fmod resolve to nl.mod / nl.fmod in nisa instructions."""
    @nki.jit
    def kernel(a):
        out = nl.ndarray((2, 128, 16), nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        for k, op in enumerate((np.mod, np.fmod)):
            t = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(t, x, op, -3.0)
            nl.store(out[k], t)
        return out

    a = np.linspace(-10, 10, 128 * 16, dtype=np.float32).reshape(128, 16)
    got = kernel(a)
    np.testing.assert_allclose(got[0], np.mod(a, -3.0), atol=1e-5)
    np.testing.assert_allclose(got[1], np.fmod(a, -3.0), atol=1e-5)


# ---------------------------------------------------------------------------- a single element
def test_single_element_load_is_a_1x1_tile_and_store_writes_it():
    """`nl.load(a[b, h])` of a 2-D HBM tensor (no axis left) is a [1, 1] SBUF tile, as AWS
    documents (`a_tile: tensor[1, 1] = nl.load(a[0, 0])`); `nl.store(out[b, h], ...)` writes that one
    element (nki-samples' flash_attn_bwd loads `sinks[b, h]` and stores its gradient so)."""
    B, H = 2, 3

    @nki.jit
    def kernel(sinks):
        out = nl.ndarray((B, H), nl.float32, buffer=nl.shared_hbm)
        for b in nl.affine_range(B):
            for h in nl.affine_range(H):
                s = nl.load(sinks[b, h], dtype=nl.float32)
                assert s.shape == (1, 1)
                plane = nl.add(nl.zeros((128, 1), dtype=nl.float32), s)   # the element on 128 partitions
                total = nisa.tensor_partition_reduce(np.add, plane)
                nl.store(out[b, h], value=total)
        return out

    sinks = np.random.default_rng(0).standard_normal((B, H)).astype(np.float32)
    np.testing.assert_allclose(kernel(sinks), 128 * sinks, rtol=1e-6)


def test_store_into_a_single_element_leaves_its_neighbours():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((4, 5), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        nl.store(out[2, 3], value=nl.full((1, 1), -7.0, nl.float32))
        return out

    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    want = a.copy()
    want[2, 3] = -7.0
    np.testing.assert_array_equal(kernel(a), want)


# ---------------------------------------------------------------------------- int tile / int
def test_int32_tile_divided_by_int_is_int32_rounded():
    """AWS's type promotion: a Python int is a weakly typed int32, so int32 tile / int is int32; the
    Vector Engine divides in float32 and converts on output, to nearest (AWS's nki-library floors with
    `round(x / y - 0.5)` through that conversion). nl.floor of the int32 result changes nothing: this
    is why nki-samples' resize_nearest_fixed_dma_kernel gets 59 for 2241 / 38 (it needs 58)."""
    @nki.jit
    def kernel():
        out = nl.ndarray((2, 128, 1), nl.int32, buffer=nl.shared_hbm)
        pos = nisa.iota(2176 + nl.arange(128)[:, None], dtype=nl.int32)
        q = pos / 38
        assert q.dtype == nl.int32
        nl.store(out[0], q)
        nl.store(out[1], nl.floor(q, dtype=nl.int32))
        return out

    got = kernel()
    pos = 2176 + np.arange(128).reshape(128, 1)
    want = np.rint((pos / 38).astype(np.float32)).astype(np.int32)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want)
    assert got[0][2241 - 2176, 0] == 59
