"""Dropout's device kernels (csrc/Dropout.cpp): native_dropout and native_dropout_backward on
contiguous float32 compute PyTorch's products x * mask * scale without converting the boolean
mask first, and must give the CPU kernels' bits (NaN, inf, -0.0 included) from the same draw;
every other call (dtypes, layouts, inference, p at the ends) takes PyTorch's kernels. Also
attention's dropout helper, _C._dropout_mask_scale. (test_random.py: the masks against the
CPU's draws; test_attention.py: attention's dropout.)"""

from __future__ import annotations

import pytest
import torch

import seeds
import torch_neuronx
from torch_neuronx import _C

SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), -2.5, -0.0, 0.0, 3.0, -1e-40])


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so that NaNs and signed zeros compare too."""
    t = t.detach().cpu()
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]) if t.is_floating_point() else t


def _input(shape, dtype=torch.float32, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seeds.seed(seed)))
    flat = x.view(-1)
    n = min(flat.numel(), SPECIAL.numel())
    flat[:n] = SPECIAL[:n]
    return x.to(dtype)


def _dropout(x, p, train=True, seed=7):
    torch.manual_seed(seeds.seed(seed))
    return torch.native_dropout(x, p, train)


@pytest.mark.parametrize("shape", [(1,), (37,), (5, 129), (8, 64, 1024)])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.999])
def test_native_dropout_and_its_gradient_are_the_cpu_kernels_bits(shape, p):
    x = _input(shape)
    out, mask = _dropout(x.to("neuron"), p)
    want_out, want_mask = _dropout(x, p)
    assert mask.dtype == torch.bool and torch.equal(mask.cpu(), want_mask)
    assert torch.equal(_bits(out), _bits(want_out))
    grad = _input(shape, seed=1)
    scale = 1.0 / (1.0 - p)
    grad_on_device = grad.to("neuron")
    torch_neuronx.clear_op_tracking()
    got = torch.ops.aten.native_dropout_backward(grad_on_device, mask, scale)
    assert torch_neuronx.get_executed_ops() == {"aten::native_dropout_backward": 1}
    want = torch.ops.aten.native_dropout_backward(grad, want_mask, scale)
    assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_take_pytorchs_kernels(dtype):
    x = _input((9, 11), dtype)
    out, mask = _dropout(x.to("neuron"), 0.3)
    want_out, want_mask = _dropout(x, 0.3)
    assert torch.equal(mask.cpu(), want_mask)
    grad = _input((9, 11), dtype, seed=2)
    got = torch.ops.aten.native_dropout_backward(grad.to("neuron"), mask, 1 / 0.7)
    want = torch.ops.aten.native_dropout_backward(grad, want_mask, 1 / 0.7)
    if dtype == torch.float64:  # computed in float32 on the device (the fp64 rule)
        torch.testing.assert_close(out.cpu(), want_out, rtol=1.3e-6, atol=1e-5, equal_nan=True)
        torch.testing.assert_close(got.cpu(), want, rtol=1.3e-6, atol=1e-5, equal_nan=True)
    else:
        assert torch.equal(_bits(out), _bits(want_out)) and torch.equal(_bits(got), _bits(want))


def test_non_contiguous_inputs_inference_and_the_ends_of_p_take_pytorchs_kernels():
    x = _input((6, 10)).t()
    for p, train in ((0.4, True), (0.4, False), (0.0, True), (1.0, True)):
        out, mask = _dropout(x.to("neuron"), p, train)
        want_out, want_mask = _dropout(x, p, train)
        assert torch.equal(mask.cpu(), want_mask), (p, train)
        assert out.stride() == want_out.stride() and torch.equal(_bits(out), _bits(want_out)), (p, train)
    grad = _input((10, 6), seed=3)
    mask = _dropout(torch.ones(6, 10), 0.4)[1].t()
    got = torch.ops.aten.native_dropout_backward(grad.to("neuron"), mask.to("neuron"), 2.0)
    assert torch.equal(_bits(got), _bits(torch.ops.aten.native_dropout_backward(grad, mask, 2.0)))


def test_a_dropout_layer_trains_as_on_cpu():
    """nn.Dropout's forward and backward on the device (native_dropout and its gradient) against
    the CPU's native_dropout and its gradient: the same bits."""
    x = _input((4, 300), seed=4)
    results = {}
    for device in ("neuron", "cpu"):
        leaf = x.to(device).requires_grad_()
        torch.manual_seed(seeds.seed(11))
        out, mask = torch.native_dropout(leaf, 0.25, True)
        (out * torch.arange(300.0, device=device)).nansum().backward()
        results[device] = (_bits(out), _bits(leaf.grad))
    assert all(torch.equal(a, b) for a, b in zip(results["neuron"], results["cpu"]))


def test_the_host_helper_computes_the_formula():
    x = _input((3, 40), seed=5)
    mask = torch.rand(3, 40, generator=torch.Generator().manual_seed(seeds.seed(6))) > 0.3
    for scale in (1 / 0.7, 0.0, 2.0):
        assert torch.equal(_bits(_C._dropout_mask_scale(x, mask, scale)), _bits(x * mask * scale))
    # other dtypes and layouts: the formula itself
    half = x.half()
    assert torch.equal(_bits(_C._dropout_mask_scale(half, mask, 1.5)), _bits(half * mask * 1.5))
    assert torch.equal(_bits(_C._dropout_mask_scale(x.t(), mask.t(), 1.5)), _bits(x.t() * mask.t() * 1.5))
    with pytest.raises(RuntimeError, match="host tensors"):
        _C._dropout_mask_scale(x.to("neuron"), mask.to("neuron"), 1.0)
