"""GELU on the device (csrc/Gelu.cpp): gelu and gelu_backward on contiguous float32 tensors of fewer
than 16,384 elements run ATen's own GELU loops, not oneDNN's eltwise primitive that PyTorch's CPU
op hands contiguous float32 to (larger ones still take it: it is faster there). The reference for
bits is PyTorch's CPU op with oneDNN off (the same loops, in this process's ATen CPU capability;
below PyTorch's grain size they run on one thread); against the default CPU op (oneDNN's code for
this host) results agree within float32 tolerance (assert_close's rtol 1.3e-6, atol 1e-5)."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from test_concatenation import concatenation
from torch_neuronx import _C

DEV = "neuron"
SHAPES = [(1,), (16,), (1000,), (3, 5, 7), (16383,)]
LARGE = [(16384,), (2, 64, 1024)]  # oneDNN's, through the alias kernel


# ATen's loops are the device's on x86-64 only (csrc/Gelu.cpp); elsewhere the alias kernel serves GELU.
atens_loops = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="the device takes ATen's GELU loops on x86-64 only")


def _cpu_without_onednn(fn, *args, **kwargs):
    with torch.backends.mkldnn.flags(enabled=False):
        return fn(*args, **kwargs)


@pytest.fixture
def unqueued():
    """These tests hold the unqueued kernel to PyTorch's bits: the queue off (the suite may run with
    TORCH_NEURONX_ENABLE_CONCATENATION=1; queued calls are tests/test_concatenation_layers.py's)."""
    with concatenation(False):
        yield


def _values(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * 4


@atens_loops
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_and_its_gradient_are_atens_loops_bit_for_bit(shape, approximate, unqueued):
    x, grad = _values(shape), _values(shape, 1)
    got = F.gelu(x.to(DEV), approximate=approximate).cpu()
    assert torch.equal(got, _cpu_without_onednn(F.gelu, x, approximate=approximate))
    torch.testing.assert_close(got, F.gelu(x, approximate=approximate))
    got_grad = torch.ops.aten.gelu_backward(grad.to(DEV), x.to(DEV), approximate=approximate).cpu()
    expected = _cpu_without_onednn(lambda: torch.ops.aten.gelu_backward(grad, x, approximate=approximate))
    assert torch.equal(got_grad, expected)
    torch.testing.assert_close(got_grad, torch.ops.aten.gelu_backward(grad, x, approximate=approximate))


@pytest.mark.parametrize("shape", LARGE)
def test_large_tensors_keep_onednn_and_match_cpu(shape):
    x, grad = _values(shape), _values(shape, 1)
    torch.testing.assert_close(F.gelu(x.to(DEV)).cpu(), F.gelu(x))
    torch.testing.assert_close(torch.ops.aten.gelu_backward(grad.to(DEV), x.to(DEV)).cpu(),
                               torch.ops.aten.gelu_backward(grad, x))


@atens_loops
def test_special_values_as_on_cpu():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-30, -1e30, 9.0, -9.0])
    for approximate in ("none", "tanh"):
        got = F.gelu(x.to(DEV), approximate=approximate).cpu()
        expected = _cpu_without_onednn(F.gelu, x, approximate=approximate)
        assert torch.equal(got.isnan(), expected.isnan())
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected))
        assert torch.equal(got.signbit(), expected.signbit())


def test_other_dtypes_and_layouts_take_the_alias_kernel_and_match_cpu():
    x = _values((8, 6))
    for t in (x.t(), x[:, ::2], x.to(torch.bfloat16), x.to(torch.float16)):
        torch.testing.assert_close(F.gelu(t.to(DEV)).cpu(), F.gelu(t), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(F.gelu(x.double().to(DEV)).cpu(), F.gelu(x).double())  # the fp64 rule
    grad = _values((6, 8), 2)
    torch.testing.assert_close(
        torch.ops.aten.gelu_backward(grad.to(DEV), x.t().to(DEV)).cpu(), torch.ops.aten.gelu_backward(grad, x.t()))
    empty = torch.empty(0, 3)
    assert F.gelu(empty.to(DEV)).shape == (0, 3)


def test_errors_are_cpus():
    x = _values((4,))
    with pytest.raises(RuntimeError) as cpu:
        F.gelu(x, approximate="fast")
    with pytest.raises(RuntimeError) as dev:
        F.gelu(x.to(DEV), approximate="fast")
    assert str(dev.value) == str(cpu.value)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ops.aten.gelu_backward(x, x.to(DEV))


def test_training_through_gelu_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    device_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(DEV)
    device_model.load_state_dict(model.state_dict())
    x = _values((16, 32))
    model(x).square().mean().backward()
    device_model(x.to(DEV)).square().mean().backward()
    for p, q in zip(model.parameters(), device_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)


@atens_loops
def test_runs_as_one_device_op_after_queued_writes():
    torch_neuronx.ops.clear_op_tracking()
    was = _C._concatenation_enabled()
    torch_neuronx.ops.set_concatenation(True)
    try:
        x = _values((256,))
        y = x.to(DEV) * 2 + 1  # queued
        got = F.gelu(y).cpu()
    finally:
        torch_neuronx.ops.set_concatenation(was)
    # queued after them (tests/test_concatenation_layers.py): float32 rounding of ATen's loops
    torch.testing.assert_close(got, _cpu_without_onednn(F.gelu, x * 2 + 1))
    assert torch_neuronx.ops.get_executed_ops().get("aten::gelu") == 1
