"""`nki.language` (`nl`): buffers, dtypes, tile sizes, allocation, loops, program ids, and the
tile-level helpers (`nl.load`, `nl.store`, `nl.matmul`, math and reductions) built on `nki.isa`.

Helpers return new tiles: SBUF for element-wise results and reductions, PSUM for `nl.matmul`
and `nl.transpose` (the Tensor Engine writes only PSUM).
"""

from __future__ import annotations

import builtins
import itertools
import math
import operator
import types

import ml_dtypes
import numpy as np

from . import isa as _isa
from . import elementwise as _ops
from .dtypes import (bfloat16, bool_, dtype, float8_e4m3, float8_e4m3fn, float8_e5m2, float16, float32, int8,
                     int16, int32, tfloat32, uint8, uint16, uint32)
from .dtypes import float4_e2m1fn_x4, float8_e4m3fn_x4, float8_e5m2_x4, float8_e8m0fnu  # MX (trn3)
from . import allocation as _allocation
from . import dtypes as _dt
from .errors import NKIError
from .indexing import arange, mgrid
from .objects import NKIObject
from .runtime import ParDim, active, current
from .shared_constant import shared_constant
from .spmd import nc, spmd_dim
from .tensor import NkiTensor, box, ds, hbm, private_hbm, psum, sbuf, shared_hbm

class _TileSize:
    """`nl.tile_size`: the hardware's tile limits. The fixed ones are attributes; the ones that
    depend on the NeuronCore generation are read from the target being simulated (the running
    launch's, else the one NEURON_PLATFORM_TARGET_OVERRIDE selects), as AWS's are per target."""

    pmax = 128
    psum_fmax = 512              # FP32 elements per PSUM bank per partition (AWS: deprecated name)
    psum_bank_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = _isa.BN_STATS_FMAX
    bn_stats_dim = _isa.BN_STATS_DIM
    bn_aggr_dim = _isa.BN_AGGR_DIM

    @staticmethod
    def _target():
        from .runtime import active
        from .targets import get_target

        run = active()
        return run.target if run is not None else get_target()

    @property
    def psum_bank_bytes(self) -> int:
        return self._target().psum_bank_bytes

    psum_fmax_bytes = psum_bank_fmax_bytes = psum_bank_bytes

    @property
    def psum_partition_bytes(self) -> int:
        return self._target().psum_bytes_per_partition

    @property
    def psum_num_banks(self) -> int:
        return self._target().psum_banks

    @property
    def total_available_sbuf_size(self) -> int:
        """Usable SBUF bytes per partition: the capacity the simulator's allocator enforces (AWS
        subtracts bytes its runtime reserves, an amount it does not document; nothing is reserved here)."""
        return self._target().sbuf_bytes_per_partition

    sbuf_fmax_bytes = total_available_sbuf_size

    @property
    def sbuf_fmax(self) -> int:
        return self._target().sbuf_bytes_per_partition // 4

    @property
    def sbuf_size_bytes(self) -> int:
        return self.pmax * self._target().sbuf_bytes_per_partition

    def __repr__(self):
        names = ("pmax", "psum_fmax", "gemm_stationary_fmax", "gemm_moving_fmax", "bn_stats_fmax",
                 "psum_num_banks", "total_available_sbuf_size")
        return "nl.tile_size(" + ", ".join(f"{n}={getattr(self, n)}" for n in names) + ")"


tile_size = _TileSize()


class fp32:  # noqa: N801 - the NKI name
    """`nl.fp32.min`: the most negative finite float32 (bit pattern 0xff7fffff). Kernels fill masked
    positions with it rather than -inf, whose arithmetic (inf - inf = NaN) would spoil a softmax."""

    min = float(np.finfo(np.float32).min)


def static_cast(x, dtype):
    """`nl.static_cast(array, dtype)`: a host-side NumPy array cast to an NKI dtype, as AWS's tests
    prepare inputs (float64 data to bfloat16 / fp8). Floats round to nearest even; integers round and
    saturate, as an instruction's output cast does (`dtypes.cast_into`). A packed MX type packs four
    values of the last axis per element ([..., 4F] -> [..., F], each value rounded to nearest even
    into the element type); a packed host array cast to another type is unpacked first."""
    d = _dt.normalize(dtype, "nl.static_cast")
    if isinstance(x, NkiTensor):
        raise NKIError("nl.static_cast", "casts a host NumPy array, not a kernel tile",
                       "cast a tile with nl.copy(x, dtype=...) or nisa.tensor_copy into a tile of that dtype")
    x = np.asarray(x)
    packed = _dt.packed_host(x.dtype)
    if packed is not None:  # a packed MX host array: its values, [..., F] -> [..., 4F]
        if d is packed:
            return x
        x = packed.unpack(x)
    if _dt.is_packed(d):  # four values per container along the last axis: [..., 4F] -> [..., F]
        if not x.ndim or x.shape[-1] % 4:
            raise NKIError("nl.static_cast", f"packing into {_dt.name(d)} takes a last axis that is a multiple of "
                           f"4, got shape {x.shape}", "group four values per packed element on the last axis")
        return d.pack(x.astype(np.float32)).view(d.host)
    if _dt.is_float(d) and d is not tfloat32:
        return x.astype(d)
    out = np.empty(x.shape, _dt.storage_dtype(d))
    _dt.cast_into(out, x.astype(np.float32), d)
    return out


def finfo(dtype):
    """`nl.finfo(dtype)`: the limits of a float dtype (`.min`, `.max`, `.eps`, `.tiny`, `.bits`), as
    np.finfo, also for bfloat16 and the fp8 types."""
    d = _dt.normalize(dtype, "nl.finfo")
    if not _dt.is_float(d) or d is tfloat32:
        raise NKIError("nl.finfo", f"no float limits for {_dt.name(d)}",
                       "pass a float dtype: float32, bfloat16, float16, float8_e4m3, float8_e4m3fn, float8_e5m2")
    return ml_dtypes.finfo(d)


# ---------------------------------------------------------------------------- allocation
def ndarray(shape, dtype, buffer=sbuf, name=None, address=None) -> NkiTensor:
    """A new tensor, uninitialized (NaN-filled, as the simulator poisons fresh memory).
    `buffer=nki.compiler.sbuf.mod_alloc(...)` or `address=(partition, byte)`: direct allocation."""
    return current("nl.ndarray").allocate(shape, dtype, buffer, name, address=address)


def _new(shape, dtype, buffer, name, instruction) -> NkiTensor:
    """Allocate a helper's result; capacity/shape errors name the helper the kernel called."""
    return current(instruction).allocate(shape, dtype, buffer, name, instruction=instruction)


