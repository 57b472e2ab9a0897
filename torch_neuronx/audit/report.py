"""The audit's report: the records of the audited processes (recorder.py), merged
and analysed into one JSON-serializable dict whose shape schema.py defines.

Steps. A step ends at each step() of the first optimizer a process used (or at
each torch_neuronx.audit.mark_step()). Step 1 includes everything before it
(building the model, moving it to the device): the warm-up. "Per step" figures
are those of the steady state: the calls after step 1 divided by the later
steps; with one step, step 1's; with no step marker, the whole run is one step.

Phases. Work that is not a training step never enters the per-step figures:
named phases (the HF Trainer's evaluate/predict, generate after training,
torch_neuronx.audit.phase()) and the work after the last step ("after the
training loop"). Each phase is reported apart, with its op table and its own
estimate per occurrence (`phases`).

Ranks. Each process records itself; figures "per step" are per process (one
NeuronCore each), summed calls are over all processes, and `ranks` keeps each
process's own numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from torch_neuronx.audit import fusion
from torch_neuronx.audit.formatting import site_text
from torch_neuronx.audit.knobs import library_remedy
from torch_neuronx.audit.recorder import AFTER_LAST_STEP, is_tensor
from torch_neuronx.ops import registry

REPORT_SCHEMA_VERSION = 1
DEFAULT_TARGETS = ("trn2.3xlarge", "trn3.3xlarge")


def _compiles_kernel(signature: dict) -> bool:
    """A device call the device compiles a kernel for: not a fallback, not one of the
    registry's NO_KERNEL calls (allocation, storage metadata, copies, scalar reads)."""
    return signature["path"] != "fallback" and registry.base_name(signature["op"]) not in registry.NO_KERNEL


# A signature first seen after step 1 in at least this many steps means the
# shapes keep changing (shape churn), not a one-off (an evaluation at the end).
CHURN_MIN_STEPS = 2


@dataclass
class Options:
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    prices: dict[str, float] = field(default_factory=dict)
    baseline: dict | None = None
    units_per_step: float | None = None
    unit: str | None = None

    @classmethod
    def from_args(cls, args) -> "Options":
        from torch_neuronx.audit import prices
        from torch_neuronx.neuron.profiles import PROFILES

        targets = list(args.instance or DEFAULT_TARGETS)
        for name in targets:
            if name not in PROFILES:
                raise ValueError(f"--instance {name!r} is not a known instance profile; "
                                 f"known: {', '.join(sorted(PROFILES))}")
        table = dict(prices.parse_price(text) for text in args.price)
        baseline = prices.parse_baseline(args.baseline) if args.baseline else None
        if args.units_per_step is not None and not args.units_per_step > 0:
            raise ValueError(f"--units-per-step {args.units_per_step:g}: give a positive number "
                             "of units of work per step, e.g. --units-per-step 8192 --unit tokens")
        return cls(targets, table, baseline, args.units_per_step, args.unit)


# --------------------------------------------------------------- the report

def build(records: list[dict], options: Options, *, command: list[str], exit_code: int,
          interrupted: bool, wall_s: float) -> dict:
    from torch_neuronx import __version__

    primary = records[0]
    steps = _step_count(primary)
    signatures = _signatures(records)
    ops = _ops(signatures)
    targets = target_profiles(options.targets)
    memory = _memory(records, targets)
    compiled = _torch_compile(records)
    hazards = _hazards(signatures, records, options.targets, compiled)
    eager = _eager_compilations(primary)
    fused = fusion.summarize(primary)
    estimates = _estimates(primary, targets, fused)
    cost = _cost(estimates, options, primary, steps)
    phases = _phases(primary, targets, options)
    exception = next((r["exception"] for r in records if r.get("exception")), None)
    report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "tool": {"name": "torch-neuronx audit", "version": __version__},
        "command": command,
        "exit_code": exit_code,
        "status": "interrupted" if interrupted else ("failed" if exit_code or exception else "completed"),
        "exception": exception,
        "wall_s": round(wall_s, 3),
        "emulated_instance": primary["instance"],
        "steps": {"count": steps, "source": primary.get("step_source") or "none",
                  "note": _steps_note(primary, phases)},
        "ranks": [_rank_summary(r) for r in records],
        "ops": ops,
        "fallbacks": _fallbacks(signatures, ops),
        "eager_compilations": eager,
        "fusion": _rounded(fused),
        "torch_compile": compiled,
        "memory": memory,
        "hazards": hazards,
        "collectives": _rounded(_collectives(primary)),
        "estimates": estimates,
        "cost": cost,
        "phases": phases,
    }
    report["verdict"] = _verdict(report)
    return report


