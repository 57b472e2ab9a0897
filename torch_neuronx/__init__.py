"""torch_neuronx: TorchNeuron, the native PyTorch backend for AWS Trainium.

``import torch`` loads this package through the ``torch.backends`` entry point
(set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to opt out); importing it again is a
no-op. It registers the ``neuron`` device (PrivateUse1), the ``torch.neuron``
module, the native op set, and sizes the emulated NeuronCores from the
instance profile (TORCH_NEURONX_INSTANCE, NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES,
NEURON_RT_NUM_CORES). The steps, in order, are torch_neuronx/_startup.py's run().

The public names, by one rule: ``torch_neuronx.*`` mirrors every public name of
``torch.neuron`` (its ``__all__``: devices, streams, events, memory, RNG), plus the
backend's own functions, which ``torch.neuron`` does not have (``OWN_NAMES``: op
tracking, NKI custom ops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing did the work.

    Defined before ``import torch``: when this package is imported first,
    importing torch autoloads it again while it is half initialized, and this
    name must already exist then."""
    # Refused with a warning (torch_neuronx/_torch_version.py). Not yet decided when this
    # package is being imported first (the name is defined only after `import torch`).
    if globals().get("_TORCH_SUPPORTED") is False:
        _torch_version.forget_package()


import torch  # noqa: E402

from torch_neuronx import _torch_version  # noqa: E402

__version__ = "0.1.0"

# Before anything loads the C++ core: outside the supported PyTorch releases, an
# ImportError naming both versions (a warning when `import torch` autoloads us).
_TORCH_SUPPORTED = _torch_version.check(torch)

if _TORCH_SUPPORTED:
    from torch_neuronx import _startup

    _startup.run()

    # The public face (see the rule in the docstring). Imported after run(): importing
    # torch_neuronx.neuron reads the instance profile, whose errors run() reports.
    from torch_neuronx import neuron as _neuron
    from torch_neuronx.custom_op import nki_op, wrap_nki  # torch_neuronx.nki itself loads on first import
    from torch_neuronx.ops import clear_op_tracking, get_executed_ops, get_fallback_ops

    def get_dynamo_metrics():
        """torch.compile(backend="neuron") metrics: the list of per-graph records
        (``NeuronCompilationMetrics``: graph_name, model_name, phase times, ...),
        which also answers this project's aggregate counters by name
        (``m["compiles"]``, ``m["cache_hits_disk"]``, ...); see compiler/metrics.py.
        Compiles happen at a graph's first call, which waits for them, so no
        synchronize is needed (TorchNeuron synchronizes here)."""
        from torch_neuronx.compiler import get_dynamo_metrics as metrics

        return metrics()

    def reset_dynamo_metrics() -> None:
        """Clears the per-graph records, the counters (also Dynamo's
        ``counters["neuron"]`` and graph-break counts) and the neuron phase times in
        ``torch._dynamo.utils.compilation_time_metrics``."""
        from torch_neuronx.compiler import reset_dynamo_metrics as reset

        reset()

    # torch.neuron's names (as in TorchNeuron), defined here because torch.neuron sits below
    # the compiler and imports it nowhere (tests/test_layers.py); the compiler loads on first call.
    _neuron.get_dynamo_metrics = get_dynamo_metrics
    _neuron.reset_dynamo_metrics = reset_dynamo_metrics

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ below serves these names
    from torch_neuronx.neuron import *  # noqa: F401, F403


def __getattr__(name: str):
    """torch.neuron's public names, looked up at each access rather than copied: a name that
    torch.neuron replaces later (integrations/dynamo.py wraps the RNG state functions when
    torch._dynamo is imported) stays the same object under both names."""
    if name in _neuron.__all__:
        return getattr(_neuron, name)
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_neuron.__all__})


# get_dynamo_metrics / reset_dynamo_metrics are torch.neuron's (as in TorchNeuron), served above.
OWN_NAMES = (
    "clear_op_tracking", "get_executed_ops", "get_fallback_ops", "nki_op", "wrap_nki",
)
if _TORCH_SUPPORTED:
    __all__ = sorted({*_neuron.__all__, *OWN_NAMES})
