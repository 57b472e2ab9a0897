"""torch.compile metrics as TorchNeuron exposes them: torch.neuron.get_dynamo_metrics()
returns one record per compiled graph (graph_id, graph_name, model_name,
has_collectives, graph_node_count, timestamp, three phase times in
microseconds), Dynamo's counters["neuron"] and compilation_time_metrics carry
them, TORCH_NEURONX_ENABLED_METRIC_TABLES=graph_stats writes them to a CSV at
exit; the returned list still answers this project's counters by name."""

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch
from torch._dynamo.utils import compilation_time_metrics, compile_times, counters

import torch_neuronx
from torch_neuronx import config
from torch_neuronx.compiler import cache, metrics

FIELDS = ["graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count", "timestamp",
          "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us", "torch_neuronx_compile_us"]
PHASES = ["torch_neuronx_fx_passes", "torch_neuronx_lower", "torch_neuronx_compile"]
NAME = re.compile(r"(?P<model>\w+?)_(?P<aot>\d+)_(?P<kind>forward|backward|inference)(?:_piece\d+)?_(?P<nth>\d+)")


@pytest.fixture(autouse=True)
def isolated(fresh_dynamo, tmp_path, monkeypatch):
    """A fresh Dynamo and metrics (tests/conftest.py), an empty disk cache, no metric table."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_NEURONX_ENABLED_METRIC_TABLES", raising=False)
    yield
    torch_neuronx.reset_dynamo_metrics()


def linear(n_in, n_out, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out).to("neuron")


def reference(model, x):
    """NumPy's x @ W.T + b, in float64."""
    w = model.weight.detach().cpu().double().numpy()
    b = model.bias.detach().cpu().double().numpy()
    return x.detach().cpu().double().numpy() @ w.T + b


def check_record(record, *, model_name="model_default", kind="inference"):
    assert [f.name for f in dataclasses.fields(record)] == FIELDS
    assert re.fullmatch(r"[0-9a-f]{64}", record.graph_id), record.graph_id
    match = NAME.fullmatch(record.graph_name)
    assert match and match["model"] == model_name and match["kind"] == kind, record.graph_name
    assert record.model_name == model_name
    assert re.fullmatch(r"\d{8}_\d{6}_\d{6}", record.timestamp), record.timestamp
    assert record.torch_neuronx_fx_passes_us >= 0
    assert record.torch_neuronx_lower_us > 0 and record.torch_neuronx_compile_us > 0
    assert record.graph_node_count > 0


# ------------------------------------------------------------------ records


@pytest.mark.parametrize("shape,dtype,tol", [((2, 10), torch.float32, 1e-5), ((7, 10), torch.bfloat16, 3e-2)])
def test_one_record_per_compiled_graph(shape, dtype, tol):
    model = linear(10, 5).to(dtype)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(*shape, device="neuron").to(dtype)
    with torch.inference_mode():
        out = compiled(x)
    np.testing.assert_allclose(out.float().cpu().numpy(), reference(model, x), rtol=tol, atol=tol)
    records = torch.neuron.get_dynamo_metrics()
    assert len(records) == 1
    check_record(records[0])
    # addmm (or t + addmm), its inputs and the output: the ATen graph's nodes
    assert 4 <= records[0].graph_node_count <= 8
    assert counters["neuron"]["compiled_graphs"] == 1
    assert counters["neuron"]["graphs_with_collectives"] == 0
    assert torch_neuronx.get_dynamo_metrics is torch.neuron.get_dynamo_metrics
    assert torch_neuronx.reset_dynamo_metrics is torch.neuron.reset_dynamo_metrics


def test_training_gives_a_forward_and_a_backward_record_of_one_aot_compile():
    model = linear(6, 3)
    compiled = torch.compile(model, backend="neuron", options={"model_name": "Trainer"})
    x = torch.randn(4, 6, device="neuron")
    compiled(x).square().sum().backward()  # the backward graph compiles at its first call
    records = torch.neuron.get_dynamo_metrics()
    assert [NAME.fullmatch(r.graph_name)["kind"] for r in records] == ["forward", "backward"]
    for record, kind in zip(records, ["forward", "backward"]):
        check_record(record, model_name="Trainer", kind=kind)
    assert len({NAME.fullmatch(r.graph_name)["aot"] for r in records}) == 1
    assert len({r.graph_id for r in records}) == 2
    expected = 2 * (reference(model, x) @ np.ones((3, 1)))  # d/dW of sum((xW^T+b)^2)
    assert model.weight.grad is not None and np.isfinite(expected).all()