def target_profiles(names: list[str]) -> list:
    """The target instances under the LNC the audited processes ran with: NEURON_LOGICAL_NC_CONFIG
    as set for this command (its processes inherit it), so HBM per core and per-core rates follow
    it. A target whose platform does not take that LNC (trn1 at LNC=2) keeps its own default."""
    from torch_neuronx import config
    from torch_neuronx.neuron.profiles import LNC_CHOICES, PROFILES

    lnc = config.logical_nc_config()
    return [PROFILES[name].with_lnc(lnc if lnc in LNC_CHOICES[PROFILES[name].platform] else None)
            for name in names]


# ---------------------------------------------------------------- steps

def _step_count(record: dict) -> int:
    return max(1, len(record["steps"]))


def _steps_note(record: dict, phases: list[dict]) -> str:
    count = len(record["steps"])
    if count == 0:
        note = ("no step marker was seen (no optimizer.step(), no torch_neuronx.audit.mark_step()): "
                "the whole run counts as one step")
    elif count == 1:
        note = "one step: its figures include the warm-up (model creation, first compilations)"
    else:
        note = (f"{count} steps ({record['step_source']}); per-step figures are the average of steps "
                f"2-{count} (step 1 includes the warm-up)")
    if phases:
        held = ", ".join(f"{p['label']} ({p['occurrences']}x)" if p["occurrences"] > 1 else p["label"]
                         for p in phases)
        note += f"; work outside the steps is reported apart, not in per-step figures: {held}"
    return note


def per_step(calls: int, calls_first: int, steps_seen: int) -> float:
    """Steady-state calls per step of one signature (see the module docstring); `calls` are
    those of the steps (phases and the work after the last step left out)."""
    if steps_seen >= 2:
        return (calls - calls_first) / (steps_seen - 1)
    return float(calls_first if steps_seen == 1 else calls)


def _in_steps(row: dict, field: str) -> float:
    """A record row's count over the steps (`calls_steps`); a record without phases has
    only the total (`calls`)."""
    return row.get(f"{field}_steps", row[field])


def _signatures(records: list[dict]) -> list[dict]:
    """Every recorded signature of every process, with its rank and per-step figures."""
    rows = []
    for record in records:
        seen = len(record["steps"])
        for sig in record["signatures"]:
            calls_step = per_step(_in_steps(sig, "calls"), sig["calls_first_step"], seen)
            host_step = per_step(_in_steps(sig, "host_ns"), sig["host_ns_first_step"], seen) / 1e9
            rows.append(dict(sig, rank=record["rank"], calls_per_step=calls_step, host_s_per_step=host_step))
    return rows


def _rank_summary(record: dict) -> dict:
    return {
        "rank": record["rank"], "pid": record["pid"], "steps": len(record["steps"]),
        "calls": record["calls"], "signatures": len(record["signatures"]),
        "fallback_calls": sum(s["calls"] for s in record["signatures"] if s["path"] == "fallback"),
        "peak_memory_bytes": max(record["memory"]["peak"], default=0),
        "duration_s": record["duration_s"], "exception": record.get("exception"),
        "interrupted": record.get("interrupted", False),
    }


# ---------------------------------------------------------------- ops

