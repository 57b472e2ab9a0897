"""The recording of one process for `torch-neuronx audit`.

The audit runs the user's command with TORCH_NEURONX_AUDIT_DIR set; every
process that loads the device then starts a Recording (torch_neuronx/__init__.py
calls start_from_env) and writes it to that directory as `record-<pid>.json`
when the process exits, also after an exception or Ctrl-C. The report
(report.py) merges the records of all processes (torchrun ranks).

What is recorded, and how:
- every device op call, by signature, in C++ (csrc/Recorder.h): calls and host
  time. Python hears of each signature's first call (`_on_signature`) and of
  every call of the signatures it watches (`_on_call`): CPU fallbacks, host
  syncs, float64 and data-dependent shapes, whose user source lines the report
  names;
- steps: each `step()` of the first optimizer seen (a global post-hook), or
  `torch_neuronx.audit.mark_step()` where there is no optimizer;
- phases: work that is not a training step, kept apart from the steps' figures:
  named phases (`torch_neuronx.audit.phase("evaluate")`, the HF Trainer's
  evaluate/predict, generate after training: units.py) and the work after the
  last step (an evaluation loop, saving). The C++ recorder keeps each
  signature's totals at the last step's end (`_audit_mark_step`); a phase's
  work is the difference of two snapshots, its entry and its exit;
- memory: the most bytes allocated per core within each step and each phase
  (the allocator's window peak; the user's own peak statistics are not reset);
- torch.compile: Dynamo's graph breaks (reason and line), the compiler's
  counters and recompile reasons, each compiled graph's runs and XLA cost
  analysis, ops with no lowering;
- NKI kernel launches on neuron tensors, with the cost model's estimates, and
  collectives.

Compiled graph runs, NKI launches, collectives and ops with no lowering reach
the recording through torch_neuronx/observe.py (the Recording is an observer
while it records); eager kernels through the C++ recorder.

Nothing here runs unless the audit asked for it: ACTIVE is None otherwise.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import linecache
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections import Counter, defaultdict

import torch

from torch_neuronx import observe
from torch_neuronx.audit import fusion
from torch_neuronx.ops import registry

RECORD_VERSION = 2
AFTER_LAST_STEP = "after_last_step"  # the phase of the work after the last step outside named phases

# The recording of this process, or None (no audit): the compiler's hooks test it.
ACTIVE: "Recording | None" = None

# The op classes behind the hazards are the registry's (ops/registry.py): HOST_SYNC (the
# device waits while the host reads its result), DATA_DEPENDENT (the host must learn an
# output's shape or value before going on), copies (move float64 exactly: no float64
# hazard) and FP8_COMPUTE (Trainium3 only; float8 storage and casts run everywhere).
FP64 = {"float64", "complex128"}


# ----------------------------------------------------------------- user lines

def _library_roots() -> tuple[str, ...]:
    import torch_neuronx

    paths = sysconfig.get_paths()
    roots = {os.path.dirname(torch.__file__), os.path.dirname(torch_neuronx.__file__),
             paths["stdlib"], paths["purelib"], paths["platlib"]}
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


_ROOTS: tuple[str, ...] = ()
_FRAMEWORK_ROOTS: tuple[str, ...] = ()
_IS_LIBRARY: dict[str, bool] = {}


def _framework_roots() -> tuple[str, ...]:
    import torch_neuronx

    roots = {os.path.dirname(torch.__file__), os.path.dirname(torch_neuronx.__file__),
             sysconfig.get_paths()["stdlib"]}
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


def _is_library(filename: str) -> bool:
    known = _IS_LIBRARY.get(filename)
    if known is None:
        known = filename.startswith("<") or os.path.realpath(filename).startswith(_ROOTS) \
            or "site-packages" in filename or "dist-packages" in filename
        _IS_LIBRARY[filename] = known
    return known


def _first_user_frame(frame):
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _is_framework(filename: str) -> bool:
    """torch, this package, the standard library: code under the library a user calls."""
    return filename.startswith("<") or os.path.realpath(filename).startswith(_FRAMEWORK_ROOTS)


def _library_frame(frame, user_frame):
    """The innermost frame of a third-party library (transformers, accelerate) between
    the call and the user's frame: where a library the user does not edit made it."""
    while frame is not None and frame is not user_frame:
        filename = frame.f_code.co_filename
        if _is_library(filename) and not _is_framework(filename):
            return (filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def user_site(with_library: bool = False) -> tuple | None:
    """(file, line, function, backward) of the first frame outside torch, the
    libraries and the standard library; for a call made by the autograd engine's
    device thread (a backward op), the line the main thread is at (loss.backward()).
    with_library: a fifth item, the innermost third-party library frame on the
    way there (file, line, function), or None: the call was made inside that
    library (the HF Trainer's own .item()), not on the user's line."""
    start = sys._getframe(1)
    frame = _first_user_frame(start)
    # A backward op: run by the autograd engine on this thread (the line is the user's
    # loss.backward(); torch_neuronx/_startup.py keeps the importing thread's backward passes
    # on it) or on the engine's device thread (below).
    backward = torch._C._current_graph_task_id() != -1
    if frame is None and threading.get_ident() != threading.main_thread().ident:
        start = sys._current_frames().get(threading.main_thread().ident)
        frame = _first_user_frame(start)
        backward = True
    if frame is None:
        return None
    site = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, backward)
    return site + (_library_frame(start, frame),) if with_library else site


