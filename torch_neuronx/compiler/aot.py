"""AOTAutograd for this backend: the decompositions it applies before lowering,
and the call that runs it (PyTorch's aot_autograd() helper, minus an import)."""

from __future__ import annotations

import collections.abc
import functools

import torch

from torch_neuronx import config


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """The decompositions AOTAutograd applies before lowering (Core ATen's); the
    registry invariant test checks every native op it decomposes.

    Built once per process: core_aten_decompositions() scans every operator
    namespace for CompositeImplicitAutograd ops (~0.25 s), which would
    otherwise be paid again by every graph Dynamo hands to the backend."""
    from torch._decomp import core_aten_decompositions

    from torch_neuronx.ops import attention, float8, linear, sync_batch_norm

    # torch.nn.functional.scaled_mm's _scaled_mm_v2 runs as _scaled_mm (its FP8 gate and lowering);
    # SyncBatchNorm's kernels and linear_backward compile as their eager kernels' ATen ops;
    # SDPA's overrideable ops with dropout as their math formulas (their mask drawn on the host)
    return {**dict(core_aten_decompositions().items()), **float8.DECOMPOSITIONS,
            **sync_batch_norm.DECOMPOSITIONS, **linear.DECOMPOSITIONS, **attention.DECOMPOSITIONS,
            **_SHIFT_DECOMPOSITIONS}


# `x >> n` and `x << n` trace as __rshift__ / __lshift__, which Core ATen keeps;
# they are bitwise_right_shift / bitwise_left_shift (the same kernel and type
# promotion in PyTorch, the same argument names), which have lowerings: each
# overload maps to its counterpart as is. Eagerly they take the CPU fallback, as on
# TorchNeuron, whose compiler decomposes them the same way.
_aten = torch.ops.aten
_SHIFT_DECOMPOSITIONS = {
    _aten.__rshift__.Scalar: _aten.bitwise_right_shift.Tensor_Scalar,
    _aten.__rshift__.Tensor: _aten.bitwise_right_shift.Tensor,
    _aten.__lshift__.Scalar: _aten.bitwise_left_shift.Tensor_Scalar,
    _aten.__lshift__.Tensor: _aten.bitwise_left_shift.Tensor,
}


class Decompositions(collections.abc.Mapping):
    """decomposition_table(), built on first use: AOTAutogradCache hits
    (compiler/aot_cache.py) never read it."""

    def __getitem__(self, op):
        return decomposition_table()[op]

    def __iter__(self):
        return iter(decomposition_table())

    def __len__(self):
        return len(decomposition_table())


def aot_autograd(gm: torch.fx.GraphModule, example_inputs, **options):
    """What PyTorch's aot_autograd() backend helper (torch._dynamo.backends.common)
    does for this backend, without its `torch._inductor.debug` import: that
    import costs every process 0.15 s (Inductor's scheduler and IR modules)
    and serves only TORCH_COMPILE_DEBUG's AOTAutograd logs, so the helper
    itself still runs when that is set, and for graphs with nested inputs
    (compiled autograd), which it flattens first."""
    from torch._dynamo.backends.common import aot_autograd as aot_autograd_helper
    from torch._dynamo import disable
    from torch._dynamo.utils import counters
    from torch._functorch.aot_autograd import aot_module_simplified

    if config.torch_compile_debug() or any(
            isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return aot_autograd_helper(**options)(gm, example_inputs)
    backward = options["bw_compiler"]

    def bw_compiler(*args, **kwargs):
        # As the helper does: Dynamo traces neither the backward compiler nor
        # the backward it returns.
        compiled = disable(backward, reason="do not trace backward compiler function")(*args, **kwargs)
        return disable(compiled, reason="do not trace generated backwards pass")

    counters["aot_autograd"]["total"] += 1
    try:
        compiled = aot_module_simplified(gm, example_inputs, **{**options, "bw_compiler": bw_compiler})
    except Exception:
        counters["aot_autograd"]["not_ok"] += 1
        raise
    counters["aot_autograd"]["ok"] += 1
    return disable(compiled, reason="do not trace AOT-compiled graph")
