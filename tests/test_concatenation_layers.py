"""Adaptive Eager Execution's queue for a layer's ops (csrc/Concatenation.h): native_layer_norm
over the last dims, gelu and gelu_backward (exact and tanh) and linear with one row of float32
(batch 1, csrc/Gemv.cpp's loop), which ends the queued sequence, joins its launch and is handed
to the device thread with it, so that the caller goes on while the product runs.

The reference is PyTorch's CPU op; the queue's layer norm takes its mean and variance in two passes
where PyTorch's kernel takes Welford's moments, and its GELU uses the device's exp and the
Abramowitz-Stegun erf PyTorch's vectorized kernel uses: compared at float32 rounding (assert_close's
float32 rtol 1.3e-6, atol 1e-5). The queued one-row linear is the unqueued one's loop: the same bits."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import _C

from test_concatenation import concatenation, executed_launches, queued_since, stats

DEV = "neuron"


@pytest.fixture
def queueing():
    with concatenation(True):
        yield


def _launches_since(before) -> int:
    _C._run_queued()
    return stats()[0] - before[0]


# ------------------------------------------------------------------------------- layer norm

@pytest.mark.parametrize("shape, normalized", [((1, 1024), (1024,)), ((4, 5, 8), (8,)), ((3, 6, 7), (6, 7)),
                                               ((33,), (33,)), ((2, 3, 1), (1,))])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm_is_queued_and_matches_cpu_with_its_mean_and_rstd(queueing, shape, normalized, affine):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g) * 3 + 1
    w = torch.randn(normalized, generator=g) if affine in ("both", "weight") else None
    b = torch.randn(normalized, generator=g) if affine in ("both", "bias") else None
    want = torch.ops.aten.native_layer_norm(x, list(normalized), w, b, 1e-5)
    on = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    before = stats()
    got = torch.ops.aten.native_layer_norm(x.to(DEV), list(normalized), on(w), on(b), 1e-5)
    assert queued_since(before) == 1
    for have, expected in zip(got, want):
        assert have.shape == expected.shape and have.dtype == expected.dtype and have.is_contiguous()
        torch.testing.assert_close(have.cpu(), expected)


def test_layer_norm_module_forward_and_backward_match_cpu(queueing):
    """nn.LayerNorm's forward queues; its backward (unqueued) reads the queued mean and rstd."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 48, generator=g)
    grads = []
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        ln = torch.nn.LayerNorm(48, eps=1e-3).to(dev)
        with torch.no_grad():
            ln.weight.mul_(1.5)
            ln.bias.add_(0.25)
        xd = x.to(dev).detach().requires_grad_()
        y = ln(xd)
        (y * y).sum().backward()
        grads.append([t.detach().cpu() for t in (y, xd.grad, ln.weight.grad, ln.bias.grad)])
    for have, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_rows_with_nan_infinity_or_constants_give_cpus_result(queueing):
    x = torch.tensor([[1.0, float("nan"), 2.0, 3.0], [1.0, float("inf"), 2.0, 3.0], [2.5, 2.5, 2.5, 2.5],
                      [0.0, 0.0, 0.0, 0.0]])
    want = torch.ops.aten.native_layer_norm(x, [4], None, None, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to(DEV), [4], None, None, 1e-5)
    for have, expected in zip(got, want):
        torch.testing.assert_close(have.cpu(), expected, equal_nan=True)


def test_layer_norm_calls_pytorch_refuses_raise_its_error(queueing):
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(RuntimeError, match="Given normalized_shape=\\[7\\]"):
        F.layer_norm(x, (7,))
    with pytest.raises(RuntimeError, match="Expected weight to be of same shape as normalized_shape"):
        F.layer_norm(x, (8,), torch.ones(7, device=DEV))


@pytest.mark.parametrize("case", ["float64", "bfloat16", "strided", "cpu weight", "large"])
def test_layer_norm_calls_the_queue_does_not_take_run_unqueued_and_match_cpu(queueing, case):
    x = torch.randn(4, 16)
    w = torch.randn(16)
    if case == "float64":
        x, w = x.double(), w.double()
    elif case == "bfloat16":
        x, w = x.bfloat16(), w.bfloat16()
    elif case == "large":
        x = torch.randn(2, 70000)
        w = torch.randn(70000)
    xd = x.to(DEV) if case != "strided" else x.t().contiguous().to(DEV).t()
    wd = w if case == "cpu weight" else w.to(DEV)
    want = None if case == "cpu weight" else F.layer_norm(x, w.shape, w)
    before = stats()
    if case == "cpu weight":
        with pytest.raises(RuntimeError):
            F.layer_norm(xd, w.shape, wd)
        return
    got = F.layer_norm(xd, w.shape, wd)
    assert queued_since(before) == 0
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5 if case != "bfloat16" else 1.6e-2, atol=1e-5)


