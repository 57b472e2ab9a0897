"""NKI cost model: scheduling, DMA model, roofline and the calibration anchors.

Anchors (docs/hardware-figures.md#calibration-points-and-assumptions): a bigger problem is never estimated faster; the optimized matmul is
faster than the naive one and within 2x of the Tensor Engine roofline, the naive one far below it
(calibration: 10.98% vs 85.24% of peak on trn1).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

from nki_examples import EXAMPLES, load_example  # noqa: E402


matmul = load_example("matmul")


def test_roofline_helper():
    flops = 2 * 1024 ** 3
    bf16 = nki.roofline_us(flops, "bfloat16", "trn2")
    # 128 x 128 PEs, one multiply-add per cycle at 2.4 GHz.
    assert bf16 == pytest.approx(flops / (2 * 128 * 128 * 2.4e9) * 1e6)
    assert nki.roofline_us(flops, nl.float32, "trn2") == pytest.approx(4 * bf16)
    assert nki.roofline_us(flops, "float8_e4m3", "trn3") < nki.roofline_us(flops, "float8_e4m3", "trn2") < bf16
    with pytest.raises(nki.NKIError, match="unknown target"):
        nki.roofline_us(flops, "bfloat16", "trn9")


def test_dma_efficiency_curve():
    eff = nki.dma_efficiency
    assert eff(4096) == 1.0 and eff(8192) == 1.0
    assert eff(2048) == pytest.approx(0.9)
    values = [eff(b) for b in (64, 256, 1024, 2048, 3000, 4096)]
    assert values == sorted(values) and values[0] < 0.05


def test_benchmark_result_fields():
    lhsT, rhs = matmul.make_inputs(256, 128, 512)
    result = nki.benchmark(matmul.matmul_naive, target="trn2")(lhsT, rhs)
    assert set(result.engines) == {"tensor", "vector", "scalar", "gpsimd", "dma"}
    assert result.latency_us > 0 and 0 < result.utilization < 1
    assert result.latency_us >= max(result.engines[e] for e in ("tensor", "vector", "scalar", "gpsimd"))
    assert result.flops == 2 * 256 * 128 * 512
    assert result.trace is matmul.matmul_naive.last_trace
    ref = matmul.reference(lhsT, rhs)
    np.testing.assert_allclose(result.outputs.astype(np.float32), ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
    # Tensor Engine busy time is exactly the cycle formula: 2 matmuls of max(min(64,128), 512) cycles.
    assert result.engines["tensor"] == pytest.approx(2 * 512 / 2.4e3)
    with pytest.raises(nki.NKIError, match="unknown target"):
        nki.benchmark(matmul.matmul_naive, target="inf9")


def test_dependencies_and_overlap():
    @nki.jit
    def chain(a):
        x = nl.load(a)
        e = nl.exp(x)  # Scalar Engine: waits for the load
        s = nl.add(e, e)  # Vector Engine: waits for the exp
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, s)
        return out

    result = nki.benchmark(chain)(np.ones((128, 512), np.float32))
    start, end = result.schedule.start_us, result.schedule.end_us
    for i in range(1, 4):
        assert start[i] >= end[i - 1] - 1e-9  # each instruction waits for its producer
    assert result.latency_us == pytest.approx(end[3])

    @nki.jit
    def independent(a, b):
        x = nl.load(a)
        y = nl.load(b)  # a second DMA queue: overlaps the first one's setup
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.exp(x))
        return out, nl.exp(y)

    ind = nki.benchmark(independent)
    with pytest.raises(nki.NKIError):  # returning an SBUF tile is refused even when benchmarking
        ind(np.ones((128, 512), np.float32), np.ones((128, 512), np.float32))


def test_parallel_dma_queues_amortize_setup():
    @nki.jit
    def loads(a, n):
        for i in nl.affine_range(n):
            nl.load(a[nl.ds(0, 128), :])

    one = nki.benchmark(loads)(np.ones((128, 64), np.float32), 1).latency_us
    sixteen = nki.benchmark(loads)(np.ones((128, 64), np.float32), 16).latency_us
    assert one >= 1.3  # the fixed setup
    transfer = one - 1.3
    # 16 queues overlap their setups; the bytes still share the core's DMA bandwidth.
    assert sixteen == pytest.approx(1.3 + 16 * transfer)
    assert sixteen < 16 * one / 2


@pytest.mark.parametrize("kernel_name", ["matmul_naive", "matmul_optimized"])
def test_bigger_problem_never_faster(kernel_name):
    kernel = getattr(matmul, kernel_name)
    sizes = [(128, 128, 512), (256, 128, 512), (256, 256, 512), (256, 256, 1024), (512, 512, 1024)]
    latencies = [nki.benchmark(kernel)(*matmul.make_inputs(*s)).latency_us for s in sizes]
    assert latencies == sorted(latencies), latencies


def test_bigger_elementwise_never_faster():
    add = load_example("tensor_add").tensor_add_kernel
    latencies = [nki.benchmark(add)(np.ones((r, c), np.float32), np.ones((r, c), np.float32)).latency_us
                 for r, c in ((128, 64), (128, 512), (256, 512), (1024, 512), (1024, 2048))]
    assert latencies == sorted(latencies), latencies


def test_optimized_matmul_near_roofline_naive_far_below():
    lhsT, rhs = matmul.make_inputs(1024, 1024, 1024)
    naive = nki.benchmark(matmul.matmul_naive, target="trn2")(lhsT, rhs)
    fast = nki.benchmark(matmul.matmul_optimized, target="trn2")(lhsT, rhs)
    roofline = nki.roofline_us(2 * 1024 ** 3, "bfloat16", "trn2")
    assert fast.latency_us < naive.latency_us
    assert fast.latency_us <= 2 * roofline, (fast.latency_us, roofline)
    assert fast.utilization >= 0.5
    assert naive.utilization <= 0.25, naive.utilization  # calibration point: 10.98%
    assert fast.utilization == pytest.approx(roofline / fast.latency_us)
    np.testing.assert_array_equal(fast.outputs.view(np.uint16), naive.outputs.view(np.uint16))


def test_targets_differ_where_the_hardware_does():
    softmax = load_example("softmax").softmax_kernel
    x = np.random.default_rng(0).standard_normal((512, 2048), dtype=np.float32)
    trn2 = nki.benchmark(softmax, target="trn2")(x)
    trn3 = nki.benchmark(softmax, target="trn3")(x)
    # VectorE runs at 1.2 GHz on trn3 vs 0.96 GHz on trn2, and trn3 DMA is faster.
    assert trn3.engines["vector"] == pytest.approx(trn2.engines["vector"] * 0.96 / 1.2)
    assert trn3.latency_us < trn2.latency_us
    # fp32 matmuls run at a quarter of the bf16 rate.
    lhsT, rhs = matmul.make_inputs(512, 128, 512, dtype=np.float32)
    lo = nki.benchmark(matmul.matmul_naive)(*matmul.make_inputs(512, 128, 512))
    hi = nki.benchmark(matmul.matmul_naive)(lhsT, rhs)
    assert hi.engines["tensor"] == pytest.approx(4 * lo.engines["tensor"])


def test_vector_dependency_overhead():
    @nki.jit
    def kernel(a, dependent):
        x = nl.load(a)
        y = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        z = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(y, x, nl.add, 1.0)
        nisa.tensor_scalar(z, y if dependent else x, nl.add, 1.0)

    a = np.ones((128, 256), np.float32)
    dep = nki.benchmark(kernel)(a, True).engines["vector"]
    indep = nki.benchmark(kernel)(a, False).engines["vector"]
    assert dep - indep == pytest.approx(100 / 0.96e3)


def test_bench_script_quick(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_nki", EXAMPLES.parents[1] / "benchmarks" / "bench_nki.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.run(quick=True)
    assert len(results["simulator"]) == 3
    for r in results["simulator"]:
        assert r["median_s"] > 0 and r["instructions"] > 0 and isinstance(r["passed"], bool)
    by_case = {(r["case"], r["target"]): r for r in results["estimates"]}
    for target in ("trn2", "trn3"):
        assert by_case[("matmul optimized", target)]["latency_us"] < by_case[("matmul naive", target)]["latency_us"]
    assert "| matmul optimized | trn3 |" in bench.render(results, "cmd")


def test_grid_launch_and_platform_target_option():
    add = load_example("tensor_add").tensor_add_kernel

    @nki.jit
    def row_program(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        x = nl.load(a[nl.ds(i * 128, 128), :])
        y = nl.load(b[nl.ds(i * 128, 128), :])
        nl.store(out[nl.ds(i * 128, 128), :], nl.add(x, y))
        return out

    a = b = np.ones((512, 256), np.float32)
    grid = nki.benchmark(row_program[4])(a, b)
    np.testing.assert_array_equal(grid.outputs, 2.0)
    assert len(grid.trace) == 4 * 4
    one = nki.benchmark(row_program[1])(a, b)
    assert grid.latency_us > one.latency_us
    # The same work in one program is costed like the grid (programs run on one core).
    assert nki.benchmark(add)(a, b).latency_us == pytest.approx(grid.latency_us, rel=0.25)

    on_trn3 = nki.jit(row_program.func, platform_target="trn3")
    assert nki.benchmark(on_trn3[4])(a, b).target == "trn3"
    assert nki.benchmark(on_trn3[4], target="trn2")(a, b).target == "trn2"


def test_optimized_matmul_deep_k_groups_dmas():
    # K = 4096: the operand blocks hold all of K, so narrow blocks load several K tiles per DMA
    # (>= 2 KiB per partition) and stay within SBUF.
    lhsT, rhs = matmul.make_inputs(4096, 256, 512)
    naive = nki.benchmark(matmul.matmul_naive)(lhsT, rhs)
    fast = nki.benchmark(matmul.matmul_optimized)(lhsT, rhs)
    ref = matmul.reference(lhsT, rhs)
    err = np.abs(fast.outputs.astype(np.float32) - ref).max() / np.abs(ref).max()
    assert err < 1e-2
    loads = [i for i in fast.trace if i.op == "nisa.dma_copy" and i.buffers[0] == "sbuf"]
    assert loads and min(i.cost[2] for i in loads) >= 2048  # bytes per partition of every load
    assert fast.latency_us < naive.latency_us / 2
    assert matmul.matmul_optimized.last_run.peak_sbuf <= 224 * 1024
