"""One FX graph (ATen level, after AOTAutograd) -> one jax.jit function -> an
XLA executable, run with inputs and outputs exchanged by DLPack.

The graph is traced through the lowering table under jax.jit, so the whole
graph becomes a single StableHLO module. Executables are cached in memory by
(graph identity, input signature) and on disk by torch_neuronx.compiler.cache,
whose hits skip tracing and lowering.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import pickle
import threading
import time
from dataclasses import dataclass

import torch
import torch.fx
from torch._inductor.output_code import OutputCode

from torch_neuronx.compiler import artifacts, cache, metrics
from torch_neuronx.compiler.errors import NeuronCompileError

_EXECUTABLES: dict[tuple, object] = {}
_EXECUTABLES_LOCK = threading.Lock()


@dataclass
class UnloweredOp:
    op: str
    source: str
    value_dependent: bool = False  # it makes a size or a Python value out of tensor values


def _source_line(node: torch.fx.Node) -> str:
    """Where the node's op was called: the innermost frame of its recorded
    Python stack, or the whole stack with TORCH_NEURONX_ENABLE_STACK_TRACE=1
    (read per compile error, off the hot path)."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [line.strip() for line in trace if line.strip().startswith("File")]
    if not frames:
        return "(no source line recorded)"
    if os.environ.get("TORCH_NEURONX_ENABLE_STACK_TRACE", "0") == "1":
        return "\n      ".join(line.rstrip() for line in trace if line.strip())
    return frames[-1]


