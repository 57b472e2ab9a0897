"""linear as TorchNeuron runs it: one `linear` kernel forward, one
`linear_backward` kernel for its gradient.

PyTorch writes linear as a composite (t + addmm, differentiated through the
matmuls); TorchNeuron registers it for the device, so here it is one of
registry.ONE_KERNEL_COMPOSITES (the alias kernel runs the composite on host
aliases), and csrc/Linear.cpp gives it the autograd kernel PyTorch's composite
had provided (in C++: every linear call on the device goes through it).

linear_backward has kernels only for MKL-DNN and nested tensors, so the alias
kernel has nothing to run: its formula here, written with ATen ops, runs on host
aliases as one kernel, and is also the compiler's decomposition. (A gradient of
the gradient, create_graph=True, runs the same formula in csrc/Linear.cpp, where
autograd differentiates it.)
"""

from __future__ import annotations

import torch

_aten = torch.ops.aten


def linear_backward(input: torch.Tensor, grad_output: torch.Tensor, weight: torch.Tensor, output_mask):
    """(grad_input, grad_weight, grad_bias) of y = input @ weight.T + bias, each
    only where output_mask asks for it (None otherwise, an undefined tensor).
    csrc/Linear.cpp's linearBackwardFormula is the same formula."""
    rows = grad_output.reshape(-1, grad_output.shape[-1])
    return (grad_output.matmul(weight) if output_mask[0] else None,
            rows.t().matmul(input.reshape(-1, input.shape[-1])) if output_mask[1] else None,
            rows.sum(0) if output_mask[2] else None)


DECOMPOSITIONS = {_aten.linear_backward.default: linear_backward}
