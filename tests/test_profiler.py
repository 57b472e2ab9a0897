"""torch.profiler with the neuron device's activity (ProfilerActivity.PrivateUse1),
used as on CUDA, and AWS's Neuron configuration of it (torch_neuronx.profiling).

- Eager ops, compiled graph runs and NKI kernels each record a device event
  (name, core, stream, start, duration) linked to the CPU op that launched it;
  key_averages() gets NEURON time columns; the Chrome trace has one track per
  core and stream, in the JSON structure Perfetto loads.
- record_function ranges, schedule(wait, warmup, active) and on_trace_ready
  work as for CUDA; an HF Trainer with a profiler callback records device events.
- NeuronConfig: the emulated options act (cores, event cap, output layout), the
  others warn; NEURON_RT_INSPECT_ENABLE profiles a whole process.
- NeuronProfiler as TorchNeuron's wrapper: start/stop/is_active and the context
  manager, one instance subdirectory per process and a timestamp directory per
  capture, the PyTorch trace file, event filters, its errors.
- Profiling does not change results (compared with CPU PyTorch, exact: the
  eager device runs the same CPU kernels).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import torch_neuronx
from torch_neuronx import nki_op, profiling
from torch_neuronx.profiling import NeuronConfig, NeuronProfiler, NRTProfilerError, ProfileMode

from nki_examples import load_example

ROOT = Path(__file__).resolve().parents[1]
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
NEURON = torch.autograd.DeviceType.PrivateUse1


def device_events(prof):
    return [e for e in prof.events() if e.device_type == NEURON and not e.is_user_annotation]


def cpu_events_by_id(prof):
    return {e.id: e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU}


def kernels(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]


def _workload(x, y):
    return torch.mm(x + y, y).sum(1)


# ----------------------------------------------------------------------------- eager ops


def test_eager_ops_record_linked_device_events_and_device_time_columns():
    x = torch.randn(32, 32)
    y = torch.randn(32, 32)
    xd, yd = x.to("neuron"), y.to("neuron")
    with profile(activities=ACTIVITIES) as prof:
        out = _workload(xd, yd)
    torch.testing.assert_close(out.cpu(), _workload(x, y), rtol=0, atol=0)  # same CPU kernels

    events = device_events(prof)
    assert [e.name for e in events] == ["aten::add.Tensor", "aten::mm.default", "aten::sum.dim_IntList"]
    cpu = cpu_events_by_id(prof)
    for event in events:
        launcher = cpu[event.linked_correlation_id]  # linked to its CPU-side launch
        assert event.name.startswith(launcher.name + ".")
        assert event.device_index == 0 and event.device_resource_id == 0  # core 0, default stream
        # Synchronous emulator: the kernel runs inside its launching op.
        assert launcher.time_range.start <= event.time_range.start
        assert event.time_range.end <= launcher.time_range.end
        assert event.time_range.elapsed_us() > 0

    rows = {row.key: row for row in prof.key_averages()}
    mm_kernel = next(e for e in events if e.name == "aten::mm.default")
    assert rows["aten::mm"].device_time_total == pytest.approx(mm_kernel.time_range.elapsed_us())
    assert rows["aten::mm.default"].self_device_time_total == pytest.approx(
        mm_kernel.time_range.elapsed_us())
    table = prof.key_averages().table(sort_by="device_time_total")
    assert "Self NEURON" in table and "NEURON total" in table


def test_native_ops_implemented_in_python_record_device_events():
    # topk is a native op served by a Python kernel (ops/topk.py), as _scaled_mm is on trn3
    x = torch.randn(64, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        torch.topk(x, 3)
    names = [e.name for e in device_events(prof)]
    assert names.count("aten::topk.default") == 1, names
    row = next(r for r in prof.key_averages() if r.key == "aten::topk.default")
    assert row.self_device_time_total > 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.topk(x, 3)
    assert device_events(prof) == []


def test_a_same_named_callee_keeps_the_kernel():
    """aten::sum() calls aten::sum.dim_IntList; PyTorch merges the two rows and keeps the
    inner one's kernels: the device time must survive the merge."""
    x = torch.ones(8, 8, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        x.sum()
    (event,) = device_events(prof)
    assert prof.key_averages()[0].key == "aten::sum"
    row = {r.key: r for r in prof.key_averages()}["aten::sum"]
    assert row.device_time_total == pytest.approx(event.time_range.elapsed_us())


def test_profiler_and_audit_share_the_hook_and_both_record():
    from torch_neuronx import _C
    from torch_neuronx.audit import recorder

    x = torch.ones(4, device="neuron")
    rec = recorder.Recording()
    rec.start()
    try:
        calls = _C._audit_calls()
        with profile(activities=ACTIVITIES) as prof:
            x + 1
            x * 2
        assert _C._audit_calls() - calls == 2
    finally:
        rec.stop()
    assert [e.name for e in device_events(prof)] == ["aten::add.Tensor", "aten::mul.Tensor"]
    with profile(activities=ACTIVITIES) as prof:  # the audit off, the profiler alone
        x + 1
    assert len(device_events(prof)) == 1


def test_cpu_only_profile_and_no_profile_record_nothing_on_the_device():
    x = torch.ones(4, device="neuron")
    assert not profiling.collecting()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert not profiling.collecting()
        x + x
    assert device_events(prof) == []
    with profile(activities=ACTIVITIES) as prof:
        assert profiling.collecting()
    assert not profiling.collecting()


def test_profile_memory_reports_device_allocations():
    x = torch.randn(64, 64, device="neuron")
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        y = x @ x  # a new 16 KiB block
        del y  # and its free
    mm = [e for e in prof.events() if e.name == "aten::mm"]
    assert [e.device_memory_usage for e in mm] == [64 * 64 * 4]
    assert all(e.cpu_memory_usage == 0 for e in mm)
    row = next(r for r in prof.key_averages() if r.key == "aten::mm")
    assert row.self_device_memory_usage == 64 * 64 * 4
    assert "NEURON Mem" in prof.key_averages().table(row_limit=3)
    frees = [e for e in prof.events() if e.name == "[memory]" and e.device_memory_usage < 0]
    assert [e.device_memory_usage for e in frees] == [-64 * 64 * 4]


def test_neuron_alias_and_the_legacy_autograd_profiler():
    assert ProfilerActivity.NEURON == ProfilerActivity.PrivateUse1
    x = torch.ones(64, device="neuron")
    # use_kineto=False (its default): PyTorch times each op with the PrivateUse1 stubs.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autograd.profiler.profile(use_device="neuron") as prof:
            x * 2
    (mul,) = [e for e in prof.function_events if e.name == "aten::mul"]
    assert mul.device_time_total > 0
    assert mul.device_time_total <= mul.cpu_time_total + 1  # whole microseconds


# ----------------------------------------------------------------------------- Chrome trace


def test_chrome_trace_has_one_track_per_core_and_stream(tmp_path):
    a = torch.ones(16, device="neuron:0")
    b = torch.ones(16, device="neuron:1")
    side = torch.neuron.Stream("neuron:1")
    with profile(activities=ACTIVITIES) as prof:
        a * 2
        b * 2
        with torch.neuron.stream(side):
            b * 3
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())  # valid JSON, the object form Perfetto reads

    assert isinstance(trace["traceEvents"], list)
    for event in trace["traceEvents"]:
        assert event["ph"] in ("X", "M", "i", "s", "f", "C"), event
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and event["dur"] >= 0
            # Kineto's own span rows use the string pid "Spans", which Perfetto accepts.
            assert isinstance(event["pid"], (int, str)) and isinstance(event["tid"], (int, str))
    kernel_events = kernels(trace)
    assert {(e["pid"], e["tid"]) for e in kernel_events} == {(0, 0), (1, 0), (1, side.stream_id)}
    for e in kernel_events:
        assert e["args"]["device"] == f"neuron:{e['pid']}" and e["args"]["stream"] == e["tid"]
        assert e["args"]["External id"] > 0  # the CPU op it is linked to

    names = {}
    cores = {e["pid"] for e in kernel_events}
    for m in trace["traceEvents"]:
        if m["ph"] == "M" and m["name"] in ("process_name", "thread_name") and m["pid"] in cores:
            key = (m["name"], m["pid"], m["tid"] if m["name"] == "thread_name" else None)
            assert key not in names, f"{key} named twice"  # one name per track
            names[key] = m["args"]["name"]
    assert names[("process_name", 0, None)] == "neuron:0"
    assert names[("process_name", 1, None)] == "neuron:1"
    assert names[("thread_name", 1, side.stream_id)] == f"stream {side.stream_id}"


