"""linear as TorchNeuron runs it: one `linear` kernel forward, one
`linear_backward` kernel for its gradient.

PyTorch writes linear as a composite (t + addmm, differentiated through the
matmuls); TorchNeuron registers it for the device, so here it is one of
registry.ONE_KERNEL_COMPOSITES (the alias kernel runs the composite on host
aliases) and this module gives it the autograd kernel PyTorch's composite had
provided.

- linear_backward has kernels only for MKL-DNN and nested tensors, so the alias
  kernel has nothing to run: its formula here, written with ATen ops, runs on host
  aliases as one kernel, and is also the compiler's decomposition.
- Tensor subclasses (DTensor, Dynamo's fake tensors, functionalization) and
  functorch transforms keep PyTorch's composite: DTensor has sharding rules for
  mm/addmm but none for linear or linear_backward in PyTorch 2.13, and the
  compiler decomposes linear while tracing anyway.
- A gradient of the gradient (create_graph=True) runs the differentiable formula.
"""

from __future__ import annotations

import torch

from torch_neuronx.ops.composites import on_host_aliases

_aten = torch.ops.aten
_PYTHON_KEY = torch._C.DispatchKey.Python


def linear_backward(input: torch.Tensor, grad_output: torch.Tensor, weight: torch.Tensor, output_mask):
    """(grad_input, grad_weight, grad_bias) of y = input @ weight.T + bias, each
    only where output_mask asks for it (None otherwise, an undefined tensor)."""
    rows = grad_output.reshape(-1, grad_output.shape[-1])
    return (grad_output.matmul(weight) if output_mask[0] else None,
            rows.t().matmul(input.reshape(-1, input.shape[-1])) if output_mask[1] else None,
            rows.sum(0) if output_mask[2] else None)


def _linear_backward_kernel(input, grad_output, weight, output_mask):
    return on_host_aliases(linear_backward, grad_output.device.index, input, grad_output, weight, output_mask)


class _Linear(torch.autograd.Function):
    """One linear kernel forward (grad mode is off in forward(), so the call goes
    below autograd), one linear_backward kernel backward. forward() takes ctx
    (no setup_context): Function.apply then skips binding the arguments to
    forward's signature, about 30 us a call; functorch transforms, which would
    need setup_context, keep PyTorch's composite (linear_autograd)."""

    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        return _below_autograd(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        mask = [needs[0], needs[1], ctx.has_bias and needs[2]]
        if torch.is_grad_enabled():  # create_graph=True: a formula autograd can differentiate
            return linear_backward(input, grad_output, weight, mask)
        return tuple(_aten.linear_backward.default(input, grad_output, weight, mask))


def _keeps_composite(tensors) -> bool:
    """Calls PyTorch's composite serves: tensor subclasses and functorch transforms."""
    if any(torch._C._dispatch_keys(t).has(_PYTHON_KEY) for t in tensors):
        return True
    return torch._C._functorch.peek_interpreter_stack() is not None


def _has_linear_backward(input, weight, bias) -> bool:
    """The shapes linear_backward's formula serves: a 2-D weight, a bias of its rows."""
    return weight.dim() == 2 and input.dim() > 0 and (bias is None or tuple(bias.shape) == tuple(weight.shape[:1]))


def linear_autograd(input, weight, bias=None):
    """linear's AutogradPrivateUse1 kernel."""
    tensors = (input, weight) if bias is None else (input, weight, bias)
    if _keeps_composite(tensors):
        return _aten.linear.default.decompose(input, weight, bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        if not _has_linear_backward(input, weight, bias):  # a 1-D weight: differentiate the composite
            return _aten.linear.default.decompose(input, weight, bias)
        return _Linear.apply(input, weight, bias)
    return _below_autograd(input, weight, bias)


def _below_autograd(input, weight, bias):
    """The device's linear kernel, called below autograd (from _Linear.forward
    too, which would otherwise come back through linear_autograd)."""
    with torch._C._AutoDispatchBelowAutograd():
        return _aten.linear.default(input, weight, bias)


KERNELS = {"linear_backward": _linear_backward_kernel}
AUTOGRAD_KERNELS = {"linear": linear_autograd}
DECOMPOSITIONS = {_aten.linear_backward.default: linear_backward}
