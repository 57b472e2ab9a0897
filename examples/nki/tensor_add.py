"""Element-wise add of two [N, D] tensors, 128 rows (one partition tile) at a time.

    python examples/nki/tensor_add.py
"""

import numpy as np

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl


@nki.jit
def tensor_add_kernel(a, b):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    rows, cols = a.shape
    pmax = nl.tile_size.pmax
    for i in nl.affine_range((rows + pmax - 1) // pmax):
        size = min(pmax, rows - i * pmax)
        x = nl.load(a[nl.ds(i * pmax, size), :])
        y = nl.load(b[nl.ds(i * pmax, size), :])
        z = nl.ndarray((size, cols), a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(z, x, y, op=nl.add)
        nl.store(out[nl.ds(i * pmax, size), :], z)
    return out


def reference(a, b):
    return a + b


def main():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 512), dtype=np.float32)
    b = rng.standard_normal((300, 512), dtype=np.float32)
    out = tensor_add_kernel(a, b)
    print("max abs error vs NumPy:", float(np.abs(out - reference(a, b)).max()))
    print(nki.benchmark(tensor_add_kernel)(a, b).summary())


if __name__ == "__main__":
    main()
