"""The older NKI dialect's index expressions and masks: `nl.arange`, `nl.mgrid`, `mask=`.

An index expression is affine in the axes of an iteration space: `nl.arange(128)[:, None]` is
`j0` over a [128, 1] space, `i * 128 + i_p` is `i * 128 + j0`, and `t[i_p, i_f]` walks the
broadcast space of its indices, exactly as NumPy's integer-array indexing does. Because every
index is affine, a tensor indexed this way is a strided access pattern (what the hardware's DMA
and engines take): `affine_view` builds it as a NumPy view of the allocation, so instructions
read and write it in place and the cost model sees its partitions and bytes.

Comparisons of index expressions make a `Mask`, a boolean over the iteration space. An
instruction given `mask=` writes only where the mask holds (the destination keeps its other
elements) and reads nothing where it does not; an access pattern may run out of its tensor's
bounds only where the mask excludes it (a `PartialView`).
"""

from __future__ import annotations

import numpy as np

from .errors import NKIError


class IndexExpr:
    """`const + sum(coef[k] * j[k])` over an iteration space of `shape` (size-1 axes are broadcast)."""

    __slots__ = ("const", "coef", "shape")
    __array_priority__ = 1000  # `np.int64 * expr` defers to the expression

    def __init__(self, const, coef, shape):
        self.const = int(const)
        self.coef = tuple(int(c) for c in coef)
        self.shape = tuple(int(s) for s in shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self):
        terms = [f"{c}*j{k}" for k, c in enumerate(self.coef) if c and self.shape[k] > 1]
        return f"IndexExpr({' + '.join(terms + [str(self.const)])}, shape={self.shape})"

    def values(self) -> np.ndarray:
        """The index at every point of the iteration space (int64, shape `self.shape`)."""
        out = np.full(self.shape, self.const, dtype=np.int64)
        for k, (c, n) in enumerate(zip(self.coef, self.shape)):
            if c and n > 1:
                view = [1] * len(self.shape)
                view[k] = n
                out = out + (c * np.arange(n, dtype=np.int64)).reshape(view)
        return out

    def bounds(self) -> tuple[int, int]:
        """(smallest, largest) value over the iteration space."""
        lo = hi = self.const
        for c, n in zip(self.coef, self.shape):
            span = c * (n - 1)
            lo, hi = lo + min(span, 0), hi + max(span, 0)
        return lo, hi

    # --- NumPy-style axis placement: nl.arange(n)[:, None]
    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        if sum(item is not None for item in index) != self.ndim or any(
                item is not None and item != slice(None) for item in index):
            raise NKIError("nl.arange", f"index expressions take ':' for each of their {self.ndim} axes and "
                           f"None for new ones, got {index!r}", "write nl.arange(n)[:, None] or [None, :]")
        coef, shape, axes = [], [], iter(range(self.ndim))
        for item in index:
            if item is None:
                coef.append(0)
                shape.append(1)
            else:
                k = next(axes)
                coef.append(self.coef[k])
                shape.append(self.shape[k])
        return IndexExpr(self.const, coef, shape)

    # --- affine arithmetic
    def __add__(self, other):
        if isinstance(other, IndexExpr):
            shape, (a, b) = _broadcast(self, other)
            return IndexExpr(self.const + other.const, [x + y for x, y in zip(a, b)], shape)
        return IndexExpr(self.const + _int(other, "+"), self.coef, self.shape)

    __radd__ = __add__

    def __neg__(self):
        return IndexExpr(-self.const, [-c for c in self.coef], self.shape)

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if isinstance(other, IndexExpr):
            raise NKIError("index expression", "the product of two index expressions is not affine",
                           "multiply index expressions by integers only")
        k = _int(other, "*")
        return IndexExpr(self.const * k, [c * k for c in self.coef], self.shape)

    __rmul__ = __mul__

    def _not_affine(self, *_):
        raise NKIError("index expression", "only +, - and * by an integer keep an index affine",
                       "an access pattern is affine: rewrite // and % as separate arange axes")

    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __truediv__ = __rtruediv__ = _not_affine

    # --- comparisons make masks
    def _compare(self, other, fn):
        if isinstance(other, IndexExpr):
            shape, (a, b) = _broadcast(self, other)
            left, right = IndexExpr(self.const, a, shape).values(), IndexExpr(other.const, b, shape).values()
            return Mask(fn(left, right))
        if isinstance(other, (bool, np.bool_)) or not isinstance(other, (int, np.integer)):
            return NotImplemented  # `expr == Ellipsis` in a list search is identity, not a mask
        return Mask(fn(self.values(), int(other)))

    def __lt__(self, other): return self._compare(other, np.less)
    def __le__(self, other): return self._compare(other, np.less_equal)
    def __gt__(self, other): return self._compare(other, np.greater)
    def __ge__(self, other): return self._compare(other, np.greater_equal)
    def __eq__(self, other): return self._compare(other, np.equal)  # noqa: E704
    def __ne__(self, other): return self._compare(other, np.not_equal)  # noqa: E704

    __hash__ = object.__hash__

    def __bool__(self):
        raise NKIError("index expression", "an index expression has no Python truth value",
                       "compare it to make a mask (mask=(i_p < n)); `if` runs on Python values only")


