"""`nki.collectives`: AWS's collective communication inside a kernel, as far as one launch can run it.

AWS's module (NKI API reference, `nki.collectives`) moves data between *ranks*: logical
NeuronCores, each running its own copy of the kernel on its own inputs (nki-library's tests launch
one per rank, `collective_ranks=N`), grouped by a `ReplicaGroup`. A simulated launch is one rank
(its LNC programs are the physical cores of that one logical core), so the simulator runs a
collective whose replica group has one rank per sub-group, where every operation is defined by
AWS's semantics on a single rank (an all-reduce or all-gather of one contribution is that
contribution; a ring of one rank sends to itself), with AWS's argument rules checked. A collective
over several ranks raises an NKIError: collectives across ranks are not simulated (there are no
other ranks' kernels or inputs in the launch). `all_gather_v` / `all_to_all_v` need several ranks
by AWS's own limits (four ranks per rank-list, or several devices) and always raise.

`rank_id()` is 0 (the simulated rank) and, like AWS's, returns a register.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import NKIError
from .isa.registers import VirtualRegister
from .language import NKIObject
from .tensor import NkiTensor

_REDUCE_OPS = ("add", "minimum", "maximum")
_NOT_SIMULATED = ("collectives across ranks (other logical NeuronCores or devices, each running its own copy "
                  "of the kernel) are not simulated: a simulated launch is one rank")
_HINT = ("simulate with a single-rank replica group, e.g. nki.collectives.ReplicaGroup([[0]]), or run the "
         "collective on Trainium")


@dataclass
class ReplicaGroup(NKIObject):
    """The ranks that take part in a collective: sub-groups (lists of ranks) with no rank in two.
    `ReplicaGroup([[0, 1, 2, 3]])`; a flat list of ranks is one sub-group."""

    groups: list

    def __post_init__(self):
        groups = self.groups
        if isinstance(groups, ReplicaGroup):
            groups = groups.groups
        try:
            groups = [list(g) for g in groups]
        except TypeError:
            groups = [list(groups)]  # a flat list of ranks: one sub-group
        if groups and all(isinstance(g, int) for g in self.groups):
            groups = [list(self.groups)]
        try:
            groups = [[int(r) for r in g] for g in groups]
        except (TypeError, ValueError):
            raise NKIError("nki.collectives.ReplicaGroup", f"groups must be lists of integer ranks, got "
                           f"{self.groups!r}") from None
        seen = set()
        for g in groups:
            if not g:
                raise NKIError("nki.collectives.ReplicaGroup", "a sub-group is empty", "list its ranks")
            for r in g:
                if r < 0:
                    raise NKIError("nki.collectives.ReplicaGroup", f"rank {r} is negative")
                if r in seen:
                    raise NKIError("nki.collectives.ReplicaGroup", f"rank {r} is in two sub-groups of {groups}",
                                   "AWS: sub-groups should not overlap")
                seen.add(r)
        self.groups = groups


def _group(replica_group, instr) -> ReplicaGroup:
    if replica_group is None:
        raise NKIError(instr, "replica_group is None", "pass an nki.collectives.ReplicaGroup")
    if not isinstance(replica_group, ReplicaGroup):
        replica_group = ReplicaGroup(replica_group)
    largest = max(len(g) for g in replica_group.groups)
    if largest > 1:
        raise NKIError(instr, f"replica group {replica_group.groups} has sub-groups of {largest} ranks; "
                       + _NOT_SIMULATED, _HINT)
    return replica_group


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


def _copy(instr, dst, src, fn=None, other=None) -> None:
    """dst = src (one rank's contribution), or fn(src, other); cast to dst's dtype as a DMA does."""
    from .isa import _access, _f32, _record, _store, _write

    eng = "dma"
    _access(instr, eng, reads=[("src", src)] + ([("src", other)] if other is not None else []),
            writes=[("dst", dst)])
    if dst.shape != src.shape:
        raise NKIError(instr, f"dst shape {dst.shape} differs from src shape {src.shape}; with one rank the "
                       "collective's output is its input", "allocate dst with src's shape (times the ranks "
                       "along collective_dim)")
    if fn is not None:
        if other.shape != src.shape:
            raise NKIError(instr, f"the two sources have shapes {src.shape} and {other.shape}")
        _write(dst, fn(_f32(src), _f32(other)))
    elif dst.dtype is src.dtype or dst.dtype == src.dtype:
        _store(dst, src.data)
    else:
        _write(dst, _f32(src))
    reads = [src] + ([other] if other is not None else [])
    nbytes = max(dst.nbytes, src.nbytes)
    side = dst if dst.buffer.on_chip else src
    _record(instr, eng, [dst], reads, ("dma", nbytes, nbytes / max(1, side.partitions if side.ndim else 1)),
            nbytes=nbytes)


def _op(op, instr):
    from . import elementwise as _ops

    token = _ops.resolve(op, instr, 2)
    if token.name not in _REDUCE_OPS:
        raise NKIError(instr, f"op {token!r} is not a collective reduction (AWS: nl.add, nl.minimum, nl.maximum)")
    return token


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None) -> None:
    """Reduce `srcs` over the ranks of the group into `dsts` (op: add, minimum, maximum)."""
    instr = "nki.collectives.all_reduce"
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    _memory(instr, srcs, dsts)
    _op(op, instr)
    _group(replica_group, instr)
    for s, d in zip(srcs, dsts):
        _copy(instr, d, s)


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """Concatenate every rank's `srcs` along `collective_dim` into `dsts` (HBM: dim 0; SBUF: 0 or 1)."""
    instr = "nki.collectives.all_gather"
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    kind = _memory(instr, srcs, dsts)
    _dim(collective_dim, kind, instr)
    _group(replica_group, instr)
    for s, d in zip(srcs, dsts):
        _copy(instr, d, s)


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None) -> None:
    """Reduce over the ranks, then give rank i the i-th slice along `collective_dim` (0)."""
    instr = "nki.collectives.reduce_scatter"
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    kind = _memory(instr, srcs, dsts)
    _dim(collective_dim, kind, instr, (0,))
    _op(op, instr)
    _group(replica_group, instr)
    for s, d in zip(srcs, dsts):
        _copy(instr, d, s)


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None) -> None:
    """Rank i sends its j-th slice along `collective_dim` (0) to rank j; HBM only."""
    instr = "nki.collectives.all_to_all"
    srcs, dsts = _tensors(srcs, instr, "srcs"), _tensors(dsts, instr, "dsts")
    kind = _memory(instr, srcs, dsts, sbuf_ok=False)
    _dim(collective_dim, kind, instr, (0,))
    _group(replica_group, instr)
    for s, d in zip(srcs, dsts):
        _copy(instr, d, s)


