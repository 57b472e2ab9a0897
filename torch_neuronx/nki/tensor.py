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
import weakref

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
_INDIRECT = weakref.WeakSet()  # views that use indirect addressing (a dynamic select, .ap(scalar_offset=))


class Allocation:
    """One buffer allocation (an `nl.ndarray`, or a kernel argument copied into HBM)."""

    __slots__ = ("id", "buffer", "storage", "dtype", "name", "written", "acc", "rowbytes", "dtype_name",
                 "full_box", "valid", "whole", "__weakref__")

    def __init__(self, shape, dtype, buffer: Buffer, name=None, fill=None, storage=None):
        self.id = next(_ids)
        self.buffer = buffer
        self.dtype = dtype
        self.name = name
        self.written = False
        self.acc = None  # PSUM only: which elements a matmul accumulation group has started on
        self.valid = None  # elements a masked instruction wrote when it filled the whole allocation
        # Whether `storage` is the tensor as allocated (False: block axes stored partition-major, or
        # a region of an allocator-placed buffer); NkiTensor.base_tensor needs it.
        self.whole = True
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
        if not self.buffer.on_chip and _slices_past_end(index, self.data.shape):
            # An HBM slice that runs past the tensor's end (AWS's adaptive pooling kernel loads
            # in[256:384] of 288 rows under mask=(i_p < 288)): the same access as index expressions,
            # a partial access pattern that the instruction's mask must cover, as for nl.arange.
            data, offset, partial = _ix.affine_view(self, _slices_as_exprs(index, self.data.shape))
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
        # The trailing Ellipsis keeps an element (`out[b, h]`, every axis an int) a 0-d view of the
        # memory, not the copied NumPy scalar plain indexing gives: nl.store writes through it.
        return NkiTensor(self.alloc, data[(*items, Ellipsis)], offset, lead, dtype=self.vdtype)

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

    def reshape(self, *shape, **kwargs) -> "NkiTensor":
        """A view of another shape (no copy). The shape is given as arguments, one tuple, or
        `shape=` (as AWS's older reference kernels call it: `t.reshape(shape=(n, h, w))`)."""
        if kwargs:
            if shape or set(kwargs) != {"shape"}:
                raise NKIError("reshape", f"reshape takes the shape as arguments or as shape=, got "
                               f"{shape!r} and {sorted(kwargs)}", "call t.reshape((a, b)) or t.reshape(shape=(a, b))")
            shape = (kwargs["shape"],)
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

    @property
    def base_tensor(self) -> "NkiTensor":
        """The tensor this view was made from: the whole allocation (a kernel argument, an
        `nl.ndarray`), with the allocation's dtype. nki-library's MX kernels read it from kernel
        arguments and views (`w.base_tensor.dtype`, index the base, then `.view(w.dtype)`)."""
        if not self.alloc.whole:
            raise NKIError("NkiTensor.base_tensor", f"{self.name or 'this tensor'} is a block tensor or an "
                           "allocator-placed tile, whose base the simulator does not model",
                           "index the tensor itself, or allocate it with nl.ndarray without block axes")
        return NkiTensor(self.alloc, self.alloc.storage)

    # --- AWS's NkiTensor view API (shape-based views; all share the allocation, nothing is copied)
    @property
    def strides(self) -> tuple:
        """Element strides of each dimension (AWS's access-pattern steps). On chip a partition step
        counts the elements of one partition row of the allocation, as `.ap` patterns do."""
        item = self.data.itemsize
        return tuple(s // item for s in self.data.strides)

    @property
    def name(self) -> str:
        """The allocation's name (`nl.ndarray(..., name=)`), '' when it has none."""
        return self.alloc.name or ""

    @property
    def size(self) -> int:
        """The number of elements."""
        return self.data.size

    def is_contiguous(self) -> bool:
        """Whether the view covers its memory row-major without gaps: each dimension of size > 1 steps
        by the product of the inner sizes. On chip the partition dimension is skipped (AWS)."""
        expected = 1
        first = 1 if self.buffer.on_chip else 0
        for n, s in reversed(list(zip(self.shape[first:], self.strides[first:]))):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def get_pattern(self) -> list:
        """The view's access pattern, `[[stride, count], ...]` per dimension (see `strides`)."""
        return [[s, n] for s, n in zip(self.strides, self.shape)]

    def is_indirect(self) -> bool:
        """Whether the view uses indirect addressing (a dynamic `select`, `.ap(scalar_offset=)`)."""
        return self in _INDIRECT

    def _dim(self, dim, what, allow_partition=False, extra=0):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise NKIError(what, f"dim must be an integer, got {dim!r}")
        n = self.ndim + extra
        if not -n <= dim < n:
            raise NKIError(what, f"dim {dim} is outside the {self.ndim} dimensions of shape {self.shape}")
        dim = int(dim) % n
        if dim == 0 and self.buffer.on_chip and not allow_partition:
            raise NKIError(what, "dim 0 is the partition dimension of an on-chip tensor; this view cannot change it",
                           "apply it to a free dimension (1 or later)")
        self._no_blocks(what)
        return dim

    def _strided(self, shape, strides) -> "NkiTensor":
        item = self.data.itemsize
        view = np.lib.stride_tricks.as_strided(self.data, shape=tuple(shape), strides=tuple(s * item for s in strides))
        return NkiTensor(self.alloc, view, self.offset, dtype=self.vdtype)

    def broadcast(self, dim, size) -> "NkiTensor":
        """`t.broadcast(dim, size)`: a size-1 dimension repeated `size` times (a stride-0 view)."""
        dim = self._dim(dim, "broadcast")
        if self.shape[dim] != 1:
            raise NKIError("broadcast", f"dimension {dim} of {self.shape} has size {self.shape[dim]}; only a size-1 "
                           "dimension broadcasts", "expand_dim first to add a size-1 dimension")
        shape = list(self.shape)
        shape[dim] = int(size)
        strides = list(self.strides)
        strides[dim] = 0
        view = np.lib.stride_tricks.as_strided(self.data, shape=tuple(shape),
                                               strides=tuple(s * self.data.itemsize for s in strides), writeable=False)
        return NkiTensor(self.alloc, view, self.offset, dtype=self.vdtype)

    def expand_dim(self, dim) -> "NkiTensor":
        """`t.expand_dim(dim)`: a new size-1 dimension at position `dim` (not 0 on chip)."""
        dim = self._dim(dim, "expand_dim", extra=1)
        shape, strides = list(self.shape), list(self.strides)
        shape.insert(dim, 1)
        strides.insert(dim, 0)
        return self._strided(shape, strides)

    def squeeze_dim(self, dim) -> "NkiTensor":
        """`t.squeeze_dim(dim)`: the size-1 dimension `dim` removed (not 0 on chip)."""
        dim = self._dim(dim, "squeeze_dim")
        if self.shape[dim] != 1:
            raise NKIError("squeeze_dim", f"dimension {dim} of {self.shape} has size {self.shape[dim]}, not 1")
        shape, strides = list(self.shape), list(self.strides)
        del shape[dim], strides[dim]
        return self._strided(shape, strides)

    def reshape_dim(self, dim, shape) -> "NkiTensor":
        """`t.reshape_dim(dim, shape)`: dimension `dim` split into `shape` (one entry may be -1)."""
        shape = [int(s) for s in shape]
        trivial = bool(shape) and shape[0] == self.shape[0] and all(s == 1 for s in shape[1:])
        dim = self._dim(dim, "reshape_dim", allow_partition=trivial)
        n = self.shape[dim]
        if shape.count(-1) > 1 or any(s <= 0 and s != -1 for s in shape):
            raise NKIError("reshape_dim", f"shape {tuple(shape)} must hold positive sizes and at most one -1")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if n % known:
                raise NKIError("reshape_dim", f"cannot infer -1 in {tuple(shape)}: {n} is not a multiple of {known}")
            shape[shape.index(-1)] = n // known
        if math.prod(shape) != n:
            raise NKIError("reshape_dim", f"shape {tuple(shape)} has {math.prod(shape)} elements, dimension {dim} "
                           f"of {self.shape} has {n}", "the sizes must multiply to the dimension's size")
        step = self.strides[dim]
        inner = [step * math.prod(shape[i + 1:]) for i in range(len(shape))]
        new_shape = list(self.shape[:dim]) + shape + list(self.shape[dim + 1:])
        new_strides = list(self.strides[:dim]) + inner + list(self.strides[dim + 1:])
        return self._strided(new_shape, new_strides)

    def flatten_dims(self, start_dim, end_dim) -> "NkiTensor":
        """`t.flatten_dims(start_dim, end_dim)`: dimensions start..end (inclusive) merged into one;
        they must be contiguous with each other in memory (start_dim > 0 on chip)."""
        start = self._dim(start_dim, "flatten_dims")
        end = self._dim(end_dim, "flatten_dims")
        if end < start:
            raise NKIError("flatten_dims", f"end_dim {end_dim} is before start_dim {start_dim}")
        sizes, steps = self.shape[start:end + 1], self.strides[start:end + 1]
        for i in range(len(sizes) - 1):
            if sizes[i] != 1 and sizes[i + 1] != 1 and steps[i] != steps[i + 1] * sizes[i + 1]:
                raise NKIError("flatten_dims", f"dimensions {start}..{end} of {self.shape} (strides {self.strides}) "
                               "are not contiguous in memory", "copy the tensor into a contiguous tile first")
        live = [s for n, s in zip(sizes, steps) if n != 1]
        shape = list(self.shape[:start]) + [math.prod(sizes)] + list(self.shape[end + 1:])
        strides = list(self.strides[:start]) + [live[-1] if live else 1] + list(self.strides[end + 1:])
        return self._strided(shape, strides)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None) -> "NkiTensor":
        """`t.rearrange(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`: einops-style split (tuples in
        src_pattern), reorder, and merge (tuples in dst_pattern) as one view."""
        what = "rearrange"
        fixed = dict(fixed_sizes or {})
        src, dst = list(src_pattern), list(dst_pattern)
        if len(src) != self.ndim:
            raise NKIError(what, f"src_pattern {tuple(src)} names {len(src)} dimensions, the tensor has {self.ndim}")
        view, names = self, []
        for dim in reversed(range(len(src))):
            group = src[dim]
            if isinstance(group, str):
                names.insert(0, group)
                continue
            group = list(group)
            sizes = [fixed.get(g, -1) for g in group]
            view = view.reshape_dim(dim, sizes) if len(group) > 1 else view
            names[0:0] = group
        flat_dst = [g for item in dst for g in ((item,) if isinstance(item, str) else item)]
        if sorted(flat_dst) != sorted(names) or len(set(names)) != len(names):
            raise NKIError(what, f"dst_pattern {tuple(dst)} must name each dimension of src_pattern {tuple(src)} once")
        view = view.permute([names.index(g) for g in flat_dst])
        dim = 0
        for item in dst:
            if isinstance(item, str):
                dim += 1
                continue
            if len(item) > 1:
                view = view.flatten_dims(dim, dim + len(item) - 1)
            dim += 1
        return view

    def slice(self, dim, start, end, step=1) -> "NkiTensor":  # noqa: A003 - AWS's name
        """`t.slice(dim, start, end, step=1)`: elements start..end-1 of dimension `dim`."""
        dim = self._dim(dim, "slice", allow_partition=True)
        n = self.shape[dim]
        if not (0 <= start < end <= n) or step < 1:
            raise NKIError("slice", f"slice({start}, {end}, step={step}) of dimension {dim} (size {n}) needs "
                           f"0 <= start < end <= {n} and step >= 1")
        if self in _INDIRECT:
            raise NKIError("slice", "this view uses indirect addressing; its dimensions cannot be sliced further",
                           "slice before the dynamic select")
        index = [slice(None)] * self.ndim
        index[dim] = slice(int(start), int(end), int(step))
        return self[tuple(index)]

    def select(self, dim, index) -> "NkiTensor":
        """`t.select(dim, i)`: element i of dimension `dim`, the dimension removed. `index` may be a
        one-element integer tile (a dynamic select, read when the view is made); the result is then
        indirect and cannot be selected dynamically again."""
        what = "select"
        dynamic = isinstance(index, NkiTensor)
        dim = self._dim(dim, what)
        if self in _INDIRECT:
            raise NKIError(what, "this view already uses indirect addressing (one dynamic select per tensor)",
                           "select statically, or make one select over the whole tensor")
        if dynamic:
            if index.data.size != 1 or _dt.is_float(index.dtype):
                raise NKIError(what, f"a dynamic index must be a one-element integer tile, got {index.shape} "
                               f"{_dt.name(index.dtype)}")
            i = int(index.data.reshape(-1)[0])
        elif isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise NKIError(what, f"index must be an integer or a one-element tile, got {index!r}")
        else:
            i = int(index)
        n = self.shape[dim]
        if not 0 <= i < n:
            raise NKIError(what, f"index {i} is outside dimension {dim} of size {n}" +
                           (" (read from the index tile)" if dynamic else ""))
        shape, strides = list(self.shape), list(self.strides)
        offset = strides[dim] * i * self.data.itemsize
        del shape[dim], strides[dim]
        base = self[tuple([slice(None)] * dim + [slice(i, i + 1)])]
        view = np.lib.stride_tricks.as_strided(base.data, shape=tuple(shape),
                                               strides=tuple(s * self.data.itemsize for s in strides))
        out = NkiTensor(self.alloc, view, self.offset + offset, dtype=self.vdtype)
        if dynamic:
            _INDIRECT.add(out)
        return out

    def vector_select(self, dim, vector_offset) -> "NkiTensor":
        """`t.vector_select(0, offsets)`: an HBM tensor's dimension 0 indexed per partition: partition p
        of the result is t[offsets[p]] (offsets an SBUF [P, 1] integer tile, read when the view is made).
        The view gathers (reads) and scatters (writes); an index outside dimension 0 is an NKIError
        unless the instruction skips it (`oob_mode=nisa.oob_mode.skip`)."""
        from .access_pattern import _bounds, indirect_view, vector_offsets

        what = "vector_select"
        if dim != 0:
            raise NKIError(what, f"dim must be 0 (AWS), got {dim!r}")
        if self.buffer.on_chip:
            raise NKIError(what, f"the tensor is in {self.buffer!r}; vector_select indexes HBM tensors only (AWS)",
                           "gather on chip with nl.gather_flattened or nisa.nc_n_gather")
        if self in _INDIRECT or self.partial is not None:
            raise NKIError(what, "this view already uses indirect addressing (one dynamic select per tensor)")
        if self.vdtype is not None:
            raise NKIError(what, "vector_select on a reinterpreted (.view) tensor is not simulated")
        rows = vector_offsets(what, vector_offset, vector_offset.partitions if isinstance(vector_offset, NkiTensor)
                              else -1)
        item = self.data.itemsize
        steps = [s // item for s in self.data.strides]
        rest = self.shape[1:]
        flat = (self.offset // item + rows * steps[0]).reshape((len(rows),) + (1,) * len(rest))
        for k, n in enumerate(rest, start=1):
            shape = [1] * (len(rest) + 1)
            shape[k] = n
            flat = flat + (steps[k] * np.arange(n, dtype=np.int64)).reshape(shape)
        n0 = self.shape[0]
        bad = (rows < 0) | (rows >= n0)
        lo, hi = _bounds(self)
        if bad.any():  # an index outside dimension 0 is out of bounds even where it lands inside memory
            flat = np.where(bad.reshape((-1,) + (1,) * len(rest)), hi, flat)
        return indirect_view(self, flat, lo, hi, what, rows)

    def reinterpret_cast(self, dtype) -> "NkiTensor":
        """`t.reinterpret_cast(dtype)`: the same bytes as another dtype, as `t.view(dtype)`."""
        from .access_pattern import reinterpret
        return reinterpret(self, dtype, "reinterpret_cast")

    # --- the older reference's tile type (`nki.tensor`)
    def assert_shape(self, shape) -> "NkiTensor":
        """`t.assert_shape(shape)`: t itself; an NKIError when its shape is not `shape`."""
        if tuple(self.shape) != tuple(shape):
            raise NKIError("assert_shape", f"the tensor has shape {self.shape}, expected {tuple(shape)}")
        return self

    def astype(self, dtype) -> "NkiTensor":
        """`t.astype(dtype)`: a copy cast to `dtype` in a new SBUF tile (a copy always occurs)."""
        from . import language as nl
        return nl.copy(self, dtype=dtype)

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


def _slices_past_end(index, shape) -> bool:
    """True when a plain slice (no index expression) has an explicit stop past its axis's end."""
    axis = 0
    for item in index:
        if item is Ellipsis:
            axis = len(shape) - (len(index) - index.index(Ellipsis) - 1)
            continue
        if axis >= len(shape):
            return False
        if isinstance(item, slice) and isinstance(item.stop, (int, np.integer)) and item.stop > shape[axis] \
                and (item.step is None or item.step > 0) and (item.start is None or 0 <= item.start):
            return True
        axis += 1
    return False


def _slices_as_exprs(index, shape):
    """`index` with each slice an index expression on an iteration axis of its own (in order)."""
    items = []
    for item in index:
        if item is Ellipsis:
            items.extend([slice(None)] * (len(shape) - (len(index) - 1)))
        else:
            items.append(item)
    slices = [k for k, item in enumerate(items) if isinstance(item, slice)]
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, slice):
            out.append(item)
            continue
        step = item.step or 1
        start = item.start or 0
        stop = shape[k] if item.stop is None else int(item.stop)
        j = slices.index(k)
        coef = [0] * len(slices)
        sizes = [1] * len(slices)
        coef[j], sizes[j] = step, len(range(start, stop, step))
        out.append(_ix.IndexExpr(start, coef, sizes))
    return tuple(out)


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
