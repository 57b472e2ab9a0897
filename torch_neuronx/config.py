"""Every environment variable torch_neuronx reads, declared once.

Each variable is a :class:`Variable`: its name, its default, the parser that
turns its text into a value and checks it, when it is read, and its row of
docs/env-vars.md (the page's tables are rendered from here by
scripts/render_env_vars.py; tests/test_config.py fails when the page is stale
and when a module other than this one reads ``os.environ``).
The declaration is the accessor: the rest of the package calls it
(``config.instance()``, ``config.neff_cache_dir()``, ...), never ``os.environ``,
and reads its ``name`` and ``default`` from it.

Nothing is cached: a variable reads the environment each time it is called.
What is read once per process (the instance profile, the fallback and fp64
policies, the integrations switch, ...) is read once because its caller runs
once, when torch_neuronx is imported; what is read per compile or per kernel
launch follows the environment as it is at that moment (tests monkeypatch it).

Rules shared by every variable the project defines (``TORCH_NEURONX_*``,
``NEURON_*``):

- unset, empty or only spaces means the default; surrounding spaces are ignored;
- a flag (on/off variable) is read by :func:`parse_flag`: ``1`` / ``true`` turn
  it on, ``0`` / ``false`` turn it off (any letter case); any other value is an
  error (``ValueError`` naming the variable and the value) raised where the
  variable is read: at import for the variables read at import, at the compile
  or launch that reads it otherwise.

Variables of other tools (``LOCAL_RANK``, ``RANK``, ``XDG_CACHE_HOME``,
``XLA_FLAGS``, ``TORCH_COMPILE_DEBUG``) are read the way their owner defines
them (``TORCH_COMPILE_DEBUG`` as PyTorch reads it: on only when exactly ``1``).

This module imports nothing but the standard library (no torch, no JAX).
"""

from __future__ import annotations

import os
import re
from dataclasses import KW_ONLY, dataclass
from typing import Any, Callable

# --------------------------------------------------------------------- parsers

FLAG_TRUE = ("1", "true")
FLAG_FALSE = ("0", "false")


def parse_flag(name: str, raw: str) -> bool:
    """The one parser of on/off variables: 1/true or 0/false, any case, spaces ignored."""
    value = raw.strip().lower()
    if value in FLAG_TRUE:
        return True
    if value in FLAG_FALSE:
        return False
    raise ValueError(
        f"{name}={raw.strip()!r}: expected '0' or '1' ('false' / 'true' in any letter case "
        "are accepted too)"
    )


def _text(name: str, raw: str) -> str:
    return raw.strip()


def _upper(name: str, raw: str) -> str:
    return raw.strip().upper()


def _verbatim(name: str, raw: str) -> str:
    return raw


