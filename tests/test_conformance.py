"""Conformance subset: PyTorch's OpInfo database and module_db on `neuron` vs CPU.

The representative subset (every op_db entry and every module_db entry, at
float32 + int64 + bool where supported, at most SUBSET_MAX_SAMPLES samples per
case) runs through tests/conformance/run_opinfo.py in worker processes, so a
crash in the core is recorded as a failing sample instead of killing pytest.
The full run (every dtype, every sample) is `run_opinfo.py --full`; its result
is docs/conformance.md.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import seeds

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "tests" / "conformance" / "run_opinfo.py"
PASS_RATE_TARGET = 0.97


def _load_harness():
    spec = importlib.util.spec_from_file_location(
        "neuron_conformance_harness", ROOT / "tests" / "conformance" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


harness = _load_harness()


# --------------------------------------------------------------------------- the harness itself


class _FakeOp:
    """Just enough of an OpInfo for run_op_sample."""

    def __init__(self, name, fn):
        self.name, self.fn, self.variant_test_name = name, fn, ""

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _sample(*args, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput

    return SampleInput(*args, **kwargs)


def test_copy_to_device_keeps_layout():
    base = torch.arange(40.0).reshape(5, 8)
    for t in (base[1:, 1::3], base.t(), base[2], torch.arange(3.0).expand(4, 3)):
        d = harness.tensor_to_device(t)
        assert d.device.type == "neuron"
        assert d.stride() == t.stride() and d.storage_offset() == t.storage_offset()
        torch.testing.assert_close(d.cpu(), t)
        assert d.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_compare_catches_wrong_values_dtypes_and_shapes():
    x = torch.randn(4, 5)
    harness.compare(x.clone(), x)
    with pytest.raises(AssertionError):
        harness.compare(x + 1e-3, x)
    with pytest.raises(AssertionError, match="dtype"):
        harness.compare(x.double(), x)
    with pytest.raises(AssertionError, match="shape"):
        harness.compare(x[:3], x)
    with pytest.raises(AssertionError):
        harness.compare([x, x], [x, x + 1])
    harness.compare(x + 5.0, x, shape_only=True)


def test_fp32_rule_tolerance_for_float64():
    x = torch.randn(100, dtype=torch.float64)
    harness.compare(x.float().double(), x)  # float32 rounding is within the fp32 rule
    with pytest.raises(AssertionError):
        harness.compare(x * (1 + 1e-4), x)  # a real error is not


def test_sample_runner_detects_a_device_specific_bug():
    def buggy(t):
        return t + (1 if t.device.type == "neuron" else 0)

    sample = _sample(torch.randn(3, 4))
    assert harness.run_op_sample(_FakeOp("buggy", buggy), sample, torch.float32)[0] == "fail"
    status, _ = harness.run_op_sample(_FakeOp("sin", torch.sin), sample, torch.float32)
    assert status == "pass"


def test_topk_indices_are_checked_by_the_values_they_point_at():
    """topk on ties: the device's indices (the lowest among equal values) differ
    from CPU's and pass; indices pointing at other values fail."""
    sample = _sample(torch.tensor([[2, 5, 5, 1, 5], [0, 0, 0, 0, 0]]), 2)
    status, message = harness.run_op_sample(_FakeOp("topk", torch.topk), sample, torch.int64)
    assert status == "pass", message

    def wrong_indices(t, k):
        values, indices = torch.topk(t, k)
        return values, (indices + 1) % t.shape[-1] if t.device.type == "neuron" else indices

    assert harness.run_op_sample(_FakeOp("topk", wrong_indices), sample, torch.int64)[0] == "fail"


def test_sample_runner_skips_when_cpu_raises_and_fails_when_only_neuron_raises():
    def cpu_raises(t):
        if t.device.type == "cpu":
            raise ValueError("cpu")
        return t

    def neuron_raises(t):
        if t.device.type == "neuron":
            raise ValueError("neuron")
        return t

    sample = _sample(torch.randn(3))
    status, reason = harness.run_op_sample(_FakeOp("a", cpu_raises), sample, torch.float32)
    assert status == "skip" and "CPU reference raises ValueError" in reason
    status, message = harness.run_op_sample(_FakeOp("b", neuron_raises), sample, torch.float32)
    assert status == "fail" and "neuron" in message


def test_random_ops_check_only_shape_dtype_device():
    sample = _sample(torch.zeros(5, 6))
    status, _ = harness.run_op_sample(_FakeOp("randn_like", torch.randn_like), sample, torch.float32)
    assert status == "pass"
    status, _ = harness.run_op_sample(
        _FakeOp("randn_like", lambda t: torch.randn(3 if t.device.type == "neuron" else 5, device=t.device)),
        _sample(torch.zeros(5)), torch.float32)
    assert status == "fail"


def test_output_left_on_cpu_is_a_failure():
    status, message = harness.run_op_sample(_FakeOp("to_host", lambda t: t.cpu() * 2),
                                            _sample(torch.ones(3)), torch.float32)
    assert status == "fail" and "on cpu" in message


# --------------------------------------------------------------------------- the subset