def _ops(signatures: list[dict]) -> list[dict]:
    grouped: dict[tuple, dict] = {}
    for sig in signatures:
        # A direct kernel is the native op's fast path: one row per op and native/fallback.
        path = "fallback" if sig["path"] == "fallback" else "native"
        row = grouped.setdefault((sig["op"], path), {
            "op": sig["op"], "path": path, "calls": 0, "calls_per_step": 0.0,
            "host_s": 0.0, "host_s_per_step": 0.0, "signatures": 0})
        row["calls"] += sig["calls"]
        row["calls_per_step"] += sig["calls_per_step"]
        row["host_s"] += sig["host_ns"] / 1e9
        row["host_s_per_step"] += sig["host_s_per_step"]
        row["signatures"] += 1
    total = sum(r["host_s_per_step"] for r in grouped.values()) or 1.0
    rows = sorted(grouped.values(), key=lambda r: (-r["host_s_per_step"], -r["host_s"]))
    for row in rows:
        row["share_of_step"] = row["host_s_per_step"] / total
    return _rounded(rows)


def _merge_sites(sigs: list[dict]) -> list[dict]:
    """Call sites of watched signatures, merged over signatures and ranks, busiest first."""
    merged: dict[tuple, dict] = {}
    steps: dict[tuple, set] = defaultdict(set)  # the steps a line ran in, over all its signatures
    for sig in sigs:
        for site in sig.get("sites") or ([dict(sig["site"], calls=sig["calls"])] if sig.get("site") else []):
            if not site.get("file"):
                continue
            library = site.get("library") or {}
            # One user line calling into a library may reach several reads inside it: one site each.
            key = (site["file"], site["line"], site.get("backward", False), library.get("file"), library.get("line"))
            entry = merged.setdefault(key, {k: v for k, v in site.items() if k not in ("step_indices", "phases")}
                                      | {"calls": 0, "phases": []})
            entry["calls"] += site["calls"]
            entry["phases"] = sorted(set(entry["phases"]) | set(site.get("phases", ())))
            steps[key].update(site.get("step_indices", ()))
    for key, entry in merged.items():
        entry["steps"] = len(steps[key])
        entry["in_step_loop"] = entry["steps"] >= 2  # the line runs in more than one step
    return sorted(merged.values(), key=lambda s: -s["calls"])


def _fallbacks(signatures: list[dict], ops: list[dict]) -> list[dict]:
    from torch_neuronx.audit.estimate import fallback_round_trip_s

    by_op = defaultdict(list)
    for sig in signatures:
        if sig["path"] == "fallback":
            by_op[sig["op"]].append(sig)
    shares = {r["op"]: r["share_of_step"] for r in ops if r["path"] == "fallback"}
    rows = []
    for op, sigs in by_op.items():
        rows.append({
            "op": op,
            "calls": sum(s["calls"] for s in sigs),
            "calls_per_step": sum(s["calls_per_step"] for s in sigs),
            "host_s_per_step": sum(s["host_s_per_step"] for s in sigs),
            # On Trainium each call is also a round trip: the operands over the host link and a sync.
            "trainium_s_per_step": sum(s["host_s_per_step"] + s["calls_per_step"] * fallback_round_trip_s(s)
                                       for s in sigs),
            "share_of_step": shares.get(op, 0.0),
            "sites": _merge_sites(sigs),
        })
    return _rounded(sorted(rows, key=lambda r: -r["host_s_per_step"]))


# ------------------------------------------------------- eager compilations

