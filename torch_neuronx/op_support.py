"""Where an ATen op runs on the neuron device, in eager mode and under
torch.compile(backend="neuron"): the one answer, used by ``torch-neuronx ops``
and by docs/supported-operators.md.

It reads the eager tables (ops/) and the compile ones (lowering/, compiler/),
so it lives above both, here: the eager op layer never imports the compiler
(tests/test_layers.py).

Nothing here lists ops. Every answer is derived from what decides it at run
time:

- eager: the native op set (ops/registry.py: NATIVE_OPS, DIRECT_KERNELS,
  DATA_MOVEMENT) and, per overload, the dispatcher's registrations (the
  PrivateUse1 kernels ops.register() installed, PyTorch's composite kernels);
  anything else reaches the CPU fallback (csrc/Eager.cpp);
- torch.compile: the lowering table (lowering.lookup) and the compiler's
  decomposition table (compiler/aot.py, applied by AOTAutograd before lowering);
- dtypes: the device-wide rules (the fp64 rule of csrc/Eager.cpp and the
  lowerings, exact float64 for DATA_MOVEMENT, FP8 per instance profile);
- the release it models: ops/evidence.py's record of what TorchNeuron does
  with the op, with its source, and whether the emulator does the same
  (``differences()``, ``torch-neuronx ops --differences``).
  The project keeps no per-op dtype list: docs/conformance.md records the
  OpInfo runs per OpInfo entry and lists failures only, so no per-op dtype
  set is claimed here.

    python -m torch_neuronx.op_support --write   # regenerates docs/supported-operators.md
    python -m torch_neuronx.op_support --check   # exit 1 when the page is out of date
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import pathlib
import re

import torch

from torch_neuronx import generated_page
from torch_neuronx.ops import evidence, sparse
from torch_neuronx.ops.registry import (
    DATA_DEPENDENT_SHAPE, DATA_MOVEMENT, DIRECT_KERNELS, FP8_COMPUTE, HOST_FALLBACK, NATIVE_OPS, base_name,
)

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "supported-operators.md"
REGENERATE = "python -m torch_neuronx.op_support --write"

# Eager routes of an op on neuron tensors.
NATIVE = "native"                # in the native op set: PyTorch's CPU kernel runs on device memory
DIRECT = "direct"                # a direct kernel (registry CPP_KERNELS, PYTHON_KERNELS)
COMPOSITE = "composite"          # PyTorch's composite kernel: the ops it calls run as listed for them
FALLBACK = "cpu fallback"        # copied to the host, run by PyTorch's CPU kernel, copied back
NO_KERNEL = "not supported"      # no kernel the device can use (e.g. CUDA-only ops)
EAGER_ROUTES = (NATIVE, DIRECT, COMPOSITE, FALLBACK, NO_KERNEL)

# torch.compile routes.
LOWERED = "lowered"              # a rule in the lowering table
DECOMPOSED = "decomposed"        # rewritten into other ATen ops before lowering
NOT_LOWERED = "not lowered"      # a graph holding it raises NeuronCompileError (or runs eagerly)
FUNCTIONALIZED = "functionalized"  # in-place / out= overloads: AOTAutograd hands the compiler the functional op
COMPILE_ROUTES = (LOWERED, DECOMPOSED, NOT_LOWERED)

_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key

FP64_EMULATED = ("float64/complex128 computed in float32/complex64, results widened back "
                 "(TORCH_NEURONX_FP64=emulate, the default)")
FP8_RULE = ("float8/float4 dtypes store, copy, view and cast on every profile; FP8 compute "
            "(_scaled_mm, _scaled_grouped_mm) runs on Trainium3 (trn3 profiles) only and raises on "
            "trn1/trn2 (docs/fp8.md)")
FP8_ONLY = "Trainium3 only (trn3 profiles): raises on trn1/trn2 (docs/fp8.md)"
# What is known of TorchNeuron's compile for the ops its eager mode runs on the host.
HOST_COMPILE_NOTE = ("; on Trainium unverified: TorchNeuron's compile has no CPU partition (a graph is one "
                     "device program, AWS snapshot torch_neuronx/neuron_dynamo_backend/backend.py), so a graph "
                     "holding an op its lowering lacks fails to compile there; no AWS source shows it lowered")


# ------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True)
class OverloadSupport:
    name: str      # "add.Tensor", "add_.Tensor", "add.out"; "add" for the default overload
    kind: str      # functional | in-place | out
    eager: str     # one of EAGER_ROUTES
    compile: str   # one of COMPILE_ROUTES, or FUNCTIONALIZED

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OpSupport:
    name: str                  # the base name: "add" (aten::add, aten::add_, their overloads and out= forms)
    eager: str                 # one of EAGER_ROUTES
    eager_reason: str
    compile: str               # one of COMPILE_ROUTES
    compile_reason: str
    dtypes: dict               # {"eager": ..., "compile": ..., "float8": ...}: rules, not per-op lists
    overloads: tuple[OverloadSupport, ...]
    graph_break: bool = False  # DATA_DEPENDENT_SHAPE: Dynamo runs it eagerly between graphs
    release: evidence.Evidence | None = None  # what TorchNeuron does with it, where recorded

    @property
    def not_compiled(self) -> list[str]:
        """Functional overloads neither lowered nor decomposed, where others of the op are."""
        if self.compile == NOT_LOWERED:
            return []
        return [o.name for o in self.overloads if o.kind == "functional" and o.compile == NOT_LOWERED]

    def to_json(self) -> dict:
        return {"op": self.name, "eager": self.eager, "eager_reason": self.eager_reason,
                "compile": self.compile, "compile_reason": self.compile_reason,
                "graph_break": self.graph_break, "dtypes": dict(self.dtypes),
                "release": self.release.to_json() if self.release else None,
                "overloads": [o.to_json() for o in self.overloads]}


# ------------------------------------------------------------------ the ATen op set


@functools.lru_cache(maxsize=1)
def aten_overloads() -> dict[str, tuple[str, ...]]:
    """Base name -> its overloads ("name.overload", "name" for the default), every
    aten operator the dispatcher knows, in-place and out= forms under the
    functional op's base name (the registry's convention, registry.base_name).
    Read once: PyTorch registers the aten operators when it is imported."""
    ops: dict[str, list[str]] = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        full = qualified[len("aten::"):]
        ops.setdefault(base_name(full), []).append(full)
    return {base: tuple(sorted(names)) for base, names in sorted(ops.items())}


def _op_overload(full: str):
    name, _, overload = full.partition(".")
    packet = getattr(torch.ops.aten, name, None)
    try:
        return getattr(packet, overload or "default") if packet is not None else None
    except AttributeError:  # registered with the dispatcher but not exposed as an OpOverload
        return None


def _kind(full: str, op) -> str:
    name = full.partition(".")[0]
    if name.endswith("_") and not name.endswith("__"):
        return "in-place"
    if op is not None and any(argument.is_out for argument in op._schema.arguments):
        return "out"
    return "functional"


def _has(full: str, key: str) -> bool:
    try:
        return _has_kernel("aten::" + full, key)
    except RuntimeError:  # a Python-only alias overload
        return False


# ------------------------------------------------------------------ eager


def _eager_overload(base: str, full: str) -> str:
    """The route of one overload, as the dispatcher resolves it for a neuron tensor."""
    if _has(full, "PrivateUse1"):
        if full in sparse.KERNELS:  # rejects making a sparse neuron tensor, with what to do instead
            return NO_KERNEL
        if base in HOST_FALLBACK:  # the CPU fallback, registered by name (ops.host_fallback_overloads)
            return FALLBACK
        return DIRECT if base in DIRECT_KERNELS else NATIVE
    if _has(full, "CompositeImplicitAutograd") or _has(full, "CompositeExplicitAutograd"):
        return COMPOSITE
    if _has(full, "CPU"):
        # a CPU kernel of its own (a structured op's functional form reaches it through its
        # out= overload, which has no neuron kernel either)
        return FALLBACK
    if _has(full, "CompositeExplicitAutogradNonFunctional"):  # e.g. diagonal_scatter, the *_copy views
        return COMPOSITE
    return NO_KERNEL


def _fp8_profile_note() -> str:
    """This process's answer for FP8 compute ops: its instance profile decides."""
    from torch_neuronx.ops import float8

    profile = float8.runtime_profile()
    if profile.fp8:
        return f"; FP8 compute runs on this profile ({profile.name}, {profile.platform})"
    return (f"; this profile ({profile.name}, {profile.platform}) has no FP8 compute: it raises (eager: "
            "RuntimeError; torch.compile: NeuronCompileError at compile time, naming the line). "
            "Set TORCH_NEURONX_INSTANCE=trn3.3xlarge to emulate Trainium3")