# ------------------------------------------------------------------------------------- GELU

def _gelu_inputs():
    g = torch.Generator().manual_seed(5)
    specials = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-4, -1e-4, 5.0, -5.0, 9.0, -9.0, 20.0, -20.0, 100.0,
                             -100.0, 1e30, -1e30, float("inf"), float("-inf"), float("nan")])
    return torch.cat([torch.randn(1000, generator=g) * 4, torch.linspace(-12, 12, 2401), specials])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_is_queued_and_matches_cpu_including_special_values(queueing, approximate):
    x = _gelu_inputs()
    before = stats()
    got = F.gelu(x.to(DEV), approximate=approximate)
    assert queued_since(before) == 1
    want = F.gelu(x, approximate=approximate)
    # At the infinities PyTorch's CPU result depends on the instruction set (exact GELU of +inf: its
    # formula's inf in the scalar loop, NaN in the AVX-512 loop): held to the formula, in float64.
    infinite = x.isinf()
    want[infinite] = torch.tensor([_gelu_formula(v, approximate) for v in x[infinite].tolist()])
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)


def _gelu_formula(v: float, approximate: str) -> float:
    if approximate == "tanh":
        return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v * v * v)))
    return v * 0.5 * (1 + math.erf(v / math.sqrt(2)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradient_is_queued_and_matches_cpu(queueing, approximate):
    x = _gelu_inputs()[:-5]  # finite inputs: PyTorch's gradient at infinities is its formula's NaN
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(6))
    want = torch.ops.aten.gelu_backward(grad, x, approximate=approximate)
    before = stats()
    got = torch.ops.aten.gelu_backward(grad.to(DEV), x.to(DEV), approximate=approximate)
    assert queued_since(before) == 1
    torch.testing.assert_close(got.cpu(), want, rtol=1.3e-6, atol=2e-5)


def test_gelu_module_training_matches_cpu(queueing):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 32, generator=g)
    results = []
    for dev in ("cpu", DEV):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(approximate="tanh"),
                                    torch.nn.Linear(64, 32), torch.nn.GELU()).to(dev)
        y = model(x.to(dev))
        y.square().mean().backward()
        results.append([y.detach().cpu()] + [p.grad.cpu() for p in model.parameters()])
    for have, want in zip(results[1], results[0]):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)


def test_gelu_with_an_unknown_approximation_raises_pytorchs_error(queueing):
    with pytest.raises(RuntimeError, match="approximate argument must be either none or tanh"):
        F.gelu(torch.randn(4, device=DEV), approximate="fast")


def test_the_devices_gelu_stays_within_its_measured_distance_of_the_exact_result():
    """GELU's erf (csrc/FloatMath.h: Abramowitz and Stegun's 7.1.26, 1.5e-7 published for the
    formula) computed in float32: its error near 1 - t P(t) e^(-x^2) is about 5e-7 (5.04e-7
    measured over this grid; PyTorch's CPU kernel on this AMD EPYC 4.55e-7), times |x| / 2 in
    gelu(x) = x/2 (1 + erf(x / sqrt 2)), plus a few float32 roundings of the result."""
    x = torch.linspace(-6, 6, 120001)
    with concatenation(True):
        got = F.gelu(x.to(DEV)).cpu().double()
    exact = x.double() * 0.5 * (1 + torch.special.erf(x.double() / math.sqrt(2)))
    bound = (x.double().abs() / 2) * 6e-7 + exact.abs() * 4 * 2.0 ** -24
    assert bool(((got - exact).abs() <= bound).all())


# ------------------------------------------------------------------------ one-row linear

def _mlp(dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.LayerNorm(1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 256)).to(dev)


def test_a_batch_one_mlp_queues_whole_and_gives_the_unqueued_bits(queueing):
    """Linear, LayerNorm, GELU, Linear at batch 1: every op queues; the first linear is a launch of
    its own, the second ends the layer norm and GELU's sequence; the linears are the unqueued loop
    (the same bits), the rest within float32 rounding of the unqueued kernels (ATen's)."""
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(8))
    model = _mlp(DEV)
    xd = x.to(DEV)
    with torch.no_grad(), concatenation(False):
        unqueued = model(xd).cpu()
        first = model[0](xd).cpu()
    _C._run_queued()
    torch_neuronx.clear_op_tracking()
    before = stats()
    with torch.no_grad():
        got = model(xd)
        got_first = model[0](xd)
    assert torch.equal(got_first.cpu(), first)
    torch.testing.assert_close(got.cpu(), unqueued)
    torch.testing.assert_close(got.cpu(), _mlp("cpu")(x).detach())
    assert executed_launches() == {"aten::native_layer_norm|aten::gelu|aten::linear": 1}
    assert stats()[1] - before[1] == 2  # the layer norm and GELU; the linears end their launches


