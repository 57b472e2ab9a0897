"""linear_backward on the device.

aten::linear_backward has kernels only for MKL-DNN and nested tensors (autograd
differentiates linear through matmul), so the alias kernel has no CPU kernel to
run; tensor-parallel code and direct calls reach it. Written with ATen ops
(each runs natively); the same function is the compiler's decomposition.
"""

from __future__ import annotations

import torch


def linear_backward(input: torch.Tensor, grad_output: torch.Tensor, weight: torch.Tensor, output_mask):
    """(grad_input, grad_weight, grad_bias) of y = input @ weight.T + bias, each
    only where output_mask asks for it (None otherwise, an undefined tensor)."""
    rows = grad_output.reshape(-1, grad_output.shape[-1])
    return (grad_output.matmul(weight) if output_mask[0] else None,
            rows.t().matmul(input.reshape(-1, input.shape[-1])) if output_mask[1] else None,
            rows.sum(0) if output_mask[2] else None)


KERNELS = {"linear_backward": linear_backward}
DECOMPOSITIONS = {torch.ops.aten.linear_backward.default: linear_backward}
