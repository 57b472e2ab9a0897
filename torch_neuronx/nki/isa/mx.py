"""MX (microscaling) instructions of NeuronCore-v4 (trn3): `nisa.quantize_mx`, `nisa.nc_matmul_mx`.

MX data (OCP Microscaling): each group of 32 values shares one 8-bit E8M0 scale, 2 ** (byte - 127).
On the NeuronCore a group is 8 partitions x 4 consecutive elements of one partition, and the four
elements live in one container of a packed `*_x4` type (dtypes.PackedX4): a [P, F] tile of
float8_e4m3fn_x4 holds [P, 4F] values. Scales are one uint8 (or float8_e8m0fnu) per group, laid out
per SBUF quadrant: the groups of data partitions 32q .. 32q + 31 have their 4 rows of scales at
scale partitions 32q .. 32q + 3 (a [P <= 32] tile needs P // 8 rows, a larger one 32 (q - 1) + 4).

Semantics and rules from AWS's NKI reference (nki.isa.quantize_mx, nki.isa.nc_matmul_mx), its
Trainium3 architecture guide and MXFP matmul guide; see docs/nki.md, "MX (microscaling) types".
"""

from __future__ import annotations

import numpy as np

from torch_neuronx import config
from .. import dtypes as _dt
from ..errors import NKIError
from ..runtime import PMAX, current
from ..tensor import box
from . import MOVING_FMAX, STATIONARY_FMAX, _access, _f32_2d, _matmul_write, _record, _store, _tensor

GROUP_PARTITIONS = 8  # a scaling group: 8 partitions x 4 elements (one packed container)
GROUP_ELEMENTS = 4
QUADRANT = 32  # SBUF partitions per quadrant; each quadrant's groups keep their scales in it
SCALE_BIAS = 127  # E8M0: value = 2 ** (byte - 127); 0xFF is NaN
SCALE_NAN = 255
_SCALE_DTYPES = (_dt.uint8, _dt.float8_e8m0fnu)
_QMX_OUT = (_dt.float8_e4m3fn_x4, _dt.float8_e5m2_x4)
_QMX_IN = (_dt.bfloat16, _dt.float16)


def _require_v4(instr):
    target = current(instr).target
    if target.neuron_core < 4:
        raise NKIError(instr, f"available only on NeuronCore-v4 and newer (trn3); this launch targets "
                       f"{target.name} (NeuronCore-v{target.neuron_core})",
                       "target trn3: @nki.jit(platform_target='trn3'), nki.benchmark(..., target='trn3') "
                       "or NEURON_PLATFORM_TARGET_OVERRIDE=trn3")


def _sbuf_only(instr, *operands):
    for role, t in operands:
        if t.buffer.kind != "sbuf":
            raise NKIError(instr, f"{role} is in {t.buffer!r}; it must be in nl.sbuf",
                           "copy it to SBUF first (nisa.tensor_copy from PSUM, nisa.dma_copy from HBM)")


