"""`nki.isa`: the instructions, destination first, executed on NumPy as they are issued.

Every instruction checks the hardware rules (which engine may read/write which buffer, shapes,
partition/free limits), computes in float32, casts into the destination's dtype, and records
itself in the trace for the cost model. Every instruction also takes the older dialect's `mask=`
(see `accepts_mask`): it then writes only where the mask holds and reads nothing elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import math
import types

import numpy as np

from .. import dtypes as _dt
from .. import elementwise as _ops
from .. import indexing as _ix
from ..errors import NKIError
from ..runtime import PMAX, active, current
from ..access_pattern import OutOfBoundsView as _OutOfBoundsView
from ..tensor import NkiTensor, box
from ..v0_1 import in_nki_0_1_kernel
from . import constants
from . import constants as _constants
from .constants import dge_mode, dma_engine, matmul_perf_mode, oob_mode, reduce_cmd

engine = types.SimpleNamespace(tensor="tensor", vector="vector", scalar="scalar", gpsimd="gpsimd",
                               dma="dma", sync="sync", unknown=None)
# The older dialect's spellings (`engine=nisa.vector_engine`).
tensor_engine, vector_engine, scalar_engine, gpsimd_engine = "tensor", "vector", "scalar", "gpsimd"
unknown_engine = None

_ENGINE_NAMES = {"tensor": "Tensor Engine", "vector": "Vector Engine", "scalar": "Scalar Engine",
                 "gpsimd": "GpSimd Engine", "dma": "DMA"}
# What each engine may read / write (docs/hardware-figures.md#neuroncore-and-nki-figures).
_READS = {"tensor": {"sbuf"}, "vector": {"sbuf", "psum"}, "scalar": {"sbuf", "psum"},
          "gpsimd": {"sbuf"}, "dma": {"sbuf", "hbm"}}
_WRITES = {"tensor": {"psum"}, "vector": {"sbuf", "psum"}, "scalar": {"sbuf", "psum"},
           "gpsimd": {"sbuf"}, "dma": {"sbuf", "hbm"}}
_HINTS = {"hbm": "load it into SBUF first (nl.load / nisa.dma_copy)",
          "psum": "copy it to SBUF first (nisa.tensor_copy)",
          "sbuf": "the Tensor Engine writes only PSUM: allocate the result with buffer=nl.psum"}
MIN_II = 64
PSUM_FMAX = 512
STATIONARY_FMAX = 128
MOVING_FMAX = 512
BN_STATS_FMAX = 512
BN_STATS_DIM = 6
BN_AGGR_DIM = 2


# ---------------------------------------------------------------------------- checks and helpers
def _tensor(x, instr, role) -> NkiTensor:
    if isinstance(x, _OutOfBoundsView):  # an .ap() view that leaves its tensor, now used
        raise NKIError(instr, f"{role} is an access pattern that leaves its tensor: {x.error.rule}",
                       "check the pattern's steps, counts and offset (the view was built at "
                       f"{x.error.location})")
    if not isinstance(x, NkiTensor):
        pending = getattr(type(x), "NOT_A_TILE", None)  # e.g. nl.loop_reduce's result: says what to do instead
        raise NKIError(instr, f"{role} must be an NKI tensor, got {pending[0] if pending else type(x).__name__}",
                       pending[1] if pending else "allocate it with nl.ndarray or pass a kernel argument")
    x._no_blocks(instr)
    if x.partial is not None:
        _ix.check_in_bounds(x, _active_mask(), instr, role)
    if _dt.is_packed(x.dtype) and instr not in _PACKED_OK:
        raise NKIError(instr, f"{role} has the packed MX type {_dt.name(x.dtype)} (four values per element), "
                       "which only nisa.nc_matmul_mx reads as numbers",
                       "multiply it with nisa.nc_matmul_mx; dma_copy / tensor_copy move it bit for bit")
    return x


# Instructions that take packed MX (*_x4) operands: the MX ones, and copies of the containers
# (sendrecv is a DMA between the two cores' SBUFs: nki-library's rmsnorm_mx_quantize_tkg exchanges
# its quantized halves with it).
_PACKED_OK = {"nisa.dma_copy", "nisa.tensor_copy", "nisa.memset", "nisa.quantize_mx", "nisa.nc_matmul_mx",
              "nisa.sendrecv", "nl.load", "nl.load_transpose2d", "nl.copy"}


def _packed_copy(instr, dst, src):
    """A copy involving a packed MX type moves containers bit for bit: both sides the same type."""
    if (_dt.is_packed(dst.dtype) or _dt.is_packed(src.dtype)) and dst.dtype is not src.dtype:
        raise NKIError(instr, f"cannot convert {_dt.name(src.dtype)} to {_dt.name(dst.dtype)}: packed MX data "
                       "is copied bit for bit, not converted",
                       "view the source as the packed type first (.view(dtype) or .ap(..., dtype=)), or "
                       "quantize with nisa.quantize_mx")


# ---------------------------------------------------------------------------- masks
def _active_mask():
    run = active()
    return None if run is None else run.mask


@contextlib.contextmanager
def masked(array):
    """Run the enclosed instructions under a mask array (None: unmasked); nested helpers see it."""
    run = current("mask")
    outer = run.mask
    run.mask = array
    try:
        yield
    finally:
        run.mask = outer


def accepts_mask(fn, instruction):
    """Give an instruction or nl helper the older dialect's `mask=`: a comparison of nl.arange /
    nl.mgrid indices (`i_p < n`, combined with & |), True (no mask) or False (does nothing)."""
    @functools.wraps(fn)
    def wrapper(*args, mask=None, **kwargs):
        if mask is None:
            return fn(*args, **kwargs)
        array = _ix.mask_array(mask, instruction)
        with masked(array):
            result = fn(*args, **kwargs)
        if (array is not None and not array.any() and isinstance(result, NkiTensor)
                and result.data is result.alloc.storage and not result.alloc.written):
            # A value-returning call whose mask excludes everything was not issued: its result holds
            # no element, so `t[...] = result` and `t[...] += result` write nothing (the compiler
            # drops the instruction, the assignment's destination with it).
            result.alloc.valid = np.zeros(result.alloc.storage.shape, dtype=bool)
        return result

    return wrapper


def _mask_for(t: NkiTensor, role="dst"):
    """The active mask as a boolean of t's shape, or None."""
    mask = _active_mask()
    return None if mask is None else _ix.fit_mask(mask, t.shape, "mask", role)


def _masked_input(t: NkiTensor, values: np.ndarray, identity) -> np.ndarray:
    """`values` (t's elements, any shape of the same size) with masked-out elements replaced by the
    operation's identity, so that a reduction or matmul does not read them."""
    keep = _input_keep(t)
    return values if keep is None else np.where(keep.reshape(values.shape), values, np.float32(identity))


def _input_keep(t: NkiTensor):
    """Which elements of input t the active mask lets the instruction read, as [P, F]; None for all
    (no mask, or a mask over another operand's space, e.g. the destination's)."""
    mask = _active_mask()
    if mask is None:
        return None
    try:
        return np.broadcast_to(mask, t.shape).reshape(t.partitions, -1)
    except ValueError:
        return None


def _engine(value, default, allowed, instr):
    name = default if value is None else (value if isinstance(value, str) else getattr(value, "name", value))
    if name not in allowed:
        raise NKIError(instr, f"engine {value!r} cannot run this instruction", f"use one of {sorted(allowed)}")
    return name


def _access(instr, eng, reads=(), writes=()):
    """The engine/buffer rule: raise naming the operand, its buffer and what the engine allows."""
    for role, t in reads:
        if t.buffer.kind not in _READS[eng]:
            raise NKIError(instr, f"{role} is in {t.buffer!r}, but the {_ENGINE_NAMES[eng]} cannot read "
                           f"{t.buffer!r} (it reads {_names(_READS[eng])})", _HINTS.get(t.buffer.kind))
    for role, t in writes:
        if t.buffer.kind not in _WRITES[eng]:
            hint = _HINTS["sbuf"] if eng == "tensor" else (
                "write to SBUF and nl.store it" if t.buffer.kind == "hbm" else "write to SBUF instead")
            raise NKIError(instr, f"{role} is in {t.buffer!r}, but the {_ENGINE_NAMES[eng]} cannot write "
                           f"{t.buffer!r} (it writes {_names(_WRITES[eng])})", hint)
        if not t.data.flags.writeable:
            raise NKIError(instr, f"{role} is a broadcast view and cannot be written")
    if eng != "tensor":
        for _, t in reads:
            if t.buffer.kind == "psum":
                _drain(t)


def _names(kinds):
    return " and ".join(f"nl.{k}" for k in sorted(kinds))


def _same_layout(instr, dst, src, role="data"):
    if dst.partitions != src.partitions or dst.free_size != src.free_size:
        raise NKIError(instr, f"dst shape {dst.shape} does not match {role} shape {src.shape} "
                       "(partition sizes and elements per partition must agree)")