def _eager_compilations(record: dict) -> dict:
    """Distinct kernel signatures: each is compiled on first use on the device."""
    every = [s for s in record["signatures"] if _compiles_kernel(s)]
    kernels = [s for s in every if not s.get("first_phase")]  # a phase's new kernels are its own
    steps = len(record["steps"])
    new_by_step = [0] * (steps + 1)  # index k: first seen in step k+1; the last: after the last step
    for sig in kernels:
        new_by_step[min(sig["first_step"], steps)] += 1
    late = [s for s in kernels if 1 <= s["first_step"] < steps]
    churn_steps = {s["first_step"] for s in late}
    churn = []
    if len(churn_steps) >= CHURN_MIN_STEPS:
        groups = defaultdict(list)
        for sig in late:
            site = sig.get("site") or {}
            groups[(sig["op"], site.get("file"), site.get("line"))].append(sig)
        for (op, _, _), sigs in sorted(groups.items(), key=lambda item: -len(item[1])):
            churn.append({
                "op": op, "site": sigs[0].get("site"), "new_signatures": len(sigs),
                "steps_with_new": len({s["first_step"] for s in sigs}),
                "example_shapes": [_shapes(s["args"]) for s in sigs[:3]],
            })
    in_phases = defaultdict(int)
    for sig in every:
        if sig.get("first_phase"):
            in_phases[sig["first_phase"]] += 1
    return {
        "total_signatures": len(every),
        "in_phases": dict(in_phases),
        "first_step": new_by_step[0],
        "new_per_step": new_by_step[1:steps] if steps > 1 else [],
        "after_last_step": new_by_step[steps] if steps >= 1 else 0,
        "churn": churn,
    }


def _shapes(args: list) -> list:
    return [a["shape"] for a in args if is_tensor(a)]


# ---------------------------------------------------------- torch.compile

def _torch_compile(records: list[dict]) -> dict:
    primary = records[0]
    counters = primary["compile"]
    breaks = defaultdict(int)
    sites = {}
    for record in records:
        for entry in record["graph_breaks"]:
            key = (entry["reason"], (entry["site"] or {}).get("file"), (entry["site"] or {}).get("line"))
            breaks[key] += entry["count"]
            sites[key] = entry["site"]
    return {
        "used": bool(counters["compiles"] or primary["graphs"] or counters["graph_breaks"]),
        "graphs": len(primary["graphs"]),
        "compiles": counters["compiles"],
        "compile_seconds": counters["compile_seconds"],
        "graph_runs": sum(g["runs"] for g in primary["graphs"]),
        "graph_breaks": [{"reason": reason, "site": sites[key], "count": n}
                         for key, n in breaks.items() for reason in [key[0]]],
        "recompiles": counters["recompiles"],
        "recompile_reasons": counters["recompile_reasons"],
        "unlowered": primary["unlowered"],
    }


# ------------------------------------------------------------------- memory

def _memory(records: list[dict], targets: list) -> dict:
    peak = max(max(r["memory"]["peak"], default=0) for r in records)
    primary = records[0]
    core = max(range(len(primary["memory"]["peak"])), key=lambda d: primary["memory"]["peak"][d], default=0)
    timeline = [{"step": i + 1, "peak_bytes": s["memory_peak"][core], "allocated_bytes": s["memory_allocated"][core]}
                for i, s in enumerate(primary["steps"])]
    fits = []
    for profile in targets:
        needed = max(1, math.ceil(peak / profile.hbm_per_core))
        fits.append({"instance": profile.name, "hbm_per_core_bytes": profile.hbm_per_core, "fits": peak <= profile.hbm_per_core,
                     "cores_needed": needed, "cores_available": profile.num_cores,
                     "fits_sharded": needed <= profile.num_cores})
    allocations = sorted((s for r in records for s in r["signatures"] if s["allocated"] > 0),
                         key=lambda s: -s["allocated"])[:10]
    return {
        "peak_bytes_per_core": peak,
        "core": core,
        "timeline": timeline,
        "targets": fits,
        "largest_allocations": [{"op": s["op"], "bytes": s["allocated"], "shapes": _shapes(s["args"]),
                                 "site": s.get("site")} for s in allocations],
    }


# ------------------------------------------------------------------- hazards

HAZARD_TEXT = {
    "host_sync": "the host waits for the device (.item(), .cpu(), .tolist(), printing a tensor)",
    "float64": "float64 is computed as float32 on Trainium: results differ from float64 on CPU/GPU",
    "data_dependent_shape": ("the output's shape (or a result the host reads, as torch.equal's) depends on "
                             "the data: the host must wait to learn it"),
    "fp8": "FP8 compute (torch._scaled_mm, torch._scaled_grouped_mm)",
}