def zeros(shape, dtype, buffer=sbuf, name=None, lazy_initialization=False) -> NkiTensor:
    return full(shape, 0, dtype, buffer, name)


def ones(shape, dtype, buffer=sbuf, name=None, lazy_initialization=False) -> NkiTensor:
    return full(shape, 1, dtype, buffer, name)


def full(shape, fill_value, dtype, buffer=sbuf, name=None, lazy_initialization=False) -> NkiTensor:
    """A tensor filled with `fill_value`; on chip this is an nisa.memset (costed), in HBM free.
    `lazy_initialization` (AWS's older reference kernels pass it, e.g. True for a PSUM accumulator
    whose first matmul starts the group) is accepted; the tile is filled either way, which gives
    the same values."""
    run = current("nl.full")
    t = run.allocate(shape, dtype, buffer, name, instruction="nl.full")
    if _allocation.is_direct(run, t):  # blocks placed by the kernel: fill each, never the whole memory
        for tile in _allocation.blocks(t):
            _isa.memset(tile, fill_value)
    elif t.buffer.on_chip:
        _isa.memset(t.physical(), fill_value)  # a block tensor is filled as its one stored tile
    else:
        _dt.cast_into(t.data, np.float32(fill_value), t.dtype)
    return t


def zeros_like(t, dtype=None, buffer=None, name=None):
    return zeros(t.shape, dtype or t.dtype, buffer or t.buffer, name)


def ndarray_like(t, dtype=None, buffer=None, name=None):
    return ndarray(t.shape, dtype or t.dtype, buffer or t.buffer, name)


def par_dim(n):
    """The older dialect's marker of the partition axis in a shape: `(nl.par_dim(128), 512)`, or after
    block axes, `(4, nl.par_dim(128), 512)`: four [128, 512] tiles, `t[b]` each."""
    return ParDim(n)


# ---------------------------------------------------------------------------- launch and loops
def program_id(axis=0) -> int:
    run = current("nl.program_id")
    if not 0 <= axis < builtins.max(1, len(run.grid)):
        raise NKIError("nl.program_id", f"axis {axis} is outside the launch grid {run.grid}")
    return run.program_id[axis] if run.grid else 0


def num_programs(axes=None):
    run = current("nl.num_programs")
    grid = run.grid or (1,)
    if axes is None:
        return math.prod(grid)
    if isinstance(axes, int):
        return grid[axes] if axes < len(grid) else 1
    return tuple(grid[a] for a in axes)


def program_ndim() -> int:
    return len(current("nl.program_ndim").grid)


def affine_range(start, stop=None, step=1, directives=None, precise_schedule=None):
    """Iterations without loop-carried dependencies (the compiler may reorder/pipeline them).
    Resolved at trace time: a Python range. `precise_schedule` (a scheduling hint nki-samples'
    contributed pipelined_attention passes; not in AWS's reference) is accepted and not acted on.
    In a kernel written for NKI 0.1.0 its body is traced once for direct allocation (v0_1.py)."""
    return _nl_loop(builtins.range(start, stop, step) if stop is not None else builtins.range(start))


def sequential_range(start, stop=None, step=1, directives=None):
    """Iterations that must run in order (loop-carried dependency). A Python range (in a kernel
    written for NKI 0.1.0, traced once for direct allocation: v0_1.py)."""
    return _nl_loop(builtins.range(start, stop, step) if stop is not None else builtins.range(start))


def _nl_loop(iterations: range):
    run = active()
    return iterations if run is None or run.loop_trace is None else run.loop_trace.loop(iterations)


def static_range(start, stop=None, step=1, directives=None):
    """Fully unrolled loop. A Python range."""
    return builtins.range(start, stop, step) if stop is not None else builtins.range(start)


def _bound(value, role):
    from .isa.registers import VirtualRegister

    if isinstance(value, VirtualRegister):
        return value.get("nl.dynamic_range")
    try:
        return operator.index(value)
    except TypeError:
        raise NKIError("nl.dynamic_range", f"{role} must be an integer or a register (nisa.register_alloc), "
                       f"got {value!r}") from None


def dynamic_range(start, stop=None, step=1):
    """`nl.dynamic_range`: a loop whose bounds are known only on the device: `start` / `stop` may be
    registers (nisa.register_alloc); `step` is a positive integer constant (AWS). The simulator
    reads the registers when the loop starts (they hold their values here) and runs a Python range."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step <= 0:
        raise NKIError("nl.dynamic_range", f"step must be a positive integer constant, got {step!r}",
                       "registers may bound the loop (start, stop), not step it")
    if stop is None:
        return builtins.range(_bound(start, "stop"))
    return builtins.range(_bound(start, "start"), _bound(stop, "stop"), int(step))


def fori_loop(lower, upper, body_fun, step=1):
    """`nl.fori_loop`: `body_fun(i)` for i in dynamic_range(lower, upper, step), i passed as a
    register (AWS: by value; writing it does not change the loop)."""
    from .isa.registers import VirtualRegister

    _check_reorder("nl.fori_loop")
    for i in dynamic_range(lower, upper, step):
        body_fun(VirtualRegister(i))


def range(start, stop=None, step=1, directives=None):  # noqa: A001 - the NKI name
    """`nl.range`: a loop iterator like the three above (nki-library's experimental kernels use
    it). Resolved at trace time: a Python range."""
    return builtins.range(start, stop, step) if stop is not None else builtins.range(start)


def shared_identity_matrix(n, dtype=uint8, dst=None, name=None):
    """`nl.shared_identity_matrix(n, dtype=nl.uint8)`: an [n, n] identity matrix in SBUF (AWS shares
    one per dtype among the kernel's uses; here each call fills its own tile, recorded as one DMA of
    the constant from HBM). n is the partition count, 1..128. `dst=`: an SBUF [n, n] tile to fill
    instead of a new one (it is also returned)."""
    instr = "nl.shared_identity_matrix"
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= tile_size.pmax:
        raise NKIError(instr, f"n={n!r} must be an int from 1 to {tile_size.pmax}: the matrix's rows are "
                       "SBUF partitions", "build larger identities from 128 x 128 blocks")
    n = int(n)
    if dst is None:
        dst = _new((n, n), dtype, sbuf, name, instr)
    else:
        dst = _isa._tensor(dst, instr, "dst")
        if dst.buffer.kind != "sbuf" or tuple(dst.shape) != (n, n):
            raise NKIError(instr, f"dst must be an SBUF [{n}, {n}] tile, got {dst.shape} in {dst.buffer!r}",
                           f"allocate it with nl.ndarray(({n}, {n}), dtype, buffer=nl.sbuf)")
    _isa._write(dst, np.eye(n, dtype=np.float32))
    _isa._record(instr, "dma", [dst], [], ("dma", dst.nbytes, dst.nbytes / n), nbytes=dst.nbytes)
    return dst


# ---------------------------------------------------------------------------- data movement
def load(src, dtype=None, name=None) -> NkiTensor:
    """Copy an HBM view into a new SBUF tile (one DMA). A single element (`a[0, 0]`, a view with
    no axis left) loads into a [1, 1] tile, as AWS documents (`a_tile: tensor[1, 1] =
    nl.load(a[0, 0])`; on-chip tensors keep a partition axis)."""
    src = _isa._tensor(src, "nl.load", "src")
    tile = _new(src.shape or (1, 1), dtype or src.dtype, sbuf, name, "nl.load")
    _isa.dma_copy(tile, src)
    return tile


def load_transpose2d(src, dtype=None, name=None) -> NkiTensor:
    """Load an HBM view [F, P] into a new SBUF tile [P, F], transposed by the DMA's access pattern."""
    src = _isa._tensor(src, "nl.load_transpose2d", "src")
    if src.ndim != 2:
        raise NKIError("nl.load_transpose2d", f"src must be 2-D, got shape {src.shape}")
    return load(src.T, dtype=dtype, name=name)


