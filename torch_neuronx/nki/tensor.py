"""Tensors of the simulator: an allocation in one buffer (HBM, SBUF, PSUM) and views of it.

An `Allocation` owns a NumPy array in the storage dtype. An `NkiTensor` is a view: a NumPy view of
that array plus its byte offset from the allocation start (kept by hand because asking NumPy for a
view's address costs microseconds, and the cost model needs it for every operand).
On-chip tensors have the partition dimension first; views must keep it first. The older dialect's
block tensors (`nl.ndarray((4, nl.par_dim(128), 512))`) keep it after their block axes: the storage
is partition-major (each partition holds every block's free bytes) and the tensor is a transposed
view of it; indexing the blocks away (`t[k]`) gives an ordinary partition-first tile.
"""

from __future__ import annotations

import itertools
import math
import operator

import numpy as np

from . import dtypes as _dt
from . import indexing as _ix
from .errors import NKIError


class Buffer:
    """A memory space: `nl.sbuf`, `nl.psum`, `nl.hbm` (private to a program) or `nl.shared_hbm`."""

    __slots__ = ("name", "kind")

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind  # "sbuf", "psum" or "hbm"

    @property
    def on_chip(self) -> bool:
        return self.kind != "hbm"

    def __repr__(self):
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", "sbuf")
psum = Buffer("psum", "psum")
hbm = Buffer("hbm", "hbm")
shared_hbm = Buffer("shared_hbm", "hbm")
private_hbm = Buffer("private_hbm", "hbm")

_ids = itertools.count(1)


class Allocation:
    """One buffer allocation (an `nl.ndarray`, or a kernel argument copied into HBM)."""

    __slots__ = ("id", "buffer", "storage", "dtype", "name", "written", "acc", "rowbytes", "dtype_name",
                 "full_box", "valid", "__weakref__")

    def __init__(self, shape, dtype, buffer: Buffer, name=None, fill=None, storage=None):
        self.id = next(_ids)
        self.buffer = buffer
        self.dtype = dtype
        self.name = name
        self.written = False
        self.acc = None  # PSUM only: which elements a matmul accumulation group has started on
        self.valid = None  # elements a masked instruction wrote when it filled the whole allocation
        if storage is None:
            storage = np.empty(shape, dtype=_dt.storage_dtype(dtype))
            storage.fill(_dt.poison_value(dtype) if fill is None else fill)
        self.storage = storage
        self.dtype_name = _dt.name(dtype)
        self.full_box = None
        # Bytes per partition of an on-chip tile (its row); HBM is addressed as one flat row.
        self.rowbytes = storage.strides[0] if (buffer.on_chip and storage.ndim > 1) else (
            storage.itemsize if buffer.on_chip else storage.nbytes)


