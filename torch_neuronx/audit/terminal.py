"""The audit report as text for the terminal: verdict and actions first, then
each section in a few lines (the JSON report has everything)."""

from __future__ import annotations

from torch_neuronx.audit.formatting import duration, relative, site_text, size

TOP = 8  # rows per table


def render(report: dict) -> str:
    lines: list[str] = []
    for section in (_header, _verdict, _ops, _fallbacks, _compilations, _fusion, _compile, _memory, _hazards,
                    _collectives, _estimates, _cost, _phases):
        block = section(report)
        if block:
            lines.extend(block)
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds)


def _header(r: dict) -> list[str]:
    steps = r["steps"]
    lines = [f"torch-neuronx audit of: {' '.join(r['command'])}",
             f"  status {r['status']} (exit code {r['exit_code']}), {steps['count']} step(s) "
             f"marked by {steps['source']}, {r['wall_s']:.1f} s, emulated {r['emulated_instance']}, "
             f"{len(r['ranks'])} process(es)",
             f"  {steps['note']}"]
    if r["exception"]:
        last = r["exception"].strip().splitlines()[-1]
        lines.append(f"  the command raised: {last}")
    return lines


def _verdict(r: dict) -> list[str]:
    verdict = r["verdict"]
    lines = [f"Verdict: {verdict['status'].replace('_', ' ').upper()}"]
    lines += [f"  - {reason}" for reason in verdict["reasons"]]
    for action in verdict["actions"]:
        cost = f", ~{_ms(action['cost_per_step_s'])}/step" if action["cost_per_step_s"] else ""
        lines.append(f"  {action['rank']}. [{action['kind']}] {action['what']} at {action['where']}{cost}")
        lines.append(f"     {action['remedy']}")
    return lines


def _ops(r: dict) -> list[str]:
    rows = r["ops"][:TOP]
    if not rows:
        return []
    outside = sum(p["calls"] for p in r.get("phases") or [])
    apart = f", {outside} of them outside the steps (below)" if outside else ""
    lines = [f"Ops on the device: {sum(o['calls'] for o in r['ops'])} calls of {len(r['ops'])} ops{apart} "
             f"(top {len(rows)} by host time per step)",
             f"  {'op':<40} {'path':<9} {'calls/step':>10} {'host/step':>11} {'share':>6}"]
    for o in rows:
        lines.append(f"  {o['op']:<40} {o['path']:<9} {o['calls_per_step']:>10.4g} "
                     f"{_ms(o['host_s_per_step']):>11} {o['share_of_step']:>6.1%}")
    return lines


def _fallbacks(r: dict) -> list[str]:
    if not r["fallbacks"]:
        return ["CPU fallbacks: none"]
    lines = ["CPU fallbacks (ops outside the native set, run on the host with copies both ways):"]
    for f in r["fallbacks"]:
        lines.append(f"  {f['op']}: {f['calls_per_step']:.3g} calls/step, {_ms(f['host_s_per_step'])}/step "
                     f"({f['share_of_step']:.1%} of the step's host time)")
        lines += _site_lines(f["sites"])
    return lines


def _site_lines(sites: list[dict]) -> list[str]:
    """The busiest call sites: line, code, and how often (in how many steps)."""
    lines = []
    for site in sites[:3]:
        count = f"{site['calls']} calls" + (f" in {site['steps']} steps" if site.get("steps") else "")
        lines.append(f"    {site_text(site)}  {site.get('code', '')}  ({count})")
        if site.get("library"):
            library = site["library"]
            lines.append(f"      inside {library['function']}() at {relative(library['file'])}:{library['line']}  "
                         f"{library.get('code', '')}")
    return lines


