"""SyncBatchNorm's kernels on the device, with CUDA's semantics.

nn.SyncBatchNorm (torch/nn/modules/_functions.py) splits batch norm into
per-rank statistics, an exchange of them, and elementwise passes:
batch_norm_stats, batch_norm_gather_stats_with_counts and batch_norm_elemt
forward, batch_norm_backward_reduce and batch_norm_backward_elemt backward.
Only CUDA implements them (aten/src/ATen/native/cuda/Normalization.cu), so
the alias kernel has no CPU kernel to run. These are the device's versions,
written with ATen ops (each runs natively), with CUDA's dtypes: statistics
(mean, invstd, sum_dy, sum_dy_xmu) in float32 for float16/bfloat16 inputs,
elementwise results in the input's dtype, all arithmetic in the statistics'
dtype.

Each function serves three ways, one statement of the semantics: the eager
kernel (KERNELS), the shape function Dynamo's fake tensors run (META_KERNELS:
the same code on meta tensors; CUDA's shape functions are not registered for
Meta) and the compiler's decomposition (DECOMPOSITIONS), which rewrites the op
into lowered ATen ops. The running statistics that
batch_norm_gather_stats_with_counts updates in place, as CUDA does (its schema
does not declare it), reach a compiled graph as `copy_` into graph inputs,
which the compiler writes back (compiler/executable.py).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """CUDA's accumulate type: float32 for the 16-bit float types."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _reduced_dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A [C] vector shaped to broadcast against x [N, C, *]."""
    return t.reshape([1, -1] + [1] * (x.dim() - 2))


def batch_norm_stats(input: torch.Tensor, eps: float):
    """(mean, invstd) per channel, with the biased variance; CUDA's InvStd
    gives 0 where variance and eps are both 0."""
    x = input.to(_stat_dtype(input.dtype))
    var, mean = torch.var_mean(x, _reduced_dims(input), correction=0)
    if eps == 0:
        return mean, torch.where(var == 0, torch.zeros_like(var), var.rsqrt())
    return mean, (var + eps).rsqrt()


def _normalized(input, weight, bias, mean, invstd):
    stat = _stat_dtype(input.dtype)
    y = (input.to(stat) - _per_channel(mean.to(stat), input)) * _per_channel(invstd.to(stat), input)
    if weight is not None:
        y = y * _per_channel(weight.to(stat), input)
    if bias is not None:
        y = y + _per_channel(bias.to(stat), input)
    return y.to(input.dtype)


def batch_norm_elemt(input, weight, bias, mean, invstd, eps: float):
    """(input - mean) * invstd * weight + bias; eps is unused, as on CUDA."""
    return _normalized(input, weight, bias, mean, invstd)


def batch_norm_elemt_out(input, weight, bias, mean, invstd, eps: float, *, out):
    result = _normalized(input, weight, bias, mean, invstd)
    out.resize_(result.shape)
    return out.copy_(result)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g: bool, weight_g: bool, bias_g: bool):
    """(sum_dy, sum_dy_xmu, grad_weight, grad_bias) per channel. As TorchNeuron
    (tests/python_ops/test_batch_norm_backward_reduce.py in AWS's snapshot), all four
    are returned whatever the flags say (CUDA leaves the unrequested ones undefined;
    SyncBatchNorm's backward reads only what it asked for). Sums in mean's dtype,
    weight and bias gradients in the weight's dtype."""
    stat = mean.dtype
    dims = _reduced_dims(input)
    dy = grad_out.to(stat)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (input.to(stat) - _per_channel(mean, input))).sum(dims)
    param_dtype = weight.dtype if weight is not None else stat
    return sum_dy, sum_dy_xmu, (sum_dy_xmu * invstd).to(param_dtype), sum_dy.to(param_dtype)


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """The input gradient from the all-reduced sums; `count` holds every
    rank's element count per channel (an integer tensor: SyncBatchNorm passes
    int32, TorchNeuron accepts int64 too), their sum is the batch."""
    if count.dtype.is_floating_point or count.dtype.is_complex or count.dtype == torch.bool:
        raise RuntimeError(f"batch_norm_backward_elemt: expected count to be an integer tensor (int32 as "
                           f"SyncBatchNorm passes it), got {count.dtype}")
    stat = mean.dtype
    norm = 1.0 / count.sum().to(stat)
    scale = invstd if weight is None else weight.to(stat) * invstd
    projection = invstd * invstd * sum_dy_xmu * norm
    grad = (grad_out.to(stat) - _per_channel(sum_dy * norm, input)
            - (input.to(stat) - _per_channel(mean, input)) * _per_channel(projection, input))
    return (grad * _per_channel(scale, input)).to(input.dtype)


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum: float,
                                        eps: float, counts):
    """Global (mean, invstd) from every rank's [world, C] mean and invstd
    and its element count, and the running statistics updated in place with
    the unbiased variance. CUDA folds the ranks in one at a time (Welford's
    parallel merge); the closed form here gives the same sums, and a zero
    count anywhere just contributes nothing."""
    stat = _stat_dtype(mean.dtype)
    weights = counts.to(stat)[:, None]
    total = weights.sum(0)
    global_mean = (weights * mean.to(stat)).sum(0) / total
    variances = invstd.to(stat).reciprocal().square() - eps
    var_n = (weights * variances).sum(0) + (weights * (mean.to(stat) - global_mean).square()).sum(0)
    if running_mean is not None:
        running_mean.copy_(running_mean * (1 - momentum) + global_mean * momentum)
    if running_var is not None:
        running_var.copy_(running_var * (1 - momentum) + var_n / (total - 1) * momentum)
    return global_mean, (var_n / total + eps).rsqrt()


KERNELS = {
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_elemt": batch_norm_elemt,
    "batch_norm_elemt.out": batch_norm_elemt_out,
    "batch_norm_backward_reduce": batch_norm_backward_reduce,
    "batch_norm_backward_elemt": batch_norm_backward_elemt,
    "batch_norm_gather_stats_with_counts": batch_norm_gather_stats_with_counts,
}
# The functional overloads: Dynamo's shape functions and the compiler's decompositions.
META_KERNELS = {name: kernel for name, kernel in KERNELS.items() if "." not in name}
DECOMPOSITIONS = {getattr(aten, name).default: kernel for name, kernel in META_KERNELS.items()}