def _as_f32(data: np.ndarray) -> np.ndarray:
    if data.dtype == _BF16:
        # bfloat16 is float32's upper half: widening the bits is exact (NaN payloads included) and
        # about twice as fast as ml_dtypes' cast, which the Tensor Engine's operands spend most time in.
        wide = data.view(np.uint16).astype(np.uint32)
        np.left_shift(wide, 16, out=wide)
        return wide.view(np.float32)
    return data.astype(np.float32, copy=False)


_BF16 = np.dtype(_dt.bfloat16)


def _f32(t: NkiTensor) -> np.ndarray:
    return _as_f32(t.data)


def _f32_2d(t: NkiTensor) -> np.ndarray:
    return _as_f32(t.data.reshape(t.partitions, -1))


def _write(t: NkiTensor, values, where=None) -> None:
    """Cast float32 `values` into t (the cast on output), where the mask holds."""
    values = np.asarray(values)
    if values.shape != t.shape:
        values = values.reshape(t.shape)
    where = _mask_for(t) if where is None else where
    if where is None and t.partial is None:
        _dt.cast_into(t.data, values, t.dtype)
        _written(t, None)
    else:
        cast = np.empty(t.shape, t.data.dtype)
        _dt.cast_into(cast, values, t.dtype)
        _store(t, cast, where)


def _store(t: NkiTensor, values, where=None) -> None:
    """Put `values` (already in t's storage dtype) into t where `where` (default: the active mask)."""
    where = _mask_for(t) if where is None else where
    if where is None and t.partial is None:
        t.data[...] = values
    else:
        np.copyto(t.data, np.broadcast_to(values, t.shape), where=True if where is None else where)
        if t.partial is not None:
            _ix.scatter(t, where)
    _written(t, where)


def _written(t: NkiTensor, where) -> None:
    alloc = t.alloc
    alloc.written = True
    if t.data is alloc.storage:  # which elements of a whole (helper-result) tile hold values
        alloc.valid = None if where is None else np.array(where)
    if alloc.acc is not None and t.partial is None:  # a PSUM value: any write but a matmul's ends a group
        _set_group(t, ACC_VALUE, where)


# ---------------------------------------------------------------------------- PSUM accumulation groups
# The state of each PSUM element (alloc.acc: one byte per byte of PSUM, shared by every dtype view
# of directly allocated memory), what a matmul with accumulate=None or `psum[...] += matmul` does:
ACC_FRESH = 0    # nothing written since the tile was allocated: a matmul or += overwrites
ACC_OPEN = 1     # a matmul accumulation group is open: a matmul (accumulate=None) or += adds
ACC_VALUE = 2    # written by another instruction (memset, copy, ...): a matmul overwrites, += adds
ACC_DRAINED = 3  # a group whose result was read out: the next matmul or += starts a new group


def _acc_bytes(t: NkiTensor) -> np.ndarray:
    """The accumulation state of t's elements: [*t.shape, itemsize] bytes (a view of alloc.acc)."""
    alloc = t.alloc
    if alloc.acc is None:
        alloc.acc = np.zeros(alloc.storage.nbytes, dtype=np.uint8)
    return np.ndarray(t.data.shape + (t.data.itemsize,), np.uint8, buffer=alloc.acc, offset=t.offset,
                      strides=t.data.strides + (1,))


def _group_state(t: NkiTensor) -> np.ndarray:
    if t.partial is not None:
        raise NKIError("nisa.nc_matmul", f"the PSUM destination is out of bounds: {t.partial.violation}",
                       "keep a matmul's destination inside its tile")
    return _acc_bytes(t)[..., 0]


def _set_group(t: NkiTensor, state, where=None) -> None:
    state_bytes = _acc_bytes(t)
    if where is None:
        state_bytes[...] = state
    else:
        np.copyto(state_bytes, np.uint8(state), where=np.broadcast_to(where, t.shape)[..., None])


def _drain(t: NkiTensor) -> None:
    """A Vector / Scalar Engine read of PSUM ends the matmul accumulation groups it reads: the
    next matmul with accumulate=None (or `+=`) there starts a new group (see docs/nki.md)."""
    if t.alloc.acc is None or t.partial is not None:
        return
    state = _acc_bytes(t)
    state[state == ACC_OPEN] = ACC_DRAINED


def _scalar_operand(value, instr, role, partitions, eng):
    """A tensor_scalar / activation operand: a Python number or a per-partition [P, 1] tensor."""
    if isinstance(value, NkiTensor):
        _access(instr, eng, reads=[(role, value)])
        if value.partitions != partitions or value.free_size != 1:
            raise NKIError(instr, f"{role} of shape {value.shape} must be a scalar or a [{partitions}, 1] "
                           "per-partition vector", "reduce it to one value per partition first")
        return _f32(value).reshape(partitions, 1), value
    if isinstance(value, (int, float, np.number, bool)):
        return np.float32(value), None
    raise NKIError(instr, f"{role} must be a number or a [P, 1] tensor, got {type(value).__name__}")


# AWS's "Arithmetic Unary" ALU operators (NKI API, "Supported Math Operators for NKI ISA"): an
# instruction's op may be one of them, applied to the data alone, with its operand None or 0.
ALU_UNARY = ("abs", "square", "relu", "rsqrt", "reciprocal")


def _alu(op, operand, instr, role, partitions, eng):
    """An ALU operator and its scalar operand, as `(fn(x), operand tensor or None)`: a binary op
    with a number or [P, 1] operand (`reverse` applied by the caller), or a unary ALU operator
    (abs, square, relu, rsqrt, reciprocal) whose operand must be None or 0."""
    token = _ops.resolve(op, instr)
    if token.arity == 1:
        if token.name not in ALU_UNARY:
            raise NKIError(instr, f"{token!r} is an activation function, not an ALU operator (the ALU's unary "
                           f"operators are nl.{', nl.'.join(ALU_UNARY)})",
                           "compute it with nisa.activation on the Scalar Engine")
        if operand is not None and not (isinstance(operand, (int, float, np.number)) and operand == 0):
            raise NKIError(instr, f"{role} is {operand!r}, but {token!r} is a unary operator: its operand must be "
                           "None or 0", f"pass {role}=0.0")
        return (lambda x, reverse=False: token.fn(x)), None
    value, tensor = _scalar_operand(operand, instr, role, partitions, eng)
    return (lambda x, reverse=False: token.fn(value, x) if reverse else token.fn(x, value)), tensor


def _issued() -> bool:
    """False when the active mask excludes every element: the instruction is not issued."""
    run = active()
    return run is None or run.mask is None or bool(run.mask.any())


def _record(op, eng, writes, reads, cost, **kw):
    run = current(op)
    if run.mask is not None and not run.mask.any():
        return None  # masked out entirely: the instruction is not issued
    return run.record(op, eng, writes, reads, cost, **kw)


# ---------------------------------------------------------------------------- data movement
def dma_copy(dst, src, dst_rmw_op=None, oob_mode=None, dge_mode=None, dma_engine=None, name=None, priority=None,
             engine=None):
    """Copy `src` to `dst` with a DMA (HBM <-> SBUF, HBM -> HBM; never PSUM). With
    `dst_rmw_op=nl.add` the DMA adds into `dst`. A dtype difference is converted (the DMA casts).
    `oob_mode=nisa.oob_mode.skip`: elements whose address (an index read at run time from a tile)
    falls outside `dst` or `src` are not copied; by default they are an error. `dge_mode`,
    `dma_engine`, `priority` and `engine` (the engine generating a hardware DGE's descriptors:
    `engine.sync` or `engine.scalar`) are accepted and not acted on."""
    if engine is not None:
        _engine(engine, None, ("sync", "scalar"), "nisa.dma_copy")
    if _constants.oob_mode.skip in (oob_mode, getattr(oob_mode, "value", None)) or oob_mode == "skip":
        keep = _in_bounds(dst, src)
        if keep is not None:
            outer = _active_mask()
            with masked(keep if outer is None else keep & _ix.fit_mask(outer, keep.shape, "mask", "dst")):
                return dma_copy(dst, src, dst_rmw_op, None, dge_mode, dma_engine, name, priority, engine)
    instr = "nisa.dma_copy"
    dst = _tensor(dst, instr, "dst")
    src = _tensor(src, instr, "src")
    _access(instr, "dma", reads=[("src", src)], writes=[("dst", dst)])
    if dst.data.size != src.data.size:
        raise NKIError(instr, f"dst shape {dst.shape} and src shape {src.shape} have different sizes")
    if dst.buffer.on_chip and src.buffer.on_chip and dst.partitions != src.partitions:
        raise NKIError(instr, f"on-chip copy between different partition counts {src.shape} -> {dst.shape}")
    values = src.data if src.shape == dst.shape else src.data.reshape(dst.shape)
    _packed_copy(instr, dst, src)
    if dst_rmw_op is not None:
        op = _ops.resolve(dst_rmw_op, instr, 2)
        _write(dst, op.fn(_f32(dst), values.astype(np.float32)))
    elif dst.dtype is src.dtype or (dst.dtype == src.dtype and dst.dtype is not _dt.tfloat32
                                    and src.dtype is not _dt.tfloat32):
        _store(dst, values)
    else:
        _write(dst, values.astype(np.float32))
    side = dst if dst.buffer.on_chip else (src if src.buffer.on_chip else dst)
    nbytes = max(dst.nbytes, src.nbytes)
    per_partition = nbytes / max(1, side.partitions if side.ndim else 1)
    _record(instr, "dma", [dst], [src], ("dma", nbytes, per_partition), nbytes=nbytes)


