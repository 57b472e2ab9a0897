"""`nki.jit`, kernel launch (`kernel[grid](...)`) and the entry points AWS's tests call: `nki.simulate`,
`nki.simulate_kernel`, `nki.cpu_simulate`, `nki.baremetal`, `nki.benchmark`, `nki.profile`.

A launch copies array arguments into simulated HBM, runs the kernel function once per program of
the grid (its Python executes the instructions), writes HBM arguments the kernel wrote back into
the caller's arrays/tensors (in place), and converts the returned HBM tensors: torch tensors on
the first torch input's device if any input was a torch tensor, else JAX arrays if any input was a
JAX array (AWS's `nki.jit` runs a kernel called with JAX arrays through JAX), NumPy arrays otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import sys

import ml_dtypes
import numpy as np

from . import dtypes as _dt
from .blas import single_threaded
from .cores import Cores
from .cost import BenchmarkResult, estimate, schedule
from .errors import NKIError
from .runtime import Run, active, set_run
from .targets import get_target
from .v0_1 import LoopTrace, written_for_nki_0_1
from .tensor import Allocation, NkiTensor, shared_hbm
from .typing import TensorSpec


class Kernel:
    """A kernel made by `nki.jit`: call it to simulate, index it (`kernel[grid]`) to launch a grid."""

    def __init__(self, func, **options):
        if isinstance(func, Kernel):
            func = func.func
        if not callable(func):
            raise TypeError(f"nki.jit expects a function, got {type(func).__name__}")
        self.func = func
        self.options = options
        self.last_trace = None  # instruction records of the latest launch (see Instr.as_dict)
        self.last_run = None
        functools.update_wrapper(self, func)

    def __getitem__(self, grid) -> "Launcher":
        return Launcher(self, _normalize_grid(grid))

    def __call__(self, *args, **kwargs):
        return Launcher(self, ())(*args, **kwargs)

    def __repr__(self):
        return f"<nki kernel {self.__name__}>"


class Launcher:
    """`kernel[grid]`: calling it runs every program of the grid."""

    def __init__(self, kernel: Kernel, grid: tuple):
        self.kernel = kernel
        self.grid = grid

    def __call__(self, *args, **kwargs):
        if active() is not None and not self.grid:
            # A kernel called from inside a running kernel is inlined, like any helper function.
            return self.kernel.func(*args, **kwargs)
        outputs, _ = launch(self.kernel, self.grid, args, kwargs)
        return outputs


def jit(func=None, **options):
    """Make an NKI kernel; usable as `@nki.jit`, `@nki.jit()` or `nki.jit(fn)`.

    Options are kept in `kernel.options`; `platform_target="trn3"` sets the kernel's default target,
    others (`mode`, ...) are accepted and ignored: every launch is simulated."""
    if func is None:
        return lambda f: Kernel(f, **options)
    return Kernel(func, **options)


def _normalize_grid(grid) -> tuple:
    if isinstance(grid, (int, np.integer)):
        grid = (int(grid),)
    try:
        grid = tuple(int(g) for g in grid)
    except TypeError:
        raise NKIError("kernel[grid]", f"grid must be an int or a tuple of ints, got {grid!r}") from None
    if any(g < 1 for g in grid):
        raise NKIError("kernel[grid]", f"grid {grid} has a dimension < 1")
    return grid


def _as_kernel(kernel) -> tuple[Kernel, tuple]:
    if isinstance(kernel, Launcher):
        return kernel.kernel, kernel.grid
    if isinstance(kernel, Kernel):
        return kernel, ()
    return Kernel(kernel), ()


# ---------------------------------------------------------------------------- arguments
def _is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_jax_array(x) -> bool:
    """A JAX array, without importing JAX (only a caller that made one has it loaded)."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, getattr(jax, "Array", ()))


