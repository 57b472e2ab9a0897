"""`NkiTensor.ap(pattern, offset, ...)`: a hardware access pattern over a tensor's memory.

AWS's escape hatch below slicing/reshape (docs "NKI Access Patterns"): `pattern` is a list of
`[step, num]` pairs, outermost first, and `offset` the element offset of the first element from
the start of the tensor. In HBM every pair steps through the tensor's flat memory (in elements).
On chip the tensor is counted the same way, flattened row-major (a partition is its free size of
elements): the first pair moves whole partitions, the others step within each partition's row.
The result is a strided view of the same memory, shape `[num, ...]`: instructions read and write it
in place, and the cost model charges its partitions and bytes like any view.

`scalar_offset` (a one-element tile, or the view `.ap` gives of one) adds its value times the
stride of dimension `indirect_dim` of the tensor's shape, as the nki-library's dynamic selects use
it (`logits.ap(..., scalar_offset=targets.ap(...), indirect_dim=1)`): the simulator reads the value
when the view is made, which is when the kernel's Python issues the instruction that uses it.
"""

from __future__ import annotations

import math

import numpy as np

from . import dtypes as _dt
from .errors import NKIError

_INSTR = "ap"


def access_pattern(t, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0,
                   dtype=None):
    from .tensor import NkiTensor

    t._no_blocks(_INSTR)
    if vector_offset is not None:
        return _vector_offset_view(t, _pairs(pattern), int(offset) + _dynamic_offset(t, scalar_offset, indirect_dim),
                                   vector_offset, indirect_dim, dtype)
    # dtype=: the memory read as another dtype (AWS's MX tutorials view uint8/uint32 HBM data as the
    # packed *_x4 types); steps, counts and offset then count elements of that dtype.
    vdtype = t.dtype if dtype is None else _dt.normalize(dtype, _INSTR)
    pairs = _pairs(pattern)
    offset = int(offset) + _dynamic_offset(t, scalar_offset, indirect_dim)
    storage = t.alloc.storage
    vstorage = _dt.storage_dtype(vdtype)
    item = vstorage.itemsize
    shape = tuple(n for _, n in pairs)
    try:
        if t.buffer.on_chip:
            strides, start = _on_chip_strides(t, pairs, offset, item)
        else:
            start = t.offset + offset * item
            strides = tuple(s * item for s, _ in pairs)
            _check_span(t, start, shape, strides, storage.nbytes, "the tensor's memory", item)
    except OutOfBounds as exc:
        if scalar_offset is not None and not t.buffer.on_chip and vstorage == storage.dtype:
            # A run-time offset that leaves the tensor: per element, as a DMA with
            # oob_mode=skip leaves those writes out (nki-library's indexed_flatten marks unused rows
            # with an invalid offset and skips them); without skip the instruction still refuses it.
            return _dynamic_out_of_bounds_view(t, pairs, start // item, offset)
        # Reported when an instruction uses the view, not when it is built: kernels build views in
        # a loop and use only those a later guard lets through (nki-library's output_projection_tkg
        # builds one past its last head group and skips it with `if h_2_idx < h_2_size`).
        return OutOfBoundsView(exc, shape)
    if vstorage == storage.dtype:
        # Allocations are C-contiguous, so the flat view shares their memory (reshape copies nothing).
        base = storage.reshape(-1)[start // item:]
    else:
        base = np.ndarray(((storage.nbytes - start) // item,), vstorage, buffer=storage, offset=start)
    view = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides)
    out = NkiTensor(t.alloc, view, start, dtype=_view_dtype(vdtype, t.alloc.dtype))
    if scalar_offset is not None:  # an indirect view (NkiTensor.is_indirect)
        from .tensor import _INDIRECT
        _INDIRECT.add(out)
    return out


class OutOfBounds(NKIError):
    """An access pattern that leaves its tensor (raised when an instruction uses the view)."""


class OutOfBoundsView:
    """What `t.ap(...)` returns for a pattern that leaves `t`: its shape, and the error, raised as
    soon as anything else of it is read or an instruction is given it."""

    __slots__ = ("error", "shape")

    def __init__(self, error, shape):
        self.error = error
        self.shape = shape

    def __getattr__(self, name):
        raise self.error

    def __getitem__(self, index):
        raise self.error

    def __repr__(self):
        return f"<out-of-bounds access pattern: {self.error.rule}>"


def _view_dtype(vdtype, alloc_dtype):
    """What a view records as its own dtype: None when it is the allocation's."""
    same = vdtype is alloc_dtype or (isinstance(vdtype, np.dtype) and isinstance(alloc_dtype, np.dtype)
                                     and vdtype == alloc_dtype)
    return None if same else vdtype


def reinterpret(t, dtype, what="view"):
    """`t.view(dtype)`: t's bytes as `dtype`, the last axis scaled by the ratio of element sizes."""
    from .tensor import NkiTensor

    t._no_blocks(what)
    vdtype = _dt.normalize(dtype, what)
    vstorage = _dt.storage_dtype(vdtype)
    data = t.data
    if vstorage.itemsize != data.itemsize:
        if t.partial is not None or data.ndim < (2 if t.buffer.on_chip else 1):
            raise NKIError(what, f"a view of shape {t.shape} cannot change the element size "
                           f"({data.itemsize} -> {vstorage.itemsize} bytes)",
                           "view a tensor whose last axis is a free axis")
        if data.strides[-1] != data.itemsize or (data.shape[-1] * data.itemsize) % vstorage.itemsize:
            raise NKIError(what, f"the last axis ({data.shape[-1]} x {data.itemsize} bytes, stride "
                           f"{data.strides[-1]}) is not contiguous or not a whole number of "
                           f"{_dt.name(vdtype)} elements ({vstorage.itemsize} bytes)",
                           "view a contiguous last axis whose byte size is a multiple of the new element's")
    try:
        new = data.view(vstorage)
    except ValueError as exc:
        raise NKIError(what, f"cannot view shape {t.shape} as {_dt.name(vdtype)} ({exc})") from None
    return NkiTensor(t.alloc, new, t.offset, t.lead, t.partial,
                     dtype=_view_dtype(vdtype, t.alloc.dtype))


def _pairs(pattern):
    try:
        pairs = [(int(s), int(n)) for s, n in pattern]
    except (TypeError, ValueError):
        raise NKIError(_INSTR, f"pattern must be a list of [step, num] pairs, got {pattern!r}") from None
    if not pairs or any(n <= 0 for _, n in pairs):
        raise NKIError(_INSTR, f"pattern {pattern!r} must have at least one pair and positive counts")
    return pairs


def _dynamic_offset(t, scalar_offset, indirect_dim) -> int:
    """Elements the runtime value of `scalar_offset` moves the access by."""
    from .tensor import NkiTensor

    if scalar_offset is None:
        return 0
    if isinstance(scalar_offset, NkiTensor):
        if scalar_offset.data.size != 1:
            raise NKIError(_INSTR, f"scalar_offset must hold one value, got shape {scalar_offset.shape}")
        value = scalar_offset.data.reshape(-1)[0]
    else:
        value = scalar_offset
    if not 0 <= indirect_dim < t.ndim:
        raise NKIError(_INSTR, f"indirect_dim {indirect_dim} is outside the tensor's {t.ndim} dimensions")
    return int(np.float32(value)) * math.prod(t.shape[indirect_dim + 1:])


def _on_chip_strides(t, pairs, offset, item):
    """Byte strides and start of an on-chip pattern. Steps and offset count elements (of `item`
    bytes) of the tensor flattened row-major (a partition is `free_size` elements), as nki-library's
    TensorView computes them: the first step moves whole partitions, the others stay within a
    partition's row."""
    row_bytes = t.free_size * t.data.itemsize
    if row_bytes % item:
        raise NKIError(_INSTR, f"a partition of the tensor ({t.free_size} x {t.data.itemsize} bytes) is not a "
                       f"whole number of {item}-byte elements")
    free_size = row_bytes // item
    row_step = t.data.strides[0] if t.ndim > 1 else t.alloc.rowbytes
    if t.ndim > 1 and not _row_contiguous(t):
        raise NKIError(_INSTR, f"the tensor's view {t.shape} is not contiguous within a partition",
                       "call .ap on the whole tile")
    (pstep, pnum), free = pairs[0], pairs[1:]
    p0, f0 = divmod(offset, free_size)
    if pstep % free_size and pnum > 1:
        raise NKIError(_INSTR, f"the partition step {pstep} is not a multiple of the {free_size} elements of "
                       "a partition", "the first [step, num] pair moves whole partitions")
    pstep //= free_size
    if p0 < 0 or pstep < 0 or p0 + (pnum - 1) * pstep >= t.partitions:
        raise OutOfBounds(_INSTR, f"partitions {p0}..{p0 + (pnum - 1) * pstep} leave the tensor's "
                       f"{t.partitions} partitions")
    last = f0 + sum((n - 1) * s for s, n in free)
    if any(s < 0 for s, _ in free) or last >= free_size:
        raise OutOfBounds(_INSTR, f"the free pattern {[list(p) for p in free]} from element {f0} leaves a "
                       f"partition's {free_size} elements")
    start = t.offset + p0 * row_step + f0 * item
    return (pstep * row_step,) + tuple(s * item for s, _ in free), start


def _row_contiguous(t):
    expected = t.data.itemsize
    for n, s in zip(reversed(t.shape[1:]), reversed(t.data.strides[1:])):
        if n > 1 and s != expected:
            return False
        expected *= n
    return True


def _check_span(t, start, shape, strides, nbytes, what, item):
    lo = start + sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = start + sum((n - 1) * s for n, s in zip(shape, strides) if s > 0)
    if lo < 0 or hi + item > nbytes:
        raise OutOfBounds(_INSTR, f"the pattern reaches elements {lo // item}..{hi // item}, outside {what} "
                       f"({nbytes // item} elements)", "check the pattern's steps, counts and offset")


def vector_offsets(instr, vector_offset, count):
    """The per-partition indices of a `vector_offset` tile (an SBUF tile of `count` integers, one
    per partition: [P, 1] or an `.ap` view of such a column), read when the view is made."""
    from .tensor import NkiTensor

    if not isinstance(vector_offset, NkiTensor) or vector_offset.buffer.kind != "sbuf":
        raise NKIError(instr, f"vector_offset must be an SBUF tile of per-partition indices, got {vector_offset!r}",
                       "load the indices into an SBUF [P, 1] integer tile")
    if _dt.is_float(vector_offset.dtype):
        raise NKIError(instr, f"vector_offset dtype {_dt.name(vector_offset.dtype)} must be an integer type")
    if vector_offset.data.size != count or vector_offset.partitions != count:
        raise NKIError(instr, f"vector_offset {vector_offset.shape} must hold one index per partition of the "
                       f"access ({count})", f"pass a [{count}, 1] tile")
    return vector_offset.data.reshape(-1).astype(np.int64)


def indirect_view(t, flat, lo, hi, instr, rows):
    """An HBM view gathered at element indices `flat` (of t's storage dtype) of t's allocation,
    with per-point out-of-bounds flags outside [lo, hi): writes scatter back (indexing.PartialView);
    an out-of-bounds point is an NKIError unless the instruction skips it
    (`oob_mode=nisa.oob_mode.skip`) or a mask excludes it."""
    from .indexing import PartialView, _flat_storage
    from .tensor import _INDIRECT, NkiTensor

    oob = (flat < lo) | (flat >= hi)
    violation = None
    if oob.any():
        bad = int(np.argwhere(oob.reshape(oob.shape[0], -1).any(axis=1))[0, 0])
        violation = (f"the indirect index of partition {bad} ({int(rows[bad])}) addresses elements outside "
                     f"the tensor's {hi - lo}")
    flat = np.where(oob, 0, flat)
    out = NkiTensor(t.alloc, _flat_storage(t.alloc)[flat], t.offset, partial=PartialView(flat, oob, violation),
                    dtype=t.vdtype)
    _INDIRECT.add(out)
    return out


def _bounds(t):
    item = t.data.itemsize
    lo = t.offset // item
    return (lo, lo + t.data.size) if t.data.flags.c_contiguous else (0, t.alloc.storage.size)


def _dynamic_out_of_bounds_view(t, pairs, first, offset):
    """An HBM `.ap(..., scalar_offset=)` view that leaves the tensor: the elements it addresses,
    each flagged in or out of bounds (indirect_view), so that oob_mode=skip can leave the outside
    ones out and any other use names the offset."""
    lo, hi = _bounds(t)
    flat = _stepped(np.full((1,) * len(pairs), first, dtype=np.int64), pairs, 0)
    rows = np.full(pairs[0][1], offset, dtype=np.int64)
    return indirect_view(t, flat, lo, hi, _INSTR, rows)


def _stepped(flat, pairs, first_axis):
    """`flat` (element indices, one axis per pair) plus each pair's steps from `first_axis` on."""
    for k, (step, num) in enumerate(pairs[first_axis:], start=first_axis):
        shape = [1] * len(pairs)
        shape[k] = num
        flat = flat + (step * np.arange(num, dtype=np.int64)).reshape(shape)
    return flat


def _vector_offset_view(t, pairs, offset, vector_offset, indirect_dim, dtype):
    """`.ap(pattern, vector_offset=v, indirect_dim=d)` on HBM: point (p, j...) is element
    offset + v[p] * stride(d) + sum(j_k * step_k) of t (the first pair's count is the number of
    partitions, its step replaced by the per-partition index; nki-library's router_topk scatters with
    flattened indices so, attention_tkg gathers cache blocks)."""
    if t.buffer.on_chip:
        raise NKIError(_INSTR, "vector_offset (per-partition indirect access) is simulated for HBM tensors only",
                       "gather on chip with nisa.nc_n_gather / nl.gather_flattened")
    if dtype is not None and _dt.normalize(dtype, _INSTR) != t.dtype:
        raise NKIError(_INSTR, "vector_offset with a dtype reinterpretation is not simulated", "view the tensor first")
    if t.vdtype is not None:
        raise NKIError(_INSTR, "vector_offset on a reinterpreted (.view) tensor is not simulated")
    if not 0 <= indirect_dim < t.ndim:
        raise NKIError(_INSTR, f"indirect_dim {indirect_dim} is outside the tensor's {t.ndim} dimensions")
    count = pairs[0][1]
    rows = vector_offsets(_INSTR, vector_offset, count)
    lo, hi = _bounds(t)
    flat = (lo + offset + rows * math.prod(t.shape[indirect_dim + 1:])).reshape((count,) + (1,) * (len(pairs) - 1))
    return indirect_view(t, _stepped(flat, pairs, 1), lo, hi, _INSTR, rows)