def _in_bounds(dst, src):
    """The elements (in dst's shape) whose dst and src addresses are both in bounds, when either
    access leaves its tensor; None when both stay inside."""
    keep = None
    for t in (dst, src):
        partial = getattr(t, "partial", None)
        if partial is not None and partial.oob.size == dst.data.size:
            inside = ~partial.oob.reshape(dst.shape)
            keep = inside if keep is None else keep & inside
    return keep


def tensor_copy(dst, src, engine=None, name=None, dtype=None):
    """Copy (and cast) an on-chip tile: Vector (default), Scalar or GpSimd Engine. `dtype` (AWS's
    beta-2 tutorials pass it) is accepted; the cast is always to dst's dtype."""
    instr = "nisa.tensor_copy"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    eng = _engine(engine, "vector", ("vector", "scalar", "gpsimd"), instr)
    _access(instr, eng, reads=[("src", src)], writes=[("dst", dst)])
    _same_layout(instr, dst, src, "src")
    _packed_copy(instr, dst, src)
    if dst.dtype == src.dtype and dst.dtype is not _dt.tfloat32:
        _store(dst, src.data.reshape(dst.shape))
    else:
        _write(dst, _f32(src))
    _record(instr, eng, [dst], [src], ("elementwise", dst.free_size))


def memset(dst, value, engine=None, name=None):
    instr = "nisa.memset"
    dst = _tensor(dst, instr, "dst")
    eng = _engine(engine, "vector", ("vector", "scalar", "gpsimd"), instr)
    _access(instr, eng, writes=[("dst", dst)])
    if _dt.is_packed(dst.dtype):  # every packed element holds the value, rounded into the element type
        _store(dst, dst.dtype.pack(np.full(dst.shape[:-1] + (4 * dst.shape[-1],), value, dtype=np.float32)))
    else:
        _write(dst, np.full(dst.shape, value, dtype=np.float32))
    _record(instr, eng, [dst], [], ("elementwise", dst.free_size))


# ---------------------------------------------------------------------------- Tensor Engine
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(), perf_mode=None, name=None):
    """dst[M, N] (PSUM, float32) = stationary[K, M].T @ moving[K, N], contracting over partitions.

    accumulate: True adds into dst, False overwrites, None (default) overwrites the first time a
    matmul writes an element and accumulates after that, until another instruction writes it.
    """
    instr = "nisa.nc_matmul"
    dst = _tensor(dst, instr, "dst")
    st = _tensor(stationary, instr, "stationary")
    mv = _tensor(moving, instr, "moving")
    _access(instr, "tensor", reads=[("stationary", st), ("moving", mv)], writes=[("dst", dst)])
    if is_double_row(perf_mode, st, mv):
        return _double_row_matmul(instr, dst, st, mv, accumulate)
    k, m, n = st.partitions, st.free_size, mv.free_size
    if st.partitions != mv.partitions:
        raise NKIError(instr, f"stationary {st.shape} and moving {mv.shape} must have the same partition "
                       "size: the matmul contracts over the partition dimension of both",
                       "put the contraction dimension K first in both tiles (stationary is [K, M])")
    if m > STATIONARY_FMAX:
        raise NKIError(instr, f"stationary free size {m} exceeds nl.tile_size.gemm_stationary_fmax "
                       f"({STATIONARY_FMAX})", "split M into tiles of at most 128")
    if n > MOVING_FMAX:
        raise NKIError(instr, f"moving free size {n} exceeds nl.tile_size.gemm_moving_fmax ({MOVING_FMAX})",
                       "split N into tiles of at most 512")
    _check_matmul_result(instr, dst, m, n, f"stationary {st.shape} and moving {mv.shape}",
                         transpose_of=st if is_transpose else None)
    fp32_in = (_dt.is_fp32_like(st.dtype), _dt.is_fp32_like(mv.dtype))
    if fp32_in[0] != fp32_in[1]:
        raise NKIError(instr, f"operand dtypes {_dt.name(st.dtype)} and {_dt.name(mv.dtype)}: "
                       "float32 operands cannot be mixed with low-precision ones",
                       "cast both to bfloat16 (or both to float32)")
    for role, t in (("stationary", st), ("moving", mv)):
        if not _dt.is_float(t.dtype):
            raise NKIError(instr, f"{role} dtype {_dt.name(t.dtype)} is not a floating-point type")
    if is_transpose and current(instr).target.neuron_core >= 3 and _is_identity(mv):
        # NeuronCore-v3's transpose mode moves the data bit-accurately: NaN and Inf stay where they
        # are instead of spreading through the products with the identity's zeros.
        result = _masked_input(st, _f32_2d(st), 0).T.copy()
    else:
        result = _masked_input(st, _f32_2d(st), 0).T @ _masked_input(mv, _f32_2d(mv), 0)
    _matmul_write(dst, result, accumulate, _matmul_mask(dst, mv))
    dtype_name = _dt.name(mv.dtype if _dt.is_fp8(mv.dtype) and _dt.is_fp8(st.dtype) else
                          (st.dtype if fp32_in[0] else _dt.bfloat16))
    _record(instr, "tensor", [dst], [st, mv], ("matmul", m, n, dtype_name), flops=2 * k * m * n,
            matmul_dtype=dtype_name)


def _is_identity(t) -> bool:
    v = t.data.reshape(t.partitions, -1)
    return v.shape[0] == v.shape[1] and np.array_equal(v.astype(np.float32), np.eye(v.shape[0], dtype=np.float32))


def is_double_row(perf_mode, st, mv) -> bool:
    """The FP8 double-row form: perf_mode double_row (the older API spells it 'double_row_gen3')
    with stationary [K, 2, M] and moving [K, 2, N], the two rows of a PE side by side."""
    name = getattr(perf_mode, "name", perf_mode)
    return (isinstance(name, str) and name.startswith("double_row") and st.ndim == 3 and mv.ndim == 3
            and st.shape[1] == 2 and mv.shape[1] == 2)


def _double_row_matmul(instr, dst, st, mv, accumulate):
    """dst[M, N] = sum over r of stationary[:, r, :].T @ moving[:, r, :]: a contraction over 2K rows
    (each PE holds two FP8 rows), as AWS's double_row_matmul reference kernel lays them out."""
    k, m, n = st.partitions, st.shape[2], mv.shape[2]
    if st.partitions != mv.partitions:
        raise NKIError(instr, f"stationary {st.shape} and moving {mv.shape} must have the same partition size")
    for role, t in (("stationary", st), ("moving", mv)):
        if not _dt.is_fp8(t.dtype):
            raise NKIError(instr, f"{role} dtype {_dt.name(t.dtype)}: the double_row performance mode packs two "
                           "FP8 rows per processing element", "cast both operands to an FP8 type, or drop perf_mode")
    if m > STATIONARY_FMAX or n > MOVING_FMAX:
        raise NKIError(instr, f"double_row operands [K, 2, {m}] and [K, 2, {n}]: M must be <= {STATIONARY_FMAX} "
                       f"and N <= {MOVING_FMAX}")
    _check_matmul_result(instr, dst, m, n, f"double_row operands {st.shape} and {mv.shape}")
    a = np.ascontiguousarray(_f32(st)).reshape(k * 2, m)
    b = np.ascontiguousarray(_f32(mv)).reshape(k * 2, n)
    _matmul_write(dst, a.T @ b, accumulate, None)
    dtype_name = _dt.name(mv.dtype)
    # Twice the rows in one pass: the cycles of one FP8 matmul of [K, M] x [K, N], the FLOPs of 2K.
    _record(instr, "tensor", [dst], [st, mv], ("matmul", m, n, dtype_name), flops=2 * 2 * k * m * n,
            matmul_dtype=dtype_name)


def _matmul_mask(dst, mv):
    """Where a masked matmul writes. A mask over the moving tensor [K, N] writes the result columns
    it keeps for some k (masked contraction rows are only not read); others apply to dst as is."""
    mask = _active_mask()
    if mask is None:
        return None
    try:
        over_moving = np.broadcast_to(mask, mv.shape).reshape(mv.partitions, -1)
    except ValueError:
        return _mask_for(dst)
    return np.broadcast_to(over_moving.any(axis=0, keepdims=True), (dst.partitions, dst.free_size)).reshape(dst.shape)


