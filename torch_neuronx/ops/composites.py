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
"""

from __future__ import annotations

import torch
from torch._decomp import decomposition_table

from torch_neuronx import _C

_aten = torch.ops.aten
_RMS_NORM_BACKWARD = decomposition_table[_aten._fused_rms_norm_backward.default]


def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    device = grad_out.device.index
    host = [None if t is None else _C._host_alias(t) for t in (grad_out, input, rstd, weight)]
    with torch.no_grad():
        grads = _RMS_NORM_BACKWARD(host[0], host[1], normalized_shape, host[2], host[3], output_mask)
    return tuple(None if g is None else _C._adopt_external(g.contiguous(), device) for g in grads)


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
AUTOGRAD_KERNELS = {
    name: _composite_under_autograd(getattr(_aten, name).default)
    for name in ("index_select_backward", "value_selecting_reduction_backward")
}
