"""torch-neuronx audit: work that is not a training step (an evaluation after the
training loop or between its steps, generate after training, saving) is reported
as a phase of its own and never averaged into the per-step figures (issue #30)."""

from __future__ import annotations

import pytest
import torch

from test_audit import ROOT, _build, _script, audit  # noqa: F401 (audit: a fixture)
from torch_neuronx.audit import knobs, recorder, schema

STEPS = 4


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("neuron")


def _train_step(model, opt):
    loss = model(torch.randn(8, 16, device="neuron")).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def _evaluate(model, batches: int = 12):
    """An evaluation larger than the training loop: more batches, a bigger batch, a host read each."""
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            total += model(torch.randn(64, 16, device="neuron")).sum().item()
    return total


def _recorded(run) -> dict:
    rec = recorder.Recording()
    rec.start()
    try:
        run(rec)
    finally:
        rec.stop()
    return rec.record()


def _train(rec, evaluate: str = "none"):
    """STEPS optimizer steps; evaluate: none, after (after the loop, unmarked) or between
    (in a torch_neuronx.audit.phase after steps 2 and 3, and after the loop)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        _train_step(model, opt)
        if evaluate == "between" and step in (1, 2):
            with rec.phase("evaluate"):
                _evaluate(model)
    if evaluate == "after":
        _evaluate(model)
    if evaluate == "between":
        with rec.phase("evaluate"):
            _evaluate(model)


def _per_step(report: dict) -> dict:
    return {(o["op"], o["path"]): o["calls_per_step"] for o in report["ops"] if o["calls_per_step"]}


@pytest.fixture(scope="module")
def reports():
    return {mode: _build([_recorded(lambda rec, mode=mode: _train(rec, mode))])
            for mode in ("none", "after", "between")}


@pytest.mark.parametrize("mode", ["after", "between"])
def test_per_step_figures_are_the_same_with_an_evaluation(reports, mode):
    base, evaluated = reports["none"], reports[mode]
    schema.validate(evaluated)
    assert _per_step(evaluated) == _per_step(base)
    for with_eval, without in zip(evaluated["estimates"], base["estimates"]):
        # The estimate is a function of the per-step calls and shapes: equal, well inside 10%.
        assert with_eval["low_s"] == pytest.approx(without["low_s"], rel=0.10)
        assert with_eval["high_s"] == pytest.approx(without["high_s"], rel=0.10)
    assert evaluated["eager_compilations"]["new_per_step"] == base["eager_compilations"]["new_per_step"]
    assert evaluated["cost"]["rows"][0]["seconds_per_step"] == pytest.approx(
        base["cost"]["rows"][0]["seconds_per_step"], rel=0.10)
    # The evaluation's host reads are no hazard of the step loop: they ran outside the steps only.
    sync = next(h for h in evaluated["hazards"] if h["op"] == "aten::_local_scalar_dense")
    assert sync["calls_per_step"] == 0 and not sync["in_step_loop"] and sync["phases"]
    assert not [a for a in evaluated["verdict"]["actions"] if a["kind"] == "host_sync"]


def test_work_after_the_last_step_is_its_own_phase(reports):
    phases = {p["name"]: p for p in reports["after"]["phases"]}
    after = phases[recorder.AFTER_LAST_STEP]
    assert after["label"] == "after the training loop" and after["occurrences"] == 1
    ops = {o["op"]: o for o in after["ops"]}
    # 12 batches of two linear layers; no backward, no optimizer there.
    assert ops["aten::linear"]["calls"] == 24 and ops["aten::_local_scalar_dense"]["calls"] == 12
    assert not any("backward" in op or "foreach" in op for op in ops)
    assert after["new_kernels"] > 0 and after["peak_bytes"] > 0
    # Its own estimate: larger than a training step's (more, bigger batches), on every target.
    steps = {e["instance"]: e for e in reports["after"]["estimates"]}
    for estimate in after["estimates"]:
        assert estimate["label"] == "estimate" and estimate["high_s"] > steps[estimate["instance"]]["high_s"]
    # Without an evaluation the work after the last step is close to nothing.
    tail = {p["name"]: p for p in reports["none"]["phases"]}.get(recorder.AFTER_LAST_STEP)
    assert tail is None or tail["calls"] < 5


def test_a_named_phase_between_steps(reports):
    phases = {p["name"]: p for p in reports["between"]["phases"]}
    evaluate = phases["evaluate"]
    assert (evaluate["occurrences"], evaluate["between_steps"], evaluate["after_last_step"]) == (3, 2, 1)
    linear = next(o for o in evaluate["ops"] if o["op"] == "aten::linear")
    assert linear["calls"] == 3 * 24 and linear["calls_per_occurrence"] == 24
    # Its kernels are its own, not new kernels of the steps it ran between (no false shape churn).
    assert reports["between"]["eager_compilations"]["in_phases"]["evaluate"] == evaluate["new_kernels"] > 0
    assert not reports["between"]["eager_compilations"]["churn"]
    assert recorder.AFTER_LAST_STEP not in phases or phases[recorder.AFTER_LAST_STEP]["calls"] < 5
    assert "work outside the steps is reported apart" in reports["between"]["steps"]["note"]


def test_steps_marked_inside_a_phase_do_not_count():
    def run(rec):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _train_step(model, opt)
        with rec.phase("export"):
            with rec.phase("nested"):  # a nested phase belongs to the outer one
                rec.mark_step("optimizer")
                _evaluate(model, batches=2)
        _train_step(model, opt)

    record = _recorded(run)
    assert len(record["steps"]) == 2
    assert [p["name"] for p in record["phases"]] == ["export", recorder.AFTER_LAST_STEP]
    linear = [s for s in record["signatures"] if s["op"] == "aten::linear" and "export" in s["phases"]]
    assert sum(s["phases"]["export"][0] for s in linear) == 4


def test_a_phase_left_open_by_an_exception_is_closed_in_the_record():
    def run(rec):
        model = _model()
        _train_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
        rec.enter_phase("evaluate")
        _evaluate(model, batches=1)

    record = _recorded(run)
    evaluate = next(p for p in record["phases"] if p["name"] == "evaluate")
    assert evaluate["occurrences"] == 1 and evaluate["wall_s"] > 0
    linear = [s for s in record["signatures"] if s["op"] == "aten::linear"]
    assert sum(s["phases"].get("evaluate", [0])[0] for s in linear) == 2
    assert sum(s["calls_after_last_step"] for s in linear) == 0


def test_public_phase_is_a_no_op_when_not_audited():
    import torch_neuronx.audit

    assert recorder.ACTIVE is None
    with torch_neuronx.audit.phase("evaluate"):
        y = torch.ones(2, device="neuron") * 2
    assert y.sum().item() == 4


# ------------------------------------------------------ through the command line

INFERENCE_SCRIPT = """
    import torch
    model = torch.nn.Linear(16, 4).to("neuron")
    with torch.no_grad():
        for _ in range(5):
            print(model(torch.randn(8, 16, device="neuron")).sum().item())
