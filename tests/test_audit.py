"""`torch-neuronx audit`: the example porting script's problems found at their
lines, the report's JSON validated against its schema, exit codes passed
through, failing and interrupted commands still reported, recording off unless
audited, and the recorder's pieces (hazards, per-step arithmetic) on their own."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_neuronx import _C
from torch_neuronx.audit import recorder, report, schema
from torch_neuronx.compiler import metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "porting_audit.py"


def _env(tmp_path, **variables) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path / "cache")
    env["TORCH_NEURONX_FALLBACK"] = "silent"
    env.update(variables)
    return env


@pytest.fixture
def audit(tmp_path, capfd, monkeypatch):
    """`torch-neuronx audit` run in this process (the command it audits still runs as a
    child process): the same code path as the console script without starting a second
    interpreter for the audit itself. Returns (result with returncode/stdout/stderr, report)."""
    from types import SimpleNamespace

    from torch_neuronx import cli

    def run(*command, options=(), env=None):
        for name in list(os.environ):
            if name.startswith(("TORCH_NEURONX_", "NEURON_")):
                monkeypatch.delenv(name)
        for name, value in _env(tmp_path).items():
            if name.startswith("TORCH_NEURONX_"):
                monkeypatch.setenv(name, value)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(ROOT)
        out = tmp_path / "report.json"
        capfd.readouterr()
        code = cli.main(["audit", "--json", str(out), *options, "--", *command])
        captured = capfd.readouterr()
        result = SimpleNamespace(returncode=code, stdout=captured.out, stderr=captured.err)
        return result, (json.loads(out.read_text()) if out.exists() else None)

    return run


def _line_of(path: pathlib.Path, marker: str) -> int:
    """The line of `path` whose comment names `marker` (so the test follows edits of the example)."""
    lines = path.read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if f"# {marker}" in line]
    assert len(found) == 1, (marker, found)
    return found[0]


def _lines(sites) -> set[int]:
    return {s["line"] for s in sites if s and s.get("file") and s["file"].endswith(EXAMPLE.name)}


@pytest.fixture(scope="module")
def example(porting_audit):
    """The example script audited through the CLI (conftest.py runs it once)."""
    proc, data, _ = porting_audit
    return proc, data


# ------------------------------------------------------- the example script


def test_report_follows_the_schema(example):
    _, data = example
    schema.validate(data)
    assert data["status"] == "completed" and data["exit_code"] == 0
    assert data["steps"]["count"] == 6 and data["steps"]["source"] == "optimizer"


def test_schema_rejects_a_broken_report(example):
    import jsonschema

    _, data = example
    broken = json.loads(json.dumps(data))
    del broken["verdict"]["status"]
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(broken)
    wrong = json.loads(json.dumps(data))
    wrong["ops"][0]["path"] = "gpu"
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(wrong)


def test_fallback_found_at_its_line(example):
    _, data = example
    fallbacks = {f["op"]: f for f in data["fallbacks"]}
    assert "aten::special_i0e.out" in fallbacks, list(fallbacks)
    i0e = fallbacks["aten::special_i0e.out"]
    assert _lines(i0e["sites"]) == {_line_of(EXAMPLE, "CPU FALLBACK")}
    assert i0e["calls"] == 6 and i0e["calls_per_step"] == 1
    assert i0e["host_s_per_step"] > 0 and 0 < i0e["share_of_step"] < 1
    # On Trainium each call is also a round trip to the host: its operands over the link
    # (17-21 x 8 float32 each way at the low 25 GB/s) and one sync at the low 10 us.
    round_trip = i0e["trainium_s_per_step"] - i0e["host_s_per_step"]
    assert 10e-6 < round_trip < 10.5e-6, round_trip
    action = next(a for a in data["verdict"]["actions"] if a["what"] == "aten::special_i0e.out")
    assert action["cost_per_step_s"] == i0e["trainium_s_per_step"]
    # Its backward (i1e) falls back too, reached from loss.backward().
    i1e = fallbacks["aten::special_i1e.out"]
    assert all(s["backward"] for s in i1e["sites"]) and "loss.backward()" in i1e["sites"][0]["code"]
    # The same ops are fallbacks in the ops table, with their calls.
    ops = {(o["op"], o["path"]): o for o in data["ops"]}
    assert ops[("aten::special_i0e.out", "fallback")]["calls"] == 6


def test_shape_churn_found_with_its_lines(example):
    _, data = example
    eager = data["eager_compilations"]
    # Every step after the first adds kernels (a new length each step), and
    # the same number each time.
    assert len(eager["new_per_step"]) == 5 and min(eager["new_per_step"]) > 0
    assert len(set(eager["new_per_step"])) == 1
    assert eager["first_step"] > 0
    churn_lines = _lines(c["site"] for c in eager["churn"])
    assert _line_of(EXAMPLE, "SHAPE CHURN") in churn_lines, churn_lines
    normal = [c for c in eager["churn"] if c["op"] == "aten::normal_"]
    assert normal and normal[0]["steps_with_new"] == 5
    actions = [a for a in data["verdict"]["actions"] if a["kind"] == "shape_churn"]
    assert len(actions) == 1 and f":{_line_of(EXAMPLE, 'SHAPE CHURN')}" in actions[0]["where"]
    assert "pad" in actions[0]["remedy"].lower()


def test_float64_and_host_sync_found_at_their_lines(example):
    _, data = example
    by_kind = {}
    for hazard in data["hazards"]:
        by_kind.setdefault(hazard["kind"], []).append(hazard)
    float64_lines = set().union(*(_lines(h["sites"]) for h in by_kind["float64"]))
    assert _line_of(EXAMPLE, "FLOAT64") in float64_lines
    sync = by_kind["host_sync"]
    sync_lines = set().union(*(_lines(h["sites"]) for h in sync))
    assert _line_of(EXAMPLE, "HOST SYNC") in sync_lines
    # The compiled function's data-dependent branch syncs too (it runs eagerly).
    assert _line_of(EXAMPLE, "GRAPH BREAK") in sync_lines
    assert all(h["in_step_loop"] for h in sync)
    item = next(s for h in sync for s in h["sites"] if s["line"] == _line_of(EXAMPLE, "HOST SYNC"))
    assert item["calls"] == 6 and ".item()" in item["code"]


def test_graph_break_found_at_its_line(example):
    _, data = example
    compiled = data["torch_compile"]
    assert compiled["used"] and compiled["graphs"] >= 1 and compiled["graph_runs"] >= 6
    breaks = compiled["graph_breaks"]
    assert _lines(b["site"] for b in breaks) == {_line_of(EXAMPLE, "GRAPH BREAK")}
    # Only the script's: the audit's own callbacks, called from ops that the split function
    # runs eagerly, are not traced by Dynamo (they once were, and reported breaks of their own).
    assert len(breaks) == 1 and breaks[0]["site"]["file"].endswith(EXAMPLE.name), breaks
    actions = {a["kind"] for a in data["verdict"]["actions"]}
    assert {"fallback", "shape_churn", "float64", "host_sync", "graph_break"} <= actions


def test_verdict_ranks_costed_actions_first(example):
    _, data = example
    verdict = data["verdict"]
    assert verdict["status"] == "ready_after_fixes"
    actions = verdict["actions"]
    assert [a["rank"] for a in actions] == list(range(1, len(actions) + 1))
    costs = [a["cost_per_step_s"] for a in actions if a["cost_per_step_s"] is not None]
    assert costs and costs == sorted(costs, reverse=True)
    # A fallback is a host round trip plus its CPU work: it outranks a host read made as often.
    assert actions[0]["kind"] == "fallback"


def test_memory_against_each_target(example):
    _, data = example
    memory = data["memory"]
    assert memory["peak_bytes_per_core"] > 0
    assert [t["instance"] for t in memory["targets"]] == list(report.DEFAULT_TARGETS)
    assert all(t["fits"] for t in memory["targets"])
    assert len(memory["timeline"]) == 6
    assert all(0 < s["peak_bytes"] <= memory["peak_bytes_per_core"] for s in memory["timeline"])


def test_estimates_and_cost_rows(example):
    _, data = example
    assert [e["instance"] for e in data["estimates"]] == list(report.DEFAULT_TARGETS)
    for e in data["estimates"]:
        assert e["label"] == "estimate" and 0 < e["low_s"] <= e["high_s"]
        assert e["by_class"]["fallback"][0] > 0  # the fallbacks' measured host time
    assert data["cost"]["unit"] == "step" and data["cost"]["units_per_step"] == 1


def test_terminal_summary_names_each_problem(example):
    proc, data = example
    text = proc.stdout
    assert "Verdict: READY AFTER FIXES" in text
    for needle in ("aten::special_i0e.out", "shape churn", "graph break", "float64", "host_sync",
                   "ESTIMATE", "assumptions:"):
        assert needle in text, needle
    assert f"porting_audit.py:{_line_of(EXAMPLE, 'CPU FALLBACK')}" in text


# ----------------------------------------------- exit codes, failures, Ctrl-C


def _script(tmp_path, body: str) -> pathlib.Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


TRAIN_STEPS = """
    import os, signal, sys
    import torch
    model = torch.nn.Linear(8, 4).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        loss = model(torch.randn(3, 8, device="neuron")).square().mean()
        opt.zero_grad(); loss.backward(); opt.step()
        {after_step}
