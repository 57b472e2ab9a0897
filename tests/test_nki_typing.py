"""`nki.typing` (`nt`) annotations and placeholders, `nl.fp32`, `nl.finfo`: names AWS's kernels use."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
import torch_neuronx.nki.typing as nt


@nki.jit
def scale_into(x, out: nt.mutable_tensor):
    """The older style: the result goes into an argument annotated as mutable, nothing is returned."""
    tile = nl.load(x)
    nl.store(out, nl.add(tile, tile))


@nki.jit
def copy_kernel(x: nt.tensor):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))
    return out


def test_mutable_tensor_annotation_is_accepted_and_the_argument_written_back():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = np.zeros_like(x)
    assert nki.simulate_kernel(scale_into, x, out) is None
    np.testing.assert_array_equal(out, 2 * x)


def test_tensor_placeholder_is_a_zero_filled_argument():
    spec = nt.tensor[[64, 16], nl.bfloat16]
    assert (spec.shape, spec.dtype, spec.mutable) == ((64, 16), nl.bfloat16, False)
    assert nt.mutable_tensor[(8, 8), "float32"].mutable
    out = nki.simulate(copy_kernel)(spec)
    assert out.shape == (64, 16) and out.dtype == nl.bfloat16 and not out.astype(np.float32).any()


def test_benchmark_with_placeholders_as_aws_samples_call_it():
    bench = nki.benchmark(warmup=2, iters=10)(copy_kernel)
    bench(nt.tensor[[128, 512], nl.float32])
    assert bench.benchmark_result.nc_latency.get_latency_percentile(99) > 0


def test_placeholder_dtype_is_checked():
    with pytest.raises(nki.NKIError, match="nt.tensor"):
        nt.tensor[[4, 4], np.float64]


def test_fp32_min_is_the_most_negative_float32():
    assert np.float32(nl.fp32.min).view(np.uint32) == 0xFF7FFFFF

    @nki.jit
    def masked(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        fill = nl.full(x.shape, nl.fp32.min, nl.float32)
        nl.store(out, nl.maximum(fill, nl.load(x)))
        return out

    x = np.full((2, 4), -np.inf, np.float32)
    np.testing.assert_array_equal(nki.simulate(masked)(x), np.full_like(x, nl.fp32.min))


@pytest.mark.parametrize("dtype", [nl.float32, nl.float16, nl.bfloat16, nl.float8_e4m3, nl.float8_e5m2])
def test_finfo(dtype):
    info = nl.finfo(dtype)
    assert info.max == ml_dtypes.finfo(dtype).max and info.min == -info.max and info.bits == dtype.itemsize * 8


@pytest.mark.parametrize("dtype", [nl.int32, nl.tfloat32])
def test_finfo_refuses_types_without_float_limits(dtype):
    with pytest.raises(nki.NKIError, match="nl.finfo"):
        nl.finfo(dtype)


def test_isa_constants_are_accepted_by_dma_copy():
    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x, dge_mode=nisa.dge_mode.hwdge, oob_mode=nisa.oob_mode.skip)
        nisa.dma_copy(dst=out, src=tile)
        return out

    x = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(nki.simulate(copy)(x), x)
    assert nisa.constants.dge_mode is nisa.dge_mode