def store(dst, value) -> None:
    """Copy an SBUF tile into an HBM view (one DMA). A PSUM tile is first copied to SBUF
    (nisa.tensor_copy), as AWS documents for nl.store ("If the tile is in PSUM, an extra copy will
    be performed to move the tile to SBUF first"); nisa.dma_copy itself never reads PSUM."""
    _isa.dma_copy(dst, _from_psum(value, "nl.store"))


def _from_psum(x, instruction):
    """x, or for a PSUM tile a copy of it in SBUF: the extra copy AWS's nl-level helpers insert."""
    if isinstance(x, NkiTensor) and x.buffer.kind == "psum":
        out = _new(x.shape, x.dtype, sbuf, None, instruction)
        _isa.tensor_copy(out, x)
        return out
    return x


def _copy_tile(x, dtype=None, name=None) -> NkiTensor:
    """A copy of an on-chip tile (optionally cast) in a new SBUF tile (nisa.tensor_copy)."""
    x = _isa._tensor(x, "nl.copy", "x")
    out = _new(x.shape, dtype or x.dtype, sbuf, name, "nl.copy")
    _isa.tensor_copy(out, x)
    return out


def assign(dst, value) -> None:
    """The older dialect's write `t[index] = value` (dst is the view `t[index]`, on chip).

    A tile that the latest instruction produced (`t[i] = nl.exp(x)`) is that instruction's output:
    it is written into dst and the instruction is recorded as writing dst, as AWS's compiler makes
    the assignment target the destination. Any other tile is copied (nisa.tensor_copy), a number is
    a memset. Only the elements the producing instruction's mask= wrote are written."""
    instr = "tensor assignment"
    if not isinstance(dst, NkiTensor) or not dst.buffer.on_chip:
        raise NKIError(instr, f"cannot assign into {dst.buffer!r} with []",
                       "write HBM with nl.store(dst[...], value) or nisa.dma_copy")
    if isinstance(value, _LoopReduce):
        x = value.x.reshape(dst.shape) if value.x.shape != dst.shape else value.x
        with _isa.masked(value.mask):
            _isa.tensor_tensor(dst, dst, x, value.token)
        return
    if isinstance(value, NkiTensor):
        if dst.same_view(value):
            return  # `t[i] += x` already wrote t[i]
        valid = value.alloc.valid if value.data is value.alloc.storage else None
        where = None if valid is None else np.broadcast_to(valid.reshape(dst.shape), dst.shape)
        if not _retarget(dst, value, where):
            with _isa.masked(None if where is None else where):
                _isa.tensor_copy(dst, value)
    elif isinstance(value, (int, float, np.number, bool)):
        _isa.memset(dst, value)
    else:
        raise NKIError(instr, f"cannot assign a {type(value).__name__} to a tile",
                       "assign a tile (the result of an nl / nisa call) or a number")


def _retarget(dst, value, where) -> bool:
    """Make the latest instruction, which wrote the whole temporary tile `value`, write dst instead."""
    trace = current("tensor assignment").trace
    last = trace[-1] if trace else None
    aid = value.alloc.id
    if (last is None or value.data is not value.alloc.storage or value.partial is not None
            or not any(w == aid for w, _ in last.writes)
            or dst.buffer.kind not in _isa._WRITES.get(last.engine, ())
            or dst.partitions != value.partitions or dst.free_size != value.free_size):
        return False
    _isa._write(dst, _isa._f32(value), where)
    if last.op in ("nisa.nc_matmul", "nisa.nc_matmul_mx") and dst.alloc.acc is not None and dst.partial is None:
        # the matmul overwrote dst: an accumulation group starts there
        _isa._set_group(dst, _isa.ACC_OPEN, _isa._mask_for(dst) if where is None else where)
    last.writes = [(dst.alloc.id, box(dst)) if w == aid else (w, bx) for w, bx in last.writes]
    return True


def accumulate(dst, value):
    """`t[i] += value`. A matmul result just computed into PSUM accumulates into a PSUM dst on the
    Tensor Engine (`psum[...] += nisa.nc_matmul(...)`); anything else is dst + value written to dst.

    The Tensor Engine form follows PSUM's accumulation groups (isa.ACC_*): it adds onto an open
    group or onto a value another instruction wrote (`nl.zeros(..., buffer=nl.psum)`, then `+=`), and
    starts a new group, overwriting, where none is open: on fresh memory, after the group's result was
    read out, or in a newly allocated tile (AWS's compiler starts the group at the contraction loop)."""
    trace = current("tensor accumulation").trace
    last = trace[-1] if trace else None
    if (isinstance(value, NkiTensor) and value.data is value.alloc.storage and value.alloc.valid is not None
            and not value.alloc.valid.any()):
        return dst  # the value's instruction was masked out entirely (mask=False): nothing to add
    if (isinstance(value, NkiTensor) and dst.buffer.kind == "psum" and value.buffer.kind == "psum"
            and last is not None and last.op == "nisa.nc_matmul" and value.data is value.alloc.storage
            and any(w == value.alloc.id for w, _ in last.writes)):
        _isa._same_layout("tensor accumulation", dst, value, "value")
        valid = value.alloc.valid
        where = None if valid is None else np.broadcast_to(valid.reshape(dst.shape), dst.shape)
        state = _isa._group_state(dst)
        adds = (state == _isa.ACC_OPEN) | (state == _isa.ACC_VALUE)
        product = _isa._f32(value).reshape(dst.shape)
        _isa._write(dst, np.where(adds, _isa._f32(dst) + product, product), where)
        _isa._set_group(dst, _isa.ACC_OPEN, _isa._mask_for(dst) if where is None else where)
        last.writes = [(dst.alloc.id, box(dst)) if w == value.alloc.id else (w, bx) for w, bx in last.writes]
        last.reads = last.reads + [(dst.alloc.id, box(dst))]
        return dst
    assign(dst, _ops.BINARY["add"](dst, value))
    return dst


