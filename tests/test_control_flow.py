"""Control-flow higher-order ops under torch.compile(backend="neuron"):
torch.cond, while_loop, scan and map compile into the graph as StableHLO
control flow (lowering/control_flow.py) instead of failing. Reference: the
same functions eagerly on CPU; tolerance 1e-5 (1e-4 for gradients)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import torch_neuronx  # noqa: F401
from torch_neuronx.compiler import NeuronCompileError, get_dynamo_metrics


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py: Dynamo and metrics reset per test


def branchy(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos() - 1, (x,))


def grow_until(x):
    """Doubles x until its sum passes 100: the trip count depends on the values."""
    def cond_fn(steps, x):
        return x.abs().sum() < 100

    def body_fn(steps, x):
        return steps + 1, x * 2

    steps, x = while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64, device=x.device), x))
    return x + steps


def running_sum(x):
    def combine(carry, row):
        carry = carry + row
        return carry, carry * 2

    last, rows = scan(combine, torch.zeros_like(x[0]), x)
    return rows.sum(0) + last


def per_row(x):
    return torch._higher_order_ops.map(lambda row: row.sin() * row.sum(), x)


CASES = {"cond": branchy, "while_loop": grow_until, "scan": running_sum, "map": per_row}


@pytest.mark.parametrize("name", list(CASES))
def test_control_flow_compiles_into_one_graph_and_matches_cpu(name):
    fn = CASES[name]
    compiled = torch.compile(fn, backend="neuron", fullgraph=True)
    for seed in (0, 1, 2):  # cond: both branches; while_loop: different trip counts
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(seed)) * (1 if seed % 2 else -1)
        torch.testing.assert_close(compiled(x.to("neuron")).cpu(), fn(x), rtol=1e-5, atol=1e-5)
    metrics = get_dynamo_metrics()
    # One executable serves every input: the branch and the trip count are
    # decided inside it, by the values.
    assert metrics["compiles"] == 1 and metrics["graph_breaks"] == 0, metrics


@pytest.mark.parametrize("name", ["cond", "scan", "map"])
def test_gradients_through_control_flow_match_cpu(name):
    fn = CASES[name]
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))
    want = x.clone().requires_grad_()
    (fn(want) ** 2).sum().backward()
    got = x.to("neuron").requires_grad_()
    (torch.compile(fn, backend="neuron", fullgraph=True)(got) ** 2).sum().backward()
    torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-4)
    assert get_dynamo_metrics()["backward_graphs"] >= 1


def test_graphs_differing_only_in_a_branch_get_their_own_executables():
    """The top-level graphs of these two are the same code; only the branch
    subgraphs differ. The executable key covers subgraphs, so the second is
    not served the first one's executable."""
    def sine(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))

    def tangent(x):
        return torch.cond(x.sum() > 0, lambda x: x.tan(), lambda x: x.cos(), (x,))

    x = torch.rand(4) + 0.1  # positive: the first branch
    for fn in (sine, tangent):
        torch.testing.assert_close(torch.compile(fn, backend="neuron")(x.to("neuron")).cpu(), fn(x))


def test_while_loop_under_autograd_is_a_clear_error():
    x = torch.randn(5, 3, device="neuron", requires_grad=True)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as caught:
        torch.compile(grow_until, backend="neuron", fullgraph=True)(x)
    assert isinstance(caught.value.inner_exception, NeuronCompileError)
    message = str(caught.value)
    assert "while_loop_stack_output" in message and "torch.no_grad()" in message, message
    with torch.no_grad():  # the remedy it names
        torch.testing.assert_close(torch.compile(grow_until, backend="neuron")(x).cpu(), grow_until(x.cpu()))


WARM_SCRIPT = """
import json, sys, torch, torch_neuronx
sys.path.insert(0, sys.argv[1])
from test_control_flow import branchy, reused_region, running_sum
out = {}
for name, fn in (("cond", branchy), ("scan", running_sum), ("region", reused_region)):
    x = torch.linspace(-1, 2, 15).reshape(5, 3).to("neuron").requires_grad_()
    y = torch.compile(fn, backend="neuron", fullgraph=True)(x)
    y.sum().backward()
    out[name] = [y.detach().cpu().tolist(), x.grad.cpu().tolist()]
m = torch_neuronx.get_dynamo_metrics()
print(json.dumps({"out": out, "aot": m["cache_hits_aot"], "disk": m["cache_hits_disk"]}))
"""


def test_second_process_loads_control_flow_graphs_from_the_disk_cache(tmp_path):
    """AOTAutograd's results for graphs with subgraphs are stored and reloaded
    (their subgraphs are pickled with them and digested into the key)."""
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-W", "ignore", "-c", WARM_SCRIPT, os.path.dirname(__file__)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["aot"] == 0 and runs[1]["aot"] == 3, runs
    assert runs[1]["out"] == runs[0]["out"]


@torch.compiler.nested_compile_region
def _region(x):
    return x.sin() * 2 + x


def reused_region(x):
    return _region(_region(x)) + _region(x * 3)


def test_nested_compile_region_is_traced_inline_forward_and_backward():
    """torch.compiler.nested_compile_region: the region's graph, called at three
    places (invoke_subgraph), forward and backward in one graph each."""
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(4))
    want = x.clone().requires_grad_()
    (reused_region(want) ** 2).sum().backward()
    got = x.to("neuron").requires_grad_()
    out = torch.compile(reused_region, backend="neuron", fullgraph=True)(got)
    (out ** 2).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), reused_region(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-4)
    metrics = get_dynamo_metrics()
    assert (metrics["forward_graphs"], metrics["backward_graphs"], metrics["graph_breaks"]) == (1, 1, 0), metrics
