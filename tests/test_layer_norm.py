"""LayerNorm on the device (csrc/LayerNorm.cpp): native_layer_norm and native_layer_norm_backward call
PyTorch's CPU kernels directly on host aliases (no generic alias path), so results are the CPU op's
bits; calls with an operand elsewhere, a float64 operand under the fp64 rule or an empty input take
the alias path as before (its errors, its rounding)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from test_concatenation import concatenation

DEV = "neuron"
CASES = [((1, 1024), (1024,)), ((4, 7, 33), (33,)), ((2, 3, 5, 6), (5, 6)), ((8, 64), (64,)), ((3, 1), (1,))]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def unqueued():
    """These tests hold the unqueued kernel to PyTorch's bits: the queue off (the suite may run with
    TORCH_NEURONX_ENABLE_CONCATENATION=1; queued calls are tests/test_concatenation_layers.py's)."""
    with concatenation(False):
        yield


def _values(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3 + 1).to(dtype)


def _on(t):
    return None if t is None else t.to(DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,normalized", CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_forward_and_backward_are_the_cpu_kernels_bits(shape, normalized, dtype, affine, unqueued):
    x, grad = _values(shape, dtype), _values(shape, dtype, 1)
    w = _values(normalized, dtype, 2) if affine != "none" else None
    b = _values(normalized, dtype, 3) if affine == "both" else None
    expected = torch.ops.aten.native_layer_norm(x, list(normalized), w, b, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to(DEV), list(normalized), _on(w), _on(b), 1e-5)
    for g, e in zip(got, expected):
        assert g.device.type == DEV and g.shape == e.shape and g.dtype == e.dtype
        assert torch.equal(g.cpu(), e)
    _, mean, rstd = expected
    for mask in itertools.product([True, False], repeat=3):
        mask = list(mask)  # a gradient only for a parameter given (PyTorch's CPU op fails otherwise)
        mask[1] = mask[1] and w is not None
        mask[2] = mask[2] and b is not None
        want = torch.ops.aten.native_layer_norm_backward(grad, x, list(normalized), mean, rstd, w, b, mask)
        have = torch.ops.aten.native_layer_norm_backward(grad.to(DEV), x.to(DEV), list(normalized), mean.to(DEV),
                                                         rstd.to(DEV), _on(w), _on(b), mask)
        for h, e in zip(have, want):
            assert (h is None) == (e is None)
            if e is not None:
                assert h.device.type == DEV and torch.equal(h.cpu(), e)


def test_a_16_bit_input_with_float32_parameters_is_the_cpu_kernels_mixed_type_path(unqueued):
    x = _values((4, 32), torch.bfloat16)
    w, b = _values((32,), seed=2), _values((32,), seed=3)
    expected = F.layer_norm(x, (32,), w, b)
    got = F.layer_norm(x.to(DEV), (32,), w.to(DEV), b.to(DEV))
    assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected)


def test_strided_inputs_match_cpu_bit_for_bit(unqueued):
    x = _values((16, 8))
    for t in (x.t(), x[::2], x.t()[:, 1::2]):
        n = t.shape[-1]
        w = _values((n,), seed=4)
        assert torch.equal(F.layer_norm(t.to(DEV), (n,), w.to(DEV)).cpu(), F.layer_norm(t, (n,), w))


def test_float64_follows_the_fp64_rule_and_empty_inputs_keep_their_shapes():
    x = _values((4, 16)).double()
    got = F.layer_norm(x.to(DEV), (16,))
    assert got.dtype == torch.float64
    assert torch.equal(got.cpu(), F.layer_norm(x.float(), (16,)).double())  # computed in float32
    y, mean, rstd = torch.ops.aten.native_layer_norm(torch.empty(0, 8).to(DEV), [8], None, None, 1e-5)
    assert (y.shape, mean.shape, rstd.shape) == ((0, 8), (0, 1), (0, 1))
    assert y.device.type == mean.device.type == DEV


def test_errors_are_cpus_and_a_cpu_weight_is_a_device_mismatch():
    x = _values((4, 8))
    for args in [((7,),), ((8,), _values((8,)), _values((7,)))]:
        with pytest.raises(RuntimeError) as cpu:
            F.layer_norm(x, *args)
        with pytest.raises(RuntimeError) as dev:
            F.layer_norm(x.to(DEV), args[0], *[_on(t) for t in args[1:]])
        assert str(dev.value) == str(cpu.value)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        F.layer_norm(x.to(DEV), (8,), _values((8,)))


def test_sees_queued_writes_and_is_one_device_op():
    torch_neuronx.ops.clear_op_tracking()
    was = torch_neuronx._C._concatenation_enabled()
    torch_neuronx.ops.set_concatenation(True)
    try:
        x = _values((2, 256))
        got = F.layer_norm(x.to(DEV) * 2 + 1, (256,)).cpu()  # the mul and add are queued
    finally:
        torch_neuronx.ops.set_concatenation(was)
    # queued after them (tests/test_concatenation_layers.py): float32 rounding of the CPU kernel
    torch.testing.assert_close(got, F.layer_norm(x * 2 + 1, (256,)))
    assert torch_neuronx.ops.get_executed_ops().get("aten::native_layer_norm") == 1


def test_training_through_layer_norm_matches_cpu():
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                                   torch.nn.Linear(32, 4), torch.nn.LayerNorm(4, elementwise_affine=False))
    model, device_model = make(), make().to(DEV)
    device_model.load_state_dict(model.state_dict())
    x = _values((8, 16))
    model(x).square().mean().backward()
    device_model(x.to(DEV)).square().mean().backward()
    for p, q in zip(model.parameters(), device_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)
