"""Warm starts that skip AOTAutograd: the disk cache of its results.

Between Dynamo and this backend, AOTAutograd turns each Dynamo graph into a
forward and a backward graph (tracing the joint graph, functionalizing,
partitioning): about half a second for a transformer block, paid again by every
process. This module stores AOTAutograd's result per Dynamo graph. A process
that meets a graph seen before (same code, constants, input metadata, global
state and versions; see `key`) loads it instead of tracing: the runtime
metadata and wrappers AOTAutograd built, and the compiled forward and backward
graphs, whose executables then come from the executable cache (cache.py).

PyTorch's AOTAutogradCache builds the entries and re-wraps them on a hit (its
"bundled" form, where the compiled graphs are pickled whole; ours pickle as
their FX graph, node by node: executable.CompiledGraph.__getstate__, fx_pickle.py).
What this module supplies: the key, computed without Inductor's (whose
computation imports Inductor's code generators, over a second); the storage,
cache.py's checksummed entries under TORCH_NEURONX_NEFF_CACHE_DIR; and
`enabled()`, which routes AOTAutogradCache's load and save to both for the
duration of one of this backend's compiles, leaving every other backend's
caching as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import pickle
import sys
import time

import torch

from torch_neuronx.compiler import cache, metrics
from torch_neuronx.log import get_logger

_log = get_logger("compiler")
_SUFFIX = ".aot"


class _Uncacheable(Exception):
    """The graph's behaviour is not decided by what the key covers."""


# Control-flow higher-order ops (PyTorch's own cache refuses them, as its key
# would not cover their subgraphs; this key does).
_CONTROL_FLOW = {torch.ops.higher_order.cond, torch.ops.higher_order.while_loop, torch.ops.higher_order.scan,
                 torch.ops.higher_order.map_impl, torch.ops.higher_order.invoke_subgraph}


def _check_cacheable(node: torch.fx.Node, value) -> None:
    """Raises _Uncacheable for a node whose meaning the key would not cover."""
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_node_safe

    if node.op == "call_module":  # its parameters would not be in the key
        raise _Uncacheable(f"graph calls module {node.target}")
    if not (node.op == "call_function" and node.target in _CONTROL_FLOW):  # their subgraphs are digested
        try:
            check_node_safe(node)  # only ops whose meaning their name decides
        except BypassAOTAutogradCache as error:
            raise _Uncacheable(str(error).splitlines()[0]) from None
    if node.op == "get_attr" and not isinstance(value, torch.fx.GraphModule) \
            and type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise _Uncacheable(f"constant {node.target} of type {type(value).__name__}")


def _graph_digest(gm: torch.fx.GraphModule, digest) -> None:
    """The code of a Dynamo graph, its tensor constants, and its subgraphs
    (bodies of higher-order ops such as checkpoint), recursively, refusing
    what the key would not cover."""
    cache.update_with_graph(digest, gm, _check_cacheable)


def _inputs_digest(args, digest) -> None:
    """Metadata of every input that AOTAutograd's result depends on, including
    which inputs share storage (aliasing changes the wrappers it builds)."""
    from torch._subclasses.fake_tensor import FakeTensor

    storages: dict[int, int] = {}
    for index, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            if type(value) not in (FakeTensor, torch.Tensor, torch.nn.Parameter):
                raise _Uncacheable(f"input {index} is a {type(value).__name__}")
            storage = storages.setdefault(value.untyped_storage()._cdata, index)
            digest.update(repr((
                "tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype,
                value.device.type, value.layout, value.requires_grad, value.is_leaf,
                isinstance(value, torch.nn.Parameter), value.is_conj(), value.is_neg(),
                value.is_inference(), storage,
            )).encode())
        elif value is None or type(value) in (bool, int, float):
            digest.update(repr((type(value).__name__, value)).encode())
        else:
            raise _Uncacheable(f"input {index} is a {type(value).__name__}")


