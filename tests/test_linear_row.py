"""linear at batch 1 on the device (csrc/Gemv.cpp): one float32 row through a row-major
weight is summed in a fixed order, checked here bit for bit against that order written
in NumPy, on both builds of the loop and at 1 and 2 threads; against float64 within the
standard bound for a dot product of k terms; every other call (more rows, strided
weights, other dtypes, errors) takes the composite, as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import _C


def _documented_order(w: np.ndarray, x: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Gemv.cpp's sum in float32: 8 lanes (lane l adds column i = l mod 8 in order),
    ((0+1)+(2+3))+((4+5)+(6+7)), the tail columns in order, then the bias."""
    n, k = w.shape
    whole = k - k % 8
    lanes = np.zeros((n, 8), np.float32)
    for i in range(0, whole, 8):
        lanes = lanes + w[:, i:i + 8] * x[i:i + 8]
    s = ((lanes[:, 0] + lanes[:, 1]) + (lanes[:, 2] + lanes[:, 3])) + (
        (lanes[:, 4] + lanes[:, 5]) + (lanes[:, 6] + lanes[:, 7]))
    for i in range(whole, k):
        s = s + w[:, i] * x[i]
    return s + b if b is not None else s


SHAPES = [(256, 1024), (1024, 256), (7, 5), (9, 3), (33, 17), (1, 1), (4095, 33), (16, 1)]


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_one_row_is_the_documented_sum_bit_for_bit(k, n, bias):
    g = torch.Generator().manual_seed(k * 31 + n)
    w, x = torch.randn(n, k, generator=g), torch.randn(k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    expected = _documented_order(w.numpy(), x.numpy(), b.numpy() if bias else None)
    dev = lambda t: None if t is None else t.to("neuron")  # noqa: E731
    for shape in [(k,), (1, k), (1, 1, k)]:
        torch_neuronx.clear_op_tracking()
        y = F.linear(x.reshape(shape).to("neuron"), dev(w), dev(b))
        assert y.shape == (*shape[:-1], n) and y.is_contiguous()
        assert torch_neuronx.get_executed_ops().get("aten::linear") == 1
        assert np.array_equal(y.cpu().reshape(n).numpy().view(np.int32), expected.view(np.int32))


@pytest.mark.parametrize("k,n", [(256, 1024), (4095, 33), (512, 2048)])
def test_the_same_bits_on_both_builds_and_thread_counts(k, n):
    """(512, 2048): 4 MiB of weight, split over threads in 256 KiB tasks."""
    g = torch.Generator().manual_seed(5)
    w, x, b = (torch.randn(n, k, generator=g).to("neuron"), torch.randn(1, k, generator=g).to("neuron"),
               torch.randn(n, generator=g).to("neuron"))
    threads = torch.get_num_threads()
    results = []
    try:
        for any_cpu in (False, True):
            _C._any_cpu_loops(any_cpu)
            for count in (1, 2):
                torch.set_num_threads(count)
                results.append(F.linear(x, w, b).cpu())
    finally:
        _C._any_cpu_loops(False)
        torch.set_num_threads(threads)
    for r in results[1:]:
        assert torch.equal(r.view(torch.int32), results[0].view(torch.int32))


@pytest.mark.parametrize("k,n", SHAPES)
def test_within_the_dot_product_bound_of_float64(k, n):
    """|y - y64| <= gamma_k * sum |w||x| + |y| * 2^-24 with gamma_k = k u / (1 - k u), u = 2^-24;
    and close to the CPU's own float32 linear."""
    g = torch.Generator().manual_seed(k + n)
    w, x, b = torch.randn(n, k, generator=g) * 3, torch.randn(1, k, generator=g), torch.randn(n, generator=g)
    y = F.linear(x.to("neuron"), w.to("neuron"), b.to("neuron")).cpu().double()
    exact = F.linear(x.double(), w.double(), b.double())
    u = 2.0 ** -24
    gamma = (k + 1) * u / (1 - (k + 1) * u)
    bound = gamma * ((w.double().abs() * x.double().abs()).sum(1) + b.double().abs()) + exact.abs() * u
    assert ((y - exact).abs() <= bound).all()
    torch.testing.assert_close(y.float(), F.linear(x, w, b), rtol=1e-5, atol=1e-5 * max(1.0, k ** 0.5))


def test_special_values_propagate_as_on_cpu():
    w = torch.randn(6, 16)
    x = torch.randn(1, 16)
    x[0, 3], x[0, 9] = float("inf"), float("nan")
    w[2, :] = 0.0  # inf * 0 = nan, as on the CPU
    y = F.linear(x.to("neuron"), w.to("neuron")).cpu()
    ref = F.linear(x, w)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.equal(torch.isinf(y), torch.isinf(ref))


@pytest.mark.parametrize("case", ["two_rows", "strided_weight", "strided_input", "float64", "bfloat16",
                                  "empty_in"])
def test_other_calls_take_the_composite_and_match_cpu(case):
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(1, 12, generator=g), torch.randn(5, 12, generator=g), torch.randn(5, generator=g)
    if case == "two_rows":
        x = torch.randn(2, 12, generator=g)
    elif case == "strided_weight":
        w = torch.randn(12, 5, generator=g).t()
    elif case == "strided_input":
        x = torch.randn(1, 24, generator=g)[:, ::2]
    elif case in ("float64", "bfloat16"):
        dtype = getattr(torch, case)
        x, w, b = x.to(dtype), w.to(dtype), b.to(dtype)
    elif case == "empty_in":
        x, w = torch.randn(1, 0), torch.randn(5, 0)
    # float64 on the device: computed as float32 (the fp64 rule), returned as float64
    y = F.linear(x.to("neuron"), w.to("neuron"), b.to("neuron")).cpu()
    if case == "float64":
        assert y.dtype == torch.float64
        x, w, b, y = x.float(), w.float(), b.float(), y.float()
    ref = F.linear(x, w, b)
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if case == "bfloat16" else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(y, ref, **tol)


def test_errors_are_the_cpu_ones():
    x, w = torch.randn(1, 8), torch.randn(4, 8)
    with pytest.raises(RuntimeError) as cpu:
        F.linear(x, w, torch.randn(3))
    with pytest.raises(RuntimeError) as dev:
        F.linear(x.to("neuron"), w.to("neuron"), torch.randn(3).to("neuron"))
    assert str(dev.value) == str(cpu.value)
    with pytest.raises(RuntimeError, match="same device|Expected all tensors"):
        F.linear(x.to("neuron"), w)
    with pytest.raises(RuntimeError) as cpu:
        F.linear(torch.randn(1, 7), w)
    with pytest.raises(RuntimeError) as dev:
        F.linear(torch.randn(1, 7).to("neuron"), w.to("neuron"))
    assert str(dev.value) == str(cpu.value)


def test_training_at_batch_one_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
    dev = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).to("neuron")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(1, 64)
    cpu(x).square().sum().backward()
    dev(x.to("neuron")).square().sum().backward()
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5)


def test_queued_writes_are_read_first():
    """A one-row linear reads device bytes: the concatenation queue runs first, with the linear
    joining its launch (TorchNeuron's matmul-class ops end a fused sequence)."""
    was = _C._concatenation_enabled()
    torch_neuronx.ops.set_concatenation(True)
    try:
        x, w = torch.randn(1, 32).to("neuron"), torch.randn(16, 32).to("neuron")
        before = _C._concatenation_stats()[1]
        x2 = x * 2.0 + 1.0
        y = F.linear(x2, w)
        assert _C._concatenation_stats()[1] - before == 2  # the two ops queued, run with the linear
    finally:
        torch_neuronx.ops.set_concatenation(was)
    torch.testing.assert_close(y.cpu(), F.linear(x.cpu() * 2.0 + 1.0, w.cpu()), rtol=1e-5, atol=1e-5)