def _matmul_write(dst, result, accumulate, where=None, adds=(ACC_OPEN,), instr="nisa.nc_matmul"):
    """Write a matmul result into PSUM: accumulate=True adds, False overwrites, None adds where an
    accumulation group is open (state in `adds`) and overwrites elsewhere, starting a group."""
    result = result.reshape(dst.shape)
    if accumulate is None:
        state = _group_state(dst)
        started = state == adds[0]  # np.isin sorts: ~10x slower on these one- or two-value sets
        for value in adds[1:]:
            started |= state == value
        if started.all():
            result = _f32(dst) + result
        elif started.any():
            result = np.where(started, _f32(dst) + result, result)
    elif accumulate:
        fresh = _group_state(dst) == ACC_FRESH
        if where is not None or _mask_for(dst) is not None:
            fresh &= np.broadcast_to(_mask_for(dst) if where is None else where, dst.shape)
        if fresh.any():
            first = np.argwhere(fresh)[0].tolist()
            raise NKIError(instr, f"accumulate=True adds onto PSUM elements that no instruction has written since "
                           f"their tile was allocated ({int(fresh.sum())} of {fresh.size}, the first at "
                           f"index {first}): AWS documents this as undefined behavior, the first matmul of an "
                           "accumulation group must overwrite", "start the group with accumulate=False (e.g. "
                           "accumulate=(k > 0) in the contraction loop) or leave accumulate=None")
        result = _f32(dst) + result
    _store(dst, result, where)
    _set_group(dst, ACC_OPEN, _mask_for(dst) if where is None else where)


def _check_matmul_result(instr, dst, m, n, operands: str, transpose_of=None) -> None:
    """A matmul's destination: [M, N] within one PSUM bank, float32, or as AWS's reference allows
    beyond that: bfloat16 on NeuronCore-v4 (trn3); on NeuronCore-v3 and later the transpose mode
    (`is_transpose=True`, `transpose_of` the stationary tile) writes a 16-bit input's own dtype."""
    if dst.partitions != m or dst.free_size != n:
        raise NKIError(instr, f"dst shape {dst.shape} must be [M, N] = [{m}, {n}] for {operands}")
    core = current(instr).target.neuron_core
    allowed = dst.dtype == _dt.float32 or (core >= 4 and dst.dtype == _dt.bfloat16)
    if (not allowed and transpose_of is not None and core >= 3 and dst.dtype == transpose_of.dtype
            and dst.dtype in (_dt.bfloat16, _dt.float16)):
        allowed = True
    if not allowed:
        raise NKIError(instr, f"dst dtype {_dt.name(dst.dtype)}: matmul results are float32 in PSUM"
                       + (" (bfloat16 too on NeuronCore-v4)" if core < 4 else " or bfloat16")
                       + "; a 16-bit transpose (is_transpose=True, NeuronCore-v3 and later) writes the input's dtype",
                       "allocate the PSUM tile with dtype=nl.float32")
    _check_psum_bank(instr, dst)


def _check_psum_bank(instr, dst):
    bank = current(instr).target.psum_bank_bytes
    per_partition = dst.free_size * dst.itemsize
    if dst.free_size > PSUM_FMAX:
        raise NKIError(instr, f"dst free size {dst.free_size} exceeds nl.tile_size.psum_fmax ({PSUM_FMAX})",
                       "a matmul writes at most 512 float32 per partition (one PSUM bank)")
    _, _, lo, hi = box(dst)
    if lo // bank != (hi - 1) // bank or per_partition > bank:
        raise NKIError(instr, f"dst spans PSUM bytes {lo}..{hi} of each partition, crossing a {bank}-byte "
                       "PSUM bank boundary", "write each matmul into one bank (<= 512 float32, bank-aligned)")


def nc_transpose(dst, data, engine=None, name=None):
    """dst[F, P] = data[P, F].T. Tensor Engine (default: SBUF -> PSUM, P, F <= 128) or
    Vector Engine (blocks of at most 32 x 32)."""
    instr = "nisa.nc_transpose"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    eng = _engine(engine, "tensor", ("tensor", "vector"), instr)
    _access(instr, eng, reads=[("data", data)], writes=[("dst", dst)])
    p, f = data.partitions, data.free_size
    limit = 32 if eng == "vector" else PMAX
    if p > limit or f > limit:
        raise NKIError(instr, f"data shape {data.shape} exceeds [{limit}, {limit}] for the {_ENGINE_NAMES[eng]}",
                       "transpose in blocks")
    if dst.partitions != f or dst.free_size != p:
        raise NKIError(instr, f"dst shape {dst.shape} must be [{f}, {p}] for data {data.shape}")
    _write(dst, _f32_2d(data).T)
    if eng == "tensor":
        _record(instr, eng, [dst], [data], ("matmul", f, p, "float32" if _dt.is_fp32_like(data.dtype)
                                             else "bfloat16"))
    else:
        _record(instr, eng, [dst], [data], ("elementwise", f))