# ----------------------------------------------------------------------------- record_function, schedule


def test_record_function_range_gets_device_time_and_a_device_annotation(tmp_path):
    x = torch.ones(32, 32, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        with record_function("my_block"):
            torch.mm(x, x).relu()
    kernel_total = sum(e.time_range.elapsed_us() for e in device_events(prof))
    cpu_block = next(r for r in prof.key_averages() if r.key == "my_block" and r.cpu_time_total > 0)
    assert cpu_block.device_time_total >= kernel_total * 0.999
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    (annotation,) = [e for e in json.loads(path.read_text())["traceEvents"]
                     if e.get("cat") == "gpu_user_annotation"]
    assert annotation["name"] == "my_block" and annotation["pid"] == 0
    starts = [e["ts"] for e in kernels(json.loads(path.read_text()))]
    # Microsecond timestamps near 5e12 (the profiler's clock on this machine) are spaced about
    # 1e-3 apart as doubles: equal up to that rounding.
    assert annotation["ts"] == pytest.approx(min(starts), abs=5e-3)


def test_schedule_and_on_trace_ready_record_only_the_active_steps():
    x = torch.ones(8, device="neuron")
    ready = []

    def on_ready(prof):
        ready.append([e.name for e in device_events(prof)])

    sched = schedule(wait=1, warmup=1, active=2, repeat=1)
    with profile(activities=ACTIVITIES, schedule=sched, on_trace_ready=on_ready) as prof:
        for step in range(6):
            with record_function(f"step{step}"):
                x.mul(step)
            prof.step()
    assert ready == [["aten::mul.Tensor", "aten::mul.Tensor"]]  # steps 2 and 3 only


# ----------------------------------------------------------------------------- compiled graphs, NKI


def test_compiled_graph_records_one_event_per_executable_run(fresh_dynamo):
    f = torch.compile(lambda a: (a * 2).relu().sum(1), backend="neuron", fullgraph=True)
    x = torch.randn(8, 8, device="neuron")
    f(x)  # compile outside the profile
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            out = f(x)
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2).relu().sum(1))
    graphs = [e for e in device_events(prof) if e.name.startswith("neuron_graph::")]
    assert len(graphs) == 3
    cpu = cpu_events_by_id(prof)
    assert all(cpu[e.linked_correlation_id].name.startswith("Torch-Compiled Region") for e in graphs)