def site_json(site) -> dict | None:
    if site is None:
        return None
    filename, line, function, backward = site[:4]
    described = {"file": filename, "line": line, "function": function, "backward": backward,
                 "code": linecache.getline(filename, line).strip()}
    if len(site) > 4 and site[4] is not None:
        lib_file, lib_line, lib_function = site[4]
        described["library"] = {"file": lib_file, "line": lib_line, "function": lib_function,
                                "code": linecache.getline(lib_file, lib_line).strip()}
    return described


# ------------------------------------------------------------------- hazards

def is_tensor(arg) -> bool:
    """Whether a recorded argument describes a tensor: {"dtype", "shape", "device"}
    (csrc/Module.cpp toPython builds the descriptions)."""
    return isinstance(arg, dict) and "dtype" in arg and "shape" in arg


def tensors(args):
    """The tensor descriptions among a signature's arguments, lists flattened."""
    for arg in args:
        if is_tensor(arg):
            yield arg
        elif isinstance(arg, (list, tuple)):
            yield from tensors(arg)


def _copies_to_host(op: str, args: list) -> bool:
    """A copy from a neuron tensor into a CPU one: copy_(dst, src) (.cpu() takes this
    path) or _copy_from(src, dst). Only these copies take two tensors."""
    if not registry.is_copy(op) or len(args) < 2 or not (is_tensor(args[0]) and is_tensor(args[1])):
        return False
    source, target = (args[1], args[0]) if registry.base_name(op) == "copy" else (args[0], args[1])
    return source["device"].startswith("neuron") and target["device"] == "cpu"


def _data_dependent(op: str, args: list) -> bool:
    """A call of a DATA_DEPENDENT op, but for repeat_interleave given its output_size (its
    last argument, an int): the caller states the shape, the host reads nothing."""
    base = registry.base_name(op)
    if base not in registry.DATA_DEPENDENT:
        return False
    return not (base == "repeat_interleave" and args and isinstance(args[-1], int))


def hazards_of(op: str, path: str, args: list) -> list[str]:
    """Why every call of this signature is watched (with its line), or []."""
    found = []
    if path == "fallback":
        found.append("fallback")
    if registry.base_name(op) in registry.HOST_SYNC:
        found.append("host_sync")
    elif _copies_to_host(op, args):
        found.append("host_sync")  # .cpu(), .tolist(), .numpy(): device-to-host copies
    if _data_dependent(op, args):
        found.append("data_dependent_shape")
    described = list(tensors(args))
    if any(t["dtype"] in FP64 and t["device"].startswith("neuron") for t in described) \
            and not registry.is_copy(op):
        found.append("float64")
    if registry.base_name(op) in registry.FP8_COMPUTE:
        found.append("fp8")
    return found


# ----------------------------------------------------------------- recording

@contextlib.contextmanager
def unrecorded():
    """The audit's own device work (reading a batch's token count) is not the program's:
    the calls made inside are not recorded."""
    from torch_neuronx import _C

    before = _C._audit_ignore_calls(True)
    try:
        yield
    finally:
        _C._audit_ignore_calls(before)


