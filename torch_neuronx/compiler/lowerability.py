"""Which ops of an ATen graph cannot be compiled (no lowering, or a value read
on the host / a value-dependent shape), and the error text that names them."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx

from torch_neuronx import config


@dataclass
class UnloweredOp:
    op: str
    source: str
    value_dependent: bool = False  # it makes a size or a Python value out of tensor values


def _source_line(node: torch.fx.Node) -> str:
    """Where the node's op was called: the innermost frame of its recorded
    Python stack, or the whole stack with TORCH_NEURONX_ENABLE_STACK_TRACE=1
    (read per compile error, off the hot path)."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [line.strip() for line in trace if line.strip().startswith("File")]
    if not frames:
        return "(no source line recorded)"
    if config.enable_stack_trace():
        return "\n      ".join(line.rstrip() for line in trace if line.strip())
    return frames[-1]


def _introduces_value_dependence(node: torch.fx.Node) -> bool:
    """The node makes a symbol out of tensor values, which no input carried:
    a host read (.item(), .tolist(): aten._local_scalar_dense) or an output
    shape decided by the values (nonzero, x[mask], unique, ...). Under
    fullgraph=True Dynamo keeps these in the graph ("unbacked" symbols); a
    static-shape graph cannot hold them."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    def unbacked(value) -> bool:
        return value is not None and bool(free_unbacked_symbols(value))

    return unbacked(node.meta.get("val")) and not any(
        unbacked(n.meta.get("val")) for n in node.all_input_nodes)


def _is_symbolic_arithmetic(node: torch.fx.Node) -> bool:
    """Sizes and arithmetic on symbolic integers (derived from a value-dependent
    op, e.g. the bounds checks of x.split(t.tolist()) or the sym_size of
    nonzero's result): they exist only because of that op, which is what gets
    reported."""
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))


def unlowered_ops(gm: torch.fx.GraphModule, _seen=None) -> list[UnloweredOp]:
    """The ops of a graph, and of its subgraphs, that cannot be compiled: those
    without a lowering, and those that depend on tensor values."""
    from torch_neuronx.lowering import lookup

    seen = set() if _seen is None else _seen  # a subgraph called at several places is listed once
    missing = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if _introduces_value_dependence(node):
            missing.append(UnloweredOp(str(node.target), _source_line(node), value_dependent=True))
        elif node.target is not torch.ops.aten.copy_.default and lookup(node.target) is None \
                and not _is_symbolic_arithmetic(node):
            missing.append(UnloweredOp(str(node.target), _source_line(node)))
    for node in gm.graph.nodes:
        value = getattr(gm, node.target) if node.op == "get_attr" else None
        if isinstance(value, torch.fx.GraphModule) and id(value) not in seen:
            seen.add(id(value))
            missing += unlowered_ops(value, seen)
    return missing


def unlowered_message(kind: str, missing, listing: str) -> str:
    hints = "".join(f"\n{_UNLOWERED_HINTS[op]}" for op in dict.fromkeys(m.op for m in missing)
                    if op in _UNLOWERED_HINTS)
    dependent = [m for m in missing if m.value_dependent]
    if dependent:  # one cause users meet under fullgraph=True, with its own remedies
        lines = "\n".join(f"  {m.op}  at {m.source}" for m in dependent)
        return (
            f"torch.compile(backend='neuron'): the {kind} graph depends on tensor values at:\n{lines}{hints}\n"
            "Neuron compiles static-shape graphs: a value read on the host (.item(), .tolist(), "
            "int(tensor)) or an op whose output shape depends on the values (nonzero, boolean-mask "
            "indexing x[mask], masked_select, unique, bincount) cannot be part of one. Compile with "
            "fullgraph=False (Dynamo then breaks the graph there and runs that part eagerly), rewrite "
            "with static shapes (torch.where(mask, x, 0) instead of x[mask]), move it out of the "
            "compiled region, or set TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 to run such graphs eagerly."
            + ("" if len(dependent) == len(missing) else f"\nAll ops without a StableHLO lowering:\n{listing}")
        )
    return (
        f"torch.compile(backend='neuron'): {len(missing)} op(s) in the {kind} graph have no "
        f"StableHLO lowering:\n{listing}{hints}\nRewrite the code to avoid them, or set "
        "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0 to run such graphs eagerly."
    )


# Why an op cannot be lowered, where the reason is not the op being missing from the table.
_UNLOWERED_HINTS = {
    "while_loop_stack_output": (
        "while_loop_stack_output is torch while_loop under autograd: its backward needs the values of "
        "every iteration, and their number depends on tensor values, which a static-shape graph cannot "
        "hold. Run the loop under torch.no_grad(), or write it as torch scan over a fixed number of steps."
    ),
}
