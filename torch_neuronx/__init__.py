"""torch_neuronx: TorchNeuron, the native PyTorch backend for AWS Trainium.

``import torch`` loads this package through the ``torch.backends`` entry point
(set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to opt out); importing it again is a
no-op. It registers the ``neuron`` device (PrivateUse1), the ``torch.neuron``
module, the native op set, and sizes the emulated NeuronCores from the
instance profile (TORCH_NEURONX_INSTANCE, NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES,
NEURON_RT_NUM_CORES).
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing did the work.

    Defined before ``import torch``: when this package is imported first,
    importing torch autoloads it again while it is half initialized, and this
    name must already exist then."""


import atexit  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from torch_neuronx import _C  # noqa: E402

__version__ = "0.1.0"


def _register_device() -> None:
    from torch_neuronx import neuron, ops
    from torch_neuronx.neuron import memory, printing

    # The profile and cores read (once) when torch_neuronx.neuron was imported.
    cores = neuron._VISIBLE_CORES
    _C._configure(len(cores), [neuron._PROFILE.hbm_per_core] * len(cores))
    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", neuron)
    # Its submodules under their torch.neuron names too: `import torch.neuron.memory`
    # (written as for torch.cuda.memory) must find the loaded module, not load
    # memory.py a second time as another module with its own state.
    for name, module in list(sys.modules.items()):
        if name.startswith("torch_neuronx.neuron."):
            sys.modules["torch.neuron." + name.removeprefix("torch_neuronx.neuron.")] = module
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True
    )
    ops.apply_env_policies()
    ops.register()
    printing.install()
    memory.install_accelerator_snapshot()
    # Registered first, so it runs after the atexit handlers of everything imported later.
    atexit.register(_C._drain_autograd_workers)


def _configuration_error(error: ValueError) -> None:
    """An invalid variable read at import (TORCH_NEURONX_INSTANCE, ...) fails the
    import with a ValueError naming it; the torch-neuronx command, whose code runs
    only after this import, exits with that one line instead of a traceback."""
    from torch_neuronx import cli

    cli.exit_if_command(error)


if torch._C._get_privateuse1_backend_name() != "neuron":
    from torch_neuronx import log as _log

    try:
        _log.configure()
        _register_device()
    except ValueError as error:
        _configuration_error(error)
        raise

from torch_neuronx.neuron import (  # noqa: E402  (public API, torch_neuronx.* mirrors torch.neuron.*)
    Event,
    Stream,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    empty_cache,
    get_device_properties,
    is_available,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
    set_device,
    set_stream,
    stream,
    synchronize,
)
from torch_neuronx.ops import (  # noqa: E402
    clear_op_tracking,
    get_executed_ops,
    get_fallback_ops,
)
from torch_neuronx import distributed  # noqa: E402, F401  (registers the "neuron" c10d backend)
from torch_neuronx import integrations  # noqa: E402
from torch_neuronx.custom_op import nki_op, wrap_nki  # noqa: E402  (torch_neuronx.nki itself loads on first import)

try:
    integrations.install()  # patches HF libraries' neuron gaps when (if ever) they are imported
except ValueError as error:  # TORCH_NEURONX_DISABLE_INTEGRATIONS
    _configuration_error(error)
    raise

# Every Dynamo patch (static shapes per neuron frame, recompile reasons,
# torch.compile(model)'s default backend on neuron tensors -> "neuron", RNG
# graph breaks) applies when torch._dynamo is imported, not now.
from torch_neuronx.compiler import dynamo as _dynamo_patches  # noqa: E402, F401

from torch_neuronx.audit import recorder as _audit_recorder  # noqa: E402

_audit_recorder.start_from_env()  # only under `torch-neuronx audit` (TORCH_NEURONX_AUDIT_DIR)

from torch_neuronx import config as _config  # noqa: E402

# torch.profiler's device events: profiling.py subscribes to observe.py on import.
from torch_neuronx import profiling as _profiling  # noqa: E402

if _config.inspect_enable():  # NEURON_RT_INSPECT_ENABLE=1: profile the whole process
    _profiling.start_from_environment()


def get_dynamo_metrics() -> dict:
    """torch.compile(backend="neuron") counters: compiles, cache hits, graph breaks, ..."""
    from torch_neuronx.compiler import get_dynamo_metrics as metrics

    return metrics()


def reset_dynamo_metrics() -> None:
    from torch_neuronx.compiler import reset_dynamo_metrics as reset

    reset()


__all__ = [
    "Event", "Stream", "clear_op_tracking", "current_device", "current_stream", "default_stream",
    "device", "device_count", "empty_cache", "get_device_properties", "get_dynamo_metrics",
    "get_executed_ops", "get_fallback_ops", "is_available", "max_memory_allocated",
    "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
    "memory_summary", "nki_op", "reset_dynamo_metrics", "reset_peak_memory_stats", "set_device",
    "set_stream", "stream", "synchronize", "wrap_nki",
]
