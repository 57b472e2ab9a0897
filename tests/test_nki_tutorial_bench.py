"""The trn1 cost-model target (AWS's NeuronCore-v2 figures) and benchmarks/bench_nki_tutorial.py, which
runs AWS's matmul tutorial kernels (exported from a local nki-samples mirror, never part of the
project) through the cost model and compares them with the tutorial's published trn1 figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki.targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_nki_tutorial", ROOT / "benchmarks" / "bench_nki_tutorial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trn1_figures_are_awss_neuroncore_v2():
    trn1 = TARGETS["trn1"]
    # AWS's Trainium/Inferentia2 guide: TensorE 92 BF16 TFLOPS and 23 FP32 TFLOPS at 2.8 GHz
    assert trn1.tensor_peak_flops("bfloat16") == pytest.approx(92e12, rel=0.003)
    assert trn1.tensor_peak_flops("float32") == pytest.approx(23e12, rel=0.003)
    assert trn1.tensor_peak_flops("float8_e4m3") == trn1.tensor_peak_flops("bfloat16")   # cFP8 at the BF16 rate
    assert trn1.dma_queues * trn1.dma_queue_bytes_per_ns == 272         # AWS's DMA guide: 272 GB/s per core
    assert trn1.sbuf_bytes_per_partition * 128 == 24 * 1024 * 1024      # 24 MiB SBUF
    assert trn1.neuron_core == 2


@nki.jit
def _big_tile(x):
    out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
    big = nl.ndarray((128, 50 * 1024), nl.float32, buffer=nl.sbuf)    # 200 KiB per partition
    nisa.memset(big, 1.0)
    nl.store(out, big[:, 0:4])
    return out


def test_trn1_enforces_its_smaller_sbuf(monkeypatch):
    x = np.zeros((128, 4), np.float32)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    np.testing.assert_array_equal(_big_tile(x), 1.0)                     # fits 224 KiB
    with pytest.raises(nki.NKIError, match=r"SBUF capacity exceeded.*trn1"):
        nki.benchmark(_big_tile, target="trn1")(x)


def test_trn1_costs_a_dma_bound_kernel_slower_and_a_matmul_faster():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 2048)).astype(np.float32)

    @nki.jit
    def copy(src):
        out = nl.ndarray(src.shape, src.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(src.shape[0] // 128):
            t = nl.ndarray((128, src.shape[1]), src.dtype, buffer=nl.sbuf)
            nisa.dma_copy(t, src[nl.ds(i * 128, 128), :])
            nisa.dma_copy(out[nl.ds(i * 128, 128), :], t)
        return out

    t1, t2 = (nki.benchmark(copy, target=t)(a) for t in ("trn1", "trn2"))
    np.testing.assert_array_equal(t1.outputs, a)
    # bytes move at 17 vs 23 bytes/ns per engine (the setup latency is the same)
    assert t1.engines["dma"] == pytest.approx(t2.engines["dma"] * 23 / 17)
    assert t1.latency_us > t2.latency_us
    assert nki.roofline_us(2 * 1024 ** 3, "bfloat16", "trn1") == pytest.approx(
        nki.roofline_us(2 * 1024 ** 3, "bfloat16", "trn2") * 2.4 / 2.8)


def test_tutorial_bench_skips_without_the_mirror(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(bench, "MIRROR", bench.MIRROR)      # main() sets it from --mirror
    assert bench.main(["--mirror", "/nonexistent/nki-samples"]) == 0
    assert "skipped: no mirror of aws-neuron/nki-samples at /nonexistent/nki-samples" in capsys.readouterr().out


def test_tutorial_bench_on_awss_kernels(tmp_path):
    bench = _bench()
    module, why = bench.export_kernels(tmp_path, bench.COMMIT)
    if module is None:
        pytest.skip(why)
    errors = bench.check(module)            # every variant against NumPy at the small shape
    assert set(errors) == set(bench.PUBLISHED)
    for name, err in errors.items():
        assert err < 2e-2, (name, err)       # bf16 outputs (the optimized kernel sums K blocks in bf16)
    rows = bench.run(module, bench.CHECK_SHAPE)
    latencies = [r["latency_ms"] for r in rows]
    assert latencies == sorted(latencies, reverse=True), latencies   # each step is faster, as published
    assert all(0 < r["utilization"] < 1 for r in rows)
    assert all(r["trn2_latency_ms"] > 0 for r in rows)
    v = bench.verdict(rows)
    assert v["order_kept"] and len(v["ratios"]) == 4
    text = bench.render(rows, errors, "cmd", bench.COMMIT)
    assert "| Original Tiled | 51.80 ms |" in text and "85.24%" in text
    # a ratio outside the tolerance is marked
    rows[0] = dict(rows[0], latency_ms=rows[0]["published_ms"] * 1.5)
    assert "1.500 (outside ±30%)" in bench.render(rows, errors, "cmd", bench.COMMIT)
