"""One FX graph (ATen level, after AOTAutograd) -> one jax.jit function -> an
XLA executable, run with inputs and outputs exchanged by DLPack
(lowering/conversions.py).

The graph is traced through the lowering table (lowering/interpreter.py) under
jax.jit, so the whole graph becomes a single StableHLO module. Executables are
cached in memory by (graph identity, input signature) and on disk by
torch_neuronx.compiler.cache, whose hits skip tracing and lowering.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time

import torch
import torch.fx

from torch_neuronx import observe
from torch_neuronx.compiler import artifacts, cache, host_random, metrics
from torch_neuronx.lowering.conversions import from_jax_all, jax_inputs
from torch_neuronx.lowering.interpreter import run_graph

_EXECUTABLES: dict[tuple, object] = {}
_EXECUTABLES_LOCK = threading.Lock()
# Per executable of _EXECUTABLES: (graph_id, lower seconds, compile seconds) of the build that
# produced it, for the metrics record of each graph that uses it (metrics.py).
_BUILDS: dict[tuple, tuple[str, float, float]] = {}


def _emulate_fp64() -> bool:
    from torch_neuronx import _C

    return _C._get_fp64_mode() == _C._fp64_modes["emulate"]


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

    def __init__(self, gm: torch.fx.GraphModule, name: str, draws: list[host_random.Draw]):
        """`draws`: what host_random.split took out of `gm`, drawn at each call."""
        self._setup(gm, name, _graph_identity(gm), draws)
        outputs = self.output_nodes if isinstance(self.output_nodes, (list, tuple)) else [self.output_nodes]
        self.output_dtypes = [
            n.meta["val"].dtype if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)
            else None
            for n in outputs
        ]

    def _setup(self, gm: torch.fx.GraphModule, name: str, key: str, draws: list) -> None:
        import jax

        from torch_neuronx import lowering

        lowering.load()  # jax_enable_x64, as when lowering

        self.gm = gm
        self.name = name
        self.key = key
        self.draws = draws
        self.uses_rng = _uses_rng(gm)
        self.emulate_fp64 = _emulate_fp64()
        self.mutations = _mutations(gm)
        self.output_nodes = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.input_views = _input_views(gm, self.output_nodes, {index for index, _, _ in self.mutations})
        self._recorded: set = set()  # the signatures whose executable has its metrics record
        self._by_signature: dict = {}  # input signature -> executable, this graph's memo of _EXECUTABLES
        # The metrics record's names (set by backend.compile_graph, with the FX passes' time).
        self.naming: dict | None = None

    # -- pickling (the AOTAutograd result cache stores compiled graphs) --------
    def __getstate__(self) -> dict:
        # Node metadata (fake tensors) is left behind: the output dtypes read
        # from it are stored as they are, and so is the identity (the key of
        # the graph's executables in the disk cache).
        from torch_neuronx.compiler import fx_pickle

        return {"graph": fx_pickle.dumps_state(self.gm), "name": self.name, "key": self.key,
                "draws": self.draws, "output_dtypes": self.output_dtypes}

    def __setstate__(self, state: dict) -> None:
        from torch_neuronx.compiler import fx_pickle

        self._setup(fx_pickle.loads_state(state["graph"]), state["name"], state["key"], state.get("draws", []))
        self.output_dtypes = state["output_dtypes"]
        # Loaded from AOTAutograd's disk cache: no FX passes ran in this process.
        self.naming = metrics.naming(self.name, self.gm)

    # -- tracing ---------------------------------------------------------------
    def _interpret(self, layouts, seed, *arrays):
        """`layouts`: per input, None or the permutation that turns the dense
        array passed (the input's bytes in memory order, _dense_layout) back
        into the input; XLA folds it into the ops that read the input."""
        import jax.numpy as jnp

        from torch_neuronx import lowering

        arrays = [a if order is None else jnp.transpose(a, order) for a, order in zip(arrays, layouts)]

        replaced = {node: src for _, src, node in self.mutations}
        ctx = lowering.TraceContext(seed, emulate_fp64=self.emulate_fp64)
        outputs, env = run_graph(self.gm, arrays, ctx, replaced)
        written = [env[src] for _, src, _ in self.mutations]
        if self.input_views:  # made on the host at each call (InputView): XLA neither computes nor copies them
            outputs = [None if i in self.input_views else o for i, o in enumerate(outputs)]
        return outputs, written

    # -- running ---------------------------------------------------------------
    def __call__(self, args):
        device = _device_of(args)
        inputs = host_random.with_draws(self.draws, args, device)
        dense = [_dense_layout(a) if isinstance(a, torch.Tensor) else (a, None) for a in inputs]
        arrays = jax_inputs([value for value, _ in dense])
        seed = _draw_seed(device) if self.uses_rng else 0
        executable = self._executable(seed, arrays, tuple(order for _, order in dense))
        if observe.observed():
            # Observed to the outputs' conversion: XLA runs asynchronously until they are taken.
            with observe.work("graph", self.name, device.index, graph=self.key[:16],
                              objects={"graph": self, "key": id(executable), "executable": executable}):
                converted, single = self._run(executable, seed, arrays, args, device)
        else:  # the arguments of observe.work cost ~3 us per call
            converted, single = self._run(executable, seed, arrays, args, device)
        for position, view in self.input_views.items():
            converted[position] = view.apply(inputs, device)
        return converted[0] if single else converted

    def _run(self, executable, seed, arrays, args, device) -> tuple[list, bool]:
        """The executable run: (its outputs as tensors, whether it has a single output);
        the inputs it writes to (self.mutations) are updated."""
        outputs, written = executable(seed, *arrays)
        if self.mutations:
            targets = [args[index] for index, _, _ in self.mutations]
            for target, value in zip(targets, from_jax_all(written, device, [t.dtype for t in targets])):
                target.copy_(value)
        single = not isinstance(outputs, (list, tuple))
        return from_jax_all([outputs] if single else outputs, device, self.output_dtypes), single

    def _executable(self, seed, arrays, layouts):
        signature = tuple((a.shape, a.dtype) if hasattr(a, "dtype") else a for a in arrays)
        if any(layouts):
            signature += (("layouts", layouts),)
        executable = self._by_signature.get(signature)  # this graph's own: no lock, no shared key
        if executable is None:
            executable = self._by_signature[signature] = self._shared_executable(seed, arrays, layouts, signature)
        else:
            metrics.record_cache_hit("memory")
        return executable

    def _shared_executable(self, seed, arrays, layouts, signature):
        """The executable for `signature`, shared by the graphs with the same code:
        from memory, the disk cache, or compiled."""
        key = (self.key, signature, self.emulate_fp64)
        with _EXECUTABLES_LOCK:
            executable = _EXECUTABLES.get(key)
        if executable is not None:
            metrics.record_cache_hit("memory")
            if signature not in self._recorded:  # compiled for an earlier graph with the same code
                self._record(signature, *_BUILDS[key])
            return executable
        start = time.perf_counter()
        # Graphs with None inputs (effect tokens of linalg error checks) stay out
        # of the disk cache: jax's deserialized executables crash when called
        # with a None argument (jax 0.10.2).
        disk_key = None if any(a is None for a in arrays) else cache.graph_key(
            [self.key.encode(), repr(signature).encode(), bytes([self.emulate_fp64])])
        lowered, lower_seconds = None, 0.0
        if artifacts.directory() is not None:
            lowered, lower_seconds = self._lower(seed, arrays, layouts)
            artifacts.write(self.name, self.gm.code, lowered.as_text())
        # A hit skips tracing and lowering; it reports the times of the build that stored it.
        executable, times = cache.load_entry(disk_key) if disk_key else (None, None)
        if executable is None:
            if lowered is None:
                lowered, lower_seconds = self._lower(seed, arrays, layouts)
            compile_start = time.perf_counter()
            executable = lowered.compile()
            times = (lower_seconds, time.perf_counter() - compile_start)
            if disk_key:
                cache.store(disk_key, executable, times)
        metrics.record_compile(time.perf_counter() - start, self.name)
        graph_id = disk_key or hashlib.sha256(repr(key).encode()).hexdigest()
        build = (graph_id, *(times or (0.0, 0.0)))
        with _EXECUTABLES_LOCK:
            _EXECUTABLES[key] = executable
            _BUILDS[key] = build
        if signature not in self._recorded:
            self._record(signature, *build)
        return executable

    def _lower(self, seed, arrays, layouts):
        """The graph traced through the lowering table to StableHLO, and the seconds it took."""
        import jax

        start = time.perf_counter()
        lowered = jax.jit(functools.partial(self._interpret, layouts)).lower(seed, *arrays)
        return lowered, time.perf_counter() - start

    def _record(self, signature, graph_id: str, lower_seconds: float, compile_seconds: float) -> None:
        """The metrics record of this graph's executable for `signature` (metrics.py), once."""
        with _EXECUTABLES_LOCK:
            if signature in self._recorded:
                return
            self._recorded.add(signature)
        naming = self.naming or {}
        metrics.record_compilation(metrics.NeuronCompilationMetrics(
            graph_id=graph_id,
            graph_name=naming.get("graph_name", self.name),
            model_name=naming.get("model_name", "model_default"),
            has_collectives=bool(naming.get("has_collectives", False)),
            graph_node_count=len(self.gm.graph.nodes),
            torch_neuronx_fx_passes_us=int(naming.get("fx_passes_seconds", 0.0) * 1e6),
            torch_neuronx_lower_us=int(lower_seconds * 1e6),
            torch_neuronx_compile_us=int(compile_seconds * 1e6),
        ))


# Ops whose result reads its input's elements unchanged; applied on the host they make a
# view (reshape: a view where the strides allow one, else a copy with the same values).
_VIEW_OPS = {
    torch.ops.aten.permute.default, torch.ops.aten.t.default, torch.ops.aten.transpose.int,
    torch.ops.aten.expand.default, torch.ops.aten.alias.default, torch.ops.aten.detach.default,
    torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims,
    torch.ops.aten.squeeze.default, torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
    torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
}
_RESHAPES = {torch.ops.aten.view.default: torch.ops.aten.reshape.default,
             torch.ops.aten._unsafe_view.default: torch.ops.aten.reshape.default}


class InputView:
    """A graph output that is a graph input or a chain of view ops on one
    (AOTAutograd saves the inputs and transposed weights of matmuls for the
    backward). XLA would return it as a fresh buffer, copying it (a transposed
    512x512 weight: one 1 MiB copy per step); it is made on the host instead,
    by the same ops on the input tensor, as eager and Inductor make it."""

    def __init__(self, index: int, ops: list[tuple]):
        self.index = index  # the placeholder's position in the graph's inputs
        self.ops = ops  # (op, the arguments after the tensor), applied in order

    def apply(self, inputs, device: torch.device) -> torch.Tensor:
        tensor = inputs[self.index]
        if not isinstance(tensor, torch.Tensor):  # a SymInt input saved for the backward
            return tensor
        if tensor.device != device:  # a CPU input, run on the device (docs/compile.md)
            tensor = tensor.to(device)
        for op, rest in self.ops:
            tensor = _RESHAPES.get(op, op)(tensor, *rest)
        return tensor


def _input_views(gm: torch.fx.GraphModule, outputs, mutated: set[int]) -> dict[int, InputView]:
    """{output position: InputView} for the outputs that only view a tensor
    input the graph does not write to (a written input ends with its new value,
    the output is its old one)."""
    if not isinstance(outputs, (list, tuple)):
        return {}
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    found = {}
    for position, node in enumerate(outputs):
        ops = []
        while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _VIEW_OPS \
                and not node.kwargs and _static(node.args[1:]):
            ops.append((node.target, tuple(node.args[1:])))
            node = node.args[0]
        if isinstance(node, torch.fx.Node) and node in placeholders and placeholders[node] not in mutated:
            found[position] = InputView(placeholders[node], ops[::-1])
    return found


def _dense_layout(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """(a contiguous view of the tensor's bytes, the permutation that gives the
    tensor back from it) for a transposed dense tensor, such as a weight's
    transpose saved for the backward (InputView); (tensor, None) otherwise.
    The graph then reads the bytes where they are instead of a copy made to
    hand XLA a dense buffer (conversions.host_input)."""
    if tensor.dim() < 2 or tensor.is_contiguous():
        return tensor, None
    memory_order = sorted(range(tensor.dim()), key=lambda d: -tensor.stride(d))
    dense = tensor.permute(memory_order)
    if not dense.is_contiguous():
        return tensor, None
    return dense, tuple(memory_order.index(d) for d in range(tensor.dim()))


def _static(args) -> bool:
    """Whether `args` hold no graph values (symbolic sizes): the view is the same at every call."""
    nodes = []
    torch.fx.node.map_arg(args, nodes.append)
    return not nodes


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


def _draw_seed(device: torch.device) -> int:
    """The random key of one run of a graph whose random ops stay in it (their
    parameters are computed in the graph; host_random.py draws the others): the
    next stream of the core's default neuron generator, whose offset advances,
    so torch.manual_seed and torch.neuron.set_rng_state reproduce them."""
    from torch_neuronx import _C

    return _C._next_default_stream(device.index) & (2**63 - 1)