def _eager_op(base: str, overloads) -> tuple[str, str]:
    if base in FP8_COMPUTE:
        return DIRECT, "a direct kernel (ops/float8.py: dequantize, float32 accumulation)" + _fp8_profile_note()
    if base in DIRECT_KERNELS:
        return DIRECT, "a direct kernel (registry DIRECT_KERNELS: csrc/Kernels.cpp or torch_neuronx/ops/)"
    if base in NATIVE_OPS:
        return NATIVE, "in the native op set (ops/registry.py): PyTorch's CPU kernel runs on device memory"
    if any(o.name in sparse.KERNELS for o in overloads):
        return NO_KERNEL, ("sparse layouts are not supported on the device: it raises an error that says "
                           "what to do instead (ops/sparse.py)")
    # Any overload: a composite functional form often calls the in-place or out= one
    # (embedding_renorm -> embedding_renorm_, special_xlog1py.self_scalar -> special_xlog1py.out).
    routes = {o.eager for o in overloads}
    if FALLBACK in routes and base in HOST_FALLBACK:
        return FALLBACK, ("TorchNeuron runs it on the host CPU (ops/evidence.py), so it is not in the native op "
                          "set here either: its inputs are copied to the host, PyTorch's CPU kernel runs, the "
                          "results are copied back (warned about, recorded by torch_neuronx.get_fallback_ops())")
    if FALLBACK in routes:
        return FALLBACK, ("not in the native op set (ops/registry.py): its inputs are copied to the host, "
                          "PyTorch's CPU kernel runs, the results are copied back (warned about, recorded "
                          "by torch_neuronx.get_fallback_ops())")
    if COMPOSITE in routes:
        return COMPOSITE, ("not in the native op set, but PyTorch's composite kernel runs it as other ATen "
                           "ops, each of which runs as listed for it")
    return NO_KERNEL, "PyTorch has no CPU or composite kernel for it: it fails on neuron tensors as on CPU"


