"""Creating the "neuron" c10d backend and binding each process to its core."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from torch_neuronx import config, neuron


def local_device_index() -> int | None:
    """The NeuronCore this process should use: LOCAL_RANK among the visible cores.

    None when LOCAL_RANK is not set (the launcher did not say; the current
    device is left as it is). Raises when the node runs more processes than it
    has visible cores.
    """
    index = config.local_rank()
    if index is None:
        return None
    count = neuron.device_count()
    local_world = config.local_world_size()
    processes = max(local_world if local_world is not None else index + 1, index + 1)
    if processes > count:
        where = _visible_cores_origin()
        raise RuntimeError(
            f"torch.distributed on neuron: {processes} processes on this node "
            f"(LOCAL_RANK={index}, LOCAL_WORLD_SIZE={local_world}) but only {count} "
            f"NeuronCore(s) are visible ({where}). Each process needs its own core: "
            f"start at most {count} processes per node (torchrun --nproc-per-node {count}) "
            "or make more cores visible."
        )
    return index


def _visible_cores_origin() -> str:
    """What made these cores visible, for the error above."""
    from torch_neuronx.neuron import profiles

    source = profiles.cores_source()
    if source == config.visible_cores.name:
        return f"NEURON_RT_VISIBLE_CORES={config.visible_cores()!r}"
    if source == config.num_cores.name:
        return f"NEURON_RT_NUM_CORES={config.num_cores()}"
    return f"all cores of {profiles.describe(neuron._PROFILE)}"


def bind_device() -> int | None:
    """Makes this process's core current: init_process_group's device_id, else LOCAL_RANK."""
    from torch_neuronx.distributed import requested_device

    requested = requested_device()
    if requested is not None and requested.type == "neuron" and requested.index is not None:
        index = requested.index
    else:
        index = local_device_index()
    if index is not None:
        neuron.set_device(index)
    return index


def create_backend(dist_backend_opts, backend_options):
    from torch_neuronx.distributed import _kernels

    if not dist.is_initialized():
        # The default group is being created (init_process_group): bind now, so
        # that the barrier, object collectives and DDP use this rank's core.
        bind_device()
    _kernels.install()
    gloo = ProcessGroupGloo(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
    )
    gloo.options.global_ranks_in_group = list(dist_backend_opts.global_ranks_in_group)
    gloo.options.group_name = dist_backend_opts.group_id
    gloo._set_sequence_number_for_group()
    return gloo
