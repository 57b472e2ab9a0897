"""Row softmax of x[N, D] (D <= a few thousand), 128 rows per tile.

max (Vector Engine reduce) -> exp(x - max) with the row sum fused into the same Scalar Engine
instruction -> reciprocal of the sum -> scale rows.

    python examples/nki/softmax.py
"""

import numpy as np

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl


@nki.jit
def softmax_kernel(x):
    rows, cols = x.shape
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    pmax = nl.tile_size.pmax
    for i in nl.affine_range((rows + pmax - 1) // pmax):
        p = min(pmax, rows - i * pmax)
        tile = nl.load(x[nl.ds(i * pmax, p), :], dtype=nl.float32)
        row_max = nl.max(tile, axis=1, keepdims=True)
        neg_max = nl.multiply(row_max, -1.0)
        e = nl.ndarray((p, cols), nl.float32, buffer=nl.sbuf)
        row_sum = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(e, op=nl.exp, data=tile, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv = nl.reciprocal(row_sum)
        y = nl.multiply(e, inv, dtype=x.dtype)
        nl.store(out[nl.ds(i * pmax, p), :], y)
    return out


def reference(x):
    x = x.astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main():
    x = np.random.default_rng(0).standard_normal((256, 1000), dtype=np.float32)
    out = softmax_kernel(x)
    print("max abs error vs NumPy:", float(np.abs(out - reference(x)).max()))
    print(nki.benchmark(softmax_kernel)(x).summary())


if __name__ == "__main__":
    main()
