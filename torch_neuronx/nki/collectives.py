"""`nki.collectives`: AWS's collective communication between ranks, inside a kernel.

AWS's module (NKI API reference, `nki.collectives`) moves data between *ranks*: logical
NeuronCores, each running its own copy of the kernel on its own inputs, grouped by a
`ReplicaGroup` (rank-lists; the collective runs independently within each, no rank in two).
AWS's CPU simulator runs several ranks in one process with `nki.multi_rank_simulate(kernel,
world_size=N, per_rank_inputs=...)`; the simulator here does the same (kernel.py): every rank is a
launch of its own (its own HBM, its own LNC cores), all ranks' cores take turns in one scheduler
(cores.py), and a collective is a rendezvous of the ranks of the caller's rank-list: each posts a
copy of its sources, waits for the others', and computes its own destinations from them. With LNC 2
each core index communicates with the same core index of the other ranks. A plain launch is a
world of one rank (rank 0): a rank-list naming other ranks is an NKIError that points to
multi_rank_simulate.

`all_gather_v` / `all_to_all_v` (metadata-driven variable sizes) are not simulated: they raise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import NKIError
from .isa.registers import VirtualRegister
from .language import NKIObject
from .runtime import current
from .tensor import NkiTensor

_REDUCE_OPS = ("add", "minimum", "maximum")
_MULTI_RANK = ("simulate the ranks together with nki.multi_rank_simulate(kernel, world_size=N, "
               "per_rank_inputs=[(args, kwargs), ...]); a plain launch is one rank (rank 0)")


@dataclass
class ReplicaGroup(NKIObject):
    """The ranks a collective runs on: rank-lists, each a group the collective runs within, no
    rank in two. `ReplicaGroup([[0, 1, 2, 3]])`; a flat list of ranks is one rank-list."""

    groups: list

    def __post_init__(self):
        groups = self.groups
        if isinstance(groups, ReplicaGroup):
            groups = groups.groups
        try:
            groups = list(groups)
        except TypeError:
            raise NKIError("nki.collectives.ReplicaGroup", f"groups must be lists of ranks, got {groups!r}") from None
        if groups and all(isinstance(g, (int, np.integer)) for g in groups):
            groups = [groups]  # a flat list of ranks: one rank-list
        try:
            groups = [[int(r) for r in g] for g in groups]
        except (TypeError, ValueError):
            raise NKIError("nki.collectives.ReplicaGroup", f"groups must be lists of integer ranks, got "
                           f"{self.groups!r}") from None
        seen = set()
        for g in groups:
            if not g:
                raise NKIError("nki.collectives.ReplicaGroup", "a rank-list is empty", "list its ranks")
            for r in g:
                if r < 0:
                    raise NKIError("nki.collectives.ReplicaGroup", f"rank {r} is negative")
                if r in seen:
                    raise NKIError("nki.collectives.ReplicaGroup", f"rank {r} is in two rank-lists of {groups}",
                                   "AWS: each rank participates in only one rank-list")
                seen.add(r)
        self.groups = groups


def _members(replica_group, instr, run) -> tuple:
    """The rank-list of `replica_group` that holds the calling rank, checked against the world."""
    if replica_group is None:
        raise NKIError(instr, "replica_group is None", "pass an nki.collectives.ReplicaGroup")
    if not isinstance(replica_group, ReplicaGroup):
        replica_group = ReplicaGroup(replica_group)
    outside = [r for g in replica_group.groups for r in g if r >= run.world_size]
    if outside:
        raise NKIError(instr, f"replica group {replica_group.groups} names rank {outside[0]}, but the simulated world "
                       f"has {run.world_size} rank(s)", _MULTI_RANK if run.world_size == 1 else
                       f"name ranks 0 .. {run.world_size - 1}")
    for g in replica_group.groups:
        if run.world_rank in g:
            return tuple(g)
    raise NKIError(instr, f"rank {run.world_rank} is in no rank-list of replica group {replica_group.groups}",
                   "list every rank that issues the collective")


def _tensors(values, instr, role) -> list:
    from .isa import _tensor

    if isinstance(values, NkiTensor) or not isinstance(values, (list, tuple)):
        raise NKIError(instr, f"{role} must be a list of tensors, got {type(values).__name__}",
                       f"pass {role}=[tensor]")
    if not values:
        raise NKIError(instr, f"{role} is empty")
    return [_tensor(v, instr, role) for v in values]


def _memory(instr, srcs, dsts, sbuf_ok=True) -> str:
    """AWS: all tensors on HBM or all on SBUF (no mixing); several tensors only on HBM."""
    kinds = {t.buffer.kind for t in srcs + dsts}
    if "psum" in kinds:
        raise NKIError(instr, "a tensor is in nl.psum; collectives move HBM or SBUF tensors",
                       "copy it to SBUF first (nisa.tensor_copy)")
    if len(kinds) > 1:
        raise NKIError(instr, "the tensors mix HBM and SBUF; AWS: all must be on HBM or all on SBUF",
                       "stage them in one memory")
    kind = kinds.pop()
    if kind == "sbuf" and not sbuf_ok:
        raise NKIError(instr, "the tensors are in SBUF; AWS supports only HBM tensors for this collective",
                       "stage them in HBM (nl.shared_hbm)")
    if kind == "sbuf" and (len(srcs) > 1 or len(dsts) > 1):
        raise NKIError(instr, f"{len(srcs)} srcs / {len(dsts)} dsts in SBUF; AWS: coalesced collectives "
                       "(several tensors) are supported only on HBM", "pass one tensor each, or use HBM")
    if len(srcs) != len(dsts):
        raise NKIError(instr, f"{len(srcs)} srcs but {len(dsts)} dsts", "pass one dst per src")
    return kind


def _dim(collective_dim, kind, instr, allowed_sbuf=(0, 1)) -> int:
    allowed = (0,) if kind == "hbm" else allowed_sbuf
    if collective_dim not in allowed:
        raise NKIError(instr, f"collective_dim={collective_dim} is not supported for {kind.upper()} tensors "
                       f"(AWS: {' or '.join(map(str, allowed))})", f"use collective_dim={allowed[0]}")
    return collective_dim


def _op(op, instr):
    from . import elementwise as _ops

    token = _ops.resolve(op, instr, 2)
    if token.name not in _REDUCE_OPS:
        raise NKIError(instr, f"op {token!r} is not a collective reduction (AWS: nl.add, nl.minimum, nl.maximum)")
    return token


def _snapshot(t: NkiTensor):
    """What a rank contributes: a copy of the tensor's values (its dtype, its shape)."""
    return np.array(t.data, copy=True), t.dtype


