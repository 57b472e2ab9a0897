"""Virtual registers: `nisa.register_alloc`, `register_move`, `register_load`, `register_store`.

AWS (NKI ISA reference): each engine sequencer holds 64 32-bit registers for scalar work; a kernel
allocates virtual registers (the compiler maps them onto physical ones), moves constants or other
registers into them, loads a scalar (up to 32 bits, a one-element tensor in HBM or SBUF) into one
and stores one back; they bound dynamic loops (`nl.dynamic_range`, `while reg:`).

The simulator executes a kernel as it runs, so a register simply holds its value: a Python int,
wrapped to 32 bits as the hardware register holds it (int32). `while reg:` / `bool(reg)`,
`int(reg)` and `range(reg)` read it (AWS's parser frontend supports these; its tracer frontend
does not). Register instructions run on the engine sequencers, not on an engine: they are not in
the instruction trace and cost nothing in the cost model.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import NKIError
from ..tensor import NkiTensor


def _wrap32(value: int) -> int:
    return int(np.array(value & 0xFFFFFFFF, np.uint32).view(np.int32))


class VirtualRegister:
    """`nisa.register_alloc()`'s result: a 32-bit integer register (None until set)."""

    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value

    def get(self, instr: str) -> int:
        if self.value is None:
            raise NKIError(instr, "the register was allocated without a value and never set",
                           "initialize it: nisa.register_alloc(0), nisa.register_move or nisa.register_load")
        return self.value

    def __bool__(self):
        return self.get("VirtualRegister") != 0

    def __int__(self):
        return self.get("VirtualRegister")

    __index__ = __int__

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def _scalar(t, instr, role) -> int:
    """The value of a one-element tensor, as the 32-bit integer a register holds."""
    if not isinstance(t, NkiTensor):
        raise NKIError(instr, f"{role} must be an NKI tensor with one element, got {type(t).__name__}")
    if t.data.size != 1:
        raise NKIError(instr, f"{role} has shape {t.shape}; a register holds one 32-bit scalar",
                       "pass a one-element tensor (shape [1] or [1, 1])")
    if t.buffer.kind == "psum":
        raise NKIError(instr, f"{role} is in nl.psum; registers load from and store to HBM or SBUF",
                       "copy the value to SBUF first (nisa.tensor_copy)")
    dtype = _dt.storage_dtype(t.dtype)
    if dtype.itemsize > 4:
        raise NKIError(instr, f"{role} is {_dt.name(t.dtype)}; a register holds at most 32 bits")
    value = np.asarray(t.data).reshape(-1)[0]
    if np.issubdtype(dtype, np.integer):
        return _wrap32(int(value))
    value = float(np.float32(value))
    if not np.isfinite(value):
        raise NKIError(instr, f"{role} holds {value}, which is not an integer a register can hold",
                       "store an integer (an int32 tile) there")
    return _wrap32(int(value))


def register_alloc(x=None) -> VirtualRegister:
    """A new virtual register: uninitialized (x None), an immediate integer, or the value of a
    one-element tensor (nki-library passes `tile[0, 0]`)."""
    instr = "nisa.register_alloc"
    if x is None:
        return VirtualRegister()
    if isinstance(x, VirtualRegister):
        return VirtualRegister(x.get(instr))
    if isinstance(x, NkiTensor):
        return VirtualRegister(_scalar(x, instr, "x"))
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise NKIError(instr, f"x must be None, an integer or a one-element tensor, got {x!r}")
    return VirtualRegister(_wrap32(int(x)))


def _register(r, instr, role) -> VirtualRegister:
    if not isinstance(r, VirtualRegister):
        raise NKIError(instr, f"{role} must be a register from nisa.register_alloc(), got {type(r).__name__}")
    return r


def register_move(dst, src) -> None:
    """dst = src: a constant integer or another register."""
    instr = "nisa.register_move"
    dst = _register(dst, instr, "dst")
    if isinstance(src, VirtualRegister):
        dst.value = src.get(instr)
    elif isinstance(src, (int, np.integer)) and not isinstance(src, (bool, np.bool_)):
        dst.value = _wrap32(int(src))
    else:
        raise NKIError(instr, f"src must be a constant integer or a register, got {src!r}",
                       "load a tensor's value with nisa.register_load")


def register_load(dst, src) -> None:
    """dst = the scalar in `src` (a one-element HBM or SBUF tensor of at most 32 bits)."""
    instr = "nisa.register_load"
    _register(dst, instr, "dst").value = _scalar(src, instr, "src")


def register_store(dst, src) -> None:
    """Write register `src` into `dst` (a one-element HBM or SBUF tensor), cast to its dtype."""
    from . import _store

    instr = "nisa.register_store"
    value = _register(src, instr, "src").get(instr)
    if not isinstance(dst, NkiTensor) or dst.data.size != 1:
        raise NKIError(instr, f"dst must be a one-element tensor, got "
                       f"{getattr(dst, 'shape', type(dst).__name__)}", "pass a tensor of shape [1] or [1, 1]")
    if dst.buffer.kind == "psum":
        raise NKIError(instr, "dst is in nl.psum; registers store to HBM or SBUF", "store to an SBUF tile")
    if not dst.data.flags.writeable:
        raise NKIError(instr, "dst is a broadcast view and cannot be written")
    out = np.empty(dst.shape, dst.data.dtype)
    _dt.cast_into(out, np.full(dst.shape, value, np.float64), dst.dtype)  # integers: exact, saturated
    _store(dst, out)
