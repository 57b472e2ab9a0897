"""topk on the device, with one tie order in eager and compiled code.

PyTorch leaves the order of equal values unspecified, and its CPU kernel
(std::nth_element / std::partial_sort) returns them in an order that depends
on the row's length and k: topk([0.5] * 4, 2) gives indices [2, 3]. The
lowering (torch_neuronx/lowering/reductions.py) is a stable sort, which gives
[0, 1], so a graph whose top-k meets a tie (a MoE router with equal scores)
picked other experts compiled than eagerly. Both modes now take the lowest
indices among equal values, in index order: the stable sort's first k.
"""

from __future__ import annotations

import torch

from torch_neuronx import _C


def _stable_topk(self: torch.Tensor, k: int, dim: int, largest: bool):
    host = _C._host_view(self)
    if host.ndim == 0:  # one element: no tie to break
        return torch.topk(host, k, dim, largest)
    size = host.shape[dim]
    if not 0 <= k <= size:
        raise RuntimeError(f"topk: selected index k={k} out of range for dimension {dim} of size {size}: "
                           f"pass 0 <= k <= {size}")
    values, indices = torch.sort(host, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


def topk(self: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    # sorted=False leaves the order free; the sorted one is a valid choice
    values, indices = _stable_topk(self, k, dim, largest)
    return values.to(self.device), indices.to(self.device)


def topk_values(self: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *,
                values: torch.Tensor, indices: torch.Tensor):
    got_values, got_indices = _stable_topk(self, k, dim, largest)
    for out, got in ((values, got_values), (indices, got_indices)):
        out.resize_(got.shape)
        out.copy_(got)
    return values, indices


KERNELS = {"topk": topk, "topk.values": topk_values}