def _introduces_value_dependence(node: torch.fx.Node) -> bool:
    """The node makes a symbol out of tensor values, which no input carried:
    a host read (.item(), .tolist(): aten._local_scalar_dense) or an output
    shape decided by the values (nonzero, x[mask], unique, ...). Under
    fullgraph=True Dynamo keeps these in the graph ("unbacked" symbols); a
    static-shape graph cannot hold them."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    def unbacked(value) -> bool:
        return value is not None and bool(free_unbacked_symbols(value))

    return unbacked(node.meta.get("val")) and not any(
        unbacked(n.meta.get("val")) for n in node.all_input_nodes)


def _is_symbolic_arithmetic(node: torch.fx.Node) -> bool:
    """Sizes and arithmetic on symbolic integers (derived from a value-dependent
    op, e.g. the bounds checks of x.split(t.tolist()) or the sym_size of
    nonzero's result): they exist only because of that op, which is what gets
    reported."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))


def unlowered_ops(gm: torch.fx.GraphModule, _seen=None) -> list[UnloweredOp]:
    """The ops of a graph, and of its subgraphs, that cannot be compiled: those
    without a lowering, and those that depend on tensor values."""
    from torch_neuronx.lowering import lookup

    seen = set() if _seen is None else _seen  # a subgraph called at several places is listed once
    missing = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if _introduces_value_dependence(node):
            missing.append(UnloweredOp(str(node.target), _source_line(node), value_dependent=True))
        elif node.target is not torch.ops.aten.copy_.default and lookup(node.target) is None \
                and not _is_symbolic_arithmetic(node):
            missing.append(UnloweredOp(str(node.target), _source_line(node)))
    for node in gm.graph.nodes:
        value = getattr(gm, node.target) if node.op == "get_attr" else None
        if isinstance(value, torch.fx.GraphModule) and id(value) not in seen:
            seen.add(id(value))
            missing += unlowered_ops(value, seen)
    return missing


def run_graph(gm: torch.fx.GraphModule, arrays, replaced=None) -> tuple[object, dict]:
    """Traces an ATen graph through the lowering table with jax values:
    (its outputs, the value of every node). Subgraphs (the branches and bodies
    of control-flow ops such as torch.cond) are passed to their op's lowering
    as functions of jax values. `replaced` maps in-place nodes to the node
    whose value they take."""
    from torch_neuronx import lowering

    env = {}
    placeholders = iter(arrays)
    replaced = replaced or {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = lowering.narrow_input(next(placeholders))
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.fx.GraphModule):
                env[node] = functools.partial(_run_subgraph, value)
            else:  # tensor constants made inside the function
                env[node] = lowering.narrow_input(_as_jax(value.detach().cpu().contiguous()))
        elif node.op == "call_function":
            if node in replaced:
                env[node] = env[replaced[node]]
                continue
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            if node.target is operator.getitem:
                env[node] = args[0][args[1]]
            else:
                env[node] = lowering.lookup(node.target)(*args, **kwargs)
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return torch.fx.node.map_arg(output, lambda n: env[n]), env


def _run_subgraph(gm: torch.fx.GraphModule, *arrays):
    return run_graph(gm, arrays)[0]


def _emulate_fp64() -> bool:
    from torch_neuronx import _C

    return _C._get_fp64_mode() == _C._fp64_modes["emulate"]


def _narrow(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.float32, torch.complex128: torch.complex64}.get(dtype, dtype)


def _uses_rng(gm: torch.fx.GraphModule) -> bool:
    return any(
        node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
        and torch.Tag.nondeterministic_seeded in node.target.tags
        for node in gm.graph.nodes
    )


def _mutations(gm: torch.fx.GraphModule) -> list[tuple[int, torch.fx.Node]]:
    """(input index, new value) for each `copy_` into a graph input: in-place
    updates of inputs kept by AOTAutograd (BatchNorm stats, KV caches)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            dst, src = node.args[0], node.args[1]
            if dst in placeholders:
                found.append((placeholders.index(dst), src, node))
    return found


class CompiledGraph:
    """A graph compiled for the neuron device; called with the list of inputs."""

    def __init__(self, gm: torch.fx.GraphModule, name: str):
        self._setup(gm, name, _graph_identity(gm))
        outputs = self.output_nodes if isinstance(self.output_nodes, (list, tuple)) else [self.output_nodes]
        self.output_dtypes = [
            n.meta["val"].dtype if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)
            else None
            for n in outputs
        ]

    def _setup(self, gm: torch.fx.GraphModule, name: str, key: str) -> None:
        import jax

        from torch_neuronx.lowering import common  # noqa: F401  (jax_enable_x64, as when lowering)

        self.gm = gm
        self.name = name
        self.key = key
        self.uses_rng = _uses_rng(gm)
        self.emulate_fp64 = _emulate_fp64()
        self.mutations = _mutations(gm)
        self.output_nodes = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self._jitted = jax.jit(self._interpret)

    # -- pickling (the AOTAutograd result cache stores compiled graphs) --------
    def __getstate__(self) -> dict:
        # Node metadata (fake tensors) is left behind: the output dtypes read
        # from it are stored as they are, and so is the identity (the key of
        # the graph's executables in the disk cache).
        from torch_neuronx.compiler import fx_pickle

        return {"graph": fx_pickle.dumps_state(self.gm), "name": self.name, "key": self.key,
                "output_dtypes": self.output_dtypes}

    def __setstate__(self, state: dict) -> None:
        from torch_neuronx.compiler import fx_pickle

        self._setup(fx_pickle.loads_state(state["graph"]), state["name"], state["key"])
        self.output_dtypes = state["output_dtypes"]

    # -- tracing ---------------------------------------------------------------
    def _interpret(self, seed, *arrays):
        from torch_neuronx import lowering

        replaced = {node: src for _, src, node in self.mutations}
        with lowering.rng_scope(seed), lowering.fp64_rule(self.emulate_fp64):
            outputs, env = run_graph(self.gm, arrays, replaced)
            written = [env[src] for _, src, _ in self.mutations]
        return outputs, written

    # -- running ---------------------------------------------------------------
    def __call__(self, args):
        device = _device_of(args)
        arrays = [_jax_input(a, i) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
        seed = _draw_seed(device) if self.uses_rng else 0
        outputs, written = self._executable(seed, arrays)(seed, *arrays)
        for (index, _, _), value in zip(self.mutations, written):
            args[index].copy_(_from_jax(value, device, args[index].dtype))
        single = not isinstance(outputs, (list, tuple))
        converted = [
            _from_jax(o, device, dtype) if o is not None else None
            for o, dtype in zip([outputs] if single else outputs, self.output_dtypes)
        ]
        return converted[0] if single else converted

    def _executable(self, seed, arrays):
        signature = tuple((a.shape, a.dtype) if hasattr(a, "dtype") else a for a in arrays)
        key = (self.key, signature, self.emulate_fp64)
        with _EXECUTABLES_LOCK:
            executable = _EXECUTABLES.get(key)
        if executable is not None:
            metrics.record_cache_hit("memory")
            return executable
        start = time.perf_counter()
        # Graphs with None inputs (effect tokens of linalg error checks) stay out
        # of the disk cache: jax's deserialized executables crash when called
        # with a None argument (jax 0.10.2).
        disk_key = None if any(a is None for a in arrays) else cache.graph_key(
            [self.key.encode(), repr(signature).encode(), bytes([self.emulate_fp64])])
        if artifacts.directory() is not None:
            artifacts.write(self.name, self.gm.code, self._jitted.lower(seed, *arrays).as_text())
        executable = cache.load(disk_key) if disk_key else None  # a hit skips tracing and lowering
        if executable is None:
            executable = self._jitted.lower(seed, *arrays).compile()
            if disk_key:
                cache.store(disk_key, executable)
        metrics.record_compile(time.perf_counter() - start, self.name)
        with _EXECUTABLES_LOCK:
            _EXECUTABLES[key] = executable
        return executable


def _graph_identity(gm: torch.fx.GraphModule) -> str:
    """A digest of what the graph computes: its code, tensor constants and
    subgraphs (cache.update_with_graph)."""
    digest = hashlib.sha256()
    cache.update_with_graph(digest, gm)
    return digest.hexdigest()


def _device_of(args) -> torch.device:
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device
    return torch.device("neuron", torch.neuron.current_device())


def _host_input(tensor: torch.Tensor, index: int) -> torch.Tensor:
    from torch_neuronx import _C

    if tensor.device.type == "neuron":
        tensor = _C._host_alias(tensor)
    elif tensor.device.type == "cpu":
        if os.environ.get("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "0").strip() in ("1", "true", "True"):
            raise RuntimeError(
                f"Input tensor at index {index} is on cpu device, but the compiled graph runs on "
                "neuron. Move it with .to('neuron'), or unset TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY "
                "to let torch_neuronx copy CPU inputs to the device."
            )
    else:
        raise RuntimeError(f"Input tensor at index {index} is on {tensor.device}; expected neuron")
    if tensor.requires_grad:
        tensor = tensor.detach()
    # XLA takes dense, 64-byte aligned buffers without a copy; anything else is
    # copied once here.
    if not tensor.is_contiguous() or tensor.data_ptr() % 64:
        tensor = tensor.contiguous() if tensor.data_ptr() % 64 == 0 else tensor.clone()
    return tensor


_KDL_CPU = 1  # DLPack's device type of host memory


@functools.lru_cache(maxsize=1)
def _jaxlib_dlpack():
    """The jaxlib calls under jax.dlpack, bound to the CPU device: (import, export).

    jax.dlpack.from_dlpack spends ~250 us per array on Python checks around a
    ~15 us import, and torch.from_dlpack(jax_array) ~20 us around a ~2 us export:
    too much for graphs called every step with dozens of inputs and outputs.
    The direct calls move the same buffers without copies (import with
    copy=False: an unaligned buffer raises instead of being copied silently;
    _host_input aligns first). None when this jaxlib lacks them; then the
    public jax.dlpack / torch.from_dlpack functions are used."""
    try:
        from jax._src import xla_bridge
        from jax._src.lib import _jax, jaxlib_extension_version
    except ImportError:
        return None
    if jaxlib_extension_version < 467 or not hasattr(_jax, "buffer_to_dlpack_managed_tensor"):
        return None
    device = xla_bridge.get_backend("cpu").device_from_local_hardware_id(0)
    to_dlpack, from_dlpack = torch.utils.dlpack.to_dlpack, torch._C._from_dlpack
    importer, exporter = _jax.dlpack_managed_tensor_to_buffer, _jax.buffer_to_dlpack_managed_tensor

    def import_array(tensor: torch.Tensor):
        return importer(to_dlpack(tensor), device, None, False, _KDL_CPU)

    def export_array(value) -> torch.Tensor:
        return from_dlpack(exporter(value, stream=None))

    return import_array, export_array


def _as_jax(tensor: torch.Tensor):
    """A jax array over the tensor's bytes (zero-copy for 64-byte aligned dense tensors)."""
    bridge = _jaxlib_dlpack()
    if bridge is not None and tensor.dtype != torch.bool:
        return bridge[0](tensor)
    import jax.dlpack

    return jax.dlpack.from_dlpack(tensor)


# jax arrays over neuron memory, keyed by the bytes they address. Importing a
# buffer costs ~13 us; parameters and optimizer state come back at the same
# address every step. An entry holds no reference to the memory (host views do
# not own it), and it is only used while a live tensor has exactly that
# address, shape, strides and dtype, so it always reads that tensor's bytes.
_IMPORTED: dict[tuple, object] = {}
_IMPORTED_MAX = 4096


def _jax_input(tensor: torch.Tensor, index: int):
    """The jax array a compiled graph reads for one tensor input."""
    if tensor.device.type == "neuron" and tensor.dtype != torch.bool and tensor.data_ptr() % 64 == 0 \
            and tensor.is_contiguous():
        key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype)
        array = _IMPORTED.get(key)
        if array is None:
            if len(_IMPORTED) >= _IMPORTED_MAX:
                _IMPORTED.clear()
            array = _IMPORTED[key] = _as_jax(_host_input(tensor, index))
        return array
    return _as_jax(_host_input(tensor, index))