def _integer(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _integer_or_none(name: str, raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


LNC_VALUES = (1, 2)  # AWS: "LNC can only be set to 1 or 2" (which platform takes which: neuron.profiles)


def parse_lnc(name: str, raw: str) -> int:
    """NEURON_LOGICAL_NC_CONFIG: physical NeuronCores per logical core, 1 or 2."""
    value = raw.strip()
    if value not in [str(v) for v in LNC_VALUES]:
        raise ValueError(
            f"{name}={value!r} is not valid: use 1 (one physical NeuronCore per logical core) or 2 "
            "(two physical cores form one logical core; the trn2/trn3 default); trn1 accepts only 1.")
    return int(value)


def parse_core_count(name: str, raw: str) -> int:
    """NEURON_RT_NUM_CORES: a count of NeuronCores, 0 meaning all of them."""
    value = raw.strip()
    if not value.isdigit():
        raise ValueError(
            f"{name}={value!r} is not valid: use a number of NeuronCores from 1 to the number the "
            "instance profile has, or 0 for all of them.")
    return int(value)


# The names of the C++ core's FallbackMode and Fp64Mode (csrc/Runtime.h). Spelled
# here because this module cannot import the extension; tests/test_config.py
# checks that _C exports the same names.
FALLBACK_MODES = ("warn", "silent", "error")
FP64_MODES = ("emulate", "native")


def choice_parser(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    """A parser that accepts one of `choices` in any letter case, spaces ignored."""
    def parse_choice(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"{name}={raw.strip()!r}: expected one of {sorted(choices)}")
        return value
    return parse_choice


DEVICE_PROFILE_VALUES = ("0", "1", "model", "session")  # AWS's NEURON_RT_INSPECT_DEVICE_PROFILE


def parse_device_profile(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in DEVICE_PROFILE_VALUES:
        raise ValueError(f"{name}={value!r}: expected 0, 1, model or session")
    return value


def _pytorch_flag(name: str, raw: str) -> bool:
    return raw == "1"


_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)  # 500M, 10GB, 1.5GiB
_UNIT = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
DEFAULT_NEFF_CACHE_MAX_SIZE = 10 * 2**30


def parse_size(name: str, raw: str) -> int | None:
    """Bytes with an optional unit (500M, 10G, 1.5GiB; powers of 1024), or None
    for no limit (-1, unlimited, none)."""
    raw = raw.strip()
    if raw.lower() in ("-1", "unlimited", "none"):
        return None
    match = _SIZE.fullmatch(raw)
    if match is None:
        raise ValueError(
            f"{name}={raw!r} is not a size. Use bytes with an optional "
            "unit (e.g. 500M, 10G, 1.5GiB; K, M, G, T are powers of 1024), or -1 / unlimited for "
            "no limit."
        )
    return int(float(match.group(1)) * _UNIT[match.group(2).lower()])


# ------------------------------------------------------------------- variables

IMPORT = "import"  # read once, when torch_neuronx is imported
PER_CALL = "per call"  # read each time it is needed (compile, cache write, launch, ...)

# The tables of docs/env-vars.md; each variable is listed in its section's table.
RUNTIME = "runtime"
COMPILE = "compile"
DISTRIBUTED = "distributed"
OTHER_TOOLS = "other-tools"
NKI = "nki"
PROFILING = "profiling"
INTEGRATIONS = "integrations"
SECTIONS = (RUNTIME, COMPILE, DISTRIBUTED, OTHER_TOOLS, NKI, PROFILING, INTEGRATIONS)


@dataclass(frozen=True)
class Variable:
    """A declared variable; calling it reads the environment and returns the
    parsed value (``config.neff_cache_dir()``), so the declaration is the accessor.
    Its documentation is here too: docs/env-vars.md's tables are rendered from it."""

    name: str
    # The value when unset or empty; a function of nothing when it depends on
    # another variable, called at each read (neff_cache_dir's follows XDG_CACHE_HOME).
    default: Any
    parse: Callable[[str, str], Any]  # (name, raw text) -> value; raises ValueError naming the variable
    when: str  # IMPORT or PER_CALL
    section: str  # one of SECTIONS
    _: KW_ONLY
    doc: str  # the Effect cell of its row in docs/env-vars.md (markdown)
    values: str = ""  # the Values cell; a flag's is `0`, `1`
    default_doc: str = ""  # the Default cell, where the default alone does not say it
    external: bool = False  # defined by another tool; read as that tool defines it

    def raw(self) -> str | None:
        """The variable's text, or None when unset."""
        return os.environ.get(self.name)

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default

    def __call__(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None or (not self.external and not raw.strip()):
            return self.default_value()
        return self.parse(self.name, raw)

    def export_default(self, text: str) -> None:
        """Writes `text` into the environment when the variable is unset, as
        TorchNeuron's import does for some: code that reads os.environ itself
        (AWS's, child processes) sees the value in force."""
        os.environ.setdefault(self.name, text)

    def parse_text(self, raw: str) -> Any:
        """A value given in code rather than in the environment, checked as the
        variable's own text would be (ops.set_fallback_mode)."""
        return self.parse(self.name, raw)


VARIABLES: dict[str, Variable] = {}


def _declare(*args, **kwargs) -> Variable:
    variable = Variable(*args, **kwargs)
    if variable.name in VARIABLES:
        raise AssertionError(f"{variable.name} declared twice")
    VARIABLES[variable.name] = variable
    return variable


def choices(values: tuple) -> str:
    """A Values cell listing `values`: `warn`, `silent`, `error`."""
    return ", ".join(f"`{value}`" for value in values)


DEFAULT_INSTANCE = "trn2.3xlarge"

# Device and runtime.
instance = _declare(
    "TORCH_NEURONX_INSTANCE", DEFAULT_INSTANCE, _text, IMPORT, RUNTIME,
    values=("`trn2.3xlarge`, `trn2.48xlarge`, `trn3.3xlarge`, `trn3.48xlarge`, `trn1.2xlarge`, "
            "`trn1.32xlarge`"),
    doc=("Instance profile of the emulated runtime: how many chips, physical NeuronCores and HBM "
         "the instance has; with `NEURON_LOGICAL_NC_CONFIG` that gives how many logical "
         "NeuronCores (`neuron:N` devices) exist and how much HBM each has (4 × 24 GiB by "
         "default). Surrounding spaces are ignored; an unknown name makes the import fail with the"
         " list of known profiles. See [devices and memory](device-and-memory.md)."))
visible_cores = _declare(
    "NEURON_RT_VISIBLE_CORES", None, _text, IMPORT, RUNTIME,
    values="core ids and ascending ranges, comma-separated: `2`, `0-1`, `0,2-3`",
    default_doc="all cores of the profile",
    doc=("Restricts the process to these cores of the profile; they are renumbered `neuron:0`, "
         "`neuron:1`, ... in the order given (`get_device_properties(i).physical_core` keeps the "
         "original id). The ids are *logical* cores under the LNC in force "
         "(`NEURON_LOGICAL_NC_CONFIG`): 0-3 on trn2.3xlarge at LNC=2, 0-7 at LNC=1, as the Neuron "
         "runtime numbers the NeuronCores it presents. Takes precedence over `NEURON_RT_NUM_CORES`"
         ' (AWS: "`NEURON_RT_VISIBLE_CORES` takes precedence over `NEURON_RT_NUM_CORES`"). A '
         "malformed value, a core outside the profile or a core named twice makes the import fail,"
         " naming the value and the cores the profile has at that LNC."))
num_cores = _declare(
    "NEURON_RT_NUM_CORES", None, parse_core_count, IMPORT, RUNTIME,
    values="`0`, or a number of cores from `1` to the profile's (logical) core count",
    default_doc="`0`: all cores",
    doc=('AWS: "Number of NeuronCores required by the process"; `0` "is interpreted as all". The '
         "process uses that many cores of the profile: the first ones, `neuron:0` ... `neuron:N-1`"
         " (the Neuron runtime picks any *free* cores, and a second process gets others; the "
         "emulator reserves nothing between processes, so every process gets the same first cores:"
         " give processes disjoint `NEURON_RT_VISIBLE_CORES` to model that). Ignored when "
         "`NEURON_RT_VISIBLE_CORES` is set (a malformed value is still an error). A value that is "
         "not a non-negative integer (`-1`, `two`), or more cores than the profile has at the LNC "
         "in force, makes the import fail, naming the variable and the valid range."))
logical_nc_config = _declare(
    "NEURON_LOGICAL_NC_CONFIG", None, parse_lnc, IMPORT, RUNTIME,
    values=choices(LNC_VALUES),
    default_doc="the platform's: `2` on trn2 and trn3, `1` on trn1",
    doc=("Logical NeuronCore configuration: physical NeuronCores per logical core (`neuron:N` "
         'device). AWS: "LNC can only be set to 1 or 2"; "LNC applies only to Trn2 and Trn3 '
         'instances" (trn1 accepts only `1`). `2`: two physical cores form one device with their '
         "shared HBM (a trn2 chip shows 4 cores of 24 GiB, a trn3 chip 4 of 36 GiB). `1`: every "
         "physical core is a device (8 per trn2 chip of 12 GiB each, 8 per trn3 chip of 18 GiB). "
         "On Trainium the two cores of a bank share its HBM under LNC=1 (one may use more than "
         'half while its neighbour uses less: AWS warns of "noisy neighbor problems"); the '
         "emulator gives each core a fixed half, so it runs out of memory no later than Trainium. "
         "Reported by `get_device_properties(i).lnc` and `torch-neuronx info` (`lnc`, "
         "`lnc_source`). Any value other than `1`/`2`, or `2` on a trn1 profile, makes the import "
         "fail, naming the variable and the valid choices. A 48xlarge at `1` has 128 cores, one "
         "more than a process can use (PyTorch's device index is 8-bit): the import fails unless "
         "`NEURON_RT_NUM_CORES` or `NEURON_RT_VISIBLE_CORES` selects at most 127. See [devices and"
         " memory](device-and-memory.md#logical-neuroncores)."))
fallback_mode = _declare(
    "TORCH_NEURONX_FALLBACK", "warn", choice_parser(FALLBACK_MODES), IMPORT, RUNTIME,
    values=choices(FALLBACK_MODES) + " (case-insensitive)",
    doc=("What an op outside the native op set does: `warn` runs it on the CPU (inputs copied to "
         "the host and back) with a warning once per op; `silent` does the same without the "
         "warning; `error` raises `NotImplementedError` naming the op. Fallback ops are listed by "
         "`torch_neuronx.get_fallback_ops()` in every mode. Can be changed at run time with "
         "`torch_neuronx.ops.set_fallback_mode()`."))
fp64_mode = _declare(
    "TORCH_NEURONX_FP64", "emulate", choice_parser(FP64_MODES), IMPORT, RUNTIME,
    values=choices(FP64_MODES) + " (case-insensitive)",
    doc=("`emulate`: float64 tensors keep dtype float64 but arithmetic is done in float32, as on "
         "Trainium (one warning per process); `native`: compute in float64 (for debugging). Pure "
         "data movement (copies, indexing, concatenation, ...) is exact in both modes."))
launch_blocking = _declare(
    "NEURON_LAUNCH_BLOCKING", False, parse_flag, IMPORT, RUNTIME,
    doc=('AWS: "When `1`, forces synchronous execution. Useful for debugging." In the emulator '
         "an op that is not queued has finished when its call returns, and any error an op raises "
         "is raised by the call that launched it (not by a later `torch.neuron.synchronize()`), "
         "whatever the value. `1` keeps Adaptive Eager Execution's queue off "
         "(`TORCH_NEURONX_ENABLE_CONCATENATION`), whose full queues otherwise run asynchronously "
         "on the device thread, so that every op runs at its call. Not emulated: the asynchronous "
         "execution of every op under `0` on Trainium, where a device error can surface at a later "
         "call. Any other value (other than "
         "the `true` / `false` spellings of every on/off variable) makes the import fail, naming "
         "the variable."))
def _positive_integer(name: str, raw: str) -> int:
    value = _integer(name, raw)
    if value < 1:
        raise ValueError(f"{name}={raw!r} must be at least 1")
    return value


enable_concatenation = _declare(
    "TORCH_NEURONX_ENABLE_CONCATENATION", False, parse_flag, IMPORT, RUNTIME,
    doc=("Adaptive Eager Execution (AWS's source calls it concatenation; off unless `1` in "
         "AWS's release, as here): eager ops are queued and run together as one launch when a "
         "value is needed. The emulator queues float32 and bfloat16 elementwise `add`, `sub`, `mul`, `div` "
         "(tensors of one shape, a scalar, or an operand that repeats whole rows), `sqrt`, `neg`, "
         "`abs`, `relu`, `reciprocal`, `rsqrt`, `pow` (exponents 2, 3, -2, 0.5, -0.5, -1), `exp`, "
         "`tanh`, `sigmoid`, `silu`, `lerp`, `addcmul`, `addcdiv`, `fill` with a number, `zero` "
         "the ReLU, sigmoid, tanh and SiLU gradients and float32 softmax (and its gradient) over "
         "the last dim so far "
         "(tensors of up to 131,072 elements); a matmul-class op (mm, bmm, addmm, linear, "
         "convolution, ...) ends a queued sequence and joins its launch, as in TorchNeuron; see "
         "docs/eager-and-fallback.md#adaptive-eager-execution-concatenation. Off under "
         "`torch.use_deterministic_algorithms(True)`, `NEURON_LAUNCH_BLOCKING=1`, the audit and "
         "torch.profiler. Can be switched at run time with `torch_neuronx.ops.set_concatenation()`."))
concatenation_buffer_size_limit = _declare(
    "TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT", 1024, _positive_integer, IMPORT, RUNTIME,
    values="an integer >= 1",
    default_doc="`1024`",
    doc=("The most ops one queued launch holds (AWS's default, 1024): a full queue runs, on the "
         "device thread (asynchronously)."))
fallback_only_for_unimplemented_ops = _declare(
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", False, parse_flag, IMPORT, RUNTIME,
    doc=('AWS: "When `1`, only falls back to CPU for unimplemented ops, not execution errors." On '
         "Trainium a native op whose device kernel cannot take its arguments is retried on the CPU "
         "unless this is `1`; with `1` it raises `RuntimeError: CPU fallback disabled because "
         "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1. Operation ... failed to execute on "
         "Neuron: ...` followed by the kernel's reason. The emulator raises so, with `1`, for the "
         "device kernels' limits: a compute op writing in place into a non-contiguous view "
         "(`Cannot process non-contiguous tensors`; copies, fills and scatters write any view), a "
         "copy between two NeuronCores (`Device-to-device copy requires tensors on same Neuron "
         "core`). With `0` (the default) those calls run, as the "
         "CPU retry makes them run on Trainium. An op that fails for any other reason raises its "
         "error with either value (its kernel is a CPU kernel: a CPU retry would fail the same "
         "way). Ops without a device implementation (outside the native op set) run through the "
         "CPU fallback with either value, as `TORCH_NEURONX_FALLBACK` says. Not emulated: calls "
         "retried under `0` are not listed by `get_fallback_ops()`; Trainium's refusal of "
         "channels-last in `contiguous()` and `.to()` under `1` (its `empty()` and `clone()` "
         "accept it; here all four allocate alike). Any other value makes the "
         "import fail, naming the variable."))
mlir_aten_ops = _declare(
    "TORCH_NEURONX_MLIR_ATEN_OPS", True, parse_flag, IMPORT, RUNTIME,
    doc=("TorchNeuron's switch between its two lowerings of eager ops: `1`, its default, lowers "
         "each ATen op through torch-mlir (PyTorch's own error types and wording, `aten::` names "
         "in `get_executed_ops()`); `0` is its older XLA path. TorchNeuron's import sets the "
         "variable to `1` when it is unset, and so does the emulator's; "
         "`torch_neuronx.utils.use_mlir_aten_ops()` is True. `0` is not emulated: the import "
         "warns once and ops behave as with `1`. Any other value makes the import fail, naming "
         "the variable."))
audit_dir = _declare(
    "TORCH_NEURONX_AUDIT_DIR", None, _text, IMPORT, RUNTIME,
    values="a directory",
    doc=("Set by `torch-neuronx audit` (never by hand) in the processes of the command it runs: "
         "each process that loads the device records its ops, steps, memory and compiled graphs "
         "and writes `record-<pid>.json` there at exit. See [tools.md](tools.md#audit)."))
log_level = _declare(
    "TORCH_NEURONX_LOG_LEVEL", None, _upper, IMPORT, RUNTIME,
    values=("`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL` (case-insensitive), or AWS's numbers `0`"
            ' (`ERROR`), `1` (`WARNING`), `2` (`INFO`), `3` (`DEBUG`, AWS: "When `3`, enable debug '
            'logs")'),
    doc=("Level of the `torch_neuronx` logger, with a handler of its own writing to stderr, or to "
         "`TORCH_NEURONX_LOG_FILE` (`[torch_neuronx.compiler INFO] compiled the forward graph in "
         "0.12 s`). `INFO`: compiles and recompiles with their reason; `DEBUG`: also cache hits "
         "and graphs received. Unset (and no log file): no handler is added and the application's "
         "`logging` configuration decides (on Trainium the unset level is `WARNING`: set `1` for "
         "that). An unknown value (`4`, `loud`) warns, naming the variable and the valid values, "
         "and is ignored."))
log_file = _declare(
    "TORCH_NEURONX_LOG_FILE", None, _text, IMPORT, RUNTIME,
    values="a file path",
    default_doc="unset (stderr)",
    doc=("The `torch_neuronx` logger appends its lines to this file (opened in append mode, as "
         "TorchNeuron does; earlier content is kept) instead of writing them to stderr. Without "
         "`TORCH_NEURONX_LOG_LEVEL` the level is `WARNING`, TorchNeuron's default. One name for "
         "every process: it is not made per rank (give each rank its own value, e.g. "
         "`TORCH_NEURONX_LOG_FILE=log.$RANK`; ranks given the same file append to it). A path that"
         " cannot be opened warns, naming the variable, and the lines go to stderr. Only this "
         "project's Python logger writes there: warnings (`warnings.warn`, such as the CPU "
         "fallback warning) still go to stderr."))

# torch.compile.


def _default_neff_cache_dir() -> str:
    """$XDG_CACHE_HOME/torch_neuronx/neff, ~/.cache when XDG_CACHE_HOME is unset or empty."""
    base = xdg_cache_home() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_neuronx", "neff")


enable_stack_trace = _declare(
    "TORCH_NEURONX_ENABLE_STACK_TRACE", False, parse_flag, PER_CALL, COMPILE,
    doc=("Read at each compile error. `1`: an error naming ops that cannot be compiled (no "
         "lowering, or depending on tensor values) shows the whole recorded Python stack of each "
         "op instead of its innermost line."))
debug_dir = _declare(
    "TORCH_NEURONX_DEBUG_DIR", None, _text, PER_CALL, COMPILE,
    values="a directory",
    doc=("With `TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1`, every compiled graph writes "
         "`fx_graphs/NNNN_<kind>.py` and `stablehlo/NNNN_<kind>.mlir` under `rank<RANK>/`."))
preserve_compilation_artifacts = _declare(
    "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", False, parse_flag, PER_CALL, COMPILE,
    doc="`1` writes the artifacts above (needs `TORCH_NEURONX_DEBUG_DIR`).")
neff_cache_dir = _declare(
    "TORCH_NEURONX_NEFF_CACHE_DIR", _default_neff_cache_dir, _text, PER_CALL, COMPILE,
    values="a directory",
    default_doc="`~/.cache/torch_neuronx/neff` (`$XDG_CACHE_HOME` respected)",
    doc=("On-disk cache of compiled executables (`*.neff`) and of AOTAutograd's results (`*.aot`),"
         " shared between processes (atomic writes, checksummed entries); see "
         "docs/compile.md#caches."))
neff_cache_max_size = _declare(
    "TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", DEFAULT_NEFF_CACHE_MAX_SIZE, parse_size, PER_CALL, COMPILE,
    values=("bytes with an optional unit (`500M`, `10G`, `1.5GiB`; K/M/G/T are powers of 1024), or "
            "`-1` / `unlimited`"),
    default_doc="`10G`",
    doc=("Size limit of the on-disk cache: after each write the least recently used entries are "
         "deleted until the directory fits (the entry just written is kept). Read at each write; a"
         " malformed value raises `ValueError` naming the variable. See docs/compile.md#caches."))
neff_disable_cache = _declare(
    "TORCH_NEURONX_NEFF_DISABLE_CACHE", False, parse_flag, PER_CALL, COMPILE,
    doc="`1` disables the on-disk cache, both kinds of entries (the in-memory cache stays).")
disable_fallback_execution = _declare(
    "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", True, parse_flag, PER_CALL, COMPILE,
    doc=("`1`: a graph containing an op with no lowering raises `NeuronCompileError` listing the "
         "ops and source lines; `0`: such a graph runs eagerly with a warning."))
dynamo_disable_cpu_autocopy = _declare(
    "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", False, parse_flag, PER_CALL, COMPILE,
    doc=('`1`: a CPU tensor passed to a compiled function raises "Input tensor at index N is on '
         'cpu device" instead of being used as a device input.'))
metrics_enabled = _declare(
    "TORCH_NEURONX_METRICS_ENABLED", True, parse_flag, PER_CALL, COMPILE,
    doc=("Read at each counted event and at each `get_dynamo_metrics()`. `1`: the counters of "
         "`torch_neuronx.get_dynamo_metrics()` (compiles, compile seconds, cache hits, evictions, "
         "graphs, recompiles) are collected; `0`: they are not (they keep the values they had, "
         'zero when `0` from the start) and `get_dynamo_metrics()["enabled"]` is `False`; the log '
         "lines stay. `graph_breaks` is PyTorch's own counter and is reported either way. "
         "Differences from TorchNeuron, whose metrics are off unless this is set: the default here"
         " is `1` (the counters are a few Python additions per compile, and scripts and docs here "
         "read them without setting the variable); TorchNeuron also accepts `yes`, here it is an "
         "error like any value outside the on/off spellings. Not affected: op tracking "
         "(`get_fallback_ops()`, `get_executed_ops()`), always on; the per-graph records of "
         "`get_dynamo_metrics()`, Dynamo's `counters[\"neuron\"]` and `compilation_time_metrics` "
         "phase times and the metric tables (`TORCH_NEURONX_ENABLED_METRIC_TABLES`), kept either "
         "way as in TorchNeuron, where this variable governs the runtime's metrics."))

METRIC_TABLE_NAMES = ("graph_stats",)  # compiler/metrics.py's METRIC_TABLES (a test checks they agree)


def parse_metric_tables(name: str, raw: str) -> tuple[str, ...]:
    """TORCH_NEURONX_ENABLED_METRIC_TABLES: a comma-separated list of metric table names."""
    tables = []
    for table in (part.strip() for part in raw.split(",")):
        if not table:
            continue
        if table not in METRIC_TABLE_NAMES:
            raise ValueError(
                f"{name}: metric table {table!r} is not registered. Available tables: "
                f"{list(METRIC_TABLE_NAMES)}. Name only these, comma-separated, or unset the "
                "variable to write no table.")
        if table not in tables:
            tables.append(table)
    return tuple(tables)


enabled_metric_tables = _declare(
    "TORCH_NEURONX_ENABLED_METRIC_TABLES", (), parse_metric_tables, PER_CALL, COMPILE,
    values="comma-separated table names: `graph_stats`",
    default_doc="none",
    doc=("Read at exit (and at each `get_dynamo_metrics()`, so that a wrong name fails early). "
         "`graph_stats`: at exit, the per-graph records of `get_dynamo_metrics()` (one row per "
         "compiled graph, a header of the record's fields) are written to "
         "`metric_table_graph_stats_rank<rank>.csv` in `TORCH_NEURONX_METRICS_DIR` (rank: "
         "`torch.distributed`'s when a process group is up, else the current neuron device); "
         "nothing is written when no graph was compiled. An unknown name is a `ValueError` naming "
         "the available tables, raised by `get_dynamo_metrics()` and logged as an error at exit "
         "(TorchNeuron checks the names at exit only)."))
metrics_dir = _declare(
    "TORCH_NEURONX_METRICS_DIR", "/tmp", _text, PER_CALL, COMPILE,
    values="a directory",
    doc=("Where the tables of `TORCH_NEURONX_ENABLED_METRIC_TABLES` are written at exit (the "
         "directory must exist; a write that fails is logged as a warning). As TorchNeuron."))

# torch.distributed (torchrun's variables).
local_rank = _declare(
    "LOCAL_RANK", None, _integer, PER_CALL, DISTRIBUTED,
    values="an integer",
    external=True,
    doc=('Set by `torchrun`; `init_process_group(backend="neuron")` binds the process to the '
         "`LOCAL_RANK`-th visible core (an explicit `device_id` wins). A value that is not an "
         "integer is an error naming it. More local ranks than visible cores is an error naming "
         "both numbers. See [distributed.md](distributed.md)."))
local_world_size = _declare(
    "LOCAL_WORLD_SIZE", None, _integer_or_none, PER_CALL, DISTRIBUTED,
    values="an integer",
    external=True,
    doc=("Set by `torchrun`: the number of processes on this node, checked against the visible "
         "cores when the default process group is created (a value that is not an integer is "
         "ignored)."))
rank = _declare(
    "RANK", "0", _verbatim, PER_CALL, DISTRIBUTED,
    values="as set by the launcher",
    external=True,
    doc=("Set by `torchrun`: compilation artifacts go to `rank<RANK>/` under "
         "`TORCH_NEURONX_DEBUG_DIR`."))

# Other tools' variables, read as their owners define them.
xdg_cache_home = _declare(
    "XDG_CACHE_HOME", None, _verbatim, PER_CALL, OTHER_TOOLS,
    values="a directory",
    default_doc="`~/.cache` (also when empty)",
    external=True,
    doc=("Base of the default `TORCH_NEURONX_NEFF_CACHE_DIR`: "
         "`$XDG_CACHE_HOME/torch_neuronx/neff`. Read at each cache access."))
xla_flags = _declare(
    "XLA_FLAGS", "", _verbatim, PER_CALL, OTHER_TOOLS,
    values="XLA's flags",
    default_doc="empty",
    external=True,
    doc=("Part of the key of every on-disk cache entry (read once per process, at the first cache "
         "lookup), so entries compiled under other flags are not reused."))
torch_compile_debug = _declare(
    "TORCH_COMPILE_DEBUG", False, _pytorch_flag, PER_CALL, OTHER_TOOLS,
    values="PyTorch's: on only when exactly `1`",
    default_doc="unset",
    external=True,
    doc=("Read at each compile: with `1`, AOTAutograd runs through PyTorch's own `aot_autograd()` "
         "helper, so PyTorch's debug logs of it appear."))

# NKI simulator.
platform_target = _declare(
    "NEURON_PLATFORM_TARGET_OVERRIDE", "trn2", _text, PER_CALL, NKI,
    values="`trn1`, `trn2`, `trn3` (case-insensitive, surrounding spaces ignored)",
    doc=("Target generation of simulated NKI launches: SBUF capacity per partition (192 KiB on trn1, "
         "224 KiB on trn2, 256 KiB on trn3) and the default target of the cost model. An unknown value makes "
         "the launch raise `NKIError` naming the variable and the known targets. "
         "`nki.benchmark(kernel, target=...)` overrides it for that run."))
QUANTIZE_MX_SCALES = ("double", "ocp")  # NKI 0.5.0 (Neuron 2.31) and later; NKI 0.4.0 and earlier
quantize_mx_scale = _declare(
    "TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE", "double", choice_parser(QUANTIZE_MX_SCALES), PER_CALL, NKI,
    values=choices(QUANTIZE_MX_SCALES) + " (case-insensitive)",
    doc=("Block scale of `nisa.quantize_mx`, read at each call. `double`: as AWS documents it since NKI "
         "0.5.0 (Neuron 2.31), two times the OCP sample algorithm's scale, `2 ** (floor(log2(amax)) - emax "
         "+ 1)`; `ocp`: the OCP sample algorithm's `2 ** (floor(log2(amax)) - emax)`, which NKI 0.4.0 and "
         "earlier used (AWS's 2.31 release notes: quantize_mx \"now uses a block scale two times larger\") "
         "and which kernels and tests written for them (nki-library d2ad3a5) expect. Another value makes "
         "quantize_mx raise `NKIError` naming the variable."))

# Profiling: the Neuron Runtime's whole-process capture (AWS's NEURON_RT_INSPECT_*),
# emulated by torch_neuronx/profiling.py (docs/profiling.md).
inspect_enable = _declare(
    "NEURON_RT_INSPECT_ENABLE", False, parse_flag, IMPORT, PROFILING,
    doc=("`1`: the process is profiled from the import of `torch_neuronx` to its exit "
         "(`torch.profiler` with CPU and device activity), and the trace is written at exit to "
         "`<NEURON_RT_INSPECT_OUTPUT_DIR>/emulated-<instance>-<host>_pid_<pid>/<timestamp>/trace.json`."
         " As AWS says for Trainium, do not combine it with a `torch.profiler` of your own: one "
         "profile runs at a time in a process."))
inspect_output_dir = _declare(
    "NEURON_RT_INSPECT_OUTPUT_DIR", "./output", _text, IMPORT, PROFILING,
    values="a directory",
    doc="Where the trace above is written.")
inspect_system_profile = _declare(
    "NEURON_RT_INSPECT_SYSTEM_PROFILE", True, parse_flag, IMPORT, PROFILING,
    doc=("`1`: device events per kernel are recorded (`ProfileMode.RUNTIME`); `0` with "
         "`NEURON_RT_INSPECT_DEVICE_PROFILE=0`: CPU events only."))
inspect_device_profile = _declare(
    "NEURON_RT_INSPECT_DEVICE_PROFILE", "0", parse_device_profile, IMPORT, PROFILING,
    values=choices(DEVICE_PROFILE_VALUES) + " (case-insensitive)",
    doc=("Trainium: instruction-level device traces (`ProfileMode.DEVICE`). Not emulated: any "
         "value other than `0` warns and records the per-kernel device events only. Another value "
         "makes the import fail, naming the variable."))
inspect_max_events_per_nc = _declare(
    "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", None, _integer, IMPORT, PROFILING,
    values="an integer",
    default_doc="unset (no limit)",
    doc=("Device events kept per core. Difference: the runtime overwrites the oldest events past "
         "the limit; the emulator drops the later ones (counted in the trace's "
         "`neuron_dropped_events`)."))
inspect_event_filter_nc = _declare(
    "NEURON_RT_INSPECT_EVENT_FILTER_NC", None, _text, IMPORT, PROFILING,
    values="core indices and ranges: `0`, `0-3`, `0,2,4`",
    default_doc="unset (all cores)",
    doc=("Device events of these cores only (device indices, `neuron:N`). A malformed value makes "
         "the import fail, naming it."))
inspect_event_filter_type = _declare(
    "NEURON_RT_INSPECT_EVENT_FILTER_TYPE", None, _text, IMPORT, PROFILING,
    values="runtime event types",
    doc="Not emulated (the emulator has no runtime event types): a value warns and is ignored.")
inspect_device_profile_num_warmup = _declare(
    "NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP", None, _text, IMPORT, PROFILING,
    values="an integer",
    doc="Not emulated (belongs to the device profile): a value warns and is ignored.")

# Hugging Face integrations.
disable_integrations = _declare(
    "TORCH_NEURONX_DISABLE_INTEGRATIONS", False, parse_flag, IMPORT, INTEGRATIONS,
    doc=("`1`: the patches in `torch_neuronx/integrations/` are not installed, so transformers, "
         "accelerate, PEFT, TRL, ... run exactly as published (to check whether a gap still "
         "exists); so does Dynamo, which then traces into `torch.neuron`'s RNG state functions "
         "instead of graph-breaking on them (docs/compile.md)."))


# ------------------------------------------------------------------- helpers


def child_environment(**variables: str) -> dict[str, str]:
    """This process's environment plus `variables`, for a child process (the
    command `torch-neuronx audit` runs, with AUDIT_DIR set)."""
    unknown = [name for name in variables if name not in VARIABLES]
    if unknown:
        raise AssertionError(f"undeclared variables {unknown}: declare them in torch_neuronx/config.py")
    return {**os.environ, **variables}


def project_variables() -> list[str]:
    """Names of the variables this project defines (TORCH_NEURONX_*, NEURON_*)."""
    return sorted(name for name, variable in VARIABLES.items() if not variable.external)


# ------------------------------------------------------ docs/env-vars.md tables
# The page's prose is written by hand; each table between these markers is
# rendered from the declarations, by `python scripts/render_env_vars.py`
# (tests/test_config.py fails when the page is stale).

GENERATED_TABLE = re.compile(
    r"(?P<begin><!-- generated from torch_neuronx/config.py, section (?P<section>[\w-]+):[^>]*-->\n)"
    r"(?P<table>.*?)(?P<end><!-- end of generated table -->)", re.DOTALL)
_READ = {IMPORT: "at import", PER_CALL: "when used"}


def _default_cell(variable: Variable) -> str:
    if variable.default_doc:
        return variable.default_doc
    if isinstance(variable.default, bool):
        return "`1`" if variable.default else "`0`"
    if variable.default is None:
        return "unset"
    if isinstance(variable.default, str) and variable.default:
        return f"`{variable.default}`"
    raise AssertionError(f"{variable.name}: say its default in default_doc=")


def _row(variable: Variable) -> list[str]:
    values = variable.values or ("`0`, `1`" if variable.parse is parse_flag else "")
    if not values:
        raise AssertionError(f"{variable.name}: say its values in values=")
    return [f"`{variable.name}`", values, _default_cell(variable), _READ[variable.when], variable.doc]


def markdown_table(section: str) -> str:
    """The table of docs/env-vars.md that lists the variables of `section`, in declaration order."""
    header = ["Variable", "Values", "Default", "Read", "Effect"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(_row(variable)) + " |"
              for variable in VARIABLES.values() if variable.section == section]
    return "\n".join(lines) + "\n"


def render_page(text: str) -> str:
    """docs/env-vars.md's text with every generated table rendered anew."""
    return GENERATED_TABLE.sub(
        lambda match: match["begin"] + markdown_table(match["section"]) + match["end"], text)