@nki_op("profiler_test::add", mutates_args=())
def nki_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return load_example("tensor_add").tensor_add_kernel(a, b)


def test_nki_kernel_event_carries_the_cost_models_estimates(tmp_path):
    from torch_neuronx import nki

    kernel = load_example("tensor_add").tensor_add_kernel
    a = torch.randn(128, 512, device="neuron")
    nki_add(a, a)  # compile outside the profile
    with profile(activities=ACTIVITIES) as prof:
        out = nki_add(a, a)
    torch.testing.assert_close(out.cpu(), a.cpu() * 2)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    (event,) = [e for e in kernels(json.loads(path.read_text())) if e["name"].startswith("nki::")]
    expected = {t: nki.benchmark(kernel, target=t)(a.cpu().numpy(), a.cpu().numpy()).latency_us
                for t in ("trn2", "trn3")}
    assert event["args"]["estimated_trn2_us"] == pytest.approx(expected["trn2"], abs=1e-3)
    assert event["args"]["estimated_trn3_us"] == pytest.approx(expected["trn3"], abs=1e-3)
    assert expected["trn3"] < expected["trn2"]  # faster DMA on trn3: a result that could differ
    (nki_event,) = [e for e in device_events(prof) if e.name.startswith("nki::")]
    if _profiler_records_python_custom_ops():
        assert cpu_events_by_id(prof)[nki_event.linked_correlation_id].name == "profiler_test::add"
    else:  # PyTorch 2.14: no CPU event for the custom op, so nothing to link the kernel to
        assert nki_event.linked_correlation_id == 0


def _profiler_records_python_custom_ops() -> bool:
    """PyTorch 2.13's profiler shows a custom op called from Python as a CPU event; 2.14's
    does not (the same for an op on CPU tensors), which only this test depends on."""
    @torch.library.custom_op("profiler_test::probe", mutates_args=())
    def probe(a: torch.Tensor) -> torch.Tensor:
        return a.clone()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        probe(torch.ones(1))
    return any(e.name == "profiler_test::probe" for e in prof.events())


# ----------------------------------------------------------------------------- AWS's NeuronConfig


