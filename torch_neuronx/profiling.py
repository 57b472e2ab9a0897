"""torch_neuronx.profiling: AWS's Neuron configuration of ``torch.profiler``, emulated.

With ``ProfilerActivity.PrivateUse1`` (``ProfilerActivity.NEURON``) in a
``torch.profiler.profile``, the C++ core (csrc/Profiler.cpp, a Kineto child
profiler) records one device event per kernel run on a NeuronCore, linked to
the CPU op that launched it. This module adds the names AWS documents for
TorchNeuron (``NeuronConfig``, ``ProfileMode``, ``NeuronProfiler``, the
``NEURON_RT_INSPECT_*`` variables) and maps each to what the emulator records;
what it cannot record is said in a warning (and in docs/profiling.md).

The emulator runs every kernel synchronously on the host, so a device event's
duration is the host time of its kernel, not an estimate of Trainium's (NKI
kernels carry the cost model's trn2/trn3 estimate as an argument).
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Iterable

from torch._C._profiler import _ExperimentalConfig

from torch_neuronx import _C, config, observe
from torch_neuronx.neuron.profiles import parse_core_list

__all__ = ["ProfileMode", "NeuronConfig", "NeuronProfiler", "NRTProfilerError", "record_kernel", "collecting"]


class ProfileMode(enum.Enum):
    """What a profile collects (AWS: ``torch_neuronx.profiling.ProfileMode``)."""

    DEVICE = "device"  # Trainium: instruction-level NeuronCore traces (.ntff)
    RUNTIME = "runtime"  # Trainium: the Neuron Runtime's system trace (executions per core)
    CPU_UTIL = "cpu_util"  # Trainium: sampled host CPU utilization
    HOST_MEMORY = "host_memory"  # Trainium: sampled host memory usage


# Why a mode records nothing here (the modes not listed are emulated).
NOT_EMULATED = {
    ProfileMode.DEVICE: "instruction-level device traces (.ntff, .neff files) are not emulated: the "
                        "emulator runs kernels as host code and has no NeuronCore instructions to "
                        "trace (device events are recorded per kernel, as RUNTIME records them; NKI "
                        "kernels carry the cost model's estimated latency)",
    ProfileMode.CPU_UTIL: "host CPU utilization (cpu_util.pb) is not sampled",
    ProfileMode.HOST_MEMORY: "host memory usage (host_mem.pb) is not sampled (for device "
                             "memory use torch.neuron.memory._record_memory_history)",
}
DEFAULT_MODES = (ProfileMode.DEVICE, ProfileMode.RUNTIME)  # AWS's default
DEFAULT_OUTPUT_DIR = "./output"  # NEURON_RT_INSPECT_OUTPUT_DIR's default


class NeuronConfig(_ExperimentalConfig):
    """AWS's Neuron profiler configuration, passed as ``experimental_config=`` to
    ``torch.profiler.profile`` together with ``ProfilerActivity.PrivateUse1``.

    Emulated: ``modes`` RUNTIME (a device event per kernel: eager op, compiled
    graph run, NKI kernel), ``max_events_per_nc`` (events past it are dropped and
    counted in the trace's ``neuron_dropped_events``), ``capture_enabled_for_nc``
    (device indices, ``neuron:N``), ``profile_output_dir`` (where
    ``NeuronProfiler.export_trace`` writes). Not emulated (a warning says so):
    modes DEVICE, CPU_UTIL, HOST_MEMORY and ``neff_cache_dir``.
    ``precache_node_info`` has nothing to precache here and is accepted as is.
    Other keyword arguments go to ``torch.profiler._ExperimentalConfig``.
    """

    def __init__(self, modes: Iterable[ProfileMode] | None = None, max_events_per_nc: int | None = None,
                 capture_enabled_for_nc: str | None = None, profile_output_dir: str | None = None,
                 neff_cache_dir: str | None = None, precache_node_info: bool = True, **experimental):
        self.modes = tuple(DEFAULT_MODES if modes is None else (ProfileMode(m) for m in modes))
        if max_events_per_nc is not None and int(max_events_per_nc) < 0:
            raise ValueError(f"max_events_per_nc={max_events_per_nc!r} must be a non-negative number")
        self.max_events_per_nc = None if max_events_per_nc is None else int(max_events_per_nc)
        self.capture_enabled_for_nc = capture_enabled_for_nc
        self.cores = (None if capture_enabled_for_nc is None
                      else parse_core_list(capture_enabled_for_nc, "capture_enabled_for_nc"))
        self.profile_output_dir = profile_output_dir or DEFAULT_OUTPUT_DIR
        self.neff_cache_dir = neff_cache_dir
        self.precache_node_info = precache_node_info
        self._warn_not_emulated()
        super().__init__(custom_profiler_config=self._capture_string(), **experimental)

    def _capture_string(self) -> str:
        """What the C++ profiler reads from Kineto's config (csrc/Profiler.cpp, Capture):
        "key:value;..." (Kineto's own parser takes a line with a second '=' as invalid)."""
        items = [f"neuron_device_events:{int(ProfileMode.RUNTIME in self.modes or ProfileMode.DEVICE in self.modes)}"]
        if self.max_events_per_nc is not None:
            items.append(f"neuron_max_events_per_nc:{self.max_events_per_nc}")
        if self.cores is not None:
            items.append("neuron_capture_enabled_for_nc:" + ",".join(map(str, self.cores)))
        return ";".join(items)

    def _warn_not_emulated(self) -> None:
        reasons = [f"ProfileMode.{mode.name}: {NOT_EMULATED[mode]}"
                   for mode in self.modes if mode in NOT_EMULATED]
        if self.neff_cache_dir is not None:
            reasons.append("neff_cache_dir: there are no NEFFs to copy (compiled graphs are XLA "
                           "executables, cached as TORCH_NEURONX_NEFF_CACHE_DIR says)")
        if reasons:
            warnings.warn("torch_neuronx.profiling: the emulator records device events per kernel "
                          "(host times); not emulated: " + "; ".join(reasons) + ". See "
                          "docs/profiling.md.", stacklevel=3)


class NRTProfilerError(Exception):
    """A capture could not start or stop (AWS: the Neuron Runtime's inspect API
    returned an error status; here: its output directory cannot be made, or
    torch.profiler refused to start)."""


PYTORCH_TRACE_FILE = "pytorch_trace.json"  # AWS's default name, in neuron_output_dir


class NeuronProfiler:
    """AWS's profiler of a region, in both of AWS's forms.

    - ``NeuronProfiler(neuron_config)`` with ``export_trace`` as a
      ``torch.profiler.profile``'s ``on_trace_ready`` (AWS's documented form).
    - ``NeuronProfiler(pytorch_activities=..., record_shapes=..., pytorch_trace_file=...,
      neuron_output_dir="./output", event_filters={"nc": [...], "types": [...]})`` as a
      context manager or with ``start()`` / ``stop()`` / ``is_active()`` (TorchNeuron's
      own wrapper): a capture of the runtime, plus a PyTorch profile of
      ``pytorch_activities`` when given.

    A capture's runtime trace goes to ``<dir>/<instance>_pid_<pid>/<timestamp>/trace.json``
    (one instance subdirectory per process, one timestamp directory per capture).
    The instance part is ``emulated-<TORCH_NEURONX_INSTANCE>-<host name>`` (there is
    no EC2 instance id), and trace.json, a Chrome trace of the device events, stands
    in for the runtime's .pb / .ntff / .neff files, which have no emulated counterpart.
    """

    def __init__(self, neuron_config: NeuronConfig | Iterable | None = None, *,
                 pytorch_activities: Iterable | None = None, record_shapes: bool = False,
                 pytorch_trace_file: str | None = None, neuron_output_dir: str | None = None,
                 event_filters: dict | None = None):
        if neuron_config is not None and not isinstance(neuron_config, NeuronConfig):
            # TorchNeuron's wrapper takes pytorch_activities first.
            neuron_config, pytorch_activities = None, neuron_config
        self.pytorch_activities = list(pytorch_activities or [])
        self.record_shapes = record_shapes
        self.event_filters = event_filters
        self.config = neuron_config or self._config_of(neuron_output_dir, event_filters)
        self.neuron_output_dir = neuron_output_dir or self.config.profile_output_dir
        self.pytorch_trace_file = (os.path.join(self.neuron_output_dir, pytorch_trace_file or PYTORCH_TRACE_FILE)
                                   if self.pytorch_activities else None)
        self.paths: list[str] = []
        self.torch_profile = None  # the torch.profiler.profile of the last capture
        self._active = False

    @staticmethod
    def _config_of(output_dir: str | None, event_filters: dict | None) -> NeuronConfig:
        filters = event_filters or {}
        cores = filters.get("nc")
        if filters.get("types"):
            warnings.warn(f"torch_neuronx.profiling: event_filters['types'] {list(filters['types'])} "
                          "not emulated (ignored): the Neuron Runtime's event types do not exist "
                          "here; every kernel of the chosen cores is recorded. See docs/profiling.md.",
                          stacklevel=3)
        return NeuronConfig(modes=[ProfileMode.RUNTIME], profile_output_dir=output_dir,
                            capture_enabled_for_nc=None if not cores else ",".join(map(str, cores)))

    # ------------------------------------------------ TorchNeuron's wrapper

    def is_active(self) -> bool:
        return self._active

    def has_pytorch_profiling(self) -> bool:
        return bool(self.pytorch_activities)

    def get_nrt_output_directory(self) -> str:
        return self.neuron_output_dir

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        if self._active:
            raise RuntimeError("Profiler is already active: call stop() before starting it again")
        try:
            os.makedirs(self.neuron_output_dir, exist_ok=True)
        except OSError as error:
            raise NRTProfilerError(f"Failed to set NRT output directory {self.neuron_output_dir!r}: "
                                   f"{error}") from error
        # One torch.profiler profile serves both: the device events are the runtime capture.
        activities = list(dict.fromkeys([*self.pytorch_activities, ProfilerActivity.PrivateUse1]))
        prof = profile(activities=activities, record_shapes=self.record_shapes,
                       experimental_config=self.config)
        try:
            prof.start()
        except Exception as error:
            raise NRTProfilerError(f"Failed to start NRT profiling: {error}") from error
        self.torch_profile, self._active = prof, True

    def stop(self) -> None:
        """Ends the capture and writes its files; errors of each step are gathered
        and raised together (the capture is stopped whatever happens)."""
        if not self._active:
            raise RuntimeError("Profiler is not active: call start() first")
        self._active = False
        errors = []
        steps = [self.torch_profile.stop, lambda: self.export_trace(self.torch_profile)]
        if self.pytorch_trace_file:  # a profile exports once: the same trace, copied
            steps.append(lambda: shutil.copyfile(self.paths[-1], self.pytorch_trace_file))
        for step in steps:
            try:
                step()
            except Exception as error:  # noqa: BLE001 - reported below, after the other steps
                errors.append(error)
                if step is steps[0]:
                    break  # nothing to write
        if errors:
            raise RuntimeError("Profiling errors:\n" + "\n".join(f"  - {type(e).__name__}: {e}" for e in errors))

    def __enter__(self) -> "NeuronProfiler":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def get_pytorch_trace(self) -> str | None:
        """The PyTorch profile's operator table, once the capture has stopped."""
        if self.has_pytorch_profiling() and self.torch_profile is not None and not self._active:
            return self.torch_profile.key_averages().table()
        return None

    def export_pytorch_trace(self, filename: str) -> None:
        if self.torch_profile is None or not self.has_pytorch_profiling():
            raise ValueError("PyTorch profiling not enabled or not started")
        if self._active:
            raise ValueError("Cannot export trace while profiling is active")
        shutil.copyfile(self.paths[-1], filename)  # what stop() exported (a profile exports once)

    # ------------------------------------------------ the trace layout

    def session_directory(self) -> str:
        instance = f"emulated-{config.instance()}-{socket.gethostname()}"
        base = os.path.join(self.neuron_output_dir, f"{instance}_pid_{os.getpid()}")
        stamp = time.strftime("%Y%m%d_%H%M%S")
        path, n = os.path.join(base, stamp), 1
        while os.path.exists(path):  # one directory per exported trace (schedule cycles)
            path, n = os.path.join(base, f"{stamp}_{n}"), n + 1
        return path

    def export_trace(self, prof) -> str:
        directory = self.session_directory()
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "trace.json")
        prof.export_chrome_trace(path)
        self.paths.append(path)
        return path


# ------------------------------------------------------------ kernels from Python


def collecting() -> bool:
    """True while a profile records device events (one C++ atomic load)."""
    return _C._profiler_collecting()


def now_ns() -> int:
    """The time on the trace's clock (ns since the epoch)."""
    return _C._profiler_now_ns()


def record_kernel(name: str, device: int, start_ns: int, end_ns: int, **args) -> None:
    """Records a kernel that ran on core ``device`` (its current stream) from
    ``start_ns`` to ``end_ns`` (``now_ns()`` clock), linked to the calling
    thread's current CPU op. ``args`` are shown in the trace (JSON values)."""
    _C._profiler_record(name, device, start_ns, end_ns,
                        [(key, json.dumps(value)) for key, value in args.items()])


class _DeviceEvents:
    """torch.profiler's device events of the work torch_neuronx/observe.py reports (compiled
    graph runs, NKI launches, collectives); eager kernels record theirs in C++."""

    PREFIX = {"graph": "neuron_graph", "nki": "nki", "collective": "neuron_collective"}
    PATH = {"graph": "compiled_graph", "nki": "nki", "collective": "collective"}

    def active(self) -> bool:
        return collecting()

    def device_work(self, work) -> None:
        args = dict(work.args)
        if "estimates" in work.objects:  # NKI: the cost model's trn2/trn3 estimates
            args.update(work.objects["estimates"]())
        record_kernel(f"{self.PREFIX[work.kind]}::{work.name}", work.device, work.start_ns, work.end_ns,
                      path=self.PATH[work.kind], **args)

    def unlowered(self, graph_kind: str, missing: list) -> None:
        pass  # a compile-time fact, no device event


observe.subscribe(_DeviceEvents())


# ------------------------------------------------- NEURON_RT_INSPECT_* (whole process)

_LIFETIME_LOCK = threading.Lock()
_LIFETIME = None


def start_from_environment() -> None:
    """NEURON_RT_INSPECT_ENABLE=1: profile the whole process, as the Neuron Runtime
    does, and write the trace under NEURON_RT_INSPECT_OUTPUT_DIR at exit. Called
    once, when torch_neuronx is imported."""
    global _LIFETIME
    if not config.inspect_enable():
        return
    import atexit

    from torch.profiler import ProfilerActivity, profile

    modes = [ProfileMode.RUNTIME] if config.inspect_system_profile() else []
    if config.inspect_device_profile() != "0":
        modes.append(ProfileMode.DEVICE)
    unsupported = [name for name, value in (
        (config.inspect_event_filter_type.name, config.inspect_event_filter_type()),
        (config.inspect_device_profile_num_warmup.name, config.inspect_device_profile_num_warmup()))
        if value is not None]
    if unsupported:
        warnings.warn(f"torch_neuronx.profiling: {', '.join(unsupported)} not emulated (ignored): "
                      "every kernel of the process is recorded. See docs/profiling.md.", stacklevel=2)
    neuron_config = NeuronConfig(modes=modes, max_events_per_nc=config.inspect_max_events_per_nc(),
                                 capture_enabled_for_nc=config.inspect_event_filter_nc(),
                                 profile_output_dir=config.inspect_output_dir())
    exporter = NeuronProfiler(neuron_config)
    with _LIFETIME_LOCK:
        _LIFETIME = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                            experimental_config=neuron_config)
        _LIFETIME.start()
    atexit.register(_stop_lifetime, exporter)


def _stop_lifetime(exporter: NeuronProfiler) -> None:
    global _LIFETIME
    with _LIFETIME_LOCK:
        prof, _LIFETIME = _LIFETIME, None
    if prof is not None:
        prof.stop()
        exporter.export_trace(prof)