def _put(instr, dst: NkiTensor, values, dtype, reads) -> None:
    """Write `values` (an array of `dtype`, dst's shape) into dst: bit for bit when the dtypes
    agree, else cast as a DMA casts. Recorded as a DMA of dst's bytes."""
    from .isa import _access, _record, _store, _write

    _access(instr, "dma", reads=[("src", t) for t in reads], writes=[("dst", dst)])
    if values.shape != dst.shape:
        values = values.reshape(dst.shape)
    if dtype is dst.dtype or dtype == dst.dtype:
        _store(dst, values)
    else:
        _write(dst, values.astype(np.float32))
    nbytes = dst.nbytes
    per_partition = nbytes / max(1, dst.partitions if dst.buffer.on_chip and dst.ndim else 1)
    _record(instr, "dma", [dst], reads, ("dma", nbytes, per_partition), nbytes=nbytes)


def _exchange(instr, run, group, contribution) -> dict:
    return run.cores.exchange(run.gid, run.world_rank, run.core, group, instr, contribution)


def _shape_rule(instr, cond, message):
    if not cond:
        raise NKIError(instr, message, "allocate dst with the collective's output shape")


def _f32(values, dtype):
    return values.astype(np.float32)


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None) -> None:
    """dsts[i] = op over the ranks of the rank-list of their srcs[i] (add, minimum, maximum), in
    float32, cast to dst's dtype."""
    instr = "nki.collectives.all_reduce"
    run = current(instr)
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    _memory(instr, srcs, dsts)
    token = _op(op, instr)
    group = _members(replica_group, instr, run)
    for s, d in zip(srcs, dsts):
        _shape_rule(instr, s.shape == d.shape, f"dst shape {d.shape} differs from src shape {s.shape}")
    got = _exchange(instr, run, group, [_snapshot(s) for s in srcs])
    for i, d in enumerate(dsts):
        acc = _reduce_ranks(got, group, i, token)
        _put(instr, d, acc, np.float32, [srcs[i]])


