#!/usr/bin/env python
"""The cost model on AWS's NKI matrix-multiplication tutorial: estimate vs AWS's published figures.

    python benchmarks/bench_nki_tutorial.py            # prints the section (about 2-3 minutes)
    python benchmarks/bench_nki_tutorial.py --write    # ... and rewrites its section of benchmarks/RESULTS.md
    python benchmarks/bench_nki_tutorial.py --shape 2048 1024 1024   # M K N: a quick run, no comparison

AWS's tutorial ("NKI Matrix Multiplication", aws-neuron-sdk `nki/tutorials/matrix_multiplication.rst`
up to Neuron 2.26) benchmarked four kernels on a `[4096, 8192] @ [8192, 8192]` bfloat16 matmul on
Trn1.32xlarge and published each one's latency and hardware FLOPs utilization (PUBLISHED below). The
kernels are AWS's (nki-samples, `src/nki_samples/tutorials/matrix_multiplication/`): they are not part
of this project. This script exports them from a local mirror of aws-neuron/nki-samples (bring it with
the search tool's `fetch` of github:aws-neuron/nki-samples) at a pinned commit into a temporary folder,
imports them (`import nki` resolves to this simulator), checks each against NumPy at a small shape, and
runs each through `nki.benchmark(kernel, target="trn1")` at the tutorial's shape: trn1 is the hardware
the figures were measured on (its cost-model figures are AWS's NeuronCore-v2 figures,
docs/hardware-figures.md). The trn2 estimate of the same trace is printed for reference. Without the
mirror it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from torch_neuronx import nki  # noqa: E402
from torch_neuronx.nki import cost  # noqa: E402

MIRROR = "/work/.mirror/aws-neuron+nki-samples/repo"   # --mirror: a bare or full clone of aws-neuron/nki-samples
COMMIT = "7af4e4d0210b2baf98cfa2bd033b06fc8ac60355"   # the last change to the tutorial kernels (2025-12-17)
KERNELS_PATH = "src/nki_samples/tutorials/matrix_multiplication/matrix_multiplication_nki_kernels.py"
SHAPE = (4096, 8192, 8192)        # M, K, N: lhsT [K, M], rhs [K, N], as the tutorial's benchmark
CHECK_SHAPE = (2048, 1024, 1024)  # the smallest shape every variant accepts (fully optimized: M % 2048)
TARGET = "trn1"

# AWS's published table (Trn1.32xlarge, [4096, 8192] @ [8192, 8192], bfloat16): kernel -> (latency ms, HFU %).
# Source: aws-neuron/aws-neuron-sdk, nki/tutorials/matrix_multiplication.rst, "Testing Correctness and
# Benchmarking", at commit 61e24fff58af (the last before the NKI docs were rewritten, which dropped the table).
PUBLISHED = {
    "nki_matmul_tiled_": ("Original Tiled", 51.80, 10.98),
    "nki_matmul_hoist_load_": ("Optimization 1 (hoisted loads)", 42.96, 13.24),
    "nki_matmul_block_free_dimension_": ("Optimization 2 (blocked M, N)", 22.07, 26.51),
    "nki_matmul_fully_optimized_": ("Optimization 3 (blocked M, N, K)", 6.97, 85.24),
}
TOLERANCE = 0.30


def _git(*args) -> str:
    return subprocess.run(["git", "--git-dir", MIRROR, *args], check=True, capture_output=True, text=True).stdout


def export_kernels(folder: Path, commit: str):
    """AWS's tutorial kernels from the mirror, as a module; None (and why) when unavailable."""
    if not Path(MIRROR).exists():
        return None, f"no mirror of aws-neuron/nki-samples at {MIRROR} (fetch github:aws-neuron/nki-samples)"
    try:
        source = _git("show", f"{commit}:{KERNELS_PATH}")
    except subprocess.CalledProcessError as error:
        return None, f"the mirror has no {KERNELS_PATH} at {commit}: {error.stderr.strip()}"
    path = folder / "matrix_multiplication_nki_kernels.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("aws_matmul_tutorial", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, None


def _inputs(m, k, n, seed=0):
    import ml_dtypes

    rng = np.random.default_rng(seed)
    return (rng.standard_normal((k, m)).astype(ml_dtypes.bfloat16),
            rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16))


def check(module) -> dict:
    """Each variant against NumPy at CHECK_SHAPE: the largest error relative to the result's scale."""
    lhsT, rhs = _inputs(*CHECK_SHAPE)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    errors = {}
    for name in PUBLISHED:
        out = np.asarray(getattr(module, name)(lhsT, rhs), dtype=np.float32)
        errors[name] = float(np.abs(out - ref).max() / np.abs(ref).max())
    return errors


def run(module, shape=SHAPE) -> list[dict]:
    m, k, n = shape
    lhsT, rhs = _inputs(m, k, n)
    rows = []
    for name, (label, published_ms, published_hfu) in PUBLISHED.items():
        start = time.perf_counter()
        result = nki.benchmark(getattr(module, name), target=TARGET)(lhsT, rhs)
        wall = time.perf_counter() - start
        trn2 = cost.estimate(result.trace, "trn2")
        rows.append({"kernel": name, "label": label, "published_ms": published_ms, "published_hfu": published_hfu,
                     "latency_ms": result.latency_us / 1e3, "utilization": result.utilization,
                     "trn2_latency_ms": trn2.latency_us / 1e3, "trn2_utilization": trn2.utilization,
                     "engines_ms": {e: v / 1e3 for e, v in result.engines.items()},
                     "instructions": len(result.trace), "wall_s": wall})
    return rows