"""


def test_a_script_with_no_steps(audit, tmp_path):
    """Inference only, no step marker: the whole run is the one step; no phase is made up."""
    proc, data = audit(str(_script(tmp_path, INFERENCE_SCRIPT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    assert data["steps"]["source"] == "none" and "whole run counts as one step" in data["steps"]["note"]
    assert data["phases"] == []
    linear = next(o for o in data["ops"] if o["op"] == "aten::linear")
    assert linear["calls_per_step"] == linear["calls"] == 5
    assert all(e["high_s"] > 0 for e in data["estimates"])
    assert "Outside the training steps" not in proc.stdout


TRAINER_EVAL_SCRIPT = """
    import sys
    sys.path.insert(0, {tests!r})
    from test_hf_training import CountingDataset, tiny_llama, training_args
    from transformers import Trainer
    mode = sys.argv[1]
    extra = dict(eval_strategy="steps", eval_steps=2) if mode == "steps" else {{}}
    args = training_args({out!r}, max_steps=4, per_device_eval_batch_size=8, **extra)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=CountingDataset(),
                      eval_dataset=None if mode == "none" else CountingDataset(48))
    trainer.train()
    if mode == "end":
        print(trainer.evaluate()["eval_loss"])
"""


@pytest.fixture(scope="module")
def trainer_reports(tmp_path_factory):
    """The HF Trainer audited without evaluation, with trainer.evaluate() after train(), and
    with eval_strategy="steps" (evaluations between training steps)."""
    import json
    import os

    from test_audit import _env

    from torch_neuronx import cli

    tmp = tmp_path_factory.mktemp("trainer")
    script = _script(tmp, TRAINER_EVAL_SCRIPT.format(tests=str(ROOT / "tests"), out=str(tmp / "out")))
    results = {}
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith(("TORCH_NEURONX_", "NEURON_"))]:
            del os.environ[name]
        os.environ.update({k: v for k, v in _env(tmp).items() if k.startswith("TORCH_NEURONX_")})
        os.environ["HF_HUB_OFFLINE"] = "1"
        for mode in ("none", "end", "steps"):
            out = tmp / f"{mode}.json"
            code = cli.main(["audit", "--quiet", "--json", str(out), "--", str(script), mode])
            assert code == 0, mode
            results[mode] = json.loads(out.read_text())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return results


@pytest.mark.parametrize("mode", ["end", "steps"])
def test_hf_trainer_evaluation_is_a_phase(trainer_reports, mode):
    base, data = trainer_reports["none"], trainer_reports[mode]
    schema.validate(data)
    assert data["steps"]["count"] == base["steps"]["count"] == 4
    assert _per_step(data) == pytest.approx(_per_step(base), rel=0.10)
    for with_eval, without in zip(data["estimates"], base["estimates"]):
        assert with_eval["high_s"] == pytest.approx(without["high_s"], rel=0.10)
    assert data["cost"]["units_per_step"] == base["cost"]["units_per_step"] == 4 * 16 * 2
    evaluate = next(p for p in data["phases"] if p["name"] == "evaluate")
    assert evaluate["label"] == "HF Trainer evaluate"
    expected = {"end": (1, 0, 1), "steps": (2, 1, 1)}[mode]  # eval_steps=2 of 4: after steps 2 and 4
    assert (evaluate["occurrences"], evaluate["between_steps"], evaluate["after_last_step"]) == expected
    # Its unit: the tokens of its batches (48 sequences of 16), per evaluate call.
    assert evaluate["unit"] == "tokens" and evaluate["units_per_occurrence"] == 48 * 16
    assert evaluate["cost"] and evaluate["cost"][0]["seconds_per_unit"]
    assert evaluate["calls"] > 0 and evaluate["estimates"][0]["high_s"] > 0


def test_hf_trainer_host_reads_name_the_trainer_option(trainer_reports):
    """The Trainer's own reads of device values (inside trainer.train()) get the Trainer's
    options as remedies, not "read values every N steps", which the user cannot do."""
    actions = [a for a in trainer_reports["none"]["verdict"]["actions"] if a["kind"] == "host_sync"]
    remedies = " ".join(a["remedy"] for a in actions)
    assert "logging_nan_inf_filter=False" in remedies and "logging_steps" in remedies, remedies
    assert "once every N steps" not in remedies
    assert all(a["where"].endswith(".py:" + a["where"].rsplit(":", 1)[1]) for a in actions)
    sync = next(h for h in trainer_reports["none"]["hazards"] if h["kind"] == "host_sync")
    assert any((s.get("library") or {}).get("function") == "_run_epoch" for s in sync["sites"])


GENERATE_AFTER_TRAINING = """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    from test_hf_training import tiny_llama
    model = tiny_llama().to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = torch.randint(1, 100, (2, 8), device="neuron")
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    for _ in range(2):
        model.generate(ids[:, :5], max_new_tokens=3, do_sample=False)