"""


def test_exit_code_is_the_commands(audit, tmp_path):
    script = _script(tmp_path, TRAIN_STEPS.format(after_step="if step == 2: sys.exit(3)"))
    proc, data = audit(str(script))
    assert proc.returncode == 3, proc.stderr[-2000:]
    schema.validate(data)
    assert data["exit_code"] == 3 and data["status"] == "failed" and data["steps"]["count"] == 3


def test_failing_command_gets_a_report_with_its_traceback(audit, tmp_path):
    script = _script(tmp_path, TRAIN_STEPS.format(after_step="if step == 1: raise RuntimeError('boom at step 1')"))
    proc, data = audit(str(script))
    assert proc.returncode == 1
    schema.validate(data)
    assert data["status"] == "failed" and "RuntimeError: boom at step 1" in data["exception"]
    assert "Traceback" in data["exception"]
    assert data["verdict"]["status"] == "blocked"
    assert data["steps"]["count"] == 2
    assert "boom at step 1" in proc.stdout  # the summary shows the exception


def test_interrupted_command_gets_a_partial_report(audit, tmp_path):
    script = _script(tmp_path, TRAIN_STEPS.format(
        after_step="if step == 1: os.kill(os.getpid(), signal.SIGINT)"))
    proc, data = audit(str(script))
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    schema.validate(data)
    assert data["status"] == "interrupted" and "KeyboardInterrupt" in data["exception"]
    assert data["steps"]["count"] == 2
    assert any("interrupted" in reason for reason in data["verdict"]["reasons"])


def test_no_device_use_is_an_error_not_an_empty_report(audit, tmp_path):
    script = _script(tmp_path, "import torch\nprint('no device here')\n")
    proc, data = audit(str(script))
    assert proc.returncode == 1 and data is None
    assert proc.stderr.count("\n") == 1 and "nothing to report" in proc.stderr


@pytest.mark.parametrize("options, needle", [
    (["--price", "trn2.3xlarge"], "INSTANCE=USD_PER_HOUR"),
    (["--price", "trn2.3xlarge=-1"], "greater than 0"),
    (["--baseline", "a100:0.5"], "NAME:SECONDS_PER_STEP:USD_PER_HOUR"),
    (["--instance", "trn9.huge"], "not a known instance profile"),
    (["--units-per-step", "0"], "positive"),
])
def test_bad_options_fail_before_running(audit, tmp_path, options, needle):
    marker = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    proc, _ = audit(str(script), options=options)
    assert proc.returncode == 1 and needle in proc.stderr, proc.stderr
    assert proc.stderr.startswith("torch-neuronx: error:") and proc.stderr.count("\n") == 1
    assert not marker.exists()


def test_missing_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch_neuronx", "audit"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "no command to audit" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "torch_neuronx", "audit", "--", "no-such-program-xyz"],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "cannot run 'no-such-program-xyz'" in proc.stderr


def test_units_per_step_and_baseline_give_cost_per_unit(audit, tmp_path):
    script = _script(tmp_path, TRAIN_STEPS.format(after_step="pass"))
    proc, data = audit(str(script), options=[
        "--units-per-step", "1000", "--unit", "samples", "--price", "trn2.3xlarge=2.0",
        "--baseline", "gpu:0.001:4.0"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    schema.validate(data)
    rows = {r["name"]: r for r in data["cost"]["rows"]}
    assert data["cost"]["unit"] == "samples" and data["cost"]["units_per_step"] == 1000
    base = rows["gpu"]
    assert base["seconds_per_unit"] == pytest.approx(1e-6)
    assert base["usd_per_million_units"] == pytest.approx(4.0 / 3600, rel=1e-4)
    trn2 = rows["trn2.3xlarge"]
    estimate = next(e for e in data["estimates"] if e["instance"] == "trn2.3xlarge")
    best, worst = trn2["usd_per_million_units"]
    assert best == pytest.approx(2.0 / 3600 * estimate["low_s"] / 1000 * 1e6, rel=1e-3)
    assert worst == pytest.approx(2.0 / 3600 * estimate["high_s"] / 1000 * 1e6, rel=1e-3)
    ratio = trn2["work_per_dollar_vs_baseline"]
    assert ratio[0] == pytest.approx(base["usd_per_million_units"] / best, rel=1e-3)


# ------------------------------------------------------- recording itself


def test_recording_is_off_unless_audited():
    assert recorder.ACTIVE is None
    before = _C._audit_calls()
    x = torch.randn(4, 4, device="neuron")
    (x @ x).sum().item()
    assert _C._audit_calls() == before


def test_in_process_recording_counts_signatures_and_steps():
    rec = recorder.Recording()
    rec.start()
    try:
        w = torch.randn(8, 8, device="neuron")
        for n in (4, 4, 5):
            y = torch.randn(n, 8, device="neuron") @ w
            y.sum().item()
            rec.mark_step()
    finally:
        rec.stop()
    data = rec.record()
    mm = [s for s in data["signatures"] if s["op"] == "aten::mm"]
    # Two shapes, two signatures: (4, 8) in steps 1-2 and (5, 8) first seen in step 3.
    assert sorted((s["args"][0]["shape"][0], s["calls"], s["first_step"]) for s in mm) == [(4, 2, 0), (5, 1, 2)]
    item = next(s for s in data["signatures"] if s["op"] == "aten::_local_scalar_dense")
    assert item["hazards"] == ["host_sync"] and item["calls"] == 3
    assert item["calls_by_step"] == {"0": 1, "1": 1, "2": 1}
    assert item["sites"][0]["file"] == __file__ and item["sites"][0]["calls"] == 3
    assert len(data["steps"]) == 3 and [s["calls"] for s in data["steps"]] == sorted(s["calls"] for s in data["steps"])
    assert recorder.ACTIVE is None


def test_fast_kernels_are_recorded_with_their_signature():
    """add/mul/sub/div have direct kernels; while recording they take the generic
    path, so their calls are recorded (and the results are the same)."""
    a = torch.randn(3, 5)
    b = torch.randn(3, 5)
    rec = recorder.Recording()
    rec.start()
    try:
        got = (a.to("neuron") + b.to("neuron")) * 2
    finally:
        rec.stop()
    torch.testing.assert_close(got.cpu(), (a + b) * 2, rtol=0, atol=0)
    ops = {s["op"] for s in rec.record()["signatures"]}
    assert {"aten::add.Tensor", "aten::mul.Tensor"} <= ops


@pytest.mark.parametrize("op, path, args, expected", [
    ("aten::special_i0e.out", "fallback", [{"dtype": "float32", "shape": [2], "device": "neuron:0"}], ["fallback"]),
    ("aten::_local_scalar_dense", "direct", [{"dtype": "float32", "shape": [], "device": "neuron:0"}], ["host_sync"]),
    ("aten::_copy_from", "direct", [{"dtype": "float32", "shape": [2], "device": "neuron:0"},
                                    {"dtype": "float32", "shape": [2], "device": "cpu"}, False], ["host_sync"]),
    ("aten::_copy_from", "direct", [{"dtype": "float32", "shape": [2], "device": "cpu"},
                                    {"dtype": "float32", "shape": [2], "device": "neuron:0"}, False], []),
    ("aten::copy_", "native", [{"dtype": "float32", "shape": [2], "device": "cpu"},
                               {"dtype": "float32", "shape": [2], "device": "neuron:0"}, False], ["host_sync"]),
    ("aten::copy_", "native", [{"dtype": "float32", "shape": [2], "device": "neuron:0"},
                               {"dtype": "float32", "shape": [2], "device": "cpu"}, False], []),
    ("aten::mul.Tensor", "native", [{"dtype": "float64", "shape": [2], "device": "neuron:0"}, 2.0], ["float64"]),
    ("aten::mul.Tensor", "native", [{"dtype": "float32", "shape": [2], "device": "neuron:0"}, 2.0], []),
    ("aten::nonzero", "native", [{"dtype": "bool", "shape": [2], "device": "neuron:0"}], ["data_dependent_shape"]),
    # float8 storage is no hazard (every profile); FP8 compute is (Trainium3 only)
    ("aten::cat", "native", [[{"dtype": "float8_e4m3fn", "shape": [2], "device": "neuron:0"}], 0], []),
    ("aten::_scaled_mm", "direct", [{"dtype": "float8_e4m3fn", "shape": [16, 16], "device": "neuron:0"}] * 2
     + [{"dtype": "float32", "shape": [], "device": "neuron:0"}] * 2, ["fp8"]),
])
def test_hazards_of(op, path, args, expected):
    assert recorder.hazards_of(op, path, args) == expected


_BOOL = {"dtype": "bool", "shape": [4], "device": "neuron:0"}
_LONG = {"dtype": "int64", "shape": [4], "device": "neuron:0"}
_F64 = {"dtype": "float64", "shape": [4], "device": "neuron:0"}


@pytest.mark.parametrize("op, args, expected", [
    # the registry's DATA_DEPENDENT ops the recorder once lacked (issue #29)
    ("aten::bincount", [_LONG, None, 0], ["data_dependent_shape"]),
    ("aten::repeat_interleave.Tensor", [_LONG, None], ["data_dependent_shape"]),
    ("aten::repeat_interleave.Tensor", [_LONG, 10], []),  # output_size given: the shape is known
    ("aten::linalg_lstsq", [_F64, _F64, None, None], ["data_dependent_shape", "float64"]),
    ("aten::equal", [_LONG, _LONG], ["data_dependent_shape"]),
    # nonzero_static has a static shape (it is the remedy the report suggests)
    ("aten::nonzero_static", [_BOOL, 4, -1], []),
    # a copy moves float64 exactly: no float64 hazard for any copy (clone, _to_copy), as for _copy_from
    ("aten::clone", [_F64, None], []),
])
def test_hazards_follow_the_registry(op, args, expected):
    assert recorder.hazards_of(op, "native", args) == expected


@pytest.mark.parametrize("calls, first, steps, expected", [
    (10, 4, 4, 2.0),   # 6 calls over steps 2-4
    (7, 7, 1, 7.0),    # one step: its calls
    (9, 0, 0, 9.0),    # no steps: the whole run
])
def test_per_step(calls, first, steps, expected):
    assert report.per_step(calls, first, steps) == expected


# ------------------------------------------------- torchrun, the HF Trainer


def test_torchrun_ranks_merged_into_one_report(audit, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, data = audit(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(port),
                        str(ROOT / "examples" / "distributed_ddp.py"), "--steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    # The launcher imports torch too but never uses the device: it leaves no record.
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert all(r["steps"] == 4 and r["calls"] > 0 for r in data["ranks"])
    # DDP all-reduces the gradients once per step: one bucket holding every parameter.
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from distributed_ddp import make_model
    finally:
        sys.path.pop(0)
    parameter_bytes = sum(p.numel() * p.element_size() for p in make_model().parameters())
    grads = [c for c in data["collectives"] if c["op"] == "allreduce" and c["bytes"] == parameter_bytes]
    assert grads and grads[0]["world_size"] == 2 and grads[0]["calls_per_step"] == 1, data["collectives"]
    # Ops are summed over the ranks: each rank ran the same steps.
    linear = next(o for o in data["ops"] if o["op"] == "aten::linear")
    assert linear["calls"] % 2 == 0 and linear["calls"] > 0
    assert data["estimates"][0]["by_class"]["collectives"][0] > 0


TRAINER_SCRIPT = """
    import sys
    {first}
    sys.path.insert(0, {tests!r})
    from test_hf_training import CountingDataset, tiny_llama, training_args
    from transformers import Trainer
    args = training_args({out!r}, max_steps=3)
    Trainer(model=tiny_llama(), args=args, train_dataset=CountingDataset()).train()