def _reduce_ranks(got, group, i, token) -> np.ndarray:
    """The ranks' i-th tensors of an exchange combined with `token`, in rank-list order, in float32."""
    acc = None
    for r in group:
        values, dtype = got[r][i]
        acc = _f32(values, dtype) if acc is None else token.fn(acc, _f32(values, dtype))
    return acc


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """dsts[i] = the ranks' srcs[i], concatenated in rank-list order along `collective_dim` (HBM: 0;
    SBUF: 0 or 1, 2-D tiles)."""
    instr = "nki.collectives.all_gather"
    run = current(instr)
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    kind = _memory(instr, srcs, dsts)
    dim = _dim(collective_dim, kind, instr)
    group = _members(replica_group, instr, run)
    for s, d in zip(srcs, dsts):
        want = tuple(n * len(group) if a == dim else n for a, n in enumerate(s.shape))
        _shape_rule(instr, d.shape == want, f"dst shape {d.shape} is not src shape {s.shape} with axis {dim} times "
                    f"the {len(group)} ranks, {want}")
    got = _exchange(instr, run, group, [_snapshot(s) for s in srcs])
    for i, d in enumerate(dsts):
        parts = [got[r][i] for r in group]
        _put(instr, d, np.concatenate([p[0] for p in parts], axis=dim), parts[0][1], [srcs[i]])


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None) -> None:
    """Reduce srcs[i] over the ranks (add, minimum, maximum), split it along `collective_dim` (0)
    into one slice per rank: the k-th rank of the rank-list receives the k-th slice."""
    instr = "nki.collectives.reduce_scatter"
    run = current(instr)
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    kind = _memory(instr, srcs, dsts)
    _dim(collective_dim, kind, instr, (0,))
    token = _op(op, instr)
    group = _members(replica_group, instr, run)
    n, me = len(group), group.index(run.world_rank)
    for s, d in zip(srcs, dsts):
        _shape_rule(instr, s.shape[0] % n == 0 and d.shape == (s.shape[0] // n,) + s.shape[1:],
                    f"dst shape {d.shape} is not src shape {s.shape} with axis 0 divided by the {n} ranks")
    got = _exchange(instr, run, group, [_snapshot(s) for s in srcs])
    for i, d in enumerate(dsts):
        acc = _reduce_ranks(got, group, i, token)
        size = acc.shape[0] // n
        _put(instr, d, acc[me * size:(me + 1) * size], np.float32, [srcs[i]])


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """Each rank splits srcs[i] along `collective_dim` (0) into one chunk per rank; the k-th rank
    of the rank-list receives every rank's k-th chunk, concatenated in rank-list order. HBM only."""
    instr = "nki.collectives.all_to_all"
    run = current(instr)
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    kind = _memory(instr, srcs, dsts, sbuf_ok=False)
    _dim(collective_dim, kind, instr, (0,))
    group = _members(replica_group, instr, run)
    n, me = len(group), group.index(run.world_rank)
    for s, d in zip(srcs, dsts):
        _shape_rule(instr, s.shape[0] % n == 0 and d.shape == s.shape,
                    f"dst shape {d.shape} must be src shape {s.shape}, axis 0 a multiple of the {n} ranks")
    got = _exchange(instr, run, group, [_snapshot(s) for s in srcs])
    for i, d in enumerate(dsts):
        size = srcs[i].shape[0] // n
        parts = [got[r][i] for r in group]
        _put(instr, d, np.concatenate([p[0][me * size:(me + 1) * size] for p in parts], axis=0), parts[0][1],
             [srcs[i]])


def _variable(instr):
    raise NKIError(instr, "this variable-size collective (sizes read from a metadata tensor at run time) is not "
                   "simulated", "use all_gather / all_to_all with fixed sizes in the simulator, or run it on Trainium")


def all_gather_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None) -> None:
    """Variable-length all-gather: not simulated."""
    _variable("nki.collectives.all_gather_v")


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None) -> None:
    """Variable-length all-to-all: not simulated."""
    _variable("nki.collectives.all_to_all_v")