"""


def test_generate_after_training_is_a_phase(audit, tmp_path):
    script = _script(tmp_path, GENERATE_AFTER_TRAINING.format(tests=str(ROOT / "tests")))
    proc, data = audit(str(script), env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    schema.validate(data)
    assert data["steps"]["count"] == 3 and data["steps"]["source"] == "optimizer"
    generate = next(p for p in data["phases"] if p["name"] == "generate")
    assert (generate["occurrences"], generate["after_last_step"]) == (2, 2)
    assert generate["unit"] == "new tokens" and generate["units_per_occurrence"] == 2 * 3
    assert data["cost"]["unit"] == "step"  # the training steps have no unit of their own here
    assert "Outside the training steps" in proc.stdout and "generate after training" in proc.stdout


# ------------------------------------------------------------- library options

@pytest.mark.parametrize("function, needle", [
    ("_run_epoch", "logging_nan_inf_filter=False"),
    ("_maybe_log_save_evaluate", "logging_steps"),
    ("_track_num_input_tokens", "include_num_input_tokens_seen"),
    ("find_packed_sequence_indices", "attention_mask"),
    ("evaluation_loop", "eval_strategy"),
    ("some_other_function", "look for that library's option"),
])
def test_library_remedy_names_the_option(function, needle):
    library = {"file": "/env/lib/python3.11/site-packages/transformers/trainer.py", "line": 10,
               "function": function}
    remedy = knobs.library_remedy(library)
    assert needle in remedy and "transformers makes this host read" in remedy


def test_package_of():
    assert knobs.package_of("/x/site-packages/accelerate/utils/operations.py") == "accelerate"
    assert knobs.package_of("/x/dist-packages/six.py") == "six"
    assert knobs.package_of("/home/me/train.py") == "train.py"