def _compilations(r: dict) -> list[str]:
    e = r["eager_compilations"]
    lines = [f"Eager kernels (each distinct op signature compiles on first use): {e['first_step']} in step 1, "
             f"{e['total_signatures']} in all; new ones in later steps: {e['new_per_step'] or 'none'}"]
    if e.get("in_phases"):
        lines[0] += "; first compiled outside the steps: " + ", ".join(
            f"{n} in {name}" for name, n in e["in_phases"].items())
    for churn in e["churn"][:TOP]:
        lines.append(f"  shape churn: {churn['op']} at {site_text(churn['site'])}: {churn['new_signatures']} new "
                     f"signatures in {churn['steps_with_new']} steps, shapes {churn['example_shapes']}")
    return lines


def _fusion(r: dict) -> list[str]:
    f = r.get("fusion")
    if not f or not f["launches_per_step_unfused"]:
        return []
    state = "on" if f["enabled"] else "off (TORCH_NEURONX_ENABLE_CONCATENATION=1 turns it on)"
    lines = [f"Adaptive Eager Execution (fusion): {state}; eager launches per step {f['launches_per_step_unfused']:.4g} "
             f"one per op, {f['launches_per_step_fused']:.4g} fused ({f['ops_per_fused_launch']:.3g} ops per fused "
             f"launch); {f['kernels']} fused kernels compiled, {f['kernels_new_after_step_1']} of them after step 1"]
    for cut in f["cuts"][:TOP]:
        what = f" ({cut['op']} at {site_text(cut['site'])})" if cut["op"] else ""
        lines.append(f"  cut by {cut['reason']}{what}: {cut['per_step']:.3g} per step")
    return lines


def _compile(r: dict) -> list[str]:
    c = r["torch_compile"]
    if not c["used"]:
        return ["torch.compile: not used"]
    lines = [f"torch.compile: {c['graphs']} graph(s), {c['compiles']} compile(s) in {c['compile_seconds']:.2f} s, "
             f"{c['graph_runs']} run(s), {sum(b['count'] for b in c['graph_breaks'])} graph break(s), "
             f"{c['recompiles']} recompile(s)"]
    for b in c["graph_breaks"][:TOP]:
        lines.append(f"  graph break at {site_text(b['site'])}: {b['reason']}")
    for reason in c["recompile_reasons"][:TOP]:
        lines.append(f"  recompile: {reason}")
    for u in c["unlowered"][:TOP]:
        lines.append(f"  no lowering: {u['op']} at {u['source']} ({u['graph']} graph)")
    return lines


def _memory(r: dict) -> list[str]:
    m = r["memory"]
    lines = [f"Memory: peak {size(m['peak_bytes_per_core'])} per core"]
    for t in m["targets"]:
        verdict = "fits" if t["fits"] else (
            f"does not fit: needs {t['cores_needed']} cores" + ("" if t["fits_sharded"] else
                                                                 f", the instance has {t['cores_available']}"))
        lines.append(f"  {t['instance']}: {size(t['hbm_per_core_bytes'])} HBM per core: {verdict}")
    for a in m["largest_allocations"][:3]:
        lines.append(f"  largest: {size(a['bytes'])} by {a['op']} at {site_text(a['site'])}")
    return lines


def _hazards(r: dict) -> list[str]:
    if not r["hazards"]:
        return ["Hazards: none"]
    lines = ["Hazards:"]
    for h in r["hazards"]:
        loop = ", in the step loop" if h["in_step_loop"] else ""
        if h.get("phases"):
            loop += f" (also outside the steps: {', '.join(h['phases'])})" if h["calls_per_step"] else \
                f" (outside the steps only: {', '.join(h['phases'])})"
        lines.append(f"  [{h['kind']}] {h['op']}: {h['calls_per_step']:.3g}/step{loop}: {h['detail']}")
        lines += _site_lines(h["sites"])
    return lines


def _collectives(r: dict) -> list[str]:
    if not r["collectives"]:
        return []
    lines = ["Collectives per step (per process):"]
    for c in [c for c in r["collectives"] if c["calls_per_step"] > 0][:TOP]:
        lines.append(f"  {c['op']}: {c['calls_per_step']:.3g} calls of {size(c['bytes'])} "
                     f"over {c['world_size']} ranks")
    return lines