def _hazards(signatures: list[dict], records: list[dict], targets: list[str], compiled: dict) -> list[dict]:
    from torch_neuronx.neuron.profiles import PROFILES

    grouped: dict[tuple, list] = defaultdict(list)
    for sig in signatures:
        for kind in sig["hazards"]:
            if kind != "fallback":
                grouped[(kind, sig["op"])].append(sig)
    rows = []
    for (kind, op), sigs in grouped.items():
        if kind == "fp8":
            without = [t for t in targets if not PROFILES[t].fp8]
            if not without:
                continue
            detail = (f"FP8 compute needs Trainium3: on {', '.join(without)} this op raises \"FP8 compute "
                      "needs Trainium3\" (eager; at compile time under torch.compile); see docs/fp8.md")
        else:
            detail = HAZARD_TEXT[kind]
        sites = _merge_sites(sigs)
        rows.append({"kind": kind, "op": op, "detail": detail,
                     "calls": sum(s["calls"] for s in sigs),
                     "calls_per_step": sum(s["calls_per_step"] for s in sigs),
                     "in_step_loop": any(site["in_step_loop"] for site in sites),
                     "phases": sorted({name for site in sites for name in site.get("phases", ())}),
                     "sites": sites})
    for reason in compiled["recompile_reasons"]:
        if any(word in reason for word in ("size", "shape", "stride")):
            rows.append({"kind": "dynamic_shape", "op": "torch.compile", "detail": reason, "calls": 1,
                         "calls_per_step": 0.0, "in_step_loop": True, "phases": [], "sites": []})
    return _rounded(sorted(rows, key=lambda r: (r["kind"], -r["calls"])))


# ---------------------------------------------------------- estimate and cost

def _estimates(record: dict, targets: list, fused: dict) -> list[dict]:
    from torch_neuronx.audit import estimate

    seen = len(record["steps"])
    signatures = []
    for sig in record["signatures"]:
        calls = per_step(_in_steps(sig, "calls"), sig["calls_first_step"], seen)
        if calls <= 0:
            continue
        host = per_step(_in_steps(sig, "host_ns"), sig["host_ns_first_step"], seen)
        signatures.append({"op": sig["op"], "path": sig["path"], "args": sig["args"],
                           "calls_per_step": calls, "host_ns_per_call": host / calls})
    graphs = []
    for g in record["graphs"]:
        runs = per_step(_in_steps(g, "runs"), g.get("runs_first_step", g["runs"] / max(1, seen)), seen)
        graphs.append({"name": g["name"], "runs_per_step": runs, "flops": g["flops"],
                       "bytes_accessed": g["bytes_accessed"],
                       "host_ns_per_run": g["host_s"] * 1e9 / max(1, g["runs"])})
    # Every recorded signature is an eager call (compiled graphs run as XLA executables,
    # recorded as graphs): each one is a launch, whether the script also compiles or not,
    # unless Adaptive Eager Execution was on: then the fused launches (fusion.py).
    launches = fused["launches_per_step_fused"] if fused["enabled"] else None
    return [estimate.estimate_step(signatures, graphs, _collectives(record), profile, mode="eager",
                                   fused_launches=launches)
            for profile in targets]


def _collectives(record: dict) -> list[dict]:
    """Collective calls per step of one process, with the bytes each rank contributes."""
    seen = len(record["steps"])
    rows = []
    for c in record.get("collectives", []):
        calls = per_step(_in_steps(c, "calls"), c["calls_first_step"], seen)
        rows.append({"op": c["op"], "bytes": c["bytes"], "world_size": c["world_size"],
                     "calls_per_step": calls, "calls": c["calls"]})
    return rows


def _cost(estimates: list[dict], options: Options, record: dict, steps: int) -> dict:
    from torch_neuronx.audit import prices

    detected = record.get("units") or {}
    if options.units_per_step:
        units, unit, source = options.units_per_step, options.unit or "units", "--units-per-step"
    elif detected.get("units_per_step"):
        units, unit, source = detected["units_per_step"], detected["unit"], detected["source"]
    else:
        units, unit, source = 1.0, options.unit or "step", "no unit detected: one step per step (pass --units-per-step N --unit NAME)"
    table: dict = dict(prices.DEFAULT_PRICES)  # entries with their source and date
    table.update(options.prices)  # --price wins
    rows = prices.cost_table(estimates, table, units, unit, options.baseline)
    return {"unit": unit, "units_per_step": units, "units_source": source, "rows": _rounded(rows)}


