"""Kernels a model family needs that PyTorch's CPU build lacks or that fell back:
SyncBatchNorm's five kernels and linear_backward (torch_neuronx/ops/sync_batch_norm.py,
ops/linear.py: CUDA-only ops, written with ATen ops) and the CTC loss (its CPU
kernel on device memory; the backward also lowered, lowering/ctc.py).

Each op is checked on the device against CPU PyTorch: the batch-norm kernels,
which have no CPU kernel, against what they compute together (var_mean,
native_batch_norm and its backward on CPU), and with no CPU fallback. Tolerances:
float32 rtol = atol = 1e-5 (reductions reorder sums); bfloat16 outputs one bf16
ulp (rtol 8e-3, atol 1e-2), their float32 statistics 1e-5 against the bf16 values.
Compiled (torch.compile(backend="neuron"), through the decompositions) matches eager.
Multi-rank nn.SyncBatchNorm training: tests/test_distributed.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx.ops import sync_batch_norm

DEVICE = "neuron"
FP32 = dict(rtol=1e-5, atol=1e-5)
BF16 = dict(rtol=8e-3, atol=1e-2)
SHAPES = [(6, 3), (4, 3, 5), (2, 4, 3, 5), (2, 3, 2, 3, 4)]
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-5


def _x(*shape, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator) * 2 + 0.5).to(dtype)


def _dims(x):
    return [0, *range(2, x.dim())]


@pytest.fixture(autouse=True)
def _no_fallback():
    torch_neuronx.clear_op_tracking()
    yield
    assert torch_neuronx.get_fallback_ops() == {}


def _ran(*names):
    executed = torch_neuronx.get_executed_ops()
    for name in names:
        assert executed.get(f"aten::{name}", 0) > 0, (name, sorted(executed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_stats_and_elemt_match_cpu_batch_norm(shape, dtype):
    x = _x(*shape, dtype=dtype)
    weight, bias = _x(shape[1], seed=1), _x(shape[1], seed=2)
    mean, invstd = torch.batch_norm_stats(x.to(DEVICE), EPS)
    var, want_mean = torch.var_mean(x.double(), _dims(x), correction=0)
    assert mean.dtype == invstd.dtype == torch.float32  # CUDA's accumulate type, for bf16 too
    torch.testing.assert_close(mean.cpu().double(), want_mean, **FP32)
    torch.testing.assert_close(invstd.cpu().double(), (var + EPS).rsqrt(), **FP32)
    y = torch.batch_norm_elemt(x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), mean, invstd, EPS)
    want = torch.native_batch_norm(x.float(), weight, bias, None, None, True, 0.0, EPS)[0].to(dtype)
    assert y.dtype == dtype
    torch.testing.assert_close(y.cpu(), want, **(FP32 if dtype == torch.float32 else BF16))
    _ran("batch_norm_stats", "batch_norm_elemt")


def test_stats_with_zero_variance_and_zero_eps_give_zero_invstd():
    """CUDA's InvStd: 1 / sqrt(var + eps), but 0 where both are 0."""
    mean, invstd = torch.batch_norm_stats(torch.ones(4, 2, 3, device=DEVICE), 0.0)
    assert torch.equal(invstd.cpu(), torch.zeros(2)) and torch.equal(mean.cpu(), torch.ones(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES[1:])
def test_backward_reduce_and_elemt_match_cpu_batch_norm_backward(shape, dtype):
    """One rank: count holds the whole batch, so the two kernels are batch norm's backward."""
    x, grad = _x(*shape, dtype=dtype), _x(*shape, seed=3, dtype=dtype)
    weight = _x(shape[1], seed=1)
    mean, invstd = torch.batch_norm_stats(x.to(DEVICE), EPS)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
        grad.to(DEVICE), x.to(DEVICE), mean, invstd, weight.to(DEVICE), True, True, True)
    count = torch.tensor([x.numel() // shape[1]], dtype=torch.int32, device=DEVICE)
    grad_input = torch.batch_norm_backward_elemt(grad.to(DEVICE), x.to(DEVICE), mean, invstd, weight.to(DEVICE),
                                                 sum_dy, sum_dy_xmu, count)
    want = torch.ops.aten.native_batch_norm_backward(grad.float(), x.float(), weight, None, None, mean.cpu(),
                                                     invstd.cpu(), True, EPS, [True, True, True])
    assert grad_input.dtype == dtype and sum_dy.dtype == torch.float32 and grad_weight.dtype == torch.float32
    torch.testing.assert_close(grad_input.cpu(), want[0].to(dtype), **(FP32 if dtype == torch.float32 else BF16))
    scale = grad.float().abs().sum().item() / shape[1]  # sums of that many terms: tolerance per term
    torch.testing.assert_close(grad_weight.cpu(), want[1], rtol=1e-5, atol=1e-6 * scale)
    torch.testing.assert_close(grad_bias.cpu(), want[2], rtol=1e-5, atol=1e-6 * scale)
    torch.testing.assert_close(sum_dy.cpu(), grad.float().sum(_dims(x)), rtol=1e-5, atol=1e-6 * scale)
    _ran("batch_norm_backward_reduce", "batch_norm_backward_elemt")


def test_backward_reduce_returns_all_four_whatever_the_flags_as_torchneuron():
    x = _x(4, 3, 5).to(DEVICE)
    mean, invstd = torch.batch_norm_stats(x, EPS)
    full = torch.batch_norm_backward_reduce(x, x, mean, invstd, None, True, True, True)
    for flags in ((False, False, False), (True, False, True), (False, True, False)):
        out = torch.batch_norm_backward_reduce(x, x, mean, invstd, None, *flags)
        assert [t.shape for t in out] == [(3,)] * 4
        for got, want in zip(out, full):
            torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0)


@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int64])
def test_backward_elemt_takes_integer_counts_and_refuses_others(count_dtype):
    x = _x(4, 3, 5).to(DEVICE)
    mean, invstd = torch.batch_norm_stats(x, EPS)
    sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(x, x, mean, invstd, None, True, True, True)
    want = torch.batch_norm_backward_elemt(x, x, mean, invstd, None, sum_dy, sum_dy_xmu,
                                           torch.tensor([20], dtype=torch.int32, device=DEVICE))
    got = torch.batch_norm_backward_elemt(x, x, mean, invstd, None, sum_dy, sum_dy_xmu,
                                          torch.tensor([20], dtype=count_dtype, device=DEVICE))
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="expected count to be an integer tensor"):
        torch.batch_norm_backward_elemt(x, x, mean, invstd, None, mean, mean, torch.tensor([20.0], device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_stats_with_counts_is_the_whole_batch(dtype):
    """Three "ranks" with 2, 5 and 0 samples: the combined statistics are those of the 7 samples,
    and the running statistics move towards them with the unbiased variance (CUDA)."""
    x = _x(7, 3, 4, 2, dtype=dtype)
    shards = [x[:2], x[2:], x[:0]]
    stats = [torch.batch_norm_stats(s.to(DEVICE), EPS) if s.numel() else
             (torch.zeros(3, device=DEVICE), torch.ones(3, device=DEVICE)) for s in shards]
    counts = torch.tensor([s.numel() // 3 for s in shards], dtype=dtype, device=DEVICE)
    running_mean = torch.full((3,), 0.5, dtype=dtype, device=DEVICE)
    running_var = torch.full((3,), 2.0, dtype=dtype, device=DEVICE)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x.to(DEVICE), torch.stack([m for m, _ in stats]), torch.stack([s for _, s in stats]),
        running_mean, running_var, 0.1, EPS, counts)
    var, want_mean = torch.var_mean(x.double(), _dims(x), correction=0)
    torch.testing.assert_close(mean.cpu().double(), want_mean, **FP32)
    torch.testing.assert_close(invstd.cpu().double(), (var + EPS).rsqrt(), rtol=1e-4, atol=1e-5)
    unbiased = torch.var(x.double(), _dims(x))
    tolerance = FP32 if dtype == torch.float32 else BF16
    torch.testing.assert_close(running_mean.cpu(), (0.9 * 0.5 + 0.1 * want_mean).to(dtype), **tolerance)
    torch.testing.assert_close(running_var.cpu(), (0.9 * 2.0 + 0.1 * unbiased).to(dtype), **tolerance)
    _ran("batch_norm_gather_stats_with_counts")


@pytest.mark.parametrize("mask", [[True, True, True], [False, True, False], [True, False, True]])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_backward_matches_autograd_on_cpu(mask, dtype):
    x, weight, grad = _x(2, 3, 4, dtype=dtype), _x(5, 4, seed=1, dtype=dtype), _x(2, 3, 5, seed=2, dtype=dtype)
    got = torch.ops.aten.linear_backward(x.to(DEVICE), grad.to(DEVICE), weight.to(DEVICE), mask)
    leaves = [t.float().requires_grad_() for t in (x, weight, _x(5, seed=3))]
    want = torch.autograd.grad(F.linear(*leaves), leaves, grad.float())
    for flag, have, expected in zip(mask, got, want):
        if not flag:
            assert have is None
            continue
        assert have.dtype == dtype
        torch.testing.assert_close(have.cpu(), expected.to(dtype), **(FP32 if dtype == torch.float32 else BF16))
    _ran("linear_backward")


def _sync_bn_step(x, grad, weight, bias, running_mean, running_var, counts):
    """SyncBatchNorm's forward and backward on one rank, with a second rank's statistics."""
    mean, invstd = torch.batch_norm_stats(x, EPS)
    gathered = torch.batch_norm_gather_stats_with_counts(x, torch.stack([mean, mean * 0.5]),
                                                         torch.stack([invstd, invstd * 2]), running_mean,
                                                         running_var, 0.1, EPS, counts)
    y = torch.batch_norm_elemt(x, weight, bias, *gathered, EPS)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(grad, x, *gathered, weight,
                                                                                  True, True, True)
    count = counts.to(torch.int32)
    grad_input = torch.batch_norm_backward_elemt(grad, x, *gathered, weight, sum_dy, sum_dy_xmu, count)
    linear = torch.ops.aten.linear_backward(x.flatten(2), grad.flatten(2)[..., :4], grad.new_ones(4, 20),
                                            [True, True, True])
    return y, grad_input, grad_weight, grad_bias, linear


@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_matches_eager(dtype, fresh_dynamo):
    """One graph holding all six ops: the compiler's decompositions (the eager kernels' ATen ops)
    give the eager results, running statistics included (copy_ into graph inputs)."""
    args = [_x(2, 3, 4, 5, dtype=dtype), _x(2, 3, 4, 5, seed=1, dtype=dtype), _x(3, seed=2), _x(3, seed=3),
            torch.zeros(3), torch.ones(3), torch.tensor([40.0, 40.0])]
    eager_args = [a.to(DEVICE) for a in args]
    compiled_args = [a.to(DEVICE) for a in args]
    want = _sync_bn_step(*eager_args)
    got = torch.compile(_sync_bn_step, backend="neuron", fullgraph=True)(*compiled_args)
    tolerance = FP32 if dtype == torch.float32 else BF16
    for have, expected in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        assert have.dtype == expected.dtype
        torch.testing.assert_close(have.cpu(), expected.cpu(), **tolerance)
    for have, expected in zip(compiled_args[4:6], eager_args[4:6]):  # the running statistics
        torch.testing.assert_close(have.cpu(), expected.cpu(), **FP32)
    assert not torch.equal(compiled_args[4].cpu(), args[4])
    assert torch_neuronx.get_dynamo_metrics()["graph_breaks"] == 0


def test_the_decompositions_are_the_eager_kernels():
    from torch_neuronx.compiler import decomposition_table

    table = decomposition_table()
    for name, kernel in sync_batch_norm.META_KERNELS.items():
        assert table[getattr(torch.ops.aten, name).default] is kernel


# ------------------------------------------------------------------------ CTC loss
def _ctc_batch(impossible: bool):
    """Log-probabilities [T=12, B=4, C=6], padded targets, and lengths; with `impossible`, the last
    sequence's 3 repeated labels get 4 steps where they need 5 (an infinite loss)."""
    logits = _x(12, 4, 6, seed=5)
    targets = torch.tensor([[1, 2, 3, 4], [5, 5, 0, 0], [2, 0, 0, 0], [3, 3, 3, 0]])
    input_lengths = torch.tensor([12, 9, 6, 4 if impossible else 10])
    target_lengths = torch.tensor([4, 2, 1, 3])
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("impossible", [False, True])
def test_ctc_loss_forward_and_backward_match_cpu(reduction, zero_infinity, impossible):
    logits, targets, input_lengths, target_lengths = _ctc_batch(impossible)
    loss_fn = torch.nn.CTCLoss(reduction=reduction, zero_infinity=zero_infinity)
    results = []
    for device in ("cpu", DEVICE):
        leaf = logits.to(device).detach().requires_grad_()
        loss = loss_fn(leaf.log_softmax(2), targets.to(device), input_lengths.to(device), target_lengths.to(device))
        loss.sum().backward()
        results.append((loss.detach().cpu(), leaf.grad.cpu()))
    (want_loss, want_grad), (loss, grad) = results
    torch.testing.assert_close(loss, want_loss, equal_nan=True, **FP32)
    torch.testing.assert_close(grad, want_grad, equal_nan=True, **FP32)
    if impossible and zero_infinity:
        assert torch.isfinite(grad).all()
    _ran("_ctc_loss", "_ctc_loss_backward")


def test_compiled_ctc_loss_runs_natively_between_graphs(fresh_dynamo):
    """_ctc_loss's output shape depends on the target lengths' values: Dynamo breaks the graph
    before it and it runs natively, as do its backward; loss and gradients match eager."""
    logits, targets, input_lengths, target_lengths = _ctc_batch(False)

    def loss_of(x):
        return F.ctc_loss(x.log_softmax(2), targets.to(DEVICE), input_lengths.to(DEVICE),
                          target_lengths.to(DEVICE), zero_infinity=True)

    results = []
    for fn in (loss_of, torch.compile(loss_of, backend="neuron")):
        leaf = logits.to(DEVICE).requires_grad_()
        loss = fn(leaf)
        loss.backward()
        results.append((loss.detach().cpu(), leaf.grad.cpu()))
    torch.testing.assert_close(results[1], results[0], **FP32)
    _ran("_ctc_loss", "_ctc_loss_backward")
