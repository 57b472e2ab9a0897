"""The start-up of torch_neuronx: every side effect of importing the package, in order.

torch_neuronx/__init__.py calls run() once per execution of its body (the first
import, or importlib.reload); the steps that may happen once per process only
(naming the backend, registering ops) are skipped when the ``neuron`` device is
already registered. Everything is imported inside the steps, so that reading
this module costs nothing and no step loads JAX (the compiler imports it on
first use).
"""

from __future__ import annotations

import atexit
import sys
from typing import Callable

import torch

from torch_neuronx import _C


def run() -> None:
    """The start-up steps, in the order they must run (the comment says why there)."""
    if not _device_registered():
        # First: every later step logs through the configured handlers (TORCH_NEURONX_LOG_*).
        _reading_configuration(_configure_logging)
        # Sizes the runtime before anything can allocate, then names the device and
        # installs torch.neuron and the native ops (they dispatch on that name).
        _reading_configuration(_register_device)
    # After the device name exists: the c10d backend is registered for the "neuron" device type.
    _register_distributed()
    # Backward passes of this thread run on it, not handed to a device thread.
    _run_backward_on_the_calling_thread()
    # Patches HF libraries' neuron gaps when (if ever) they are imported; reads
    # TORCH_NEURONX_DISABLE_INTEGRATIONS.
    _reading_configuration(_install_integrations)
    # Every Dynamo patch (static shapes per neuron frame, recompile reasons, torch.compile(model)'s
    # default backend on neuron tensors -> "neuron", RNG graph breaks): applied when
    # torch._dynamo is imported, not now (importing Dynamo costs about a second).
    _install_dynamo_patches()
    # Late, so that the recorder sees the process as the user's code will run it; active
    # only under `torch-neuronx audit` (TORCH_NEURONX_AUDIT_DIR).
    _start_audit_recorder()
    # Last: torch.profiler's device events subscribe to torch_neuronx.observe, and
    # NEURON_RT_INSPECT_ENABLE=1 profiles the whole process from here on.
    _start_profiling()


def _device_registered() -> bool:
    return torch._C._get_privateuse1_backend_name() == "neuron"


def _reading_configuration(step: Callable[[], None]) -> None:
    """Runs a step that reads environment variables. An invalid one fails the import
    with a ValueError naming it; the torch-neuronx command, whose code runs only
    after this import, exits with that one line instead of a traceback."""
    try:
        step()
    except ValueError as error:
        from torch_neuronx import cli

        cli.exit_if_command(error)
        raise


def _run_backward_on_the_calling_thread() -> None:
    """PyTorch's autograd engine gives each accelerator device a thread of its own and hands it
    every backward pass that reaches a device tensor: for CUDA this lets the CPU queue kernels
    while the caller waits. The emulator's kernels run on the CPU as they are called, so the
    hand-off (two thread wake-ups per backward) only adds time: about 100 us per backward pass
    on a 2-core machine, a third of a small ReLU MLP's training step (benchmarks/RESULTS.md,
    bench_concatenation's relu_mlp_step). The engine's one switch for this is per thread
    (torch.autograd.set_multithreading_enabled(False), as CPU tensors always run): set here for
    the importing thread, where training loops run; a backward started on another thread keeps the
    device thread (same results, the hand-off's cost). `with
    torch.autograd.set_multithreading_enabled(True):` restores the device thread for a block."""
    torch.autograd.set_multithreading_enabled(False)


def _configure_logging() -> None:
    from torch_neuronx import log

    log.configure()


def _register_device() -> None:
    from torch_neuronx import neuron, ops
    from torch_neuronx.neuron import memory, printing

    # The profile and cores read (once) when torch_neuronx.neuron was imported.
    cores = neuron._VISIBLE_CORES
    _C._configure(len(cores), [neuron._PROFILE.hbm_per_core] * len(cores))
    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", neuron)
    _alias_neuron_submodules()
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True
    )
    ops.apply_env_policies()
    ops.register()
    printing.install()
    memory.install_accelerator_snapshot()
    # Registered first, so it runs after the atexit handlers of everything imported later.
    atexit.register(_C._drain_autograd_workers)


def _alias_neuron_submodules() -> None:
    """torch.neuron's submodules under their torch.neuron names too: `import torch.neuron.memory`
    (written as for torch.cuda.memory) must find the loaded module, not load memory.py a
    second time as another module with its own state."""
    for name, module in list(sys.modules.items()):
        if name.startswith("torch_neuronx.neuron."):
            sys.modules["torch.neuron." + name.removeprefix("torch_neuronx.neuron.")] = module


def _register_distributed() -> None:
    from torch_neuronx import distributed  # noqa: F401  (registers the "neuron" c10d backend on import)


def _install_integrations() -> None:
    from torch_neuronx import integrations

    integrations.install()


def _install_dynamo_patches() -> None:
    from torch_neuronx.compiler import dynamo  # noqa: F401  (registers its import trigger on import)


def _start_audit_recorder() -> None:
    from torch_neuronx.audit import recorder

    recorder.start_from_env()


def _start_profiling() -> None:
    from torch_neuronx import config, profiling  # profiling subscribes to observe.py on import

    if config.inspect_enable():
        profiling.start_from_environment()