def scale_rows(partitions: int) -> np.ndarray:
    """Scale-tile partition of each group of data partitions (group g covers 8g .. 8g + 7)."""
    g = np.arange(partitions // GROUP_PARTITIONS)
    return QUADRANT * (g // 4) + g % 4


def _data_partitions(instr, role, p):
    if p % QUADRANT or not 0 < p <= PMAX:
        raise NKIError(instr, f"{role} has {p} partitions; MX data spans whole 32-partition SBUF quadrants "
                       f"(32, 64, 96 or 128)", "pad the partition dimension to a multiple of 32")


def _check_scale(instr, role, scale, partitions, free):
    if scale.dtype not in _SCALE_DTYPES:
        raise NKIError(instr, f"{role} dtype {_dt.name(scale.dtype)}: MX scales are uint8 or float8_e8m0fnu "
                       "(E8M0 exponents)", f"allocate {role} with dtype=nl.uint8")
    need = int(scale_rows(partitions)[-1]) + 1
    if scale.partitions < need or scale.free_size != free:
        raise NKIError(instr, f"{role} shape {scale.shape}: the scales of {partitions} data partitions x {free} "
                       f"packed elements need {free} elements in each of partitions "
                       f"{_rows_text(partitions)} (each 32-partition quadrant keeps its 4 rows of scales in "
                       "its own quadrant)",
                       f"allocate {role} as [{partitions if partitions > QUADRANT else partitions // 8}, {free}]")


def _rows_text(partitions):
    quads = (partitions + QUADRANT - 1) // QUADRANT
    if partitions <= QUADRANT:
        return f"0..{partitions // GROUP_PARTITIONS - 1}"
    return ", ".join(f"{QUADRANT * q}..{QUADRANT * q + 3}" for q in range(quads))


def _scale_values(scale, partitions) -> np.ndarray:
    """2 ** (byte - 127) per group: [partitions // 8, free] float32 (NaN for 0xFF)."""
    rows = np.asarray(scale.data).reshape(scale.partitions, -1)[scale_rows(partitions)]
    bits = rows.view(np.uint8).astype(np.int32)
    values = np.ldexp(np.float32(1), bits - SCALE_BIAS).astype(np.float32)
    return np.where(bits == SCALE_NAN, np.float32(np.nan), values)


def _scale_headroom(instr) -> int:
    """Exponent added to the OCP sample algorithm's block scale: 1 (two times larger) since NKI 0.5.0,
    0 before; the two NKI versions' kernels and goldens differ in it (config.quantize_mx_scale)."""
    try:
        return 1 if config.quantize_mx_scale() == "double" else 0
    except ValueError as error:
        raise NKIError(instr, str(error), f"set {config.quantize_mx_scale.name} to `double` (NKI 0.5.0 and "
                       "later, the default) or `ocp` (NKI 0.4.0 and earlier), or unset it") from None


def quantize_mx(dst, src, dst_scale, name=None):
    """Quantize float16/bfloat16 `src` [P, 4F] to MXFP8 (Vector Engine, NeuronCore-v4): `dst` [P, F]
    float8_e5m2_x4 / float8_e4m3fn_x4 and one E8M0 scale per group of 8 partitions x 4 elements in
    `dst_scale` (uint8 or float8_e8m0fnu, quadrant layout). All three in SBUF, P a multiple of 32.

    Scale: since NKI 0.5.0 AWS documents a block scale two times the OCP sample algorithm's,
    2 ** (floor(log2(amax)) - emax + 1) with emax the element type's largest exponent (8 for E4M3, 15
    for E5M2), so that the largest values round without saturating; NKI 0.4.0 and earlier used the OCP
    scale (TORCH_NEURONX_NKI_QUANTIZE_MX_SCALE chooses). Elements are value / scale rounded to nearest
    even."""
    instr = "nisa.quantize_mx"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    scale = _tensor(dst_scale, instr, "dst_scale")
    _require_v4(instr)
    _access(instr, "vector", reads=[("src", src)], writes=[("dst", dst), ("dst_scale", scale)])
    _sbuf_only(instr, ("src", src), ("dst", dst), ("dst_scale", scale))
    if src.dtype not in _QMX_IN:
        raise NKIError(instr, f"src dtype {_dt.name(src.dtype)}: quantize_mx reads float16 or bfloat16",
                       "cast src to bfloat16 first (nisa.tensor_copy)")
    if dst.dtype not in _QMX_OUT:
        hint = ("quantize_mx produces MXFP8 only; float4_e2m1fn_x4 data comes quantized from the host"
                if dst.dtype is _dt.float4_e2m1fn_x4 else None)
        raise NKIError(instr, f"dst dtype {_dt.name(dst.dtype)}: quantize_mx writes float8_e5m2_x4 or "
                       "float8_e4m3fn_x4", hint or "allocate dst with dtype=nl.float8_e4m3fn_x4")
    p, f = src.partitions, src.free_size
    _data_partitions(instr, "src", p)
    if f % GROUP_ELEMENTS:
        raise NKIError(instr, f"src has {f} elements per partition, not a multiple of 4 (a packed container "
                       "holds 4)")
    if dst.partitions != p or dst.free_size != f // GROUP_ELEMENTS:
        raise NKIError(instr, f"dst shape {dst.shape} must hold [{p}, {f // GROUP_ELEMENTS}] packed elements for "
                       f"src {src.shape} (four values per {_dt.name(dst.dtype)})")
    _check_scale(instr, "dst_scale", scale, p, f // GROUP_ELEMENTS)

    element = dst.dtype
    emax = int(np.frexp(np.float32(element.max))[1]) - 1  # largest exponent: 8 (E4M3), 15 (E5M2)
    x = _f32_2d(src)
    groups = x.reshape(p // GROUP_PARTITIONS, GROUP_PARTITIONS, f // GROUP_ELEMENTS, GROUP_ELEMENTS)
    with np.errstate(invalid="ignore"):
        amax = np.abs(groups).max(axis=(1, 3))
    finite = np.isfinite(amax)
    exponent = np.frexp(np.where(finite, amax, 0))[1] - 1  # floor(log2(amax)) for amax > 0
    biased = np.clip(exponent - emax + _scale_headroom(instr) + SCALE_BIAS, 0, SCALE_NAN - 1)
    biased = np.where(amax > 0, biased, 0)
    biased = np.where(finite, biased, SCALE_NAN).astype(np.int32)
    # value / scale, an exact power-of-two step; a group with Inf/NaN (scale NaN) is cast unscaled.
    step = np.where(finite, SCALE_BIAS - biased, 0)
    step = np.repeat(np.repeat(step, GROUP_PARTITIONS, axis=0), GROUP_ELEMENTS, axis=1)
    scaled = np.ldexp(x, step).astype(np.float32)
    with np.errstate(invalid="ignore"):
        saturated = np.where(np.isfinite(scaled), np.clip(scaled, -element.max, element.max), scaled)
    _store(dst, element.pack(saturated).reshape(dst.shape))

    bits = np.zeros((scale.partitions, f // GROUP_ELEMENTS), np.uint8)
    rows = scale_rows(p)
    bits[rows] = biased.astype(np.uint8)
    where = np.zeros(bits.shape, bool)
    where[rows] = True
    storage = _dt.storage_dtype(scale.dtype)
    _store(scale, bits.view(storage).reshape(scale.shape), where.reshape(scale.shape))
    _record(instr, "vector", [dst, scale], [src], ("elementwise", f // GROUP_ELEMENTS))


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """dst[M, N] (PSUM, float32 or bfloat16) = sum over k < K and j < 4 of
    stationary[k, m][j] * s_scale * moving[k, n][j] * m_scale (Tensor Engine, NeuronCore-v4): MXFP8 /
    MXFP4 tiles (`*_x4`, mixing allowed) [K, M <= 128] and [K, N <= one PSUM bank of results: 512
    float32, 1024 bfloat16], K a multiple of 32 (a
    contraction of 4K values), each with its E8M0 scales in the quadrant layout. Accumulation
    (`accumulate`) as nisa.nc_matmul. `tile_size` (row size 32, 64 or 128; column size 128) and
    `tile_position` place the instruction on the PE array (row tiling): checked, not simulated."""
    instr = "nisa.nc_matmul_mx"
    dst = _tensor(dst, instr, "dst")
    st, mv = _tensor(stationary, instr, "stationary"), _tensor(moving, instr, "moving")
    ss, ms = _tensor(stationary_scale, instr, "stationary_scale"), _tensor(moving_scale, instr, "moving_scale")
    _require_v4(instr)
    _access(instr, "tensor", reads=[("stationary", st), ("moving", mv), ("stationary_scale", ss),
                                    ("moving_scale", ms)], writes=[("dst", dst)])
    for role, t in (("stationary", st), ("moving", mv)):
        if not _dt.is_packed(t.dtype):
            raise NKIError(instr, f"{role} dtype {_dt.name(t.dtype)}: nc_matmul_mx multiplies MX data in the "
                           "packed types float8_e4m3fn_x4, float8_e5m2_x4 or float4_e2m1fn_x4",
                           "quantize with nisa.quantize_mx, view packed HBM data with .view(dtype) / "
                           ".ap(dtype=...), or use nisa.nc_matmul for unscaled data")
    k, m, n = st.partitions, st.free_size, mv.free_size
    if mv.partitions != k:
        raise NKIError(instr, f"stationary {st.shape} and moving {mv.shape} must have the same partition size "
                       "(the contraction dimension)")
    _data_partitions(instr, "stationary", k)
    if m > STATIONARY_FMAX:
        raise NKIError(instr, f"stationary free size {m} exceeds nl.tile_size.gemm_stationary_fmax "
                       f"({STATIONARY_FMAX})", "split M into tiles of at most 128")
    # The moving free size is bounded by one PSUM bank of the result: 512 float32 (gemm_moving_fmax)
    # or 1024 bfloat16 (AWS's nki-library MX projections tile N by 2 * psum_fmax for bf16 results).
    bank = current(instr).target.psum_bank_bytes
    n_max = bank // dst.itemsize if dst.dtype in (_dt.float32, _dt.bfloat16) else MOVING_FMAX
    if n > n_max:
        raise NKIError(instr, f"moving free size {n} exceeds one PSUM bank of {_dt.name(dst.dtype)} results "
                       f"({n_max}; nl.tile_size.gemm_moving_fmax is {MOVING_FMAX} for float32)",
                       f"split N into tiles of at most {n_max}")
    if dst.partitions != m or dst.free_size != n:
        raise NKIError(instr, f"dst shape {dst.shape} must be [M, N] = [{m}, {n}] for stationary {st.shape} "
                       f"and moving {mv.shape}")
    if dst.dtype not in (_dt.float32, _dt.bfloat16):
        raise NKIError(instr, f"dst dtype {_dt.name(dst.dtype)}: nc_matmul_mx writes float32 or bfloat16",
                       "allocate the PSUM tile with dtype=nl.float32 or nl.bfloat16")
    _, _, lo, hi = box(dst)
    if lo // bank != (hi - 1) // bank:
        raise NKIError(instr, f"dst spans PSUM bytes {lo}..{hi} of each partition, crossing a {bank}-byte PSUM "
                       "bank boundary", "write each matmul into one bank")
    _check_scale(instr, "stationary_scale", ss, k, m)
    _check_scale(instr, "moving_scale", ms, k, n)
    if tile_size:
        rows, cols = (tuple(tile_size) + (None, None))[:2]
        if rows not in (32, 64, 128) or cols != 128:
            raise NKIError(instr, f"tile_size {tuple(tile_size)}: nc_matmul_mx tiles PE rows only; use "
                           "(128, 128), (64, 128) or (32, 128)")
        if k > rows:
            raise NKIError(instr, f"stationary has {k} partitions, more than the row tile size {rows}")
        if tile_position and (len(tuple(tile_position)) != 2 or tuple(tile_position)[0] % rows
                              or not 0 <= tuple(tile_position)[0] < 128 or tuple(tile_position)[1] != 0):
            raise NKIError(instr, f"tile_position {tuple(tile_position)} is not a row tile of size {rows} "
                           "((row offset multiple of the row size, 0))")
    a = _dequantize(st, ss, k, m)  # [K, M, 4]
    b = _dequantize(mv, ms, k, n)  # [K, N, 4]
    with np.errstate(invalid="ignore", over="ignore"):
        result = a.transpose(0, 2, 1).reshape(4 * k, m).T @ b.transpose(0, 2, 1).reshape(4 * k, n)
    _matmul_write(dst, result.astype(np.float32), accumulate, instr="nisa.nc_matmul_mx")
    _record(instr, "tensor", [dst], [st, mv, ss, ms], ("matmul", m, n, "mx"), flops=2 * 4 * k * m * n,
            matmul_dtype="mx")


def _dequantize(t, scale, k, f) -> np.ndarray:
    values = t.dtype.unpack(np.asarray(t.data).reshape(k, f)).reshape(k, f, GROUP_ELEMENTS)
    factors = np.repeat(_scale_values(scale, k), GROUP_PARTITIONS, axis=0)  # [K, F]
    with np.errstate(invalid="ignore"):
        return values * factors[:, :, None]