def test_neuron_config_emulated_options(tmp_path):
    x0 = torch.ones(4, device="neuron:0")
    x1 = torch.ones(4, device="neuron:1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # RUNTIME alone is emulated: no warning
        cfg = NeuronConfig(modes=[ProfileMode.RUNTIME], capture_enabled_for_nc="1",
                           max_events_per_nc=2, profile_output_dir=str(tmp_path))
    exporter = NeuronProfiler(cfg)
    with profile(activities=ACTIVITIES, experimental_config=cfg, on_trace_ready=exporter.export_trace) as prof:
        for _ in range(3):
            x0 + 1
            x1 + 1
    assert [e.device_index for e in device_events(prof)] == [1, 1]  # core 1 only, 2 events
    (path,) = exporter.paths
    relative = Path(path).relative_to(tmp_path).parts
    assert relative[0] == f"emulated-{torch_neuronx.config.instance()}-{os.uname().nodename}_pid_{os.getpid()}"
    assert relative[-1] == "trace.json"
    trace = json.loads(Path(path).read_text())
    assert len(kernels(trace)) == 2
    assert trace["neuron_dropped_events"] == 1


def test_neuron_config_warns_for_what_is_not_emulated():
    with pytest.warns(UserWarning, match="not emulated: ProfileMode.DEVICE.*ProfileMode.CPU_UTIL"
                                         ".*ProfileMode.HOST_MEMORY.*neff_cache_dir"):
        cfg = NeuronConfig(modes=list(ProfileMode), neff_cache_dir="/tmp/neff")
    assert cfg.modes == tuple(ProfileMode)
    with pytest.warns(UserWarning, match="ProfileMode.DEVICE"):
        NeuronConfig()  # AWS's default modes: DEVICE and RUNTIME
    with pytest.raises(ValueError, match="capture_enabled_for_nc='2-1' is not valid"):
        NeuronConfig(modes=[ProfileMode.RUNTIME], capture_enabled_for_nc="2-1")
    with pytest.warns(UserWarning, match="CPU_UTIL"):
        cpu_only = NeuronConfig(modes=[ProfileMode.CPU_UTIL])
    x = torch.ones(4, device="neuron")
    with profile(activities=ACTIVITIES, experimental_config=cpu_only) as prof:
        x + 1
    assert device_events(prof) == []  # neither RUNTIME nor DEVICE: no device events


def _instance_dirs(root: Path) -> list[Path]:
    return [d for d in root.iterdir() if d.is_dir() and "_pid_" in d.name]


def test_neuron_profiler_wrapper_runtime_capture_only(tmp_path):
    x = torch.ones(4, device="neuron")
    profiler = NeuronProfiler(pytorch_activities=[], neuron_output_dir=str(tmp_path))
    assert not profiler.has_pytorch_profiling() and profiler.pytorch_trace_file is None
    assert not profiler.is_active() and profiler.get_nrt_output_directory() == str(tmp_path)
    profiler.start()
    assert profiler.is_active()
    x + 1
    profiler.stop()
    assert not profiler.is_active()
    (instance,) = _instance_dirs(tmp_path)  # one instance subdirectory
    (capture,) = [d for d in instance.iterdir()]
    assert (capture / "trace.json") == Path(profiler.paths[0])
    trace = json.loads((capture / "trace.json").read_text())
    assert [k["name"] for k in kernels(trace)] == ["aten::add.Tensor"]  # the runtime's stand-in: device events
    assert not any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])  # no PyTorch activity asked for
    assert sorted(p.name for p in tmp_path.iterdir()) == [instance.name]  # no PyTorch trace file
    assert profiler.get_pytorch_trace() is None