def _int(value, what) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise NKIError("index expression", f"{what} needs an integer or an index expression, got {value!r}")
    return int(value)


def _broadcast(*exprs):
    """The broadcast iteration shape of expressions (NumPy rules) and each one's coefficients in it."""
    ndim = max(e.ndim for e in exprs)
    shape = [1] * ndim
    padded = []
    for e in exprs:
        pad = ndim - e.ndim
        sizes = (1,) * pad + e.shape
        # A size-1 axis is not iterated: its coefficient must not spread over the broadcast size.
        padded.append((0,) * pad + tuple(c if n > 1 else 0 for c, n in zip(e.coef, e.shape)))
        for k, n in enumerate(sizes):
            if n != 1 and shape[k] not in (1, n):
                raise NKIError("index expression", f"iteration shapes {[x.shape for x in exprs]} do not broadcast")
            shape[k] = max(shape[k], n)
    return tuple(shape), padded


def arange(start, stop=None, step=1) -> IndexExpr:
    """`nl.arange([start,] stop[, step])`: a 1-D index expression; place it with [:, None] / [None, :]."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = (_int(v, "nl.arange") for v in (start, stop, step))
    n = len(range(start, stop, step))
    if n <= 0:
        raise NKIError("nl.arange", f"arange({start}, {stop}, {step}) is empty")
    return IndexExpr(start, (step,), (n,))


class Grid(tuple):
    """What `nl.mgrid[...]` returns: one dense index expression per axis, unpackable, and by name:
    `.p` (axis 0, the partition axis), then `.x`, `.y`, `.z` for the free axes."""

    __slots__ = ()
    p = property(lambda self: self[0])
    x = property(lambda self: self[1])
    y = property(lambda self: self[2])
    z = property(lambda self: self[3])


class _MGrid:
    """`nl.mgrid[0:128, 0:512]`: NumPy's mgrid as index expressions (each spans the whole grid)."""

    def __getitem__(self, index):
        single = not isinstance(index, tuple)
        index = (index,) if single else index
        ranges = []
        for item in index:
            if not isinstance(item, slice) or item.stop is None:
                raise NKIError("nl.mgrid", f"each axis must be a slice start:stop[:step], got {item!r}")
            ranges.append(range(item.start or 0, item.stop, item.step or 1))
        shape = tuple(len(r) for r in ranges)
        if 0 in shape:
            raise NKIError("nl.mgrid", f"mgrid{list(index)} has an empty axis")
        exprs = [IndexExpr(r.start, [r.step if k == axis else 0 for k in range(len(shape))], shape)
                 for axis, r in enumerate(ranges)]
        return exprs[0] if single else Grid(exprs)


