"""The entry points AWS's tests call: nki.simulate_kernel, nki.simulate, nki.cpu_simulate (nki-library),
nki.baremetal, nki.benchmark in its decorator form, nki.profile. On the emulator every one of them
simulates the kernel; timings come from the cost model (docs/nki.md, "Running kernels")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.language as nl

ROWS = 32  # rows per program


def add_rows(a, b):
    """Program i adds rows [i*ROWS, (i+1)*ROWS): a grid of len(a) // ROWS programs adds a and b."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    rows = nl.ds(nl.program_id(0) * ROWS, ROWS)
    nl.store(out[rows, :], nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
    return out


add_kernel = nki.jit(add_rows)


@pytest.fixture
def ab():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2 * ROWS, 16), dtype=np.float32), rng.standard_normal((2 * ROWS, 16), dtype=np.float32)


def test_simulate_kernel_with_a_grid(ab):
    a, b = ab
    np.testing.assert_array_equal(nki.simulate_kernel(add_kernel[2], a, b), a + b)


def test_simulate(ab):
    a, b = ab
    np.testing.assert_array_equal(nki.simulate(add_kernel[2])(a, b), a + b)
    out = nki.simulate(add_rows)(a[:ROWS], b[:ROWS])  # a plain function is wrapped as nki.jit would
    np.testing.assert_array_equal(out, a[:ROWS] + b[:ROWS])


@pytest.mark.parametrize("kernel", [add_kernel, add_rows], ids=["jit", "plain function"])
def test_cpu_simulate_indexed_by_lnc_with_keyword_inputs(ab, kernel):
    a, b = ab
    np.testing.assert_array_equal(nki.cpu_simulate(kernel)[2](a=a, b=b), a + b)


def test_baremetal_decorator_with_options_and_grid(ab):
    a, b = ab

    @nki.baremetal(save_neff_name="file.neff", save_trace_name="profile.ntff", additional_compile_opt="-O1")
    def kernel(x, y):
        return add_rows(x, y)

    np.testing.assert_array_equal(kernel[2](a, b), a + b)
    np.testing.assert_array_equal(nki.baremetal(add_kernel)[2](a, b), a + b)


def test_benchmark_decorator_form_sets_benchmark_result(ab):
    a, b = ab
    bench = nki.benchmark(warmup=5, iters=10)(add_kernel)
    result = bench[2](a, b)  # AWS's tests read the result off the decorated kernel, not off the call
    latency = bench.benchmark_result.nc_latency
    assert bench.benchmark_result is result and result.latency_us > 0
    assert latency.get_latency_percentile(50) == latency.get_latency_percentile(99) == result.latency_us
    np.testing.assert_array_equal(result.outputs, a + b)
    with pytest.raises(ValueError, match="percentile"):
        latency.get_latency_percentile(101)

    launched = bench[2]  # the other spelling: keep the indexed kernel and read its result
    launched(a, b)
    assert launched.benchmark_result.latency_us == result.latency_us


def test_benchmark_decorator_on_a_plain_function(ab):
    a, b = ab

    @nki.benchmark(warmup=1, iters=2, save_neff_name="file.neff")
    def kernel(x, y):
        return add_rows(x, y)

    kernel(a[:ROWS], b[:ROWS])
    assert kernel.benchmark_result.nc_latency.get_latency_percentile(99) > 0


def test_benchmark_functional_form_still_returns_the_result(ab):
    a, b = ab
    result = nki.benchmark(add_kernel[2], target="trn3")(a, b)
    assert result.target == "trn3" and result.latency_us > 0


def test_profile_writes_the_trace_as_json(ab, tmp_path):
    a, b = ab
    kernel = nki.profile(working_directory=str(tmp_path), save_neff_name="file.neff",
                         save_trace_name="profile.ntff", profile_nth=2)(add_kernel)
    np.testing.assert_array_equal(kernel[2](a, b), a + b)
    record = json.loads((tmp_path / "profile.json").read_text())
    assert record["kernel"] == "add_rows" and record["latency_us"] > 0
    assert {ins["op"] for ins in record["instructions"]} >= {"nisa.dma_copy"}
    with pytest.raises(FileExistsError, match="overwrite=True"):
        kernel[2](a, b)
    nki.profile(working_directory=str(tmp_path), overwrite=True)(add_kernel)[2](a, b)


def test_profile_without_a_directory_just_runs(ab):
    a, b = ab
    np.testing.assert_array_equal(nki.profile(add_kernel)[2](a, b), a + b)
