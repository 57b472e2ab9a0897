"""The audit report as one self-contained HTML file, `torch-neuronx audit --html FILE`.

One file that can be mailed, attached to a ticket or opened offline: no network
at view time (no CDN, no external CSS, JS or fonts); the plots are inline SVG.
The page is templates/report.html.j2 (jinja2, autoescaped: the report carries
user code lines and exception text). Plots come from matplotlib, drawn on a
bare Figure with the Agg canvas so the audited user's process-wide backend is
never touched, and only where a picture beats a table: the estimated step time
by op class, memory over the steps against each target's HBM, kernel
signatures per step (shape churn) and host time of each CPU fallback.

matplotlib and jinja2 come with the `audit` extra; they are imported on the
first render, never by the other audit modules, so recording and the terminal
summary work without them.
"""

from __future__ import annotations

import io
import os
import re
import shlex

from torch_neuronx.audit import formatting

INSTALL_HINT = "install the audit extra: pip install 'torch-neuronx[audit]'"
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
TOP = 12  # rows in long tables and bars in plots; the JSON report has the rest

# One colour per op class of estimate.py, stable across plots and reports.
CLASS_COLOURS = {
    "matmul": "#4269d0", "vector": "#6cc5b0", "data": "#efb118", "fallback": "#ff725c",
    "launch": "#a463f2", "graphs": "#3ca951", "collectives": "#9498a0",
}
BASE, CHURN, ACCENT = "#4269d0", "#d62728", "#ff725c"


def write(report: dict, path: str) -> None:
    """Writes `render(report)` to `path` (UTF-8)."""
    text = render(report)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def render(report: dict) -> str:
    """The report as one HTML page; RuntimeError when the `audit` extra is missing."""
    jinja2 = _require("jinja2")
    _require("matplotlib")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(duration=_duration, bytes=_bytes, pct=_pct, num=_num, span=_span, where=formatting.site_text,
                       last_line=_last_line, relative=formatting.relative)
    r = _with_defaults(report)
    return env.get_template("report.html.j2").render(
        r=r, plots=_plots(r), command=shlex.join(r["command"]), top=TOP,
        assumptions=_assumptions(r), classes=_classes(r["estimates"]))


def _require(name: str):
    """Imports an optional dependency, or says which extra brings it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise RuntimeError(f"the HTML report needs {name}: {INSTALL_HINT}") from error


# ----------------------------------------------------------------- the data

# A report from a crashed or interrupted command still follows the schema, but
# hand-made or older ones may not: fill what the template reads so that one
# missing section never costs the whole page.
_EMPTY = {
    "command": [], "status": "unknown", "exit_code": None, "exception": None, "wall_s": None,
    "emulated_instance": "?", "steps": {}, "ranks": [], "ops": [], "fallbacks": [],
    "eager_compilations": {}, "fusion": {}, "torch_compile": {}, "memory": {}, "hazards": [], "collectives": [],
    "estimates": [], "cost": {}, "verdict": {}, "tool": {},
}


def _with_defaults(report: dict) -> dict:
    r = {k: (report.get(k) if report.get(k) is not None else v) for k, v in _EMPTY.items()}
    r.update({k: v for k, v in report.items() if k not in _EMPTY})
    r["verdict"] = {"status": "unknown", "reasons": [], "actions": [], **r["verdict"]}
    return r


def _assumptions(r: dict) -> list[str]:
    """Every target's assumptions once, in order (most are shared)."""
    seen: list[str] = []
    for estimate in r["estimates"]:
        seen += [a for a in estimate.get("assumptions") or [] if a not in seen]
    return seen


def _classes(estimates: list[dict]) -> list[str]:
    """Op classes in the estimates' order, without those that cost nothing anywhere."""
    names: list[str] = []
    for estimate in estimates:
        names += [n for n in estimate.get("by_class") or {} if n not in names]
    return [n for n in names if any(_high(e, n) > 0 for e in estimates)]


def _high(estimate: dict, name: str) -> float:
    pair = (estimate.get("by_class") or {}).get(name) or [0, 0]
    return pair[-1] or 0


# --------------------------------------------------------------- formatting