# ------------------------------------------------------------------ torch.compile


def _lowering_rule(op):
    from torch_neuronx.lowering import lookup

    rule = lookup(op)
    return rule.func if isinstance(rule, functools.partial) else rule


def _compile_overload(full: str, op, kind: str) -> str:
    from torch_neuronx.compiler.aot import decomposition_table

    from torch_neuronx.lowering import LOWERINGS

    if op is None:
        return NOT_LOWERED
    if kind == "out" and op not in LOWERINGS:  # the packet's rule serves the functional op AOTAutograd makes
        return FUNCTIONALIZED
    if _lowering_rule(op) is not None:
        return LOWERED
    if kind != "functional":
        return FUNCTIONALIZED
    if op in decomposition_table() or _has(full, "CompositeImplicitAutograd"):
        return DECOMPOSED
    return NOT_LOWERED


def _compile_op(base: str, overloads, ops) -> tuple[str, str]:
    from torch_neuronx.compiler.aot import decomposition_table

    lowered = [o for o in overloads if o.compile == LOWERED]
    if lowered:
        rule = _lowering_rule(ops[lowered[0].name])
        note = _fp8_profile_note() if base in FP8_COMPUTE else HOST_COMPILE_NOTE if base in HOST_FALLBACK else ""
        return LOWERED, f"a rule in the lowering table ({rule.__module__.replace('.', '/')}.py){note}"
    decomposed = [o for o in overloads if o.compile == DECOMPOSED]
    if decomposed:
        table = [o.name for o in decomposed if ops[o.name] in decomposition_table()]
        source = ("the compiler's decomposition table (compiler/aot.py: Core ATen's decompositions)" if table
                  else "PyTorch's CompositeImplicitAutograd kernel, while the graph is traced")
        checked = ("; tests/test_registry_invariant.py checks that the result holds lowered ops only"
                   if base in NATIVE_OPS - DIRECT_KERNELS else "; its parts compile if they are lowered")
        return DECOMPOSED, f"rewritten into other ATen ops by {source}{checked}"
    return NOT_LOWERED, ("no rule in the lowering table and no decomposition: a graph holding it raises "
                         "NeuronCompileError (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0: runs eagerly)")


