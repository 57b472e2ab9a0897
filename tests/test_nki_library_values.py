"""Wrong values found by running nki-library's own tests in its simulation mode (issue #27,
scripts/nki_suite/library.py): the first instruction whose simulated result differed from AWS's
documented semantics, checked with small kernels written for this file against NumPy references.

- The free-axis reduction of nisa.activation / activation_reduce / tensor_scalar_reduce /
  tensor_tensor (reduce_res) runs over every value the instruction computes (AWS: "reduce along
  the free dimensions of the activated data"), not over what its destination's memory holds
  afterwards. nki-library's qkv_cte (RMS norm) writes the unneeded activation through a
  zero-step access pattern, `act.ap(pattern=[[1, n], [0, H]])`, so that all H values of a row land on
  one element; reading the reduction back from dst summed H copies of the last square.
"""

from __future__ import annotations

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(4127)


def _sum_of_squares_kernel(form):
    @nki.jit
    def kernel(x):
        n, h = x.shape
        out = nl.ndarray((n, 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        act = nl.ndarray((n, 1), x.dtype, buffer=nl.sbuf)  # one element per row: the values are not needed
        res = nl.ndarray((n, 1), nl.float32, buffer=nl.sbuf)
        sink = act.ap(pattern=[[1, n], [0, h]])  # zero step: every value of a row on one element
        if form == "activation_reduce":
            nisa.activation_reduce(dst=sink, op=nl.square, data=t, reduce_op=nl.add, reduce_res=res)
        elif form == "activation":
            nisa.activation(dst=sink, op=nl.square, data=t, reduce_op=nl.add, reduce_res=res,
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
        elif form == "tensor_scalar_reduce":
            nisa.tensor_scalar_reduce(dst=sink, data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.add,
                                      reduce_res=res)
        nl.store(out, res)
        return out
    return kernel


@pytest.mark.parametrize("shape", [(128, 512), (5, 96)])
@pytest.mark.parametrize("dtype", [np.float32, nl.bfloat16])
@pytest.mark.parametrize("form", ["activation_reduce", "activation", "tensor_scalar_reduce"])
def test_reduction_runs_over_every_computed_value_when_dst_has_a_zero_step(form, dtype, shape):
    x32 = RNG.standard_normal(shape).astype(np.float32)
    x = x32.astype(dtype)
    xf = x.astype(np.float32)
    got = np.asarray(_sum_of_squares_kernel(form)(x), np.float32)
    if form == "tensor_scalar_reduce":
        ref = (2.0 * xf).sum(axis=1, keepdims=True)
        atol = 1e-3 * np.abs(2.0 * xf).sum(axis=1, keepdims=True) + 1e-4
    else:
        ref = (xf * xf).sum(axis=1, keepdims=True)
        # the squares are cast to dst's dtype before the reduction: bf16 rounding, 2**-8 relative each
        atol = (2.0 ** -8 if dtype is not np.float32 else 1e-6) * ref + 1e-4
    assert got.shape == ref.shape
    np.testing.assert_array_less(np.abs(got - ref), atol)


def test_zero_step_dst_still_holds_the_last_value_of_each_row():
    # the destination keeps what its (aliased) element received last: the row's last square
    x = RNG.standard_normal((8, 32)).astype(np.float32)

    @nki.jit
    def kernel(x):
        n, h = x.shape
        out = nl.ndarray((n, 1), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        act = nl.ndarray((n, 1), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((n, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=act.ap(pattern=[[1, n], [0, h]]), op=nl.square, data=t, reduce_op=nl.add,
                               reduce_res=res)
        nl.store(out, act)
        return out

    np.testing.assert_allclose(kernel(x), x[:, -1:] ** 2, rtol=1e-6)


def test_scalar_tensor_tensor_reduce_runs_over_every_computed_value():
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    y = RNG.standard_normal((16, 64)).astype(np.float32)

    @nki.jit
    def kernel(x, y):
        n, h = x.shape
        out = nl.ndarray((n, 1), nl.float32, buffer=nl.shared_hbm)
        a, b = nl.load(x), nl.load(y)
        sink = nl.ndarray((n, 1), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((n, 1), nl.float32, buffer=nl.sbuf)
        # (x * 1.0) * y, reduced with add: the row-wise dot product of x and y
        nisa.scalar_tensor_tensor(dst=sink.ap(pattern=[[1, n], [0, h]]), data=a, op0=nl.multiply, operand0=1.0,
                                  op1=nl.multiply, operand1=b, reduce_op=nl.add, reduce_res=res)
        nl.store(out, res)
        return out

    np.testing.assert_allclose(kernel(x, y), (x * y).sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-5)