def where(condition, x, y, dtype=None, name=None) -> NkiTensor:
    """AWS's nl.where: a new SBUF tile with x's elements where condition is true (nonzero), y's
    elsewhere (numpy.where). x and y are tiles or numbers; a tile of another shape than condition
    is broadcast to it (on chip, the first axis stays the partition axis). dtype: the argument,
    else the inputs' (x's and y's tiles; a float if both are numbers)."""
    instr = "nl.where"
    cond = _isa._tensor(condition, instr, "condition")
    tiles = [t for t in (x, y) if isinstance(t, NkiTensor)]
    out = _new(cond.shape, dtype or (_result_dtype(*tiles) if tiles else float32), sbuf, name, instr)

    def fit(t):
        return t.broadcast_to(cond.shape) if isinstance(t, NkiTensor) and t.shape != cond.shape else t
    _isa.select(out, cond, fit(x), fit(y), instr)
    return out


# ---------------------------------------------------------------------------- Tensor Engine helpers
def matmul(x, y, transpose_x=False) -> NkiTensor:
    """x @ y into a new PSUM float32 tile. With transpose_x=True, x is already [K, M] (contraction on
    partitions, the hardware layout); otherwise x is [M, K] and is transposed on the Tensor Engine first."""
    x = _from_psum(_isa._tensor(x, "nl.matmul", "x"), "nl.matmul")
    y = _from_psum(_isa._tensor(y, "nl.matmul", "y"), "nl.matmul")
    if not transpose_x:
        xt = transpose(x)
        x = _copy_tile(xt)
    out = _new((x.free_size, y.free_size), float32, psum, None, "nl.matmul")
    _isa.nc_matmul(out, x.reshape(x.partitions, x.free_size), y.reshape(y.partitions, y.free_size))
    return out


def transpose(x, dtype=None) -> NkiTensor:
    """x[P, F].T into a new PSUM tile (Tensor Engine)."""
    x = _from_psum(_isa._tensor(x, "nl.transpose", "x"), "nl.transpose")
    out = _new((x.free_size, x.partitions), dtype or x.dtype, psum, None, "nl.transpose")
    _isa.nc_transpose(out, x.reshape(x.partitions, x.free_size))
    return out


# ---------------------------------------------------------------------------- random numbers
def random_seed(seed) -> None:
    """Seed the launch's random generator (what nl.dropout / nisa.dropout draw from): a number, or
    a tile whose first element is the seed. Not an instruction here (nothing is costed)."""
    if isinstance(seed, NkiTensor):
        seed = seed.data.reshape(-1)[0]
    run = current("nl.random_seed")
    run.rng = np.random.default_rng(int(seed))


def dropout(x, rate, dtype=None, name=None) -> NkiTensor:
    """x with each element zeroed with probability `rate` (a number or a [P, 1] tile), in a new SBUF
    tile (nisa.dropout on the Vector Engine); kept elements are not rescaled."""
    x = _isa._tensor(x, "nl.dropout", "x")
    out = _new(x.shape, dtype or x.dtype, sbuf, name, "nl.dropout")
    _isa.dropout(out, x, rate)
    return out


# ---------------------------------------------------------------------------- element-wise helpers
def _result_dtype(*tensors):
    dts = {t.dtype for t in tensors if isinstance(t, NkiTensor)}
    if len(dts) == 1:
        return dts.pop()
    return float32


def _unary_helper(token, vector=False):
    def helper(x, dtype=None, name=None):
        x = _isa._tensor(x, f"nl.{token.name}", "x")
        out = _new(x.shape, dtype or x.dtype, sbuf, name, f"nl.{token.name}")
        if vector:
            _isa.reciprocal(out, x)
        else:
            _isa.activation(out, token, x)
        return out

    helper.__name__ = token.name
    helper.__doc__ = f"nl.{token.name}(x, dtype=None): element-wise on the Scalar Engine, a new SBUF tile."
    return helper


def _binary_helper(token):
    def helper(x, y, dtype=None, name=None):
        instr = f"nl.{token.name}"
        xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
        if not xt and not yt:
            return float(token.fn(np.float32(x), np.float32(y)))
        if xt and yt:
            return _tensor_tensor(token, x, y, dtype, name, instr)
        data, scalar, reverse = (x, y, False) if xt else (y, x, True)
        out = _new(data.shape, dtype or data.dtype, sbuf, name, instr)
        _isa.tensor_scalar(out, data, token, scalar, reverse0=reverse)
        return out

    helper.__name__ = token.name
    helper.__doc__ = (f"nl.{token.name}(x, y, dtype=None): element-wise on the Vector Engine (tensor_tensor, "
                      "or tensor_scalar for a number / [P, 1] operand), a new SBUF tile.")
    return helper


def _tensor_tensor(token, x, y, dtype, name, instr):
    if x.shape == y.shape:
        out = _new(x.shape, dtype or _result_dtype(x, y), sbuf, name, instr)
        _isa.tensor_tensor(out, x, y, token)
        return out
    # A [P, 1] operand is a per-partition scalar: tensor_scalar broadcasts it along the free axes.
    for data, vec, reverse in ((x, y, False), (y, x, True)):
        if vec.free_size == 1 and vec.partitions == data.partitions and data.free_size > 1:
            out = _new(data.shape, dtype or _result_dtype(x, y), sbuf, name, instr)
            _isa.tensor_scalar(out, data, token, vec, reverse0=reverse)
            return out
    # On chip the first axis is the partition axis whatever the rank: a tile with fewer axes is
    # aligned on it (trailing 1s added, as broadcast_to does), so a reduction's [P] result meets
    # a [P, 1] tile as [P, 1], not as NumPy's trailing-axis [P, P].
    xs, ys = x.shape, y.shape
    if x.buffer.on_chip and y.buffer.on_chip and len(xs) != len(ys):
        rank = builtins.max(len(xs), len(ys))
        xs, ys = xs + (1,) * (rank - len(xs)), ys + (1,) * (rank - len(ys))
    try:
        shape = np.broadcast_shapes(xs, ys)
    except ValueError:
        raise NKIError(instr, f"shapes {x.shape} and {y.shape} do not broadcast") from None
    out = _new(shape, dtype or _result_dtype(x, y), sbuf, name, instr)
    _isa.tensor_tensor(out, x.broadcast_to(shape), y.broadcast_to(shape), token)
    return out