def _estimates(r: dict) -> list[str]:
    lines = ["Step time on Trainium (ESTIMATE from the recorded work; range = peak rates .. realistic "
             "efficiency):"]
    for e in r["estimates"]:
        lines.append(f"  {e['instance']}: {_ms(e['low_s'])} .. {_ms(e['high_s'])} per step")
        parts = ", ".join(f"{name} {_ms(low)}..{_ms(high)}" for name, (low, high) in e["by_class"].items()
                          if high > 0)
        if parts:
            lines.append(f"    by class: {parts}")
    assumptions = []
    for e in r["estimates"]:
        for line in e["assumptions"]:
            if line not in assumptions:
                assumptions.append(line)
    lines.append("  assumptions:")
    lines += [f"    - {a}" for a in assumptions]
    return lines


def _cost(r: dict) -> list[str]:
    c = r["cost"]
    lines = [f"Cost of finished work (unit: {c['unit']}, {c['units_per_step']:g} per step, from {c['units_source']}):"]
    for row in c["rows"]:
        lines.append("  " + _cost_row(row, c["unit"]))
    return lines


def _cost_row(row: dict, unit: str) -> str:
    def span(value, fmt):
        if value is None:
            return "?"
        if isinstance(value, (list, tuple)):
            return " .. ".join(fmt(v) for v in value) if value[0] != value[1] else fmt(value[0])
        return fmt(value)

    price = "price unknown (pass --price)" if row.get("usd_per_hour") is None else f"${row['usd_per_hour']:g}/h"
    text = (f"{row['name']}: {span(row.get('seconds_per_unit'), lambda v: f'{v:.3g} s')} per {unit}, "
            f"{span(row.get('usd_per_million_units'), lambda v: f'${v:.4g}')} per million {unit}, {price}")
    ratio = row.get("work_per_dollar_vs_baseline")
    if ratio is not None:
        text += f"; work per dollar vs baseline: {span(ratio, lambda v: f'{v:.2f}x')}"
    return text


def _phases(r: dict) -> list[str]:
    """Work outside the training steps: each phase with its own figures and estimate."""
    if not r.get("phases"):
        return []
    lines = ["Outside the training steps (reported apart, not in any per-step figure above):"]
    for p in r["phases"]:
        where = ", ".join(f"{n} {label}" for label, n in (("before the first step", p["before_first_step"]),
                                                          ("between steps", p["between_steps"]),
                                                          ("after the last step", p["after_last_step"])) if n)
        times = f"{p['occurrences']} time(s), {where}" if p["name"] != "after_last_step" else "once"
        lines.append(f"  {p['label']} [{p['name']}]: {times}; {p['calls']} device calls, "
                     f"{p['graph_runs']} compiled-graph run(s), {p['new_kernels']} new kernel(s), "
                     f"host time {_ms(p['host_s'])}, wall {_ms(p['wall_s'])}, peak {size(p['peak_bytes'])}")
        ops = ", ".join(f"{o['op']} x{o['calls_per_occurrence']:.4g}" for o in p["ops"][:4])
        if ops:
            lines.append(f"    ops per occurrence: {ops}")
        if p["fallbacks"]:
            lines.append(f"    CPU fallbacks: {', '.join(p['fallbacks'])}")
        for e in p["estimates"]:
            unit = ""
            row = next((c for c in p["cost"] if c["name"] == e["instance"]), None)
            if row and row.get("seconds_per_unit"):
                low, high = row["seconds_per_unit"]
                unit = f" ({_ms(low)} .. {_ms(high)} per {p['unit'][:-1] if p['unit'].endswith('s') else p['unit']})"
            lines.append(f"    {e['instance']}: {_ms(e['low_s'])} .. {_ms(e['high_s'])} per occurrence "
                         f"(ESTIMATE){unit}")
    return lines
