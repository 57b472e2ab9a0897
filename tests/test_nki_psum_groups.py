"""PSUM matmul accumulation groups and per-program on-chip memory (issue #27 item 4).

AWS (`nki.isa.nc_matmul`, NKI 0.3 migration guide): `accumulate=None` "auto-detects: the first
write to a PSUM location overwrites, and subsequent writes accumulate"; `accumulate=True` on a
location no matmul initialised is undefined behavior; the older dialect's `psum[...] += matmul` in
a contraction loop starts its group at the loop. The simulator's rule (docs/nki.md, "Simulator
rules"): per PSUM element, a group is open after a matmul writes it; a Vector / Scalar Engine read
(the result read out), a new allocation of the tile and a new program of the grid end it, and
another instruction's write turns it into a value (`+=` adds onto it, a matmul overwrites it).

Kernels here are this project's own; references are NumPy float64 products, compared at
rtol 1e-4 / atol 1e-4 for float32 operands (float32 accumulation of K <= 384 terms) and
rtol 2e-2 / atol 2e-2 for bfloat16 operands (the operands' rounding; sums in float32).
"""

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.compiler as ncc
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(27)
TOL = {np.float32: dict(rtol=1e-4, atol=1e-4), ml_dtypes.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _inputs(k, m, n, dtype):
    a = RNG.standard_normal((k, m)).astype(dtype)
    b = RNG.standard_normal((k, n)).astype(dtype)
    return a, b


def _ref(a, b):
    return a.astype(np.float64).T @ b.astype(np.float64)


# ---------------------------------------------------------------------------- `+=` (older dialect)
@nki.jit
def _plus_equals_one_bank(a, b):
    """Each output tile (a column block of `a`) sums its K tiles with `+=` into the same directly
    placed PSUM bank, which nothing zeroes (nki-samples attention v9/v10's pattern)."""
    k, m_total = a.shape
    n = b.shape[1]
    tiles = m_total // 64
    out = nl.ndarray((m_total, n), nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((tiles, nl.par_dim(64), n), nl.float32,
                     buffer=ncc.psum.mod_alloc(base_bank=3, num_bank_tiles=(1,)))
    for t in nl.sequential_range(tiles):
        for kt in nl.affine_range(k // 128):
            x = nl.load(a[nl.ds(kt * 128, 128), nl.ds(t * 64, 64)])
            y = nl.load(b[nl.ds(kt * 128, 128), :])
            acc[t, :, :] += nisa.nc_matmul(x, y)
        nl.store(out[nl.ds(t * 64, 64), :], nl.copy(acc[t, :, :], dtype=nl.float32))
    return out


@pytest.mark.parametrize("dtype,k,n", [(np.float32, 384, 256), (ml_dtypes.bfloat16, 256, 512)])
def test_plus_equals_starts_a_group_in_each_reused_bank(dtype, k, n):
    a, b = _inputs(k, 192, n, dtype)
    out = _plus_equals_one_bank(a, b)
    assert not np.isnan(out).any()  # the first tile does not add onto the poisoned bank
    np.testing.assert_allclose(out, _ref(a, b), **TOL[dtype])  # later tiles do not add onto earlier sums


@nki.jit
def _plus_equals_init(a, b, init):
    k, m = a.shape
    out = nl.ndarray((m, b.shape[1]), nl.float32, buffer=nl.shared_hbm)
    if init is None:
        acc = nl.ndarray((m, b.shape[1]), nl.float32, buffer=nl.psum)   # not initialised
    else:
        acc = nl.full((m, b.shape[1]), init, nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // 128):
        acc[...] += nisa.nc_matmul(nl.load(a[nl.ds(kt * 128, 128), :]), nl.load(b[nl.ds(kt * 128, 128), :]))
    nl.store(out, nl.copy(acc))
    return out


@pytest.mark.parametrize("init", [None, 0.0, 1.5])
def test_plus_equals_onto_fresh_psum_overwrites_onto_a_value_adds(init):
    a, b = _inputs(256, 64, 128, np.float32)
    out = _plus_equals_init(a, b, init)
    np.testing.assert_allclose(out, _ref(a, b) + (init or 0.0), **TOL[np.float32])


# ---------------------------------------------------------------------------- accumulate=None
@nki.jit
def _none_upfront_tiles(a, b):
    """Output tiles allocated up front at one PSUM address (nki-library attention_cte's mm2 tiles):
    each accumulates its K tiles with accumulate=None and is read out before the next starts."""
    k, m_total = a.shape
    n = b.shape[1]
    tiles = m_total // 128
    out = nl.ndarray((m_total, n), nl.float32, buffer=nl.shared_hbm)
    accs = [nl.ndarray((128, n), nl.float32, buffer=nl.psum, address=(0, 5 * 2048)) for _ in range(tiles)]
    for t in range(tiles):
        for kt in range(k // 128):
            x = nl.load(a[nl.ds(kt * 128, 128), nl.ds(t * 128, 128)])
            y = nl.load(b[nl.ds(kt * 128, 128), :])
            nisa.nc_matmul(accs[t], x, y)
        res = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(res, accs[t])
        nl.store(out[nl.ds(t * 128, 128), :], res)
    return out


@pytest.mark.parametrize("dtype,k,n", [(np.float32, 256, 512), (ml_dtypes.bfloat16, 384, 128)])
def test_tiles_sharing_a_psum_address_each_start_a_group(dtype, k, n):
    a, b = _inputs(k, 384, n, dtype)
    np.testing.assert_allclose(_none_upfront_tiles(a, b), _ref(a, b), **TOL[dtype])


@nki.jit
def _none_reused_auto_tile(a, b):
    """One automatically allocated PSUM tile reused by every output tile: reading the result out
    (here with the Scalar Engine) ends the group, so the next output tile starts its own."""
    k, m_total = a.shape
    n = b.shape[1]
    out = nl.ndarray((m_total, n), nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, n), nl.float32, buffer=nl.psum)
    for t in range(m_total // 128):
        for kt in range(k // 128):
            nisa.nc_matmul(acc, nl.load(a[nl.ds(kt * 128, 128), nl.ds(t * 128, 128)]),
                           nl.load(b[nl.ds(kt * 128, 128), :]))
        res = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        nisa.activation(res, nl.copy, acc)
        nl.store(out[nl.ds(t * 128, 128), :], res)
    return out


def test_reading_the_result_ends_the_group():
    a, b = _inputs(256, 256, 64, np.float32)
    np.testing.assert_allclose(_none_reused_auto_tile(a, b), _ref(a, b), **TOL[np.float32])


@nki.jit
def _none_reallocated(a, b):
    """A tile placed where another one's group is still open (never read): the new tile's first
    matmul overwrites."""
    out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    first = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum, address=(0, 2048))
    nisa.nc_matmul(first, x, y)
    second = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum, address=(0, 2048))
    nisa.nc_matmul(second, x, y)
    nl.store(out, nl.copy(second))
    return out


def test_a_new_allocation_starts_a_new_group():
    a, b = _inputs(128, 32, 96, np.float32)
    np.testing.assert_allclose(_none_reallocated(a, b), _ref(a, b), **TOL[np.float32])


@nki.jit
def _running_sums(a, b, explicit):
    """Partial sums read out after each K tile: accumulate=True continues the group after a read
    (running sums); accumulate=None starts a new one (each K tile's own product)."""
    k, m = a.shape
    n = b.shape[1]
    out = nl.ndarray((k // 128, m, n), nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
    for kt in range(k // 128):
        x, y = nl.load(a[nl.ds(kt * 128, 128), :]), nl.load(b[nl.ds(kt * 128, 128), :])
        nisa.nc_matmul(acc, x, y, accumulate=(kt > 0) if explicit else None)
        nl.store(out[kt], nl.copy(acc))
    return out


def test_explicit_accumulate_continues_after_a_read():
    a, b = _inputs(384, 64, 128, np.float32)
    parts = np.stack([_ref(a[i:i + 128], b[i:i + 128]) for i in range(0, 384, 128)])
    np.testing.assert_allclose(_running_sums(a, b, True), np.cumsum(parts, axis=0), **TOL[np.float32])
    np.testing.assert_allclose(_running_sums(a, b, False), parts, **TOL[np.float32])


def test_accumulate_true_onto_an_unwritten_tile_is_an_error():
    @nki.jit
    def kernel(a, b):
        acc = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, nl.load(a), nl.load(b), accumulate=True)
        return None

    a, b = _inputs(128, 16, 32, np.float32)
    with pytest.raises(nki.NKIError) as err:
        kernel(a, b)
    e = err.value
    assert e.instruction == "nisa.nc_matmul"
    assert "no instruction has written since their tile was allocated" in e.rule and "undefined" in e.rule
    assert "accumulate=False" in str(e)


# ---------------------------------------------------------------------------- programs of a grid
@nki.jit
def _sharded_matmul(a, b):
    """Each program (a logical core of LNC 2) computes its half of the output columns in the same
    directly placed PSUM bank, as nki-library's conv1d with lnc_shard=True does."""
    k, m = a.shape
    n = b.shape[1]
    half = n // nl.num_programs(0)
    pid = nl.program_id(0)
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, half), nl.float32, buffer=nl.psum, address=(0, 0))
    for kt in range(k // 128):
        nisa.nc_matmul(acc, nl.load(a[nl.ds(kt * 128, 128), :]),
                       nl.load(b[nl.ds(kt * 128, 128), nl.ds(pid * half, half)]))
    res = nl.ndarray((m, half), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(res, acc)
    nl.store(out[:, nl.ds(pid * half, half)], res)
    return out


@pytest.mark.parametrize("programs,dtype", [(2, np.float32), (4, ml_dtypes.bfloat16)])
def test_each_program_starts_its_own_groups(programs, dtype):
    a, b = _inputs(256, 64, 512, dtype)
    out = nki.cpu_simulate(_sharded_matmul)[programs](a=a, b=b)
    np.testing.assert_allclose(out, _ref(a, b), **TOL[dtype])


def test_programs_do_not_see_each_others_direct_memory():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((nl.num_programs(0),) + a.shape, nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf, address=(0, 0))
        if nl.program_id(0) == 0:
            nisa.dma_copy(buf, a)
        nl.store(out[nl.program_id(0)], buf)
        return out

    a = RNG.standard_normal((8, 16)).astype(np.float32)
    out = kernel[2](a)
    np.testing.assert_array_equal(out[0], a)
    assert np.isnan(out[1]).all()  # program 1 runs on its own core: the SBUF it never wrote is poison
