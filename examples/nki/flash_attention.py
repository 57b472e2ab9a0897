"""Causal flash attention forward for one head: out = softmax(q k^T / sqrt(d) + causal mask) v.

q, k, v: [seq, d] with d <= 128 and seq a multiple of 512. K^T and V are loaded once and stay in
SBUF; for each 128-row query tile the kernel walks the 512-wide key blocks at or before the
diagonal, keeping the running row max m, the running denominator l and the output accumulator
(online softmax), and masks the diagonal block with affine_select.

Written for clarity, not speed: each query tile is one chain of dependent instructions that
alternates between engines, and engines run in order, so the cost model estimates only ~6% of
Tensor Engine peak at seq 1024 (interleaving two query tiles would overlap the chains).

    python examples/nki/flash_attention.py
"""

import math

import ml_dtypes
import numpy as np

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

Q_TILE = 128
K_BLOCK = 512
NEG = -1e30


@nki.jit
def flash_attention_fwd(q, k, v):
    seq, d = q.shape
    scale = 1.0 / math.sqrt(d)
    chunks = K_BLOCK // 128
    out = nl.ndarray((seq, d), q.dtype, buffer=nl.shared_hbm)

    # K^T [d, seq] (via Tensor Engine transposes) and V [128, seq/128, d], loaded once.
    k_t = nl.ndarray((d, seq), q.dtype, buffer=nl.sbuf)
    v_sb = nl.ndarray((128, seq // 128, d), q.dtype, buffer=nl.sbuf)
    for t in nl.affine_range(seq // 128):
        k_tile = nl.load(k[nl.ds(t * 128, 128), :])
        k_tp = nl.ndarray((d, 128), q.dtype, buffer=nl.psum)
        nisa.nc_transpose(k_tp, k_tile)
        nisa.tensor_copy(k_t[:, nl.ds(t * 128, 128)], k_tp)
        nisa.dma_copy(v_sb[:, t, :], v[nl.ds(t * 128, 128), :])

    for i in nl.affine_range(seq // Q_TILE):
        q_tile = nl.load(q[nl.ds(i * Q_TILE, Q_TILE), :])
        q_tp = nl.ndarray((d, Q_TILE), q.dtype, buffer=nl.psum)
        nisa.nc_transpose(q_tp, q_tile)
        q_t = nl.ndarray((d, Q_TILE), q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(q_t, q_tp, nl.multiply, scale)  # fold 1/sqrt(d) into q

        m = nl.full((Q_TILE, 1), NEG, nl.float32)
        l = nl.zeros((Q_TILE, 1), nl.float32)
        acc = nl.zeros((Q_TILE, d), nl.float32)
        last_block = (i * Q_TILE + Q_TILE - 1) // K_BLOCK
        for j in nl.sequential_range(last_block + 1):
            s_ps = nl.ndarray((Q_TILE, K_BLOCK), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(s_ps, q_t, k_t[:, nl.ds(j * K_BLOCK, K_BLOCK)])
            s = s_ps  # blocks left of the diagonal are read straight from PSUM
            if (j + 1) * K_BLOCK > i * Q_TILE + 1:  # block reaches past the diagonal: mask it
                # GpSimd cannot read PSUM: copy, then keep where (i*Q_TILE + p) - (j*K_BLOCK + f) >= 0.
                s = nl.ndarray((Q_TILE, K_BLOCK), nl.float32, buffer=nl.sbuf)
                nisa.tensor_copy(s, s_ps, engine=nisa.engine.scalar)
                nisa.affine_select(s, pattern=[[-1, K_BLOCK]], offset=i * Q_TILE - j * K_BLOCK,
                                   channel_multiplier=1, on_true_tile=s, on_false_value=NEG)
            block_max = nl.ndarray((Q_TILE, 1), nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(block_max, nl.maximum, s, axis=1)
            m_new = nl.ndarray((Q_TILE, 1), nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(m_new, m, block_max, nl.maximum)
            neg_m = nl.ndarray((Q_TILE, 1), nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(neg_m, m_new, nl.multiply, -1.0)
            p = nl.ndarray((Q_TILE, K_BLOCK), q.dtype, buffer=nl.sbuf)
            row_sum = nl.ndarray((Q_TILE, 1), nl.float32, buffer=nl.sbuf)
            nisa.activation(p, op=nl.exp, data=s, bias=neg_m, reduce_op=nl.add, reduce_res=row_sum,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
            alpha = nl.ndarray((Q_TILE, 1), nl.float32, buffer=nl.sbuf)
            nisa.activation(alpha, op=nl.exp, data=m, bias=neg_m)
            nisa.scalar_tensor_tensor(l, l, nl.multiply, alpha, nl.add, row_sum)  # l = l*alpha + rowsum

            # P^T chunks ([keys, queries]) so that P @ V contracts over keys on partitions.
            pv = nl.ndarray((Q_TILE, d), nl.float32, buffer=nl.psum)
            for c in nl.affine_range(chunks):
                p_tp = nl.ndarray((128, Q_TILE), q.dtype, buffer=nl.psum)
                nisa.nc_transpose(p_tp, p[:, nl.ds(c * 128, 128)])
                p_t = nl.ndarray((128, Q_TILE), q.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(p_t, p_tp)
                nisa.nc_matmul(pv, p_t, v_sb[:, j * chunks + c, :])
            nisa.scalar_tensor_tensor(acc, acc, nl.multiply, alpha, nl.add, pv)  # acc = acc*alpha + P@V
            nisa.tensor_copy(m, m_new)

        inv_l = nl.ndarray((Q_TILE, 1), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(inv_l, l)
        o = nl.ndarray((Q_TILE, d), q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(o, acc, nl.multiply, inv_l)
        nl.store(out[nl.ds(i * Q_TILE, Q_TILE), :], o)
    return out


def reference(q, k, v):
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    s = q @ k.T / math.sqrt(q.shape[1])
    s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def make_inputs(seq=1024, d=128, dtype=ml_dtypes.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((seq, d), dtype=np.float32).astype(dtype) for _ in range(3))


def main():
    q, k, v = make_inputs()
    result = nki.benchmark(flash_attention_fwd, target="trn2")(q, k, v)
    err = np.abs(result.outputs.astype(np.float32) - reference(q, k, v)).max()
    print("max abs error vs NumPy:", float(err))
    print(result.summary())


if __name__ == "__main__":
    main()
