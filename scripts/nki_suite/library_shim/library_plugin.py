"""pytest plugin of scripts/nki_suite/library.py (loaded with `-p library_plugin`, before
nki-library's conftest):

- stubs for the modules nki-library's test utilities import only to reach Trainium hosts, S3, SQS
  and CloudWatch metrics (`fabric2`, `paramiko`, `boto3`, `botocore`, `aws_embedded_metrics`):
  simulation mode never calls them; any use raises;
- the two modules of AWS's test utilities that the public snapshot does not ship and its
  conftest imports: `test.utils.perf_analysis_private` (performance analysis of hardware runs) and
  `test.utils.scripts.remote_lock_scripts` (NeuronCore locks on remote hosts); stubbed the same way;
- one repair of the snapshot's test orchestrator: `Orchestrator._rename_neff_outputs_to_python_names`
  reads `self._compiled_kernel`, which only the compilation step sets, and simulation mode skips that
  step, so at d2ad3a5 every simulated case stops on an AttributeError after the kernel ran; the
  plugin gives the class the attribute's "nothing compiled" value, None (the method then returns, as
  it does for a kernel without output specs);
- packed MX outputs compared by value, as AWS's validator compares them: its `_compare_outputs`
  casts each output to float32 and, where that raises TypeError (AWS's host packed dtypes refuse
  the cast), unpacks both sides into their values first. This simulator's packed host arrays are
  unsigned-integer containers (a NumPy union dtype named after the type: no Python-level NumPy dtype
  can refuse the cast), which the cast would compare as integers, at a tolerance relative to the
  largest container (a difference in the low bytes' values would pass); the plugin unpacks them
  (torch_neuronx.nki.dtypes.PackedX4.unpack, the values AWS's unpackers give) before the comparison;
- packed MX outputs read as the golden's dtype bit for bit: on hardware the library reads each
  output file with its golden's dtype (`np.fromfile`), so a test may give the golden of a packed
  output as the containers' bytes viewed as float32 (experimental `mxfp_load`); in simulation it
  converts the simulator's outputs with `np.asarray(output, dtype=golden.dtype)`, which for this
  simulator's integer containers would convert their values; the plugin hands such outputs over so
  that the conversion reinterprets the bytes where the golden's element has the container's size;
- `neuronxcc.starfish.support.dtype`, where AWS's compiler package keeps the host dtype helpers that
  `neuron_dtypes` also has (qkv_cte's MX tests import `static_cast` from it): the shim's
  `neuron_dtypes` under that name;
- a per-case time limit (NKI_SUITE_CASE_TIMEOUT seconds, default 120), so one slow case costs its
  file one failure, not the file's whole time budget.
"""

from __future__ import annotations

import importlib.machinery
import os
import signal
import sys
import types

import pytest

STUBBED = ("fabric2", "paramiko", "boto3", "botocore", "aws_embedded_metrics")
MISSING = ("test.utils.perf_analysis_private", "test.utils.scripts", "test.utils.scripts.remote_lock_scripts")


class _Unavailable(Exception):
    """What every stubbed name is: an exception class (the utilities catch botocore's errors) that
    cannot be used for anything else."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("nki_suite: an AWS host/S3/metrics module was used; the library harness "
                           "stubs it (simulation mode needs none)")


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (_Unavailable,), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class _StubFinder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in STUBBED and name not in MISSING:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name, "stubbed by scripts/nki_suite/library_shim/library_plugin.py")
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())


def _starfish_dtype():
    """neuronxcc.starfish.support.dtype: the shim's neuron_dtypes (`neuronxcc` itself is
    torch_neuronx's stand-in package, which holds only `nki`)."""
    import neuron_dtypes

    for name in ("neuronxcc.starfish", "neuronxcc.starfish.support"):
        package = types.ModuleType(name, "stand-in of scripts/nki_suite/library_shim/library_plugin.py")
        package.__path__ = []
        sys.modules.setdefault(name, package)
    sys.modules.setdefault("neuronxcc.starfish.support.dtype", neuron_dtypes)


def pytest_configure(config):
    _starfish_dtype()


def pytest_sessionstart(session):
    orchestrator = sys.modules.get("test.utils.test_orchestrator")
    if orchestrator is not None and not hasattr(orchestrator.Orchestrator, "_compiled_kernel"):
        orchestrator.Orchestrator._compiled_kernel = None
    validator = sys.modules.get("test.utils.output_validator")
    if validator is not None and not getattr(validator.OutputValidator._compare_outputs, "_unpacks", False):
        validator.OutputValidator._compare_outputs = _unpacking(validator.OutputValidator._compare_outputs)


    simulation = sys.modules.get("test.utils.simulation_setup")
    if simulation is not None and not getattr(simulation.simulate_kernel, "_as_bytes", False):
        simulation.simulate_kernel = _packed_as_bytes(simulation.simulate_kernel)