# ---------------------------------------------------------------------------- Vector / Scalar Engines
def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    """dst = data1 <op> data2, element-wise (Vector Engine; GpSimd allowed). Not both inputs in PSUM."""
    instr = "nisa.tensor_tensor"
    dst, a, b = _tensor(dst, instr, "dst"), _tensor(data1, instr, "data1"), _tensor(data2, instr, "data2")
    token = _ops.resolve(op, instr, 2)
    eng = _engine(engine, "vector", ("vector", "gpsimd"), instr)
    _access(instr, eng, reads=[("data1", a), ("data2", b)], writes=[("dst", dst)])
    if a.buffer.kind == "psum" and b.buffer.kind == "psum":
        raise NKIError(instr, "data1 and data2 are both in nl.psum; tensor_tensor may read at most one "
                       "input from PSUM", "copy one of them to SBUF first (nisa.tensor_copy)")
    _same_layout(instr, dst, a, "data1")
    _same_layout(instr, dst, b, "data2")
    _write(dst, token.fn(_f32_2d(a), _f32_2d(b)))
    fast = "psum" in (a.buffer.kind, b.buffer.kind) or (
        token.name in _ops.FAST_BF16 and all(t.dtype == _dt.bfloat16 for t in (dst, a, b)))
    _record(instr, eng, [dst], [a, b], ("tensor_tensor", dst.free_size, fast))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=None, name=None):
    """dst = (data <op0> operand0) <op1> operand1; operands are numbers or [P, 1] tensors
    broadcast along the free axes. `reverse` swaps the operands of that op."""
    instr = "nisa.tensor_scalar"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    eng = _engine(engine, "vector", ("vector", "scalar", "gpsimd"), instr)
    _access(instr, eng, reads=[("data", data)], writes=[("dst", dst)])
    _same_layout(instr, dst, data)
    reads = [data]
    x = _f32_2d(data)
    for op, operand, reverse, role in ((op0, operand0, reverse0, "operand0"), (op1, operand1, reverse1, "operand1")):
        if op is None:
            continue
        fn, tensor = _alu(op, operand, instr, role, data.partitions, eng)
        if tensor is not None:
            reads.append(tensor)
        x = fn(x, reverse)
    _write(dst, x)
    _record(instr, eng, [dst], reads, ("elementwise", dst.free_size))


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """A scan along the free axis, per partition (Vector Engine):
    dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i], with `initial` (a number or a
    [P, 1] tile) in place of dst[:, -1]. `reverse` swaps the operands of that op."""
    instr = "nisa.tensor_tensor_scan"
    dst, a, b = _tensor(dst, instr, "dst"), _tensor(data0, instr, "data0"), _tensor(data1, instr, "data1")
    _access(instr, "vector", reads=[("data0", a), ("data1", b)], writes=[("dst", dst)])
    if a.buffer.kind == "psum" and b.buffer.kind == "psum":
        raise NKIError(instr, "data0 and data1 are both in nl.psum; at most one input may be in PSUM",
                       "copy one of them to SBUF first (nisa.tensor_copy)")
    _same_layout(instr, dst, a, "data0")
    _same_layout(instr, dst, b, "data1")
    t0, t1 = _ops.resolve(op0, instr, 2), _ops.resolve(op1, instr, 2)
    prev, tensor = _scalar_operand(initial, instr, "initial", a.partitions, "vector")
    x, y = _f32_2d(a), _f32_2d(b)
    out = np.empty_like(x)
    prev = np.broadcast_to(np.float32(prev) if tensor is None else prev[:, 0], (a.partitions,))
    for i in range(x.shape[1]):  # a recurrence: one NumPy step per column, all partitions at once
        step = t0.fn(prev, x[:, i]) if reverse0 else t0.fn(x[:, i], prev)
        prev = out[:, i] = t1.fn(y[:, i], step) if reverse1 else t1.fn(step, y[:, i])
    _write(dst, out)
    reads = [a, b] + ([tensor] if tensor is not None else [])
    _record(instr, "vector", [dst], reads, ("tensor_tensor", dst.free_size, "psum" in (a.buffer.kind, b.buffer.kind)))


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False,
                         engine=None, reduce_cmd=None, reduce_op=None, reduce_res=None, name=None):
    """dst = (data <op0> operand0) <op1> operand1, operand0 a number or [P, 1], operand1 a tensor.

    With `reduce_op` or `reduce_res` (AWS, Neuron SDK 2.33) it also reduces dst along the free
    axes through the Vector Engine's accumulation registers, as tensor_scalar_reduce does
    (`reduce_cmd` default reset_reduce; reduce_res, [P, 1], receives the registers)."""
    instr = "nisa.scalar_tensor_tensor"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    other = _tensor(operand1, instr, "operand1")
    eng = _engine(engine, "vector", ("vector", "gpsimd"), instr)
    _access(instr, eng, reads=[("data", data), ("operand1", other)], writes=[("dst", dst)])
    if data.buffer.kind == "psum" and other.buffer.kind == "psum":
        raise NKIError(instr, "data and operand1 are both in nl.psum; at most one input may be in PSUM",
                       "copy one of them to SBUF first (nisa.tensor_copy)")
    _same_layout(instr, dst, data)
    _same_layout(instr, dst, other, "operand1")
    reducing = (reduce_op is not None and reduce_op is not Ellipsis) or reduce_res is not None
    if reducing and eng != "vector":
        raise NKIError(instr, "the reduction (reduce_op / reduce_res) runs on the Vector Engine's accumulation "
                       f"registers, not on the {_ENGINE_NAMES[eng]}", "leave engine= unset or use nisa.vector_engine")
    rtoken = _register_op(instr, None if reduce_op is Ellipsis else reduce_op) if reducing else None
    cmd = _command(reduce_cmd, instr, ("reset", "reduce", "reset_reduce"), "reset_reduce") if reducing else None
    res = _reduce_operand(instr, reduce_res, data.partitions, "vector") if reduce_res is not None else None
    f0, tensor = _alu(op0, operand0, instr, "operand0", data.partitions, eng)
    t1 = _ops.resolve(op1, instr, 2)
    x = f0(_f32_2d(data), reverse0)
    y = _f32_2d(other)
    result = t1.fn(y, x) if reverse1 else t1.fn(x, y)
    _write(dst, result)
    writes = [dst]
    if reducing:
        lanes = _lanes(data)
        _accumulate(instr, "vector", cmd, lanes, rtoken,
                    _partial_reduce(dst, rtoken, result) if cmd != "reset" else None)
        if res is not None:
            _write(res, _read_registers(instr, "vector", lanes))
            writes.append(res)
    reads = [data, other] + ([tensor] if tensor is not None else [])
    _record(instr, eng, writes, reads, ("tensor_tensor", dst.free_size, "psum" in (data.buffer.kind,
                                                                                   other.buffer.kind)))


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=None, name=None):
    """A running reduction along the free axis on the Vector Engine, through its accumulation
    registers (AWS's pseudo code): per partition, `reg` starts as op1's identity (reset_reduce,
    the default; 0 for add and subtract), its current value (reduce) or `imm1` (load_reduce), then
    for each element i: reg = op1(src[i] <op0> imm0, reg); dst[i] = reg. The final reg stays in
    the registers for later Vector Engine accumulation instructions."""
    instr = "nisa.tensor_scalar_cumulative"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    _access(instr, "vector", reads=[("src", src)], writes=[("dst", dst)])
    _same_layout(instr, dst, src, "src")
    for role, t in (("src", src), ("dst", dst)):
        if t.dtype in (_dt.int32, _dt.uint32):
            raise NKIError(instr, f"{role} dtype {_dt.name(t.dtype)} is not supported (AWS: an ISA limitation)",
                           "use a 16-bit integer or a float dtype")
    t0 = _ops.resolve(op0, instr, 2)
    t1 = _ops.resolve(op1, instr, 2)
    if t1.name not in ("add", "subtract", "multiply", "maximum", "minimum"):
        raise NKIError(instr, f"op1 {t1!r} cannot accumulate", "use nl.add, nl.subtract, nl.multiply, nl.maximum "
                       "or nl.minimum")
    cmd = _command(reduce_cmd, instr, ("reduce", "reset_reduce", "load_reduce"), "reset_reduce")
    if (imm1 is not None) != (cmd == "load_reduce"):
        raise NKIError(instr, f"imm1 is the value reduce_cmd=load_reduce loads into the registers; got imm1={imm1!r} "
                       f"with reduce_cmd={cmd}", "pass both reduce_cmd=nisa.reduce_cmd.load_reduce and imm1, or neither")
    reads = [src]
    value, tensor = _scalar_operand(imm0, instr, "imm0", src.partitions, "vector")
    reads += [tensor] if tensor is not None else []
    lanes = _lanes(src)
    regs = _registers(instr, "vector")
    if cmd == "reset_reduce":
        reg = np.full(src.partitions, 0.0 if t1.name == "subtract" else _REGISTER_IDENTITY[t1.name], np.float32)
    elif cmd == "load_reduce":
        init, init_tensor = _scalar_operand(imm1, instr, "imm1", src.partitions, "vector")
        reads += [init_tensor] if init_tensor is not None else []
        reg = np.broadcast_to(np.float32(init) if init_tensor is None else init[:, 0], (src.partitions,)).copy()
    else:
        if _issued() and not regs.known[lanes].all():
            raise NKIError(instr, f"reduce_cmd=reduce continues the Vector Engine's accumulation registers of "
                           f"partitions {lanes.start}..{lanes.stop - 1}, but no instruction of this program has set "
                           "them (their state is unknown)", "start with reduce_cmd=nisa.reduce_cmd.reset_reduce")
        reg = regs.values[lanes].copy()
    x = t0.fn(_f32_2d(src), value)
    keep = _input_keep(src)
    out = np.empty_like(x)
    for i in range(x.shape[1]):  # a recurrence: one NumPy step per column, all partitions at once
        step = t1.fn(x[:, i], reg)
        reg = step if keep is None else np.where(keep[:, i], step, reg)  # masked elements are not read
        out[:, i] = reg
    _write(dst, out)
    if _issued():
        regs.values[lanes] = reg
        regs.known[lanes] = True
    _record(instr, "vector", [dst], reads, ("elementwise", dst.free_size))


# What a masked-out element counts as in a reduction (it is not read).
_IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf,
             "logical_and": 1.0, "logical_or": 0.0}


def _reduce_axes(instr, data, axis):
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % data.ndim for a in axes)
    if 0 in axes:
        raise NKIError(instr, f"axis {axis} includes the partition axis 0; reductions run over free axes only",
                       "transpose (nisa.nc_transpose) to bring the axis onto the free dimension")
    return axes


def reduced_shape(data, axes, keepdims) -> tuple:
    """The shape of `data` reduced over free `axes` (size 1 there with keepdims, else dropped)."""
    if keepdims:
        return tuple(1 if i in axes else s for i, s in enumerate(data.shape))
    return tuple(s for i, s in enumerate(data.shape) if i not in axes)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """dst = reduce(op) of data over free `axis` (int or tuple, never 0) on the Vector Engine."""
    instr = "nisa.tensor_reduce"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    token = _ops.resolve(op, instr, 2)
    if token.reducer is None:
        raise NKIError(instr, f"operator {token!r} cannot reduce", "use nl.add, nl.maximum, nl.minimum or nl.multiply")
    _access(instr, "vector", reads=[("data", data)], writes=[("dst", dst)])
    axes = _reduce_axes(instr, data, axis)
    values = _masked_input(data, _f32(data), _IDENTITY.get(token.name, 0))
    result = token.reducer.reduce(values, axis=axes, keepdims=True).astype(np.float32)
    if negate:
        result = -result
    if dst.partitions != data.partitions or dst.free_size != result.size // data.partitions:
        raise NKIError(instr, f"dst shape {dst.shape} does not match the reduced shape "
                       f"{tuple(1 if i in axes else s for i, s in enumerate(data.shape))}")
    _write(dst, result)
    _record(instr, "vector", [dst], [data], ("reduce", data.free_size))


# ---------------------------------------------------------------------------- accumulation registers
class Accumulators:
    """One engine's accumulation registers (AWS: `reduce_regs`, one 32-bit register per compute
    lane, 128 in all): a float32 value per partition lane, and whether this program has set it.
    They persist across instructions of the engine (`nisa.reduce_cmd`); they live in the program's
    `Run` (`run.accumulators[engine]`) and start unknown in every program of the grid."""

    def __init__(self):
        self.values = np.zeros(PMAX, np.float32)
        self.known = np.zeros(PMAX, bool)


