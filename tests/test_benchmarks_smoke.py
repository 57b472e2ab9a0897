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


def _run_quick(script: str, out: Path, timeout: int):
    """Run benchmarks/<script> --quick --json out; the JSON it wrote. The timeout only guards
    against a hang."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_bench_eager_quick_runs(tmp_path):
    out = tmp_path / "bench.json"
    results_md = ROOT / "benchmarks" / "RESULTS.md"
    before = results_md.read_bytes() if results_md.exists() else None

    payload = _run_quick(SCRIPT.name, out, timeout=300)  # --quick normally takes ~15 s
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
    result = _run_quick("bench_distributed.py", out, timeout=600)["2"]
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
    results = _run_quick("bench_profiler.py", out, timeout=300)
    assert len(results) == 3
    for name, case in results.items():
        for key in ("plain_s", "cpu_s", "device_s", "device_exit_s"):
            assert math.isfinite(case[key]) and case[key] > 0, (name, key)
        for key in ("device_vs_plain", "cpu_vs_plain", "device_vs_cpu"):
            ratio = case[key]
            assert ratio["p25"] <= ratio["median"] <= ratio["p75"] and ratio["median"] > 0, (name, key)


def test_bench_concatenation_quick_runs(tmp_path):
    """Every case checks the queue's results against CPU eager before timing (the script fails
    otherwise) and reports finite ratios; the chain and the SGD step (foreach or not) queue all their arithmetic,
    the MLP forward at batch 1 its layer norm and GELU (its linears end the launches); the small ReLU MLP step queues its ReLUs, their gradients and
    its optimizer's arithmetic; GPT-2's GELU written out and silu(gate) * up queue all their ops (8 and 2);
    each case reports the sequences it launched first and their reuse."""
    results = {r["name"]: r for r in _run_quick("bench_concatenation.py", tmp_path / "c.json", timeout=600)}
    assert set(results) == {"chain20", "sgd_step", "adamw_step", "adamw_step_8k", "mlp_fwd_b1", "relu_mlp_step",
                            "mlp_step", "transformer_step", "gelu_tanh", "silu_gate", "sigmoid_8k", "chain20_bf16",
                            "adamw_foreach", "sgd_foreach", "llama_decode"}
    for name, r in results.items():
        for key in ("off", "sync", "on", "on_off", "on_sync"):
            assert r[key]["p25"] <= r[key]["median"] <= r[key]["p75"] and r[key]["median"] > 0, (name, key)
    assert results["chain20"]["ops"] == 20 and results["sgd_step"]["ops"] == 300
    # foreach=True: each of AdamW's 8 foreach calls (SGD's 3) queues one op per parameter
    assert results["adamw_foreach"]["ops"] == 800 and results["sgd_foreach"]["ops"] == 300
    assert results["chain20_bf16"]["ops"] == 20 and results["gelu_tanh"]["ops"] == 8 and results["silu_gate"]["ops"] == 2 and results["sigmoid_8k"]["ops"] == 1
    # its layer norm and GELU; each linear (one row) ends a launch and is not counted as a queued op
    assert results["llama_decode"]["ops"] > 50  # per layer: two RMSNorms (6 ops each), SiLU gate, residual adds
    assert results["mlp_fwd_b1"]["ops"] == 2 and 0 < results["mlp_fwd_b1"]["hit_rate"] < 1
    # 2 ReLUs, 2 threshold_backward, and for each of the 6 parameters its .grad zeroed
    # (zero_grad(set_to_none=False): zero_), the gradient accumulated into it (add_) and SGD with
    # momentum's 3 ops (the check step made the buffers)
    assert results["relu_mlp_step"]["ops"] == 4 + 6 * (1 + 1 + 3), results["relu_mlp_step"]
    assert results["chain20"]["new_sequences"] >= 1 and 0 < results["chain20"]["hit_rate"] < 1


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


def _profile_compile_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_compile", ROOT / "benchmarks" / "profile_compile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_compile_reads_dots_and_times_the_same_contraction():
    """The profiler's dots, read from StableHLO text, are timed in torch as the same
    contraction XLA computes (batched, contracting either dimension), within float32
    tolerance of jax's dot_general on the same operands."""
    import jax
    import numpy as np
    import torch
    from jax import lax

    profile = _profile_compile_module()
    text = "\n".join([
        "%3 = stablehlo.dot_general %1, %2, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] "
        ": (tensor<64x48xf32>, tensor<64x32xf32>) -> tensor<48x32xf32>",
        "%7 = stablehlo.dot_general %5, %6, batching_dims = [0, 1] x [0, 1], contracting_dims = [2] x [3], "
        "precision = [DEFAULT, DEFAULT] : (tensor<2x3x8x5xbf16>, tensor<2x3x7x8xbf16>) -> tensor<2x3x5x7xbf16>",
    ])
    dots = profile.dots_of(text)
    assert [(d["lhs"], d["rhs"], d["batch"], d["contract"], d["dtype"]) for d in dots] == [
        ((64, 48), (64, 32), ((), ()), ((0,), (0,)), "f32"),
        ((2, 3, 8, 5), (2, 3, 7, 8), ((0, 1), (0, 1)), ((2,), (3,)), "bf16"),
    ]
    for dot in dots:
        got = profile._torch_contraction(dot)().float().numpy()
        g = torch.Generator().manual_seed(0)   # the operands _torch_contraction draws
        lhs, rhs = (torch.randn(dot[k], generator=g).float().numpy() for k in ("lhs", "rhs"))
        if dot["dtype"] == "bf16":   # the operands as rounded to bf16
            lhs, rhs = (torch.from_numpy(v).bfloat16().float().numpy() for v in (lhs, rhs))
        want = np.asarray(lax.dot_general(jax.numpy.asarray(lhs), jax.numpy.asarray(rhs),
                                          (dot["contract"], dot["batch"])))
        tol = 1e-4 if dot["dtype"] == "f32" else 3e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_profile_compile_quick_runs(tmp_path):
    """Both training steps report finite times, their forward and backward graphs, and
    the dots of each graph (the MLP: 3 forward, 5 backward)."""
    out = tmp_path / "profile.json"
    results = _run_quick("profile_compile.py", out, timeout=600)
    assert [r["case"] for r in results] == ["MLP training step", "Transformer block training step"]
    for r in results:
        for key in ("eager_step_s", "compiled_step_s", "optimizer_s", "speedup", "dispatch_s"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["case"], key)
        assert [g["graph"].rsplit("_", 1)[-1] for g in r["graphs"]] == ["forward", "backward"], r["graphs"]
        for g in r["graphs"]:
            for key in ("call_s", "xla_in_step_s", "xla_alone_s"):
                assert math.isfinite(g[key]) and g[key] > 0, (g["graph"], key)
            assert g["dots"] and all(d["xla_s"] >= 0 and d["torch_s"] > 0 for d in g["dots"])
    assert [len(g["dots"]) for g in results[0]["graphs"]] == [3, 5]


def test_bench_fusion_bounds_runs_and_checks_the_compiled_queue_returns_the_chain():
    """bench_fusion_bounds.py runs end to end and prints each measurement (its numbers are
    docs/eager-and-fallback.md's case for running the queue as loops, not as an XLA executable)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fusion_bounds.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for label in ("returning every result", "returning the last result", "20 ops queued"):
        line = next(line for line in proc.stdout.splitlines() if label in line)
        assert float(line.split()[-2]) > 0, line
