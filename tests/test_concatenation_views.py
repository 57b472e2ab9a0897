"""Adaptive Eager Execution's queue (csrc/Concatenation.h), December 2026 additions: the .Scalar
overloads of add/sub/mul/div (what autograd's formulas and C++ code call), and strided operands.

The reference is the same call on CPU tensors. The Scalar overloads are PyTorch's .Tensor overloads
with the number wrapped in a CPU tensor, and the queue computes them as it computes those: bit for
bit where PyTorch computes one IEEE operation per element (mul, div, add/sub with alpha 1), at
float32 rounding (assert_close's float32 tolerances) for add/sub with another alpha (PyTorch's
fused multiply-add depends on the instruction set)."""

from __future__ import annotations

import pytest
import torch

from test_concatenation import concatenation, queued_since, stats

DEV = "neuron"


@pytest.fixture
def queueing():
    with concatenation(True):
        yield


# ------------------------------------------------------------------------- .Scalar overloads

SCALAR_CALLS = [
    ("mul", 2.0, {}), ("mul", -0.5, {}), ("mul", 3, {}), ("mul", 1e39, {}), ("div", 64, {}), ("div", 0.0, {}),
    ("div", -3.7, {}), ("add", 1e-6, {}), ("add", 3, {}), ("sub", 0.25, {}), ("add", 3, {"alpha": 0.5}),
    ("sub", 1.5, {"alpha": -2}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, number, kwargs", SCALAR_CALLS, ids=str)
def test_scalar_overloads_are_queued_and_match_cpu(queueing, dtype, name, number, kwargs):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 5, 7, generator=g) * 4).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    out_of_place = getattr(torch.ops.aten, name).Scalar
    in_place = getattr(torch.ops.aten, name + "_").Scalar
    want, want_inplace = out_of_place(x, number, **kwargs), in_place(x.clone(), number, **kwargs)
    before = stats()
    got, got_inplace = out_of_place(x.to(DEV), number, **kwargs), in_place(x.to(DEV), number, **kwargs)
    # bfloat16 add/sub with an alpha other than 1 run unqueued (as the .Tensor overloads do)
    queued = 0 if dtype == torch.bfloat16 and kwargs.get("alpha", 1) != 1 else 2
    assert queued_since(before) == queued
    for have, expected in ((got, want), (got_inplace, want_inplace)):
        assert have.dtype == expected.dtype and have.shape == expected.shape
        if kwargs.get("alpha", 1) != 1:
            torch.testing.assert_close(have.cpu(), expected, equal_nan=True)
        else:
            assert torch.equal(have.cpu().isnan(), expected.isnan())
            assert torch.equal(have.cpu().nan_to_num(), expected.nan_to_num())


def test_scalar_overloads_with_a_boolean_or_float64_run_unqueued_and_match_cpu(queueing):
    x = torch.randn(4, 6)
    before = stats()
    got = [torch.ops.aten.mul.Scalar(x.to(DEV), True), torch.ops.aten.add.Scalar(x.to(DEV), False)]
    assert queued_since(before) == 0
    assert torch.equal(got[0].cpu(), torch.ops.aten.mul.Scalar(x, True))
    assert torch.equal(got[1].cpu(), torch.ops.aten.add.Scalar(x, False))
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        torch.ops.aten.add.Scalar(x.to(DEV), 1.0, alpha=1e300)


def test_backward_formulas_that_scale_by_a_number_queue_and_match_cpu(queueing):
    """pow's and mean's gradients (mul.Scalar, div.Scalar from autograd's C++ formulas)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 16, generator=g)
    xd = x.to(DEV).requires_grad_()
    xc = x.clone().requires_grad_()
    for t in (xd, xc):
        (t.pow(2) * 0.5 + t.pow(3)).sum(-1).backward(torch.ones(4, device=t.device))
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
