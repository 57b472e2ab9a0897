"""Stand-in for AWS's host package `neuron_dtypes` (not public), which nki-library's tests and
`*_torch.py` references import: `static_cast`, `is_float_type`, `sizeinbytes`, `finfo` and the
dtypes, mapped onto torch_neuronx.nki's `nl.static_cast` / `nl.finfo` and ml_dtypes.

Harness-only: scripts/nki_suite/library.py puts this folder on PYTHONPATH.
"""

import numpy as np

import torch_neuronx.nki.dtypes as _dt
import torch_neuronx.nki.language as _nl

bfloat16 = _nl.bfloat16
float8_e4m3 = _nl.float8_e4m3
float8_e4m3fn = _nl.float8_e4m3fn
float8_e5m2 = _nl.float8_e5m2
float8_e4m3fn_x4 = _nl.float8_e4m3fn_x4
float8_e5m2_x4 = _nl.float8_e5m2_x4
float4_e2m1fn_x4 = _nl.float4_e2m1fn_x4
float8_e8m0fnu = getattr(_nl, "float8_e8m0fnu", None)


def static_cast(array, dtype):
    """A host array cast to `dtype` (floats round to nearest even, integers round and saturate;
    packed MX types pack four values of the last axis)."""
    if hasattr(array, "numpy") and not isinstance(array, np.ndarray):  # a torch tensor
        array = array.detach().cpu().float().numpy()
    return _nl.static_cast(array, dtype)


def is_float_type(dtype) -> bool:
    d = _dt.normalize(dtype, "neuron_dtypes.is_float_type")
    return bool(_dt.is_float(d))


def sizeinbytes(dtype) -> int:
    d = _dt.normalize(dtype, "neuron_dtypes.sizeinbytes")
    return int(np.dtype(_dt.storage_dtype(d)).itemsize)


def finfo(dtype):
    return _nl.finfo(dtype)