def test_graph_break_gives_two_records_with_unique_names():
    class WithBreak(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.first, self.second = torch.nn.Linear(10, 5), torch.nn.Linear(5, 3)

        def forward(self, x):
            x = self.first(x)
            torch._dynamo.graph_break()
            return self.second(x)

    model = WithBreak().to("neuron")
    compiled = torch.compile(model, backend="neuron", options={"model_name": "MyModel"})
    x = torch.randn(2, 10, device="neuron")
    with torch.inference_mode():
        out = compiled(x)
    np.testing.assert_allclose(out.cpu().numpy(), reference(model.second, model.first(x)), rtol=1e-5, atol=1e-5)
    m = torch.neuron.get_dynamo_metrics()
    assert len(m) == 2
    for record in m:
        check_record(record, model_name="MyModel")
    assert len({r.graph_name for r in m}) == 2
    assert len({NAME.fullmatch(r.graph_name)["aot"] for r in m}) == 2  # one AOT compile each
    assert m["graph_breaks"] == 1 and counters["neuron"]["compiled_graphs"] == 2


def test_new_shape_recompiles_into_a_new_record():
    compiled = torch.compile(linear(11, 5), backend="neuron", dynamic=False)  # a graph no other test compiles
    with torch.inference_mode():
        compiled(torch.randn(2, 11, device="neuron"))
        first = counters["neuron"]["compiled_graphs"]
        compiled(torch.randn(4, 11, device="neuron"))
        compiled(torch.randn(4, 11, device="neuron"))  # the same shape again: no record
    m = torch.neuron.get_dynamo_metrics()
    assert (first, counters["neuron"]["compiled_graphs"], len(m)) == (1, 2, 2)
    assert m[0].graph_name != m[1].graph_name and m[0].graph_id != m[1].graph_id
    assert m["recompiles"] == 1 and m["compiles"] == 2


def test_model_name_from_options_or_model_default():
    x = torch.randn(3, 8, device="neuron")
    with torch.inference_mode():
        torch.compile(linear(8, 2), backend="neuron", options={"model_name": "LlamaForCausalLM"})(x)
        torch.compile(linear(8, 4), backend="neuron")(x)
        torch.compile(linear(8, 6), backend="neuron", options={"other": 1})(x)
    m = torch.neuron.get_dynamo_metrics()
    assert [r.model_name for r in m] == ["LlamaForCausalLM", "model_default", "model_default"]
    assert re.fullmatch(r"LlamaForCausalLM_\d+_inference_\d+", m[0].graph_name)
    assert all(re.fullmatch(r"model_default_\d+_inference_\d+", r.graph_name) for r in m[1:])


def test_graph_compiled_again_reuses_the_executable_and_reports_its_build_times():
    x = torch.randn(5, 9, device="neuron")
    with torch.inference_mode():
        torch.compile(linear(9, 3), backend="neuron")(x)
        torch._dynamo.reset()  # the same graph handed to the backend again
        torch.compile(linear(9, 3, seed=1), backend="neuron")(x)
    m = torch.neuron.get_dynamo_metrics()
    assert len(m) == 2 and m[0].graph_name != m[1].graph_name
    assert m[0].graph_id == m[1].graph_id
    assert (m[1].torch_neuronx_lower_us, m[1].torch_neuronx_compile_us) == \
        (m[0].torch_neuronx_lower_us, m[0].torch_neuronx_compile_us)
    assert m["compiles"] == 1 and m["cache_hits_memory"] >= 1  # compiled once in this process


def test_disk_cache_entry_keeps_the_build_times():
    import jax
    import jax.numpy as jnp

    executable = jax.jit(lambda a: jnp.sin(a) * 2).lower(jnp.ones((3,))).compile()
    cache.store("timed", executable, (0.25, 1.5))
    loaded, times = cache.load_entry("timed")
    np.testing.assert_allclose(np.asarray(loaded(jnp.arange(3.0))), 2 * np.sin(np.arange(3.0)), rtol=1e-6)
    assert times == (0.25, 1.5)
    assert cache.load_entry("absent") == (None, None)


# ------------------------------------------------------------------ Dynamo's tables


def test_phase_times_in_dynamo_compilation_time_metrics():
    with torch.inference_mode():
        torch.compile(linear(10, 5), backend="neuron")(torch.randn(2, 10, device="neuron"))
    timing = compilation_time_metrics["torch_neuronx_compile"]
    m = torch.neuron.get_dynamo_metrics()
    for phase in PHASES:
        assert compilation_time_metrics[phase] == pytest.approx([getattr(m[0], f"{phase}_us") / 1e6])
    text = compile_times(repr="str")
    assert all(phase in text for phase in PHASES)
    with torch.inference_mode():
        torch.compile(linear(20, 10), backend="neuron")(torch.randn(2, 20, device="neuron"))
    assert len(timing) == 2 and timing[1] > 0  # the list taken earlier follows


def test_reset_clears_records_counters_and_phase_times():
    with torch.inference_mode():
        torch.compile(linear(10, 5), backend="neuron")(torch.randn(2, 10, device="neuron"))
    timing = compilation_time_metrics["torch_neuronx_lower"]
    assert len(torch.neuron.get_dynamo_metrics()) == 1 and len(timing) == 1
    torch.neuron.reset_dynamo_metrics()
    m = torch.neuron.get_dynamo_metrics()
    assert len(m) == 0 and m["compiles"] == 0 and m["inference_graphs"] == 0
    assert counters["neuron"]["compiled_graphs"] == 0 and len(timing) == 0


def test_returned_list_answers_the_aggregate_counters_by_name():
    with torch.inference_mode():
        torch.compile(linear(3, 3), backend="neuron")(torch.randn(2, 3, device="neuron"))
    m = torch_neuronx.get_dynamo_metrics()
    assert isinstance(m, list) and isinstance(m[0], metrics.NeuronCompilationMetrics) and len(m[:1]) == 1
    assert m["compiles"] == 1 and m["inference_graphs"] == 1 and m["enabled"] is True
    assert m.get("cache_hits_disk") == 0 and m.get("absent", 7) == 7
    assert "compiles" in m and "absent" not in m and m[0] in m
    plain = dict(m)
    assert plain["compiles"] == 1 and set(plain) == set(metrics.snapshot())
    json.dumps(plain)
    with pytest.raises(KeyError):
        m["absent"]


def test_records_kept_when_the_counters_are_off(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_METRICS_ENABLED", "0")
    with torch.inference_mode():
        torch.compile(linear(4, 2), backend="neuron")(torch.randn(2, 4, device="neuron"))
    m = torch.neuron.get_dynamo_metrics()
    assert m["enabled"] is False and m["compiles"] == 0  # this project's counters: off
    assert len(m) == 1 and counters["neuron"]["compiled_graphs"] == 1  # TorchNeuron's records: kept


def test_concurrent_records_are_all_kept():
    def add(thread):
        for i in range(50):
            metrics.record_compilation(metrics.NeuronCompilationMetrics(
                graph_id=f"{thread}-{i}", has_collectives=i % 5 == 0))

    threads = [threading.Thread(target=add, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = torch.neuron.get_dynamo_metrics()
    assert len(m) == 400 and len({r.graph_id for r in m}) == 400
    assert counters["neuron"]["compiled_graphs"] == 400 and counters["neuron"]["graphs_with_collectives"] == 80
    assert len(compilation_time_metrics["torch_neuronx_compile"]) == 400


# ------------------------------------------------------------------ collectives


def test_graph_with_a_functional_all_reduce_is_flagged(monkeypatch):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        def reduce(x):
            return funcol.all_reduce(x * 2, "sum", group=dist.group.WORLD) + 1

        def plain(x):
            return x * 3 - 1

        x = torch.arange(6.0, device="neuron")
        out = torch.compile(reduce, backend="neuron", fullgraph=True)(x)
        other = torch.compile(plain, backend="neuron", fullgraph=True)(x)
    finally:
        dist.destroy_process_group()
    np.testing.assert_allclose(out.cpu().numpy(), np.arange(6.0) * 2 + 1)  # one rank: the sum is x*2
    np.testing.assert_allclose(other.cpu().numpy(), np.arange(6.0) * 3 - 1)
    m = torch.neuron.get_dynamo_metrics()
    flagged = [r for r in m if r.has_collectives]
    assert flagged and all("_piece" in r.graph_name for r in flagged)  # compiled around the collective
    assert len({r.graph_name for r in flagged}) == len(flagged)
    assert [r.has_collectives for r in m if r not in flagged] == [False]
    assert counters["neuron"]["graphs_with_collectives"] == len(flagged)
    assert counters["neuron"]["compiled_graphs"] == len(m)


# ------------------------------------------------------------------ metric tables


CHILD = textwrap.dedent("""
    import dataclasses, json, torch, torch_neuronx
    with torch.inference_mode():
        torch.compile(torch.nn.Linear(4, 4).to('neuron'), backend='neuron')(torch.randn(2, 4, device='neuron'))
        torch.compile(torch.nn.Linear(4, 2).to('neuron'), backend='neuron',
                      options={'model_name': 'Second'})(torch.randn(3, 4, device='neuron'))
    print(json.dumps([dataclasses.asdict(r) for r in torch.neuron.get_dynamo_metrics()]))
""")


def run_child(tmp_path, **variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env.update(TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "child-cache"), TORCH_NEURONX_METRICS_DIR=str(tmp_path),
               **variables)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), proc


def test_graph_stats_table_written_at_exit(tmp_path):
    records, _ = run_child(tmp_path, TORCH_NEURONX_ENABLED_METRIC_TABLES=" graph_stats ")
    with open(tmp_path / "metric_table_graph_stats_rank0.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == FIELDS
    assert len(rows) == 1 + len(records) == 3
    for row, record in zip(rows[1:], records):
        assert row == [str(record[f]) for f in FIELDS]
    assert [row[2] for row in rows[1:]] == ["model_default", "Second"]
    assert all(int(row[FIELDS.index("torch_neuronx_compile_us")]) > 0 for row in rows[1:])


def test_no_table_without_the_variable(tmp_path):
    records, _ = run_child(tmp_path)
    assert len(records) == 2
    assert not list(tmp_path.glob("metric_table_*"))


def test_unknown_table_name_is_an_error_naming_the_available_tables(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_NEURONX_ENABLED_METRIC_TABLES", "graph_stats,compile_stats")
    with pytest.raises(ValueError, match=r"'compile_stats' is not registered\. Available tables: \['graph_stats'\]"):
        torch.neuron.get_dynamo_metrics()
    with pytest.raises(ValueError, match="TORCH_NEURONX_ENABLED_METRIC_TABLES"):
        metrics.write_tables()
    monkeypatch.setenv("TORCH_NEURONX_ENABLED_METRIC_TABLES", "graph_stats,,graph_stats")
    assert config.enabled_metric_tables() == ("graph_stats",)
    monkeypatch.setenv("TORCH_NEURONX_METRICS_DIR", str(tmp_path))
    assert metrics.write_tables() == []  # no graph compiled: no file
    assert list(metrics.METRIC_TABLES) == list(config.METRIC_TABLE_NAMES)


def test_warm_start_records_carry_the_build_times(tmp_path):
    """A second process with the same disk cache loads AOTAutograd's results and the
    executables: same graph ids and build times, no FX passes, names of its own compile."""
    cold, _ = run_child(tmp_path)
    warm, proc = run_child(tmp_path)
    assert [r["graph_id"] for r in warm] == [r["graph_id"] for r in cold]
    for before, after in zip(cold, warm):
        assert (after["torch_neuronx_lower_us"], after["torch_neuronx_compile_us"]) == \
            (before["torch_neuronx_lower_us"], before["torch_neuronx_compile_us"])
        assert before["torch_neuronx_fx_passes_us"] > 0 and after["torch_neuronx_fx_passes_us"] == 0
        assert NAME.fullmatch(after["graph_name"]) and after["model_name"] == before["model_name"]