def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _duration(seconds) -> str:
    return formatting.duration(seconds, micro="µs") if _is_number(seconds) else "—"


def _bytes(n) -> str:
    return formatting.size(n) if _is_number(n) else "—"


def _pct(value) -> str:
    return f"{value:.1%}" if _is_number(value) else "—"


def _num(value) -> str:
    return f"{value:.4g}" if _is_number(value) else "—"


_SPAN_FORMATS = {
    "duration": _duration,
    "num": _num,
    "usd": lambda v: f"${v:.4g}",
    "ratio": lambda v: f"{v:.2f}×",
}


def _span(value, kind: str = "num") -> str:
    """A [best, worst] pair as "best – worst" (one value when they agree)."""
    fmt = _SPAN_FORMATS[kind]
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(map(_is_number, value)):
        return fmt(value[0]) if value[0] == value[1] else f"{fmt(value[0])} – {fmt(value[1])}"
    return fmt(value) if _is_number(value) else "—"


def _last_line(text) -> str:
    """The last non-blank line of an exception: its type and message."""
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# -------------------------------------------------------------------- plots

def _plots(r: dict) -> dict:
    """name -> {"svg": markup, "caption": text}, or None where there is nothing to draw."""
    import matplotlib

    # Text as <text> (smaller, selectable, the page's font) and fixed hashes
    # (the same report gives the same file); restored on leaving.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "torch-neuronx-audit",
                                "font.size": 9}):
        return {"step_time": _plot_step_time(r), "memory": _plot_memory(r),
                "signatures": _plot_signatures(r), "fallbacks": _plot_fallbacks(r)}


def _figure(width: float, height: float):
    """A Figure on the Agg canvas: no pyplot, so no global backend or figure registry."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_axisbelow(True)
    return fig, ax


def _svg(fig, name: str):
    """The figure as inline <svg>: no XML prolog or metadata, ids prefixed with the plot's
    name (matplotlib numbers them from 1 in every file, and one page holds four)."""
    from markupsafe import Markup

    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r'(\bid="|url\(#|href="#)', rf"\g<1>{name}-", text)
    return Markup(text)


def _time_unit(seconds: float) -> tuple[float, str]:
    """(scale, unit) for an axis whose largest value is `seconds`."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return scale, unit
    return 1e-9, "ns"


