"""Simulator gaps found by running nki-library's own integration tests in its simulation mode
(scripts/nki_suite/library.py, issue #27), each checked here with small kernels written for this
file against NumPy references.

- `nisa.tensor_partition_reduce(dst, op, data)` (GpSimd Engine): data `[P, f1, ...]` reduced over
  its partitions into dst `[1, f1, ...]`; nki-library's attention backward reduces its sink
  gradients with it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki import NKIError

RNG = np.random.default_rng(2727)


def _partition_reduce_kernel(op, out_dtype=None):
    @nki.jit
    def kernel(x):
        dtype = out_dtype or x.dtype
        out = nl.ndarray((1, *x.shape[1:]), dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        r = nl.ndarray((1, *x.shape[1:]), dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(r, op, t)
        nl.store(out, r)
        return out

    return kernel


@pytest.mark.parametrize("shape", [(128, 32), (128, 32, 4), (7, 3, 5), (64, 2, 3, 2)])
@pytest.mark.parametrize("op, ref", [(nl.add, np.sum), (nl.maximum, np.max)])
def test_tensor_partition_reduce_float32(shape, op, ref):
    x = RNG.standard_normal(shape).astype(np.float32)
    out = _partition_reduce_kernel(op)(x)
    assert out.shape == (1, *shape[1:])
    # float32 sums over up to 128 partitions: NumPy's pairwise order vs the simulator's may differ by rounding
    np.testing.assert_allclose(out[0], ref(x.astype(np.float64), axis=0), rtol=1e-5, atol=1e-5)


def test_tensor_partition_reduce_bfloat16_casts_the_float32_sum():
    x = RNG.standard_normal((128, 16)).astype(ml_dtypes.bfloat16)
    out = _partition_reduce_kernel(nl.add)(x)
    want = x.astype(np.float32).sum(axis=0, dtype=np.float64).astype(np.float32).astype(ml_dtypes.bfloat16)
    assert out.dtype == ml_dtypes.bfloat16
    # one bfloat16 rounding of the float32 sum: at most one ulp (2**-7 relative) from the reference
    np.testing.assert_allclose(out[0].astype(np.float32), want.astype(np.float32), rtol=2 ** -7, atol=1e-2)


def test_tensor_partition_reduce_into_float32_from_bfloat16():
    x = RNG.standard_normal((96, 8)).astype(ml_dtypes.bfloat16)
    out = _partition_reduce_kernel(nl.add, np.float32)(x)
    np.testing.assert_allclose(out[0], x.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-5)


def test_tensor_partition_reduce_rules():
    x = RNG.standard_normal((128, 8)).astype(np.float32)

    @nki.jit
    def wrong_dst(x):
        out = nl.ndarray((2, 8), x.dtype, buffer=nl.shared_hbm)
        r = nl.ndarray((2, 8), x.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(r, nl.add, nl.load(x))
        nl.store(out, r)
        return out

    with pytest.raises(NKIError, match=r"tensor_partition_reduce.*must be one partition"):
        wrong_dst(x)

    with pytest.raises(NKIError, match=r"tensor_partition_reduce.*cannot reduce across partitions"):
        _partition_reduce_kernel(nl.multiply)(x)

    @nki.jit
    def from_psum(x):
        out = nl.ndarray((1, 8), x.dtype, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(p, nl.load(x))
        r = nl.ndarray((1, 8), x.dtype, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(r, nl.add, p)
        nl.store(out, r)
        return out

    with pytest.raises(NKIError, match=r"GpSimd Engine cannot read"):
        from_psum(x)


# ---------------------------------------------------------------------------- tensor_copy_predicated
def _predicated_kernel(scalar=None, reverse=False, src_in_psum=False):
    @nki.jit
    def kernel(old, src, pred):
        out = nl.ndarray(old.shape, old.dtype, buffer=nl.shared_hbm)
        d = nl.load(old)
        p = nl.load(pred)
        if scalar is not None:
            nisa.tensor_copy_predicated(dst=d, src=scalar, predicate=p, reverse_pred=reverse)
        else:
            s = nl.load(src)
            if src_in_psum:
                ps = nl.ndarray(src.shape, src.dtype, buffer=nl.psum)
                nisa.tensor_copy(ps, s)
                s = ps
            nisa.tensor_copy_predicated(dst=d, src=s, predicate=p, reverse_pred=reverse)
        nl.store(out, d)
        return out

    return kernel


@pytest.mark.parametrize("shape, dtype, pred_dtype", [((128, 64), np.float32, np.uint8),
                                                      ((64, 4, 8), ml_dtypes.bfloat16, np.uint32),
                                                      ((32, 2, 3, 4), np.int32, np.uint16)])
@pytest.mark.parametrize("reverse", [False, True])
def test_tensor_copy_predicated_tile(shape, dtype, pred_dtype, reverse):
    old = RNG.standard_normal(shape).astype(dtype)
    src = (RNG.standard_normal(shape) * 10).astype(dtype)
    pred = RNG.integers(0, 3, shape).astype(pred_dtype)  # 0, 1, 2: any nonzero value selects
    out = _predicated_kernel(reverse=reverse)(old, src, pred)
    take = (pred == 0) if reverse else (pred != 0)
    np.testing.assert_array_equal(out, np.where(take, src, old))  # a bit-exact copy where selected
    assert take.any() and (~take).any()


def test_tensor_copy_predicated_scalar_and_psum_src():
    old = RNG.standard_normal((128, 32)).astype(np.float32)
    src = RNG.standard_normal((128, 32)).astype(np.float32)
    pred = RNG.integers(0, 2, (128, 32)).astype(np.uint8)
    out = _predicated_kernel(scalar=-1.5, reverse=True)(old, src, pred)
    np.testing.assert_array_equal(out, np.where(pred == 0, np.float32(-1.5), old))
    out = _predicated_kernel(src_in_psum=True)(old, src, pred)
    np.testing.assert_array_equal(out, np.where(pred != 0, src, old))


def test_tensor_copy_predicated_rules():
    old = np.zeros((128, 8), np.float32)
    src = np.ones((128, 8), np.float32)
    with pytest.raises(NKIError, match=r"tensor_copy_predicated: predicate dtype float32 is not supported"):
        _predicated_kernel()(old, src, np.ones((128, 8), np.float32))
    with pytest.raises(NKIError, match=r"tensor_copy_predicated: src dtype bfloat16 differs from dst dtype float32"):
        _predicated_kernel()(old, src.astype(ml_dtypes.bfloat16), np.ones((128, 8), np.uint8))
    with pytest.raises(NKIError, match=r"tensor_copy_predicated: dst shape \(128, 8\) does not match predicate shape"):
        _predicated_kernel()(old, src, np.ones((128, 4), np.uint8))


# ---------------------------------------------------------------------------- range_select
FP32_MIN = np.finfo(np.float32).min


def _range_select_kernel(op0, op1, range_start):
    @nki.jit
    def kernel(x, lo, hi):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        row_max = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        t, b0, b1 = nl.load(x), nl.load(lo), nl.load(hi)
        d = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        m = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.range_select(d, on_true_tile=t, comp_op0=op0, comp_op1=op1, bound0=b0, bound1=b1,
                          reduce_res=m, reduce_op=nl.maximum, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                          range_start=range_start, on_false_value=FP32_MIN)
        nl.store(out, d)
        nl.store(row_max, m)
        return out, row_max

    return kernel


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op0, op1, np0, np1, start", [
    (nl.greater_equal, nl.less, np.greater_equal, np.less, 0.0),       # a window [lo, hi)
    (nl.greater, nl.less_equal, np.greater, np.less_equal, 100.0),     # (lo, hi] with an offset
    (nl.greater_equal, nl.equal, np.greater_equal, np.equal, 7.0)])
def test_range_select_masks_by_index_and_reduces_the_max(dtype, op0, op1, np0, np1, start):
    P, F = 64, 96
    x = RNG.standard_normal((P, F)).astype(dtype)
    lo = (start + RNG.integers(-5, F, (P, 1))).astype(np.float32)
    hi = (lo + RNG.integers(0, 40, (P, 1))).astype(np.float32)
    hi[3] = lo[3] - 1  # an empty row: all FP32_MIN
    out, row_max = _range_select_kernel(op0, op1, start)(x, lo, hi)
    idx = start + np.arange(F, dtype=np.float32)[None, :]
    keep = np0(idx, lo) & np1(idx, hi)
    want = np.where(keep, x.astype(np.float32), FP32_MIN)
    # the selected values are copied (no arithmetic); FP32_MIN becomes -inf in bfloat16, as AWS documents
    np.testing.assert_array_equal(out.astype(np.float32), want.astype(dtype).astype(np.float32))
    # the max is taken in float32 before the cast into dst: an empty row gives FP32_MIN, not -inf
    np.testing.assert_array_equal(row_max, want.max(axis=1, keepdims=True))
    assert row_max[3, 0] == FP32_MIN


def test_range_select_rules():
    x = np.ones((8, 16), np.float32)
    lo, hi = np.zeros((8, 1), np.float32), np.full((8, 1), 4, np.float32)
    with pytest.raises(NKIError, match=r"range_select.*comp_op0 nl.add is not a comparison"):
        _range_select_kernel(nl.add, nl.less, 0.0)(x, lo, hi)
    with pytest.raises(NKIError, match=r"range_select: bound0 dtype int32 must be float32"):
        _range_select_kernel(nl.greater_equal, nl.less, 0.0)(x, lo.astype(np.int32), hi)
    with pytest.raises(NKIError, match=r"range_select: bound1 shape \(8, 2\) must hold one value per partition"):
        _range_select_kernel(nl.greater_equal, nl.less, 0.0)(x, lo, np.zeros((8, 2), np.float32))


# ---------------------------------------------------------------------------- tensors as truth values
def test_a_tensor_argument_is_true_and_none_is_false():
    @nki.jit
    def maybe_add(x, bias=None):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        if bias:  # nki-library's test for an optional tensor argument
            t = nl.add(t, nl.load(bias))
        nl.store(out, t)
        return out

    x = RNG.standard_normal((16, 8)).astype(np.float32)
    b = RNG.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(maybe_add(x), x)
    np.testing.assert_allclose(maybe_add(x, b), x + b, rtol=1e-6)


# ---------------------------------------------------------------------------- packed MX types on the host
@pytest.mark.parametrize("packed, container", [(nl.float8_e4m3fn_x4, np.uint32), (nl.float4_e2m1fn_x4, np.uint16)])
def test_a_packed_type_is_a_numpy_dtype_for_host_arrays(packed, container):
    # nki-library's tests allocate packed outputs as np.zeros(shape, dtype=nl.float8_e4m3fn_x4)
    out = np.zeros((128, 4), dtype=packed)
    assert out.dtype == container and str(nl.static_cast(out, np.float32).dtype) == "float32"
    assert out.dtype.metadata == {"nki_dtype": str(packed)}

    @nki.jit
    def copy_packed(src, dst):
        t = nl.ndarray(src.shape, src.dtype, buffer=nl.sbuf)
        assert t.dtype is packed  # the kernel sees the packed type, not the container
        nisa.dma_copy(t, src)
        nisa.dma_copy(dst, t)

    values = RNG.uniform(-2, 2, (128, 16)).astype(np.float32)
    src = nl.static_cast(values, packed)
    copy_packed(src, out)  # written in place into the caller's array, bit for bit
    np.testing.assert_array_equal(out, src)
    np.testing.assert_array_equal(nl.static_cast(out, np.float32), nl.static_cast(src, np.float32))


@pytest.mark.parametrize("packed", [nl.float8_e4m3fn_x4, nl.float8_e5m2_x4, nl.float4_e2m1fn_x4])
def test_a_packed_host_dtype_names_its_type(packed):
    # nki-library's torch_ref_wrapper passes arrays whose str(dtype) holds "x4" to its MX references
    # as NumPy arrays (others become torch tensors), and the references find their format in a dict
    # keyed by the nl packed types with the array's dtype.
    out = np.zeros((32, 4), dtype=packed)
    assert packed.name in str(out.dtype) and "x4" in str(out.dtype)
    assert "x4" not in str(np.zeros(2, np.uint32).dtype)
    params = {t: i for i, t in enumerate((nl.float8_e5m2_x4, nl.float8_e4m3fn_x4, nl.float4_e2m1fn_x4))}
    assert out.dtype in params and params[out.dtype] == params[packed]
    assert torch.from_numpy(out).dtype == {np.uint32: torch.uint32, np.uint16: torch.uint16}[packed.storage.type]
    assert nl.static_cast(out.copy(), packed).dtype == out.dtype  # the type survives copies


def _library_plugin():
    """scripts/nki_suite/library_shim/library_plugin.py, without the import hook it installs (the
    stubs of AWS's host modules must not leak into this test session)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "nki_suite" / "library_shim" / "library_plugin.py"
    spec = importlib.util.spec_from_file_location("nki_suite_library_plugin_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, module._StubFinder)]
    return module


def test_the_library_harness_compares_packed_outputs_by_value():
    # As a float32 cast, two float8_x4 containers that differ in their lowest element differ by at
    # most 255, far inside nki-library's tolerance relative to the largest container; AWS's validator
    # unpacks packed outputs first, and so does the harness's wrapper.
    packed = nl.float8_e4m3fn_x4
    values = np.tile(np.float32([1.0, 2.0, 4.0, 8.0]), (8, 4))
    values[:, 3::4] = np.arange(1, 9, dtype=np.float32)[:, None]  # the top elements vary by row
    golden = nl.static_cast(values, packed)
    values[0, 0] = -1.0  # one lowest element wrong
    actual = nl.static_cast(values, packed)
    seen = {}

    def compare(self, actual_outputs, golden_output, rtol):
        seen.update(actual=actual_outputs, golden=golden_output)
        a, g = actual_outputs["out"].astype(np.float32), golden_output["out"].astype(np.float32)
        return np.all(np.abs(a - g) <= rtol * (g.max() - g.min()))

    assert compare(None, {"out": actual}, {"out": golden}, 2e-2)  # the integer containers: a false pass
    wrapped = _library_plugin()._unpacking(compare)
    assert not wrapped(None, {"out": actual, "other": 1.0}, {"out": golden, "other": 1.0}, 2e-2)
    values[0, 0] = 1.0
    np.testing.assert_array_equal(seen["golden"]["out"], values)
    assert seen["actual"]["other"] == 1.0  # outputs of other types pass through unchanged
    assert wrapped(None, {"out": golden.copy()}, {"out": golden}, 0.0)


def test_the_library_harness_reads_packed_outputs_as_bytes():
    # On hardware nki-library reads an output file with its golden's dtype (mxfp_load's golden is the
    # containers viewed as float32); in simulation it converts with np.asarray(out, dtype=golden.dtype)
    packed = nl.float8_e4m3fn_x4
    out = nl.static_cast(RNG.uniform(-2, 2, (4, 16)).astype(np.float32), packed)
    plain = np.ones(3, np.float32)
    simulate = _library_plugin()._packed_as_bytes(lambda **kw: [out, plain])
    got, other = simulate(x=1)
    assert other is plain
    as_float = np.asarray(got, dtype=np.float32)
    np.testing.assert_array_equal(as_float.view(np.uint32), out.view(np.uint32))  # bits, not values
    assert np.asarray(got, dtype=out.dtype).dtype == out.dtype
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), out.astype(np.float64))  # other sizes: values



