"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, x[N, D], weight[D].

The weight is DMA-broadcast to all 128 partitions once (an HBM broadcast view) and reused.

    python examples/nki/rmsnorm.py
"""

import numpy as np

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl


@nki.jit
def rmsnorm_kernel(x, weight, eps=1e-6):
    rows, cols = x.shape
    pmax = nl.tile_size.pmax
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    w = nl.load(weight.reshape((1, cols)).broadcast_to((pmax, cols)))
    for i in nl.affine_range((rows + pmax - 1) // pmax):
        p = min(pmax, rows - i * pmax)
        tile = nl.load(x[nl.ds(i * pmax, p), :])
        squares = nl.ndarray((p, cols), nl.float32, buffer=nl.sbuf)
        sum_sq = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(squares, op=nl.square, data=tile, reduce_op=nl.add, reduce_res=sum_sq,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        # rstd = (sum_sq / D + eps) ** -0.5, in one tensor_scalar and one activation.
        var = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(var, sum_sq, nl.multiply, 1.0 / cols, op1=nl.add, operand1=eps)
        rstd = nl.rsqrt(var)
        normed = nl.ndarray((p, cols), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(normed, tile, nl.multiply, rstd)
        y = nl.ndarray((p, cols), x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(y, normed, w[:p, :], nl.multiply)
        nl.store(out[nl.ds(i * pmax, p), :], y)
    return out


def reference(x, weight, eps=1e-6):
    x = x.astype(np.float32)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * weight.astype(np.float32)


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 768), dtype=np.float32)
    w = rng.standard_normal(768, dtype=np.float32)
    out = rmsnorm_kernel(x, w)
    print("max abs error vs NumPy:", float(np.abs(out - reference(x, w)).max()))
    print(nki.benchmark(rmsnorm_kernel)(x, w).summary())


if __name__ == "__main__":
    main()