# The reductions the registers accumulate with, and what `reset` sets them to (AWS: the
# reduction's identity; 0 for add, as activation's reset documents).
_REGISTER_OPS = ("add", "multiply", "maximum", "minimum")
_REGISTER_IDENTITY = {"add": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}
_COMMANDS = ("idle", "reset", "reduce", "reset_reduce", "load_reduce")


def _command(value, instr, allowed, default) -> str:
    """A `reduce_cmd=` argument as its member name (None: `default`), refused if the engine does
    not document it."""
    if value is None:
        return default
    name = value.name if isinstance(value, reduce_cmd) else getattr(value, "name", value)
    if name not in _COMMANDS:
        raise NKIError(instr, f"reduce_cmd {value!r} is not a nisa.reduce_cmd member",
                       f"use one of nisa.reduce_cmd.{', nisa.reduce_cmd.'.join(_COMMANDS)}")
    if name not in allowed:
        raise NKIError(instr, f"reduce_cmd={name} is not supported by this instruction",
                       f"use one of nisa.reduce_cmd.{', nisa.reduce_cmd.'.join(allowed)}")
    return name


def _lanes(t: NkiTensor) -> slice:
    """The register lanes an instruction on `t` uses: its partitions (as laid out in memory)."""
    lo = box(t)[0] if t.partial is None and t.data.size else 0
    return slice(lo, lo + t.partitions)


def _registers(instr, eng) -> Accumulators:
    run = current(instr)
    regs = run.accumulators.get(eng)
    if regs is None:
        regs = run.accumulators[eng] = Accumulators()
    return regs


def _accumulate(instr, eng, cmd, lanes, rtoken, partial=None, init=None) -> None:
    """Apply `cmd` to the engine's registers on `lanes`: reset (to rtoken's identity), load `init`,
    then accumulate this instruction's per-partition reduction `partial` with rtoken."""
    if not _issued():
        return
    regs = _registers(instr, eng)
    values, known = regs.values[lanes], regs.known[lanes]
    if cmd in ("reset", "reset_reduce"):
        values[...] = _REGISTER_IDENTITY[rtoken.name] if rtoken is not None else 0.0
        known[...] = True
    elif cmd == "load_reduce":
        values[...] = init
        known[...] = True
    if cmd in ("reduce", "reset_reduce", "load_reduce"):
        if not known.all():
            raise NKIError(instr, f"reduce_cmd={cmd} accumulates onto the {_ENGINE_NAMES[eng]}'s accumulation "
                           f"registers of partitions {lanes.start}..{lanes.stop - 1}, but no instruction of this "
                           "program has set them (their state is unknown)",
                           "start the accumulation with reduce_cmd=nisa.reduce_cmd.reset_reduce (or reset / "
                           "load_reduce)")
        values[...] = rtoken.fn(values, partial.reshape(-1))


def _read_registers(instr, eng, lanes) -> np.ndarray:
    """The registers of `lanes` as a [P, 1] float32 array (what reduce_res receives)."""
    regs = _registers(instr, eng)
    if _issued() and not regs.known[lanes].all():
        raise NKIError(instr, f"reduce_res reads the {_ENGINE_NAMES[eng]}'s accumulation registers of partitions "
                       f"{lanes.start}..{lanes.stop - 1}, but no instruction of this program has set them (their "
                       "state is unknown)", "pass reduce_cmd=nisa.reduce_cmd.reset_reduce to reduce this "
                       "instruction's result into reduce_res")
    return regs.values[lanes].reshape(-1, 1).copy()


def _reduce_operand(instr, reduce_res, partitions, eng):
    res = _tensor(reduce_res, instr, "reduce_res")
    _access(instr, eng, writes=[("reduce_res", res)])
    if res.partitions != partitions or res.free_size != 1:
        raise NKIError(instr, f"reduce_res shape {res.shape} must be [{partitions}, 1]: one value per partition",
                       "allocate it as nl.ndarray((P, 1), ...) or pass a [:, i:i+1] column")
    return res


def _register_op(instr, reduce_op, allowed=_REGISTER_OPS):
    token = _ops.resolve(reduce_op if reduce_op is not None else _ops.BINARY["add"], instr, 2)
    if token.name not in allowed:
        raise NKIError(instr, f"reduce_op {token!r} cannot reduce into the accumulation registers",
                       f"use one of {', '.join('nl.' + n for n in allowed)}")
    return token


def _as_written(t: NkiTensor, values) -> np.ndarray:
    """The float32 `values` an instruction computes for t, cast to t's dtype (the cast on output)
    as [P, F] float32: what the engine's reduction sees. Not read back from t's memory: a
    destination access pattern with a zero step (nki-library's `act.ap([[1, n], [0, H]])`, which
    keeps only one element per partition of the activation it does not need) stores every value
    on the same element, yet the reduction runs over every computed value (AWS: the reduction of
    the activated data / of the tensor_scalar result)."""
    values = np.asarray(values, np.float32).reshape(t.shape)
    cast = np.empty(t.shape, t.data.dtype)
    _dt.cast_into(cast, values, t.dtype)
    return cast.reshape(t.partitions, -1).astype(np.float32, copy=False)


def _partial_reduce(t: NkiTensor, token, values=None) -> np.ndarray:
    """Per-partition reduction of the values written to t (`values`, the instruction's float32
    results, after the cast to t's dtype; without `values`, t's elements), masked-out elements
    excluded: [P, 1] float32."""
    written = _f32_2d(t) if values is None else _as_written(t, values)
    written = _masked_input(t, written, _IDENTITY.get(token.name, 0))
    return token.reducer.reduce(written, axis=1, keepdims=True).astype(np.float32)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=None,
               name=None):
    """dst = op(data * scale + bias) on the Scalar Engine; bias/scale are numbers or [P, 1] tensors.

    The Scalar Engine's accumulation registers (AWS's pseudo code): `reduce_cmd` reset /
    reset_reduce sets them to 0 (the identity of `reduce_op`), reduce / reset_reduce accumulates
    the free-axis reduction of the result (`reduce_op`, default add) onto them, idle (the
    default) leaves them; `reduce_res` ([P, 1]) then receives the registers."""
    instr = "nisa.activation"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    token = _ops.resolve(op, instr, 1)
    _access(instr, "scalar", reads=[("data", data)], writes=[("dst", dst)])
    _same_layout(instr, dst, data)
    cmd = _command(reduce_cmd, instr, ("idle", "reset", "reduce", "reset_reduce"), "idle")
    rtoken = _register_op(instr, reduce_op, ("add", "maximum", "minimum")) if (
        reduce_op is not None or cmd != "idle" or reduce_res is not None) else None
    res = _reduce_operand(instr, reduce_res, data.partitions, "scalar") if reduce_res is not None else None
    reads = [data]
    x = _f32_2d(data)
    s, st = _scalar_operand(scale, instr, "scale", data.partitions, "scalar")
    if st is not None or s != 1.0:
        x = x * s
    if bias is not None:
        b, bt = _scalar_operand(bias, instr, "bias", data.partitions, "scalar")
        x = x + b
        reads += [t for t in (bt,) if t is not None]
    reads += [t for t in (st,) if t is not None]
    y = token.fn(x)
    _write(dst, y)
    writes = [dst]
    lanes = _lanes(data)
    if cmd != "idle":
        partial = _partial_reduce(dst, rtoken, y) if cmd != "reset" else None
        _accumulate(instr, "scalar", cmd, lanes, rtoken, partial)
    if res is not None:
        _write(res, _read_registers(instr, "scalar", lanes))
        writes.append(res)
    _record(instr, "scalar", writes, reads, ("elementwise", dst.free_size))


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """nisa.activation with reduce_cmd=reset_reduce (AWS: kept for backward compatibility)."""
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=reduce_cmd.reset_reduce)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False, reduce_cmd=None,
                         reduce_init=None, reduce_res_negate=False, name=None):
    """dst = data <op0> operand0 (a number or a [P, 1] tensor; `reverse0` swaps the operands) on
    the Vector Engine, and the free-axis reduction of dst (`reduce_op`: add, multiply, maximum,
    minimum) into `reduce_res` ([P, 1]).

    `reduce_cmd` drives the Vector Engine's accumulation registers: reset_reduce (the default)
    resets them to the reduction's identity and reduces into them, reduce accumulates onto them,
    load_reduce loads `reduce_init` (a number or [P, 1]) first, reset only resets; reduce_res then
    receives the registers (negated with `reduce_res_negate`). idle leaves the registers out:
    reduce_res receives this instruction's reduction, and the registers' state becomes unknown
    (AWS: an idle instruction may still modify them)."""
    instr = "nisa.tensor_scalar_reduce"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    _access(instr, "vector", reads=[("data", data)], writes=[("dst", dst)])
    _same_layout(instr, dst, data)
    if data.ndim > 4 or dst.ndim > 4:
        raise NKIError(instr, f"data {data.shape} / dst {dst.shape} have more than three free dimensions",
                       "reshape the tiles to at most [P, a, b, c]")
    rtoken = _register_op(instr, reduce_op)
    cmd = _command(reduce_cmd, instr, _COMMANDS, "reset_reduce")
    res = _reduce_operand(instr, reduce_res, data.partitions, "vector") if reduce_res is not None else None
    if cmd == "idle" and res is None:
        raise NKIError(instr, "reduce_cmd=idle keeps no reduction in the registers, and reduce_res is None, "
                       "so the reduction would be lost", "pass reduce_res, or reduce_cmd=reset_reduce / reduce "
                       "to keep the result in the accumulation registers")
    if (reduce_init is not None) != (cmd == "load_reduce"):
        raise NKIError(instr, "reduce_init is the value reduce_cmd=load_reduce loads into the registers; "
                       f"got reduce_init={reduce_init!r} with reduce_cmd={cmd}",
                       "pass both reduce_cmd=nisa.reduce_cmd.load_reduce and reduce_init, or neither")
    reads = [data]
    f0, tensor = _alu(op0, operand0, instr, "operand0", data.partitions, "vector")
    if tensor is not None:
        reads.append(tensor)
    init = None
    if reduce_init is not None:
        init, init_tensor = _scalar_operand(reduce_init, instr, "reduce_init", data.partitions, "vector")
        init = np.broadcast_to(init, (data.partitions, 1)).reshape(-1)
        if init_tensor is not None:
            reads.append(init_tensor)
    result = f0(_f32_2d(data), reverse0)
    _write(dst, result)
    writes = [dst]
    lanes = _lanes(data)
    partial = _partial_reduce(dst, rtoken, result) if cmd != "reset" else None
    if cmd == "idle":
        out = partial
        if _issued():
            _registers(instr, "vector").known[lanes] = False
    else:
        _accumulate(instr, "vector", cmd, lanes, rtoken, partial, init)
        out = _read_registers(instr, "vector", lanes) if res is not None else None
    if res is not None:
        _write(res, -out if reduce_res_negate else out)
        writes.append(res)
    _record(instr, "vector", writes, reads, ("elementwise", dst.free_size, MIN_II))