def test_a_queued_linear_reads_its_weight_as_it_was_when_called(queueing):
    g = torch.Generator().manual_seed(9)
    x, w, b = torch.randn(64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    xd, wd, bd = x.to(DEV), w.to(DEV), b.to(DEV)
    y = F.linear(xd, wd, bd)
    wd.add_(1.0)  # queued after it
    bd.zero_()
    xd.mul_(2.0)
    y2 = F.linear(xd, wd, bd)
    with concatenation(False):
        want = F.linear(x.to(DEV), w.to(DEV), b.to(DEV)).cpu()
        want2 = F.linear((x * 2).to(DEV), (w + 1).to(DEV), torch.zeros(32, device=DEV)).cpu()
    assert torch.equal(y.cpu(), want) and torch.equal(y2.cpu(), want2)


def test_a_queued_linear_runs_on_the_device_thread_and_every_read_waits_for_it(queueing):
    w = torch.randn(512, 512, device=DEV)
    x = torch.randn(512, device=DEV)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a weight of 1 MiB would split across 2 intra-op threads (run now)
    try:
        before = _C._concatenation_stats()[3]
        ys = [F.linear(x, w) for _ in range(8)]
        want = w.cpu() @ x.cpu()
        for y in ys:
            torch.testing.assert_close(y.cpu(), want, rtol=1e-5, atol=1e-4)
        assert _C._concatenation_stats()[3] - before == 8
    finally:
        torch.set_num_threads(threads)


def test_linear_over_1_mib_that_would_split_across_threads_or_deterministic_is_not_queued(queueing):
    """Up to 1 MiB of weight a product the intra-op threads would split is queued and computed by the
    device thread alone (overlapping the caller's Python); above, it is split at the call."""
    w, x = torch.randn(1024, 512, device=DEV), torch.randn(1, 512, device=DEV)
    small = torch.randn(512, 512, device=DEV)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _C._concatenation_stats()[3]
        y = F.linear(x, w)
        assert _C._concatenation_stats()[3] == before  # 2 MiB split across the intra-op threads: run now
        y_small = F.linear(x, small)
        torch.neuron.synchronize()
        assert _C._concatenation_stats()[3] == before + 1  # 1 MiB: the device thread's
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(y_small.cpu(), x.cpu() @ small.cpu().t(), rtol=1e-5, atol=1e-4)
    torch.use_deterministic_algorithms(True)
    try:
        before = _C._concatenation_stats()[3]
        y2 = F.linear(x, w)
        assert _C._concatenation_stats()[3] == before
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(y.cpu(), y2.cpu())


def test_synchronous_launches_give_the_same_bits(queueing):
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(10))
    model, xd = _mlp(DEV), x.to(DEV)
    with torch.no_grad():
        asynchronous = model(xd).cpu()
        _C._concatenation_async(False)
        try:
            synchronous = model(xd).cpu()
        finally:
            _C._concatenation_async(True)
    assert torch.equal(asynchronous, synchronous)


def test_the_layer_ops_loops_for_any_cpu_give_the_same_bits(queueing):
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(11)) * 3
    model, xd = _mlp(DEV), x.to(DEV)

    def run():
        with torch.no_grad():
            outs = [model(xd[i:i + 1]) for i in range(3)]
            outs += list(torch.ops.aten.native_layer_norm(xd, [256], None, None, 1e-5))
            outs += [F.gelu(xd, approximate="tanh"), torch.ops.aten.gelu_backward(xd, xd * 0.5),
                     torch.ops.aten.gelu_backward(xd, xd * 0.5, approximate="tanh")]
        return [t.cpu() for t in outs]

    fast = run()
    _C._any_cpu_loops(True)
    try:
        portable = run()
    finally:
        _C._any_cpu_loops(False)
    for a, b in zip(fast, portable):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


# ------------------------------------------------- sums over the last dim, one value per row