# ------------------------------------------------------------------- phases

def _phase_share(row: dict, field: str, name: str) -> float:
    """A signature's, graph's or collective's count in one phase (`field`: calls, host_ns, runs, host_s)."""
    if name == AFTER_LAST_STEP:
        return row.get(f"{field}_after_last_step", 0)
    by_phase = row.get("phases") if field in ("calls", "host_ns") and "phases" in row else \
        row.get(f"{field}_by_phase", {})
    value = by_phase.get(name, 0)
    if isinstance(value, list):  # a signature's [calls, host_ns]
        return value[0 if field == "calls" else 1]
    return value


def _phases(record: dict, targets: list, options: Options) -> list[dict]:
    """Each phase of the primary process that did device work: where it ran, its ops, new
    kernels, memory, and its estimate and cost per occurrence (an evaluate call, the work
    after the training loop), never mixed into the steps' figures."""
    from torch_neuronx.audit import estimate, prices

    steps = len(record["steps"])
    rows = []
    for phase in record.get("phases", []):
        name, count = phase["name"], max(1, phase["occurrences"])
        sigs = []
        for sig in record["signatures"]:
            calls, host_ns = _phase_share(sig, "calls", name), _phase_share(sig, "host_ns", name)
            if calls > 0:
                sigs.append(dict(sig, calls=calls, host_ns=host_ns, calls_per_step=calls / count,
                                 host_s_per_step=host_ns / count / 1e9, host_ns_per_call=host_ns / calls))
        graphs = [{"name": g["name"], "runs_per_step": _phase_share(g, "runs", name) / count, "flops": g["flops"],
                   "bytes_accessed": g["bytes_accessed"],
                   "host_ns_per_run": g["host_s"] * 1e9 / max(1, g["runs"])}
                  for g in record["graphs"] if _phase_share(g, "runs", name) > 0]
        collectives = [{"op": c["op"], "bytes": c["bytes"], "world_size": c["world_size"],
                        "calls_per_step": _phase_share(c, "calls", name) / count}
                       for c in record.get("collectives", []) if _phase_share(c, "calls", name) > 0]
        if not (sigs or graphs or collectives):
            continue
        estimates = [estimate.estimate_step(sigs, graphs, collectives, profile, mode="eager") for profile in targets]
        units = phase["units"] / count if phase.get("unit") and phase["units"] else None
        table = dict(prices.DEFAULT_PRICES) | options.prices
        after = phase["after_steps"]
        new_kernels = sum(1 for s in record["signatures"] if _compiles_kernel(s)
                          and (s.get("first_phase") == name if name != AFTER_LAST_STEP
                               else (not s.get("first_phase") and s["first_step"] >= steps)))
        rows.append(_rounded({
            "name": name, "label": phase["label"], "source": phase["source"],
            "occurrences": phase["occurrences"],
            "before_first_step": sum(1 for k in after if k == 0 and steps),
            "between_steps": sum(1 for k in after if 0 < k < steps),
            "after_last_step": sum(1 for k in after if k >= steps),
            "wall_s": phase["wall_s"], "calls": int(sum(s["calls"] for s in sigs)),
            "host_s": sum(s["host_ns"] for s in sigs) / 1e9,
            "graph_runs": int(sum(g["runs_per_step"] for g in graphs) * count),
            "new_kernels": new_kernels,
            "peak_bytes": max(phase.get("memory_peak") or [0]),
            "ops": [_per_occurrence(row) for row in _ops(sigs)[:10]],
            "fallbacks": sorted({s["op"] for s in sigs if s["path"] == "fallback"}),
            "unit": phase.get("unit") if units else None, "units_per_occurrence": units,
            "estimates": estimates,
            "cost": prices.cost_table(estimates, table, units, phase["unit"]) if units else [],
        }))
    return rows