def _to_jax(value):
    """The NumPy outputs of a launch as JAX arrays (the same dtypes: JAX uses ml_dtypes' too)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_to_jax(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_jax(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        import jax.numpy as jnp
        return jnp.asarray(value)
    return value


def _torch_to_numpy(t, index):
    import torch

    t = t.detach()
    if t.dtype == torch.float64 or t.dtype == torch.int64 or t.dtype.is_complex:
        raise NKIError("kernel argument", f"argument {index} has dtype {t.dtype}, which NKI does not support",
                       "cast it to float32 / int32 (or bfloat16) before the call")
    t = t.cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).copy()
    if t.dtype == torch.float8_e5m2:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e5m2).copy()
    return t.numpy().copy()


def _numpy_to_torch(arr: np.ndarray, device):
    import torch

    arr = np.ascontiguousarray(arr)
    if arr.dtype == _dt.bfloat16:
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    elif arr.dtype == _dt.float8_e4m3fn:
        t = torch.from_numpy(arr.view(np.uint8)).view(torch.float8_e4m3fn)
    elif arr.dtype == _dt.float8_e4m3:
        raise NKIError("kernel return", "nl.float8_e4m3 (IEEE-like E4M3, max 240) has no torch dtype",
                       "return nl.float8_e4m3fn (torch.float8_e4m3fn), bfloat16 or float32")
    elif arr.dtype == _dt.float8_e5m2:
        t = torch.from_numpy(arr.view(np.uint8)).view(torch.float8_e5m2)
    else:
        t = torch.from_numpy(arr)
    return t.to(device) if device is not None and str(device) != "cpu" else t


def _to_hbm(x, index):
    """(NkiTensor in HBM, original) for array arguments; None for pass-through arguments."""
    if _is_torch_tensor(x):
        arr = _torch_to_numpy(x, index)
    elif isinstance(x, TensorSpec):
        arr = np.zeros(x.shape, _dt.storage_dtype(x.dtype))
    elif isinstance(x, np.ndarray):
        arr = np.array(x, copy=True, order="C")
    elif _is_jax_array(x):
        arr = np.array(x, copy=True, order="C")  # a host copy: JAX arrays are immutable
    else:
        return None
    try:
        dtype = _dt.normalize(arr.dtype, "kernel argument")
    except NKIError:
        raise NKIError("kernel argument", f"argument {index} has dtype {arr.dtype}, which NKI does not support",
                       "cast it to float32 / int32 (or bfloat16) before the call") from None
    # Named after the kernel's parameter, so that error messages name the tensor the kernel indexes.
    alloc = Allocation(arr.shape, dtype, shared_hbm, name=index if isinstance(index, str) else f"arg{index}",
                       storage=arr)
    return NkiTensor(alloc, alloc.storage)


def _write_back(original, tensor: NkiTensor):
    if isinstance(original, TensorSpec):
        return  # a placeholder has no caller's array to update
    if _is_jax_array(original):
        raise NKIError("kernel argument", "the kernel wrote to a JAX array argument, and JAX arrays are immutable",
                       "return the result from the kernel (nl.ndarray(..., buffer=nl.shared_hbm)), or pass a "
                       "NumPy array or torch tensor to be written in place")
    if _is_torch_tensor(original):
        import torch

        with torch.no_grad():
            original.copy_(_numpy_to_torch(tensor.alloc.storage, None).to(original.device))
    elif original.flags.writeable:
        original[...] = tensor.alloc.storage
    else:
        raise NKIError("kernel argument", "the kernel wrote to a read-only NumPy argument",
                       "pass a writeable array")


def _convert_output(value, torch_device, torch_mode):
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return type(value)(_convert_output(v, torch_device, torch_mode) for v in value)
    if isinstance(value, dict):
        return {k: _convert_output(v, torch_device, torch_mode) for k, v in value.items()}
    if isinstance(value, NkiTensor):
        if value.buffer.on_chip:
            raise NKIError("kernel return", f"the kernel returned a tensor in {value.buffer!r}",
                           "return HBM tensors: nl.ndarray(..., buffer=nl.shared_hbm) written with nl.store")
        arr = np.array(value.data, copy=True)
        if _dt.is_packed(value.dtype):  # packed MX containers, tagged with their type (dtypes.PackedX4.host)
            arr = arr.view(value.dtype.storage if torch_mode else value.dtype.host)
        return _numpy_to_torch(arr, torch_device) if torch_mode else arr
    return value


# ---------------------------------------------------------------------------- launch
def _convert_argument(value, index, pairs):
    tensor = _to_hbm(value, index)
    if tensor is None:
        return value
    pairs.append((value, tensor))
    return tensor


def launch(kernel: Kernel, grid: tuple, args, kwargs, target=None):
    """Run `kernel` over `grid`; returns (converted outputs, the Run with its trace).

    Target: the argument, else the kernel's `platform_target` jit option, else the environment."""
    run = Run(get_target(target or kernel.options.get("platform_target")), grid)
    torch_inputs = [a for a in itertools.chain(args, kwargs.values()) if _is_torch_tensor(a)]
    torch_device = torch_inputs[0].device if torch_inputs else None
    observed = _observe().work("nki", kernel.func.__name__, torch_device.index or 0, grid=list(run.grid),
                               objects={"estimates": lambda: _estimates(run)}) \
        if torch_device is not None and torch_device.type == "neuron" else contextlib.nullcontext()
    with observed as work:  # device work on neuron tensors: the audit and torch.profiler may listen
        converted = _simulate(kernel, grid, run, args, kwargs, bool(torch_inputs), torch_device)
        if work is not None:
            work.args.update(instructions=len(run.trace), simulated_target=run.target.name)
    return converted, run