def test_the_library_harness_provides_starfish_static_cast(monkeypatch):
    # qkv_cte's MX tests import static_cast from AWS's compiler package (neuronxcc.starfish.support
    # .dtype); the harness gives them its neuron_dtypes stand-in under that name.
    import sys
    from pathlib import Path

    shim = Path(__file__).resolve().parent.parent / "scripts" / "nki_suite" / "library_shim"
    monkeypatch.syspath_prepend(str(shim))
    names = ("neuronxcc.starfish", "neuronxcc.starfish.support", "neuronxcc.starfish.support.dtype", "neuron_dtypes")
    before = {name: sys.modules.get(name) for name in names}  # restored after: nothing leaks
    try:
        _library_plugin()._starfish_dtype()
        from neuronxcc.starfish.support.dtype import static_cast

        values = RNG.uniform(-4, 4, (8, 16)).astype(np.float32)
        np.testing.assert_array_equal(static_cast(values, nl.float8_e4m3fn_x4).view(np.uint32),
                                      nl.static_cast(values, nl.float8_e4m3fn_x4).view(np.uint32))
        import neuronxcc.nki.language as ncl  # the stand-in neuronxcc still holds nki

        assert ncl.float8_e4m3fn_x4 is nl.float8_e4m3fn_x4
    finally:
        for name, module in before.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