def reciprocal(dst, data, name=None):
    """dst = 1 / data on the Vector Engine."""
    instr = "nisa.reciprocal"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    _access(instr, "vector", reads=[("data", data)], writes=[("dst", dst)])
    _same_layout(instr, dst, data)
    _write(dst, _ops.UNARY["reciprocal"].fn(_f32_2d(data)))
    _record(instr, "vector", [dst], [data], ("reciprocal", dst.free_size))


def dropout(dst, data, prob, name=None):
    """dst = data with each element replaced by 0 with probability `prob` (a number or a [P, 1]
    tile), on the Vector Engine; kept elements are not rescaled. The draws come from the launch's
    NumPy generator (`nl.random_seed`), not the hardware's: only the statistics match."""
    instr = "nisa.dropout"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    _access(instr, "vector", reads=[("data", data)], writes=[("dst", dst)])
    _same_layout(instr, dst, data)
    p, pt = _scalar_operand(prob, instr, "prob", data.partitions, "vector")
    x = _f32_2d(data)
    keep = random_generator(instr).random(x.shape, dtype=np.float32) >= p
    _write(dst, np.where(keep, x, np.float32(0)))
    _record(instr, "vector", [dst], [data] + ([pt] if pt is not None else []), ("elementwise", dst.free_size))


def random_generator(instr) -> np.random.Generator:
    """The launch's random generator: seeded by nl.random_seed, else with 0 (repeatable runs)."""
    run = current(instr)
    if run.rng is None:
        run.rng = np.random.default_rng(0)
    return run.rng