class _Programs:
    """One launch's programs, ready to run: arguments converted into simulated HBM, one forked Run
    per program of the grid (each a NeuronCore with its own on-chip memory and registers)."""

    def __init__(self, kernel: Kernel, grid: tuple, run: Run, args, kwargs, world_rank=0, world_size=1):
        self.kernel, self.grid, self.run = kernel, grid, run
        self.pairs = []  # (caller's array or tensor, its HBM copy) for the write-back
        names = _parameter_names(kernel.func)
        self.args = [_convert_argument(a, names[i] if i < len(names) else i, self.pairs) for i, a in enumerate(args)]
        self.kwargs = {k: _convert_argument(v, k, self.pairs) for k, v in kwargs.items()}
        self.programs = [run.fork(pid, core) for core, pid in enumerate(itertools.product(*(range(g) for g in grid)))] \
            if grid else [run]
        nki_0_1 = written_for_nki_0_1(kernel.func)
        for program in self.programs:
            program.world_rank, program.world_size = world_rank, world_size
            program.nki_0_1 = nki_0_1
            program.loop_trace = LoopTrace() if nki_0_1 else None

    def bodies(self, cores: Cores, first: int) -> list:
        """The programs' bodies for `cores`, whose programs `first`, first + 1, ... they are."""
        self.run.launch.cores = cores
        bodies = []
        for i, program in enumerate(self.programs):
            program.gid = first + i
            bodies.append(self._body(program))
        return bodies

    def _body(self, program):
        def execute():
            previous = set_run(program)
            try:
                result = self.kernel.func(*self.args, **self.kwargs)
                program.check_capacity()
                return result
            finally:
                set_run(previous)
        return execute

    def settle(self) -> None:
        """After the programs ran (or failed): the launch's state, for kernel.last_run."""
        run = self.run
        if self.grid:
            run.peak_sbuf = max(p.peak_sbuf for p in self.programs)
            run.peak_psum_banks = max(p.peak_psum_banks for p in self.programs)
        self.kernel.last_trace = run.trace
        self.kernel.last_run = run

    def finish(self, result, torch_mode: bool, torch_device):
        for original, tensor in self.pairs:
            if tensor.alloc.written:
                _write_back(original, tensor)
        _record_aliases(self.run, self.pairs, result)
        converted = _convert_output(result, torch_device, torch_mode)
        if not torch_mode and any(_is_jax_array(original) for original, _ in self.pairs):
            converted = _to_jax(converted)  # JAX arguments: JAX results, as AWS's JAX drivers expect
        return converted


def _simulate(kernel: Kernel, grid: tuple, run: Run, args, kwargs, torch_mode: bool, torch_device):
    """Every program of the grid in the simulator; the outputs converted back. The programs run
    concurrently, taking turns (cores.Cores), so that core_barrier / sendrecv work."""
    launch = _Programs(kernel, grid, run, args, kwargs)
    cores = Cores(len(launch.programs))
    try:
        with single_threaded():
            results = cores.run(launch.bodies(cores, 0))
    finally:
        launch.settle()
    return launch.finish(results[-1], torch_mode, torch_device)


