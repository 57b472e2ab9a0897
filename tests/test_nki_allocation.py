"""Direct allocation (nki.compiler.sbuf/psum.mod_alloc and .alloc, nl.ndarray(address=)) and the
launch-grid / constant names AWS's tutorials use with it (nl.spmd_dim, nl.nc, nl.shared_constant,
nl.load_transpose2d). Kernels are this project's own; references are NumPy (copies exact, float32
matmul rtol 1e-5)."""

from __future__ import annotations

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

ncc = nki.compiler
RNG = np.random.default_rng(3)


def test_modulo_allocation_wraps_blocks_onto_shared_tiles():
    """4 logical blocks in 2 physical tiles: block 2 lands where block 0 was (AWS's modulo rule)."""
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 128), a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((4, nl.par_dim(128), 64), dtype=a.dtype,
                       buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
        for i in range(4):
            nisa.dma_copy(t[i], a[:, i * 64:(i + 1) * 64])
        nisa.dma_copy(out[:, 0:64], t[0])
        nisa.dma_copy(out[:, 64:128], t[1])
        return out

    a = RNG.standard_normal((128, 256), dtype=np.float32)
    out = k(a)
    np.testing.assert_array_equal(out[:, :64], a[:, 128:192])
    np.testing.assert_array_equal(out[:, 64:], a[:, 192:256])


def test_tensors_at_one_address_share_memory():
    """Two tensors placed at one byte address alias, across dtypes (bf16 written, read as raw uint16)."""
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.uint16, buffer=nl.shared_hbm)
        x = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf, address=(0, 1024))
        y = nl.ndarray(a.shape, nl.uint16, buffer=ncc.sbuf.mod_alloc(base_addr=1024))
        nisa.dma_copy(x, a)
        nisa.dma_copy(out, y)
        return out

    import ml_dtypes
    a = RNG.standard_normal((128, 32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(k(a), a.view(np.uint16))


def test_disjoint_allocations_do_not_interfere_and_zeros_fill_only_their_blocks():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 96), a.dtype, buffer=nl.shared_hbm)
        x = nl.ndarray((nl.par_dim(128), 64), a.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        nisa.dma_copy(x, a)
        z = nl.zeros((2, nl.par_dim(128), 16), a.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=256, num_free_tiles=(2,)))
        nisa.dma_copy(out[:, 0:64], x)
        nisa.dma_copy(out[:, 64:80], z[0])
        nisa.dma_copy(out[:, 80:96], z[1])
        return out

    a = RNG.standard_normal((128, 64), dtype=np.float32)
    out = k(a)
    np.testing.assert_array_equal(out[:, :64], a)
    assert not out[:, 64:].any()


def test_psum_mod_alloc_banks_hold_matmul_results():
    """Each block of a PSUM tensor gets its own bank; matmul accumulation works in them."""
    @nki.jit
    def k(x, w):
        out = nl.ndarray((2, 128, 512), nl.float32, buffer=nl.shared_hbm)
        xs = nl.load(x)
        ws = nl.load(w)
        acc = nl.ndarray((2, nl.par_dim(128), 512), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=2, num_bank_tiles=(2,)))
        for b in range(2):
            for kk in range(2):  # two accumulating matmuls per bank
                nisa.nc_matmul(acc[b], xs[:, nl.ds(kk * 128, 128)], ws[:, nl.ds(b * 512, 512)])
            res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(res, acc[b])
            nisa.dma_copy(out[b], res)
        return out

    x = RNG.standard_normal((128, 256), dtype=np.float32)
    w = RNG.standard_normal((128, 1024), dtype=np.float32)
    out = k(x, w)
    for b in range(2):
        want = x[:, :128].T @ w[:, b * 512:(b + 1) * 512] + x[:, 128:].T @ w[:, b * 512:(b + 1) * 512]
        np.testing.assert_allclose(out[b], want, rtol=1e-5, atol=1e-4)


def test_custom_alloc_function_places_each_block():
    """ncc.sbuf.alloc(func): blocks (i, j) placed in reverse order still read back per block."""
    def place(idx, pdim, fdim):
        i, j = idx
        return 0, (3 - (2 * i + j)) * fdim

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 4 * 32), a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((2, 2, nl.par_dim(128), 32), a.dtype, buffer=ncc.sbuf.alloc(place))
        for i in range(2):
            for j in range(2):
                nisa.dma_copy(t[i, j], a[:, nl.ds((2 * i + j) * 32, 32)])
        for i in range(2):
            for j in range(2):
                nisa.dma_copy(out[:, nl.ds((2 * i + j) * 32, 32)], t[i, j])
        return out

    a = RNG.standard_normal((128, 128), dtype=np.float32)
    np.testing.assert_array_equal(k(a), a)


@pytest.mark.parametrize("buffer, rule", [
    (lambda: ncc.sbuf.mod_alloc(base_addr=224 * 1024 - 100), "SBUF address out of range"),
    (lambda: ncc.psum.mod_alloc(base_bank=8), "PSUM bank 8 out of range"),
    (lambda: ncc.psum.mod_alloc(base_bank=0, base_addr=1024), "PSUM address out of range"),
    (lambda: ncc.sbuf.mod_alloc(base_addr=2), "not a multiple of its dtype's size"),
])
def test_placement_errors_name_the_real_figures(buffer, rule):
    @nki.jit
    def k(a):
        nl.ndarray((128, 512), nl.float32, buffer=buffer())
        return a

    with pytest.raises(nki.NKIError) as info:
        k(np.zeros((1, 1), np.float32))
    assert rule in str(info.value)
    if "SBUF" in rule:
        assert "229376 bytes per partition (trn2)" in str(info.value)


def test_compiler_decorators_and_directives_pass_through():
    @ncc.skip_middle_end_transformations
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        for i in nl.sequential_range(2, directives=ncc.no_reorder()):
            nisa.dma_copy(out[nl.ds(i * 128, 128)], nl.load(a[nl.ds(i * 128, 128)]))
        return out

    a = RNG.standard_normal((256, 8), dtype=np.float32)
    np.testing.assert_array_equal(k(a), a)
    assert ncc.sbuf.auto_alloc() is nl.sbuf and ncc.psum.auto_alloc() is nl.psum


def test_spmd_dim_is_the_product_of_its_factors():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nisa.dma_copy(out[nl.ds(i * 128, 128)], nl.load(a[nl.ds(i * 128, 128)]))
        return out

    a = RNG.standard_normal((8 * 128, 4), dtype=np.float32)
    assert nl.spmd_dim(4, nl.nc(2)) == 8 and nl.nc(2) == 2
    np.testing.assert_array_equal(k[nl.spmd_dim(4, nl.nc(2))](a), a)


def test_load_transpose2d_and_shared_constant():
    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(a)
        eye = nl.load(nl.shared_constant(np.identity(4, dtype=np.int8), dtype=nl.float32))
        nl.store(out, t)
        out2 = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nl.store(out2, eye)
        return out, out2

    a = RNG.standard_normal((64, 32), dtype=np.float32)
    out, eye = k(a)
    np.testing.assert_array_equal(out, a.T)
    np.testing.assert_array_equal(eye, np.identity(4, dtype=np.float32))
