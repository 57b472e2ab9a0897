"""LayerNorm with bn_stats / bn_aggr: y = (x - mean) / sqrt(var + eps) * gamma + beta.

bn_stats summarizes each chunk of up to 512 elements per partition into 6 values; bn_aggr
combines the chunks into (mean, variance) in one Vector Engine instruction.

    python examples/nki/layernorm.py
"""

import numpy as np

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl


@nki.jit
def layernorm_kernel(x, gamma, beta, eps=1e-5):
    rows, cols = x.shape
    pmax = nl.tile_size.pmax
    fmax = nl.tile_size.bn_stats_fmax
    chunks = (cols + fmax - 1) // fmax
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, cols)).broadcast_to((pmax, cols)), dtype=nl.float32)
    b = nl.load(beta.reshape((1, cols)).broadcast_to((pmax, cols)), dtype=nl.float32)
    for i in nl.affine_range((rows + pmax - 1) // pmax):
        p = min(pmax, rows - i * pmax)
        tile = nl.load(x[nl.ds(i * pmax, p), :])
        stats = nl.ndarray((p, chunks * nl.tile_size.bn_stats_dim), nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(chunks):
            width = min(fmax, cols - c * fmax)
            nisa.bn_stats(stats[:, nl.ds(c * nl.tile_size.bn_stats_dim, nl.tile_size.bn_stats_dim)],
                          tile[:, nl.ds(c * fmax, width)])
        mean_var = nl.ndarray((p, nl.tile_size.bn_aggr_dim), nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(mean_var, stats)
        rstd = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(rstd, mean_var[:, 1:2], nl.add, eps)
        nisa.activation(rstd, op=nl.rsqrt, data=rstd)
        normed = nl.ndarray((p, cols), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(normed, tile, nl.subtract, mean_var[:, 0:1], op1=nl.multiply, operand1=rstd)
        scaled = nl.ndarray((p, cols), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(scaled, normed, g[:p, :], nl.multiply)
        y = nl.ndarray((p, cols), x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(y, scaled, b[:p, :], nl.add)
        nl.store(out[nl.ds(i * pmax, p), :], y)
    return out


def reference(x, gamma, beta, eps=1e-5):
    x = x.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps) * gamma + beta).astype(np.float32)


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 1100), dtype=np.float32) * 3 + 1
    gamma = rng.standard_normal(1100, dtype=np.float32)
    beta = rng.standard_normal(1100, dtype=np.float32)
    out = layernorm_kernel(x, gamma, beta)
    print("max abs error vs NumPy:", float(np.abs(out - reference(x, gamma, beta)).max()))
    print(nki.benchmark(layernorm_kernel)(x, gamma, beta).summary())


if __name__ == "__main__":
    main()