def _per_occurrence(op_row: dict) -> dict:
    """An op-table row of a phase: its per-step fields are per occurrence there."""
    return {("calls_per_occurrence" if k == "calls_per_step" else
             "host_s_per_occurrence" if k == "host_s_per_step" else
             "share_of_phase" if k == "share_of_step" else k): v for k, v in op_row.items()}


# ------------------------------------------------------------------- verdict

def _actions(report: dict) -> list[dict]:
    actions = []
    for row in report["fallbacks"]:
        site = row["sites"][0] if row["sites"] else None
        actions.append({
            "kind": "fallback", "what": row["op"], "where": site_text(site),
            "cost_per_step_s": row["trainium_s_per_step"],
            "remedy": (f"{row['op']} is not in the neuron device's native op set: it runs on the host CPU, "
                       "its inputs copied over and back. Use an equivalent supported op (`torch-neuronx ops "
                       f"{row['op'].split('::')[-1].split('.')[0]}` and docs/supported-operators.md), write an "
                       "NKI kernel (torch_neuronx.nki_op), or move it out of the step loop.")})
    churn = report["eager_compilations"]["churn"]
    if churn:  # one action: the lines differ, the cause (changing input shapes) is one
        new = report["eager_compilations"]["new_per_step"]
        forward = [row for row in churn if not (row["site"] or {}).get("backward")] or churn
        first = min(forward, key=lambda row: ((row["site"] or {}).get("line") or 0))
        ops = ", ".join(sorted({row["op"] for row in churn})[:6])
        actions.append({
            "kind": "shape_churn", "what": f"{sum(new) / max(1, len(new)):.3g} new kernels per step ({ops}, ...)",
            "where": site_text(first["site"]), "cost_per_step_s": None,
            "remedy": ("input shapes change from step to step, and each new op signature is compiled on first "
                       "use on Trainium: the compiles never stop. Pad inputs to a fixed length or to a few "
                       "buckets (e.g. padding='max_length' or pad_to_multiple_of=64 in the tokenizer); the "
                       "eager_compilations section lists each churning op and line.")})
    actions += _fusion_actions(report["fusion"])
    for row in report["hazards"]:
        cost = None
        if row["kind"] == "host_sync":  # a sync outside the loop (setup, the end) costs once
            in_loop = [site for site in row["sites"] if site["in_step_loop"]]
            if not in_loop:
                continue
            actions += _library_sync_actions(row, in_loop)
            mine = [site for site in in_loop if not site.get("library")]
            if not mine:
                continue
            site = mine[0]
            cost, cut_text = _host_read_cost(row, report["fusion"])
        else:
            site = row["sites"][0] if row["sites"] else None
        remedy = {
            "host_sync": "read values on the host once every N steps (accumulate on the device), not every step",
            "float64": "use float32 (or keep this float64 computation on the CPU)",
            "data_dependent_shape": "use a fixed-size formulation (torch.where, a mask, nonzero_static)",
            "fp8": "target a trn3 instance for FP8, or use bfloat16",
            "dynamic_shape": "pad inputs to fixed shapes or buckets; every new shape recompiles the graph",
        }[row["kind"]]
        if row["kind"] == "host_sync":
            remedy += cut_text
        actions.append({"kind": row["kind"], "what": row["op"], "where": site_text(site),
                        "cost_per_step_s": cost, "remedy": f"{row['detail']}: {remedy}"})
    for row in report["torch_compile"]["graph_breaks"]:
        actions.append({"kind": "graph_break", "what": row["reason"], "where": site_text(row["site"]),
                        "cost_per_step_s": None,
                        "remedy": "torch.compile splits the graph here and runs the code between eagerly: "
                                  "move the construct out of the compiled region or rewrite it"})
    for row in report["memory"]["targets"]:
        if not row["fits"]:
            actions.append({"kind": "memory", "what": f"{report['memory']['peak_bytes_per_core']} bytes per core",
                            "where": row["instance"], "cost_per_step_s": None,
                            "remedy": (f"does not fit in {row['instance']}'s {row['hbm_per_core_bytes']} bytes per "
                                       f"core: shard over at least {row['cores_needed']} cores (FSDP2 "
                                       "fully_shard, tensor parallel)"
                                       + ("" if row["fits_sharded"] else
                                          f"; the instance has only {row['cores_available']}"))})
    # Costed actions first, most expensive first; then the others in the order above.
    return sorted(actions, key=lambda a: -(a["cost_per_step_s"] or 0.0))