def test_neuron_profiler_wrapper_with_pytorch_profiling(tmp_path):
    x = torch.randn(8, 8, device="neuron")
    with NeuronProfiler(pytorch_activities=[ProfilerActivity.CPU], record_shapes=True,
                        pytorch_trace_file="custom.json", neuron_output_dir=str(tmp_path)) as prof:
        assert prof.is_active()
        y = torch.relu(x @ x)
    assert not prof.is_active()
    torch.testing.assert_close(y.cpu(), torch.relu(x.cpu() @ x.cpu()), rtol=0, atol=0)  # exact: same CPU kernels
    assert prof.pytorch_trace_file == str(tmp_path / "custom.json")
    trace = json.loads(Path(prof.pytorch_trace_file).read_text())
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert {"aten::mm", "aten::relu"} <= names
    assert any(e.get("args", {}).get("Input Dims") for e in trace["traceEvents"])  # record_shapes
    assert "aten::mm" in prof.get_pytorch_trace()
    prof.export_pytorch_trace(str(tmp_path / "again.json"))
    assert json.loads((tmp_path / "again.json").read_text()) == trace
    with prof:  # a second capture: same instance subdirectory, a new capture directory
        x + 1
    (instance,) = _instance_dirs(tmp_path)
    assert len(list(instance.iterdir())) == 2 and len(set(prof.paths)) == 2
    assert NeuronProfiler([ProfilerActivity.CPU]).has_pytorch_profiling()  # AWS's positional form
    assert NeuronProfiler().neuron_output_dir == "./output"


def test_neuron_profiler_wrapper_event_filters(tmp_path):
    x0 = torch.ones(4, device="neuron:0")
    x1 = torch.ones(4, device="neuron:1")
    with pytest.warns(UserWarning, match=r"event_filters\['types'\].*not emulated"):
        prof = NeuronProfiler(neuron_output_dir=str(tmp_path),
                              event_filters={"nc": ["1", "3-4"], "types": ["cc_exec_barrier"]})
    assert prof.config.cores == [1, 3, 4]
    with prof:
        x0 + 1
        x1 + 1
    trace = json.loads(Path(prof.paths[0]).read_text())
    assert [k["pid"] for k in kernels(trace)] == [1]  # core 1 only
    with pytest.raises(ValueError, match="capture_enabled_for_nc"):
        NeuronProfiler(event_filters={"nc": ["4-2"]})


def test_neuron_profiler_wrapper_errors(tmp_path):
    profiler = NeuronProfiler(neuron_output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="Profiler is not active"):
        profiler.stop()
    with pytest.raises(ValueError, match="PyTorch profiling not enabled or not started"):
        profiler.export_pytorch_trace(str(tmp_path / "t.json"))
    profiler.start()
    with pytest.raises(RuntimeError, match="Profiler is already active"):
        profiler.start()
    profiler.stop()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(NRTProfilerError, match="Failed to set NRT output directory"):
        NeuronProfiler(neuron_output_dir=str(blocker / "sub")).start()
    assert issubclass(NRTProfilerError, Exception) and not issubclass(NRTProfilerError, RuntimeError)


def test_inspect_environment_variables_profile_the_whole_process(tmp_path):
    script = "import torch\nx = torch.ones(8, device='neuron')\n(x * 2).sum()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env.update(NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_OUTPUT_DIR=str(tmp_path),
               NEURON_RT_INSPECT_EVENT_FILTER_TYPE="hardware", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NEURON_RT_INSPECT_EVENT_FILTER_TYPE not emulated" in proc.stderr
    (path,) = tmp_path.glob("*_pid_*/*/trace.json")
    names = [e["name"] for e in kernels(json.loads(path.read_text()))]
    assert "aten::mul.Tensor" in names and "aten::sum.default" in names


# ----------------------------------------------------------------------------- HF Trainer


def test_hf_trainer_with_a_profiler_callback_records_device_events(tmp_path):
    from transformers import Trainer, TrainerCallback

    from test_hf_training import CountingDataset, tiny_llama, training_args

    traces = []

    class ProfilerCallback(TrainerCallback):
        def __init__(self):
            self.prof = profile(activities=ACTIVITIES, schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
                                on_trace_ready=self.ready)

        def ready(self, prof):
            path = tmp_path / "trainer_trace.json"
            prof.export_chrome_trace(str(path))
            traces.append(json.loads(path.read_text()))

        def on_train_begin(self, args, state, control, **kwargs):
            self.prof.start()

        def on_step_end(self, args, state, control, **kwargs):
            self.prof.step()

        def on_train_end(self, args, state, control, **kwargs):
            self.prof.stop()

    args = training_args(tmp_path, max_steps=3, gradient_accumulation_steps=1)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=CountingDataset(),
                      callbacks=[ProfilerCallback()])
    trainer.train()
    (trace,) = traces
    names = {e["name"] for e in kernels(trace)}
    assert {"aten::mm.default", "aten::embedding.default"} & names
    assert len(kernels(trace)) > 50  # forward, backward and optimizer of one step
    assert {e["pid"] for e in kernels(trace)} == {0}