def _one(values, instr, role) -> list:
    values = _tensors(values, instr, role)
    if len(values) != 1:
        raise NKIError(instr, f"{role} has {len(values)} tensors; AWS: coalesced collectives are not supported "
                       "here, each list holds exactly one tensor", f"pass {role}=[tensor]")
    return values


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None) -> None:
    """For each (source, target) pair, the source rank's srcs[0] lands in the target rank's dsts[0]
    (a rank that is no target keeps its dst). Every rank named in a pair takes part; HBM only."""
    instr = "nki.collectives.collective_permute"
    run = current(instr)
    srcs, dsts = _one(srcs, instr, "srcs"), _one(dsts, instr, "dsts")
    _memory(instr, srcs, dsts, sbuf_ok=False)
    try:
        pairs = [(int(a), int(b)) for a, b in source_target_pairs]
    except (TypeError, ValueError):
        raise NKIError(instr, f"source_target_pairs must be (source, target) rank pairs, got "
                       f"{source_target_pairs!r}") from None
    ranks = sorted({r for p in pairs for r in p})
    outside = [r for r in ranks if r >= run.world_size]
    if outside:
        raise NKIError(instr, f"source_target_pairs name rank {outside[0]}, but the simulated world has "
                       f"{run.world_size} rank(s)", _MULTI_RANK)
    for role, side in (("target", 1), ("source", 0)):
        counts = [p[side] for p in pairs]
        dup = [r for r in set(counts) if counts.count(r) > 1]
        if dup:
            raise NKIError(instr, f"rank {dup[0]} is the {role} of several pairs in {pairs}",
                           "give each rank at most one source and one target")
    if run.world_rank not in ranks:
        return
    _shape_rule(instr, srcs[0].shape == dsts[0].shape, f"dst shape {dsts[0].shape} differs from src shape "
                f"{srcs[0].shape}")
    got = _exchange(instr, run, tuple(ranks), _snapshot(srcs[0]))
    source = [a for a, b in pairs if b == run.world_rank]
    if source:
        values, dtype = got[source[0]]
        _put(instr, dsts[0], values, dtype, [srcs[0]])


def _channels(by_channel, instr, role) -> list:
    if not isinstance(by_channel, (list, tuple)) or not by_channel:
        raise NKIError(instr, f"{role} must be a non-empty list (one entry per channel) of one-tensor lists")
    return [_one(c, instr, role)[0] for c in by_channel]


def _channel_ids(channel_ids, n, instr) -> None:
    ids = list(channel_ids)
    if ids != list(range(len(ids))):
        raise NKIError(instr, f"channel_ids {ids} must be consecutive integers from 0 (AWS)")
    if len(ids) != n:
        raise NKIError(instr, f"{n} channels of tensors but channel_ids {ids}", "pass one channel id per channel")
    if n > 4:
        raise NKIError(instr, f"{n} channels; AWS allows at most 4 (2 outside whole-node replica groups)")