def _reduction(token, name, mean=False):
    def helper(x, axis, dtype=None, keepdims=False, name=None):
        instr = f"nl.{helper.__name__}"
        x = _isa._tensor(x, instr, "x")
        axes = _isa._reduce_axes(instr, x, axis)
        out = _new(_isa.reduced_shape(x, axes, keepdims), dtype or x.dtype, sbuf, name, instr)
        _isa.tensor_reduce(out, token, x, axes, keepdims=keepdims)
        if mean:
            count = math.prod(x.shape[a] for a in axes)
            _isa.tensor_scalar(out, out, _ops.BINARY["multiply"], 1.0 / count)
        return out

    helper.__name__ = name
    helper._nki_op = token
    helper.__doc__ = f"nl.{name}(x, axis, dtype=None, keepdims=False): reduce over free axes (Vector Engine)."
    return helper


_masks = _isa.accepts_mask  # every helper takes the older dialect's mask= (see nisa.accepts_mask)
for _token in _ops.UNARY.values():
    _token.helper = _masks(_unary_helper(_token, vector=_token.name == "reciprocal"), f"nl.{_token.name}")
    globals()[_token.name] = _token
for _token in _ops.BINARY.values():
    _token.helper = _masks(_binary_helper(_token), f"nl.{_token.name}")
    globals()[_token.name] = _token

sum = _masks(_reduction(_ops.BINARY["add"], "sum"), "nl.sum")  # noqa: A001 - the NKI name
max = _masks(_reduction(_ops.BINARY["maximum"], "max"), "nl.max")  # noqa: A001
min = _masks(_reduction(_ops.BINARY["minimum"], "min"), "nl.min")  # noqa: A001
prod = _masks(_reduction(_ops.BINARY["multiply"], "prod"), "nl.prod")
mean = _masks(_reduction(_ops.BINARY["add"], "mean", mean=True), "nl.mean")
_ops.UNARY["copy"].helper = _masks(_copy_tile, "nl.copy")  # a tensor_copy, not a Scalar Engine pass
load = _masks(load, "nl.load")
store = _masks(store, "nl.store")
matmul = _masks(matmul, "nl.matmul")
transpose = _masks(transpose, "nl.transpose")
random_seed = _masks(random_seed, "nl.random_seed")
dropout = _masks(dropout, "nl.dropout")
del _token


# ---------------------------------------------------------------------------- more of AWS's nl names
def empty_like(x, dtype=None, buffer=None, name=""):
    """`nl.empty_like(x, dtype=None, buffer=None)`: a new uninitialized tensor of x's shape, dtype
    and buffer (each overridable), as nl.ndarray (fresh memory is poisoned with NaN here)."""
    x = _isa._tensor(x, "nl.empty_like", "x")
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name or None)


def rand(shape, dtype, buffer=sbuf, name=""):
    """`nl.rand(shape, dtype, buffer=nl.sbuf)`: a new tensor of uniform [0, 1) values, drawn from the
    launch's generator (the one nl.random_seed seeds; not the hardware's). On chip the fill is
    recorded as one GpSimd instruction."""
    instr = "nl.rand"
    d = _dt.normalize(dtype, instr)
    if not _dt.is_float(d):
        raise NKIError(instr, f"dtype {_dt.name(d)} cannot hold values in [0, 1)", "pass a float dtype")
    t = _new(shape, d, buffer, name or None, instr)
    values = _isa.random_generator(instr).random(t.shape, dtype=np.float32)
    if t.buffer.on_chip:
        _isa._write(t, values)
        _isa._record(instr, "gpsimd", [t], [], ("gpsimd", t.free_size))
    else:
        _dt.cast_into(t.data, values, t.dtype)
    return t


def _buffer_kind(buffer, instr):
    if isinstance(buffer, NkiTensor):
        buffer = buffer.buffer
    kind = getattr(buffer, "kind", None)
    if kind is None:
        raise NKIError(instr, f"expected a buffer (nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm, nl.private_hbm), "
                       f"got {buffer!r}", "pass a buffer, or a tensor's .buffer")
    return kind


def is_psum(buffer) -> bool:
    """`nl.is_psum(buffer)`: whether the buffer is PSUM."""
    return _buffer_kind(buffer, "nl.is_psum") == "psum"


def is_sbuf(buffer) -> bool:
    """`nl.is_sbuf(buffer)`: whether the buffer is SBUF."""
    return _buffer_kind(buffer, "nl.is_sbuf") == "sbuf"


def is_hbm(buffer) -> bool:
    """`nl.is_hbm(buffer)`: whether the buffer is any HBM kind (hbm, shared_hbm, private_hbm)."""
    return _buffer_kind(buffer, "nl.is_hbm") == "hbm"


def is_on_chip(buffer) -> bool:
    """`nl.is_on_chip(buffer)`: whether the buffer is SBUF or PSUM."""
    return _buffer_kind(buffer, "nl.is_on_chip") in ("sbuf", "psum")


def _trn3_only(helper, instr):
    def checked(*args, **kwargs):
        from .targets import get_target
        from .runtime import active

        run = active()
        target = run.target if run is not None else get_target()
        if target.neuron_core < 4:
            raise NKIError(instr, f"is available on NeuronCore-v4 (trn3) and newer; the target is {target.name} "
                           f"(NeuronCore-v{target.neuron_core})",
                           "launch on trn3 (NEURON_PLATFORM_TARGET_OVERRIDE=trn3), or compare with nl.abs and "
                           "nl.greater and pick with nl.where")
        return helper(*args, **kwargs)

    checked.__name__ = helper.__name__
    checked.__doc__ = helper.__doc__
    return checked


def _integer_operand(value, instr, role):
    if isinstance(value, NkiTensor):
        if _dt.is_float(value.dtype):
            raise NKIError(instr, f"{role} dtype {_dt.name(value.dtype)} is not an integer type: bit-vector "
                           "operators treat elements as bit patterns", "copy it into an integer tile first")
        return value.data.astype(np.int64)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise NKIError(instr, f"{role} must be an integer tile or an integer, got {value!r}")
    return np.int64(value)


