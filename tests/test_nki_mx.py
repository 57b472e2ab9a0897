"""MX (microscaling) on NeuronCore-v4: the packed types (nl.float8_e4m3fn_x4, float8_e5m2_x4,
float4_e2m1fn_x4), reinterpreting views, nisa.quantize_mx and nisa.nc_matmul_mx.

Kernels are this project's own. References are NumPy, written from the OCP MX spec (a shared E8M0
scale per 32-element block) with the block scale AWS documents for quantize_mx (twice the OCP
sample algorithm's): element bits and scale bytes compared exactly; matmuls against the float64
matmul of the dequantized matrices (rtol 1e-5: products of MX values are exact in float32, only the
float32 summation order differs)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(27)
# element type, largest exponent, largest finite, mantissa bits, smallest normal exponent
ELEMENTS = {
    "float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8, 448.0, 3, -6),
    "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 15, 57344.0, 2, -14),
    "float4_e2m1fn_x4": (ml_dtypes.float4_e2m1fn, 2, 6.0, 1, 0),
}


# ---------------------------------------------------------------------------- NumPy reference
def ref_quantize(x, x4, aws_scale=True):
    """OCP MX quantization of x [P, F4] in blocks of 8 rows x 4 columns: (element values [P, F4] as
    float32, scale bytes [P // 8, F4 // 4]). OCP: X = 2 ** (floor(log2(amax)) - emax); AWS's
    quantize_mx uses 2 X (aws_scale). Elements: x / X, clamped to the largest finite, rounded to
    nearest even."""
    element, emax, vmax, _, _ = ELEMENTS[str(x4)]
    p, f4 = x.shape
    x = x.astype(np.float64)
    amax = np.abs(x.reshape(p // 8, 8, f4 // 4, 4)).max(axis=(1, 3))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(amax > 0, amax, 1.0)))
    byte = np.clip(e - emax + (1 if aws_scale else 0) + 127, 0, 254)
    byte = np.where(amax > 0, byte, 0).astype(np.uint8)
    scale = np.repeat(np.repeat(2.0 ** (byte.astype(np.float64) - 127), 8, axis=0), 4, axis=1)
    q = np.clip(x / scale, -vmax, vmax).astype(np.float32).astype(element).astype(np.float32)
    return q, byte


def ref_pack(values, x4):
    """Element values [P, 4F] -> packed containers [P, F]: element j of a container in its j-th
    byte (float8, uint32) or nibble (float4, uint16), lowest first."""
    element = ELEMENTS[str(x4)][0]
    codes = np.asarray(values, np.float32).astype(element).view(np.uint8)
    if str(x4).startswith("float8"):
        return np.ascontiguousarray(codes).view("<u4")
    nib = codes.reshape(codes.shape[0], -1, 4).astype(np.uint16) & 0xF
    return (nib[..., 0] | nib[..., 1] << 4 | nib[..., 2] << 8 | nib[..., 3] << 12).astype(np.uint16)


def ref_unpack(packed, x4):
    element = ELEMENTS[str(x4)][0]
    if str(x4).startswith("float8"):
        return np.ascontiguousarray(packed).view(np.uint8).view(element).astype(np.float32)
    p = packed.astype(np.uint16)
    nibs = np.stack([(p >> (4 * j)) & 0xF for j in range(4)], axis=-1).astype(np.uint8)
    return nibs.reshape(p.shape[0], -1).view(element).astype(np.float32)


def hw_rows(k):
    """Scale partitions of data partition groups 0..k//8-1: 4 rows per 32-partition quadrant."""
    return np.array([32 * (g // 4) + g % 4 for g in range(k // 8)])


def random_mx(k, f, x4, scale_lo=118, scale_hi=130):
    """Random MX data in the interleaved SBUF layout: (logical matrix [4K, F] float64, packed
    containers [K, F], dense scales [K // 8, F] uint8). Element (k, f, j) is logical row j*K + k."""
    element, _, vmax, _, _ = ELEMENTS[str(x4)]
    values = (RNG.uniform(-vmax, vmax, (k, 4 * f)).astype(np.float32).astype(element).astype(np.float32))
    scales = RNG.integers(scale_lo, scale_hi, (k // 8, f)).astype(np.uint8)
    factors = np.repeat(np.repeat(2.0 ** (scales.astype(np.float64) - 127), 8, axis=0), 4, axis=1)
    deq = values.astype(np.float64) * factors  # [K, 4F], column 4 f + j
    logical = deq.reshape(k, f, 4).transpose(2, 0, 1).reshape(4 * k, f)
    return logical, ref_pack(values, x4), scales


# ---------------------------------------------------------------------------- kernels
def load_scales(scale_hbm, k, f):
    """Dense [K // 8, F] uint8 scales from HBM into the quadrant layout nc_matmul_mx reads."""
    s = nl.ndarray((k if k > 32 else k // 8, f), nl.uint8, buffer=nl.sbuf)
    nisa.memset(s, 0)
    for q in range(max(1, k // 32)):
        n = min(4, k // 8 - 4 * q)
        nisa.dma_copy(dst=s[32 * q:32 * q + n, :], src=scale_hbm[4 * q:4 * q + n, :])
    return s


@nki.jit(platform_target="trn3")
def quantize_kernel(x, x4):
    """x [P, 4F] -> (packed data [P, F] as its containers' integers, scales [P or P // 8, F])."""
    p, f4 = x.shape
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    d = nl.ndarray((p, f4 // 4), x4, buffer=nl.sbuf)
    s = nl.ndarray((p if p > 32 else p // 8, f4 // 4), nl.uint8, buffer=nl.sbuf)
    nisa.memset(s, 0)
    nisa.quantize_mx(dst=d, src=t, dst_scale=s)
    out_d = nl.ndarray((p, f4 // 4), x4, buffer=nl.shared_hbm)
    out_s = nl.ndarray(s.shape, nl.uint8, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_d, src=d)
    nisa.dma_copy(dst=out_s, src=s)
    return out_d, out_s


@nki.jit(platform_target="trn3")
def matmul_kernel(st_data, st_scale, mv_data, mv_scale, st_x4, mv_x4, out_dtype):
    """Packed HBM data (uint32 / uint16 containers) viewed as the MX types, one nc_matmul_mx."""
    k, m = st_data.shape
    n = mv_data.shape[1]
    st = nl.ndarray((k, m), st_x4, buffer=nl.sbuf)
    mv = nl.ndarray((k, n), mv_x4, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=st_data.ap([[m, k], [1, m]], dtype=st_x4))
    nisa.dma_copy(dst=mv, src=mv_data.view(mv_x4))
    acc = nl.ndarray((m, n), out_dtype, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=load_scales(st_scale, k, m),
                      moving_scale=load_scales(mv_scale, k, n))
    res = nl.ndarray((m, n), nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


# ---------------------------------------------------------------------------- packed types
def test_packed_types_are_named_and_sized_as_aws_documents():
    assert str(nl.float4_e2m1fn_x4) == "float4_e2m1fn_x4" and repr(nl.float8_e5m2_x4) == "nl.float8_e5m2_x4"
    assert nl.float8_e4m3fn_x4.itemsize == 4 and nl.float8_e5m2_x4.itemsize == 4  # 4 x 8 bits
    assert nl.float4_e2m1fn_x4.itemsize == 2  # 4 x 4 bits
    assert nl.float8_e8m0fnu == np.dtype(ml_dtypes.float8_e8m0fnu)
    import nki.language as aws_nl
    assert aws_nl.float4_e2m1fn_x4 is nl.float4_e2m1fn_x4


@pytest.mark.parametrize("x4", [nl.float8_e4m3fn_x4, nl.float8_e5m2_x4, nl.float4_e2m1fn_x4])
def test_pack_and_unpack_agree_with_the_reference_layout(x4):
    vmax = ELEMENTS[str(x4)][2]
    values = RNG.uniform(-vmax, vmax, (8, 32)).astype(np.float32).astype(ELEMENTS[str(x4)][0]).astype(np.float32)
    packed = x4.pack(values)
    np.testing.assert_array_equal(packed, ref_pack(values, x4))
    np.testing.assert_array_equal(x4.unpack(packed), values)


def test_packed_tiles_count_their_container_bytes_for_capacity():
    @nki.jit(platform_target="trn3")
    def k(x4, f):
        t = nl.ndarray((128, f), x4, buffer=nl.sbuf)
        nisa.memset(t, 0.0)

    k(nl.float8_e4m3fn_x4, 512)
    assert k.last_run.peak_sbuf == 512 * 4  # 2 KiB per partition: 2048 fp8 values
    k(nl.float4_e2m1fn_x4, 512)
    assert k.last_run.peak_sbuf == 512 * 2
    k(nl.uint8, 65536)  # 64 KiB per partition fits trn3's 256 KiB ...
    with pytest.raises(nki.NKIError, match="SBUF"):
        k(nl.float8_e4m3fn_x4, 65536 + 1)  # ... as uint8, but not as 4-byte containers


def test_memset_fills_every_packed_element_and_hbm_returns_containers():
    @nki.jit(platform_target="trn3")
    def k():
        t = nl.ndarray((32, 8), nl.float4_e2m1fn_x4, buffer=nl.sbuf)
        nisa.memset(t, 1.5)
        out = nl.ndarray((32, 8), nl.float4_e2m1fn_x4, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    out = k()
    assert out.dtype == np.uint16 and out.shape == (32, 8)
    np.testing.assert_array_equal(ref_unpack(out, nl.float4_e2m1fn_x4), np.full((32, 32), 1.5, np.float32))


def test_view_reinterprets_bytes_and_scales_the_last_axis():
    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, nl.uint8, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        v = t.view(nl.float8_e5m2_x4)
        assert v.shape == (a.shape[0], a.shape[1] // 4) and v.dtype is nl.float8_e5m2_x4
        w = nl.ndarray(v.shape, nl.float8_e5m2_x4, buffer=nl.sbuf)
        nisa.tensor_copy(dst=w, src=v)
        out = nl.ndarray(v.shape, nl.uint32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out.view(nl.float8_e5m2_x4), src=w)
        return out

    a = RNG.integers(0, 256, (64, 48)).astype(np.uint8)
    np.testing.assert_array_equal(k(a), a.view("<u4"))


# ---------------------------------------------------------------------------- quantize_mx
@pytest.mark.parametrize("p,f4,src_dtype,x4", [
    (32, 64, ml_dtypes.bfloat16, nl.float8_e4m3fn_x4),
    (64, 128, np.float16, nl.float8_e5m2_x4),
    (128, 32, ml_dtypes.bfloat16, nl.float8_e5m2_x4),
    (96, 16, np.float16, nl.float8_e4m3fn_x4),
])
def test_quantize_mx_matches_the_ocp_reference_with_aws_block_scale(p, f4, src_dtype, x4):
    # Blocks of very different magnitudes: each gets its own scale.
    x = RNG.standard_normal((p, f4)) * 2.0 ** RNG.integers(-20, 12, (p // 8, 1)).repeat(8, axis=0)
    x[:8, :4] = 0.0  # an all-zero block
    x = x.astype(src_dtype)
    data, scales = quantize_kernel(x, x4)
    q_ref, byte_ref = ref_quantize(x.astype(np.float32), x4)
    np.testing.assert_array_equal(scales[hw_rows(p)], byte_ref)  # exact scale bytes, quadrant layout
    np.testing.assert_array_equal(ref_unpack(data, x4), q_ref)  # exact element bits
    if p > 32:  # rows 4..31 of each quadrant are not written (the kernel zeroed them)
        others = np.setdiff1d(np.arange(p), hw_rows(p))
        assert not scales[others].any()
    # Round trip: dequantized values are within half an element ulp (plus the subnormal step) of x.
    _, _, _, mbits, emin = ELEMENTS[str(x4)]
    factor = np.repeat(np.repeat(2.0 ** (scales[hw_rows(p)].astype(np.float64) - 127), 8, 0), 4, 1)
    deq = ref_unpack(data, x4) * factor
    x64 = x.astype(np.float64)
    bound = np.abs(x64) * 2.0 ** -(mbits + 1) + factor * 2.0 ** (emin - mbits - 1)
    assert np.all(np.abs(deq - x64) <= bound * (1 + 1e-9))


def test_quantize_mx_scale_is_twice_the_ocp_sample_scale():
    """A block whose largest magnitude is E4M3's largest finite (448): OCP's sample algorithm gives
    scale 2**0 (byte 127); AWS's documented quantize_mx scale is two times larger (byte 128), so 448
    becomes 224 and no value saturates."""
    x = np.zeros((32, 8), np.float32)
    x[:8, :4] = 1.0
    x[3, 2] = 448.0
    x[8:16, 4:8] = -3.0  # amax 3: floor(log2 3) = 1 -> 2 ** (1 - 8 + 1)
    data, scales = quantize_kernel(x.astype(ml_dtypes.bfloat16), nl.float8_e4m3fn_x4)
    assert scales[0, 0] == 128 and scales[1, 1] == 127 - 6
    vals = ref_unpack(data, nl.float8_e4m3fn_x4)
    assert vals[3, 2] == 224.0 and vals[0, 0] == 0.5
    assert np.all(vals[8:16, 4:8] == -3.0 * 2.0 ** 6)
    _, byte_ocp = ref_quantize(x, nl.float8_e4m3fn_x4, aws_scale=False)
    assert byte_ocp[0, 0] == 127  # the reference's OCP variant, for contrast


@pytest.mark.parametrize("p,f4,x4", [(32, 64, nl.float8_e4m3fn_x4), (128, 32, nl.float8_e5m2_x4)])
def test_quantize_mx_ocp_scale_of_nki_0_4(monkeypatch, p, f4, x4):
    """TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE=ocp: NKI 0.4.0's quantize_mx, the OCP sample algorithm's
    scale (one less byte than the default's, elements twice as large), bits and bytes exact."""
    monkeypatch.setenv("TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE", "OCP")
    x = RNG.standard_normal((p, f4)) * 2.0 ** RNG.integers(-20, 12, (p // 8, 1)).repeat(8, axis=0)
    x = x.astype(ml_dtypes.bfloat16)
    data, scales = quantize_kernel(x, x4)
    q_ref, byte_ref = ref_quantize(x.astype(np.float32), x4, aws_scale=False)
    np.testing.assert_array_equal(scales[hw_rows(p)], byte_ref)
    np.testing.assert_array_equal(ref_unpack(data, x4), q_ref)
    monkeypatch.setenv("TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE", "double")  # read at each call
    _, scales_double = quantize_kernel(x, x4)
    np.testing.assert_array_equal(scales_double[hw_rows(p)], byte_ref + 1)


def test_quantize_mx_ocp_scale_saturates_the_largest_finite(monkeypatch):
    """Under the OCP scale a block whose amax is E4M3's largest finite keeps 448 (byte 127), and a
    value that rounds past it clamps to 448, where the default scale halves it."""
    monkeypatch.setenv("TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE", "ocp")
    x = np.zeros((32, 8), np.float32)
    x[3, 2] = 448.0
    x[4, 1] = 1.0
    x[8:16, 4:8] = 479.0  # floor(log2) 8 -> byte 127; 479 rounds to 480 > 448: clamped to 448
    data, scales = quantize_kernel(x.astype(ml_dtypes.bfloat16), nl.float8_e4m3fn_x4)
    vals = ref_unpack(data, nl.float8_e4m3fn_x4)
    assert scales[0, 0] == 127 and scales[1, 1] == 127
    assert vals[3, 2] == 448.0 and vals[4, 1] == 1.0 and np.all(vals[8:16, 4:8] == 448.0)


def test_quantize_mx_scale_variable_rejects_other_values(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE", "half")
    with pytest.raises(nki.NKIError, match="TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE.*Fix: set"):
        quantize_kernel(np.ones((32, 8), ml_dtypes.bfloat16), nl.float8_e4m3fn_x4)


# ---------------------------------------------------------------------------- nc_matmul_mx
@pytest.mark.parametrize("k,m,n,st_x4,mv_x4", [
    (128, 128, 512, nl.float8_e4m3fn_x4, nl.float8_e4m3fn_x4),
    (32, 16, 64, nl.float8_e5m2_x4, nl.float8_e5m2_x4),
    (64, 128, 96, nl.float4_e2m1fn_x4, nl.float4_e2m1fn_x4),
    (96, 40, 200, nl.float4_e2m1fn_x4, nl.float8_e5m2_x4),  # MXFP4 x MXFP8
])
def test_nc_matmul_mx_equals_the_dequantized_matmul(k, m, n, st_x4, mv_x4):
    x, st_data, st_scale = random_mx(k, m, st_x4)
    y, mv_data, mv_scale = random_mx(k, n, mv_x4)
    out = matmul_kernel(st_data, st_scale, mv_data, mv_scale, st_x4, mv_x4, nl.float32)
    ref = x.T @ y  # [M, N], contraction over the 4K logical rows
    # float32 summation of exact products: error within 1e-5 of the sum of magnitudes
    assert np.all(np.abs(out - ref) <= 1e-5 * (np.abs(x).T @ np.abs(y)))
    assert np.abs(ref).max() > 0


def test_nc_matmul_mx_bfloat16_psum_and_accumulation():
    """Two K tiles accumulate into one PSUM tile (accumulate=None: the first write overwrites);
    a bfloat16 destination holds the float32 sum rounded to bfloat16."""
    k, m, n = 64, 32, 128
    x1, s1, ss1 = random_mx(k, m, nl.float8_e4m3fn_x4)
    y1, m1, ms1 = random_mx(k, n, nl.float8_e4m3fn_x4)
    x2, s2, ss2 = random_mx(k, m, nl.float8_e4m3fn_x4)
    y2, m2, ms2 = random_mx(k, n, nl.float8_e4m3fn_x4)

    @nki.jit(platform_target="trn3")
    def kern(s1, ss1, m1, ms1, s2, ss2, m2, ms2, out_dtype):
        acc = nl.ndarray((m, n), out_dtype, buffer=nl.psum)
        nisa.memset(acc, 7.0)  # overwritten by the first matmul
        for i, (sd, ssc, md, msc) in enumerate([(s1, ss1, m1, ms1), (s2, ss2, m2, ms2)]):
            st = nl.ndarray((k, m), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
            mv = nl.ndarray((k, n), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
            nisa.dma_copy(dst=st, src=sd.view(nl.float8_e4m3fn_x4))
            nisa.dma_copy(dst=mv, src=md.view(nl.float8_e4m3fn_x4))
            nisa.nc_matmul_mx(acc, st, mv, load_scales(ssc, k, m), load_scales(msc, k, n),
                              accumulate=None if i == 0 else True)
        res = nl.ndarray((m, n), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    operands = (s1, ss1, m1, ms1, s2, ss2, m2, ms2)
    ref = x1.T @ y1 + x2.T @ y2
    np.testing.assert_allclose(kern(*operands, nl.float32), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    bf = kern(*operands, nl.bfloat16)
    np.testing.assert_allclose(bf, ref, rtol=2 ** -7, atol=1e-3 * np.abs(ref).max())
    assert np.array_equal(bf, bf.astype(ml_dtypes.bfloat16).astype(np.float32))  # bfloat16 values


def test_quantize_then_matmul_approximates_the_float_matmul():
    """The tutorial's pipeline: interleave, quantize both operands on the device, nc_matmul_mx."""
    K4, m, n = 512, 128, 256
    a = RNG.standard_normal((K4, m)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((K4, n)).astype(ml_dtypes.bfloat16)

    @nki.jit(platform_target="trn3")
    def kern(a, b):
        k = a.shape[0] // 4
        qs = []
        for src in (a, b):
            f = src.shape[1]
            t = nl.ndarray((k, f, 4), src.dtype, buffer=nl.sbuf)  # row j*k + p of src -> [p, :, j]
            nisa.dma_copy(dst=t, src=src.reshape((4, k, f)).ap([[f, k], [1, f], [k * f, 4]]))
            d = nl.ndarray((k, f), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
            s = nl.ndarray((k, f), nl.uint8, buffer=nl.sbuf)
            nisa.quantize_mx(dst=d, src=t.reshape((k, 4 * f)), dst_scale=s)
            qs.append((d, s))
        acc = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=qs[0][0], moving=qs[1][0], stationary_scale=qs[0][1],
                          moving_scale=qs[1][1])
        res = nl.ndarray(acc.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        out = nl.ndarray(acc.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out

    out = kern(a, b)
    # The reference pipeline: the same interleaving, ref_quantize, the dequantized float64 matmul.
    deq = []
    for src in (a, b):
        f = src.shape[1]
        inter = src.astype(np.float32).reshape(4, K4 // 4, f).transpose(1, 2, 0).reshape(K4 // 4, 4 * f)
        q, byte = ref_quantize(inter, nl.float8_e4m3fn_x4)
        d = q * np.repeat(np.repeat(2.0 ** (byte.astype(np.float64) - 127), 8, 0), 4, 1)
        deq.append(d.reshape(K4 // 4, f, 4).transpose(2, 0, 1).reshape(K4, f))  # back to [4K, F] rows
    ref_q = deq[0].T @ deq[1]
    assert np.all(np.abs(out - ref_q) <= 1e-5 * (np.abs(deq[0]).T @ np.abs(deq[1])))
    # Against the unquantized product: E4M3's 3 mantissa bits (~2**-5 RMS relative error per
    # element) give a few percent, and it is not the float product.
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert 1e-3 < err < 0.06, err


def test_mx_matmul_is_costed_at_four_times_the_bf16_rate():
    k, m, n = 128, 128, 512
    _, sd, ss = random_mx(k, m, nl.float8_e4m3fn_x4)
    _, md, ms = random_mx(k, n, nl.float8_e4m3fn_x4)
    res = nki.benchmark(matmul_kernel, target="trn3")(sd, ss, md, ms, nl.float8_e4m3fn_x4,
                                                       nl.float8_e4m3fn_x4, nl.float32)
    mm = [i for i in res.trace if i.op == "nisa.nc_matmul_mx"]
    assert len(mm) == 1 and mm[0].flops == 2 * 512 * 128 * 512
    assert res.roofline_us == pytest.approx(2 * 512 * 128 * 512 / (4 * 2 * 128 * 128 * 2.4e9) * 1e6)


# ---------------------------------------------------------------------------- hardware rules
def _qmx(shape=(32, 16), src_dtype=nl.bfloat16, x4=nl.float8_e4m3fn_x4, scale_shape=None,
         scale_dtype=nl.uint8, src_buffer=nl.sbuf, target="trn3"):
    @nki.jit(platform_target=target)
    def k():
        p, f4 = shape
        src = nl.ndarray(shape, src_dtype, buffer=src_buffer)
        nisa.memset(src, 1.0)
        d = nl.ndarray((p, f4 // 4), x4, buffer=nl.sbuf)
        s = nl.ndarray(scale_shape or (p if p > 32 else p // 8, f4 // 4), scale_dtype, buffer=nl.sbuf)
        nisa.quantize_mx(dst=d, src=src, dst_scale=s)
    k()


def test_quantize_mx_accepts_float8_e8m0fnu_scales():
    _qmx(scale_dtype=nl.float8_e8m0fnu)


@pytest.mark.parametrize("kwargs,match", [
    (dict(target="trn2"), "NeuronCore-v4.*trn2"),
    (dict(x4=nl.float4_e2m1fn_x4), "MXFP8 only"),
    (dict(src_dtype=nl.float32), "float16 or bfloat16"),
    (dict(shape=(16, 16)), "16 partitions.*multiple of 32"),
    (dict(shape=(48, 16)), "48 partitions"),
    (dict(shape=(32, 18)), "not a multiple of 4"),
    (dict(shape=(64, 16), scale_shape=(8, 4)), "partitions 0..3, 32..35"),
    (dict(scale_dtype=nl.int32), "uint8 or float8_e8m0fnu"),
    (dict(src_buffer=nl.psum), "src is in nl.psum; it must be in nl.sbuf"),
])
def test_quantize_mx_rules(kwargs, match):
    with pytest.raises(nki.NKIError, match=match):
        _qmx(**kwargs)


def _mm(k=32, m=16, n=64, st_dtype=nl.float8_e4m3fn_x4, dst_dtype=nl.float32, target="trn3", **kw):
    @nki.jit(platform_target=target)
    def kern():
        st = nl.ndarray((k, m), st_dtype, buffer=nl.sbuf)
        mv = nl.ndarray((k, n), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(st, 0.0)
        nisa.memset(mv, 0.0)
        ss = nl.zeros((k if k > 32 else k // 8, m), nl.uint8, buffer=nl.sbuf)
        ms = nl.zeros((k if k > 32 else k // 8, n), nl.uint8, buffer=nl.sbuf)
        acc = nl.ndarray((min(m, 128), n), dst_dtype, buffer=nl.psum)
        nisa.nc_matmul_mx(acc, st, mv, ss, ms, **kw)
    kern()


def test_nc_matmul_mx_accepts_row_tiles():
    _mm(k=64, tile_size=(64, 128), tile_position=(64, 0))


def test_nc_matmul_mx_bfloat16_results_fill_one_bank_of_1024():
    _mm(n=1024, dst_dtype=nl.bfloat16)


@pytest.mark.parametrize("kwargs,match", [
    (dict(target="trn2"), "NeuronCore-v4"),
    (dict(st_dtype=nl.bfloat16), "stationary dtype bfloat16.*packed types"),
    (dict(k=16), "16 partitions"),
    (dict(m=129), "gemm_stationary_fmax"),
    (dict(n=513), "exceeds one PSUM bank of float32 results \\(512"),
    (dict(n=1025, dst_dtype=nl.bfloat16), "bfloat16 results \\(1024"),
    (dict(dst_dtype=nl.float16), "float32 or bfloat16"),
    (dict(tile_size=(64, 64)), "tiles PE rows only"),
    (dict(k=128, tile_size=(64, 128)), "more than the row tile size"),
])
def test_nc_matmul_mx_rules(kwargs, match):
    with pytest.raises(nki.NKIError, match=match):
        _mm(**kwargs)


def test_packed_data_is_not_read_as_numbers_or_converted():
    @nki.jit(platform_target="trn3")
    def arith():
        t = nl.ndarray((32, 8), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(t, 0.0)
        u = nl.ndarray((32, 8), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=u, data1=t, data2=t, op=nl.add)

    with pytest.raises(nki.NKIError, match="packed MX type float8_e4m3fn_x4.*nc_matmul_mx"):
        arith()

    @nki.jit(platform_target="trn3")
    def convert():
        t = nl.ndarray((32, 8), nl.bfloat16, buffer=nl.sbuf)
        nisa.memset(t, 1.0)
        u = nl.ndarray((32, 8), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t)

    with pytest.raises(nki.NKIError, match="bit for bit"):
        convert()


def test_host_arrays_of_packed_types_keep_their_type_through_a_kernel():
    """nl.static_cast(values, x4) packs four values per element on the host (as AWS's tests prepare
    MX weights); the kernel sees an HBM tensor of that type, and a returned one is tagged with it."""
    vals = RNG.uniform(-6, 6, (32, 64)).astype(np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    packed = nl.static_cast(vals, nl.float4_e2m1fn_x4)
    assert packed.shape == (32, 16) and packed.dtype == np.uint16
    np.testing.assert_array_equal(packed, ref_pack(vals, nl.float4_e2m1fn_x4))

    @nki.jit
    def k(w):
        assert w.dtype is nl.float4_e2m1fn_x4 and w.shape == (32, 16)
        t = nl.load(w)  # the nl helpers move packed data as the instructions do
        out = nl.ndarray(w.shape, w.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(t))
        return out

    out = k(packed)
    assert nki.dtypes.normalize(out.dtype) is nl.float4_e2m1fn_x4
    np.testing.assert_array_equal(ref_unpack(out, nl.float4_e2m1fn_x4), vals)
    with pytest.raises(nki.NKIError, match="multiple of 4"):
        nl.static_cast(np.zeros((4, 6), np.float32), nl.float8_e4m3fn_x4)


def test_static_cast_unpacks_a_packed_host_array():
    vals = RNG.uniform(-448, 448, (8, 16)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    packed = nl.static_cast(vals, nl.float8_e4m3fn_x4)
    assert packed.shape == (8, 4)
    np.testing.assert_array_equal(nl.static_cast(packed, np.float32), vals)
    np.testing.assert_array_equal(nl.static_cast(packed, nl.bfloat16), vals.astype(ml_dtypes.bfloat16))


def test_quantize_mx_gives_a_nan_scale_to_a_group_with_inf_or_nan():
    x = np.ones((32, 8), np.float32)
    x[0, 0] = np.inf
    x[9, 5] = np.nan
    data, scales = quantize_kernel(x.astype(ml_dtypes.bfloat16), nl.float8_e5m2_x4)
    assert scales[0, 0] == 255 and scales[1, 1] == 255  # OCP: the group's scale is NaN
    assert scales[0, 1] == 127 - 15 + 1 and scales[2, 0] == 127 - 15 + 1  # the other groups are normal
    vals = ref_unpack(data, nl.float8_e5m2_x4)
    assert np.isinf(vals[0, 0]) and np.isnan(vals[9, 5]) and vals[0, 4] == 2.0 ** 14


# ---------------------------------------------------------------------------- NkiTensor.base_tensor
@nki.jit(platform_target="trn3")
def _base_tensor_kernel(w, sel):
    """nki-library's MX weight load: the base of a kernel argument and of a slice of it, and the
    base of a packed view of a uint32 argument, indexed, copied, then viewed as the packed type."""
    part = w[1:3, :]
    assert part.base_tensor.shape == w.shape and part.base_tensor.dtype == w.dtype
    x4 = sel.view(nl.float8_e4m3fn_x4)
    assert x4.base_tensor.dtype == nl.uint32 and x4.base_tensor.shape == sel.shape
    t = nl.ndarray(w.shape, w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=part.base_tensor)
    out_w = nl.ndarray(w.shape, w.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_w, src=t)
    tile = nl.ndarray((32, 4), dtype=x4.base_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x4.base_tensor[0:32, 0:4])
    out_p = nl.ndarray((32, 4), nl.float8_e4m3fn_x4, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_p, src=tile.view(x4.dtype))
    return out_w, out_p


def test_base_tensor_is_the_whole_allocation_with_its_dtype():
    w = RNG.standard_normal((4, 8)).astype(np.float32)
    sel = RNG.integers(0, 2**32, (32, 4), dtype=np.uint32)
    out_w, out_p = nki.cpu_simulate(_base_tensor_kernel)[1](w=w, sel=sel)
    np.testing.assert_array_equal(out_w, w)  # the slice's base is all of w
    np.testing.assert_array_equal(np.asarray(out_p).view(np.uint32), sel)  # bits, through the base


def test_base_tensor_of_a_block_tensor_is_an_error():
    @nki.jit
    def kernel(x):
        b = nl.ndarray((2, nl.par_dim(32), 4), nl.float32, buffer=nl.sbuf)
        return b[0].base_tensor

    with pytest.raises(nki.NKIError, match="base_tensor.*block tensor"):
        nki.cpu_simulate(kernel)[1](x=np.zeros((1, 1), np.float32))
