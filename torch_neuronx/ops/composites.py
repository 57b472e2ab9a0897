"""The kernels around registry.ONE_KERNEL_COMPOSITES, ops PyTorch writes as
composites that the device runs as one kernel (the alias kernel runs the
composite on host aliases).

- _fused_rms_norm_backward: what _fused_rms_norm's autograd formula calls once
  _fused_rms_norm has a kernel of its own. PyTorch gives it no CPU kernel, only a
  decomposition; that decomposition runs here on host aliases, so the device
  sees one kernel, and the compiler (which decomposes _fused_rms_norm before
  autograd) never meets it.
- index_select_backward and value_selecting_reduction_backward under autograd:
  derivatives.yaml has no formula for them (the CPU differentiates their
  composites part by part), so a call whose inputs require grad (double
  backward) keeps running the composite on the device, which keeps its gradient
  exact; every other call goes below autograd to the one kernel.
- (rms_norm with a 16-bit input and a weight of another dtype, one _fused_rms_norm
  in float32 as TorchNeuron runs it, is routed in C++: csrc/RmsNorm.cpp.)
"""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table

from torch_neuronx import _C

_aten = torch.ops.aten
_RMS_NORM_BACKWARD = decomposition_table[_aten._fused_rms_norm_backward.default]


def on_host_aliases(fn, device: int, *args) -> tuple:
    """fn(*args) with each device tensor replaced by its host alias, without autograd;
    the tensors it returns adopted on `device`. The device sees one kernel: fn's
    parts are CPU calls, not device calls of their own."""
    host = [_C._host_alias(a) if isinstance(a, torch.Tensor) else a for a in args]
    # Under the capture scope fn's results (and its temporaries) are allocated by the
    # device allocator: counted in memory_allocated() and under the core's capacity,
    # and adopted without a copy.
    with torch.no_grad(), _C._CaptureScope(device):
        results = tuple(None if r is None else _dense_layout(r) for r in fn(*host))
    return tuple(None if r is None else _C._adopt_external(r, device) for r in results)


def _dense_layout(result: torch.Tensor) -> torch.Tensor:
    """A result as `.to(device)` would lay it out: unchanged when its elements fill its memory
    densely in some order of dimensions (SDPA's output on PyTorch's flash path is [B, H, L, D]
    over a [B, L, H, D] buffer, and code may view its transpose), else a contiguous copy."""
    if result.is_contiguous():
        return result
    expected = 1
    for size, stride in sorted(zip(result.shape, result.stride()), key=lambda dim: dim[1]):
        if size != 1 and stride != expected:
            return result.contiguous()
        expected *= size
    return result


def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    return on_host_aliases(_RMS_NORM_BACKWARD, grad_out.device.index, grad_out, input, normalized_shape, rstd,
                           weight, output_mask)


def _composite_under_autograd(op):
    """op's AutogradPrivateUse1 kernel: the composite when a gradient must flow
    through the call, else the one kernel below autograd."""

    def kernel(*args):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return op.decompose(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return kernel


KERNELS = {"_fused_rms_norm_backward": _fused_rms_norm_backward}
AUTOGRAD_KERNELS = {name: _composite_under_autograd(getattr(_aten, name).default)
                    for name in ("index_select_backward", "value_selecting_reduction_backward")}
