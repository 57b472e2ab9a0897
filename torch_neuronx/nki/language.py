"""`nki.language` (`nl`): buffers, dtypes, tile sizes, allocation, loops, program ids, and the
tile-level helpers (`nl.load`, `nl.store`, `nl.matmul`, math and reductions) built on `nki.isa`.

Helpers return new tiles: SBUF for element-wise results and reductions, PSUM for `nl.matmul`
and `nl.transpose` (the Tensor Engine writes only PSUM).
"""

from __future__ import annotations

import builtins
import math
import types
import weakref

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
from .runtime import ParDim, current
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


class NKIObject:
    """`nl.NKIObject`: the base of classes whose instances a kernel builds and passes around at trace
    time (configs, tile plans, buffer bundles: AWS's nki-library derives its `@dataclass`es, frozen
    or not, and plain classes with `__init__` and methods from it). Their fields hold Python values
    and tiles resolved while tracing; AWS's compiler needs the base to trace them. The simulator runs
    the kernel's Python as it is, so the base adds nothing: no state (`__slots__ = ()` keeps
    subclasses' `__dict__`, dataclass equality and hashing their own).

    One thing nki-library relies on (attention_cte's `SectionParams`): a `@dataclass` subclass's
    plain class attributes without an annotation (`section_idx = None`) are constructor fields
    (`SectionParams(section_idx=0)`). Python's dataclass ignores them, so each subclass gives them
    an annotation when it is created (after the annotated ones, keeping their defaults); AWS does
    not document this, its kernels just construct them so."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            try:
                cls.__annotations__ = own
            except (AttributeError, TypeError):
                return
        for key, value in list(cls.__dict__.items()):
            if (key.startswith("_") or key in own or callable(value)
                    or isinstance(value, (staticmethod, classmethod, property))):
                continue
            own[key] = "typing.Any"


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


def affine_range(start, stop=None, step=1, directives=None):
    """Iterations without loop-carried dependencies (the compiler may reorder/pipeline them).
    Resolved at trace time: a Python range."""
    return builtins.range(start, stop, step) if stop is not None else builtins.range(start)


def sequential_range(start, stop=None, step=1, directives=None):
    """Iterations that must run in order (loop-carried dependency). A Python range."""
    return builtins.range(start, stop, step) if stop is not None else builtins.range(start)


def static_range(start, stop=None, step=1, directives=None):
    """Fully unrolled loop. A Python range."""
    return builtins.range(start, stop, step) if stop is not None else builtins.range(start)


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
    """Copy an HBM view into a new SBUF tile (one DMA)."""
    src = _isa._tensor(src, "nl.load", "src")
    tile = _new(src.shape, dtype or src.dtype, sbuf, name, "nl.load")
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
    if isinstance(value, NkiTensor):
        if dst.same_view(value):
            return  # `t[i] += x` already wrote t[i]
        pending = _LOOP_REDUCE.pop(value.alloc, None)
        if pending is not None:  # `t[...] = nl.loop_reduce(x, op, ...)`: t = t <op> x
            token, x = pending
            _isa.tensor_tensor(dst, dst, x.reshape(dst.shape) if x.shape != dst.shape else x, token)
            return
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
    last.writes = [(dst.alloc.id, box(dst)) if w == aid else (w, bx) for w, bx in last.writes]
    return True


def accumulate(dst, value):
    """`t[i] += value`. A matmul result just computed into PSUM accumulates into a PSUM dst on the
    Tensor Engine (`psum[...] += nisa.nc_matmul(...)`); anything else is dst + value written to dst."""
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
        _isa._write(dst, _isa._f32(dst) + _isa._f32(value).reshape(dst.shape), where)
        last.writes = [(dst.alloc.id, box(dst)) if w == value.alloc.id else (w, bx) for w, bx in last.writes]
        last.reads = last.reads + [(dst.alloc.id, box(dst))]
        return dst
    assign(dst, _ops.BINARY["add"](dst, value))
    return dst


_LOOP_REDUCE = weakref.WeakKeyDictionary()  # loop_reduce results not yet assigned: alloc -> (op, x)


def loop_reduce(x, op, loop_indices, dtype=None, name=None) -> NkiTensor:
    """AWS's nl.loop_reduce: "the destination tile is also the rhs input to op", so
    `t[...] = nl.loop_reduce(x, op=np.add, loop_indices=[k])` is `t = t <op> x` (one Vector Engine
    tensor_tensor, written when the result is assigned; `loop_indices` only guides the compiler's loop
    optimizations and is not used here). The returned tile holds nothing until it is assigned."""
    instr = "nl.loop_reduce"
    x = _isa._tensor(x, instr, "x")
    token = _ops.resolve(op, instr, 2)
    out = _new(x.shape, dtype or x.dtype, sbuf, name, instr)
    out.alloc.valid = np.zeros(out.alloc.storage.shape, dtype=bool)
    _LOOP_REDUCE[out.alloc] = (token, x)
    return out


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
where = _masks(where, "nl.where")
loop_reduce = _masks(loop_reduce, "nl.loop_reduce")
del _token

__all__ = [
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "tile_size", "ds", "par_dim", "fp32", "finfo",
    "NKIObject", "static_cast", "dtype",
    "arange", "mgrid",
    "int8", "int16", "int32", "uint8", "uint16", "uint32", "float8_e4m3", "float8_e4m3fn", "float8_e5m2",
    "float16", "bfloat16", "tfloat32", "float32", "bool_",
    "float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4", "float8_e8m0fnu",
    "ndarray", "zeros", "ones", "full", "zeros_like", "ndarray_like",
    "program_id", "num_programs", "program_ndim", "affine_range", "sequential_range", "static_range", "range",
    "shared_identity_matrix",
    "load", "store", "copy", "matmul", "transpose", "random_seed", "dropout", "sum", "max", "min", "prod", "mean",
    *_ops.UNARY, *_ops.BINARY,
]
