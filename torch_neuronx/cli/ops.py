"""``torch-neuronx ops [NAME ...] [--all] [--differences] [--json]``: where ATen ops run on the
neuron device, in eager mode and under torch.compile, with their dtype rules
and overloads. The answers are torch_neuronx.op_support's (the native op
registry, the dispatcher, the lowering table, the compiler's decompositions),
the same that generate docs/supported-operators.md.

The lowering table is filled by importing the lowering modules, which import
JAX: the command takes a few seconds more than ``info``.
"""

from __future__ import annotations

import json
import sys

from torch_neuronx.cli import PROG, CommandError

SCHEMA_VERSION = 1
HELP = "show where ATen ops run: eager (native, CPU fallback), torch.compile (lowered or not), dtypes"


def add_arguments(parser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="ATen ops: a base name (add), an overload (aten::add.Tensor), an in-place "
                             "or out= form (add_, add.out); none: the summary counts")
    parser.add_argument("--all", action="store_true", help="every ATen op, one line each")
    parser.add_argument("--differences", action="store_true",
                        help="the ops whose route here differs from TorchNeuron's (the release it models), with why")
    parser.add_argument("--json", action="store_true", help="print JSON (fields: docs/tools.md)")
    parser.set_defaults(ops_parser=parser)


def run(args) -> int:
    from torch_neuronx import op_support as support

    given = [name for name, on in (("NAME", args.names), ("--all", args.all), ("--differences", args.differences))
             if on]
    if len(given) > 1:  # a usage error: argparse's format and exit code
        args.ops_parser.print_usage(sys.stderr)
        print(f"{args.ops_parser.prog}: error: {' and '.join(given)} exclude each other", file=sys.stderr)
        return 2
    if args.differences:
        ops = support.differences()
        _print(args, {"schema_version": SCHEMA_VERSION, "ops": [op.to_json() for op in ops]},
               lambda: render_differences(ops))
        return 0
    if args.all:
        ops = support.all_ops()
        _print(args, {"schema_version": SCHEMA_VERSION, "ops": [op.to_json() for op in ops]},
               lambda: render_table(ops))
        return 0
    if not args.names:
        counts = support.summary()
        _print(args, {"schema_version": SCHEMA_VERSION, "torch": _torch_version(), **counts},
               lambda: render_summary(counts))
        return 0
    queries = []
    for name in args.names:
        try:
            base, overload = support.resolve(name)
        except LookupError as error:
            raise CommandError(str(error)) from None
        queries.append((name, support.op_support(base), overload))
    records = [{"query": name, **op.to_json(),
                "overload": next((o.to_json() for o in op.overloads if o.name == overload), None)}
               for name, op, overload in queries]
    _print(args, {"schema_version": SCHEMA_VERSION, "ops": records},
           lambda: "\n\n".join(render_op(op, overload) for _, op, overload in queries))
    return 0


def _print(args, report: dict, text) -> None:
    print(json.dumps(report, indent=2) if args.json else text())


def _torch_version() -> str:
    import torch

    return torch.__version__


# ------------------------------------------------------------------ text output


def render_op(op, overload: str | None = None) -> str:
    """One op's block: eager, torch.compile, dtypes, overloads (the queried one marked)."""
    title = f"aten::{overload} (an overload of aten::{op.name})" if overload else f"aten::{op.name}"
    compile_text = f"{op.compile}: {op.compile_reason}"
    if op.graph_break:
        compile_text += ("; value-dependent: Dynamo breaks the graph and runs it eagerly on the device "
                         "between compiled graphs")
    if op.not_compiled:
        compile_text += f"; not compiled: {', '.join(op.not_compiled)}"
    rows = [("eager", f"{op.eager}: {op.eager_reason}"), ("torch.compile", compile_text)]
    if op.release:
        same = "the same here" if op.release.emulated else "differs here"
        note = f" ({op.release.note})" if op.release.note else ""
        rows.append(("TorchNeuron", f"{op.release.route}, {same}{note}; source: {op.release.source}"))
    rows += [("dtypes" if i == 0 else "", f"{key}: {rule}") for i, (key, rule) in enumerate(op.dtypes.items())]
    width = max(len(o.name) for o in op.overloads) + 2
    for i, o in enumerate(op.overloads):
        mark = "  <-" if o.name == overload else ""
        rows.append(("overloads" if i == 0 else "",
                     f"{o.name:<{width}}{o.kind:<12}{o.eager:<15}{o.compile}{mark}".rstrip()))
    return "\n".join([title] + [f"  {label:<15}{value}" for label, value in rows])


def render_summary(counts: dict) -> str:
    eager = ", ".join(f"{route} {n}" for route, n in counts["eager"].items())
    compiled = ", ".join(f"{route} {n}" for route, n in counts["compile"].items())
    rows = [
        ("ATen ops", f"{counts['aten_ops']} (base names; overloads, in-place and out= forms included), "
                     f"torch {_torch_version()}"),
        ("eager", eager),
        ("torch.compile", compiled),
        ("native set", f"{counts['native_set']} ops, {counts['direct_kernels']} direct kernels "
                       f"(torch_neuronx/ops/registry.py); {counts['graph_breaks']} of them run eagerly "
                       "between compiled graphs (value-dependent)"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value}" for label, value in rows]
    lines.append("")
    lines.append(f"`{PROG} ops NAME ...` for an op's block (eager, torch.compile, dtypes, overloads), "
                 f"`{PROG} ops --all` for every op; the table: docs/supported-operators.md")
    return "\n".join(lines)


def render_differences(ops) -> str:
    """Where this emulator's route differs from the evidence of what TorchNeuron does."""
    if not ops:
        return "no known differences from TorchNeuron (torch_neuronx/ops/evidence.py)"
    lines = [f"{len(ops)} ops run differently here than on TorchNeuron (torch_neuronx/ops/evidence.py):"]
    for op in ops:
        lines += [f"  {op.name}: TorchNeuron: {op.release.route}; here: {op.eager}",
                  f"    why: {op.release.note}", f"    source: {op.release.source}"]
    return "\n".join(lines)


def render_table(ops) -> str:
    width = max(len(op.name) for op in ops) + 2
    lines = [f"{'op':<{width}}{'eager':<15}torch.compile"]
    lines += [f"{op.name:<{width}}{op.eager:<15}{op.compile}" for op in ops]
    return "\n".join(lines)