def _variable(instr):
    raise NKIError(instr, "AWS runs this collective only across several ranks (LNC 2 with four ranks per "
                   "rank-list, or several devices); " + _NOT_SIMULATED, "run it on Trainium")


def all_gather_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None) -> None:
    """Variable-length all-gather: not simulated (needs several ranks)."""
    _variable("nki.collectives.all_gather_v")


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False,
                 priority=None, name=None) -> None:
    """Variable-length all-to-all: not simulated (needs several ranks)."""
    _variable("nki.collectives.all_to_all_v")


def _one(values, instr, role) -> list:
    values = _tensors(values, instr, role)
    if len(values) != 1:
        raise NKIError(instr, f"{role} has {len(values)} tensors; AWS: coalesced collectives are not supported "
                       "here, each list holds exactly one tensor", f"pass {role}=[tensor]")
    return values


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None) -> None:
    """Send `srcs` of each pair's source rank to its target rank's `dsts`; HBM only."""
    instr = "nki.collectives.collective_permute"
    srcs, dsts = _one(srcs, instr, "srcs"), _one(dsts, instr, "dsts")
    _memory(instr, srcs, dsts, sbuf_ok=False)
    try:
        pairs = [(int(a), int(b)) for a, b in source_target_pairs]
    except (TypeError, ValueError):
        raise NKIError(instr, f"source_target_pairs must be (source, target) rank pairs, got "
                       f"{source_target_pairs!r}") from None
    if any(a != b for a, b in pairs):
        raise NKIError(instr, f"source_target_pairs {pairs} move data between different ranks; " + _NOT_SIMULATED,
                       "simulate with pairs of a rank to itself, e.g. [(0, 0)], or run it on Trainium")
    if (0, 0) in pairs:  # the simulated rank is 0
        _copy(instr, dsts[0], srcs[0])


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


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None,
                                name=None) -> None:
    """Each rank sends to its successor in the ring and receives from its predecessor, per channel;
    a ring of one rank receives its own data."""
    instr = "nki.collectives.collective_permute_implicit"
    srcs, dsts = _channels(srcs_by_channel, instr, "srcs_by_channel"), _channels(dsts_by_channel, instr,
                                                                                   "dsts_by_channel")
    if len(srcs) != len(dsts):
        raise NKIError(instr, f"{len(srcs)} source channels but {len(dsts)} destination channels")
    _channel_ids(channel_ids, len(srcs), instr)
    _group(replica_group, instr)
    for s, d in zip(srcs, dsts):
        _memory(instr, [s], [d])
        _copy(instr, d, s)


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group, op,
                                       channel_ids=(0,), priority=None, name=None) -> None:
    """As collective_permute_implicit, sending op(srcs0, srcs1) of each channel."""
    instr = "nki.collectives.collective_permute_implicit_reduce"
    s0 = _channels(srcs0_by_channel, instr, "srcs0_by_channel")
    s1 = _channels(srcs1_by_channel, instr, "srcs1_by_channel")
    dsts = _channels(dsts_by_channel, instr, "dsts_by_channel")
    if not len(s0) == len(s1) == len(dsts):
        raise NKIError(instr, f"channel counts differ: {len(s0)} / {len(s1)} / {len(dsts)}")
    token = _op(op, instr)
    _channel_ids(channel_ids, len(dsts), instr)
    _group(replica_group, instr)
    for a, b, d in zip(s0, s1, dsts):
        _memory(instr, [a], [d])
        _memory(instr, [b], [d])
        _copy(instr, d, a, token.fn, b)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0,
                                                           name=None) -> VirtualRegister:
    """The rank whose data a ring step processes (a register): the own rank at iteration 0, then the
    predecessors'; in a ring of one rank, always the own rank (0)."""
    _group(replica_group, "nki.collectives.collective_permute_implicit_current_processing_rank_id")
    return VirtualRegister(0)


def rank_id(name=None) -> VirtualRegister:
    """This rank's id within the collective group, as a register: 0 (a launch simulates one rank)."""
    return VirtualRegister(0)


__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "all_gather_v", "reduce_scatter", "all_to_all",
           "all_to_all_v", "collective_permute", "collective_permute_implicit",
           "collective_permute_implicit_reduce", "collective_permute_implicit_current_processing_rank_id",
           "rank_id"]
