"""Cross-core instructions of a Logical NeuronCore (LNC 2): `nisa.core_barrier` and `nisa.sendrecv`.

AWS (NKI ISA reference, `nki.isa.core_barrier` / `nki.isa.sendrecv`, NeuronCore-v3+ with LNC
enabled): a barrier makes every listed core wait until all have reached it ("currently only
cores=(0, 1) is supported"); sendrecv sends this core's `src` tile to core `send_to_rank` and
receives core `recv_from_rank`'s tile into `dst`, both in SBUF, the same dtype and shape, ranks 0
or 1; operations with the same `pipe_id` are synchronized. The programs of a launch run as
concurrent cores (nki/cores.py); a core is a program's linear index in the grid.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import NKIError
from ..runtime import current

# LNC 2 is the largest logical NeuronCore AWS documents: its cores are 0 and 1.
LNC_CORES = (0, 1)
# dma_engine.gpsimd_dma: most bytes per partition per element size (AWS's sendrecv page).
_GPSIMD_DMA_BYTES = {4: 1024, 2: 512, 1: 256}


def _core_list(cores, instr) -> tuple:
    if isinstance(cores, (int, np.integer)):
        cores = (int(cores),)
    try:
        cores = tuple(sorted({int(c) for c in cores}))
    except (TypeError, ValueError):
        raise NKIError(instr, f"cores must be a core index or a tuple of them, got {cores!r}",
                       "pass cores=(0, 1)") from None
    if not cores:
        raise NKIError(instr, "cores is empty", "pass cores=(0, 1)")
    return cores


def _rank(value, run, instr, role) -> int:
    try:
        rank = int(value)
    except (TypeError, ValueError):
        raise NKIError(instr, f"{role} must be a core index (0 or 1), got {value!r}") from None
    if rank not in LNC_CORES:
        raise NKIError(instr, f"{role}={rank}: sendrecv exchanges tiles between the two NeuronCores of an "
                       "LNC 2 logical core, ranks 0 and 1", "use nl.program_id(0) and 1 - nl.program_id(0)")
    if rank >= run.cores.lnc:
        raise NKIError(instr, f"{role}={rank}, but this launch has {run.cores.lnc} program(s) (cores "
                       f"0..{run.cores.lnc - 1}); AWS: sendrecv requires LNC 2",
                       "launch the kernel on both cores: kernel[2](...) (nki.cpu_simulate(kernel)[2] for LNC 2)")
    return rank


def core_barrier(data, cores, engine=None, name=None):
    """Wait until every core of `cores` has reached this barrier (the n-th barrier over a set of
    cores on one core meets the n-th on each other). `data` names the tensor the cores synchronize
    on (AWS: shared HBM the cores both write); the simulator checks it is a tensor and records the
    barrier as reading and writing it. `engine` (default GpSimd) is the engine that waits. In a
    one-program launch (LNC 1) the partner core runs another launch, which is not simulated: the
    barrier waits for nothing."""
    from . import _ENGINE_NAMES, _record, _tensor

    instr = "nisa.core_barrier"
    run = current(instr)
    data = _tensor(data, instr, "data")
    cores = _core_list(cores, instr)
    eng = "gpsimd" if engine is None else (engine if isinstance(engine, str) else getattr(engine, "name", engine))
    if eng not in _ENGINE_NAMES or eng == "dma":
        raise NKIError(instr, f"engine {engine!r} cannot run a barrier",
                       "use nisa.engine.gpsimd (default), vector, scalar or tensor")
    if any(c not in LNC_CORES for c in cores):
        raise NKIError(instr, f"cores={cores}: a barrier synchronizes the NeuronCores of one LNC 2 logical core, "
                       "0 and 1 (AWS: only cores=(0, 1) is supported)", "pass cores=(0, 1)")
    if run.core not in cores:
        raise NKIError(instr, f"core {run.core} issued a barrier over cores={cores}, which does not include it",
                       f"list core {run.core} in cores")
    group = run.cores
    if group.lnc > 1:
        missing = [c for c in cores if c >= group.lnc]
        if missing:
            raise NKIError(instr, f"cores={cores} includes core {missing[0]}, but this launch has {group.lnc} "
                           "programs", "list the launch's cores")
        arrivals = group.arrivals[(run.world_rank, cores)]
        arrivals[run.core] += 1
        count = arrivals[run.core]
        group.wait(run.gid, lambda: all(arrivals[c] >= count for c in cores),
                   f"nisa.core_barrier(cores={cores}) number {count}")
    # At LNC 1 (one program), AWS 2.33: the barrier still pairs the two physical cores of an HBM
    # stack, each its own logical core running its own launch; the partner is not simulated, so
    # there is nothing to wait for.
    _record(instr, eng, [data], [data], ("gpsimd", 0))


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=None, name=None):
    """Send this core's `src` tile to core `send_to_rank` and receive core `recv_from_rank`'s tile
    into `dst` (both SBUF, same dtype, same partitions and elements per partition). A core blocks
    until the tile it receives has been sent; tiles travel in order per (sender, receiver,
    pipe_id). `dma_engine=nisa.dma_engine.gpsimd_dma` limits a partition to 1024 bytes of 32-bit,
    512 of 16-bit, 256 of 8-bit data (AWS)."""
    from . import _access, _record, _same_layout, _store, _tensor
    from .constants import dma_engine as _dma_engine

    instr = "nisa.sendrecv"
    run = current(instr)
    src, dst = _tensor(src, instr, "src"), _tensor(dst, instr, "dst")
    for role, t in (("src", src), ("dst", dst)):
        if t.buffer.kind != "sbuf":
            raise NKIError(instr, f"{role} is in {t.buffer!r}; sendrecv moves tiles between the SBUFs of the "
                           "two cores (src and dst must both be in nl.sbuf)",
                           "copy the tile to SBUF first (nisa.tensor_copy / nisa.dma_copy)")
    _access(instr, "dma", reads=[("src", src)], writes=[("dst", dst)])
    if src.dtype is not dst.dtype and src.dtype != dst.dtype:
        raise NKIError(instr, f"src is {_dt.name(src.dtype)} and dst is {_dt.name(dst.dtype)}; sendrecv does not "
                       "convert", "give src and dst the same dtype")
    _same_layout(instr, dst, src, "src")
    to = _rank(send_to_rank, run, instr, "send_to_rank")
    frm = _rank(recv_from_rank, run, instr, "recv_from_rank")
    gpsimd = dma_engine is _dma_engine.gpsimd_dma or getattr(dma_engine, "name", None) == "gpsimd_dma"
    if gpsimd:
        size = _dt.storage_dtype(src.dtype).itemsize
        limit = _GPSIMD_DMA_BYTES.get(size, 1024)
        if src.free_size * size > limit:
            raise NKIError(instr, f"dma_engine=gpsimd_dma moves at most {limit} bytes per partition of a "
                           f"{8 * size}-bit type; src has {src.free_size * size}",
                           "use dma_engine=nisa.dma_engine.dma (default) or split the tile")
    try:
        pipe = int(pipe_id)
    except (TypeError, ValueError):
        raise NKIError(instr, f"pipe_id must be an integer, got {pipe_id!r}") from None
    group = run.cores
    # What this core sends is what src holds now (a copy: the sender may overwrite src after).
    group.mailboxes[(run.world_rank, run.core, to, pipe)].append(
        (np.array(src.data, copy=True).reshape(src.partitions, -1), src.dtype, src.shape, run.core))
    inbox = group.mailboxes[(run.world_rank, frm, run.core, pipe)]
    group.wait(run.gid, lambda: len(inbox) > 0,
               f"nisa.sendrecv(recv_from_rank={frm}, pipe_id={pipe}) (core {frm} has not sent to core {run.core})")
    values, dtype, shape, sender = inbox.popleft()
    if dtype is not dst.dtype and dtype != dst.dtype or values.shape != (dst.partitions, dst.free_size):
        raise NKIError(instr, f"core {run.core} receives into a {_dt.name(dst.dtype)} {dst.shape} dst, but core "
                       f"{sender} sent a {_dt.name(dtype)} {shape} tile on pipe_id {pipe}",
                       "give both cores' sendrecv tiles the same dtype, partitions and elements per partition")
    _store(dst, values.reshape(dst.shape))
    nbytes = src.nbytes
    _record(instr, "dma", [dst], [src], ("dma", nbytes, nbytes / max(1, src.partitions)), nbytes=nbytes)