def _plot_step_time(r: dict):
    """Stacked bars per target, low and high end of the range: where the time goes."""
    estimates = [e for e in r["estimates"] if e.get("by_class")]
    classes = _classes(estimates)
    if not classes:
        return None
    bars = [(f"{e.get('instance', '?')} {end}", e["by_class"], i) for e in estimates
            for end, i in (("low", 0), ("high", 1))]
    total = max(sum((by.get(c) or [0, 0])[i] for c in classes) for _, by, i in bars)
    scale, unit = _time_unit(total)
    fig, ax = _figure(8, 1.2 + 0.38 * len(bars))
    left = [0.0] * len(bars)
    for name in classes:
        widths = [(by.get(name) or [0, 0])[i] / scale for _, by, i in bars]
        ax.barh(range(len(bars)), widths, left=left, label=name, height=0.7,
                color=CLASS_COLOURS.get(name, "#888888"))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(bars)), [label for label, _, _ in bars])
    ax.invert_yaxis()
    ax.grid(axis="x", color="#dddddd")
    ax.set_xlabel(f"estimated device time per step ({unit})")
    ax.set_title("estimate: step time by op class", loc="left", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    caption = ("ESTIMATE, not a measurement: the step time each target would take, by op class, at the low "
               "(peak rates) and high (realistic efficiency) end of the range; the assumptions are listed below.")
    return {"svg": _svg(fig, "step-time"), "caption": caption}


def _plot_memory(r: dict):
    """Peak and allocated bytes per step, with each target's HBM per core for scale."""
    timeline = (r["memory"].get("timeline") or [])
    if not timeline:
        return None
    steps = [t["step"] for t in timeline]
    fig, ax = _figure(8, 3.2)
    ax.plot(steps, [t["peak_bytes"] for t in timeline], marker="o", color=ACCENT, label="peak in the step")
    ax.plot(steps, [t["allocated_bytes"] for t in timeline], marker="s", color=BASE,
            label="allocated at the step's end")
    data = max(max(t["peak_bytes"], t["allocated_bytes"]) for t in timeline) or 1
    targets = r["memory"].get("targets") or []
    for target, style in zip(targets, ("--", ":", "-.", (0, (5, 1)))):
        ax.axhline(target["hbm_per_core_bytes"], color="#555555", linestyle=style,
                   label=f"{target['instance']}: HBM per core")
    log = bool(targets) and max(t["hbm_per_core_bytes"] for t in targets) > 20 * data
    _bytes_axis(ax, log)  # log: else the HBM line flattens the data onto the axis
    note = " Log scale: the HBM per core is far above what the script used." if log else ""
    ax.set_xticks(steps if len(steps) <= 30 else ax.get_xticks())
    ax.set_xlabel("step")
    ax.grid(color="#eeeeee")
    ax.set_title("device memory per core over the steps", loc="left", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    caption = (f"Memory of the busiest core (core {r['memory'].get('core', 0)}) at each step, against the "
               f"HBM per core of each target.{note}")
    return {"svg": _svg(fig, "memory"), "caption": caption}


def _bytes_axis(ax, log: bool) -> None:
    """Byte labels; on a log axis, ticks at powers of 32 (1 KiB, 32 KiB, 1 MiB, ...) so
    that the labels are round binary sizes."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    if log:
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_locator(LogLocator(base=32))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _bytes(value)))


def _plot_signatures(r: dict):
    """New kernel signatures per step: a flat tail after step 1 is healthy; bars every
    step mean the shapes keep changing and the device keeps compiling."""
    e = r["eager_compilations"]
    counts = [e.get("first_step") or 0] + list(e.get("new_per_step") or [])
    labels = [str(i + 1) for i in range(len(counts))]
    if e.get("after_last_step"):
        counts.append(e["after_last_step"])
        labels.append("after")
    if not any(counts):
        return None
    churn = bool(e.get("churn"))
    colours = [BASE] + [CHURN if churn and n else "#8fa8e8" for n in counts[1:]]
    fig, ax = _figure(8, 2.8)
    bars = ax.bar(range(len(counts)), counts, color=colours, width=0.7)
    ax.bar_label(bars, fontsize=8, padding=2)
    ax.set_xticks(range(len(counts)), labels)
    ax.set_xlabel("step")
    ax.set_ylabel("new kernel signatures")
    ax.grid(axis="y", color="#eeeeee")
    title = "kernels compiled per step" + (": shape churn" if churn else "")
    ax.set_title(title, loc="left", fontsize=10, color=CHURN if churn else "black")
    caption = ("Op signatures compiled on first use: step 1 includes the warm-up. "
               + ("Red bars: new signatures in later steps, the shapes keep changing (shape churn); "
                  "the compilations never stop." if churn else "No shape churn after step 1."))
    return {"svg": _svg(fig, "signatures"), "caption": caption}


def _plot_fallbacks(r: dict):
    """Host time per step of each CPU-fallback op, the most expensive on top."""
    rows = [f for f in r["fallbacks"] if _is_number(f.get("host_s_per_step"))][:TOP]
    if not rows:
        return None
    scale, unit = _time_unit(max(f["host_s_per_step"] for f in rows) or 1e-9)
    fig, ax = _figure(8, 1.0 + 0.4 * len(rows))
    bars = ax.barh(range(len(rows)), [f["host_s_per_step"] / scale for f in rows], color=ACCENT, height=0.6)
    ax.bar_label(bars, labels=[f"{_pct(f.get('share_of_step'))} of the step's host time" for f in rows],
                 fontsize=8, padding=3)
    ax.set_yticks(range(len(rows)), [f["op"] for f in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.45 * max(f["host_s_per_step"] for f in rows) / scale or 1)  # room for the labels
    ax.grid(axis="x", color="#eeeeee")
    ax.set_xlabel(f"host time per step ({unit})")
    ax.set_title("CPU fallbacks: host time per step", loc="left", fontsize=10)
    caption = ("Ops outside the device's native set run on the host CPU, their tensors copied over and back "
               "(host time measured on the emulator).")
    return {"svg": _svg(fig, "fallbacks"), "caption": caption}