class _PackedOutput:
    """A packed MX output array that NumPy converts to a dtype of its container's size by
    reinterpreting the bytes (as reading the output file with that dtype does), else as usual."""

    def __init__(self, array):
        self.array = array

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        if dtype is not None and np.dtype(dtype).itemsize == self.array.dtype.itemsize:
            return self.array.view(dtype)
        return np.asarray(self.array, dtype=dtype)


def _packed_as_bytes(simulate):
    """`simulate` (simulation_setup.simulate_kernel) with its packed MX outputs as _PackedOutput."""
    import numpy as np
    from torch_neuronx.nki.dtypes import packed_host

    def simulate_bytes(*args, **kwargs):
        return [_PackedOutput(o) if isinstance(o, np.ndarray) and packed_host(o.dtype) is not None else o
                for o in simulate(*args, **kwargs)]

    simulate_bytes._as_bytes = True
    return simulate_bytes


def _unpacking(compare):
    """`compare` (OutputValidator._compare_outputs) given packed MX outputs as their float32 values."""
    from torch_neuronx.nki.dtypes import packed_host

    def compare_values(self, actual_outputs, golden_output, *args, **kwargs):
        actual, golden = dict(actual_outputs), dict(golden_output)
        for key, expected in golden_output.items():
            packed = packed_host(getattr(expected, "dtype", None))
            if packed is not None and key in actual:
                golden[key] = packed.unpack(expected)
                actual[key] = packed.unpack(actual[key])
        return compare(self, actual, golden, *args, **kwargs)

    compare_values._unpacks = True
    return compare_values


class CaseTimeout(BaseException):
    """A BaseException, so that a kernel's or the orchestrator's `except Exception` cannot swallow
    it; pytest still records it as the case's failure."""


def _on_alarm(signum, frame):
    raise CaseTimeout(f"nki_suite: case ran past {os.environ.get('NKI_SUITE_CASE_TIMEOUT', '120')} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limit = int(os.environ.get("NKI_SUITE_CASE_TIMEOUT", "120"))
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_finish(session):
    """With NKI_SUITE_COLLECT_JSON set: every selected case, with the markers the harness's subset
    rule reads (`fast`) and whether the library's conftest skips it (its large-shape rule)."""
    path = os.environ.get("NKI_SUITE_COLLECT_JSON")
    if not path:
        return
    import json

    rows = [{"nodeid": item.nodeid, "file": str(item.path), "fast": item.get_closest_marker("fast") is not None,
             "runnable": runnable(item)} for item in session.items]
    with open(path, "w") as f:
        json.dump(rows, f)


# ---------------------------------------------------------------------------- the harness's subset
# Applied in the process that runs the file (NKI_SUITE_PER_FILE set), after the library's conftest
# has marked its simulation skips and pytest has deselected by platform: the same items the run
# collects, so sweeps drawn at import time cannot differ between selection and run.
LARGE = ("4096", "5120", "8192", "16384", "32768", "36864")
FORCED = ("trace_only", "compile_only", "compile_and_infer")  # markers that override --test-mode


def runnable(item) -> bool:
    return (not any(m.name == "skip" for m in item.iter_markers())
            and not any(item.get_closest_marker(m) for m in FORCED)
            and not any(p in item.nodeid for p in LARGE))


def select(items, per_file):
    """Per file: its `fast` cases that can run in simulation, or, where there are none, all its
    cases that can; the first `per_file` of them (0: all) in collection order."""
    by_file = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)
    keep = []
    for group in by_file.values():
        pool = [i for i in group if i.get_closest_marker("fast") and runnable(i)] or [i for i in group if runnable(i)]
        keep.extend(pool[:per_file] if per_file else pool)
    return keep


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    per_file = os.environ.get("NKI_SUITE_PER_FILE")
    if per_file is None:
        return
    keep = set(map(id, select(items, int(per_file))))
    dropped = [i for i in items if id(i) not in keep]
    items[:] = [i for i in items if id(i) in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)


# ---------------------------------------------------------------------------- results as they come
def _log(row):
    path = os.environ.get("NKI_SUITE_RESULTS_JSONL")
    if path:
        import json
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def pytest_runtest_logstart(nodeid, location):
    _log({"nodeid": nodeid, "event": "start"})


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        message = ""
        if report.outcome == "failed":
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)[-300:]
        _log({"nodeid": report.nodeid, "event": report.when, "outcome": report.outcome,
              "message": message.strip().splitlines()[0][:300] if message.strip() else ""})
