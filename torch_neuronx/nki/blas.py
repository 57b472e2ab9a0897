"""Run NumPy's BLAS single-threaded while a kernel is simulated.

Tile matmuls are small ([128, 128] x [128, 512]); on a busy machine OpenBLAS threads spin against
other processes and one such product can take 100x longer than on one thread. numpy has no public
switch, so this finds NumPy's OpenBLAS in the process and calls its set/get_num_threads (Linux; a
no-op where it cannot be found).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading

import numpy as np  # noqa: F401 - loads the BLAS this module looks for


@functools.lru_cache(maxsize=1)
def _openblas():
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for suffix in ("scipy_openblas_{}_num_threads64_", "openblas_{}_num_threads64_", "openblas_{}_num_threads"):
            try:
                get, set_ = getattr(lib, suffix.format("get")), getattr(lib, suffix.format("set"))
            except AttributeError:
                continue
            get.restype = ctypes.c_int
            set_.argtypes = [ctypes.c_int]
            return get, set_
    return None


_lock = threading.Lock()
_depth = 0
_saved = None


@contextlib.contextmanager
def single_threaded():
    """One BLAS thread while any launch runs (nested or in several threads); restored after the last."""
    global _depth, _saved
    funcs = _openblas()
    if funcs is None:
        yield
        return
    get, set_ = funcs
    with _lock:
        if _depth == 0:
            _saved = get()
            set_(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                set_(_saved)