# ------------------------------------------------------------------ dtypes


def _dtypes(base: str, eager: str, compile: str) -> dict:
    if eager == NATIVE:
        fp64 = ("float64/complex128 exact (data movement: registry DATA_MOVEMENT)" if base in DATA_MOVEMENT
                else FP64_EMULATED)
        eager_rule = f"those of PyTorch's CPU kernel; {fp64}"
    elif eager == DIRECT:
        eager_rule = "those its direct kernel implements"
    elif eager == FALLBACK:
        eager_rule = "those of PyTorch's CPU kernel; float64 computed in float64 (on host copies)"
    elif eager == COMPOSITE:
        eager_rule = "those of the ops it runs as"
    else:
        eager_rule = "none"
    compile_rule = ("float64/complex128 computed in float32/complex64 inside the graph "
                    "(TORCH_NEURONX_FP64=native keeps float64)" if compile != NOT_LOWERED else "not compiled")
    return {"eager": eager_rule, "compile": compile_rule, "float8": FP8_RULE}


# ------------------------------------------------------------------ the answer


def op_support(base: str) -> OpSupport:
    """Support of one ATen op, by base name ("add"). KeyError when ATen has no such op."""
    names = aten_overloads()[base]
    ops = {full: _op_overload(full) for full in names}
    overloads = []
    for full in names:
        kind = _kind(full, ops[full])
        overloads.append(OverloadSupport(full, kind, _eager_overload(base, full),
                                         _compile_overload(full, ops[full], kind)))
    overloads = tuple(overloads)
    eager, eager_reason = _eager_op(base, overloads)
    compile, compile_reason = _compile_op(base, overloads, ops)
    return OpSupport(base, eager, eager_reason, compile, compile_reason, _dtypes(base, eager, compile),
                     overloads, graph_break=base in DATA_DEPENDENT_SHAPE, release=evidence.BY_OP.get(base))


