"""`nl.shared_constant(constant, dtype=None)`: a kernel-time constant placed in HBM.

AWS embeds the data in the compiled binary and loads it into shared HBM once; every use of the
same data and dtype shares it. Here each call copies the data into a fresh HBM tensor of the
launch (private to the program, so it never takes a slot among the grid's shared outputs).
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .errors import NKIError
from .runtime import current
from .tensor import NkiTensor, hbm


def shared_constant(constant, dtype=None) -> NkiTensor:
    """`constant`: an array (NumPy, or anything np.asarray takes) or the path of a .npy file."""
    if isinstance(constant, (str, bytes)) or hasattr(constant, "__fspath__"):
        constant = np.load(constant)
    data = np.asarray(constant)
    if data.dtype == np.float64 or data.dtype == np.int64:
        if dtype is None:
            raise NKIError("nl.shared_constant", f"{data.dtype} constants are not supported on the device",
                           "pass dtype= (e.g. nl.float32) or a float32/int32 array")
    t = current("nl.shared_constant").allocate(data.shape or (1,), dtype if dtype is not None else data.dtype,
                                               hbm, instruction="nl.shared_constant")
    data = data.reshape(t.shape)
    if data.dtype.kind in "iub" and t.data.dtype.kind in "iu":  # integers copy exactly (no float32 trip)
        t.data[...] = data
    else:
        _dt.cast_into(t.data, data.astype(np.float32), t.dtype)
    return t
