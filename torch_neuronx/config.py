"""Every environment variable torch_neuronx reads, declared once.

Each variable is a :class:`Variable`: its name, its default, the parser that
turns its text into a value, when it is read, and a one-line meaning
(docs/env-vars.md says the same, longer; tests/test_config.py checks that the
two list the same variables and that no other module reads ``os.environ``).
The rest of the package calls the typed accessors below (``config.instance()``,
``config.neff_cache_dir()``, ...), never ``os.environ``.

Nothing is cached: an accessor reads the environment each time it is called.
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


def _lower(name: str, raw: str) -> str:
    return raw.strip().lower()


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
    name: str
    default: Any
    parse: Callable[[str, str], Any]  # (name, raw text) -> value
    when: str  # IMPORT or PER_CALL (see `read_at` for details)
    meaning: str
    read_at: str = ""
    external: bool = False  # defined by another tool; read as that tool defines it

    def raw(self) -> str | None:
        """The variable's text, or None when unset."""
        return os.environ.get(self.name)

    def get(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        if not self.external and not raw.strip():
            return self.default
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
INSTANCE = _declare(
    "TORCH_NEURONX_INSTANCE", DEFAULT_INSTANCE, _text, IMPORT,
    "Instance profile of the emulated runtime: number of NeuronCores and HBM per core.",
    read_at="neuron/__init__.py (profiles.active_profile), once")
VISIBLE_CORES = _declare(
    "NEURON_RT_VISIBLE_CORES", None, _text, IMPORT,
    "Cores of the profile this process uses ('2', '0-1', '0,2-3'); None: all of them.",
    read_at="neuron/__init__.py (profiles.visible_cores), once; the distributed error message")
NUM_CORES = _declare(
    "NEURON_RT_NUM_CORES", None, parse_core_count, IMPORT,
    "How many cores of the profile this process uses (the first ones); 0 or None: all of them. "
    "NEURON_RT_VISIBLE_CORES takes precedence.",
    read_at="neuron/__init__.py (profiles.visible_cores), once; the distributed error message")
LOGICAL_NC_CONFIG = _declare(
    "NEURON_LOGICAL_NC_CONFIG", None, parse_lnc, IMPORT,
    "Physical NeuronCores per logical core (1 or 2); None: the platform's default (checked by "
    "neuron.profiles).",
    read_at="neuron/__init__.py (profiles.active_profile), once")
FALLBACK = _declare(
    "TORCH_NEURONX_FALLBACK", "warn", _verbatim, IMPORT,
    "What an op outside the native op set does: warn, silent or error (checked by ops.set_fallback_mode).",
    read_at="ops.apply_env_policies")
FP64 = _declare(
    "TORCH_NEURONX_FP64", "emulate", _lower, IMPORT,
    "float64 arithmetic: emulate (in float32, as on Trainium) or native (checked by ops).",
    read_at="ops.apply_env_policies")
LAUNCH_BLOCKING = _declare(
    "NEURON_LAUNCH_BLOCKING", False, parse_flag, IMPORT,
    "Synchronous launches on Trainium; validated only (the emulator is always synchronous).",
    read_at="ops.apply_env_policies")
LOG_LEVEL = _declare(
    "TORCH_NEURONX_LOG_LEVEL", None, _upper, IMPORT,
    "Level of the torch_neuronx logger: a name (DEBUG..CRITICAL) or AWS's 0-3 "
    "(0 ERROR, 1 WARNING, 2 INFO, 3 DEBUG); None: logging left alone (checked by log.configure).",
    read_at="log.configure")
LOG_FILE = _declare(
    "TORCH_NEURONX_LOG_FILE", None, _text, IMPORT,
    "File the torch_neuronx logger appends to instead of stderr (None: stderr).",
    read_at="log.configure")
FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS = _declare(
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", False, parse_flag, IMPORT,
    "On Trainium, 1 stops the CPU retry of an op whose device execution failed; validated only "
    "(the emulator never retries: a failing op raises, as with 1).",
    read_at="ops.apply_env_policies")
DISABLE_INTEGRATIONS = _declare(
    "TORCH_NEURONX_DISABLE_INTEGRATIONS", False, parse_flag, IMPORT,
    "Do not patch third-party libraries (torch_neuronx/integrations).",
    read_at="integrations.install")
AUDIT_DIR = _declare(
    "TORCH_NEURONX_AUDIT_DIR", None, _text, IMPORT,
    "Set by `torch-neuronx audit` in the processes it runs: record this process and write its record here.",
    read_at="torch_neuronx/__init__.py, once (audit/recorder.py)")

# torch.compile (read per compile / per cache access / per run).
ENABLE_STACK_TRACE = _declare(
    "TORCH_NEURONX_ENABLE_STACK_TRACE", False, parse_flag, PER_CALL,
    "Compile errors show each op's whole recorded Python stack, not its innermost line.",
    read_at="compiler/graph.py, at each compile error")
DEBUG_DIR = _declare(
    "TORCH_NEURONX_DEBUG_DIR", None, _text, PER_CALL,
    "Directory of the compilation artifacts (with PRESERVE_COMPILATION_ARTIFACTS).",
    read_at="compiler/artifacts.py, at each compiled graph")
PRESERVE_COMPILATION_ARTIFACTS = _declare(
    "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", False, parse_flag, PER_CALL,
    "Write each compiled graph's FX code and StableHLO under DEBUG_DIR.",
    read_at="compiler/artifacts.py, at each compiled graph")
NEFF_CACHE_DIR = _declare(
    "TORCH_NEURONX_NEFF_CACHE_DIR", None, _text, PER_CALL,
    "Directory of the on-disk compile cache (default: $XDG_CACHE_HOME/torch_neuronx/neff).",
    read_at="compiler/cache.py, at each cache access")
NEFF_CACHE_MAX_SIZE = _declare(
    "TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", DEFAULT_NEFF_CACHE_MAX_SIZE, parse_size, PER_CALL,
    "Size limit of the on-disk cache in bytes (None: unlimited); LRU entries deleted past it.",
    read_at="compiler/cache.py, at each cache write")
NEFF_DISABLE_CACHE = _declare(
    "TORCH_NEURONX_NEFF_DISABLE_CACHE", False, parse_flag, PER_CALL,
    "Disable the on-disk compile cache (the in-memory one stays).",
    read_at="compiler/cache.py, at each cache access")
DISABLE_FALLBACK_EXECUTION = _declare(
    "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", True, parse_flag, PER_CALL,
    "A graph with an op that has no lowering raises instead of running eagerly.",
    read_at="compiler/__init__.py, at each compile with unlowered ops")
METRICS_ENABLED = _declare(
    "TORCH_NEURONX_METRICS_ENABLED", True, parse_flag, PER_CALL,
    "Collect the get_dynamo_metrics() counters (0: not collected; the snapshot says enabled=False).",
    read_at="compiler/metrics.py, at each counted event and each snapshot")
DYNAMO_DISABLE_CPU_AUTOCOPY = _declare(
    "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", False, parse_flag, PER_CALL,
    "A CPU tensor passed to a compiled graph is an error instead of a device input.",
    read_at="compiler/graph.py, at each run of a compiled graph with a CPU input")

# NKI simulator.
PLATFORM_TARGET = _declare(
    "NEURON_PLATFORM_TARGET_OVERRIDE", "trn2", _text, PER_CALL,
    "Target generation of simulated NKI launches (trn2, trn3; checked by nki.targets).",
    read_at="nki/targets.py get_target, at each launch")

# Profiling: the Neuron Runtime's whole-process capture (AWS's NEURON_RT_INSPECT_*),
# emulated by torch_neuronx/profiling.py (docs/profiling.md).
INSPECT_ENABLE = _declare(
    "NEURON_RT_INSPECT_ENABLE", False, parse_flag, IMPORT,
    "Profile the whole process (torch.profiler with device events) and write the trace at exit.",
    read_at="profiling.start_from_environment, once")
INSPECT_OUTPUT_DIR = _declare(
    "NEURON_RT_INSPECT_OUTPUT_DIR", "./output", _text, IMPORT,
    "Directory of the whole-process trace (<dir>/<instance>_pid_<pid>/<timestamp>/trace.json).",
    read_at="profiling.start_from_environment, once")
INSPECT_SYSTEM_PROFILE = _declare(
    "NEURON_RT_INSPECT_SYSTEM_PROFILE", True, parse_flag, IMPORT,
    "With INSPECT_ENABLE: record the per-kernel device events (ProfileMode.RUNTIME).",
    read_at="profiling.start_from_environment, once")
INSPECT_DEVICE_PROFILE = _declare(
    "NEURON_RT_INSPECT_DEVICE_PROFILE", "0", _lower, IMPORT,
    "With INSPECT_ENABLE: 0, 1/model or session: instruction-level traces (ProfileMode.DEVICE), not emulated (warns).",
    read_at="profiling.start_from_environment, once")
INSPECT_MAX_EVENTS_PER_NC = _declare(
    "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", None, _integer, IMPORT,
    "With INSPECT_ENABLE: device events kept per core (later ones dropped); None: no limit.",
    read_at="profiling.start_from_environment, once")
INSPECT_EVENT_FILTER_NC = _declare(
    "NEURON_RT_INSPECT_EVENT_FILTER_NC", None, _text, IMPORT,
    "With INSPECT_ENABLE: cores whose device events are recorded ('0', '0-3', '0,2,4'); None: all.",
    read_at="profiling.start_from_environment, once")
INSPECT_EVENT_FILTER_TYPE = _declare(
    "NEURON_RT_INSPECT_EVENT_FILTER_TYPE", None, _text, IMPORT,
    "With INSPECT_ENABLE: runtime event types to capture; not emulated (warns, ignored).",
    read_at="profiling.start_from_environment, once")
INSPECT_DEVICE_PROFILE_NUM_WARMUP = _declare(
    "NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP", None, _text, IMPORT,
    "With INSPECT_ENABLE: executions skipped before device profiling; not emulated (warns, ignored).",
    read_at="profiling.start_from_environment, once")

# Other tools' variables.
LOCAL_RANK = _declare(
    "LOCAL_RANK", None, _integer, PER_CALL,
    "torchrun's rank on this node: the visible core the process binds to.",
    read_at="distributed/_backend.py, when the default process group is created", external=True)
LOCAL_WORLD_SIZE = _declare(
    "LOCAL_WORLD_SIZE", None, _integer_or_none, PER_CALL,
    "torchrun's number of processes on this node (a malformed value is ignored).",
    read_at="distributed/_backend.py, when the default process group is created", external=True)
RANK = _declare(
    "RANK", "0", _verbatim, PER_CALL,
    "torchrun's global rank: the rank<RANK>/ subdirectory of compilation artifacts (text as given).",
    read_at="compiler/artifacts.py", external=True)
XDG_CACHE_HOME = _declare(
    "XDG_CACHE_HOME", None, _verbatim, PER_CALL,
    "Base of the default compile cache directory (default ~/.cache; empty counts as unset).",
    read_at="compiler/cache.py", external=True)
XLA_FLAGS = _declare(
    "XLA_FLAGS", "", _verbatim, PER_CALL,
    "XLA's flags: part of every compile-cache key.",
    read_at="compiler/cache.py, once per process (the toolchain fingerprint is cached)", external=True)
TORCH_COMPILE_DEBUG = _declare(
    "TORCH_COMPILE_DEBUG", False, _pytorch_flag, PER_CALL,
    "PyTorch's debug switch (on only when exactly '1', as PyTorch reads it): AOTAutograd's own helper runs.",
    read_at="compiler/__init__.py, at each compile", external=True)


# ------------------------------------------------------------ typed accessors
# One per variable; each reads the environment when called.


def instance() -> str:
    """TORCH_NEURONX_INSTANCE: the instance profile's name (checked by device.profiles)."""
    return INSTANCE.get()


def visible_cores() -> str | None:
    """NEURON_RT_VISIBLE_CORES as written (parsed by device.profiles), None when unset or empty."""
    return VISIBLE_CORES.get()


def num_cores() -> int | None:
    """NEURON_RT_NUM_CORES, None when unset or empty (0 also means all cores)."""
    return NUM_CORES.get()


def logical_nc_config() -> int | None:
    """NEURON_LOGICAL_NC_CONFIG (1 or 2), None when unset or empty (the platform's default)."""
    return LOGICAL_NC_CONFIG.get()


def fallback_mode() -> str:
    """TORCH_NEURONX_FALLBACK as written ('warn' when unset)."""
    return FALLBACK.get()


def fp64_mode() -> str:
    """TORCH_NEURONX_FP64, lower case ('emulate' when unset)."""
    return FP64.get()


def launch_blocking() -> bool:
    """NEURON_LAUNCH_BLOCKING (a flag)."""
    return LAUNCH_BLOCKING.get()


def log_level() -> str | None:
    """TORCH_NEURONX_LOG_LEVEL, upper case, or None when unset (checked by log.configure)."""
    return LOG_LEVEL.get()


def log_file() -> str | None:
    """TORCH_NEURONX_LOG_FILE, or None when unset or empty."""
    return LOG_FILE.get()


def fallback_only_for_unimplemented_ops() -> bool:
    """TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS (a flag)."""
    return FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS.get()


def metrics_enabled() -> bool:
    """TORCH_NEURONX_METRICS_ENABLED (a flag, on by default)."""
    return METRICS_ENABLED.get()


def disable_integrations() -> bool:
    """TORCH_NEURONX_DISABLE_INTEGRATIONS (a flag)."""
    return DISABLE_INTEGRATIONS.get()


def enable_stack_trace() -> bool:
    """TORCH_NEURONX_ENABLE_STACK_TRACE (a flag)."""
    return ENABLE_STACK_TRACE.get()


def child_environment(**variables: str) -> dict[str, str]:
    """This process's environment plus `variables`, for a child process (the
    command `torch-neuronx audit` runs, with AUDIT_DIR set)."""
    unknown = [name for name in variables if name not in VARIABLES]
    if unknown:
        raise AssertionError(f"undeclared variables {unknown}: declare them in torch_neuronx/config.py")
    return {**os.environ, **variables}


def audit_dir() -> str | None:
    """TORCH_NEURONX_AUDIT_DIR: where this process writes its audit record; None: not audited."""
    return AUDIT_DIR.get()


def debug_dir() -> str | None:
    """TORCH_NEURONX_DEBUG_DIR, or None when unset."""
    return DEBUG_DIR.get()


def preserve_compilation_artifacts() -> bool:
    """TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS (a flag)."""
    return PRESERVE_COMPILATION_ARTIFACTS.get()


def neff_cache_dir() -> str:
    """TORCH_NEURONX_NEFF_CACHE_DIR, else $XDG_CACHE_HOME/torch_neuronx/neff
    (~/.cache when XDG_CACHE_HOME is unset or empty). Whether the cache is on
    at all is neff_disable_cache()."""
    configured = NEFF_CACHE_DIR.get()
    if configured:
        return configured
    base = XDG_CACHE_HOME.get() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_neuronx", "neff")


def neff_cache_max_size() -> int | None:
    """TORCH_NEURONX_NEFF_CACHE_MAX_SIZE in bytes (10 GiB when unset), None for no limit."""
    return NEFF_CACHE_MAX_SIZE.get()


def neff_disable_cache() -> bool:
    """TORCH_NEURONX_NEFF_DISABLE_CACHE (a flag)."""
    return NEFF_DISABLE_CACHE.get()


def disable_fallback_execution() -> bool:
    """TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION (a flag, on by default)."""
    return DISABLE_FALLBACK_EXECUTION.get()


def dynamo_disable_cpu_autocopy() -> bool:
    """TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY (a flag)."""
    return DYNAMO_DISABLE_CPU_AUTOCOPY.get()


def platform_target() -> str:
    """NEURON_PLATFORM_TARGET_OVERRIDE as written ('trn2' when unset; checked by nki.targets)."""
    return PLATFORM_TARGET.get()


def local_rank() -> int | None:
    """LOCAL_RANK, None when unset; ValueError naming it when not an integer."""
    return LOCAL_RANK.get()


def local_world_size() -> int | None:
    """LOCAL_WORLD_SIZE, None when unset or not an integer."""
    return LOCAL_WORLD_SIZE.get()


def rank() -> str:
    """RANK as written ('0' when unset)."""
    return RANK.get()


def xla_flags() -> str:
    """XLA_FLAGS as written ('' when unset)."""
    return XLA_FLAGS.get()


def torch_compile_debug() -> bool:
    """TORCH_COMPILE_DEBUG as PyTorch reads it (exactly '1')."""
    return TORCH_COMPILE_DEBUG.get()


def inspect_enable() -> bool:
    """NEURON_RT_INSPECT_ENABLE: profile the whole process."""
    return INSPECT_ENABLE.get()


def inspect_output_dir() -> str:
    """NEURON_RT_INSPECT_OUTPUT_DIR (default ./output)."""
    return INSPECT_OUTPUT_DIR.get()


def inspect_system_profile() -> bool:
    """NEURON_RT_INSPECT_SYSTEM_PROFILE (default on)."""
    return INSPECT_SYSTEM_PROFILE.get()


def inspect_device_profile() -> str:
    """NEURON_RT_INSPECT_DEVICE_PROFILE: '0', '1', 'model' or 'session'."""
    value = INSPECT_DEVICE_PROFILE.get()
    if value not in ("0", "1", "model", "session"):
        raise ValueError(f"{INSPECT_DEVICE_PROFILE.name}={value!r}: expected 0, 1, model or session")
    return value


def inspect_max_events_per_nc() -> int | None:
    """NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC, None when unset."""
    return INSPECT_MAX_EVENTS_PER_NC.get()


def inspect_event_filter_nc() -> str | None:
    """NEURON_RT_INSPECT_EVENT_FILTER_NC as written, None when unset."""
    return INSPECT_EVENT_FILTER_NC.get()


def inspect_event_filter_type() -> str | None:
    """NEURON_RT_INSPECT_EVENT_FILTER_TYPE as written, None when unset."""
    return INSPECT_EVENT_FILTER_TYPE.get()


def inspect_device_profile_num_warmup() -> str | None:
    """NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP as written, None when unset."""
    return INSPECT_DEVICE_PROFILE_NUM_WARMUP.get()


def project_variables() -> list[str]:
    """Names of the variables this project defines (TORCH_NEURONX_*, NEURON_*)."""
    return sorted(name for name, variable in VARIABLES.items() if not variable.external)
