"""Custom ops of other libraries that the neuron backend replaces by compiled
equivalents (torch_neuronx/compiler/op_replacements.py): transformers'
grouped_mm_fallback, which its MoE layers call under torch.compile when the
expert weights are not bfloat16."""

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.compiler import get_dynamo_metrics, op_replacements, reset_dynamo_metrics

moe = pytest.importorskip("transformers.integrations.moe")

# Group ends over 11 rows: group 1 is empty, rows 9 and 10 belong to no group.
OFFS = [3, 3, 7, 9]


def _operands(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(11, 5, generator=g, dtype=dtype).to(device).requires_grad_()
    w = torch.randn(len(OFFS), 5, 6, generator=g, dtype=dtype).to(device).requires_grad_()
    offs = torch.tensor(OFFS, dtype=torch.int32).to(device)
    return x, w, offs


def _forward_backward(fn, x, w, offs):
    out = fn(x, w, offs)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(out.device)
    out.backward(grad)
    return out.detach().cpu(), x.grad.cpu(), w.grad.cpu()


def test_masked_grouped_mm_matches_transformers_fallback_forward_and_backward():
    """The replacement, run eagerly on CPU, against transformers' own loop of
    torch.mm (an empty group, rows past the last offset): forward and both
    gradients within 1e-6."""
    want = _forward_backward(torch.ops.transformers.grouped_mm_fallback, *_operands("cpu"))
    got = _forward_backward(op_replacements.REPLACEMENTS["transformers::grouped_mm_fallback"], *_operands("cpu"))
    for name, a, b in zip(("output", "grad input", "grad weight"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=f"{name} differs")
    assert got[0][9:].abs().max() == 0  # rows past offs[-1]


def test_compiled_fallback_call_is_one_forward_and_one_backward_graph():
    """Before the replacement, AOTAutograd failed on the fallback's backward
    (offs.tolist() on a fake tensor) and Dynamo broke the graph around it."""
    def layer(x, w, offs):
        h = torch.ops.transformers.grouped_mm_fallback(torch.relu(x), w, offs)
        return torch.tanh(h) * 2

    want = _forward_backward(layer, *_operands("neuron"))
    torch._dynamo.reset()
    reset_dynamo_metrics()
    got = _forward_backward(torch.compile(layer, backend="neuron", fullgraph=True), *_operands("neuron"))
    metrics = get_dynamo_metrics()
    assert (metrics["forward_graphs"], metrics["backward_graphs"], metrics["graph_breaks"]) == (1, 1, 0), metrics
    for name, a, b in zip(("output", "grad input", "grad weight"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{name} differs")