def _bitvec_helper(token):
    opname = token.name

    def helper(x, y, dtype=None, name=None):
        instr = f"nl.{opname}"
        tiles = [t for t in (x, y) if isinstance(t, NkiTensor)]
        if not tiles:
            raise NKIError(instr, "at least one of x, y must be a tile", "pass a tile")
        tiles = [_isa._tensor(t, instr, "x") for t in tiles]
        shape = tiles[0].shape if len(tiles) == 1 else None
        if shape is None:
            a, b = tiles
            if a.shape == b.shape:
                shape = a.shape
            else:
                try:
                    shape = np.broadcast_shapes(a.shape, b.shape)
                except ValueError:
                    raise NKIError(instr, f"shapes {a.shape} and {b.shape} do not broadcast") from None
        xs = _integer_operand(x.broadcast_to(shape) if isinstance(x, NkiTensor) else x, instr, "x")
        ys = _integer_operand(y.broadcast_to(shape) if isinstance(y, NkiTensor) else y, instr, "y")
        out_dtype = _dt.normalize(dtype, instr) if dtype is not None else tiles[0].dtype
        if _dt.is_float(out_dtype):
            raise NKIError(instr, f"dtype {_dt.name(out_dtype)} is not an integer type", "pass an integer dtype")
        out = _new(shape, out_dtype, sbuf, name, instr)
        _isa._access(instr, "vector", reads=[("x", t) for t in tiles], writes=[("dst", out)])
        bits = token.fn.exact(xs, ys)
        _isa._store(out, np.broadcast_to(bits, shape).astype(out.data.dtype))  # wraps to dst's width
        _isa._record(instr, "vector", [out], tiles, ("elementwise", out.free_size))
        return out

    helper.__name__ = opname
    helper.__doc__ = (f"nl.{opname}(x, y, dtype=None): element-wise on the bit patterns of integer tiles (Vector "
                      "Engine), a new SBUF tile; the result wraps to the output dtype's width.")
    return helper


def invert(x, dtype=None, name=None):
    """`nl.invert(x)`: bitwise NOT of an integer tile (AWS: XOR with all ones)."""
    return bitwise_xor(x, -1, dtype=dtype, name=name)


def logical_not(x, dtype=None, name=None):
    """`nl.logical_not(x)`: 1 where x is 0, else 0. AWS implements it as XOR with 1 (for 0/1 inputs);
    here it is a logical XOR with 1 (`x != 0` XOR true), the same for 0/1 inputs."""
    return logical_xor(x, 1.0, dtype=dtype, name=name)


def _contiguous_tail(instr, x, axis):
    axes = sorted(_isa._reduce_axes(instr, x, axis))
    if axes != list(builtins.range(axes[0], x.ndim)):
        raise NKIError(instr, f"axis {axis} must be the last free dimension(s) of the tile {x.shape}: [1], [1, 2], ...",
                       "reshape or permute the tile so the axes are its last ones")
    return tuple(axes)


def var(x, axis, dtype=None, keepdims=False, name=None):
    """`nl.var(x, axis)`: the population variance (NumPy's ddof=0) over the last free axes; the result
    keeps the reduced axes (size 1) whatever `keepdims` says (AWS: keepdims is ignored). Computed in
    float32 as mean((x - mean(x))^2) with Vector / Scalar Engine instructions."""
    instr = "nl.var"
    x = _isa._tensor(x, instr, "x")
    axes = _contiguous_tail(instr, x, axis)
    mu = mean(x, axes, dtype=float32, keepdims=True)
    dev = subtract(x, mu, dtype=float32)
    sq = square(dev, dtype=float32)
    out = _new(_isa.reduced_shape(x, axes, True), dtype or x.dtype, sbuf, name, instr)
    _isa.tensor_reduce(out, _ops.BINARY["add"], sq, axes, keepdims=True)
    _isa.tensor_scalar(out, out, _ops.BINARY["multiply"], 1.0 / math.prod(x.shape[a] for a in axes))
    return out


def softmax(x, axis=-1, dtype=None, name=None):
    """`nl.softmax(x, axis=-1)`: exp(x - max) / sum(exp(x - max)) over the last free axes (float32)."""
    instr = "nl.softmax"
    x = _isa._tensor(x, instr, "x")
    axes = _contiguous_tail(instr, x, axis)
    m = max(x, axes, dtype=float32, keepdims=True)
    e = exp(subtract(x, m, dtype=float32), dtype=float32)
    s = sum(e, axes, dtype=float32, keepdims=True)
    return divide(e, s, dtype=dtype or x.dtype, name=name)


def rms_norm(x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None, name=None):
    """`nl.rms_norm(x, w, axis, n, epsilon=1e-6)`: x / sqrt(sum(x^2 over axis) / n + epsilon) * w.
    w is a tile of x's shape or one that broadcasts to it (a [1, F] or [P, 1] row / column is
    broadcast along the other axis); `compute_dtype` (default float32) is the intermediates' dtype."""
    instr = "nl.rms_norm"
    x = _isa._tensor(x, instr, "x")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise NKIError(instr, f"n={n!r} must be a positive integer: the count of values the mean of squares divides by")
    axes = _contiguous_tail(instr, x, axis)
    cd = compute_dtype or float32
    ss = sum(square(x, dtype=cd), axes, dtype=cd, keepdims=True)
    r = _new(ss.shape, cd, sbuf, None, instr)
    _isa.tensor_scalar(r, ss, _ops.BINARY["multiply"], 1.0 / int(n), op1=_ops.BINARY["add"], operand1=float(epsilon))
    _isa.activation(r, _ops.UNARY["rsqrt"], r)
    normed = multiply(x, r, dtype=cd)
    return multiply(normed, w, dtype=dtype or x.dtype, name=name)


def broadcast_to(x, shape, dtype=None, name=None):
    """`nl.broadcast_to(x, shape)`: a new SBUF tile of `shape` (the same rank as x), each free
    dimension either x's or broadcast from size 1 (one tensor_copy). x itself when the shape and
    dtype already match. The partition dimension must match: engines do not copy across partitions."""
    instr = "nl.broadcast_to"
    x = _isa._tensor(x, instr, "x")
    if not x.buffer.on_chip:
        raise NKIError(instr, f"x is in {x.buffer!r}; it broadcasts an SBUF or PSUM tile", "nl.load it first")
    shape = tuple(int(s) for s in shape)
    if len(shape) != x.ndim:
        raise NKIError(instr, f"shape {shape} must have the rank of x's {x.shape}", "use nl.expand_dims first")
    for i, (old, new) in enumerate(zip(x.shape, shape)):
        if old != new and old != 1:
            raise NKIError(instr, f"dimension {i} of {x.shape} cannot broadcast to {new}: only size-1 dimensions broadcast")
    if shape[0] != x.shape[0]:
        raise NKIError(instr, f"the partition dimension ({x.shape[0]} -> {shape[0]}) cannot broadcast here: the "
                       "engines read and write each partition's own data",
                       "broadcast across partitions with nisa.nc_matmul (a ones [1, P] stationary) or a DMA")
    if shape == tuple(x.shape) and (dtype is None or _dt.normalize(dtype, instr) == x.dtype):
        return x
    out = _new(shape, dtype or x.dtype, sbuf, name, instr)
    _isa.tensor_copy(out, x.broadcast_to(shape))
    return out