def _state_digest(aot_config, digest) -> None:
    """Global state and settings that AOTAutograd's tracing reads, and whether the
    instance profile has FP8 compute: a hit skips the backend's graph checks, so a
    graph with _scaled_mm compiled on trn3 must not load on trn2 (compiler/float8.py)."""
    import torch._functorch.config as functorch_config

    from torch_neuronx.ops import float8

    autocast = [
        (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        for device in sorted(set(torch._C._autocast_supported_devices()) | {"neuron"})
    ]
    digest.update(repr((
        sys.version, torch.__version__, torch.version.git_version, torch.is_grad_enabled(), autocast,
        torch.are_deterministic_algorithms_enabled(), torch.get_default_dtype(),
        aot_config.num_params_buffers, aot_config.keep_inference_input_mutations, aot_config.is_export,
        aot_config.no_tangents, aot_config.dynamic_shapes, aot_config.static_input_indices,
        float8.has_fp8_compute(),
    )).encode())
    digest.update(functorch_config.save_config())


def key(gm: torch.fx.GraphModule, args, aot_config, act_input_paths=()) -> str | None:
    """The entry name of a Dynamo graph's AOTAutograd result, or None when the
    graph cannot be cached (an unknown Python function in it, a tensor subclass
    input, ...): then AOTAutograd runs as usual."""
    digest = hashlib.sha256(b"aot-result")
    try:
        _graph_digest(gm, digest)
        _inputs_digest(args, digest)
    except _Uncacheable as why:
        _log.debug("AOTAutograd result not cached: %s", why)
        return None
    _state_digest(aot_config, digest)
    digest.update(repr(tuple(act_input_paths)).encode())
    return cache.graph_key([digest.digest()])


def _try_load(mod, args, aot_config, compiler_config_extra, local, remote, act_input_paths=(),
              compile_region_name=None):
    """AOTAutogradCache.try_load while one of this backend's compiles runs. PyTorch 2.14 passes
    ``act_input_paths`` (part of its own key, so of ours); 2.13 has no such argument."""
    from torch._functorch._aot_autograd.autograd_cache import create_fx_config
    from torch._functorch._aot_autograd.schemas import AOTAutogradCacheInfo
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from torch._dynamo.utils import GmWrapper

    gm = mod.gm if isinstance(mod, GmWrapper) else mod  # Dynamo wraps graphs with list inputs
    entry_key = key(gm, args, aot_config, act_input_paths)
    if entry_key is None:
        return None, aot_config
    payload = cache.load_bytes(entry_key, _SUFFIX)
    if payload is not None:
        metrics.warm_start(aot_config.aot_id)  # names the metrics records of the graphs it holds
        try:
            with unset_fake_temporarily():
                entry = pickle.loads(payload)
            compiled = entry.wrap_post_compile(args, aot_config, create_fx_config(compiler_config_extra,
                                                                                  compile_region_name))
        except Exception as error:  # written by another build: same as a corrupted entry
            cache.discard(entry_key, _SUFFIX, f"could not be loaded ({type(error).__name__}: {error})")
        else:
            metrics.record_cache_hit("aot")
            # The graphs arrive from the entry instead of from AOTAutograd.
            for kind in ("forward", "backward") if entry.compiled_bw is not None else ("inference",):
                metrics.record_graph(kind)
            return compiled, aot_config
    info = AOTAutogradCacheInfo(entry_key, time.time_ns(), forward_symints=[])
    return None, dataclasses.replace(aot_config, cache_info=info)


def _save(entry_key: str, entry, remote: bool = False) -> None:
    """AOTAutogradCache.save while one of this backend's compiles runs. Graphs
    that do not pickle (run eagerly, split around custom ops) or carry effect
    tokens are not stored."""
    from torch.utils._python_dispatch import _disable_current_modes

    if entry.runtime_metadata.tokens:
        # Effect tokens (linalg error checks): the token count does not survive
        # pickling, and a hit would call the graph without its token input.
        _log.debug("AOTAutograd result not cached: the graph has effect tokens")
        return
    try:
        entry.pre_save()
        with _disable_current_modes():
            payload = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as why:
        # RuntimeError: pybind11's refusal, e.g. for an OpOverload held as a node's argument
        # (the ops activation checkpointing wraps in run_and_save_rng_state)
        _log.debug("AOTAutograd result not cached: %s", why)
        return
    cache.store_bytes(entry_key, _SUFFIX, payload)


@contextlib.contextmanager
def enabled():
    """Routes AOTAutogradCache's load and save to this module during one of
    this backend's compiles (Dynamo compiles one frame at a time, under its
    compile lock). The backward graph is handed to the backend right away
    instead of at the first backward call, so that the entry (which holds
    both) is complete when the compile ends; compiling a graph here costs no
    XLA compile, which runs at the graph's first call."""
    import torch._functorch.config as functorch_config
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    if cache.cache_dir() is None or torch.compiler.config.force_disable_caches:
        yield
        return
    saved = AOTAutogradCache.__dict__["try_load"], AOTAutogradCache.__dict__["save"]
    AOTAutogradCache.try_load, AOTAutogradCache.save = staticmethod(_try_load), staticmethod(_save)
    try:
        with functorch_config.patch(enable_autograd_cache=True, force_autograd_cache=True,
                                    bundled_autograd_cache=True, force_non_lazy_backward_lowering=True):
            yield
    finally:
        AOTAutogradCache.try_load, AOTAutogradCache.save = saved