class DynSlice:
    """`nl.ds(start, size)`: `size` elements from `start` (a slice with a static size)."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step=1):
        self.start = operator.index(start)
        self.size = operator.index(size)
        self.step = operator.index(step)

    def __repr__(self):
        return f"nl.ds({self.start}, {self.size})"


def ds(start, size, step=1) -> DynSlice:
    return DynSlice(start, size, step)


class NkiTensor:
    """A view of an allocation. Index with ints, slices and `nl.ds`, or with the older dialect's
    `nl.arange` / `nl.mgrid` expressions; `reshape`, `permute`, `broadcast_to` make more views.
    Arithmetic operators call the `nl` helpers.

    `lead`: block axes before the partition axis (block tensors, until indexed away).
    `partial`: an `indexing.PartialView` when an index expression leaves the tensor's bounds."""

    __slots__ = ("alloc", "data", "offset", "lead", "partial", "vdtype", "__weakref__")
    __array_priority__ = 1000  # so that `ndarray + tile` defers to the tile

    def __init__(self, alloc: Allocation, data: np.ndarray, offset: int = 0, lead: int = 0, partial=None,
                 dtype=None):
        self.alloc = alloc
        self.data = data
        self.offset = offset
        self.lead = lead
        self.partial = partial
        self.vdtype = dtype  # a reinterpreting view's dtype (.view(dtype), .ap(dtype=)); None: the allocation's

    # --- metadata
    @property
    def shape(self):
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def dtype(self):
        return self.alloc.dtype if self.vdtype is None else self.vdtype

    @property
    def buffer(self) -> Buffer:
        return self.alloc.buffer

    @property
    def itemsize(self) -> int:
        return self.data.itemsize

    @property
    def nbytes(self) -> int:
        return self.data.size * self.data.itemsize

    @property
    def partitions(self) -> int:
        return self.data.shape[0] if self.data.ndim else 1

    @property
    def free_size(self) -> int:
        """Elements per partition."""
        return math.prod(self.data.shape[1:]) if self.data.ndim else 1

    def __len__(self):
        return self.data.shape[0]

    def __repr__(self):
        name = f" {self.alloc.name!r}" if self.alloc.name else ""
        return f"NkiTensor{name}(shape={self.shape}, dtype={_dt.name(self.dtype)}, buffer={self.buffer!r})"

    def numpy(self) -> np.ndarray:
        """A copy of the values (for debugging inside a simulated kernel)."""
        return np.array(self.data)

    # --- views
    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        if self.partial is not None:
            raise NKIError("tensor indexing", "an out-of-bounds access pattern cannot be indexed again",
                           "index the tensor once with all its index expressions")
        if any(isinstance(item, _ix.IndexExpr) for item in index):
            data, offset, partial = _ix.affine_view(self, index)
            return NkiTensor(self.alloc, data, offset, partial=partial, dtype=self.vdtype)
        if self.buffer.on_chip and self.data.ndim == 1 and len(index) == 2 and Ellipsis not in index:
            # A partition-only tile ([P], e.g. t[:, j] of a [P, F] tile) holds one element per
            # partition: indexed with two indices it is the [P, 1] tile it occupies (nki-library's
            # attention_cte slices range_select bounds `t[:, j][:n, :1]`).
            return self.reshape((self.data.shape[0], 1))[index]
        data = self.data
        shape, strides = data.shape, data.strides
        items = []
        offset = self.offset
        axis = 0
        lead = self.lead
        for item in index:
            if item is Ellipsis:
                rest = len(index) - index.index(Ellipsis) - 1
                fill = data.ndim - axis - rest
                items.extend([slice(None)] * fill)
                axis += fill
                continue
            if item is None:
                raise NKIError("tensor indexing", "new axes (None) are not supported",
                               "use .reshape() to add a dimension")
            if axis >= data.ndim:
                raise NKIError("tensor indexing", f"too many indices for a tensor of shape {shape}")
            n = shape[axis]
            if isinstance(item, DynSlice):
                start, stop, step = item.start, item.start + item.size * item.step, item.step
                # size 0 is an empty view, as the slice t[a:a] is (nki-library's cross_entropy gives a
                # core no positions with nl.ds(offset, 0) and never touches the view)
                empty = item.size == 0 and 0 <= start <= n
                if not empty and (item.size <= 0 or step <= 0 or start < 0 or start + (item.size - 1) * step >= n):
                    raise NKIError("tensor indexing", f"{item!r} is out of bounds for axis {axis} of size {n}",
                                   f"tensor shape {shape}")
                items.append(slice(start, stop, step))
                offset += start * strides[axis]
            elif isinstance(item, slice):
                start, stop, step = item.indices(n)
                if item.stop is not None and isinstance(item.stop, int) and item.stop > n:
                    raise NKIError("tensor indexing", f"slice {item.start}:{item.stop} is out of bounds for "
                                   f"axis {axis} of size {n}", f"tensor shape {shape}")
                items.append(slice(start, stop, step))
                if stop != start:
                    offset += start * strides[axis]
            elif isinstance(item, (int, np.integer)):
                i = int(item)
                if not -n <= i < n:
                    raise NKIError("tensor indexing", f"index {i} is out of bounds for axis {axis} of size {n}",
                                   f"tensor shape {shape}")
                i %= n
                offset += i * strides[axis]
                # On chip the partition axis stays an axis (of size 1): tiles are always [P, ...].
                keep = axis == self.lead and self.buffer.on_chip
                items.append(slice(i, i + 1) if keep else i)
                lead -= axis < self.lead  # a block index drops that block axis
            else:
                raise NKIError("tensor indexing", f"unsupported index {item!r}",
                               "use ints, slices or nl.ds(start, size)")
            axis += 1
        return NkiTensor(self.alloc, data[tuple(items)], offset, lead, dtype=self.vdtype)

    def __setitem__(self, index, value):
        """The older dialect's write: `t[i_p, i_f] = nl.load(...)`, `t[k] = expr` (see nl.assign)."""
        from . import language as nl
        nl.assign(self[index], value)

    def same_view(self, other) -> bool:
        """Whether `other` is exactly this view (so assigning it is a no-op: `t[i] += x`)."""
        if not isinstance(other, NkiTensor) or other.alloc is not self.alloc or other.shape != self.shape:
            return False
        if self.partial is not None or other.partial is not None:
            return (self.partial is not None and other.partial is not None
                    and np.array_equal(self.partial.flat, other.partial.flat))
        return other.offset == self.offset and other.data.strides == self.data.strides

    def physical(self) -> "NkiTensor":
        """The whole allocation as stored, partition axis first (a block tensor as one tile)."""
        return NkiTensor(self.alloc, self.alloc.storage, 0)

    def _no_blocks(self, what):
        if self.lead:
            raise NKIError(what, f"a tensor of shape {self.shape} still has {self.lead} block dimension(s) "
                           "before its partition dimension", "index the blocks first: t[b] is one tile")

    def reshape(self, *shape) -> "NkiTensor":
        self._no_blocks("reshape")
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        view = self.data.view()
        try:
            view.shape = shape
        except (AttributeError, ValueError) as exc:
            raise NKIError("reshape", f"cannot view shape {self.shape} as {tuple(shape)} without a copy ({exc})",
                           "reshape a contiguous tensor, or copy it first") from None
        if self.buffer.on_chip and view.shape[0] != self.shape[0]:
            raise NKIError("reshape", f"on-chip reshape must keep the partition dimension "
                           f"({self.shape[0]}), got {tuple(view.shape)}")
        return NkiTensor(self.alloc, view, self.offset, dtype=self.vdtype)

    def permute(self, *dims) -> "NkiTensor":
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        self._no_blocks("permute")
        if sorted(dims) != list(range(self.ndim)):
            raise NKIError("permute", f"{dims} is not a permutation of the {self.ndim} axes of {self.shape}")
        if self.buffer.on_chip and dims[0] != 0:
            raise NKIError("permute", "an on-chip tensor cannot move its partition axis with a view",
                           "use nisa.nc_transpose (or a DMA through HBM) to transpose partitions")
        return NkiTensor(self.alloc, self.data.transpose(dims), self.offset, dtype=self.vdtype)

    def transpose(self, *dims) -> "NkiTensor":
        return self.permute(*(dims or reversed(range(self.ndim))))

    @property
    def T(self) -> "NkiTensor":
        return self.permute(*reversed(range(self.ndim)))

    def broadcast_to(self, shape) -> "NkiTensor":
        """NumPy's rules, except that an on-chip tile with fewer axes than `shape` keeps its first
        axis as the partition axis: a [P] tile (a reduction's result) broadcast to [P, F] repeats
        each partition's value along the free axis, as on the hardware (NumPy would align it with
        the last axis and give every partition the whole vector)."""
        shape = tuple(shape)
        data = self.data
        if self.buffer.on_chip and 0 < data.ndim < len(shape):
            data = data.reshape(data.shape + (1,) * (len(shape) - data.ndim))
        try:
            view = np.broadcast_to(data, shape)
        except ValueError:
            raise NKIError("broadcast_to", f"cannot broadcast shape {self.shape} to {shape}"
                           + (" (an on-chip tile's first axis is its partition axis)" if self.buffer.on_chip
                              else "")) from None
        return NkiTensor(self.alloc, view, self.offset, dtype=self.vdtype)

    def ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """A hardware access pattern over this tensor's memory (see access_pattern.py)."""
        from .access_pattern import access_pattern
        return access_pattern(self, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)

    def expand_dims(self, axis) -> "NkiTensor":
        shape = list(self.shape)
        shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, 1)
        return NkiTensor(self.alloc, self.data.reshape(shape), self.offset, dtype=self.vdtype)

    def view(self, dtype) -> "NkiTensor":
        """The same bytes read as another dtype (a reinterpreting cast, no copy), as NumPy's
        `ndarray.view`: the last axis scales by the ratio of the element sizes (a [P, 4F] uint8 tile
        is a [P, F] float8_e4m3fn_x4 one). The last axis must be contiguous."""
        from .access_pattern import reinterpret
        return reinterpret(self, dtype, "view")

    # --- operators forward to the nl helpers (imported lazily: language imports this module)
    def _binary(self, other, name, reverse=False):
        from . import language as nl
        op = getattr(nl, name)
        return op(other, self) if reverse else op(self, other)

    def __iadd__(self, o):
        from . import language as nl
        return nl.accumulate(self, o)

    def __add__(self, o): return self._binary(o, "add")
    def __radd__(self, o): return self._binary(o, "add", True)
    def __sub__(self, o): return self._binary(o, "subtract")
    def __rsub__(self, o): return self._binary(o, "subtract", True)
    def __mul__(self, o): return self._binary(o, "multiply")
    def __rmul__(self, o): return self._binary(o, "multiply", True)
    def __truediv__(self, o): return self._binary(o, "divide")
    def __rtruediv__(self, o): return self._binary(o, "divide", True)
    def __pow__(self, o): return self._binary(o, "power")
    def __matmul__(self, o):
        from . import language as nl
        return nl.matmul(self, o)

    def __neg__(self):
        from . import language as nl
        return nl.negative(self)

    def __bool__(self):
        # A tensor is a reference to memory, not a value: as in AWS's NKI (whose NkiTensor defines no
        # truth value, so Python's default applies), it is true. Kernels test optional tensor
        # arguments with it (nki-library's `if params.expert_params.expert_index:`); a tile's
        # *values* cannot steer trace-time Python (compare into a mask and select instead).
        return True


