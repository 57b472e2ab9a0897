"""Direct allocation: tensors the kernel places at addresses of its own choosing.

`nki.compiler.sbuf.mod_alloc(...)` / `.alloc(func)` / `nki.compiler.psum...` as `buffer=` of
`nl.ndarray`, and `nl.ndarray(..., address=(partition, byte))`. AWS's rule: a tensor's block axes
(those before `nl.par_dim`) are *logical* tiles; the allocation function maps each block index to a
physical place, so two blocks (or two tensors) may share memory, and a kernel that reuses a buffer
on purpose (modulo allocation, double buffering) must see its own earlier writes there.

So directly allocated tensors are views of one physical memory per buffer kind and program (core): a
[128, bytes per partition] byte array (SBUF: the target's capacity; PSUM: 8 banks of 2 KiB),
poisoned with 0xFF (NaN for float types) like any fresh buffer. One `Allocation` per dtype views it
(tensor dtypes come from their allocation), all with one id, so the cost model's dependency
boxes (absolute partition x byte ranges) see aliasing across tensors and dtypes.
Automatically allocated tensors keep their own storage: the two never overlap here.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

from . import dtypes as _dt
from .errors import NKIError
from .tensor import Allocation, DynSlice, NkiTensor, psum as _psum, sbuf as _sbuf


class DirectBuffer:
    """What `ncc.sbuf.alloc(func)` / `ncc.psum.alloc(func)` return: a `buffer=` with a placement.

    SBUF: `func(block_index, pdim_size, fdim_bytes) -> (start_partition, byte_addr)`.
    PSUM: `func(block_index, pdim_size, fdim_bytes) -> (bank, start_partition, byte_addr)`."""

    __slots__ = ("kind", "func")

    def __init__(self, kind: str, func):
        if not callable(func):
            raise NKIError(f"nki.compiler.{kind}.alloc", f"func must be callable, got {func!r}")
        self.kind = kind
        self.func = func

    @property
    def buffer(self):
        return _sbuf if self.kind == "sbuf" else _psum

    def __repr__(self):
        return f"nki.compiler.{self.kind}.alloc({getattr(self.func, '__name__', self.func)!r})"


def _modulo(base, tiles, scale, idx):
    """AWS's modulo placement: block index `idx` wraps within the `tiles` grid (missing axes: 1
    tile; axes beyond `tiles` are ignored), linearized row-major, times `scale`, plus `base`."""
    tiles = tuple(tiles) or (1,) * len(idx)
    wrapped = [i % n for i, n in zip(idx, tiles)]
    linear = 0
    for k, i in enumerate(wrapped):
        linear += i * math.prod(tiles[k + 1:len(wrapped)])
    return base + linear * scale


def sbuf_mod_alloc(*, base_addr, base_partition=0, num_par_tiles=(), num_free_tiles=()) -> DirectBuffer:
    def place(idx, pdim_size, fdim_size):
        return (_modulo(base_partition, num_par_tiles, pdim_size, idx),
                _modulo(base_addr, num_free_tiles, fdim_size, idx))
    return DirectBuffer("sbuf", place)


def psum_mod_alloc(*, base_bank, base_addr=0, base_partition=0, num_bank_tiles=(), num_par_tiles=(),
                   num_free_tiles=()) -> DirectBuffer:
    def place(idx, pdim_size, fdim_size):
        # A block occupies its own bank (scale 1): partial-bank placement is by base_addr only.
        return (_modulo(base_bank, num_bank_tiles, 1, idx),
                _modulo(base_partition, num_par_tiles, pdim_size, idx),
                _modulo(base_addr, num_free_tiles, fdim_size, idx))
    return DirectBuffer("psum", place)


def fixed(kind: str, address) -> DirectBuffer:
    """`nl.ndarray(..., address=(partition, byte))`: every block at that one place (PSUM: the byte
    address counts from bank 0, so bank = byte // 2048)."""
    try:
        part, byte = (int(a) for a in address)
    except (TypeError, ValueError):
        raise NKIError("nl.ndarray", f"address must be (partition_offset, free_offset), got {address!r}") from None
    if kind == "sbuf":
        return DirectBuffer("sbuf", lambda idx, p, f: (part, byte))
    return DirectBuffer("psum", lambda idx, p, f: (None, part, byte))


# ---------------------------------------------------------------------------- placement
def is_direct(run, tensor) -> bool:
    return any(tensor.alloc is a for a in run.direct_allocs.values())


def blocks(tensor):
    """Every block of a directly allocated tensor as its own tile (blocks may share memory)."""
    lead = tensor.lead
    return [tensor[idx] for idx in np.ndindex(*tensor.shape[:lead])] if lead else [tensor]


def _memory(run, kind: str) -> np.ndarray:
    mem = run.direct_memory.get(kind)
    if mem is None:
        t = run.target
        width = t.sbuf_bytes_per_partition if kind == "sbuf" else t.psum_bytes_per_partition
        mem = np.full((128, width), 0xFF, dtype=np.uint8)
        run.direct_memory[kind] = mem
    return mem


def _allocation(run, kind: str, dtype) -> Allocation:
    """The per-dtype view of the physical memory (one id per memory, see the module doc)."""
    key = (kind, _dt.name(dtype))
    alloc = run.direct_allocs.get(key)
    if alloc is None:
        mem = _memory(run, kind)
        storage = mem.view(_dt.storage_dtype(dtype))
        alloc = Allocation(storage.shape, dtype, _sbuf if kind == "sbuf" else _psum, storage=storage)
        ids = run.direct_ids
        alloc.id = ids.setdefault(kind, alloc.id)
        if kind == "psum":  # one accumulation-group state for every dtype view (isa.ACC_*)
            alloc.acc = run.direct_acc.setdefault(kind, np.zeros(mem.nbytes, np.uint8))
        run.direct_allocs[key] = alloc
    return alloc


def _call_allocator(func, idx, pdim, fdim):
    """Calls an allocation function with AWS's argument names, `idx`, `pdim_size`, `fdim_size`, as
    keywords where it takes them: AWS's reference kernels bind other leading parameters with
    functools.partial (`partial(psum_addr, bank_map=...)` for `psum_addr(bank_map, idx, pdim_size,
    fdim_size)`), which only keyword arguments reach. A function with other parameter names is
    called positionally."""
    try:
        inspect.signature(func).bind(idx=idx, pdim_size=pdim, fdim_size=fdim)
    except (TypeError, ValueError):
        return func(idx, pdim, fdim)
    return func(idx=idx, pdim_size=pdim, fdim_size=fdim)


def _place(run, buf: DirectBuffer, idx, pdim, fdim, shape, itemsize, instruction) -> int:
    """Byte offset of block `idx` in the physical memory; the place is checked against capacity."""
    t = run.target
    got = _call_allocator(buf.func, idx, pdim, fdim)
    what = f"block {idx} of a {shape} tensor" if idx else f"a {shape} tensor"
    try:
        got = tuple(None if g is None else int(g) for g in got)
    except (TypeError, ValueError):
        got = None
    if got is None or len(got) != (2 if buf.kind == "sbuf" else 3):
        raise NKIError(instruction, f"the {buf.kind} allocation function returned {got!r} for {what}",
                       "return (start_partition, byte_addr) for SBUF, (bank, start_partition, byte_addr) for PSUM")
    if buf.kind == "sbuf":
        part, byte = got
        cap = t.sbuf_bytes_per_partition
        if byte < 0 or byte + fdim > cap:
            raise NKIError(instruction, f"SBUF address out of range: {what} needs bytes [{byte}, {byte + fdim}) "
                           f"of each partition; SBUF has {cap} bytes per partition ({t.name})",
                           "lower the base address or the number of physical tiles")
    else:
        bank, part, byte = got
        size = t.psum_bank_bytes
        if bank is None:  # nl.ndarray(address=): a flat byte address over the banks
            bank, byte = divmod(byte, size)
        if not 0 <= bank < t.psum_banks:
            raise NKIError(instruction, f"PSUM bank {bank} out of range for {what}: PSUM has {t.psum_banks} "
                           f"banks of {size} bytes per partition ({t.name})", "use banks 0..7")
        if byte < 0 or byte + fdim > size:
            raise NKIError(instruction, f"PSUM address out of range: {what} needs bytes [{byte}, {byte + fdim}) "
                           f"of bank {bank}, a bank holds {size} bytes per partition ({t.name})",
                           "a tile cannot span banks: use at most [128, 512] float32 per block")
        byte += bank * size
    if part < 0 or part + pdim > 128:
        raise NKIError(instruction, f"partitions [{part}, {part + pdim}) of {what} are out of range (0..128)")
    if byte % itemsize:
        raise NKIError(instruction, f"byte address {byte} of {what} is not a multiple of its dtype's size "
                       f"({itemsize})")
    return part * _memory(run, buf.kind).shape[1] + byte


def allocate(run, shape, blocks: int, dtype, buf: DirectBuffer, instruction) -> NkiTensor:
    """A directly allocated tensor of `shape` (partition axis at `blocks`)."""
    alloc = _allocation(run, buf.kind, dtype)
    itemsize = alloc.storage.itemsize
    bshape, pdim, free = shape[:blocks], shape[blocks], shape[blocks + 1:]
    fdim = math.prod(free) * itemsize

    def place():
        offsets = np.empty(bshape, dtype=np.int64)
        for idx in np.ndindex(*bshape):
            offsets[idx] = _place(run, buf, idx, pdim, fdim, shape, itemsize, instruction)
        return offsets

    # A kernel written for NKI 0.1.0 traced its loop bodies once: one placement per call (v0_1.py).
    offsets = place() if run.loop_trace is None else run.loop_trace.once((buf.kind, shape, _dt.name(dtype)), place)
    if alloc.acc is not None:  # a new PSUM tensor: no matmul accumulation group is open in it
        rows = np.arange(pdim)[:, None] * alloc.rowbytes
        for off in np.unique(offsets):
            alloc.acc[(off + rows + np.arange(fdim)[None, :]).ravel()] = 0
    tile_strides = (alloc.rowbytes,) + tuple(itemsize * math.prod(free[k + 1:]) for k in range(len(free)))
    return _view(alloc, offsets, (pdim,) + tuple(free), tile_strides)


def _affine_strides(offsets: np.ndarray):
    """Per-axis byte strides if offsets[i] = offsets[0] + sum(i_k * stride_k), else None."""
    if offsets.size == 0:
        return None
    origin = int(offsets.flat[0])
    strides = tuple(int(offsets[(0,) * k + (1,) + (0,) * (offsets.ndim - k - 1)]) - origin if n > 1 else 0
                    for k, n in enumerate(offsets.shape))
    expect = origin + sum(np.arange(n).reshape((1,) * k + (n,) + (1,) * (offsets.ndim - k - 1)) * s
                          for k, (n, s) in enumerate(zip(offsets.shape, strides)))
    return strides if np.array_equal(offsets, np.broadcast_to(expect, offsets.shape)) else None


def _view(alloc, offsets, tile_shape, tile_strides) -> NkiTensor:
    alloc.whole = False
    strides = _affine_strides(offsets)
    origin = int(offsets.flat[0])
    if strides is None:  # blocks wrap (modulo) or are scattered: no single strided view
        strides = (0,) * offsets.ndim
        data = np.ndarray(offsets.shape + tile_shape, alloc.storage.dtype, buffer=alloc.storage,
                          offset=origin, strides=strides + tile_strides)
        data.flags.writeable = False  # a placeholder: blocks are reached through their own offsets
        return BlockMappedTensor(alloc, data, origin, offsets.ndim, offsets=offsets, tile_strides=tile_strides)
    data = np.ndarray(offsets.shape + tile_shape, alloc.storage.dtype, buffer=alloc.storage,
                      offset=origin, strides=strides + tile_strides)
    return NkiTensor(alloc, data, origin, lead=offsets.ndim)


class BlockMappedTensor(NkiTensor):
    """A directly allocated tensor whose blocks are not one strided view (e.g. 4 blocks in 2
    physical tiles): indexing its block axes looks each block's place up."""

    __slots__ = ("offsets", "tile_strides")

    def __init__(self, alloc, data, offset, lead, *, offsets, tile_strides):
        super().__init__(alloc, data, offset, lead)
        self.offsets = offsets
        self.tile_strides = tile_strides

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        if any(not isinstance(i, (int, np.integer, slice, DynSlice)) for i in index[:self.lead]):
            raise NKIError("tensor indexing", f"the block axes of a tensor whose blocks share physical tiles "
                           f"take ints, slices or nl.ds, got {index[:self.lead]!r}", "index each block: t[i, j]")
        picks = tuple(slice(i.start, i.start + i.size * i.step, i.step) if isinstance(i, DynSlice) else i
                      for i in index[:self.lead])
        offsets = self.offsets[picks]
        rest = index[self.lead:]
        tile = _view(self.alloc, np.asarray(offsets), self.data.shape[self.lead:], self.tile_strides)
        if not rest:
            return tile
        return tile[(slice(None),) * tile.lead + rest]
