"""One seam for observing device work (torch_neuronx/observe.py): compiled graph
runs, NKI launches and collectives report there, and both observers, the audit's
recording and torch.profiler's device activity, see every kind of work. The
layers that do the work never import the observers (a source scan)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from nki_examples import load_example
from test_layers import PACKAGE, _imported_modules
from torch_neuronx import observe
from torch_neuronx.audit import recorder

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


@pytest.fixture
def one_rank(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_an_nki_launch_and_an_all_reduce_reach_the_audit_and_the_profiler(one_rank, tmp_path):
    kernel = load_example("tensor_add").tensor_add_kernel
    a = torch.randn(128, 256, device="neuron")
    grads = torch.ones(64, device="neuron")
    rec = recorder.Recording()
    rec.start()
    try:
        with profile(activities=ACTIVITIES) as prof:
            out = kernel(a, a)
            one_rank.all_reduce(grads)
            rec.mark_step()
    finally:
        rec.stop()
    torch.testing.assert_close(out.cpu(), a.cpu() * 2)
    record = rec.record()
    (launch,) = record["nki_kernels"]
    assert (launch["name"], launch["launches"], launch["launches_steps"]) == ("tensor_add_kernel", 1, 1)
    assert launch["host_s"] > 0 and 0 < launch["estimated_trn3_us"] < launch["estimated_trn2_us"]
    (collective,) = record["collectives"]
    assert (collective["op"], collective["bytes"], collective["world_size"]) == ("allreduce", 64 * 4, 1)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = {e["name"]: e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"}
    nki_event, collective_event = events["nki::tensor_add_kernel"], events["neuron_collective::allreduce"]
    assert nki_event["args"]["estimated_trn2_us"] == pytest.approx(launch["estimated_trn2_us"])
    assert collective_event["args"]["bytes"] == 64 * 4 and collective_event["args"]["world_size"] == 1
    assert collective_event["args"]["path"] == "collective" and collective_event["dur"] >= 0


def test_nothing_is_reported_when_nobody_observes(one_rank):
    seen = []

    class Probe:
        def active(self):
            return False

        def device_work(self, work):
            seen.append(work)

        def unlowered(self, kind, missing):
            seen.append(kind)

    probe = Probe()
    observe.subscribe(probe)
    try:
        load_example("tensor_add").tensor_add_kernel(torch.ones(4, 8, device="neuron"), torch.ones(4, 8, device="neuron"))
        one_rank.all_reduce(torch.ones(2, device="neuron"))
        with observe.work("graph", "forward", 0) as work:
            assert work is None  # no active observer: not even an event object
    finally:
        observe.unsubscribe(probe)
    assert seen == []


def test_an_observer_hears_of_work_only_when_it_returns():
    seen = []

    class Probe:
        def active(self):
            return True

        def device_work(self, work):
            seen.append((work.kind, work.name, work.device, work.args, work.seconds >= 0))

        def unlowered(self, kind, missing):
            pass

    probe = Probe()
    observe.subscribe(probe)
    try:
        with observe.work("collective", "allreduce", 2, bytes=8, world_size=2):
            pass
        with pytest.raises(ZeroDivisionError), observe.work("graph", "forward", 0):
            1 / 0  # work that raised did not run: not reported
        with pytest.raises(ValueError, match="device work of kind 'kernel'"):
            observe.work("kernel", "x", 0)
    finally:
        observe.unsubscribe(probe)
    assert seen == [("collective", "allreduce", 2, {"bytes": 8, "world_size": 2}, True)]


@pytest.mark.parametrize("layer", ["ops", "compiler", "nki", "distributed"])
def test_the_layers_that_do_the_work_never_import_its_observers(layer):
    observers = ("torch_neuronx.audit", "torch_neuronx.profiling")
    offenders = [f"{path.relative_to(PACKAGE)}:{line} ({module})"
                 for path in sorted((PACKAGE / layer).rglob("*.py"))
                 for line, module in _imported_modules(path)
                 if any(module == o or module.startswith(o + ".") for o in observers)]
    assert not offenders, "report through torch_neuronx/observe.py instead:\n" + "\n".join(offenders)