def multi_rank_simulate(kernel, *, world_size: int, per_rank_inputs) -> list:
    """AWS's `nki.multi_rank_simulate(kernel, world_size=N, per_rank_inputs=...)`: run the kernel
    on N ranks in one process, so that its `nki.collectives` calls communicate; rank r runs
    `kernel(*args, **kwargs)` with its `(args, kwargs)` pair (`per_rank_inputs`: a sequence in rank
    order, or a mapping with the keys 0 .. N-1). Returns the ranks' outputs, in rank order.

    As AWS documents, every rank runs the same specialization: array arguments may differ in
    contents but not in shape or dtype, other arguments must be equal on every rank. `kernel[lnc]`
    runs each rank on `lnc` cores. Each rank has its own HBM (arguments, shared_hbm outputs) and
    trace (`kernel.last_run` / `last_trace` are the last rank's); all ranks' cores take turns in
    one scheduler (cores.Cores)."""
    k, grid = _as_kernel(_launchable(kernel))
    instr = "nki.multi_rank_simulate"
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise NKIError(instr, f"world_size must be a positive integer, got {world_size!r}")
    pairs = _rank_inputs(per_rank_inputs, int(world_size), instr)
    target = get_target(k.options.get("platform_target"))
    launches = []
    torch_modes = []
    for rank, (args, kwargs) in enumerate(pairs):
        inputs = [a for a in itertools.chain(args, kwargs.values()) if _is_torch_tensor(a)]
        torch_modes.append((bool(inputs), inputs[0].device if inputs else None))
        launches.append(_Programs(k, grid, Run(target, grid), args, kwargs, rank, int(world_size)))
    total = sum(len(launch.programs) for launch in launches)
    cores = Cores(total, lnc=len(launches[0].programs), world_size=int(world_size))
    bodies = []
    for launch in launches:
        bodies += launch.bodies(cores, len(bodies))
    try:
        with single_threaded():
            results = cores.run(bodies)
    finally:
        for launch in launches:
            launch.settle()
    outputs = []
    for rank, launch in enumerate(launches):
        last = (rank + 1) * len(launch.programs) - 1
        outputs.append(launch.finish(results[last], *torch_modes[rank]))
    return outputs


def _rank_inputs(per_rank_inputs, world_size: int, instr) -> list:
    """per_rank_inputs as a list of (args tuple, kwargs dict) in rank order, checked as AWS
    documents: the same parameters, array shapes and dtypes, and equal other arguments."""
    if isinstance(per_rank_inputs, dict):
        if sorted(per_rank_inputs) != list(range(world_size)):
            raise NKIError(instr, f"per_rank_inputs has the keys {sorted(per_rank_inputs)}; it needs one for each "
                           f"rank 0 .. {world_size - 1}")
        items = [per_rank_inputs[r] for r in range(world_size)]
    else:
        items = list(per_rank_inputs)
        if len(items) != world_size:
            raise NKIError(instr, f"per_rank_inputs has {len(items)} entries for world_size={world_size}",
                           "give one (args, kwargs) pair per rank")
    pairs = []
    for rank, item in enumerate(items):
        try:
            args, kwargs = item
            args, kwargs = tuple(args), dict(kwargs)
        except (TypeError, ValueError):
            raise NKIError(instr, f"per_rank_inputs[{rank}] must be an (args tuple, kwargs dict) pair, got "
                           f"{type(item).__name__}") from None
        pairs.append((args, kwargs))

    def signature(args, kwargs):
        def one(v):
            if isinstance(v, np.ndarray) or _is_torch_tensor(v):
                return ("array", tuple(v.shape), str(v.dtype))
            return ("value", v)
        return [one(a) for a in args], {k: one(v) for k, v in sorted(kwargs.items())}

    first = signature(*pairs[0])
    for rank, (args, kwargs) in enumerate(pairs[1:], 1):
        other = signature(args, kwargs)
        if len(other[0]) != len(first[0]) or sorted(other[1]) != sorted(first[1]):
            raise NKIError(instr, f"rank {rank} passes other parameters than rank 0",
                           "every rank runs the same kernel: pass the same parameters")
        for name, a, b in [(i, x, y) for i, (x, y) in enumerate(zip(first[0], other[0]))] + \
                [(n, first[1][n], other[1][n]) for n in first[1]]:
            try:
                same = a == b
                same = bool(same) if not isinstance(same, np.ndarray) else bool(same.all())
            except Exception:  # noqa: BLE001 - objects without a usable ==
                same = a is b
            if not same:
                what = "arrays must have the same shape and dtype" if a[0] == b[0] == "array" else \
                    "non-array arguments are static and must be equal"
                raise NKIError(instr, f"argument {name!r} differs between rank 0 ({a[1:] if a[0] == 'array' else a[1]!r}) "
                               f"and rank {rank} ({b[1:] if b[0] == 'array' else b[1]!r}): {what} on every rank (AWS)")
    return pairs


