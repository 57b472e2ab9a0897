"""Every environment variable torch_neuronx reads, declared once.

Each variable is a :class:`Variable`: its name, its default, the parser that
turns its text into a value (and checks it), when it is read, and a one-line
meaning (docs/env-vars.md says the same, longer; tests/test_config.py checks that
the two list the same variables and that no other module reads ``os.environ``).
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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Variable:
    """A declared variable; calling it reads the environment and returns the
    parsed value (``config.neff_cache_dir()``), so the declaration is the accessor."""

    name: str
    # The value when unset or empty; a function of nothing when it depends on
    # another variable, called at each read (neff_cache_dir's follows XDG_CACHE_HOME).
    default: Any
    parse: Callable[[str, str], Any]  # (name, raw text) -> value; raises ValueError naming the variable
    when: str  # IMPORT or PER_CALL
    meaning: str
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


DEFAULT_INSTANCE = "trn2.3xlarge"

# Device and runtime (read at import).
instance = _declare(
    "TORCH_NEURONX_INSTANCE", DEFAULT_INSTANCE, _text, IMPORT,
    "Instance profile of the emulated runtime: number of NeuronCores and HBM per core.")
visible_cores = _declare(
    "NEURON_RT_VISIBLE_CORES", None, _text, IMPORT,
    "Cores of the profile this process uses ('2', '0-1', '0,2-3'); None: all of them.")
num_cores = _declare(
    "NEURON_RT_NUM_CORES", None, parse_core_count, IMPORT,
    "How many cores of the profile this process uses (the first ones); 0 or None: all of them. "
    "NEURON_RT_VISIBLE_CORES takes precedence.")
logical_nc_config = _declare(
    "NEURON_LOGICAL_NC_CONFIG", None, parse_lnc, IMPORT,
    "Physical NeuronCores per logical core (1 or 2); None: the platform's default (checked by "
    "neuron.profiles).")
fallback_mode = _declare(
    "TORCH_NEURONX_FALLBACK", "warn", choice_parser(FALLBACK_MODES), IMPORT,
    "What an op outside the native op set does: warn, silent or error.")
fp64_mode = _declare(
    "TORCH_NEURONX_FP64", "emulate", choice_parser(FP64_MODES), IMPORT,
    "float64 arithmetic: emulate (in float32, as on Trainium) or native.")
launch_blocking = _declare(
    "NEURON_LAUNCH_BLOCKING", False, parse_flag, IMPORT,
    "Synchronous launches on Trainium; validated only (the emulator is always synchronous).")
log_level = _declare(
    "TORCH_NEURONX_LOG_LEVEL", None, _upper, IMPORT,
    "Level of the torch_neuronx logger: a name (DEBUG..CRITICAL) or AWS's 0-3 "
    "(0 ERROR, 1 WARNING, 2 INFO, 3 DEBUG); None: logging left alone (checked by log.configure).")
log_file = _declare(
    "TORCH_NEURONX_LOG_FILE", None, _text, IMPORT,
    "File the torch_neuronx logger appends to instead of stderr (None: stderr).")
fallback_only_for_unimplemented_ops = _declare(
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", False, parse_flag, IMPORT,
    "On Trainium, 1 stops the CPU retry of an op whose device execution failed; validated only "
    "(the emulator never retries: a failing op raises, as with 1).")
disable_integrations = _declare(
    "TORCH_NEURONX_DISABLE_INTEGRATIONS", False, parse_flag, IMPORT,
    "Do not patch third-party libraries (torch_neuronx/integrations).")
audit_dir = _declare(
    "TORCH_NEURONX_AUDIT_DIR", None, _text, IMPORT,
    "Set by `torch-neuronx audit` in the processes it runs: record this process and write its record here.")

# torch.compile (read per compile / per cache access / per run).
enable_stack_trace = _declare(
    "TORCH_NEURONX_ENABLE_STACK_TRACE", False, parse_flag, PER_CALL,
    "Compile errors show each op's whole recorded Python stack, not its innermost line.")
debug_dir = _declare(
    "TORCH_NEURONX_DEBUG_DIR", None, _text, PER_CALL,
    "Directory of the compilation artifacts (with PRESERVE_COMPILATION_ARTIFACTS).")
preserve_compilation_artifacts = _declare(
    "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", False, parse_flag, PER_CALL,
    "Write each compiled graph's FX code and StableHLO under DEBUG_DIR.")


def _default_neff_cache_dir() -> str:
    """$XDG_CACHE_HOME/torch_neuronx/neff, ~/.cache when XDG_CACHE_HOME is unset or empty."""
    base = xdg_cache_home() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_neuronx", "neff")


# Whether the cache is on at all is neff_disable_cache.
neff_cache_dir = _declare(
    "TORCH_NEURONX_NEFF_CACHE_DIR", _default_neff_cache_dir, _text, PER_CALL,
    "Directory of the on-disk compile cache (default: $XDG_CACHE_HOME/torch_neuronx/neff).")
neff_cache_max_size = _declare(
    "TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", DEFAULT_NEFF_CACHE_MAX_SIZE, parse_size, PER_CALL,
    "Size limit of the on-disk cache in bytes (None: unlimited); LRU entries deleted past it.")
neff_disable_cache = _declare(
    "TORCH_NEURONX_NEFF_DISABLE_CACHE", False, parse_flag, PER_CALL,
    "Disable the on-disk compile cache (the in-memory one stays).")
disable_fallback_execution = _declare(
    "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", True, parse_flag, PER_CALL,
    "A graph with an op that has no lowering raises instead of running eagerly.")
metrics_enabled = _declare(
    "TORCH_NEURONX_METRICS_ENABLED", True, parse_flag, PER_CALL,
    "Collect the get_dynamo_metrics() counters (0: not collected; the snapshot says enabled=False).")
dynamo_disable_cpu_autocopy = _declare(
    "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", False, parse_flag, PER_CALL,
    "A CPU tensor passed to a compiled graph is an error instead of a device input.")

# NKI simulator.
platform_target = _declare(
    "NEURON_PLATFORM_TARGET_OVERRIDE", "trn2", _text, PER_CALL,
    "Target generation of simulated NKI launches (trn2, trn3; checked by nki.targets).")

# Profiling: the Neuron Runtime's whole-process capture (AWS's NEURON_RT_INSPECT_*),
# emulated by torch_neuronx/profiling.py (docs/profiling.md).
inspect_enable = _declare(
    "NEURON_RT_INSPECT_ENABLE", False, parse_flag, IMPORT,
    "Profile the whole process (torch.profiler with device events) and write the trace at exit.")
inspect_output_dir = _declare(
    "NEURON_RT_INSPECT_OUTPUT_DIR", "./output", _text, IMPORT,
    "Directory of the whole-process trace (<dir>/<instance>_pid_<pid>/<timestamp>/trace.json).")
inspect_system_profile = _declare(
    "NEURON_RT_INSPECT_SYSTEM_PROFILE", True, parse_flag, IMPORT,
    "With INSPECT_ENABLE: record the per-kernel device events (ProfileMode.RUNTIME).")
inspect_device_profile = _declare(
    "NEURON_RT_INSPECT_DEVICE_PROFILE", "0", parse_device_profile, IMPORT,
    "With INSPECT_ENABLE: 0, 1/model or session: instruction-level traces (ProfileMode.DEVICE), not emulated (warns).")
inspect_max_events_per_nc = _declare(
    "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", None, _integer, IMPORT,
    "With INSPECT_ENABLE: device events kept per core (later ones dropped); None: no limit.")
inspect_event_filter_nc = _declare(
    "NEURON_RT_INSPECT_EVENT_FILTER_NC", None, _text, IMPORT,
    "With INSPECT_ENABLE: cores whose device events are recorded ('0', '0-3', '0,2,4'); None: all.")
inspect_event_filter_type = _declare(
    "NEURON_RT_INSPECT_EVENT_FILTER_TYPE", None, _text, IMPORT,
    "With INSPECT_ENABLE: runtime event types to capture; not emulated (warns, ignored).")
inspect_device_profile_num_warmup = _declare(
    "NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP", None, _text, IMPORT,
    "With INSPECT_ENABLE: executions skipped before device profiling; not emulated (warns, ignored).")

# Other tools' variables.
local_rank = _declare(
    "LOCAL_RANK", None, _integer, PER_CALL,
    "torchrun's rank on this node: the visible core the process binds to.", external=True)
local_world_size = _declare(
    "LOCAL_WORLD_SIZE", None, _integer_or_none, PER_CALL,
    "torchrun's number of processes on this node (a malformed value is ignored).", external=True)
rank = _declare(
    "RANK", "0", _verbatim, PER_CALL,
    "torchrun's global rank: the rank<RANK>/ subdirectory of compilation artifacts (text as given).", external=True)
xdg_cache_home = _declare(
    "XDG_CACHE_HOME", None, _verbatim, PER_CALL,
    "Base of the default compile cache directory (default ~/.cache; empty counts as unset).", external=True)
xla_flags = _declare(
    "XLA_FLAGS", "", _verbatim, PER_CALL,
    "XLA's flags: part of every compile-cache key.", external=True)
torch_compile_debug = _declare(
    "TORCH_COMPILE_DEBUG", False, _pytorch_flag, PER_CALL,
    "PyTorch's debug switch (on only when exactly '1', as PyTorch reads it): AOTAutograd's own helper runs.", external=True)


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