def resolve(name: str) -> tuple[str, str | None]:
    """A user's op name -> (base name, overload or None). Accepts "add", "add_",
    "aten::add", "aten.add.Tensor", "aten::add.Tensor", "add.out".
    LookupError, with the closest names, when ATen has no such op or overload."""
    text = name.strip()
    for prefix in ("aten::", "aten.", "torch.ops.aten."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    op_name, _, overload = text.partition(".")
    base = base_name(op_name)
    known = aten_overloads()
    if base not in known:
        close = difflib.get_close_matches(base, known, n=3, cutoff=0.7)
        hint = f"; did you mean {', '.join(close)}?" if close else " (torch-neuronx ops --all lists every ATen op)"
        raise LookupError(f"{name!r} is not an ATen op{hint}")
    if not overload:
        return base, None
    full = f"{op_name}.{overload}" if overload != "default" else op_name
    if full not in known[base]:
        raise LookupError(f"{name!r} is not an ATen op: aten::{op_name} has no overload {overload!r} "
                          f"(its overloads: {', '.join(o for o in known[base] if o.partition('.')[0] == op_name)})")
    return base, full


def all_ops() -> list[OpSupport]:
    """Every ATen op, by base name."""
    return [op_support(base) for base in aten_overloads()]


def documented_ops() -> list[OpSupport]:
    """The page's ops: every op of the native set, and every ATen op with a lowering."""
    from torch_neuronx.lowering import lowered_op_names

    names = (set(NATIVE_OPS) | lowered_op_names()) & set(aten_overloads())
    return [op_support(base) for base in sorted(names)]


def differences() -> list[OpSupport]:
    """The ops whose route here differs from what TorchNeuron does (ops/evidence.py), with why."""
    return [op_support(record.op) for record in evidence.differences()]


def summary() -> dict:
    """Counts over every ATen op (base names)."""
    ops = all_ops()
    return {
        "aten_ops": len(ops),
        "eager": {route: sum(op.eager == route for op in ops) for route in EAGER_ROUTES},
        "compile": {route: sum(op.compile == route for op in ops) for route in COMPILE_ROUTES},
        "native_set": len(NATIVE_OPS - DIRECT_KERNELS),
        "direct_kernels": len(DIRECT_KERNELS),
        "graph_breaks": len(DATA_DEPENDENT_SHAPE),
    }


# ------------------------------------------------------------------ the page

EAGER_CELL = {NATIVE: "Native", DIRECT: "Native (direct kernel)", COMPOSITE: "Composite",
              FALLBACK: "CPU_FALLBACK", NO_KERNEL: "N"}
COMPILE_CELL = {LOWERED: "Lowered", DECOMPOSED: "Decomposed", NOT_LOWERED: "Not lowered"}


def _dtype_cell(op: OpSupport) -> str:
    if op.eager == NATIVE:
        return "CPU kernel's; fp64 exact" if op.name in DATA_MOVEMENT else "CPU kernel's; fp64 as fp32"
    if op.eager == FALLBACK:
        return "CPU kernel's; fp64 on host"
    if op.eager == DIRECT:
        return "direct kernel's"
    return "its parts'"


def _limitations(op: OpSupport) -> str:
    notes = [FP8_ONLY] if op.name in FP8_COMPUTE else []
    if op.graph_break:
        notes.append("graph break: value-dependent forms run eagerly between compiled graphs")
    if op.eager == FALLBACK:
        notes.append("runs on the CPU on Trainium too" if op.name in HOST_FALLBACK else "not in the native op set")
    if op.release and not op.release.emulated:
        notes.append(f"TorchNeuron: {op.release.route}; differs here (see below)")
    missing = op.not_compiled
    if missing:
        notes.append("not compiled: " + ", ".join(f"`{name}`" for name in missing))
    return "; ".join(notes)


def render_page(torch_version: str | None = None) -> str:
    """docs/supported-operators.md, from the registry, the dispatcher and the lowering table;
    its header names `torch_version` (default: the installed PyTorch's)."""
    ops = documented_ops()
    counts = {route: sum(op.eager == route for op in ops) for route in EAGER_ROUTES}
    compiled = {route: sum(op.compile == route for op in ops) for route in COMPILE_ROUTES}
    lines = [
        "# Supported operators",
        "",
        f"Generated by `{REGENERATE}` from the native op set (`torch_neuronx/ops/registry.py`), the",
        "dispatcher's registrations, the lowering table (`torch_neuronx/lowering/`) and the compiler's",
        "decomposition table (`torch_neuronx/compiler/aot.py`); do not edit by hand.",
        "`tests/test_ops_command.py` fails when it is out of date. `torch-neuronx ops NAME` answers for",
        "any ATen op (with its overloads), `torch-neuronx ops --all` lists them all.",
        "",
        f"{len(ops)} ATen ops (torch {torch_version or torch.__version__}): every op of the native set and every op with a "
        "lowering. Eager: " + ", ".join(f"{EAGER_CELL[r]} {counts[r]}" for r in EAGER_ROUTES if counts[r])
        + ". torch.compile: " + ", ".join(f"{COMPILE_CELL[r]} {compiled[r]}" for r in COMPILE_ROUTES
                                           if compiled[r]) + ".",
        "",
        "An operator is the ATen base name: `add` stands for `aten::add`, its overloads (`add.Tensor`,",
        "`add.Scalar`), its in-place form `add_` and its `out=` forms.",
        "",
        "| Column | Values |",
        "|---|---|",
        "| Eager | **Native**: in the native op set; the device runs PyTorch's CPU kernel on device memory "
        "(AWS's table: `Y`, Native). **Native (direct kernel)**: allocation, views, copies and a few "
        "kernels of the package's own. **CPU_FALLBACK**: inputs copied to the host, PyTorch's CPU kernel, "
        "results copied back (a warning; `torch_neuronx.get_fallback_ops()` records it). "
        "**Composite**: PyTorch runs it as other ATen ops. |",
        "| torch.compile | `torch.compile(backend=\"neuron\")`. **Lowered**: a StableHLO rule in the lowering "
        "table. **Decomposed**: rewritten before lowering into other ATen ops (Core ATen's decompositions, "
        "or PyTorch's CompositeImplicitAutograd kernel). **Not lowered**: a graph holding it raises "
        "`NeuronCompileError` (or runs eagerly with `TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0`). |",
        "| Dtypes | The dtypes of PyTorch's CPU kernel for the op (the device runs that kernel), with the "
        "device's float64 rule: **fp64 as fp32**: float64/complex128 are computed in float32/complex64 "
        "and widened back (`TORCH_NEURONX_FP64=emulate`, the default); **fp64 exact**: data movement keeps "
        "every bit; **fp64 on host**: the CPU fallback computes float64. Compiled graphs compute "
        "float64 in float32 for every op. |",
        "| Limitations | Graph breaks (value-dependent ops Dynamo runs eagerly), overloads that do not "
        "compile, why an op falls back. |",
        "",
        "The project has no per-op dtype table: the OpInfo conformance run "
        "([conformance.md](conformance.md)) is recorded per OpInfo entry and lists failures only. "
        "Device-wide: " + FP8_RULE + ".",
        "",
        "| Operator | Eager | torch.compile | Dtypes | Limitations |",
        "|---|---|---|---|---|",
    ]
    for op in ops:
        lines.append(f"| `{op.name}` | {EAGER_CELL[op.eager]} | {COMPILE_CELL[op.compile]} | "
                     f"{_dtype_cell(op)} | {_limitations(op)} |")
    return "\n".join(lines + _release_section()) + "\n"


def _release_section() -> list[str]:
    """The evidence of what TorchNeuron does with an op, and where the emulator differs."""
    lines = [
        "",
        "## What TorchNeuron does, and where this emulator differs",
        "",
        "Each decision about the release this emulator models, with its source "
        "(`torch_neuronx/ops/evidence.py`; `torch-neuronx ops --differences` lists the ones not followed yet). "
        "**cpu fallback**: TorchNeuron runs the op on the host CPU; here too. **one kernel**: PyTorch "
        "implements the op as several, TorchNeuron registers one device kernel. **device + host read**: "
        "device work, then a host read before the rest. Compiled graphs: " + HOST_COMPILE_NOTE[2:] + ".",
        "",
        "| Operator | TorchNeuron | Here | Source |",
        "|---|---|---|---|",
    ]
    for record in evidence.RECORDS:
        here = "same" + (f" ({record.note})" if record.note else "") if record.emulated else f"**differs**: {record.note}"
        lines.append(f"| aten::{record.op} | {record.route} | {here} | {record.source} |")
    return lines


_GENERATED_WITH = re.compile(r"^\d+ ATen ops \(torch ([^)]+)\):", re.MULTILINE)


def page_is_current(text: str) -> bool:
    """Whether `text` is the page this installation renders, but for the PyTorch
    release named in its header: the page is written with one supported release
    (the pinned 2.13.0) and must hold, op for op, on the others."""
    generated_with = _GENERATED_WITH.search(text)
    return text == render_page(generated_with.group(1) if generated_with else None)


def main(argv: list[str] | None = None) -> int:
    return generated_page.main(argv, prog="python -m torch_neuronx.op_support", description=__doc__.split("\n\n")[0], page=PAGE,
                               render=render_page, is_current=page_is_current, regenerate=REGENERATE)

if __name__ == "__main__":
    raise SystemExit(main())
