"""The audit's model of Adaptive Eager Execution: how TorchNeuron's eager mode would
group the recorded op calls into launches when its concatenation is on.

The rule is the one AWS's source applies (torch_neuronx/csrc/core/concatenation/ of the
public April 2026 snapshot; facts only, no code): ops compiled from their lowering that
do not write into one of their inputs are buffered; a matmul-class op (AWS's list:
linear, linear_backward, matmul, matmul_backward, mm, bmm, addmm, baddbmm, addbmm,
conv2d) ends the buffered sequence, itself included, and the sequence runs as one
launch; any other kind of device work is a boundary: it ends the sequence, which runs as
one launch, and runs alone (copies and transfers, host reads, CPU fallbacks, in-place
ops, collectives, events and synchronizations, compiled graphs; NKI kernels too here, where
AWS's list has them end a sequence like a matmul: the audit records their launches apart), and so does
reaching TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT ops. Views and allocations move no
data and are not launches. The audit also closes the open sequence at each step's end,
so that a step's launches are its own.

Each signature's role is decided here at its first call (Recording._on_signature); the
C++ recorder (csrc/Recorder.h) keeps the open sequence and counts each distinct sequence's
launches and what ended them. report.py turns the counts into launches per step, the
fused sequences and their cuts.
"""

from __future__ import annotations

from torch_neuronx.ops import registry

# csrc/Recorder.h FusionRole.
BOUNDARY, FUSIBLE, ENDS_SEQUENCE, TRANSPARENT = 0, 1, 2, 3
ROLE_NAMES = {BOUNDARY: "boundary", FUSIBLE: "fusible", ENDS_SEQUENCE: "ends_sequence",
              TRANSPARENT: "transparent"}

# csrc/Recorder.h FusionCut: what ended a sequence when it was not an op call.
ENDED_BY_ITS_MATMUL, CLOSED_AT_STEP_END = -1, -7
CUTS = {
    -1: "its own matmul-class op (a natural end)",
    -2: "the buffer size limit (TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT)",
    -3: "a synchronize, stream synchronize or event record",
    -4: "a compiled graph's run",
    -5: "an NKI kernel's launch",
    -6: "a collective",
    -7: "the end of a step",
}
CUT_CODES = {"graph": -4, "nki": -5, "collective": -6}


def _writes_input(op: str) -> bool:
    """In-place and out= ops: AWS's engine treats an op whose output is one of its inputs as a
    boundary."""
    name, _, overload = op.rpartition("::")[2].partition(".")
    return (name.endswith("_") and not name.endswith("__")) or overload.startswith("out")


def boundary_reason(op: str, path: str) -> str | None:
    """Why a call of `op` ends a fused sequence, or None when it does not."""
    name = registry.base_name(op)
    if path == "fallback":
        return "a CPU fallback"
    if name in registry.HOST_SYNC or name in registry.DATA_DEPENDENT:
        return "a host read"
    if registry.is_copy(op):
        return "a copy or transfer"
    if op.partition("::")[0] not in ("aten", "prims"):
        return "an op outside aten (a custom op, a collective)"
    if _writes_input(op):
        return "an in-place op"
    return None


def role_of(op: str, path: str) -> int:
    """The FusionRole of a signature's calls."""
    name = registry.base_name(op)
    if registry.is_allocation(op) or name in registry.VIEWS or name in registry.METADATA:
        return TRANSPARENT
    if boundary_reason(op, path) is not None:
        return BOUNDARY
    return ENDS_SEQUENCE if name in registry.ENDS_FUSED_SEQUENCE else FUSIBLE


def flags(role: int, watched: bool) -> int:
    """The C++ recorder's answer for a new signature (csrc/Recorder.h startRecording)."""
    return int(watched) | (role << 1)


# ----------------------------------------------------------------- the report's section

TOP_SEQUENCES = 10
SHOWN_OPS = 12


