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