def verdict(rows) -> dict:
    ratios = [r["latency_ms"] / r["published_ms"] for r in rows]
    estimates = [r["latency_ms"] for r in rows]
    published = [r["published_ms"] for r in rows]
    order = sorted(range(len(rows)), key=lambda i: -estimates[i]) == sorted(range(len(rows)), key=lambda i: -published[i])
    return {"order_kept": order, "within": [abs(x - 1) <= TOLERANCE for x in ratios], "ratios": ratios}


def render(rows, errors, command: str, commit: str) -> str:
    v = verdict(rows)
    m, k, n = SHAPE
    lines = [
        "## NKI cost model on AWS's matmul tutorial (`benchmarks/bench_nki_tutorial.py`)",
        "",
        f"Command: `{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Kernels: AWS's "
        f"`{KERNELS_PATH}` from aws-neuron/nki-samples at `{commit[:12]}` (exported at run time, not part of "
        f"the project). Shape: lhsT `[{k}, {m}]` @ rhs `[{k}, {n}]`, bfloat16, as the tutorial's benchmark. "
        "Published: the tutorial's table (Trn1.32xlarge; aws-neuron-sdk `nki/tutorials/matrix_multiplication.rst` "
        "before the Neuron 2.27 docs rewrite). Estimate: `nki.benchmark(kernel, target=\"trn1\")`, the cost model "
        "with AWS's NeuronCore-v2 figures (TensorE 2.8 GHz, 92 BF16 TFLOPS; DMA 16 x 17 bytes/ns), "
        "utilization = TensorE roofline time / estimated latency (AWS's HFU is the same ratio against 92 TFLOPS). "
        "The trn2 column schedules the same instruction trace with trn2's figures, for reference.",
        "",
        "| variant | published (trn1) | estimate (trn1) | estimate / published | published HFU | estimated utilization | trn2 estimate | error vs NumPy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r, ratio, ok in zip(rows, v["ratios"], v["within"]):
        lines.append(f"| {r['label']} | {r['published_ms']:.2f} ms | {r['latency_ms']:.2f} ms | {ratio:.3f}"
                     f"{'' if ok else ' (outside ±30%)'} | {r['published_hfu']:.2f}% | {r['utilization']:.2%} | "
                     f"{r['trn2_latency_ms']:.2f} ms ({r['trn2_utilization']:.1%}) | {errors[r['kernel']]:.1e} |")
    inside = sum(v["within"])
    lines += [
        "",
        f"Order (slowest to fastest) {'kept' if v['order_kept'] else 'NOT kept'}; {inside} of {len(rows)} "
        f"estimates within ±{TOLERANCE:.0%} of the published latency. Fully optimized kernel: estimated "
        f"utilization {rows[-1]['utilization']:.1%} against AWS's published {rows[-1]['published_hfu']:.2f}%. "
        "Error vs NumPy: the largest absolute difference over the largest |reference|, at "
        f"M, K, N = {CHECK_SHAPE} (the fully optimized kernel accumulates its K blocks in bfloat16).",
        "",
        "| variant | instructions | TensorE busy | VectorE busy | DMA busy (trn1) | simulation wall time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e = r["engines_ms"]
        lines.append(f"| {r['label']} | {r['instructions']} | {e['tensor']:.2f} ms | {e['vector']:.2f} ms | "
                     f"{e['dma']:.2f} ms | {r['wall_s']:.0f} s |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    global MIRROR
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace this script's section of RESULTS.md")
    parser.add_argument("--shape", nargs=3, type=int, metavar=("M", "K", "N"),
                        help="another shape: prints the estimates only (no comparison, nothing written)")
    parser.add_argument("--commit", default=None, help="nki-samples commit (default: the pinned one)")
    parser.add_argument("--mirror", default=None, help=f"the nki-samples git directory (default: {MIRROR})")
    parser.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    args = parser.parse_args(argv)
    commit = args.commit or COMMIT
    if args.mirror:
        MIRROR = args.mirror
    with tempfile.TemporaryDirectory() as folder:
        module, why = export_kernels(Path(folder), commit)
        if module is None:
            print(f"skipped: {why}")
            return 0
        if args.shape:
            for r in run(module, tuple(args.shape)):
                print(f"{r['kernel']}: {r['latency_ms']:.3f} ms on {TARGET} ({r['utilization']:.1%}), "
                      f"trn2 {r['trn2_latency_ms']:.3f} ms, {r['instructions']} instructions, {r['wall_s']:.1f} s")
            return 0
        errors = check(module)
        rows = run(module)
    command = "python benchmarks/bench_nki_tutorial.py" + (" --write" if args.write else "")
    sys.path.insert(0, str(HERE))
    from results_file import publish

    publish("nki-tutorial", render(rows, errors, command, commit), write=args.write, json_path=args.json,
            payload={"rows": rows, "errors": errors, "verdict": verdict(rows)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
