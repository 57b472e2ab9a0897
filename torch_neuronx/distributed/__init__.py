"""torch.distributed on the ``neuron`` device: the ``"neuron"`` c10d backend.

Importing torch_neuronx registers the backend name (cheap: nothing heavy is
imported here). The work happens when a process group is created with it::

    dist.init_process_group(backend="neuron")            # neuron and CPU tensors
    dist.init_process_group(backend="cpu:gloo,neuron:neuron")

Each process group gets a gloo backend on the group's store; collectives on
neuron tensors run on zero-copy host views of the device memory (the emulated
NeuronCore's memory is host memory), see ``_kernels``. When the default group
is created, the process binds ``torch.neuron.set_device(LOCAL_RANK)``.
"""

from __future__ import annotations

import contextvars

BACKEND_NAME = "neuron"

# The device_id given to the init_process_group call under way in this thread
# (None outside one): c10d does not pass it to backend creators, so the
# init_process_group wrapper below records it for _backend.bind_device.
_REQUESTED_DEVICE: contextvars.ContextVar = contextvars.ContextVar("torch_neuronx_device_id", default=None)


def requested_device():
    """The ``device_id`` of the init_process_group call under way (a torch.device), or None."""
    return _REQUESTED_DEVICE.get()


def _create_backend(dist_backend_opts, backend_options):
    from torch_neuronx.distributed import _backend

    return _backend.create_backend(dist_backend_opts, backend_options)


def _register() -> None:
    import torch.distributed as dist

    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    # "cpu" too: with backend="neuron" alone, CPU tensors (object collectives,
    # checkpoint metadata, CPU buffers) go to the same gloo backend, as
    # backend="gloo" serves both CPU and CUDA tensors.
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["neuron", "cpu"]
    )
    _record_device_id()


def _record_device_id() -> None:
    """Wraps the public ``init_process_group`` (both names it has) so that the
    backend creator can read its ``device_id`` argument (see requested_device).

    Only public API is relied upon: the function and its ``device_id``
    parameter, checked here, at import, so a PyTorch without it fails loudly."""
    import inspect

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from torch_neuronx import patching

    signature = inspect.signature(distributed_c10d.init_process_group)
    if "device_id" not in signature.parameters:
        raise RuntimeError(
            f"torch_neuronx.distributed: torch.distributed.init_process_group has no device_id "
            f"parameter in PyTorch {torch.__version__}; this torch_neuronx needs a PyTorch that has "
            "it (2.3 or newer) to bind each process to its NeuronCore."
        )

    def build(init_process_group):
        def wrapper(*args, **kwargs):
            try:
                device = signature.bind_partial(*args, **kwargs).arguments.get("device_id")
            except TypeError:  # bad arguments: init_process_group reports them
                device = None
            if isinstance(device, int) and not isinstance(device, bool):
                # As init_process_group reads an index: a device of the current accelerator.
                accelerator = torch.accelerator.current_accelerator()
                device = torch.device(accelerator.type, device) if accelerator is not None else None
            token = _REQUESTED_DEVICE.set(device if isinstance(device, torch.device) else None)
            try:
                return init_process_group(*args, **kwargs)
            finally:
                _REQUESTED_DEVICE.reset(token)

        return wrapper

    why = ("records init_process_group's device_id for the neuron backend creator, which c10d "
           "does not pass it (the process binds to that core)")
    patching.patch_once(distributed_c10d, "init_process_group", build, why=why)
    patching.patch_once(dist, "init_process_group", build, why=why)


_register()

__all__ = ["BACKEND_NAME"]