@pytest.mark.parametrize("shape", [(300,), (4, 5, 300), (2, 1), (3, 4096)])
@pytest.mark.parametrize("keepdim", [True, False])
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sum_and_mean_over_the_last_dim_are_queued_and_match_cpu(queueing, shape, keepdim, name):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(12)) * 3 + 0.5
    fn = getattr(torch, name)
    for dim in (-1, len(shape) - 1):
        before = stats()
        got = fn(x.to(DEV), dim, keepdim=keepdim)
        assert queued_since(before) == 1
        want = fn(x, dim, keepdim=keepdim)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sums_of_rows_with_nan_infinity_or_beyond_float32_range_give_cpus_result(queueing, name):
    x = torch.tensor([[1.0, float("nan"), 2.0], [1.0, float("inf"), 2.0], [float("inf"), float("-inf"), 0.0],
                      [3e38, 3e38, 0.0], [-3e38, -3e38, 1.0]])
    fn = getattr(torch, name)
    torch.testing.assert_close(fn(x.to(DEV), -1).cpu(), fn(x, -1), equal_nan=True)


@pytest.mark.parametrize("call", [
    lambda x: x.sum(0), lambda x: x.sum(), lambda x: x.mean((0, 1)), lambda x: x.sum(-1, dtype=torch.float64),
    lambda x: x.double().sum(-1), lambda x: x.bfloat16().mean(-1), lambda x: x.t().sum(-1)])
def test_other_reductions_run_unqueued_and_match_cpu(queueing, call):
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(13))
    xd = x.to(DEV)
    _C._run_queued()
    before = stats()
    got = call(xd)
    assert queued_since(before) == 0
    want = call(x)
    torch.testing.assert_close(got.cpu(), want, rtol=1.6e-2 if want.dtype == torch.bfloat16 else 1e-5,
                               atol=1e-5, check_dtype=True)


def test_a_reduction_over_a_dim_out_of_range_raises_pytorchs_error(queueing):
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.randn(3, 4, device=DEV).sum(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_an_operand_with_one_value_per_row_is_queued_bit_for_bit(queueing, op, dtype):
    """[B, S, H] <op> [B, S, 1] (and the column first, out of place; in place on the full tensor):
    PyTorch computes one IEEE operation per element, so the bits are CPU's."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(2, 3, 40, generator=g).to(dtype)
    r = (torch.rand(2, 3, 1, generator=g) + 0.5).to(dtype)
    fn = getattr(torch, op)
    calls = [lambda a, b: fn(a, b), lambda a, b: fn(b, a), lambda a, b: getattr(a.clone(), op + "_")(b)]
    for call in calls:
        before = stats()
        got = call(x.to(DEV), r.to(DEV))
        assert queued_since(before) >= 1
        assert torch.equal(got.cpu(), call(x, r))


def test_an_operand_with_one_value_per_row_reads_the_value_written_before_it(queueing):
    x, r = torch.randn(4, 16), torch.randn(4, 1)
    xd, rd = x.to(DEV), r.to(DEV)
    y = xd * rd
    rd.mul_(2)  # queued after it
    z = xd * rd
    assert torch.equal(y.cpu(), x * r) and torch.equal(z.cpu(), x * (r * 2))


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_above_the_grain_size_split_across_threads_bit_for_bit(queueing, threads):
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(15))
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        xd = x.to(DEV)
        got = [xd * xd.mean(-1, keepdim=True), xd.sum(-1), xd / xd.sum(-1, keepdim=True)]
        got = [t.cpu() for t in got]
    finally:
        torch.set_num_threads(was)
    with concatenation(True):
        xd = x.to(DEV)
        one = [t.cpu() for t in (xd * xd.mean(-1, keepdim=True), xd.sum(-1), xd / xd.sum(-1, keepdim=True))]
    for a, b in zip(got, one):
        assert torch.equal(a, b)
    torch.testing.assert_close(got[0], x * x.mean(-1, keepdim=True))


def _rms_norm(x, w, eps=1e-6):
    """Llama's RMSNorm (transformers' LlamaRMSNorm.forward, float32)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def test_rms_norm_runs_as_one_launch_and_matches_cpu(queueing):
    g = torch.Generator().manual_seed(16)
    x, w = torch.randn(2, 5, 64, generator=g), torch.randn(64, generator=g)
    _C._run_queued()
    before = stats()
    got = _rms_norm(x.to(DEV), w.to(DEV))
    assert _launches_since(before) == 1 and stats()[1] - before[1] == 6
    torch.testing.assert_close(got.cpu(), _rms_norm(x, w))


def test_llama_decoding_step_queues_its_norms_and_projections(queueing):
    """A tiny Llama's forward at batch 1, one token: its RMSNorms, one-row projections and SiLU
    gate queue; its logits are CPU's within float32 rounding."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.tensor([[5]])
    with torch.no_grad():
        want = model(ids).logits
        device_model = model.to(DEV)
        before = stats()
        got = device_model(ids.to(DEV)).logits.cpu()
    assert stats()[1] - before[1] >= 2 * (2 * 6 + 2) + 6  # per layer two RMSNorms' 6 ops and silu * up
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
