"""Smaller `nki.isa` names AWS's nki-library kernels call: the NeuronCore generation
(`get_nc_version`, `nc_version`), the DMA engine's transpose (`dma_transpose`), the Vector
Engine's top-8 search (`max8`, `nc_find_index8`, `nc_match_replace8`) the GpSimd Engine's
per-partition gather and nonzero search (`nc_n_gather`, `nonzero_with_count`), the Vector
Engine's cross-partition shuffle (`nc_stream_shuffle`), and the instructions nki-library's own test
suite stopped on (scripts/nki_suite/library.py): the GpSimd cross-partition reduction
(`tensor_partition_reduce`), the Vector Engine's predicated copy and index-window select
(`tensor_copy_predicated`, `range_select`) and the DMA engines' sum (`dma_compute`). Semantics and limits are AWS's NKI ISA reference
(Neuron SDK 2.29-2.33 pages of each name); docs/nki.md says what the simulator does.
"""

from __future__ import annotations

import enum

import numpy as np

from .. import dtypes as _dt
from ..errors import NKIError
from ..runtime import active
from ..targets import get_target
from ..tensor import NkiTensor


class nc_version(enum.IntEnum):  # noqa: N801 - the NKI name
    """`nisa.nc_version`: the NeuronCore generation. gen2: Trn1/Inf2, gen3: Trn2, gen4: Trn3.
    Ordered (kernels test `get_nc_version() >= nc_version.gen3`)."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    """`nisa.get_nc_version()`: the NeuronCore generation of the target being simulated: the running
    launch's target inside a kernel, else the target NEURON_PLATFORM_TARGET_OVERRIDE selects (trn2:
    gen3, trn3: gen4)."""
    run = active()
    return nc_version(run.target.neuron_core if run is not None else get_target().neuron_core)


# dma_transpose: the permutation AWS documents for each rank (the i-th axis of dst is axis axes[i] of src).
_DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, dge_mode=None, oob_mode=None, priority=None, name=None):
    """`dst = src` with its axes permuted, by a DMA (src in HBM or SBUF): 2-D [1, 0], 3-D [2, 1, 0],
    4-D [3, 1, 2, 0], the only permutations AWS supports. `dge_mode`: unknown (default), none, or hwdge,
    which adds the hardware-DGE limits (src.shape[0] == 16, src.shape[-1] a multiple of 128, a
    2-byte dtype). A dtype difference between src and dst is cast, as dma_copy does."""
    from . import _access, _record, _store, _tensor, _write
    from .constants import dge_mode as _dge

    instr = "nisa.dma_transpose"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    _access(instr, "dma", reads=[("src", src)], writes=[("dst", dst)])
    if src.ndim not in _DMA_TRANSPOSE_AXES:
        raise NKIError(instr, f"src has {src.ndim} dimensions {src.shape}; the DMA transposes 2-, 3- or "
                       "4-dimensional tensors only", "reshape src to 2-4 dimensions")
    expected = _DMA_TRANSPOSE_AXES[src.ndim]
    if axes is not None and tuple(axes) != expected:
        raise NKIError(instr, f"axes={tuple(axes)} is not supported for a {src.ndim}-D src: the DMA "
                       f"transposes only (1, 0), (2, 1, 0) and (3, 1, 2, 0)",
                       f"use axes={expected} (or omit axes) and rearrange the rest with access patterns")
    if isinstance(dge_mode, int) and not isinstance(dge_mode, bool) and dge_mode in {m.value for m in _dge}:
        dge_mode = _dge(dge_mode)  # the enum's value, as nki-library passes it (_DGE_MODE_NONE = 3)
    mode = dge_mode.name if isinstance(dge_mode, _dge) else ("unknown" if dge_mode is None else dge_mode)
    # AWS's reference lists unknown and hwdge for a direct transpose; nki-library's mlp_tkg (a
    # production kernel) passes dge_mode.none (descriptors built ahead of time), so none is taken
    # too, with no limits beyond the direct transpose's. swdge is the indirect (gather) transpose.
    if mode not in ("unknown", "hwdge", "none"):
        raise NKIError(instr, f"dge_mode={dge_mode!r}: a direct DMA transpose takes only dge_mode.unknown, "
                       "dge_mode.hwdge or dge_mode.none", "omit dge_mode")
    if mode == "hwdge" and (src.shape[0] != 16 or src.shape[-1] % 128 or np.dtype(src.data.dtype).itemsize != 2):
        raise NKIError(instr, f"a hardware-DGE transpose needs src.shape[0] == 16, src.shape[-1] a multiple "
                       f"of 128 and a 2-byte dtype; got src {src.shape} {src.alloc.dtype_name}",
                       "use dge_mode.unknown, or tile src to [16, k * 128] of a 2-byte dtype")
    want = tuple(src.shape[a] for a in expected)
    if tuple(dst.shape) != want:
        raise NKIError(instr, f"dst shape {dst.shape} must be {want}: src {src.shape} permuted by {expected}")
    if _dt.is_packed(src.dtype) or _dt.is_packed(dst.dtype):
        raise NKIError(instr, "packed MX types cannot be transposed element-wise by the DMA",
                       "transpose the uint8/uint32 bytes of a view instead")
    values = np.transpose(src.data, expected)
    if dst.dtype is src.dtype or (dst.dtype == src.dtype and dst.dtype is not _dt.tfloat32):
        _store(dst, values)
    else:
        _write(dst, values.astype(np.float32))
    side = dst if dst.buffer.on_chip else (src if src.buffer.on_chip else dst)
    nbytes = max(dst.nbytes, src.nbytes)
    _record(instr, "dma", [dst], [src], ("dma", nbytes, nbytes / max(1, side.partitions)), nbytes=nbytes)


_MAX8_FMIN, _MAX8_FMAX = 8, 16384


def _top8_input(instr, t, role, max_rank):
    from . import _f32_2d

    if t.ndim > max_rank:
        raise NKIError(instr, f"{role} has {t.ndim} dimensions {t.shape}, more than {max_rank}",
                       "flatten its free axes")
    if not _MAX8_FMIN <= t.free_size <= _MAX8_FMAX:
        raise NKIError(instr, f"{role} has {t.free_size} elements per partition; the instruction reads "
                       f"{_MAX8_FMIN} to {_MAX8_FMAX}", "split the search into chunks and combine them")
    return _f32_2d(t)


def _top8_output(instr, dst, partitions, kinds=None):
    if dst.ndim > 3 or dst.partitions != partitions or dst.free_size != 8:
        raise NKIError(instr, f"dst shape {dst.shape} must hold 8 elements per partition for {partitions} "
                       f"partitions ([{partitions}, 8])")
    if kinds is not None and dst.alloc.dtype_name not in kinds:
        raise NKIError(instr, f"dst dtype {dst.alloc.dtype_name} is not supported: indices are "
                       f"{' or '.join(kinds)}", "allocate dst as nl.uint32 (or nl.uint16)")


def max8(dst, src, name=None):
    """`nisa.max8(dst, src)`: the 8 largest values of each partition of src, in descending order
    (Vector Engine; read as float32, cast into dst's dtype). src: 8 to 16,384 elements per partition,
    at most 4 free axes; dst: [P, 8]."""
    from . import _access, _record, _tensor, _write

    instr = "nisa.max8"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    _access(instr, "vector", reads=[("src", src)], writes=[("dst", dst)])
    values = _top8_input(instr, src, "src", 5)
    _top8_output(instr, dst, src.partitions)
    top = -np.sort(-values, axis=1, kind="stable")[:, :8]
    _write(dst, top)
    _record(instr, "vector", [dst], [src], ("reduce", src.free_size))


def _match8(values, wanted, reverse):
    """Per partition, the data position each of the 8 wanted values is paired with, or -1. A value
    takes its first matching position; equal values among the 8 take successive matches, in slot
    order (nc_find_index8) or reverse slot order (nc_match_replace8), as AWS documents."""
    hit = values[:, None, :] == wanted[:, :, None]                      # [P, 8, F]
    same = wanted[:, :, None] == wanted[:, None, :]                      # [P, 8, 8]
    rank = (np.triu(same, 1) if reverse else np.tril(same, -1)).sum(axis=2)
    nth = hit & (np.cumsum(hit, axis=2) == rank[:, :, None] + 1)
    return np.where(nth.any(axis=2), nth.argmax(axis=2), -1)


def _index_output(instr, dst, partitions, pos):
    _top8_output(instr, dst, partitions, kinds=("uint32", "uint16"))
    sentinel = np.iinfo(dst.data.dtype).max
    return np.where(pos >= 0, pos, sentinel).astype(dst.data.dtype).reshape(dst.shape)


def _vals8(instr, vals, partitions):
    if vals.ndim > 3 or vals.partitions != partitions or vals.free_size != 8:
        raise NKIError(instr, f"vals shape {vals.shape} must hold 8 values per partition for "
                       f"{partitions} partitions ([{partitions}, 8])")
    return vals.data.reshape(vals.partitions, 8).astype(np.float32)


def nc_find_index8(dst, data, vals, name=None):
    """`nisa.nc_find_index8(dst, data, vals)`: per partition, the index (from 0, over data's free
    elements flattened) of the first element of data equal to each of the 8 vals; a value repeated
    among vals takes the next matches in slot order; a value not in data gives the all-ones sentinel
    (0xFFFFFFFF / 0xFFFF). Values compare as float32. dst uint32 or uint16 [P, 8]; data 8 to 16,384
    elements per partition, at most 3-D; vals 8 per partition."""
    from . import _access, _record, _store, _tensor

    instr = "nisa.nc_find_index8"
    dst, data, vals = _tensor(dst, instr, "dst"), _tensor(data, instr, "data"), _tensor(vals, instr, "vals")
    _access(instr, "vector", reads=[("data", data), ("vals", vals)], writes=[("dst", dst)])
    values = _top8_input(instr, data, "data", 3)
    wanted = _vals8(instr, vals, data.partitions)
    out = _index_output(instr, dst, data.partitions, _match8(values, wanted, reverse=False))
    _store(dst, out)
    _record(instr, "vector", [dst], [data, vals], ("reduce", data.free_size))


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """`nisa.nc_match_replace8(dst, data, vals, imm, dst_idx=None)`: dst = data with the first
    occurrence of each of the 8 vals (per partition) replaced by imm; a value repeated among vals
    replaces the next occurrences, slots taken in reverse order (AWS: the first match goes to the
    highest slot). dst_idx (uint32/uint16 [P, 8], optional) receives the matched positions; a value
    not in data replaces nothing and its index is the all-ones sentinel (the simulator's choice: AWS
    does not document this case). dst may be data itself (nki-library's top-k does so)."""
    from . import _access, _record, _store, _tensor, _write

    instr = "nisa.nc_match_replace8"
    dst, data, vals = _tensor(dst, instr, "dst"), _tensor(data, instr, "data"), _tensor(vals, instr, "vals")
    reads, writes = [("data", data), ("vals", vals)], [("dst", dst)]
    if dst_idx is not None:
        dst_idx = _tensor(dst_idx, instr, "dst_idx")
        writes.append(("dst_idx", dst_idx))
    _access(instr, "vector", reads=reads, writes=writes)
    values = _top8_input(instr, data, "data", 5)
    if dst.partitions != data.partitions or dst.free_size != data.free_size:
        raise NKIError(instr, f"dst shape {dst.shape} must match data shape {data.shape}")
    wanted = _vals8(instr, vals, data.partitions)
    if not isinstance(imm, (int, float, np.number)):
        raise NKIError(instr, f"imm must be a number, got {type(imm).__name__}")
    pos = _match8(values, wanted, reverse=True)
    index = None if dst_idx is None else _index_output(instr, dst_idx, data.partitions, pos)
    out = values.copy()
    rows = np.broadcast_to(np.arange(data.partitions)[:, None], pos.shape)
    out[rows[pos >= 0], pos[pos >= 0]] = np.float32(imm)
    _write(dst, out.reshape(dst.shape))
    if index is not None:
        _store(dst_idx, index)
    _record(instr, "vector", [dst] + ([dst_idx] if dst_idx is not None else []), [data, vals],
            ("reduce", data.free_size))


def nc_n_gather(dst, data, indices, name=None):
    """`nisa.nc_n_gather(dst, data, indices)`: per partition, dst = data's free elements (flattened)
    at the positions in indices (GpSimd Engine, all in SBUF). indices uint32, dst data's dtype, the
    same partitions; dst holds as many elements per partition as indices. A position past data's
    free size is an error here (AWS does not document it)."""
    from . import _access, _record, _store, _tensor

    instr = "nisa.nc_n_gather"
    dst, data, indices = (_tensor(dst, instr, "dst"), _tensor(data, instr, "data"),
                          _tensor(indices, instr, "indices"))
    _access(instr, "gpsimd", reads=[("data", data), ("indices", indices)], writes=[("dst", dst)])
    if not data.partitions == indices.partitions == dst.partitions:
        raise NKIError(instr, f"data {data.shape}, indices {indices.shape} and dst {dst.shape} must have "
                       "the same partition size (the gather stays within each partition)",
                       "use nisa.local_gather or a DMA to move data across partitions")
    if indices.alloc.dtype_name != "uint32":
        raise NKIError(instr, f"indices dtype {indices.alloc.dtype_name} must be uint32", "cast with nl.copy")
    if dst.dtype != data.dtype:
        raise NKIError(instr, f"dst dtype {dst.alloc.dtype_name} must be data's ({data.alloc.dtype_name})")
    if dst.free_size != indices.free_size:
        raise NKIError(instr, f"dst {dst.shape} must hold indices' {indices.free_size} elements per partition")
    idx = indices.data.reshape(indices.partitions, -1).astype(np.int64)
    flat = data.data.reshape(data.partitions, -1)
    if idx.size and (idx.max() >= flat.shape[1]):
        raise NKIError(instr, f"index {int(idx.max())} is past data's {flat.shape[1]} elements per partition")
    _store(dst, np.take_along_axis(flat, idx, axis=1).reshape(dst.shape))
    _record(instr, "gpsimd", [dst], [data, indices], ("elementwise", dst.free_size))


_GPSIMD_CORE_PARTITIONS = 16  # each of the 8 GpSimd cores connects to 16 contiguous SBUF partitions


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """`nisa.nonzero_with_count(dst, src, index_offset=0, padding_val=-1)` (GpSimd Engine,
    NeuronCore-v3+): on partitions 0, 16, ..., 112 only (each GpSimd core's first partition), dst's
    free elements are the positions of src's nonzero free elements (flattened, plus index_offset),
    then padding_val, then the count; dst holds one more element per partition than src. Other
    partitions of dst are left as they were."""
    from . import _access, _record, _tensor, _write

    instr = "nisa.nonzero_with_count"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    _access(instr, "gpsimd", reads=[("src", src)], writes=[("dst", dst)])
    if get_nc_version() < nc_version.gen3:
        raise NKIError(instr, "available only on NeuronCore-v3 and newer")
    if dst.partitions != src.partitions or dst.free_size != src.free_size + 1:
        raise NKIError(instr, f"dst shape {dst.shape} must have src's partitions and one more element per "
                       f"partition than src {src.shape} (the last one holds the count)")
    lanes = np.arange(0, src.partitions, _GPSIMD_CORE_PARTITIONS)
    values = src.data.reshape(src.partitions, -1)[lanes].astype(np.float32)
    out = dst.data.reshape(dst.partitions, -1).astype(np.float32)  # untouched partitions keep their values
    t = values.shape[1]
    for row, lane in zip(values, lanes):
        nz = np.flatnonzero(row)
        out[lane, :t] = padding_val
        out[lane, :nz.size] = nz + index_offset
        out[lane, t] = nz.size
    where = np.zeros(dst.shape[:1] + (dst.free_size,), bool)
    where[lanes] = True
    _write(dst, out, where=where.reshape(dst.shape))
    _record(instr, "gpsimd", [dst], [src], ("elementwise", src.free_size))


_QUADRANT = 32


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """`nisa.nc_stream_shuffle(dst, src, shuffle_mask)` (Vector Engine, SBUF or PSUM): within each
    quadrant of 32 partitions, dst partition i = src partition shuffle_mask[i] of the same quadrant
    (counted from each tensor's first partition); 255 leaves dst partition i unchanged. The same
    32-entry mask applies to every quadrant; in place (dst is src) is allowed. dst has src's dtype
    and elements per partition; the partition counts may differ (nki-library broadcasts a
    1-partition src onto up to 32 dst partitions with a mask of zeros). AWS's rules on the start
    partitions of src and dst are not modeled."""
    from . import _access, _record, _store, _tensor

    instr = "nisa.nc_stream_shuffle"
    dst, src = _tensor(dst, instr, "dst"), _tensor(src, instr, "src")
    _access(instr, "vector", reads=[("src", src)], writes=[("dst", dst)])
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != _QUADRANT or any(not (0 <= m < _QUADRANT or m == 255) for m in mask):
        raise NKIError(instr, f"shuffle_mask must be 32 entries, each a partition 0..31 of the quadrant or "
                       f"255 (leave unchanged); got {len(mask)} entries {mask[:8]}...")
    if dst.dtype != src.dtype:
        raise NKIError(instr, f"dst dtype {dst.alloc.dtype_name} must be src's ({src.alloc.dtype_name})")
    if dst.free_size != src.free_size:
        raise NKIError(instr, f"dst {dst.shape} must have src's elements per partition {src.shape}")
    data = src.data.reshape(src.partitions, -1).copy()   # read before writing: in-place shuffles are allowed
    out = dst.data.reshape(dst.partitions, -1).copy()
    for row in range(dst.partitions):
        m = mask[row % _QUADRANT]
        if m == 255:
            continue
        source = row - row % _QUADRANT + m
        if source >= src.partitions:
            raise NKIError(instr, f"shuffle_mask[{row % _QUADRANT}] = {m} makes dst partition {row} read src "
                           f"partition {source}, past src's {src.partitions} partitions")
        out[row] = data[source]
    _store(dst, out.reshape(dst.shape))
    _record(instr, "vector", [dst], [src], ("elementwise", src.free_size))