def _predecessor(group, rank, steps=1):
    return group[(group.index(rank) - steps) % len(group)]


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None,
                                name=None) -> None:
    """A ring over the rank-list: each rank sends each channel's src to its successor and receives
    its predecessor's into the channel's dst (a ring of one rank receives its own)."""
    instr = "nki.collectives.collective_permute_implicit"
    run = current(instr)
    srcs = _channels(srcs_by_channel, instr, "srcs_by_channel")
    dsts = _channels(dsts_by_channel, instr, "dsts_by_channel")
    if len(srcs) != len(dsts):
        raise NKIError(instr, f"{len(srcs)} source channels but {len(dsts)} destination channels")
    _channel_ids(channel_ids, len(srcs), instr)
    for s, d in zip(srcs, dsts):
        _memory(instr, [s], [d])
        _shape_rule(instr, s.shape == d.shape, f"dst shape {d.shape} differs from src shape {s.shape}")
    group = _members(replica_group, instr, run)
    got = _exchange(instr, run, group, [_snapshot(s) for s in srcs])
    previous = got[_predecessor(group, run.world_rank)]
    for (values, dtype), s, d in zip(previous, srcs, dsts):
        _put(instr, d, values, dtype, [s])


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group, op,
                                       channel_ids=(0,), priority=None, name=None) -> None:
    """As collective_permute_implicit, each rank sending op(srcs0, srcs1) of each channel (in
    float32): its dst receives its predecessor's."""
    instr = "nki.collectives.collective_permute_implicit_reduce"
    run = current(instr)
    s0 = _channels(srcs0_by_channel, instr, "srcs0_by_channel")
    s1 = _channels(srcs1_by_channel, instr, "srcs1_by_channel")
    dsts = _channels(dsts_by_channel, instr, "dsts_by_channel")
    if not len(s0) == len(s1) == len(dsts):
        raise NKIError(instr, f"channel counts differ: {len(s0)} / {len(s1)} / {len(dsts)}")
    token = _op(op, instr)
    _channel_ids(channel_ids, len(dsts), instr)
    for a, b, d in zip(s0, s1, dsts):
        _memory(instr, [a], [d])
        _memory(instr, [b], [d])
        _shape_rule(instr, a.shape == b.shape == d.shape, f"the sources {a.shape}, {b.shape} and dst {d.shape} "
                    "differ in shape")
    group = _members(replica_group, instr, run)
    mine = [token.fn(_f32(*_snapshot(a)), _f32(*_snapshot(b))) for a, b in zip(s0, s1)]
    got = _exchange(instr, run, group, mine)
    for values, a, b, d in zip(got[_predecessor(group, run.world_rank)], s0, s1, dsts):
        _put(instr, d, values, np.float32, [a, b])


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0,
                                                           name=None) -> VirtualRegister:
    """The rank whose data ring step `iteration_id` processes, as a register: the own rank at
    iteration 0, then the predecessors' (the data arrived from them), around the rank-list."""
    instr = "nki.collectives.collective_permute_implicit_current_processing_rank_id"
    run = current(instr)
    group = _members(replica_group, instr, run)
    step = int(iteration_id) if not isinstance(iteration_id, VirtualRegister) else iteration_id.get(instr)
    return VirtualRegister(_predecessor(group, run.world_rank, step))


def rank_id(name=None) -> VirtualRegister:
    """This rank's id, as a register (0 in a plain launch; the rank in nki.multi_rank_simulate)."""
    return VirtualRegister(current("nki.collectives.rank_id").world_rank)


__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "all_gather_v", "reduce_scatter", "all_to_all",
           "all_to_all_v", "collective_permute", "collective_permute_implicit",
           "collective_permute_implicit_reduce", "collective_permute_implicit_current_processing_rank_id",
           "rank_id"]
