"""topk on the device, with one tie order in eager and compiled code.

PyTorch leaves the order of equal values unspecified, and its CPU kernel
(std::nth_element / std::partial_sort) returns them in an order that depends
on the row's length and k: topk([0.5] * 4, 2) gives indices [2, 3]. The
lowering (torch_neuronx/lowering/reductions.py) is a stable sort, which gives
[0, 1], so a graph whose top-k meets a tie (a MoE router with equal scores)
picked other experts compiled than eagerly. Both modes now take the lowest
indices among equal values, in index order: the stable sort's first k.
The CPU kernel runs first and its result stands unless it has ties (an O(n)
check: a 152k-entry row takes about twice the kernel's time); one with ties is
redone by the stable sort.
"""

from __future__ import annotations

import torch

from torch_neuronx import _C


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Equal, NaN included (topk ranks NaN as the largest value, all NaNs alike);
    b is the small operand: a's NaNs are looked for only when b has one."""
    same = a == b
    if b.is_floating_point() and bool(b.isnan().any()):
        same |= a.isnan() & b.isnan()
    return same


def _has_ties(x: torch.Tensor, values: torch.Tensor, dim: int) -> bool:
    """Whether the order of the CPU kernel's result may differ from the stable
    one: two selected values are equal, or the k-th value also occurs among
    the values left out."""
    k = values.shape[dim]
    if k == 0:
        return False
    if bool(_same(values.narrow(dim, 1, k - 1), values.narrow(dim, 0, k - 1)).any()):
        return True
    return bool((torch.count_nonzero(_same(x, values.narrow(dim, k - 1, 1)), dim) > 1).any())


def _stable_topk(self: torch.Tensor, k: int, dim: int, largest: bool):
    host = _C._host_alias(self)
    values, indices = torch.topk(host, k, dim, largest)  # its own errors for a bad k or dim
    if host.ndim == 0 or not _has_ties(host, values, dim):
        return values, indices  # no equal values: one right order, the kernel's (the fast path)
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
