"""Matrix multiply out[M, N] = lhsT[K, M].T @ rhs[K, N], two ways.

`matmul_naive`: the textbook tiling. For every [128, 512] output tile and every 128-deep slice of
K it loads a [128, 128] and a [128, 512] tile and issues one matmul: small DMAs (256 B and 1 KiB
per partition), the same data loaded M/128 or N/512 times, so it is DMA-bound.

`matmul_optimized`: blocks of up to 1024 columns of lhsT and rhs (all of K) are loaded once per
block, with at least 2 KiB per partition per DMA, and kept in SBUF while every matmul of the block
runs (hoisted loads, blocked free dimensions); each output row-block is stored with one DMA.

    python examples/nki/matmul.py
"""

import ml_dtypes
import numpy as np

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

TILE_K = 128  # contraction tile: the partition dimension
TILE_M = 128  # stationary free size (nl.tile_size.gemm_stationary_fmax)
TILE_N = 512  # moving free size (nl.tile_size.gemm_moving_fmax)


@nki.jit
def matmul_naive(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            acc = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                a = nl.load(lhsT[nl.ds(k * TILE_K, TILE_K), nl.ds(m * TILE_M, TILE_M)])
                b = nl.load(rhs[nl.ds(k * TILE_K, TILE_K), nl.ds(n * TILE_N, TILE_N)])
                nisa.nc_matmul(acc, a, b)
            res = nl.ndarray((TILE_M, TILE_N), lhsT.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(res, acc)
            nl.store(out[nl.ds(m * TILE_M, TILE_M), nl.ds(n * TILE_N, TILE_N)], res)
    return out


@nki.jit
def matmul_optimized(lhsT, rhs, block_m=1024, block_n=1024):
    K, M = lhsT.shape
    _, N = rhs.shape
    kt = K // TILE_K
    # Each operand block holds all of K: keep it within ~96 KiB per partition so that both fit in
    # SBUF (224 KiB) with room for the results; halve the block width until it does.
    budget = 96 * 1024 // (kt * lhsT.itemsize)
    while block_m > TILE_M and block_m > budget:
        block_m //= 2
    while block_n > TILE_N and block_n > budget:
        block_n //= 2
    block_m, block_n = min(block_m, M), min(block_n, N)
    out = nl.ndarray((M, N), lhsT.dtype, buffer=nl.shared_hbm)
    for nb in nl.affine_range(N // block_n):
        # rhs columns of this block, all of K, loaded once and reused by every M block.
        rhs_sb = nl.ndarray((TILE_K, kt, block_n), rhs.dtype, buffer=nl.sbuf)
        _load_block(rhs_sb, rhs, nb * block_n)
        for mb in nl.affine_range(M // block_m):
            lhs_sb = nl.ndarray((TILE_K, kt, block_m), lhsT.dtype, buffer=nl.sbuf)
            _load_block(lhs_sb, lhsT, mb * block_m)
            for m in nl.affine_range(block_m // TILE_M):
                res = nl.ndarray((TILE_M, block_n), lhsT.dtype, buffer=nl.sbuf)
                for n in nl.affine_range(block_n // TILE_N):
                    acc = nl.ndarray((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(kt):
                        nisa.nc_matmul(acc, lhs_sb[:, k, nl.ds(m * TILE_M, TILE_M)],
                                       rhs_sb[:, k, nl.ds(n * TILE_N, TILE_N)])
                    nisa.tensor_copy(res[:, nl.ds(n * TILE_N, TILE_N)], acc)
                nl.store(out[nl.ds(mb * block_m + m * TILE_M, TILE_M), nl.ds(nb * block_n, block_n)], res)
    return out


def _load_block(dst, src, col):
    """dst[128, kt, width] = src[:, col:col + width] split into 128-row K tiles. DMAs are fastest
    from 2 KiB per partition, so narrow blocks load several K tiles per DMA (an HBM view
    [g*128, width] -> [128, g, width])."""
    _, kt, width = dst.shape
    group = max(1, min(kt, 2048 // (width * dst.itemsize)))
    while kt % group:
        group -= 1
    for k in nl.affine_range(kt // group):
        rows = src[nl.ds(k * group * TILE_K, group * TILE_K), nl.ds(col, width)]
        nisa.dma_copy(dst[:, nl.ds(k * group, group), :], rows.reshape((group, TILE_K, width)).permute(1, 0, 2))


def reference(lhsT, rhs):
    return lhsT.astype(np.float32).T @ rhs.astype(np.float32)


def make_inputs(k, m, n, dtype=ml_dtypes.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((k, m), dtype=np.float32).astype(dtype),
            rng.standard_normal((k, n), dtype=np.float32).astype(dtype))


def main():
    lhsT, rhs = make_inputs(1024, 1024, 1024)
    ref = reference(lhsT, rhs)
    for kernel in (matmul_naive, matmul_optimized):
        result = nki.benchmark(kernel, target="trn2")(lhsT, rhs)
        err = np.abs(result.outputs.astype(np.float32) - ref).max() / np.abs(ref).max()
        print(f"{kernel.__name__}: relative error {err:.2e}; {result.summary()}")


if __name__ == "__main__":
    main()
