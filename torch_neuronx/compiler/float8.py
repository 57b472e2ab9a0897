"""The float8/float4 rules a graph must pass before it is lowered, checked on
the FX graph (its nodes carry the dtypes, strides and the user's source line):

- float4_e2m1fn_x2 is storage only: PyTorch has no conversion kernel for it,
  so converting it raises the CPU's NotImplementedError, here at compile time;
- FP8 compute (registry.FP8_COMPUTE: _scaled_mm, _scaled_grouped_mm) needs an
  instance profile with FP8 (Trainium3): elsewhere the graph is refused with
  the eager error plus the line that called the op;
- their arguments are checked as PyTorch checks them (ops/float8.py), since
  the meta kernels skip those checks for a device they do not know.
"""

from __future__ import annotations

import torch
import torch.fx

from torch_neuronx.compiler.errors import NeuronCompileError
from torch_neuronx.ops import float8

aten = torch.ops.aten
_CONVERSIONS = frozenset({aten._to_copy.default, torch.ops.prims.convert_element_type.default,
                          aten.copy.default, aten.copy_.default})


def _dtype(value):
    return value.dtype if isinstance(value, torch.Tensor) else None


def _converts_float4(node: torch.fx.Node) -> bool:
    if node.target not in _CONVERSIONS:
        return False
    dtypes = {_dtype(n.meta.get("val")) for n in node.all_input_nodes} | {_dtype(node.meta.get("val"))}
    dtypes.discard(None)
    return torch.float4_e2m1fn_x2 in dtypes and len(dtypes) > 1


def _meta(value):
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def check_graph(gm: torch.fx.GraphModule) -> None:
    """Raises on the first node that breaks a rule (its subgraphs included)."""
    from torch_neuronx.compiler.lowerability import _source_line

    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(getattr(gm, node.target), torch.fx.GraphModule):
            check_graph(getattr(gm, node.target))
        if node.op != "call_function":
            continue
        if _converts_float4(node):
            raise NotImplementedError(
                f"\"copy_kernel\" not implemented for 'Float4_e2m1fn_x2' (at {_source_line(node)}): "
                "float4_e2m1fn_x2 is a storage format (two values per byte), as on the CPU.")
        name = getattr(node.target, "__name__", "").partition(".")[0]
        if name in float8.COMPUTE_OPS:
            if not float8.has_fp8_compute():
                raise NeuronCompileError(f"{float8.fp8_compute_error(name)}\n  at {_source_line(node)}")
            args = [_meta(a) for a in node.args]
            kwargs = {k: _meta(v) for k, v in node.kwargs.items()}
            float8.CHECKS[name](*args, **kwargs)