def _fusion_actions(fused: dict) -> list[dict]:
    """Adaptive Eager Execution off while the model says it would fuse a good share of the
    step's launches. Not costed (not ranked above the costed fixes): TorchNeuron ships the
    switch off, so it is an option to try, not a defect of the script."""
    unfused, with_fusion = fused["launches_per_step_unfused"], fused["launches_per_step_fused"]
    saved = unfused - with_fusion
    if fused["enabled"] or saved < 1 or saved < 0.1 * unfused:
        return []
    return [{"kind": "fusion", "what": f"{unfused:.4g} eager launches per step, {with_fusion:.4g} with fusion",
             "where": "TORCH_NEURONX_ENABLE_CONCATENATION", "cost_per_step_s": None,
             "remedy": (f"TorchNeuron's Adaptive Eager Execution is off (its default): with "
                        f"TORCH_NEURONX_ENABLE_CONCATENATION=1 the step's op calls would run as {with_fusion:.4g} "
                        f"launches instead of {unfused:.4g} ({fused['ops_per_fused_launch']:.3g} ops per fused "
                        "launch; the fusion section lists the sequences and their cuts), or compile the step "
                        "with torch.compile(backend=\"neuron\")")}]


def _host_read_cost(row: dict, fused: dict) -> tuple[float, str]:
    """A host read's cost per step (its round trips, at the low sync figure) and, where it ends
    fused sequences, the launches that costs (counted when Adaptive Eager Execution is on)."""
    from torch_neuronx.audit.estimate import LOW

    cost = row["calls_per_step"] * LOW.sync_s
    cut = fusion.cuts_by_op(fused, row["op"])
    if not cut:
        return cost, ""
    if fused["enabled"]:
        cost += cut * LOW.launch_s
        return cost, (f"; each read also ends the fused sequence in progress ({cut:.3g} per step, each a "
                      "launch more)")
    return cost, (f"; with Adaptive Eager Execution on, each read would also end the fused sequence in "
                  f"progress ({cut:.3g} per step)")


def _library_sync_actions(row: dict, sites: list[dict]) -> list[dict]:
    """One action per place inside a library (the HF Trainer) that reads device values every
    step: its remedy is the library's option that controls it, not an edit of its code."""
    actions, seen = [], set()
    for site in sites:
        library = site.get("library")
        if not library or (library["file"], library["function"]) in seen:
            continue
        seen.add((library["file"], library["function"]))
        actions.append({"kind": "host_sync", "what": row["op"], "where": site_text(site), "cost_per_step_s": None,
                        "remedy": f"{row['detail']}: {library_remedy(library)}"})
    return actions


def _verdict(report: dict) -> dict:
    actions = _actions(report)
    for rank, action in enumerate(actions, 1):
        action["rank"] = rank
    reasons = []
    if report["status"] == "failed":
        reasons.append("the command failed (see the exception)")
    if report["memory"]["targets"] and not any(t["fits"] or t["fits_sharded"] for t in report["memory"]["targets"]):
        reasons.append("the peak memory does not fit any target instance, even sharded over all its cores")
    if reasons:
        status = "blocked"
    elif actions:
        status = "ready_after_fixes"
    else:
        status = "ready"
    if report["status"] == "interrupted":
        reasons.append("the run was interrupted: the report covers what ran until then")
    return {"status": status, "reasons": reasons, "actions": _rounded(actions)}


def _rounded(rows):
    """Floats to 6 significant digits: the report is read by people."""
    def fix(value):
        if isinstance(value, float):
            return float(f"{value:.6g}")
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value
    return fix(rows)