def expand_dims(x, axis):
    """`nl.expand_dims(x, axis)`: a view of x with a new size-1 axis at `axis` (no copy). On chip the
    new axis cannot be axis 0, the partition axis."""
    x = _isa._tensor(x, "nl.expand_dims", "x")
    return x.expand_dim(axis if axis >= 0 else x.ndim + 1 + axis)


def gather_flattened(data, indices, axis=0, dtype=None, name=None):
    """`nl.gather_flattened(data, indices)`: per partition, out[p, i...] = data[p]'s free elements
    (flattened) at position indices[p, i...] (GpSimd Engine). indices is an integer tile of data's
    partition count; the result has indices' shape. A position past data's free size is an error."""
    instr = "nl.gather_flattened"
    data = _isa._tensor(data, instr, "data")
    indices = _isa._tensor(indices, instr, "indices")
    if axis != 0:
        raise NKIError(instr, f"axis={axis!r}: only the default (0, the flattened free elements of each "
                       "partition) is simulated", "reshape data so the gather runs over its flattened free axes")
    if _dt.is_float(indices.dtype):
        raise NKIError(instr, f"indices dtype {_dt.name(indices.dtype)} must be an integer type", "cast with nl.copy")
    if indices.partitions != data.partitions:
        raise NKIError(instr, f"indices {indices.shape} and data {data.shape} must have the same partition count "
                       "(the gather stays within each partition)", "gather across partitions with a DMA")
    flat = data.data.reshape(data.partitions, -1)
    idx = indices.data.reshape(indices.partitions, -1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= flat.shape[1]):
        bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
        raise NKIError(instr, f"index {bad} is outside data's {flat.shape[1]} elements per partition")
    out = _new(indices.shape, dtype or data.dtype, sbuf, name, instr)
    _isa._access(instr, "gpsimd", reads=[("data", data), ("indices", indices)], writes=[("dst", out)])
    _isa._write(out, np.take_along_axis(flat, idx, axis=1).astype(np.float32))
    _isa._record(instr, "gpsimd", [out], [data, indices], ("elementwise", out.free_size))
    return out


def while_loop(init, body_fun):
    """`nl.while_loop(init, body_fun)`: r = init; while r != 0: r = body_fun(r), `r` a register
    (nisa.register_alloc) passed by value. The simulator reads the registers as the loop runs."""
    from .isa.registers import VirtualRegister

    instr = "nl.while_loop"
    _check_reorder(instr)
    if not isinstance(init, VirtualRegister):
        raise NKIError(instr, f"init must be a register (nisa.register_alloc), got {type(init).__name__}",
                       "load the condition into a register with nisa.register_load")
    r = init
    while r.get(instr) != 0:
        r = body_fun(VirtualRegister(r.get(instr)))
        if not isinstance(r, VirtualRegister):
            raise NKIError(instr, f"body_fun must return the next condition register, got {type(r).__name__}",
                           "return the register the body loaded the condition into")


def device_print(print_prefix, tensor):
    """`nl.device_print(prefix, tensor)`: print the prefix and the tile's values to stdout (AWS's CPU
    simulation prints immediately; on a device the runtime dumps them). SBUF or HBM tensors."""
    instr = "nl.device_print"
    if not isinstance(print_prefix, str):
        raise NKIError(instr, f"print_prefix must be a constant string, got {type(print_prefix).__name__}")
    t = _isa._tensor(tensor, instr, "tensor")
    if t.buffer.kind == "psum":
        raise NKIError(instr, "tensor is in nl.psum; device_print prints SBUF or HBM tensors", "copy it to SBUF first")
    print(print_prefix, np.asarray(t.data.astype(np.float32) if _dt.is_float(t.dtype) else t.data), flush=True)


_NO_REORDER = {}  # id(run) -> depth of nested `with nl.no_reorder():` blocks


def _check_reorder(instr):
    from .runtime import active

    run = active()
    if run is not None and _NO_REORDER.get(id(run)):
        raise NKIError(instr, "register-based dynamic loops are not supported inside `with nl.no_reorder():` (AWS)",
                       "move the loop out of the block, or use a Python range")


class no_reorder:  # noqa: N801 - the NKI name
    """`with nl.no_reorder():` keeps the block's instructions in program order. The simulator runs
    (and records) every instruction in program order anyway; the block only forbids the dynamic
    loops AWS forbids there (nl.fori_loop, nl.while_loop)."""

    def __enter__(self):
        self._run = current("nl.no_reorder")
        _NO_REORDER[id(self._run)] = _NO_REORDER.get(id(self._run), 0) + 1
        return self

    def __exit__(self, *exc):
        key = id(self._run)
        _NO_REORDER[key] -= 1
        if not _NO_REORDER[key]:
            del _NO_REORDER[key]
        return False


class _LoopReduce:
    """What nl.loop_reduce returns: a pending `dst = op(dst, x)`, applied by the assignment
    `t[...] = nl.loop_reduce(x, ...)` that names dst."""

    __slots__ = ("x", "token", "dtype", "mask")
    NOT_A_TILE = ("the pending result of nl.loop_reduce, which is only the right side of `t[...] = "
                  "nl.loop_reduce(...)`", "assign it into the accumulator tile: acc[...] = nl.loop_reduce(x, "
                  "op=np.add, loop_indices=[k])")

    def __init__(self, x, token, dtype, mask):
        self.x, self.token, self.dtype, self.mask = x, token, dtype, mask

    def __getattr__(self, item):
        raise NKIError("nl.loop_reduce", f"its result is only the right side of an assignment `t[...] = "
                       f"nl.loop_reduce(...)` (asked for .{item})",
                       "assign it into the accumulator tile: acc[...] = nl.loop_reduce(x, op=np.add, loop_indices=[k])")


