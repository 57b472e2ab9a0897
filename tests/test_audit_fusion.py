"""The audit's model of Adaptive Eager Execution (torch_neuronx/audit/fusion.py over
csrc/Recorder.h): how TorchNeuron would group the recorded eager calls into launches,
what cut each sequence (with its line), and how the report uses it."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import _C
from torch_neuronx.audit import estimate, fusion, recorder, report, schema, terminal
from torch_neuronx.compiler import metrics


@pytest.mark.parametrize("op, path, role", [
    ("aten::add.Tensor", "native", fusion.FUSIBLE),
    ("aten::add.Tensor", "direct", fusion.FUSIBLE),
    ("aten::mm", "native", fusion.ENDS_SEQUENCE),
    ("aten::addmm", "native", fusion.ENDS_SEQUENCE),
    ("aten::linear", "direct", fusion.ENDS_SEQUENCE),
    ("aten::convolution", "native", fusion.ENDS_SEQUENCE),
    ("aten::add_.Tensor", "native", fusion.BOUNDARY),        # in place: AWS's engine runs it alone
    ("aten::add.out", "native", fusion.BOUNDARY),            # writes into its out= argument
    ("aten::_foreach_add_.List", "native", fusion.BOUNDARY),
    ("aten::addmm_", "native", fusion.BOUNDARY),             # in place wins over matmul-class
    ("aten::_local_scalar_dense", "native", fusion.BOUNDARY),
    ("aten::nonzero", "native", fusion.BOUNDARY),
    ("aten::copy_", "direct", fusion.BOUNDARY),
    ("aten::_to_copy", "native", fusion.BOUNDARY),
    ("aten::special_i0e.out", "fallback", fusion.BOUNDARY),
    ("aten::sin", "fallback", fusion.BOUNDARY),              # the path decides: a fallback is host work
    ("mylib::custom", "native", fusion.BOUNDARY),
    ("aten::view", "native", fusion.TRANSPARENT),
    ("aten::t", "native", fusion.TRANSPARENT),
    ("aten::empty.memory_format", "direct", fusion.TRANSPARENT),
    ("aten::resize_", "direct", fusion.TRANSPARENT),
    ("aten::__and__.Tensor", "native", fusion.FUSIBLE),      # a dunder is not in place
])
def test_role_of(op, path, role):
    assert fusion.role_of(op, path) == role


def _recorded(body, steps: int = 3) -> dict:
    rec = recorder.Recording()
    rec.start()
    try:
        for _ in range(steps):
            body()
            rec.mark_step()
    finally:
        rec.stop()
    return rec.record()


def _sequences(data: dict) -> list[tuple[list[str], int]]:
    """(op names, launches in steps 2..N) of each recorded sequence."""
    by_id = {s["id"]: s["op"] for s in data["signatures"]}
    return sorted(([by_id[i] for i in seq["ops"]], seq["launches_steps"] - seq["launches_first_step"])
                  for seq in data["fused_sequences"])


def test_a_host_read_and_a_synchronize_cut_sequences_at_their_lines():
    x = torch.ones(64, device="neuron")

    def step():
        y = (x * 2 + 1).exp()
        y.max().item()  # host read: cuts
        z = (y - 1) / 3
        torch.neuron.synchronize()
        z.sqrt().neg()

    data = _recorded(step)
    assert (["aten::sub.Tensor", "aten::div.Tensor"], 2) in _sequences(data)
    assert (["aten::sqrt", "aten::neg"], 2) in _sequences(data)
    summary = fusion.summarize(data)
    # Per step: three sequences (mul add exp max | sub div | sqrt neg) and the read itself.
    assert summary["launches_per_step_fused"] == 4
    assert summary["launches_per_step_unfused"] == 9  # mul add exp max item sub div sqrt neg
    assert summary["ops_per_fused_launch"] == pytest.approx(8 / 3)
    cuts = {(c["reason"], c["op"]): c for c in summary["cuts"]}
    read = cuts[("a host read", "aten::_local_scalar_dense")]
    assert read["per_step"] == 1 and read["site"]["file"] == __file__
    assert read["site"]["code"] == "y.max().item()  # host read: cuts"
    assert cuts[(fusion.CUTS[-3], None)]["per_step"] == 1
    # The sequence left open at the step's end is closed there, and is not an actionable cut.
    assert all(c["reason"] != fusion.CUTS[-7] for c in summary["cuts"])


def test_a_matmul_class_op_ends_its_sequence_and_an_in_place_op_runs_alone():
    w = torch.randn(16, 16, device="neuron")
    x = torch.randn(8, 16, device="neuron")

    def step():
        h = torch.relu(x * 2) @ w
        h.add_(1)  # in place: a boundary
        (h.tanh() @ w).sum()

    data = _recorded(step)
    sequences = _sequences(data)
    assert (["aten::mul.Tensor", "aten::relu", "aten::mm"], 2) in sequences
    assert (["aten::tanh", "aten::mm"], 2) in sequences
    assert (["aten::sum"], 2) in sequences  # open at the step's end
    summary = fusion.summarize(data)
    assert summary["launches_per_step_fused"] == 4  # two matmul sequences, add_, sum
    assert summary["launches_per_step_unfused"] == 7
    ended = {row["ops"][-1]: row["ended_by"] for row in summary["sequences"]}
    assert ended["aten::mm"][0]["reason"] == fusion.CUTS[-1]


def test_the_buffer_size_limit_cuts_long_sequences(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT", "3")
    x = torch.ones(32, device="neuron")

    def step():
        y = x
        for _ in range(7):
            y = y * 1.5
        return y

    data = _recorded(step)
    summary = fusion.summarize(data)
    assert summary["launches_per_step_fused"] == 3  # 3 + 3 + 1
    assert summary["cuts"][0]["reason"] == fusion.CUTS[-2] and summary["cuts"][0]["per_step"] == 2


def test_shapes_make_distinct_fused_kernels():
    sizes = iter([8, 8, 9, 10])

    def step():
        n = next(sizes)
        (torch.ones(n, device="neuron") * 2).exp()

    data = _recorded(step, steps=4)
    summary = fusion.summarize(data)
    assert summary["kernels"] == 3 and summary["kernels_new_after_step_1"] == 2


def test_recording_twice_starts_a_fresh_model():
    x = torch.ones(4, device="neuron")
    first = _recorded(lambda: (x + 1).exp(), steps=1)
    second = _recorded(lambda: (x + 1).exp(), steps=1)
    assert [seq["id"] for seq in first["fused_sequences"]] == [seq["id"] for seq in second["fused_sequences"]] == [0]


def test_without_recording_the_model_keeps_nothing():
    x = torch.ones(4, device="neuron")
    (x + 1).exp()
    torch.neuron.synchronize()
    assert _C._audit_take_fused_sequences() == []


# ---------------------------------------------------------------- the report

def _record(concatenation: bool) -> dict:
    """A record of three steps, each: mul, add, exp, then .item() at line 7 of train.py."""
    site = {"file": "train.py", "line": 7, "function": "<module>", "backward": False, "code": "loss.item()"}

    def sig(sig_id, op, role, args):
        return {"id": sig_id, "op": op, "path": "native", "args": args, "allocated": 0, "first_step": 0,
                "first_phase": None, "site": site if op.endswith("dense") else None,
                "hazards": ["host_sync"] if op.endswith("dense") else [], "fusion_role": role,
                "calls": 3, "host_ns": 3000, "calls_first_step": 1, "host_ns_first_step": 1000,
                "calls_steps": 3, "host_ns_steps": 3000, "calls_after_last_step": 0,
                "host_ns_after_last_step": 0, "phases": {},
                **({"sites": [dict(site, calls=3, step_indices=[0, 1, 2], phases=[])],
                    "calls_by_step": {"0": 1, "1": 1, "2": 1}, "calls_by_phase": {}}
                   if op.endswith("dense") else {})}

    tensor = [{"tensor": True, "dtype": "float32", "shape": [1024], "device": "neuron:0"}]
    signatures = [sig(0, "aten::mul.Tensor", "fusible", tensor * 2), sig(1, "aten::add.Tensor", "fusible", tensor * 2),
                  sig(2, "aten::exp", "fusible", tensor), sig(3, "aten::_local_scalar_dense", "boundary", tensor)]
    sequence = {"id": 0, "ops": [0, 1, 2], "first_step": 0, "launches": 3, "launches_first_step": 1,
                "launches_steps": 3, "launches_after_last_step": 0, "launches_by_phase": {},
                "ended_by": [{"cut": 3, "launches": 3, "launches_first_step": 1, "launches_steps": 3,
                              "launches_after_last_step": 0, "launches_by_phase": {}}]}
    step = {"units": 0, "end_s": 1.0, "calls": 4, "memory_peak": [0], "memory_allocated": [0]}
    return {
        "record_version": 2, "pid": 1, "argv": ["train.py"], "rank": 0, "instance": "trn2.3xlarge", "lnc": 2,
        "hbm_per_core": 24 * 2**30, "fallback_mode": "warn", "fp64_mode": "emulate", "started": 0.0,
        "duration_s": 1.0, "exception": None, "interrupted": False, "step_source": "optimizer",
        "steps": [step] * 3, "calls": 12, "signatures": signatures,
        "memory": {"peak": [0], "allocated_at_exit": [0]},
        "compile": {key: [] if isinstance(value, list) else value if isinstance(value, bool) else 0
                    for key, value in metrics.snapshot().items()},
        "graphs": [], "graph_breaks": [], "unlowered": [], "collectives": [], "units": {},
        "concatenation": concatenation, "fused_sequences": [sequence],
    }


def _build(record: dict) -> dict:
    return report.build([record], report.Options(), command=["train.py"], exit_code=0, interrupted=False,
                        wall_s=1.0)


@pytest.mark.parametrize("enabled", [False, True])
def test_report_costs_launches_from_fusion_only_when_it_is_on(enabled):
    data = _build(_record(enabled))
    schema.validate(data)
    assert data["fusion"]["enabled"] is enabled
    assert data["fusion"]["launches_per_step_unfused"] == 4
    assert data["fusion"]["launches_per_step_fused"] == 2  # mul add exp | item
    launches = 2 if enabled else 4
    for row in data["estimates"]:
        assert row["by_class"]["launch"] == pytest.approx([launches * estimate.LOW.launch_s,
                                                          launches * estimate.HIGH.launch_s])
    actions = {a["kind"]: a for a in data["verdict"]["actions"]}
    read = actions["host_sync"]
    # One round trip per step, plus (fusion on) the launch its cut costs.
    expected = estimate.LOW.sync_s + (estimate.LOW.launch_s if enabled else 0.0)
    assert read["cost_per_step_s"] == pytest.approx(expected)
    assert "fused sequence" in read["remedy"] and read["where"] == "train.py:7"
    if enabled:
        assert "fusion" not in actions
    else:
        assert actions["fusion"]["cost_per_step_s"] is None
        assert "TORCH_NEURONX_ENABLE_CONCATENATION=1" in actions["fusion"]["remedy"]
    text = terminal.render(data)
    assert "Adaptive Eager Execution (fusion): " + ("on" if enabled else "off") in text
    assert "cut by a host read (aten::_local_scalar_dense at train.py:7): 1 per step" in text


def test_record_without_fusion_fields_still_builds():
    """A record written before the model existed (no fused_sequences) reports no fusion."""
    record = _record(False)
    del record["fused_sequences"], record["concatenation"]
    for sig in record["signatures"]:
        del sig["fusion_role"]
    data = _build(record)
    assert data["fusion"]["launches_per_step_fused"] == data["fusion"]["launches_per_step_unfused"] == 4
    assert "fusion" not in {a["kind"] for a in data["verdict"]["actions"]}
