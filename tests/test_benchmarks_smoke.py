"""Smoke test of the eager benchmarks: the script runs end to end in --quick
mode and reports a usable ratio for every case. Timing is never asserted here
(machines are noisy); benchmarks/RESULTS.md holds the measured numbers."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_eager.py"
CASES = {"add16", "add64x64", "matmul1024", "mlp_step", "transformer_step"}


def test_bench_eager_quick_runs(tmp_path):
    out = tmp_path / "bench.json"
    results_md = ROOT / "benchmarks" / "RESULTS.md"
    before = results_md.read_bytes() if results_md.exists() else None

    # The timeout only guards against a hang; --quick normally takes ~15 s.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    payload = json.loads(out.read_text())
    cases = {case["name"]: case for case in payload["cases"]}
    assert set(cases) == CASES
    for name, case in cases.items():
        for key in ("cpu_s", "neuron_s", "ratio", "ratio_p25", "ratio_p75"):
            value = case[key]
            assert math.isfinite(value) and value > 0, (name, key, value)
        assert case["ratio_p25"] <= case["ratio"] <= case["ratio_p75"], (name, case)
        assert case["target"] > 0
        assert isinstance(case["passed"], bool)
    assert math.isfinite(cases["add16"]["overhead_us"])
    assert payload["machine"]["torch_threads"] >= 1
    # Without --write the checked-in results are left alone.
    after = results_md.read_bytes() if results_md.exists() else None
    assert before == after


def test_bench_distributed_quick_runs(tmp_path):
    """2 ranks, 1 and 4 MiB: both sides report a bandwidth, the all_reduce sums are
    right and DDP on neuron ends with the same parameters as DDP on CPU."""
    out = tmp_path / "dist.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_distributed.py"), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())["2"]
    assert result["correct"]
    assert [case["mib"] for case in result["allreduce"]] == [1, 4]
    for case in result["allreduce"]:
        assert math.isfinite(case["ratio"]) and case["neuron_busbw_gbs"] > 0 and case["cpu_busbw_gbs"] > 0
    assert result["ddp"]["params_match"]
    assert result["ddp"]["neuron_s"] > 0 and result["ddp"]["cpu_s"] > 0


def test_bench_profiler_quick_runs(tmp_path):
    """Every case reports its three timings and finite ratios against the plain run
    measured in the same process; RESULTS.md is left alone."""
    out = tmp_path / "profiler.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_profiler.py"), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == 3
    for name, case in results.items():
        for key in ("plain_s", "cpu_s", "device_s", "device_exit_s"):
            assert math.isfinite(case[key]) and case[key] > 0, (name, key)
        for key in ("device_vs_plain", "cpu_vs_plain", "device_vs_cpu"):
            ratio = case[key]
            assert ratio["p25"] <= ratio["median"] <= ratio["p75"] and ratio["median"] > 0, (name, key)


def test_results_sections_are_replaced_not_appended(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_file import write_section

    path = tmp_path / "RESULTS.md"
    write_section("a", "## A\nold", path)
    write_section("b", "## B\nkept", path)
    write_section("a", "## A\nnew", path)
    text = path.read_text()
    assert "new" in text and "old" not in text and "kept" in text
    assert text.index("## A") < text.index("## B")
