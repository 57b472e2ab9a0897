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

BACKEND_NAME = "neuron"


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


_register()

__all__ = ["BACKEND_NAME"]