def _from_jax(value, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    """A neuron tensor that takes over the jax array's buffer (no copy)."""
    from torch_neuronx import _C

    bridge = _jaxlib_dlpack()
    host = bridge[1](value) if bridge is not None else torch.from_dlpack(value)
    tensor = _C._adopt_external(host, device.index or 0)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)  # float64 results computed in float32 (the fp64 rule)
    return tensor


def _draw_seed(device: torch.device) -> int:
    """A fresh seed from the core's default generator, so compiled random ops
    advance (and are reproduced by) the same generator as eager ones."""
    return int(torch.empty((), dtype=torch.int64, device=device).random_(0, 2**31 - 1).item())


class BoxedOutput(OutputCode):
    """What the backend hands AOTAutograd for one graph: a callable taking the
    list of inputs (boxed). An OutputCode, the type AOTAutograd's result cache
    (compiler/aot_cache.py) stores; this base class holds graphs that are not
    stored there (run eagerly, or split around custom ops)."""

    def __init__(self, fn):
        self.fn = fn
        # An instance attribute: wrappers made with functools.wraps (Dynamo's
        # disable() around the backward) copy it, so they are called boxed too.
        self._boxed_call = True

    def __call__(self, args):
        return self.fn(args)

    def __getstate__(self):
        raise pickle.PicklingError("this graph runs outside a single executable; it is not cached")

    def prepare_for_serialization(self) -> None:
        pass

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        pass  # executables are loaded on the first call


class GraphRunner(BoxedOutput):
    """A graph compiled to one executable; it pickles as its CompiledGraph."""

    def __init__(self, compiled: CompiledGraph):
        super().__init__(compiled)
        self.compiled_graph = compiled

    def __getstate__(self):
        return {"compiled_graph": self.compiled_graph}

    def __setstate__(self, state):
        self.__init__(state["compiled_graph"])


def compile_graph(gm: torch.fx.GraphModule, example_inputs, name: str) -> GraphRunner:
    missing = unlowered_ops(gm)
    if missing:
        raise NeuronCompileError(missing)
    return GraphRunner(CompiledGraph(gm, name))