def _record_aliases(run: Run, pairs, result) -> None:
    """For callers that must know the kernel's effects (torch_neuronx.custom_op's traced
    launch): which arguments it wrote (`run.written_args`: the caller's objects), and for
    each returned leaf, in _output_leaves order, the argument it is, or None for a new
    tensor (`run.returned_args`)."""
    by_alloc = {id(tensor.alloc): original for original, tensor in pairs}
    run.written_args = [original for original, tensor in pairs if tensor.alloc.written]
    run.returned_args = [by_alloc.get(id(leaf.alloc)) if isinstance(leaf, NkiTensor) else None
                         for leaf in _output_leaves(result)]


def _output_leaves(value) -> list:
    """The leaves of a kernel's return value, in _convert_output's order."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _output_leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _output_leaves(v)]
    return [] if value is None else [value]


def _parameter_names(func) -> list:
    """The positional parameter names of a kernel function (none for builtins and the like)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _observe():
    """torch_neuronx.observe, imported when a launch has neuron tensors (the
    simulator itself does not need torch)."""
    from torch_neuronx import observe

    return observe


def _estimates(run: Run) -> dict:
    """The cost model's estimate of a launch on each generation (the same instruction
    trace scheduled for trn2 and trn3), computed only for an observer that asks."""
    return {f"estimated_{name}_us": round(schedule(run.trace, get_target(name)).latency_us, 3)
            for name in ("trn2", "trn3")}


def simulate(kernel):
    """`nki.simulate(kernel)(*args)`, `nki.simulate(kernel[grid])(*args)`: run the kernel in the
    simulator; NumPy arrays in, NumPy arrays out (torch tensors in, torch tensors out)."""
    k, grid = _as_kernel(kernel)
    return lambda *args, **kwargs: launch(k, grid, args, kwargs)[0]


def simulate_kernel(kernel, *args, **kwargs):
    """Old-style `nki.simulate_kernel(kernel[grid], *args)`: simulate it once, return its outputs."""
    return simulate(kernel)(*args, **kwargs)


def _launchable(kernel):
    """A Kernel or Launcher for `kernel`: a plain function is wrapped as `nki.jit` would."""
    return kernel if isinstance(kernel, (Kernel, Launcher)) else Kernel(kernel)


def cpu_simulate(kernel):
    """nki-library's `nki.cpu_simulate(kernel)[lnc](**inputs)`: index with the logical NeuronCore
    count (the launch grid), call to simulate."""
    return _launchable(kernel)


def baremetal(kernel=None, **options):
    """`@nki.baremetal(...)` / `nki.baremetal(kernel)`: on hardware, compile the kernel and run it on a
    NeuronCore without a framework (NumPy in and out). Here calling it simulates it. Options
    (`save_neff_name`, `save_trace_name`, `additional_compile_opt`, ...) name compiler and
    profiler artifacts that the simulator does not produce; they are accepted and ignored."""
    if kernel is None:
        return lambda k: baremetal(k, **options)
    return _launchable(kernel)


