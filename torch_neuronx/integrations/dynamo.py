"""Patch for torch._dynamo (see docs/compile.md).

Dynamo steps around ``torch.cuda``'s RNG functions (its trace rules list them
as skipped: a graph break, then the call runs eagerly) because reading or
setting a generator is no ATen op: traced, ``get_rng_state`` became a fake
tensor and ``set_rng_state`` received one ("RNG state must be a
torch.ByteTensor", or a no_dispatch assertion in fake-tensor conversion, e.g.
under ``torch.random.fork_rng(device_type="neuron")`` or the OpInfo sample
wrappers). Those rules name CUDA's functions only, so ``torch.neuron``'s get the
same treatment here: each becomes ``torch.compiler.disable(fn)`` (a graph break;
under fullgraph=True Dynamo's "Skip calling torch.compiler.disable()d function"
error, as CUDA's raise "Attempted to call function marked as skipped").

Applied when torch._dynamo is imported, not before: importing it costs about a
second, and ``import torch`` must not pay for it. The names are replaced, so a
reference taken before that (``f = torch.neuron.get_rng_state`` ahead of the
first ``torch.compile``) keeps the plain function; ``torch.neuron.<name>`` and
``torch.get_device_module("neuron").<name>`` (what ``fork_rng`` uses) are looked
up at each call and get the wrapped one.
"""

from __future__ import annotations

from types import ModuleType

from torch_neuronx.integrations import patches
from torch_neuronx.patching import patch_once

_REASON = "it reads or sets a neuron RNG generator, which is no graph op (as torch.cuda's RNG API)"


@patches("torch._dynamo")
def neuron_rng_state_graph_breaks(module: ModuleType) -> None:
    """torch.neuron's RNG state functions run eagerly behind a graph break."""
    import torch

    from torch_neuronx import neuron
    from torch_neuronx.neuron import random

    def build(original):
        return torch.compiler.disable(original, reason=_REASON)

    # torch.neuron (torch_neuronx.neuron) re-exports them: both names are replaced.
    for name in random.STATE_FUNCTIONS:
        for owner in (random, neuron):
            patch_once(owner, name, build,
                       why="Dynamo graph-breaks on torch.neuron's RNG state functions, as on torch.cuda's")
