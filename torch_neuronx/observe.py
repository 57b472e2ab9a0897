"""The one seam for observing device work: what ran, on which core, how long, with
which arguments.

Eager kernels (native, CPU fallback, direct, and the Python kernels through
`_C._AuditKernelCall`) are observed in C++: csrc/Recorder.h's RecordedCall, one
flag word read per call. Every other kind of device work reports here:

- compiled graph runs (compiler/executable.py), kind "graph";
- NKI kernel launches on neuron tensors (nki/kernel.py), kind "nki";
- collectives (distributed/_kernels.py), kind "collective";
- and one compile-time observation, the ops of a graph with no lowering
  (compiler/backend.py), `unlowered()`.

Its observers are the audit's recording (audit/recorder.py) and torch.profiler's
device activity (profiling.py). They subscribe; the layers that do the work
import only this module and never know who listens. With no observer active a
report costs one loop over the (at most two) observers.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

KINDS = ("graph", "nki", "collective")


class DeviceWork:
    """One piece of device work. `args`: JSON values (shown in traces, recorded);
    `objects`: in-process references an observer may need (a graph's executable)."""

    __slots__ = ("kind", "name", "device", "start_ns", "end_ns", "args", "objects")

    def __init__(self, kind: str, name: str, device: int, args: dict, objects: dict):
        if kind not in KINDS:
            raise ValueError(f"device work of kind {kind!r}: use one of {', '.join(KINDS)}")
        self.kind, self.name, self.device = kind, name, device
        self.args, self.objects = args, objects
        self.start_ns = self.end_ns = 0

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class Observer(Protocol):
    def active(self) -> bool:
        """Whether it wants reports now (a cheap check: an audit records, a profile collects)."""

    def device_work(self, work: DeviceWork) -> None:
        """One piece of device work, after it ran (not called when it raised)."""

    def unlowered(self, graph_kind: str, missing: list) -> None:
        """The ops of a `graph_kind` graph that have no lowering (compiler/lowerability.py)."""


_OBSERVERS: list[Observer] = []
_LOCK = threading.Lock()


def subscribe(observer: Observer) -> None:
    with _LOCK:
        if observer not in _OBSERVERS:
            _OBSERVERS.append(observer)


def unsubscribe(observer: Observer) -> None:
    with _LOCK:
        if observer in _OBSERVERS:
            _OBSERVERS.remove(observer)


def _active() -> list[Observer]:
    return [observer for observer in _OBSERVERS if observer.active()]


def observed() -> bool:
    """Whether any observer wants reports now (ops/ asks it before recording a Python kernel's
    call through the C++ seam)."""
    return any(observer.active() for observer in _OBSERVERS)


def _now_ns() -> int:
    from torch_neuronx import _C  # the profiler's clock, so that device events line up with CPU ops

    return _C._profiler_now_ns()


class work:
    """`with observe.work("graph", name, device, **args) as w:` around a piece of device
    work; `w.objects` may be filled inside. Observers hear of it when it returns."""

    __slots__ = ("_work", "_observers")

    def __init__(self, kind: str, name: str, device: int, objects: dict[str, Any] | None = None, **args):
        self._observers = _active()
        self._work = DeviceWork(kind, name, device, args, objects or {}) if self._observers else None

    def __enter__(self) -> DeviceWork | None:
        if self._work is not None:
            self._work.start_ns = _now_ns()
        return self._work

    def __exit__(self, kind, value, traceback) -> None:
        if self._work is None or kind is not None:
            return
        self._work.end_ns = _now_ns()
        for observer in self._observers:
            observer.device_work(self._work)


def unlowered(graph_kind: str, missing: list) -> None:
    for observer in _active():
        observer.unlowered(graph_kind, missing)