# ---------------------------------------------------------------------------- empty nl.ds views
def test_an_empty_ds_view_is_allowed_like_an_empty_slice():
    @nki.jit
    def shard(x, start, size):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        part = x[nl.ds(start, size)]
        assert part.shape == (size, x.shape[1]) and x[start:start + size].shape == part.shape
        return out

    x = RNG.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(shard(x, 0, 0), x)
    np.testing.assert_array_equal(shard(x, 4, 0), x)  # at the end, as x[4:4]
    with pytest.raises(NKIError, match=r"nl.ds\(5, 0\) is out of bounds"):
        shard(x, 5, 0)
    with pytest.raises(NKIError, match=r"nl.ds\(2, 3\) is out of bounds"):
        shard(x, 2, 3)


# ---------------------------------------------------------------------------- dma_compute
@pytest.mark.parametrize("n_src, dtype, on_chip_dst", [(2, np.float32, True), (3, ml_dtypes.bfloat16, True),
                                                       (3, np.float32, False)])
def test_dma_compute_adds_its_sources_in_float32(n_src, dtype, on_chip_dst):
    @nki.jit
    def fused_add(*xs):
        out = nl.ndarray(xs[0].shape, xs[0].dtype, buffer=nl.shared_hbm)
        if on_chip_dst:
            t = nl.ndarray(xs[0].shape, xs[0].dtype, buffer=nl.sbuf)
            nisa.dma_compute(dst=t, srcs=list(xs), reduce_op=nl.add)
            nisa.dma_copy(out, t)
        else:  # HBM -> HBM, with explicit unit scales
            nisa.dma_compute(out, tuple(xs), scales=(1.0,) * len(xs), reduce_op=nl.add)
        return out

    xs = [RNG.standard_normal((64, 48)).astype(dtype) for _ in range(n_src)]
    out = fused_add(*xs)
    want = np.sum([x.astype(np.float32) for x in xs], axis=0, dtype=np.float32).astype(dtype)
    # float32 sums, one rounding into dtype: exact against the same recipe
    np.testing.assert_array_equal(out, want)


