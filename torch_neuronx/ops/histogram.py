"""histc on the device, for every dtype CUDA accepts.

PyTorch's CPU histogram kernel has no integer version, while CUDA's has one:
transformers' MoE layers count tokens per expert with
``torch.histc(expert_ids.int(), ...)`` on every device but cpu/mps. The native
path runs the CPU kernel on device memory, so integer inputs are binned as
float32 here (exact for values below 2**24) and the counts cast back to the
input dtype, as CUDA returns them.
"""

from __future__ import annotations

import torch

from torch_neuronx import _C


def _counts(self: torch.Tensor, bins: int, min, max) -> torch.Tensor:
    host = _C._host_alias(self)
    if self.dtype.is_floating_point:
        return torch.histc(host, bins, min, max)
    return torch.histc(host.to(torch.float32), bins, min, max).to(self.dtype)


def histc(self: torch.Tensor, bins: int = 100, min=0, max=0) -> torch.Tensor:
    return _counts(self, bins, min, max).to(self.device)


def histc_out(self: torch.Tensor, bins: int = 100, min=0, max=0, *, out: torch.Tensor) -> torch.Tensor:
    # CPU and CUDA refuse an out= of another dtype, and so does Trainium (in these words).
    if out.dtype != self.dtype:
        raise RuntimeError(
            "torch.histogram: input tensor and hist tensor should have the same dtype, but got "
            f"input {self.dtype} and hist {out.dtype} (pass out= of dtype {self.dtype})")
    counts = _counts(self, bins, min, max)
    out.resize_(counts.shape)
    out.copy_(counts)
    return out


KERNELS = {"histc": histc, "histc.out": histc_out}