"""


@pytest.mark.parametrize("first", ["import torch", "from transformers import Trainer"],
                         ids=["torch-first", "transformers-first"])
def test_hf_trainer_tokens_per_step_detected(audit, tmp_path, first):
    """Tokens are counted whichever is imported first (the patch waits for transformers)."""
    script = _script(tmp_path, TRAINER_SCRIPT.format(first=first, tests=str(ROOT / "tests"),
                                                     out=str(tmp_path / "out")))
    proc, data = audit(str(script), options=["--price", "trn2.3xlarge=2.5"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    assert data["steps"]["count"] == 3 and data["steps"]["source"] == "optimizer"
    # 4 sequences of 16 tokens per micro-batch, 2 micro-batches per optimizer step.
    cost = data["cost"]
    assert cost["unit"] == "tokens" and cost["units_per_step"] == 4 * 16 * 2, cost
    assert "Trainer" in cost["units_source"]
    trn2 = next(r for r in cost["rows"] if r["name"] == "trn2.3xlarge")
    estimate = next(e for e in data["estimates"] if e["instance"] == "trn2.3xlarge")
    assert trn2["seconds_per_unit"][0] == pytest.approx(estimate["low_s"] / 128, rel=1e-3)
    assert "per million tokens" in proc.stdout


def test_report_fields_are_the_documented_ones(example):
    """docs/tools.md's table of the report's fields names exactly its top-level fields."""
    import re

    text = (ROOT / "docs" / "tools.md").read_text()
    section = text.split("### The report (JSON)", 1)[1].split("\n### ", 1)[0]
    documented = set()
    for first_cell in re.findall(r"^\| ([^|]+) \|", section, re.MULTILINE):
        documented.update(re.findall(r"`([a-z_]+)(?:\[\])?`", first_cell))
    documented.discard("Field")
    _, data = example
    assert documented == set(data), documented ^ set(data)
    assert documented == set(schema.SCHEMA["properties"])


def test_bench_audit_quick_runs(tmp_path):
    """The overhead benchmark runs end to end (timings are not asserted here)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_audit.py"), "--quick", "--json", str(out)],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads(out.read_text())["cases"]
    assert len(cases) == 3
    for case in cases.values():
        assert case["plain_s"] > 0 and case["recorded_s"] > 0 and case["p25"] <= case["ratio"] <= case["p75"]