@pytest.fixture(scope="module")
def subset(tmp_path_factory, request):
    out = tmp_path_factory.mktemp("conformance")
    report, raw = out / "subset.md", out / "subset.jsonl"
    cmd = [sys.executable, str(RUNNER), "--jobs", "2", "--output", str(report), "--json", str(raw),
           "--seed", str(seeds.seed(harness.SAMPLE_SEED))]
    if request.config.getoption("threads") is not None:  # pytest --threads (tests/conftest.py)
        cmd += ["--threads", str(request.config.getoption("threads"))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    return records, report.read_text()


def _totals(records):
    passed = sum(r["passed"] for r in records)
    failed = sum(r["failed"] for r in records)
    skipped = sum(r["skipped"] for r in records)
    return passed, failed, skipped


def test_subset_covers_op_db_and_module_db(subset):
    """op_db, the foreach databases (each op also in place: `_foreach_add_`) and module_db."""
    from torch.testing._internal import common_methods_invocations as cmi
    from torch.testing._internal.common_modules import module_db

    records, _ = subset
    ops = {r["name"] for r in records if r["kind"] == "op"}
    modules = {r["name"] for r in records if r["kind"] == "module"}
    foreach = [op for op in cmi.foreach_unary_op_db + cmi.foreach_binary_op_db + cmi.foreach_pointwise_op_db
               + cmi.foreach_reduce_op_db + cmi.foreach_other_op_db]
    assert {"_foreach_add", "_foreach_add_", "_foreach_addcdiv_", "_foreach_norm"} <= ops
    assert ops == ({harness.op_full_name(op) for op in cmi.op_db} | {op.name for op in foreach}
                   | {op.name + "_" for op in foreach if op.inplace_variant is not None})
    assert modules == {harness.module_name(info) for info in module_db}
    ran = sum(r["passed"] + r["failed"] for r in records)
    assert ran >= 5000, ran


def test_subset_pass_rate(subset):
    records, _ = subset
    passed, failed, _ = _totals(records)
    rate = passed / (passed + failed)
    worst = sorted((r for r in records if r["failed"]), key=lambda r: -r["failed"])[:15]
    detail = "\n".join(f"{r['name']} {r['dtype']}: {r['failed']} failed, {r['failures'][0][1][:150]}"
                       for r in worst)
    assert rate >= PASS_RATE_TARGET, f"pass rate {rate:.4f} < {PASS_RATE_TARGET}\n{detail}"


@pytest.mark.parametrize("name", harness.CORE_OPS)
def test_core_op_has_no_failures(subset, name):
    records, _ = subset
    mine = [r for r in records if r["kind"] == "op" and r["name"] == name]
    assert mine, f"{name} is not in op_db"
    assert sum(r["passed"] for r in mine) > 0, f"{name}: no sample passed"
    failures = [(r["dtype"], f) for r in mine for f in r["failures"]]
    assert not failures, f"{name}: {failures[:3]}"


def test_every_skip_has_a_reason(subset):
    records, _ = subset
    for r in records:
        assert sum(r["skips"].values()) == r["skipped"], r["name"]
        assert all(reason.strip() for reason in r["skips"]), r["name"]


def test_report_lists_totals_failures_skips_and_fallback(subset):
    records, report = subset
    passed, failed, skipped = _totals(records)
    fp32 = sum(r["failed_fp32"] for r in records)
    assert f"| {passed} | {failed} | {fp32} | {skipped} |" in report
    for heading in ("## Totals", "## Failures", "## Skips", "## CPU fallback", "Command: `python"):
        assert heading in report


# --------------------------------------------------------------------------- PyTorch's own device tests


def _device_test_class():
    """TestCommon over a few ops with instantiate_device_type_tests(only_for="neuron"),
    named so op_db's own skips for TestCommon apply (op_db keys its skips and xfails by test class name)."""
    from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_utils import TestCase

    chosen = [op for op in op_db if op.name in ("add", "mul", "sum", "matmul", "softmax")]

    class TestCommon(TestCase):
        @ops(chosen, allowed_dtypes=(torch.float32,))
        def test_compare_cpu(self, device, dtype, op):
            for sample in op.sample_inputs(device, dtype):
                actual = op(sample.input, *sample.args, **sample.kwargs)
                host = sample.transform(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t)
                expected = op(host.input, *host.args, **host.kwargs)
                self.assertEqual(actual.device.type, "neuron")
                self.assertEqual(actual, expected, exact_device=False)

    scope: dict = {"TestCommon": TestCommon}
    instantiate_device_type_tests(TestCommon, scope, only_for="neuron")
    return scope


def test_instantiate_device_type_tests_for_neuron():
    import unittest

    scope = _device_test_class()
    assert list(scope) == ["TestCommonPRIVATEUSE1"] or list(scope) == ["TestCommonNEURON"], list(scope)
    cls = next(iter(scope.values()))
    assert cls.device_type == "neuron"
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    assert suite.countTestCases() >= 5
    result = unittest.TestResult()
    suite.run(result)
    assert result.wasSuccessful(), (result.failures + result.errors)[:2]
