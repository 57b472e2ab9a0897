"""NKI data types: NumPy dtypes (low precision ones from ml_dtypes) plus tfloat32.

On-chip tiles keep their storage dtype; instructions compute in float32 and cast on output
(`cast_into`), which is where rounding to bfloat16 / fp8 / tf32 and integer saturation happen.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import NKIError

# `nki.dtype` / `nl.dtype`: the type of the dtype objects below, as kernels annotate parameters
# (`dtype: nki.dtype = nl.bfloat16`). Every NKI dtype here is a NumPy dtype, but tfloat32.
dtype = np.dtype

int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
# Two E4M3 types, as AWS's nl has them: float8_e4m3 is the IEEE-like one (infinities, max 240;
# ml_dtypes.float8_e4m3), float8_e4m3fn the OCP "fn" one (no infinities, max 448; torch.float8_e4m3fn).
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
bool_ = np.dtype(np.bool_)
# OCP MX scale type (E8M0: an exponent only, 2 ** (bits - 127); 0xFF is NaN), for nisa.quantize_mx's
# dst_scale and nisa.nc_matmul_mx's scales (which also take uint8 holding the same bits).
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)


class TFloat32:
    """tfloat32: stored as float32 with the mantissa rounded to 10 bits (no NumPy type exists)."""

    name = "tfloat32"
    itemsize = 4
    storage = float32

    def __repr__(self):
        return "nl.tfloat32"


tfloat32 = TFloat32()


class PackedX4:
    """An MX (microscaling) packed type: four `element` values in one container of `itemsize` bytes
    (`storage`, an unsigned integer dtype holding the bits), element j in bits [j*b, (j+1)*b) with b
    the element's bit width. AWS: "4x packed float8_e4m3fn elements, custom data type for
    nki.isa.nc_matmul_mx on NeuronCore-v4"; the float8 ones are 32-bit, float4_e2m1fn_x4 is 16-bit.

    A tile [P, F] of a packed type holds [P, 4F] values; its bytes (capacity, DMA sizes) are the
    containers'. Instructions other than quantize_mx / nc_matmul_mx move the containers bit for bit
    (dma_copy, tensor_copy between packed tiles) and refuse to read them as numbers."""

    __slots__ = ("name", "element", "storage", "bits", "itemsize", "max", "host")

    def __init__(self, name, element, storage, bits):
        self.name = name
        self.element = np.dtype(element)
        self.storage = np.dtype(storage)
        self.bits = bits
        self.itemsize = self.storage.itemsize
        self.max = float(ml_dtypes.finfo(self.element).max)
        # Host arrays of this type: the containers' unsigned integers, the dtype tagged with the NKI
        # name, so that a kernel argument keeps its packed type and a returned packed tensor says what
        # it holds. nl.static_cast(values, nl.float8_e4m3fn_x4) makes one. The tag is a NumPy union
        # dtype (the container integer with one field named after the type), so `str(array.dtype)`
        # names the type, as AWS's host packed dtypes do: nki-library's torch_ref_wrapper hands arrays
        # whose dtype string holds "x4" to its references as NumPy arrays (the rest become torch
        # tensors, uint32 as int32), and its MX references unpack them. Arithmetic and torch see the
        # plain container integers; the metadata tag stays for arrays made before the field.
        self.host = np.dtype((self.storage, {name: (self.storage, 0)}), metadata={"nki_dtype": name})

    @property
    def dtype(self) -> np.dtype:
        """NumPy's dtype protocol (`np.dtype(x)` reads `x.dtype`): `np.zeros(shape,
        dtype=nl.float8_e4m3fn_x4)`, as nki-library's tests allocate packed outputs on the host, is
        an array of the tagged containers (`host`), which a kernel takes as a tensor of this type."""
        return self.host

    def __repr__(self):
        return f"nl.{self.name}"

    def __hash__(self):
        # Equal to its host dtype's hash: NumPy finds a dtype equal to the host dtype it converts this
        # type into, so a dict keyed by packed types (nki-library's MX references) is found by the
        # dtype of a packed host array.
        return hash(self.host)

    def __str__(self):  # nki-library compares dtypes by str(dtype) == str(nl.float4_e2m1fn_x4)
        return self.name

    def __reduce__(self):
        return (_packed, (self.name,))

    def unpack(self, bits: np.ndarray) -> np.ndarray:
        """float32 values [..., 4F] of containers [..., F]."""
        bits = np.asarray(bits).view(self.storage)
        mask = (1 << self.bits) - 1
        codes = np.stack([(bits >> (j * self.bits)) & mask for j in range(4)], axis=-1).astype(np.uint8)
        codes = codes.reshape(bits.shape[:-1] + (bits.shape[-1] * 4,)) if bits.ndim else codes
        return codes.view(self.element).astype(np.float32)

    def pack(self, values) -> np.ndarray:
        """Containers [..., F] of float32 values [..., 4F], each rounded to nearest even into the
        element type (values past its largest finite magnitude give what ml_dtypes gives)."""
        values = np.asarray(values, dtype=np.float32)
        codes = values.astype(self.element).view(np.uint8).astype(self.storage)
        codes = codes.reshape(values.shape[:-1] + (values.shape[-1] // 4, 4))
        if self.bits < 8:
            codes &= (1 << self.bits) - 1
        out = np.zeros(codes.shape[:-1], self.storage)
        for j in range(4):
            out |= codes[..., j] << self.storage.type(j * self.bits)
        return out


float8_e4m3fn_x4 = PackedX4("float8_e4m3fn_x4", ml_dtypes.float8_e4m3fn, np.uint32, 8)
float8_e5m2_x4 = PackedX4("float8_e5m2_x4", ml_dtypes.float8_e5m2, np.uint32, 8)
float4_e2m1fn_x4 = PackedX4("float4_e2m1fn_x4", ml_dtypes.float4_e2m1fn, np.uint16, 4)
PACKED = (float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4)


def _packed(name):
    return {d.name: d for d in PACKED}[name]


def is_packed(dtype) -> bool:
    return isinstance(dtype, PackedX4)


def packed_host(array_dtype):
    """The packed MX type a host array's (tagged) dtype holds, or None: its single field's name
    (PackedX4.host), else its metadata tag."""
    names = getattr(array_dtype, "names", None)
    meta = getattr(array_dtype, "metadata", None)
    name = names[0] if names and len(names) == 1 else meta.get("nki_dtype") if meta else None
    return next((d for d in PACKED if d.name == name), None)


ALL = {d.name if d is not tfloat32 else "tfloat32": d for d in (
    int8, int16, int32, uint8, uint16, uint32, float16, float32, bfloat16, float8_e4m3, float8_e4m3fn,
    float8_e5m2, float8_e8m0fnu, tfloat32, bool_) + PACKED}
_TORCH_NAMES = {"bool": bool_}


def normalize(dtype, instruction: str = "dtype"):
    """Canonical NKI dtype for a NumPy dtype/type, a name, a torch dtype or tfloat32."""
    if dtype is tfloat32 or isinstance(dtype, TFloat32):
        return tfloat32
    if isinstance(dtype, PackedX4):
        return dtype
    if isinstance(dtype, str) or type(dtype).__module__ == "torch":
        name = str(dtype).replace("torch.", "")
        if name in ALL:
            return ALL[name]
        if name in _TORCH_NAMES:
            return _TORCH_NAMES[name]
        raise NKIError(instruction, f"unsupported dtype {dtype!r}", f"use one of {sorted(ALL)}")
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise NKIError(instruction, f"unsupported dtype {dtype!r}", f"use one of {sorted(ALL)}") from None
    packed = packed_host(d)
    if packed is not None:  # a host array of a packed MX type
        return packed
    if d not in ALL.values():
        raise NKIError(instruction, f"unsupported dtype {d}", f"use one of {sorted(ALL)}")
    return d


def storage_dtype(dtype) -> np.dtype:
    if dtype is tfloat32:
        return float32
    return dtype.storage if isinstance(dtype, PackedX4) else dtype


_NAMES = {d: n for n, d in ALL.items()}


def name(dtype) -> str:
    """NKI name of a dtype (cached: NumPy computes dtype.name in Python on every access)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        return dtype.name


def is_float(dtype) -> bool:
    if isinstance(dtype, PackedX4):
        return False  # containers of four values: not readable as one number
    return dtype is tfloat32 or dtype.kind in "fV" and dtype != bool_


def is_fp32_like(dtype) -> bool:
    return dtype is tfloat32 or dtype == float32


def is_fp8(dtype) -> bool:
    return dtype is not tfloat32 and not isinstance(dtype, PackedX4) and dtype in (
        float8_e4m3, float8_e4m3fn, float8_e5m2)


def higher_precision(a, b):
    """The operand dtype an instruction's result takes when none is given: the more precise of two
    (a float over an integer, then more bytes, then more mantissa bits: float16 over bfloat16)."""
    if a is b or (a == b and tfloat32 not in (a, b)):
        return a
    return max((a, b), key=_precision)


def _precision(dtype):
    if not is_float(dtype):
        return (0, dtype.itemsize, 0)
    if dtype is tfloat32:
        return (1, 4, 10)
    return (1, dtype.itemsize, ml_dtypes.finfo(dtype).nmant)


def poison_value(dtype):
    """What a fresh buffer holds: NaN for floats, the most negative integer for integers; packed MX
    containers: all bits set (NaN elements in the float8 types, -6.0 in float4_e2m1fn, which has no NaN)."""
    if isinstance(dtype, PackedX4):
        return np.iinfo(dtype.storage).max
    if is_float(dtype):
        return np.nan
    if dtype == bool_:
        return True
    return np.iinfo(dtype).min


def _round_tf32(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    # Round to nearest even on the 13 dropped mantissa bits; leave inf/nan alone.
    finite = (bits & 0x7F800000) != 0x7F800000
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lsb) & 0xFFFFE000).astype(np.uint32)
    return np.where(finite, rounded, bits).view(np.float32)


def cast_into(dst: np.ndarray, values, dtype) -> None:
    """Write float32 `values` into the storage view `dst` with the cast the hardware does on output."""
    if dtype is tfloat32:
        dst[...] = _round_tf32(np.asarray(values, dtype=np.float32))
    elif isinstance(dtype, PackedX4):
        raise NKIError("cast", f"a value cannot be cast into the packed MX type {dtype.name}",
                       "quantize into it with nisa.quantize_mx, or copy packed data bit for bit "
                       "(nisa.dma_copy / nisa.tensor_copy between tiles of the same packed type)")
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        # Integer outputs round to nearest and saturate instead of wrapping; NaN becomes 0. Clip in
        # float64: int32's max is not a float32 (it rounds up to 2**31, which wraps to int32's min).
        with np.errstate(invalid="ignore"):
            rounded = np.nan_to_num(np.rint(np.asarray(values, dtype=np.float64)), nan=0.0)
            dst[...] = np.clip(rounded, info.min, info.max)
    else:
        dst[...] = values