def test_progress_line_sums_the_processes(tmp_path, capsys):
    """While the command runs, the audit shows one line (on a terminal): elapsed,
    steps, ops and fallback ops, read from the processes' progress files."""
    from torch_neuronx.cli import audit as audit_command

    for pid, state in ((11, {"steps": 3, "calls": 100, "fallback_ops": 1}),
                       (12, {"steps": 2, "calls": 50, "fallback_ops": 2})):
        (tmp_path / f"progress-{pid}.json").write_text(json.dumps(state))
    (tmp_path / "progress-13.json").write_text("{half written")  # being replaced: skipped
    audit_command._Progress(str(tmp_path)).show()
    line = capsys.readouterr().err
    assert line.startswith("\raudit: ") and "steps 3" in line and "ops 150" in line and "fallback ops 2" in line


GENERATE_SCRIPT = """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    from test_hf_training import tiny_llama
    model = tiny_llama().eval()
    prompt = torch.randint(1, 100, (2, 5))
    model.generate(prompt, max_new_tokens=2, do_sample=False)  # on the CPU: not counted
    model = model.to("neuron")
    for _ in range(3):
        model.generate(prompt.to("neuron"), max_new_tokens=4, do_sample=False)
"""


def test_generate_new_tokens_per_step_detected(audit, tmp_path):
    script = _script(tmp_path, GENERATE_SCRIPT.format(tests=str(ROOT / "tests")))
    proc, data = audit(str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    assert data["steps"]["count"] == 3 and data["steps"]["source"] == "generate"
    assert data["cost"]["unit"] == "new tokens" and data["cost"]["units_per_step"] == 2 * 4
    # Each decoding step attends over one more position: new kernels in every call
    # of the first generate, none in the later ones (same prompt length).
    assert data["eager_compilations"]["first_step"] > 0
    assert data["eager_compilations"]["new_per_step"] == [0, 0]


RECOMPILE_SCRIPT = """
    import torch
    f = torch.compile(lambda x: (x * 2).sin().sum(), backend="neuron")
    for n in (4, 5, 6):
        f(torch.randn(n, device="neuron"))
        torch_neuronx_audit_step()
"""


def test_recompiles_on_new_shapes_are_a_dynamic_shape_hazard(audit, tmp_path):
    script = _script(tmp_path, RECOMPILE_SCRIPT.replace(
        "torch_neuronx_audit_step()", "__import__('torch_neuronx.audit').audit.mark_step()"))
    proc, data = audit(str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    compiled = data["torch_compile"]
    assert compiled["recompiles"] == 2 and compiled["graph_runs"] == 3, compiled
    dynamic = [h for h in data["hazards"] if h["kind"] == "dynamic_shape"]
    assert len(dynamic) == 2 and all("size" in h["detail"] for h in dynamic), data["hazards"]
    assert "dynamic_shape" in {a["kind"] for a in data["verdict"]["actions"]}


# ------------------------------------------------ report logic on synthetic records


# The compiler's counters of a process that compiled nothing (this process's may not be).
_NOTHING_COMPILED = {key: [] if isinstance(value, list) else value if isinstance(value, bool) else 0
                     for key, value in metrics.snapshot().items()}


def _record(**overrides) -> dict:
    """A minimal record as recorder.Recording.record() writes it."""
    base = {
        "record_version": 1, "pid": 1, "argv": ["x.py"], "rank": 0, "instance": "trn2.3xlarge", "lnc": 2,
        "hbm_per_core": 24 * 2**30, "fallback_mode": "warn", "fp64_mode": "emulate", "started": 0.0,
        "duration_s": 1.0, "exception": None, "interrupted": False, "step_source": "optimizer",
        "steps": [{"units": 0, "end_s": 1.0, "calls": 1, "memory_peak": [0], "memory_allocated": [0]}],
        "calls": 1, "signatures": [], "memory": {"peak": [0], "allocated_at_exit": [0]},
        "compile": _NOTHING_COMPILED, "graphs": [], "graph_breaks": [], "unlowered": [],
        "collectives": [], "units": {},
    }
    base.update(overrides)
    return base


def _build(records, **options):
    return report.build(records, report.Options(**options), command=["x.py"], exit_code=0,
                        interrupted=False, wall_s=1.0)


@pytest.mark.parametrize("peak_gib, fits, needed, status", [
    (20, True, 1, "ready"),
    (40, False, 2, "ready_after_fixes"),      # shard over 2 of trn2.3xlarge's 4 cores
    (200, False, 9, "blocked"),               # more than the 4 cores of either target
])
def test_memory_fit_and_smallest_sharding(peak_gib, fits, needed, status):
    data = _build([_record(memory={"peak": [peak_gib * 2**30], "allocated_at_exit": [0]})])
    schema.validate(data)
    trn2 = next(t for t in data["memory"]["targets"] if t["instance"] == "trn2.3xlarge")
    assert trn2["fits"] is fits and trn2["cores_needed"] == needed
    assert trn2["fits_sharded"] is (needed <= 4)
    assert data["verdict"]["status"] == status


def test_targets_follow_the_lnc_of_the_audited_command(monkeypatch):
    # NEURON_LOGICAL_NC_CONFIG=1 (inherited by the audited processes): a trn2/trn3 core has half the
    # HBM and half the rates; trn1 cannot take LNC=2 and keeps its own LNC=1 under it.
    record = _record(memory={"peak": [20 * 2**30], "allocated_at_exit": [0]})
    mm = {"id": 0, "op": "aten::mm", "path": "native", "allocated": 0, "first_step": 0, "site": None,
          "args": [{"dtype": "bfloat16", "shape": [4096, 4096], "device": "neuron:0"}] * 2,
          "hazards": [], "calls": 2, "host_ns": 100, "calls_first_step": 1, "host_ns_first_step": 50}
    record["signatures"], record["steps"] = [mm], record["steps"] * 2
    targets = ["trn2.3xlarge", "trn3.48xlarge"]
    default = _build([record], targets=targets)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    lnc1 = _build([record], targets=targets)
    schema.validate(lnc1)
    rows = {t["instance"]: t for t in lnc1["memory"]["targets"]}
    assert (rows["trn2.3xlarge"]["hbm_per_core_bytes"], rows["trn2.3xlarge"]["fits"]) == (12 * 2**30, False)
    assert (rows["trn2.3xlarge"]["cores_needed"], rows["trn2.3xlarge"]["cores_available"]) == (2, 8)
    assert (rows["trn3.48xlarge"]["hbm_per_core_bytes"], rows["trn3.48xlarge"]["cores_available"]) == \
        (18 * 2**30, 128)
    for before, after in zip(default["estimates"], lnc1["estimates"]):
        assert after["assumptions"][0].startswith(f"{before['instance']} (") and "LNC=1" in after["assumptions"][0]
        assert after["by_class"]["matmul"] == pytest.approx([2 * t for t in before["by_class"]["matmul"]])
    assert [p.lnc for p in report.target_profiles(["trn1.2xlarge", "trn2.3xlarge"])] == [1, 1]
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    assert [p.lnc for p in report.target_profiles(["trn1.2xlarge", "trn2.3xlarge"])] == [1, 2]


def test_fp8_is_a_hazard_only_for_targets_without_fp8():
    sig = {"id": 0, "op": "aten::_scaled_mm", "path": "direct", "allocated": 0, "first_step": 0, "site": None,
           "args": [{"dtype": "float8_e4m3fn", "shape": [16, 16], "device": "neuron:0"}] * 2
           + [{"dtype": "float32", "shape": [], "device": "neuron:0"}] * 2,
           "hazards": ["fp8"], "calls": 2, "host_ns": 100, "calls_first_step": 1, "host_ns_first_step": 50}
    both = _build([_record(signatures=[sig], steps=[_record()["steps"][0]] * 2)])
    fp8 = [h for h in both["hazards"] if h["kind"] == "fp8"]
    assert len(fp8) == 1 and "trn2.3xlarge" in fp8[0]["detail"] and "trn3" not in fp8[0]["detail"]
    assert "FP8 compute needs Trainium3" in fp8[0]["detail"] and "docs/fp8.md" in fp8[0]["detail"]
    trn3_only = _build([_record(signatures=[sig])], targets=["trn3.3xlarge"])
    assert not [h for h in trn3_only["hazards"] if h["kind"] == "fp8"]


UNLOWERED_SCRIPT = """
    import torch
    f = torch.compile(lambda x: torch.special.i0e(x * 2) + 1, backend="neuron")
    for _ in range(2):
        f(torch.randn(8, device="neuron"))
        __import__("torch_neuronx.audit").audit.mark_step()
"""


def test_ops_with_no_lowering_reported_with_their_line(audit, tmp_path):
    """With TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 a graph holding an op with no
    lowering runs eagerly: the audit names the op and its line, and the eager
    fallback op it then runs."""
    script = _script(tmp_path, UNLOWERED_SCRIPT)
    proc, data = audit(str(script), env={"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    unlowered = data["torch_compile"]["unlowered"]
    assert [u["op"] for u in unlowered] == ["aten.special_i0e.default"], unlowered
    assert 'script.py", line 3' in unlowered[0]["source"]
    assert "aten::special_i0e.out" in {f["op"] for f in data["fallbacks"]}
    remedy = next(a["remedy"] for a in data["verdict"]["actions"] if a["kind"] == "fallback")
    assert "torch-neuronx ops special_i0e" in remedy


ACCELERATE_SCRIPT = """
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    model = torch.nn.Linear(8, 4)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(3):
        loss = model(torch.randn(4, 8, device=accelerator.device)).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print("trained on", accelerator.device)
"""


def test_accelerate_launch_is_audited(audit, tmp_path):
    """`accelerate launch` starts the script in a process of its own: that process records."""
    script = _script(tmp_path, ACCELERATE_SCRIPT)
    accelerate = pathlib.Path(sys.executable).with_name("accelerate")
    proc, data = audit(str(accelerate), "launch", "--num_processes", "1", str(script),
                       env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained on neuron" in proc.stdout
    schema.validate(data)
    assert data["steps"]["count"] == 3 and len(data["ranks"]) == 1
    assert {"aten::linear", "aten::linear_backward"} <= {o["op"] for o in data["ops"]}


def test_a_line_whose_shapes_change_counts_every_step_it_ran_in():
    """A host sync whose tensor shape changes every step is a new signature each step;
    its line still ran in every step (in the step loop), not in one."""
    rec = recorder.Recording()
    rec.start()
    try:
        for n in (3, 4, 5):
            torch.randn(n, device="neuron").cpu()  # a device-to-host copy of a new shape each step
            rec.mark_step()
    finally:
        rec.stop()
    data = _build([rec.record()])
    sync = next(h for h in data["hazards"] if h["kind"] == "host_sync")
    site = next(s for s in sync["sites"] if s["file"] == __file__)
    assert site["calls"] == 3 and site["steps"] == 3 and site["in_step_loop"]
    assert "step_indices" not in site