def _cut_text(cut: int, by_id: dict) -> tuple[str, dict | None]:
    """(why, the op that cut: its op name and first site) of one ended_by code."""
    if cut < 0:
        return CUTS.get(cut, f"cut {cut}"), None
    sig = by_id.get(cut)
    if sig is None:
        return "an op call", None
    return boundary_reason(sig["op"], sig["path"]) or "an op call", sig


def summarize(record: dict) -> dict:
    """The report's `fusion` section for one process: launches per step without and with the
    model's fusion, the fused sequences (the kernels TorchNeuron compiles for them) and what
    cut them."""
    from torch_neuronx.audit.report import _in_steps, per_step

    seen = len(record["steps"])
    by_id = {sig["id"]: sig for sig in record["signatures"]}
    unfused = boundary_launches = 0.0
    for sig in record["signatures"]:
        role = sig.get("fusion_role", "boundary")
        if sig["path"] == "fallback" or role == "transparent":
            continue
        calls = per_step(_in_steps(sig, "calls"), sig["calls_first_step"], seen)
        unfused += calls
        if role == "boundary":
            boundary_launches += calls
    sequences, cuts = [], []
    fused_launches = fused_ops = 0.0
    for seq in record.get("fused_sequences", ()):
        launches = per_step(_in_steps(seq, "launches"), seq["launches_first_step"], seen)
        fused_launches += launches
        fused_ops += launches * len(seq["ops"])
        ended = []
        for cut in seq["ended_by"]:
            n = per_step(_in_steps(cut, "launches"), cut["launches_first_step"], seen)
            ended.append((cut["cut"], n))
            if cut["cut"] not in (ENDED_BY_ITS_MATMUL, CLOSED_AT_STEP_END):  # what the program did
                cuts.append((cut["cut"], n))
        sequences.append((seq, launches, ended))
    in_steps = [s for s in sequences if s[1] > 0]
    rows = []
    for seq, launches, ended in sorted(in_steps, key=lambda s: (-s[1] * len(s[0]["ops"]), s[0]["id"]))[:TOP_SEQUENCES]:
        names = [by_id[i]["op"] if i in by_id else f"signature {i}" for i in seq["ops"]]
        rows.append({"ops": names[:SHOWN_OPS], "length": len(names), "launches_per_step": launches,
                     "ended_by": _cut_rows(ended, by_id)})
    launches_fused = boundary_launches + fused_launches
    return {
        "enabled": bool(record.get("concatenation", False)),
        "launches_per_step_unfused": unfused,
        "launches_per_step_fused": launches_fused,
        "ops_per_fused_launch": fused_ops / fused_launches if fused_launches else 0.0,
        "sequences_per_step": fused_launches,
        "kernels": sum(1 for s in sequences if s[0]["launches"]),
        "kernels_in_steps": len(in_steps),
        "kernels_new_after_step_1": sum(1 for s in sequences
                                        if isinstance(s[0].get("first_step"), int) and 1 <= s[0]["first_step"] < seen),
        "sequences": rows,
        "cuts": _cut_rows(cuts, by_id),
    }


def _cut_rows(cuts: list[tuple[int, float]], by_id: dict) -> list[dict]:
    """(cut, per step) pairs as rows, one per reason, op and line (the signatures of one op
    at one line, in several shapes, are one row), most frequent first."""
    rows: dict[tuple, dict] = {}
    for cut, count in cuts:
        why, sig = _cut_text(cut, by_id)
        site = (sig.get("sites") or [sig.get("site")])[0] if sig else None
        key = (why, sig["op"] if sig else None, (site or {}).get("file"), (site or {}).get("line"))
        row = rows.setdefault(key, {"reason": why, "op": key[1], "site": site, "per_step": 0.0})
        row["per_step"] += count
    return sorted((r for r in rows.values() if r["per_step"] > 0), key=lambda r: -r["per_step"])


def cuts_by_op(summary: dict, op: str) -> float:
    """Sequences per step that calls of `op` cut (a host read's cost to fusion)."""
    return sum(row["per_step"] for row in summary["cuts"] if row["op"] == op)