def _add(totals: dict, key, calls: int, host_ns: int) -> None:
    row = totals.setdefault(key, [0, 0])
    row[0] += calls
    row[1] += host_ns


def _split(by: Counter, steps: int) -> tuple[float, float, float, dict]:
    """(step 1, all steps, after the last step, {phase: n}) of a count kept by
    Recording._where(). With no step, the whole run outside phases is the one step."""
    in_steps = sum(v for k, v in by.items() if isinstance(k, int) and k < max(steps, 1))
    first = by.get(0, 0) if steps else in_steps
    after = by.get(steps, 0) if steps else 0
    return first, in_steps, after, {k: v for k, v in by.items() if isinstance(k, str)}


class Recording:
    """What one process did while audited; `record()` is its JSON form."""

    def __init__(self, directory: str | None = None):
        self.directory = directory
        self.started = time.time()
        self._t0 = time.perf_counter()
        self.signatures: dict[int, dict] = {}
        self.watched: dict[int, dict] = {}  # id -> calls by site, by step and by phase
        self.steps: list[dict] = []
        self.step_source: str | None = None
        self._optimizer: int | None = None
        self._first_step_totals: list = []
        self.graphs: dict[str, dict] = {}
        self.graph_breaks: Counter = Counter()
        self._breaks_seen = 0
        self.unlowered_ops: Counter = Counter()  # (op, source, graph kind) -> graphs
        self.nki: dict = {}  # (kernel, grid, instructions) -> launches by _where(), host time, estimates
        self.collectives: Counter = Counter()  # (op, bytes, world size) -> calls
        # The model of fusion (fusion.py): sequence id -> its signature ids, launches by
        # _where(), and what ended it (cut code or signature id) -> launches by _where().
        self.fused: dict[int, dict] = {}
        self._collective_steps: dict = defaultdict(Counter)  # key -> Counter by _where()
        self.units: dict = {}  # unit, source, units_per_step (steady state)
        self._units_in_step = 0
        # Phases: work that is not a training step (see the module docstring).
        self.phases: dict[str, dict] = {}  # name -> its occurrences, time, units, memory, signatures
        self._phase: dict | None = None  # the open phase (nested ones belong to it)
        self._phase_since_mark: dict = {}  # signature id -> [calls, host_ns] in phases since the last step
        self._phase_before_mark: dict = {}  # ... in phases before the last step's end
        self._phase_before_first: dict = {}  # ... in phases before the first step's end
        self._held_peak: list[int] = []  # a step's memory peak before a phase inside it took the window
        self.exception: str | None = None
        self.interrupted = False
        self._hooks: list = []
        self._last_progress = 0.0

    # -- switching on and off ------------------------------------------------------
    def start(self) -> None:
        global ACTIVE, _ROOTS, _FRAMEWORK_ROOTS
        from torch_neuronx import _C

        _ROOTS = _library_roots()
        _FRAMEWORK_ROOTS = _framework_roots()
        ACTIVE = self
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from torch_neuronx.audit import units

        self._hooks.append(register_optimizer_step_post_hook(self._optimizer_step))
        units.register()
        observe.subscribe(self)
        from torch_neuronx import config

        _C._audit_fusion_limit(config.concatenation_buffer_size_limit())
        # The C++ recorder calls these from inside ops. An op run eagerly by a function that
        # torch.compile split (a graph break) runs while Dynamo watches new Python frames, and it
        # would compile these callbacks and report their own graph breaks as the script's.
        _C._audit_start(torch.compiler.disable(self._on_signature), torch.compiler.disable(self._on_call))

    def stop(self) -> None:
        global ACTIVE
        from torch_neuronx import _C

        _C._audit_stop()
        observe.unsubscribe(self)
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        ACTIVE = None

    @property
    def in_phase(self) -> bool:
        return self._phase is not None

    def _where(self):
        """Where work is going now: the open phase's name, or the index of the step in
        progress (0 is step 1; len(self.steps) after the last step)."""
        return self._phase["name"] if self._phase is not None else len(self.steps)

    # -- the C++ recorder's callbacks ------------------------------------------------
    def _on_signature(self, sig_id: int, op: str, path: str, args: list, allocated: int) -> int:
        site = user_site(with_library=True)
        hazards = hazards_of(op, path, args)
        role = fusion.role_of(op, path)
        self.signatures[sig_id] = {
            "id": sig_id, "op": op, "path": path, "args": args, "allocated": allocated,
            "first_step": len(self.steps), "first_phase": self._phase["name"] if self._phase else None,
            "site": site_json(site), "hazards": hazards, "fusion_role": fusion.ROLE_NAMES[role],
        }
        if hazards:
            self.watched[sig_id] = {"sites": Counter(), "steps": Counter(), "site_steps": defaultdict(set),
                                    "phases": Counter(), "site_phases": defaultdict(set)}
            self._watched_call(sig_id, site)
        return fusion.flags(role, bool(hazards))

    def _on_call(self, sig_id: int) -> None:
        if sig_id in self.watched:  # else a call that began before this recording did
            self._watched_call(sig_id, user_site(with_library=True))

    def _watched_call(self, sig_id: int, site) -> None:
        watched = self.watched[sig_id]
        where = self._where()
        watched["sites"][site] += 1
        kind = "phases" if isinstance(where, str) else "steps"
        watched[kind][where] += 1
        watched["site_" + kind][site].add(where)

    # -- steps ---------------------------------------------------------------------
    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        # The first optimizer seen marks the steps (a GAN's second one does not).
        if self._optimizer is None:
            self._optimizer = id(optimizer)
        if self._optimizer == id(optimizer):
            self.mark_step("optimizer")

    def add_units(self, count: int, unit: str, source: str) -> None:
        """Units of work done in the current step (units.py: tokens of the HF Trainer, generate),
        or in the open phase: its first unit is the phase's unit."""
        if self._phase is not None:
            phase = self.phases[self._phase["name"]]
            if phase["unit"] in (None, unit):
                phase.update(unit=unit, unit_source=source, units=phase["units"] + count)
            return
        self._units_in_step += count
        self.units.setdefault("unit", unit)
        self.units.setdefault("source", source)

    def mark_step(self, source: str = "mark_step") -> None:
        """The end of a step. The first source that marks one (optimizer, generate,
        torch_neuronx.audit.mark_step) is the only one that counts; a step marked
        inside a phase (generate inside an evaluation) is not a training step."""
        from torch_neuronx import _C

        if self._phase is not None:
            return
        if self.step_source is None:
            self.step_source = source
        if source != self.step_source:
            return
        self._take_fused()  # the step's sequences, before it is counted as done
        devices = range(torch.neuron.device_count())
        units, self._units_in_step = self._units_in_step, 0
        held, self._held_peak = self._held_peak, []
        self.steps.append({
            "units": units,
            "end_s": round(time.perf_counter() - self._t0, 6),
            "calls": _C._audit_calls(),
            "memory_peak": [max(_C._audit_take_window_peak(d), held[d] if held else 0) for d in devices],
            "memory_allocated": [_C._audit_allocated(d) for d in devices],
        })
        _C._audit_mark_step()  # every signature's totals at this step's end
        for sig_id, (calls, host_ns) in self._phase_since_mark.items():
            _add(self._phase_before_mark, sig_id, calls, host_ns)
        self._phase_since_mark = {}
        if len(self.steps) == 1:
            self._first_step_totals = _C._audit_signatures()
            self._phase_before_first = {k: list(v) for k, v in self._phase_before_mark.items()}
        self._collect_graph_breaks()
        self._write_progress()

    # -- phases: work that is not a training step ------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str, label: str | None = None, source: str = "torch_neuronx.audit.phase"):
        """The work inside is phase `name` (an evaluation, saving, export), never a step's."""
        self.enter_phase(name, label, source)
        try:
            yield
        finally:
            self.exit_phase()

    def enter_phase(self, name: str, label: str | None = None, source: str = "torch_neuronx.audit.phase") -> None:
        from torch_neuronx import _C

        if self._phase is not None:  # nested: the outer phase holds the work
            self._phase["depth"] += 1
            return
        self._take_fused()  # the step's sequences so far are the step's
        devices = range(torch.neuron.device_count())
        entry = self.phases.setdefault(name, {
            "name": name, "label": label or name, "source": source, "occurrences": 0, "after_steps": [],
            "wall_s": 0.0, "units": 0, "unit": None, "unit_source": None,
            "memory_peak": [0 for _ in devices], "signatures": {}})
        entry["occurrences"] += 1
        entry["after_steps"].append(len(self.steps))
        # The step's peak so far, kept for it: the phase takes the allocator's window.
        peaks = [_C._audit_take_window_peak(d) for d in devices]
        self._held_peak = [max(p, self._held_peak[d] if self._held_peak else 0) for d, p in enumerate(peaks)]
        self._phase = {"name": name, "depth": 1, "t0": time.perf_counter(),
                       "before": {row[0]: row for row in _C._audit_signatures()}}

    def exit_phase(self) -> None:
        from torch_neuronx import _C

        phase = self._phase
        if phase is None:
            return
        phase["depth"] -= 1
        if phase["depth"]:
            return
        self._take_fused()  # the phase's sequences
        self._phase = None
        entry = self.phases[phase["name"]]
        entry["wall_s"] += time.perf_counter() - phase["t0"]
        for sig_id, calls, host_ns in _C._audit_signatures():
            _, calls_before, host_before = phase["before"].get(sig_id, (sig_id, 0, 0))
            if calls != calls_before:
                _add(entry["signatures"], sig_id, calls - calls_before, host_ns - host_before)
                _add(self._phase_since_mark, sig_id, calls - calls_before, host_ns - host_before)
        entry["memory_peak"] = [max(p, _C._audit_take_window_peak(d)) for d, p in enumerate(entry["memory_peak"])]

    # -- device work reported through torch_neuronx/observe.py -------------------------
    def active(self) -> bool:
        return ACTIVE is self

    def device_work(self, work) -> None:
        from torch_neuronx import _C

        if work.kind in fusion.CUT_CODES:
            _C._audit_fusion_cut(fusion.CUT_CODES[work.kind])
        if work.kind == "graph":
            self.graph_run(work.objects["graph"], work.objects["key"], work.objects["executable"], work.seconds)
        elif work.kind == "collective":
            self.collective(work.name, work.args["bytes"], work.args["world_size"])
        elif work.kind == "nki":
            self.nki_launch(work)

    def nki_launch(self, work) -> None:
        """One NKI kernel launch on neuron tensors: its host time (the simulation) and, once per
        kernel, grid and instruction count, the cost model's trn2/trn3 estimate."""
        key = (work.name, tuple(work.args.get("grid", ())), work.args.get("instructions", 0))
        entry = self.nki.get(key)
        if entry is None:
            estimates = work.objects["estimates"]() if "estimates" in work.objects else {}
            entry = self.nki[key] = {"launches_by": Counter(), "host_s": 0.0, "estimates": estimates,
                                     "first_step": len(self.steps)}
        entry["launches_by"][self._where()] += 1
        entry["host_s"] += work.seconds

    # -- the model of fusion ------------------------------------------------------------
    def _take_fused(self) -> None:
        """The sequences launched since the last take (which closes the open one), counted
        where the work is now going (the step in progress or the open phase)."""
        from torch_neuronx import _C

        where = self._where()
        for seq_id, ops, launches, ended_by in _C._audit_take_fused_sequences():
            entry = self.fused.setdefault(seq_id, {"ops": list(ops), "first": where, "launches_by": Counter(),
                                                   "ended_by": defaultdict(Counter)})
            entry["launches_by"][where] += launches
            for cut, count in ended_by:
                entry["ended_by"][cut][where] += count

    @staticmethod
    def _fused_row(seq_id: int, entry: dict, steps: int) -> dict:
        launches = _split(entry["launches_by"], steps)
        ended_by = []
        for cut, by in entry["ended_by"].items():
            split = _split(by, steps)
            ended_by.append({"cut": cut, "launches": sum(by.values()), "launches_first_step": split[0],
                             "launches_steps": split[1],
                             "launches_after_last_step": split[2], "launches_by_phase": split[3]})
        return {"id": seq_id, "ops": entry["ops"], "first_step": entry["first"],
                "launches": sum(entry["launches_by"].values()),
                "launches_first_step": launches[0], "launches_steps": launches[1],
                "launches_after_last_step": launches[2], "launches_by_phase": launches[3],
                "ended_by": ended_by}

    # -- torch.compile ---------------------------------------------------------------
    def _collect_graph_breaks(self) -> None:
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:  # Dynamo never ran (importing it would cost seconds)
            return
        graph_break_reasons = utils.graph_break_reasons
        if len(graph_break_reasons) < self._breaks_seen:  # torch._dynamo.reset() cleared it
            self._breaks_seen = 0
        for reason in graph_break_reasons[self._breaks_seen:]:
            frame = reason.user_stack[-1] if reason.user_stack else None
            where = (frame.filename, frame.lineno, frame.name, False) if frame else None
            first = str(reason.reason).strip().splitlines()[0] if str(reason.reason).strip() else "unknown"
            self.graph_breaks[(first, where)] += 1
        self._breaks_seen = len(graph_break_reasons)

    def graph_run(self, graph, key, executable, seconds: float) -> None:
        """One run of a compiled graph (compiler/executable.py)."""
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = {"name": graph.name, "runs_by": Counter(), "host_s_by": Counter(),
                                        "first_step": len(self.steps), **_cost_analysis(executable)}
        where = self._where()
        entry["runs_by"][where] += 1
        entry["host_s_by"][where] += seconds

    def collective(self, op: str, nbytes: int, world_size: int) -> None:
        """One collective call (distributed/_kernels.py): its bytes per rank."""
        key = (op, nbytes, world_size)
        self.collectives[key] += 1
        self._collective_steps[key][self._where()] += 1

    def unlowered(self, kind: str, missing) -> None:
        """Ops of a graph with no lowering (compiler/backend.py), run eagerly or raised."""
        for item in missing:
            self.unlowered_ops[(item.op, str(item.source), kind)] += 1

    # -- the record ------------------------------------------------------------------
    def record(self) -> dict:
        from torch_neuronx import _C, config, neuron
        from torch_neuronx.compiler import metrics

        while self._phase is not None:  # the program ended inside a phase (an exception)
            self.exit_phase()
        self._take_fused()
        self._collect_graph_breaks()
        steps = len(self.steps)
        totals = {row[0]: row for row in _C._audit_signatures()}
        at_mark = {row[0]: row for row in _C._audit_signatures(at_mark=True)}
        first = {row[0]: row for row in self._first_step_totals}
        signatures = []
        for sig_id, entry in sorted(self.signatures.items()):
            _, calls, host_ns = totals.get(sig_id, (sig_id, 0, 0))
            row = dict(entry, calls=calls, host_ns=host_ns,
                       **self._signature_split(sig_id, calls, host_ns, first, at_mark, steps))
            watched = self.watched.get(sig_id)
            if watched:
                row["sites"] = [self._site_row(watched, site, n, steps) for site, n in watched["sites"].most_common()]
                row["calls_by_step"] = {str(k): v for k, v in sorted(watched["steps"].items())}
                row["calls_by_phase"] = dict(watched["phases"])
            signatures.append(row)
        devices = range(torch.neuron.device_count())
        profile = neuron._PROFILE
        return {
            "record_version": RECORD_VERSION,
            "pid": os.getpid(),
            "argv": list(sys.argv),
            "rank": int(config.rank()) if str(config.rank()).isdigit() else 0,
            "instance": profile.name, "lnc": profile.lnc, "hbm_per_core": profile.hbm_per_core,
            "fallback_mode": _fallback_mode(), "fp64_mode": _fp64_mode(),
            "started": self.started,
            "duration_s": round(time.perf_counter() - self._t0, 6),
            "exception": self.exception,
            "interrupted": self.interrupted,
            "step_source": self.step_source,
            "steps": self.steps,
            "calls": _C._audit_calls(),
            "signatures": signatures,
            "memory": {
                "peak": [max([torch.neuron.max_memory_allocated(d)] +
                             [s["memory_peak"][d] for s in self.steps]) for d in devices],
                "allocated_at_exit": [torch.neuron.memory_allocated(d) for d in devices],
            },
            "compile": metrics.snapshot(),
            "graphs": [self._graph_row(g, steps) for g in self.graphs.values()],
            "graph_breaks": [{"reason": reason, "site": site_json(site), "count": n}
                             for (reason, site), n in self.graph_breaks.most_common()],
            "unlowered": [{"op": op, "source": source, "graph": kind, "count": n}
                          for (op, source, kind), n in self.unlowered_ops.most_common()],
            "collectives": [self._collective_row(key, n, steps) for key, n in self.collectives.most_common()],
            "nki_kernels": [self._nki_row(key, entry, steps) for key, entry in self.nki.items()],
            "concatenation": bool(_C._concatenation_enabled()),
            "fused_sequences": [self._fused_row(k, v, steps) for k, v in sorted(self.fused.items())],
            "units": self._units_summary(),
            "phases": self._phase_rows(steps),
        }

    def _signature_split(self, sig_id: int, calls: int, host_ns: int, first: dict, at_mark: dict,
                         steps: int) -> dict:
        """A signature's calls and host time in step 1, in all the steps, after the last step (outside
        named phases), and in each phase. Phases are taken out of the steps' figures."""
        phases = {name: list(p["signatures"][sig_id]) for name, p in self.phases.items()
                  if sig_id in p["signatures"]}
        if not steps:  # no step marker: the whole run outside phases is the one step
            calls -= sum(v[0] for v in phases.values())
            host_ns -= sum(v[1] for v in phases.values())
            return {"calls_first_step": calls, "host_ns_first_step": host_ns, "calls_steps": calls,
                    "host_ns_steps": host_ns, "calls_after_last_step": 0, "host_ns_after_last_step": 0,
                    "phases": phases}
        _, first_calls, first_host = first.get(sig_id, (sig_id, 0, 0))
        _, mark_calls, mark_host = at_mark.get(sig_id, (sig_id, 0, 0))
        before_first = self._phase_before_first.get(sig_id, (0, 0))
        before_mark = self._phase_before_mark.get(sig_id, (0, 0))
        since_mark = self._phase_since_mark.get(sig_id, (0, 0))
        return {"calls_first_step": first_calls - before_first[0], "host_ns_first_step": first_host - before_first[1],
                "calls_steps": mark_calls - before_mark[0], "host_ns_steps": mark_host - before_mark[1],
                "calls_after_last_step": calls - mark_calls - since_mark[0],
                "host_ns_after_last_step": host_ns - mark_host - since_mark[1],
                "phases": phases}

    @staticmethod
    def _site_row(watched: dict, site, calls: int, steps: int) -> dict:
        in_steps = watched["site_steps"][site]
        phases = set(watched["site_phases"][site])
        if steps and steps in in_steps:
            phases.add(AFTER_LAST_STEP)
        return dict(site_json(site) or {}, calls=calls,
                    step_indices=sorted(k for k in in_steps if k < max(steps, 1)), phases=sorted(phases))

    @staticmethod
    def _graph_row(graph: dict, steps: int) -> dict:
        runs = _split(graph["runs_by"], steps)
        host = _split(graph["host_s_by"], steps)
        return {"name": graph["name"], "first_step": graph["first_step"], "flops": graph["flops"],
                "bytes_accessed": graph["bytes_accessed"],
                "runs": sum(graph["runs_by"].values()), "host_s": sum(graph["host_s_by"].values()),
                "runs_first_step": runs[0], "runs_steps": runs[1], "runs_after_last_step": runs[2],
                "runs_by_phase": runs[3], "host_s_first_step": host[0], "host_s_steps": host[1],
                "host_s_after_last_step": host[2], "host_s_by_phase": host[3]}

    def _collective_row(self, key: tuple, calls: int, steps: int) -> dict:
        op, nbytes, size = key
        first, in_steps, after, phases = _split(self._collective_steps[key], steps)
        return {"op": op, "bytes": nbytes, "world_size": size, "calls": calls, "calls_first_step": first,
                "calls_steps": in_steps, "calls_after_last_step": after, "calls_by_phase": phases}

    @staticmethod
    def _nki_row(key: tuple, entry: dict, steps: int) -> dict:
        name, grid, instructions = key
        first, in_steps, after, phases = _split(entry["launches_by"], steps)
        return {"name": name, "grid": list(grid), "instructions": instructions,
                "launches": sum(entry["launches_by"].values()), "host_s": entry["host_s"],
                "launches_first_step": first, "launches_steps": in_steps, "launches_after_last_step": after,
                "launches_by_phase": phases, "first_step": entry["first_step"], **entry["estimates"]}

    def _phase_rows(self, steps: int) -> list[dict]:
        """The named phases, then the work after the last step (outside them) as a phase of its
        own; the signatures', graphs' and collectives' rows hold each phase's share of them."""
        from torch_neuronx import _C

        rows = [{k: v for k, v in p.items() if k != "signatures"} for p in self.phases.values()]
        if steps:
            last_end = self.steps[-1]["end_s"]
            elapsed = time.perf_counter() - self._t0 - last_end
            after_phases = sum(p["wall_s"] * sum(1 for s in p["after_steps"] if s == steps) / p["occurrences"]
                               for p in self.phases.values())
            devices = range(torch.neuron.device_count())
            rows.append({"name": AFTER_LAST_STEP, "label": "after the training loop",
                         "source": "the work after the last step, outside named phases", "occurrences": 1,
                         "after_steps": [steps], "wall_s": max(0.0, elapsed - after_phases), "units": 0,
                         "unit": None, "unit_source": None,
                         "memory_peak": [max(_C._audit_take_window_peak(d), self._held_peak[d] if self._held_peak else 0)
                                         for d in devices]})
        return rows

    def _units_summary(self) -> dict:
        if "unit" not in self.units:
            return {}
        counted = [s["units"] for s in self.steps[1:]] or [s["units"] for s in self.steps[:1]]
        per_step = sum(counted) / len(counted) if counted else self._units_in_step
        return dict(self.units, units_per_step=per_step)

    def used_device(self) -> bool:
        from torch_neuronx import _C

        return bool(_C._audit_calls() or self.graphs or self.steps)

    def write(self) -> str | None:
        """Writes the record, unless this process never used the device (a
        launcher such as torchrun imports torch too)."""
        if self.directory is None or not self.used_device():
            return None
        path = os.path.join(self.directory, f"record-{os.getpid()}.json")
        temporary = path + ".tmp"
        with open(temporary, "w") as f:
            json.dump(self.record(), f)
        os.replace(temporary, path)  # the audit never reads a half-written record
        return path

    def _write_progress(self) -> None:
        """A small file the audit reads for its progress line (at most twice a second)."""
        now = time.perf_counter()
        if self.directory is None or now - self._last_progress < 0.5:
            return
        self._last_progress = now
        from torch_neuronx import _C

        fallbacks = sum(1 for s in self.signatures.values() if s["path"] == "fallback")
        progress = {"steps": len(self.steps), "calls": _C._audit_calls(), "fallback_ops": fallbacks}
        path = os.path.join(self.directory, f"progress-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(progress, f)
        os.replace(path + ".tmp", path)


def _cost_analysis(executable) -> dict:
    """XLA's own count of a compiled graph's FLOPs and bytes (0 when unavailable)."""
    try:
        analysis = executable.cost_analysis()
        if isinstance(analysis, (list, tuple)):
            analysis = analysis[0] if analysis else {}
        return {"flops": float(analysis.get("flops", 0.0)),
                "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}
    except Exception:  # an executable loaded from the disk cache may not have it
        return {"flops": 0.0, "bytes_accessed": 0.0}


def _fallback_mode() -> str:
    from torch_neuronx import ops

    return ops.get_fallback_mode()


def _fp64_mode() -> str:
    from torch_neuronx import ops

    return ops.get_fp64_mode()


# ------------------------------------------------------------ the audited process

def start_from_env() -> None:
    """Starts recording this process when the audit asked for it (TORCH_NEURONX_AUDIT_DIR)."""
    from torch_neuronx import config

    directory = config.audit_dir()
    if not directory or ACTIVE is not None:
        return
    recording = Recording(directory)
    recording.start()
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        recording.exception = "".join(traceback.format_exception(kind, value, tb))
        recording.interrupted = issubclass(kind, KeyboardInterrupt)
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    # Registered now, after torch and this package: runs before their exit handlers.
    atexit.register(_finish, recording)


def _finish(recording: Recording) -> None:
    try:
        recording.stop()
        recording.write()
    except Exception:  # never turn the user's exit into a crash
        traceback.print_exc()