def box(t: NkiTensor):
    """(partition lo, hi, free-byte lo, hi) the view touches inside its allocation (half-open).

    On chip the free range is the span within one partition row; in HBM the whole tensor is one row.
    Conservative (a bounding box), which is what dependency tracking needs.
    """
    data = t.data
    alloc = t.alloc
    # The whole allocation (the common case, cached); a partial access is bounded by it.
    if data is alloc.storage or t.partial is not None:
        if alloc.full_box is None:
            alloc.full_box = _box(NkiTensor(alloc, alloc.storage, 0))
        return alloc.full_box
    return _box(t)


def _box(t: NkiTensor):
    data = t.data
    rb = t.alloc.rowbytes
    off = t.offset
    if data.size == 0:
        return (0, 0, 0, 0)
    lo_f = hi_f = 0
    shape, strides = data.shape, data.strides
    if not t.alloc.buffer.on_chip:
        for n, s in zip(shape, strides):
            if s > 0:
                hi_f += (n - 1) * s
            else:
                lo_f += (n - 1) * s
        return (0, 1, off + lo_f, off + hi_f + data.itemsize)
    p0, f0 = divmod(off, rb)
    if data.ndim == 0:
        return (p0, p0 + 1, f0, f0 + data.itemsize)
    s0 = strides[0]
    if s0 % rb:
        return (0, t.alloc.storage.shape[0], 0, rb)
    p_hi = p0 + (shape[0] - 1) * (s0 // rb) if s0 >= 0 else p0
    p_lo = p0 + (shape[0] - 1) * (s0 // rb) if s0 < 0 else p0
    for n, s in zip(shape[1:], strides[1:]):
        if s > 0:
            hi_f += (n - 1) * s
        else:
            lo_f += (n - 1) * s
    return (p_lo, p_hi + 1, f0 + lo_f, f0 + hi_f + data.itemsize)