mgrid = _MGrid()


class Mask:
    """A boolean over an iteration space, from comparing index expressions; `&`, `|`, `^`, `~`."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = np.asarray(array, dtype=bool)

    def _combine(self, other, fn):
        if isinstance(other, (bool, np.bool_)):
            other = np.bool_(other)
        elif isinstance(other, Mask):
            other = other.array
        else:
            return NotImplemented
        return Mask(fn(self.array, other))

    def __and__(self, other): return self._combine(other, np.logical_and)
    def __or__(self, other): return self._combine(other, np.logical_or)
    def __xor__(self, other): return self._combine(other, np.logical_xor)
    __rand__, __ror__, __rxor__ = __and__, __or__, __xor__

    def __invert__(self):
        return Mask(~self.array)

    def __bool__(self):
        raise NKIError("mask", "a mask has no Python truth value", "pass it as mask= to an instruction")

    def __repr__(self):
        return f"Mask(shape={self.array.shape}, true={int(self.array.sum())})"


def mask_array(mask, instruction):
    """The boolean array of a `mask=` argument: None (no mask) for None or True, an all-False scalar
    for False (the instruction does nothing), else the mask's array."""
    if mask is None or (isinstance(mask, (bool, np.bool_)) and mask):
        return None
    if isinstance(mask, (bool, np.bool_)):
        return np.bool_(False)
    if isinstance(mask, Mask):
        return mask.array
    raise NKIError(instruction, f"mask must be a comparison of nl.arange / nl.mgrid indices, got {mask!r}",
                   "write mask=(i_p < n), combine with & and |")


def fit_mask(array, shape, instruction, role):
    """`array` as a boolean of `shape`. The mask is over the instruction's iteration space; an operand
    of another shape takes what applies to it: a reduction's result keeps the partition dependence
    (true where any reduced element is), a matmul result the free dependence of the moving tensor
    (the contraction axis is the inputs' partition axis)."""
    if array is None:
        return None
    try:
        return np.broadcast_to(array, shape)
    except ValueError:
        pass
    if array.ndim and len(shape) >= 1 and array.shape[0] in (1, shape[0]):
        per_partition = array.reshape(array.shape[0], -1).any(axis=1)
        return np.broadcast_to(per_partition.reshape((-1,) + (1,) * (len(shape) - 1)), shape)
    if array.ndim == len(shape):
        try:
            return np.broadcast_to(array.any(axis=0, keepdims=True), shape)
        except ValueError:
            pass
    raise NKIError(instruction, f"mask of shape {array.shape} does not fit {role} of shape {tuple(shape)}",
                   "build the mask from the same nl.arange / nl.mgrid indices as the access")


# ---------------------------------------------------------------------------- access patterns
class PartialView:
    """An access pattern that leaves its tensor's bounds somewhere: `flat` (element index into the
    allocation per point, clipped into bounds), `oob` (where it is out of bounds) and the first
    violation for the error message. Valid only where an instruction's mask excludes `oob`."""

    __slots__ = ("flat", "oob", "violation")

    def __init__(self, flat, oob, violation):
        self.flat = flat
        self.oob = oob
        self.violation = violation


def is_index_expr(item) -> bool:
    return isinstance(item, IndexExpr)