def loop_reduce(x, op, loop_indices, *, dtype=None, name=None, **kwargs):
    """`acc[...] = nl.loop_reduce(x, op, loop_indices)`: acc = op(acc, x) (nisa.tensor_tensor on the
    Vector Engine), the assignment target being the reduction's destination and rhs, as AWS
    documents; `loop_indices` (the loops it reduces over) is accepted and only checked for presence."""
    instr = "nl.loop_reduce"
    x = _isa._tensor(x, instr, "x")
    token = _ops.resolve(op, instr, 2)
    if loop_indices is None:
        raise NKIError(instr, "loop_indices is required (the loop indices the reduction runs over)")
    return _LoopReduce(x, token, dtype, _isa._active_mask())  # mask=: applied with the assignment


def atomic_rmw(dst, value, op):
    """`nl.atomic_rmw(dst, value, op=np.add)`: dst = dst + value on HBM, a DMA with read-modify-write
    (nisa.dma_copy with dst_rmw_op=nl.add). AWS supports only np.add."""
    instr = "nl.atomic_rmw"
    token = _ops.resolve(op, instr, 2)
    if token.name != "add":
        raise NKIError(instr, f"op {token!r} is not supported: only np.add / nl.add (AWS)")
    dst = _isa._tensor(dst, instr, "dst")
    if dst.buffer.on_chip:
        raise NKIError(instr, f"dst is in {dst.buffer!r}; atomic_rmw updates HBM", "index an HBM tensor")
    if not isinstance(value, NkiTensor):
        tile = _new(dst.shape, dst.dtype, sbuf, None, instr)
        _isa.memset(tile, value)
        value = tile
    _isa.dma_copy(dst, value, dst_rmw_op=_ops.BINARY["add"])

def all_reduce(x, op, program_axes, *, dtype=None, parallel_reduce=True, asynchronous=False, name=None):
    """`nl.all_reduce(x, op, program_axes)` (the older reference): op (add, maximum, minimum) of x
    over the programs of the launch grid that differ only along `program_axes`, in float32, in a new
    SBUF tile of every such program (cast to `dtype`, default x's). Each program waits for the others
    of its group (they run as concurrent cores, see "Logical NeuronCores"); recorded as a DMA of x's
    bytes. `parallel_reduce` and `asynchronous` are accepted and not acted on."""
    instr = "nl.all_reduce"
    run = current(instr)
    x = _isa._tensor(x, instr, "x")
    token = _ops.resolve(op, instr, 2)
    if token.name not in ("add", "maximum", "minimum"):
        raise NKIError(instr, f"op {token!r} is not supported here", "use np.add / nl.add, nl.maximum or nl.minimum")
    grid = tuple(run.grid) or (1,)
    axes = (program_axes,) if isinstance(program_axes, (int, np.integer)) else tuple(program_axes)
    if not axes or any(not 0 <= a < len(grid) for a in axes):
        raise NKIError(instr, f"program_axes {program_axes!r} must name axes of the launch grid {run.grid}",
                       "launch the kernel over a grid: kernel[n](...)")
    pid = tuple(run.program_id) if run.grid else (0,)
    first = run.gid - int(np.ravel_multi_index(pid, grid))
    members = []
    for combo in itertools.product(*(builtins.range(grid[a]) for a in axes)):
        p = list(pid)
        for a, v in zip(axes, combo):
            p[a] = v
        members.append(first + int(np.ravel_multi_index(tuple(p), grid)))
    group = tuple(sorted(members))
    cores = run.launch.cores
    values = np.array(_isa._f32(x), copy=True)
    if cores is None or len(group) == 1:
        got = {run.gid: values}
    else:
        key = ("nl.all_reduce", group)
        seq = cores.issued[(run.gid,) + key]
        cores.issued[(run.gid,) + key] = seq + 1
        slot = cores.slots[key + (seq,)]
        slot[run.gid] = values
        cores.wait(run.gid, lambda: builtins.all(g in slot for g in group),
                   f"{instr} number {seq + 1} over programs {list(group)} (waiting for "
                   f"{[g for g in group if g not in slot]})")
        got = slot
    acc = None
    for g in group:
        if got[g].shape != values.shape:
            raise NKIError(instr, f"the programs of the group reduce tiles of different shapes "
                           f"({got[g].shape} and {values.shape})")
        acc = got[g] if acc is None else token.fn(acc, got[g])
    out = _new(x.shape, dtype or x.dtype, sbuf, name, instr)
    _isa._access(instr, "dma", reads=[("x", x)], writes=[("dst", out)])
    _isa._write(out, acc)
    _isa._record(instr, "dma", [out], [x], ("dma", x.nbytes, x.nbytes / builtins.max(1, x.partitions)),
                 nbytes=x.nbytes)
    return out

for _token in _ops.BITVEC.values():
    _token.helper = _masks(_bitvec_helper(_token), f"nl.{_token.name}")
    globals()[_token.name] = _token
del _token
_ops.BINARY["abs_max"].helper = _trn3_only(_ops.BINARY["abs_max"].helper, "nl.abs_max")
_ops.BINARY["abs_min"].helper = _trn3_only(_ops.BINARY["abs_min"].helper, "nl.abs_min")
all = _masks(_reduction(_ops.BINARY["logical_and"], "all"), "nl.all")  # noqa: A001 - the NKI name
for _f in ("invert", "logical_not", "var", "softmax", "rms_norm", "where", "broadcast_to", "gather_flattened",
           "atomic_rmw", "loop_reduce", "all_reduce"):
    globals()[_f] = _masks(globals()[_f], f"nl.{_f}")
del _f

__all__ = [
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "tile_size", "ds", "par_dim", "fp32", "finfo",
    "NKIObject", "static_cast", "dtype",
    "arange", "mgrid",
    "int8", "int16", "int32", "uint8", "uint16", "uint32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2",
    "float16", "bfloat16", "tfloat32", "float32", "bool_",
    "float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4", "float8_e8m0fnu",
    "ndarray", "zeros", "ones", "full", "zeros_like", "ndarray_like",
    "program_id", "num_programs", "program_ndim", "affine_range", "sequential_range", "static_range", "range",
    "dynamic_range", "fori_loop",
    "shared_identity_matrix",
    "load", "store", "copy", "matmul", "transpose", "random_seed", "dropout", "sum", "max", "min", "prod", "mean",
    *_ops.UNARY, *_ops.BINARY, *_ops.BITVEC,
    "empty_like", "rand", "is_psum", "is_sbuf", "is_hbm", "is_on_chip", "invert", "logical_not", "all", "var",
    "softmax", "rms_norm", "where", "broadcast_to", "expand_dims", "gather_flattened", "while_loop",
    "device_print", "no_reorder", "loop_reduce", "atomic_rmw", "all_reduce",
]
