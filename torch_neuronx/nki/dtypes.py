"""NKI data types: NumPy dtypes (low precision ones from ml_dtypes) plus tfloat32.

On-chip tiles keep their storage dtype; instructions compute in float32 and cast on output
(`cast_into`), which is where rounding to bfloat16 / fp8 / tf32 and integer saturation happen.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

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


class TFloat32:
    """tfloat32: stored as float32 with the mantissa rounded to 10 bits (no NumPy type exists)."""

    name = "tfloat32"
    itemsize = 4
    storage = float32

    def __repr__(self):
        return "nl.tfloat32"


tfloat32 = TFloat32()

ALL = {d.name if d is not tfloat32 else "tfloat32": d for d in (
    int8, int16, int32, uint8, uint16, uint32, float16, float32, bfloat16, float8_e4m3, float8_e4m3fn,
    float8_e5m2, tfloat32, bool_)}
_TORCH_NAMES = {"bool": bool_}


def normalize(dtype, instruction: str = "dtype"):
    """Canonical NKI dtype for a NumPy dtype/type, a name, a torch dtype or tfloat32."""
    from .errors import NKIError

    if dtype is tfloat32 or isinstance(dtype, TFloat32):
        return tfloat32
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
    if d not in ALL.values():
        raise NKIError(instruction, f"unsupported dtype {d}", f"use one of {sorted(ALL)}")
    return d


def storage_dtype(dtype) -> np.dtype:
    return float32 if dtype is tfloat32 else dtype


_NAMES = {d: n for n, d in ALL.items()}


def name(dtype) -> str:
    """NKI name of a dtype (cached: NumPy computes dtype.name in Python on every access)."""
    try:
        return _NAMES[dtype]
    except KeyError:
        return dtype.name


def is_float(dtype) -> bool:
    return dtype is tfloat32 or dtype.kind in "fV" and dtype != bool_


def is_fp32_like(dtype) -> bool:
    return dtype is tfloat32 or dtype == float32


def is_fp8(dtype) -> bool:
    return dtype is not tfloat32 and dtype in (float8_e4m3, float8_e4m3fn, float8_e5m2)


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
    """What a fresh buffer holds: NaN for floats, the most negative integer for integers."""
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
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        # Integer outputs round to nearest and saturate instead of wrapping; NaN becomes 0. Clip in
        # float64: int32's max is not a float32 (it rounds up to 2**31, which wraps to int32's min).
        with np.errstate(invalid="ignore"):
            rounded = np.nan_to_num(np.rint(np.asarray(values, dtype=np.float64)), nan=0.0)
            dst[...] = np.clip(rounded, info.min, info.max)
    else:
        dst[...] = values