class Benchmarked:
    """`nki.benchmark(...)(kernel)`: calling it (or `bench[grid]`) simulates the kernel, schedules
    its trace with the cost model, returns the BenchmarkResult and keeps it as `.benchmark_result`
    (AWS's attribute: `bench.benchmark_result.nc_latency.get_latency_percentile(99)`)."""

    def __init__(self, kernel: Kernel, grid: tuple, target=None, parent=None):
        self.kernel = kernel
        self.grid = grid
        self.target = target
        self.benchmark_result = None
        self._parent = parent  # `bench[grid](...)` also sets `bench.benchmark_result`, as AWS's tests read it

    def __getitem__(self, grid) -> "Benchmarked":
        return type(self)(self.kernel, _normalize_grid(grid), self.target, parent=self)

    def __call__(self, *args, **kwargs) -> BenchmarkResult:
        tgt = get_target(self.target or self.kernel.options.get("platform_target"))
        outputs, r = launch(self.kernel, self.grid, args, kwargs, target=tgt)
        result = estimate(r.trace, tgt.name, outputs)
        node = self
        while node is not None:
            node.benchmark_result = result
            node = node._parent
        return result


def benchmark(kernel=None, target=None, warmup=None, iters=None, **_ignored):
    """`nki.benchmark(kernel, target=...)(*args)` -> BenchmarkResult with the estimated latency; also
    AWS's decorator form `nki.benchmark(warmup=5, iters=10)(kernel)` (see Benchmarked).

    The kernel is simulated with that target's capacity rules, then its trace is scheduled by the
    cost model: the latency is an estimate, not a measurement. `target`: "trn2" or "trn3"; None
    means the kernel's `platform_target`, else NEURON_PLATFORM_TARGET_OVERRIDE (default trn2).
    `warmup` / `iters` and AWS's other options (`save_neff_name`, `save_trace_name`, ...) are
    accepted and ignored: the estimate is deterministic, every run gives the same number.
    """
    if kernel is None:
        return lambda k: benchmark(k, target, warmup, iters)
    k, grid = _as_kernel(kernel)
    get_target(target)  # an unknown target fails here, at the call naming it
    return Benchmarked(k, grid, target)


class Profiled(Benchmarked):
    """`nki.profile(...)(kernel)`: calling it simulates the kernel and returns its outputs; with a
    `working_directory`, writes there `<trace name>.json`: the cost model's summary and the
    instruction trace (the emulator has no NEFF/NTFF to save)."""

    directory = None
    trace_name = "profile.ntff"
    overwrite = False

    def __call__(self, *args, **kwargs):
        result = super().__call__(*args, **kwargs)
        if self.directory is not None:
            _write_profile(result, self.kernel, self.directory, self.trace_name, self.overwrite)
        return result.outputs

    def __getitem__(self, grid) -> "Profiled":
        child = super().__getitem__(grid)
        child.directory, child.trace_name, child.overwrite = self.directory, self.trace_name, self.overwrite
        return child


def profile(func=None, working_directory=None, save_trace_name=None, overwrite=False, **_ignored):
    """AWS's `@nki.profile(working_directory=..., save_trace_name=...)`; see Profiled. Its other
    options (`save_neff_name`, `profile_nth`, `additional_compile_opt`) are accepted and ignored."""
    if func is None:
        return lambda f: profile(f, working_directory, save_trace_name, overwrite)
    k, grid = _as_kernel(func)
    profiled = Profiled(k, grid)
    profiled.directory = working_directory
    profiled.trace_name = save_trace_name or Profiled.trace_name
    profiled.overwrite = overwrite
    return profiled


def _write_profile(result: BenchmarkResult, kernel: Kernel, directory, trace_name, overwrite) -> None:
    import json
    import os

    path = os.path.join(directory, os.path.splitext(os.path.basename(trace_name))[0] + ".json")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"nki.profile: {path} exists; pass overwrite=True to replace it")
    os.makedirs(directory, exist_ok=True)
    record = {"kernel": kernel.func.__name__, "summary": result.summary(), "target": result.target,
              "latency_us": result.latency_us, "engines_us": result.engines,
              "instructions": [ins.as_dict() for ins in result.trace]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, default=str)