def test_dma_compute_rules():
    x = np.ones((8, 4), np.float32)

    def kernel_with(**kwargs):
        @nki.jit
        def k(a, b):
            out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
            nisa.dma_compute(out, [a, b], **kwargs)
            return out
        return k

    with pytest.raises(NKIError, match=r"dma_compute.*only nl.add"):
        kernel_with(reduce_op=nl.multiply)(x, x)
    with pytest.raises(NKIError, match=r"dma_compute: scales=\[2.0, 1.0\]: every scale must be 1.0"):
        kernel_with(reduce_op=nl.add, scales=[2.0, 1.0])(x, x)
    with pytest.raises(NKIError, match=r"dma_compute: srcs\[1\] has 16 elements, dst 32"):
        kernel_with(reduce_op=nl.add)(x, np.ones((8, 2), np.float32))


# ---------------------------------------------------------------------------- out-of-bounds .ap() views
def test_an_out_of_bounds_ap_view_is_reported_when_used_not_when_built():
    # nki-library's output_projection_tkg builds a view per group in a loop and uses only those a
    # later guard lets through; building one past the end is not an error, using it is.
    @nki.jit
    def guarded(x, n_groups):
        out = nl.ndarray((n_groups, 128, 16), x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        for g in range(n_groups + 1):
            view = t.ap(pattern=[[64, 128], [4, 16]], offset=g)  # g == 4 reaches element 64: past the row
            assert view.shape == (128, 16)
            if g < n_groups:
                r = nl.ndarray((128, 16), x.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(r, view)
                nl.store(out[g], r)
        return out

    x = RNG.standard_normal((128, 64)).astype(np.float32)
    out = guarded(x, 4)
    for g in range(4):
        np.testing.assert_array_equal(out[g], x[:, g::4])

    @nki.jit
    def used(x):
        t = nl.load(x)
        view = t.ap(pattern=[[64, 128], [4, 16]], offset=4)
        r = nl.ndarray((128, 16), x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(r, view)

    with pytest.raises(NKIError, match=r"nisa.tensor_copy: src is an access pattern that leaves its tensor: "
                                       r"the free pattern \[\[4, 16\]\] from element 4 leaves"):
        used(x)


# ---------------------------------------------------------------------------- a [P] tile indexed as [P, 1]
def test_a_partition_only_tile_takes_a_second_index_as_its_one_column():
    @nki.jit
    def column_then_slice(x, j, n):
        out = nl.ndarray((n, 1), x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        col = t[:, j]                 # [P]: the free axis indexed away
        assert col.shape == (x.shape[0],)
        nl.store(out, col[:n, :1])    # as the [P, 1] tile it occupies
        return out

    x = RNG.standard_normal((128, 6)).astype(np.float32)
    np.testing.assert_array_equal(column_then_slice(x, 4, 100), x[:100, 4:5])

    @nki.jit
    def past_the_column(x):
        nl.load(x)[:, 0][:, 1:2]

    with pytest.raises(NKIError, match="out of bounds"):
        past_the_column(x)