# ---------------------------------------------------------------------------- GpSimd Engine
def _affine(instr, dst, pattern, offset, channel_multiplier):
    """offset + channel_multiplier * p + sum(step_i * j_i) over dst's [P, num_1, num_2, ...] grid."""
    try:
        pairs = [(int(step), int(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise NKIError(instr, f"pattern {pattern!r} must be a list of [step, num] pairs, one per free axis") from None
    if math.prod(num for _, num in pairs) != dst.free_size:
        raise NKIError(instr, f"pattern {pattern!r} covers {math.prod(num for _, num in pairs)} elements per "
                       f"partition, dst has {dst.free_size}")
    p = dst.partitions
    value = np.float32(offset) + np.float32(channel_multiplier) * np.arange(p, dtype=np.float32).reshape(
        (p,) + (1,) * len(pairs))
    for axis, (step, num) in enumerate(pairs):
        shape = [1] * (len(pairs) + 1)
        shape[axis + 1] = num
        value = value + (np.float32(step) * np.arange(num, dtype=np.float32)).reshape(shape)
    return value.reshape(p, -1)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """dst[p, j...] = offset + channel_multiplier * p + sum(step_i * j_i), `pattern` = [[step, num], ...]."""
    instr = "nisa.iota"
    dst = _tensor(dst, instr, "dst")
    _access(instr, "gpsimd", writes=[("dst", dst)])
    _write(dst, _affine(instr, dst, pattern, offset, channel_multiplier))
    _record(instr, "gpsimd", [dst], [], ("gpsimd", dst.free_size))


def affine_select(dst, pattern, offset=0, channel_multiplier=0, on_true_tile=None, on_false_value=None,
                  cmp_op=None, name=None):
    """dst = on_true_tile where cmp_op(affine expression, 0) else on_false_value (GpSimd Engine).
    The expression is the iota one; cmp_op defaults to nl.greater_equal (causal masks). AWS's
    reference lists offset as required; nki-library's kernels (cascaded_max) omit it: 0 here."""
    if on_true_tile is None or on_false_value is None:
        raise NKIError("nisa.affine_select", "on_true_tile and on_false_value are required")
    token = _ops.resolve(cmp_op if cmp_op is not None else _ops.BINARY["greater_equal"], "nisa.affine_select", 2)
    select_where(dst, on_true_tile, on_false_value, lambda d: token.fn(
        _affine("nisa.affine_select", d, pattern, offset, channel_multiplier), np.float32(0)) != 0)


def select_where(dst, on_true_tile, on_false_value, keep):
    """affine_select's checks and data path: dst = on_true_tile where `keep(dst)` (a boolean of
    dst's [P, F] layout) holds, else on_false_value (GpSimd). The value-returning form passes its
    predicate (a comparison of index expressions) here."""
    instr = "nisa.affine_select"
    dst = _tensor(dst, instr, "dst")
    src = _tensor(on_true_tile, instr, "on_true_tile")
    reads = [("on_true_tile", src)]
    if src.buffer.kind == "psum" and in_nki_0_1_kernel():
        # NKI 0.1.0 took a PSUM on_true_tile: its reference stated no buffer rule for affine_select,
        # and AWS's own 0.1.0 kernels (the 2.20 SD attention tutorial's causal mask, nki-samples'
        # flash attention) select straight from the matmul's PSUM tile. NKI 0.2.0+'s reference:
        # "GpSimd Engine cannot access PSUM", which the check below keeps for `import nki` kernels.
        _drain(src)
        reads = []
    _access(instr, "gpsimd", reads=reads, writes=[("dst", dst)])
    _same_layout(instr, dst, src, "on_true_tile")
    where = np.asarray(keep(dst)).reshape(dst.partitions, -1)
    _write(dst, np.where(where, _f32_2d(src), np.float32(on_false_value)))
    _record(instr, "gpsimd", [dst], [src], ("gpsimd", dst.free_size))


def select(dst, condition, on_true, on_false, instr="nl.where"):
    """dst = on_true where condition is nonzero, else on_false, element-wise (Vector Engine;
    nl.where's data path). on_true / on_false are tiles of dst's layout or numbers."""
    dst, cond = _tensor(dst, instr, "dst"), _tensor(condition, instr, "condition")
    operands = [("x", on_true), ("y", on_false)]
    tiles = [(role, t) for role, t in operands if isinstance(t, NkiTensor)]
    _access(instr, "vector", reads=[("condition", cond), *tiles], writes=[("dst", dst)])
    if sum(t.buffer.kind == "psum" for t in [cond, *(t for _, t in tiles)]) > 1:
        raise NKIError(instr, "more than one input is in nl.psum; the Vector Engine reads at most one input "
                       "from PSUM", "copy the others to SBUF first (nisa.tensor_copy)")
    _same_layout(instr, dst, cond, "condition")
    values = []
    for role, t in operands:
        if isinstance(t, NkiTensor):
            _same_layout(instr, dst, t, role)
            values.append(_f32_2d(t))
        elif isinstance(t, (int, float, np.number, bool)):
            values.append(np.float32(t))
        else:
            raise NKIError(instr, f"{role} must be a tile or a number, got {type(t).__name__}")
    _write(dst, np.where(_f32_2d(cond) != 0, values[0], values[1]))
    _record(instr, "vector", [dst], [cond, *(t for _, t in tiles)], ("tensor_tensor", dst.free_size, False))


# ---------------------------------------------------------------------------- statistics
def bn_stats(dst, data, name=None):
    """Per-partition statistics of data[P, F] (F <= 512) for bn_aggr: dst[P, 6] =
    (count, mean, sum of squared deviations, 0, 0, 0). Several chunks go side by side in one tile."""
    instr = "nisa.bn_stats"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    _access(instr, "vector", reads=[("data", data)], writes=[("dst", dst)])
    f = data.free_size
    if f > BN_STATS_FMAX:
        raise NKIError(instr, f"data has {f} elements per partition, more than nl.tile_size.bn_stats_fmax "
                       f"({BN_STATS_FMAX})", "call bn_stats per chunk into slices of one stats tile")
    if dst.partitions != data.partitions or dst.free_size != BN_STATS_DIM:
        raise NKIError(instr, f"dst shape {dst.shape} must be [{data.partitions}, {BN_STATS_DIM}]")
    x = _f32_2d(data).astype(np.float64)
    keep = _input_keep(data)  # a masked-out element is not read: not counted either
    keep = np.ones(x.shape, bool) if keep is None else keep
    count = keep.sum(axis=1)
    mean = np.where(keep, x, 0.0).sum(axis=1) / np.maximum(count, 1)
    m2 = np.where(keep, (x - mean[:, None]) ** 2, 0.0).sum(axis=1)
    stats = np.zeros((data.partitions, BN_STATS_DIM), dtype=np.float32)
    stats[:, 0], stats[:, 1], stats[:, 2] = count, mean, m2
    _write(dst, stats)
    _record(instr, "vector", [dst], [data], ("reduce", f))


def bn_aggr(dst, data, name=None):
    """Combine bn_stats chunks data[P, 6 * k] into dst[P, 2] = (mean, variance) (population variance)."""
    instr = "nisa.bn_aggr"
    dst, data = _tensor(dst, instr, "dst"), _tensor(data, instr, "data")
    _access(instr, "vector", reads=[("data", data)], writes=[("dst", dst)])
    if data.free_size % BN_STATS_DIM:
        raise NKIError(instr, f"data has {data.free_size} elements per partition, not a multiple of "
                       f"{BN_STATS_DIM} (bn_stats chunks)")
    if dst.partitions != data.partitions or dst.free_size != BN_AGGR_DIM:
        raise NKIError(instr, f"dst shape {dst.shape} must be [{data.partitions}, {BN_AGGR_DIM}]")
    chunks = _f32_2d(data).astype(np.float64).reshape(data.partitions, -1, BN_STATS_DIM)
    count, mean, m2 = chunks[..., 0], chunks[..., 1], chunks[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total > 0, total, 1)
    grand = (count * mean).sum(axis=1) / safe
    # Chan et al.: M2 of the union = sum of M2 + sum n_i (mean_i - grand mean)^2.
    m2_total = m2.sum(axis=1) + (count * (mean - grand[:, None]) ** 2).sum(axis=1)
    _write(dst, np.stack([grand, m2_total / safe], axis=1).astype(np.float32))
    _record(instr, "vector", [dst], [data], ("reduce", data.free_size))


_MASKED = ("dma_copy", "tensor_copy", "memset", "nc_matmul", "nc_transpose", "tensor_tensor", "tensor_tensor_scan",
           "tensor_scalar", "tensor_scalar_reduce", "tensor_scalar_cumulative",
           "scalar_tensor_tensor", "tensor_reduce", "activation", "activation_reduce", "reciprocal", "iota",
           "affine_select", "bn_stats", "bn_aggr", "dropout")
from . import value_forms as _value_forms  # noqa: E402 - the older forms call the instructions above

for _name in _MASKED:
    _fn = globals()[_name]
    if _name in _value_forms.OLDER:
        _fn = _value_forms.both_forms(_fn, _value_forms.OLDER[_name], f"nisa.{_name}")
    globals()[_name] = accepts_mask(_fn, f"nisa.{_name}")
del _name, _fn

from .mx import nc_matmul_mx, quantize_mx  # noqa: E402,F401 - NeuronCore-v4 MX instructions (isa/mx.py)
from .small import dma_transpose, get_nc_version, max8, nc_find_index8, nc_match_replace8, nc_n_gather, nc_stream_shuffle, nc_version, nonzero_with_count  # noqa: E402,F401 - isa/small.py
from .lnc import core_barrier, sendrecv  # noqa: E402,F401 - cross-core instructions of LNC 2 (isa/lnc.py)
from .registers import VirtualRegister, register_alloc, register_load, register_move, register_store  # noqa: E402,F401 - isa/registers.py
from .extra import (activate2, dma_compute, exponential, local_gather, range_select, select_reduce,  # noqa: E402,F401
                    sequence_bounds, tensor_copy_dynamic_dst, tensor_copy_dynamic_src, tensor_copy_predicated,
                    tensor_partition_reduce)
from .rng import rand2, rand_get_state, rand_set_state, rng, set_rng_seed  # noqa: E402,F401 - isa/rng.py

# The previous reference's value-returning forms (`res = nisa.local_gather(src, index)`).
from . import extra as _extra  # noqa: E402
for _name in ("tensor_partition_reduce", "local_gather", "sequence_bounds", "range_select"):
    globals()[_name] = _value_forms.both_forms(globals()[_name], getattr(_extra, _name + "_value"), f"nisa.{_name}")

# The older dialect's mask= for the instructions its reference documents with one.
tensor_copy_predicated = accepts_mask(tensor_copy_predicated, "nisa.tensor_copy_predicated")
tensor_copy_dynamic_src = accepts_mask(tensor_copy_dynamic_src, "nisa.tensor_copy_dynamic_src")
tensor_copy_dynamic_dst = accepts_mask(tensor_copy_dynamic_dst, "nisa.tensor_copy_dynamic_dst")


# ---------------------------------------------------------------------------- instruction handles
class NkiInstruction:
    """AWS's handle to an issued instruction, what a destination-form `nki.isa` call returns.
    `consumer.depends_on(*producers)` adds scheduling edges: the consumer starts after every
    producer has finished (AWS: a hardware semaphore wait). The simulator executes instructions in
    program order, so an edge changes only the cost model's schedule; a producer issued after its
    consumer cannot be honoured and is an NKIError. An instruction the mask left unissued has no
    record, and its edges are dropped."""

    __slots__ = ("_record", "_trace")

    def __init__(self, handle, trace=None):
        self._record = handle
        self._trace = trace

    def depends_on(self, *producers: "NkiInstruction") -> "NkiInstruction":
        instr = "NkiInstruction.depends_on"
        for producer in producers:
            if not isinstance(producer, NkiInstruction):
                raise NKIError(instr, f"a producer must be an NkiInstruction (what an nki.isa call returns), got "
                               f"{type(producer).__name__}", "pass the value an nki.isa call returned")
        me = self._record
        for producer in producers:
            other = producer._record
            if me is None or other is None:
                continue
            if producer._trace is not self._trace:
                raise NKIError(instr, "the producer was issued by another kernel launch")
            if other.index >= me.index:
                what = "itself" if other is me else f"an instruction issued after it ({other.op})"
                raise NKIError(instr, f"{me.op} cannot wait for {what}: the simulator runs instructions in program "
                               "order, so a producer must be issued before its consumer",
                               "issue the producer first, then call consumer.depends_on(producer)")
            if other.index not in me.after:
                me.after = me.after + (other.index,)
        return self

    def __repr__(self):
        return f"NkiInstruction({self._record!r})"


def _returns_instruction(fn):
    """Make a destination-form instruction return its NkiInstruction (value forms keep their tile)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        run = active()
        if run is None:
            return fn(*args, **kwargs)
        run.last_record = None
        result = fn(*args, **kwargs)
        if result is None:
            return NkiInstruction(run.last_record, run.trace)
        return result

    return wrapper


for _name in (*_MASKED, "nc_matmul_mx", "quantize_mx", "dma_transpose", "max8", "nc_find_index8",
              "nc_match_replace8", "nc_n_gather", "nc_stream_shuffle", "nonzero_with_count", "core_barrier",
              "sendrecv", "activate2", "dma_compute", "exponential", "local_gather", "range_select",
              "select_reduce", "sequence_bounds", "tensor_copy_predicated", "tensor_partition_reduce", "rng",
              "rand2", "rand_set_state", "rand_get_state", "set_rng_seed"):
    globals()[_name] = _returns_instruction(globals()[_name])
del _name