def affine_view(tensor, index):
    """`tensor[index]` where the index holds index expressions (with ints, and full slices for
    trailing axes). Returns (NumPy view or gathered copy, byte offset, PartialView or None)."""
    data = tensor.data
    # A tile of runtime row numbers on an axis (`t[b, idx_tile, i_f]`, idx_tile an integer [P, 1]
    # tile: an indirect DMA gather, row idx_tile[p] for partition p) takes part in the iteration
    # space as an expression of its shape; its values are added per point below.
    gathers = {}
    if isinstance(index, tuple):
        index = list(index)
        for k, item in enumerate(index):
            if _index_tile(item):
                values = np.asarray(item.data).astype(np.int64)
                gathers[k] = values
                index[k] = IndexExpr(0, (0,) * values.ndim, values.shape)
        index = tuple(index)
    exprs = _index_exprs(tensor, index)
    shape, coefs = _broadcast(*exprs)
    itemsize = data.itemsize
    offset = tensor.offset + sum(e.const * s for e, s in zip(exprs, data.strides))
    strides = [sum(c[k] * s for c, s in zip(coefs, data.strides)) for k in range(len(shape))]
    violation = _first_violation(tensor, exprs, shape, coefs)
    if gathers:
        return _gather_view(tensor, exprs, shape, coefs, offset, strides, gathers)
    if violation is None:
        view = np.ndarray(shape, data.dtype, buffer=tensor.alloc.storage, offset=offset, strides=strides)
        if not data.flags.writeable:
            view.flags.writeable = False
        return view, offset, None
    # Out of bounds somewhere: gather the in-bounds points; the mask must exclude the rest.
    oob = np.zeros(shape, dtype=bool)
    for axis, (e, c) in enumerate(zip(exprs, coefs)):
        v = np.broadcast_to(IndexExpr(e.const, c, shape).values(), shape)
        oob |= (v < 0) | (v >= data.shape[axis])
    flat = np.full(shape, offset, dtype=np.int64)
    for k, (n, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[k] = n
        flat = flat + (s * np.arange(n, dtype=np.int64)).reshape(view)
    flat = flat // itemsize
    storage = _flat_storage(tensor.alloc)
    flat = np.where(oob, 0, flat)
    gathered = storage[flat]
    if not data.flags.writeable:
        gathered.flags.writeable = False
    return gathered, offset, PartialView(flat, oob, violation)


def _index_tile(item) -> bool:
    """An on-chip tile of more than one integer: runtime indices, one per point (a gather)."""
    data = getattr(item, "data", None)
    return hasattr(item, "alloc") and isinstance(data, np.ndarray) and data.size > 1 \
        and np.issubdtype(data.dtype, np.integer)


def _gather_view(tensor, exprs, shape, coefs, offset, strides, gathers):
    """The points of an access with runtime index tiles: a gathered copy and its PartialView (the
    elements it reads and writes; points whose runtime index leaves the tensor are out of bounds,
    which the instruction's mask must exclude, as for an affine access)."""
    data = tensor.data
    itemsize = data.itemsize
    flat = np.full(shape, offset, dtype=np.int64)
    for k, (n, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[k] = n
        flat = flat + (s * np.arange(n, dtype=np.int64)).reshape(view)
    oob = np.zeros(shape, dtype=bool)
    violation = None
    for axis, (e, c) in enumerate(zip(exprs, coefs)):
        if axis in gathers:
            pad = len(shape) - gathers[axis].ndim
            v = np.broadcast_to(gathers[axis].reshape((1,) * pad + gathers[axis].shape), shape)
            flat = flat + v * data.strides[axis]
        else:
            v = np.broadcast_to(IndexExpr(e.const, c, shape).values(), shape)
        bad = (v < 0) | (v >= data.shape[axis])
        if bad.any() and violation is None:
            name = tensor.alloc.name or f"the {tensor.buffer!r} tensor"
            violation = (f"index on axis {axis} of {name} (shape {tuple(data.shape)}) takes values "
                         f"{int(v.min())}..{int(v.max())}, outside its bound [0, {data.shape[axis]})")
        oob |= bad
    flat = np.where(oob, 0, flat // itemsize)
    gathered = _flat_storage(tensor.alloc)[flat]
    if not data.flags.writeable:
        gathered.flags.writeable = False
    return gathered, offset, PartialView(flat, oob, violation)


def _flat_storage(alloc) -> np.ndarray:
    storage = alloc.storage
    assert storage.flags.c_contiguous, "allocations are C-contiguous"
    return storage.reshape(-1)


def _index_exprs(tensor, index):
    """One index expression per axis of the tensor: the expressions broadcast among themselves
    (NumPy), ints are constants, and trailing full slices add iteration axes after theirs."""
    shape = tensor.data.shape
    items = list(index)
    for at, item in enumerate(items):
        if item is Ellipsis:
            items[at:at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
            break
    if len(items) > len(shape):
        raise NKIError("tensor indexing", f"{len(items)} indices for a tensor of shape {shape}")
    items += [slice(None)] * (len(shape) - len(items))
    last = max(i for i, item in enumerate(items) if isinstance(item, IndexExpr))
    ndim = max(item.ndim for item in items if isinstance(item, IndexExpr))
    # Trailing full slices add iteration axes; an int after the last expression does not (NumPy:
    # `t[i_p, 0]` with i_p = nl.arange(128)[:, None] is [128, 1], as AWS's kernels broadcast it).
    after = [axis for axis in range(last + 1, len(items)) if isinstance(items[axis], slice)]
    trailing = len(after)
    exprs = []
    for axis, item in enumerate(items):
        if isinstance(item, IndexExpr):
            pad = ndim - item.ndim
            exprs.append(IndexExpr(item.const, (0,) * pad + item.coef + (0,) * trailing,
                                   (1,) * pad + item.shape + (1,) * trailing))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            i = int(item)
            exprs.append(IndexExpr(i + shape[axis] if i < 0 else i, (), ()))
        elif _runtime_scalar(item):
            # A one-element on-chip tile used as an index (dynamic DMA addressing: a batch slot
            # read at run time); the simulator knows its value. Out of range, it leaves the
            # access partial, as a constant out of range does.
            exprs.append(IndexExpr(int(np.asarray(item.data).reshape(-1)[0]), (), ()))
        elif isinstance(item, slice) and axis > last:
            start, stop, step = item.indices(shape[axis])
            k = ndim + after.index(axis)
            coef, sizes = [0] * (ndim + trailing), [1] * (ndim + trailing)
            coef[k], sizes[k] = step, len(range(start, stop, step))
            exprs.append(IndexExpr(start, coef, sizes))
        else:
            raise NKIError("tensor indexing", f"index {item!r} on axis {axis} cannot be mixed with nl.arange "
                           "indices after it", "index every axis with nl.arange / nl.mgrid expressions or ints")
    return exprs


def _runtime_scalar(item) -> bool:
    """A tile (NkiTensor) of one integer element."""
    data = getattr(item, "data", None)
    return hasattr(item, "alloc") and isinstance(data, np.ndarray) and data.size == 1 \
        and np.issubdtype(data.dtype, np.integer)


def _first_violation(tensor, exprs, shape, coefs):
    for axis, (e, c) in enumerate(zip(exprs, coefs)):
        lo, hi = IndexExpr(e.const, c, shape).bounds()
        n = tensor.data.shape[axis]
        if lo < 0 or hi >= n:
            name = tensor.alloc.name or f"the {tensor.buffer!r} tensor"
            return (f"index on axis {axis} of {name} (shape {tuple(tensor.data.shape)}) ranges over "
                    f"{lo}..{hi}, outside its bound [0, {n})")
    return None


def check_in_bounds(t, mask, instruction, role):
    """Raise if the partial access `t` touches an out-of-bounds point that `mask` does not exclude."""
    partial = t.partial
    if partial is None:
        return
    live = partial.oob if mask is None else partial.oob & fit_mask(mask, t.shape, instruction, role)
    if live.any():
        raise NKIError(instruction, f"{role} is out of bounds: {partial.violation}",
                       "keep the indices inside the tensor, or exclude the rest with mask=(...)")


def scatter(t, where) -> None:
    """Write a partial view's gathered values back into its allocation where `where` (and in bounds)."""
    partial = t.partial
    valid = ~partial.oob if where is None else (~partial.oob & where)
    _flat_storage(t.alloc)[partial.flat[valid]] = t.data[valid]
