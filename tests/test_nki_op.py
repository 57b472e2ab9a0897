"""NKI kernels as PyTorch ops (torch_neuronx.nki_op / wrap_nki): eager on neuron
tensors against torch references, the per-signature compile cache, in-place
outputs (mutates_args), autograd through register_autograd, and the op as one
node inside torch.compile(backend="neuron"). Tolerance: float32 kernels
compute in fp32 like torch, so 1e-5 unless stated."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx
from torch_neuronx import nki, nki_op, wrap_nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

from nki_examples import load_example as _example  # noqa: E402

DEVICE = "neuron"


ADD = _example("tensor_add").tensor_add_kernel
RMSNORM = _example("rmsnorm").rmsnorm_kernel


@nki_op("nki_test::add", mutates_args=())
def nki_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ADD(a, b)


@nki_op("nki_test::rmsnorm", mutates_args=())
def nki_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return RMSNORM(x, weight, eps)


def _rmsnorm_reference(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rmsnorm_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    with torch.enable_grad():
        x_, w_ = x.detach().requires_grad_(), weight.detach().requires_grad_()
        out = _rmsnorm_reference(x_, w_, ctx.eps)
        gx, gw = torch.autograd.grad(out, (x_, w_), grad)
    return gx, gw, None


def _rmsnorm_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


nki_rmsnorm.register_autograd(_rmsnorm_backward, setup_context=_rmsnorm_setup)


def test_eager_op_on_neuron_matches_torch_and_caches_per_signature():
    nki_add.nki_cache.clear()
    a, b = torch.randn(200, 64, device=DEVICE), torch.randn(200, 64, device=DEVICE)
    out = nki_add(a, b)
    assert out.device == a.device and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), (a + b).cpu(), rtol=1e-6, atol=1e-6)
    assert (nki_add.nki_cache.compiles, nki_add.nki_cache.hits) == (1, 0)
    nki_add(torch.randn(200, 64, device=DEVICE), b)  # same signature: cached
    assert (nki_add.nki_cache.compiles, nki_add.nki_cache.hits) == (1, 1)
    nki_add(torch.randn(8, 64, device=DEVICE), torch.randn(8, 64, device=DEVICE))  # new shape
    assert nki_add.nki_cache.compiles == 2


def test_non_tensor_arguments_are_part_of_the_signature():
    nki_rmsnorm.nki_cache.clear()
    x, w = torch.randn(130, 96, device=DEVICE), torch.randn(96, device=DEVICE)
    for eps in (1e-6, 1e-6, 1e-2):
        torch.testing.assert_close(nki_rmsnorm(x, w, eps).cpu(), _rmsnorm_reference(x, w, eps).cpu(),
                                   rtol=1e-5, atol=1e-5)
    assert (nki_rmsnorm.nki_cache.compiles, nki_rmsnorm.nki_cache.hits) == (2, 1)


def test_bf16_op():
    a = torch.randn(128, 256, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(128, 256, device=DEVICE, dtype=torch.bfloat16)
    out = nki_add(a, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), (a.float() + b.float()).bfloat16().cpu(), rtol=1e-2, atol=1e-2)


@nki.jit
def _scale_into_kernel(x, out, factor):
    tile = nl.load(x)
    scaled = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(scaled, tile, nl.multiply, factor)
    nl.store(out, scaled)


@nki_op("nki_test::scale_into", mutates_args={"out"})
def nki_scale_into(x: torch.Tensor, out: torch.Tensor, factor: float) -> None:
    _scale_into_kernel(x, out, factor)


def test_mutates_args_writes_the_callers_tensor_in_place():
    x = torch.randn(64, 32, device=DEVICE)
    out = torch.zeros(64, 32, device=DEVICE)
    ptr = out.data_ptr()
    nki_scale_into(x, out, 3.0)
    assert out.data_ptr() == ptr
    torch.testing.assert_close(out.cpu(), (x * 3).cpu())


def test_mutating_kernel_inside_a_compiled_region():
    def scaled_plus_one(x):
        out = torch.empty_like(x)
        nki_scale_into(x * 2, out, 3.0)
        return out + 1

    x = torch.randn(64, 32, device=DEVICE)
    got = torch.compile(scaled_plus_one, backend="neuron", fullgraph=True)(x)
    torch.testing.assert_close(got.cpu(), (x * 6 + 1).cpu(), rtol=1e-5, atol=1e-5)


@nki_op("nki_test::scale_into_with_mode", mutates_args={"out"})
def nki_scale_into_with_mode(x: torch.Tensor, out: torch.Tensor, mode: float) -> None:
    _scale_into_kernel(x, out, mode)


def test_a_mutating_op_may_name_a_parameter_mode():
    """auto_functionalized passes `mode=` to its own dispatch function when torch.compile traces a
    mutating op: the schema names the op's `mode` `mode_` (positional calls unchanged)."""
    def scaled(x, factor):
        out = torch.empty_like(x)
        nki_scale_into_with_mode(x, out, factor)
        return out

    x = torch.randn(64, 32, device=DEVICE)
    torch.testing.assert_close(scaled(x, 2.0).cpu(), (x * 2).cpu())
    got = torch.compile(scaled, backend="neuron", fullgraph=True)(x, 5.0)
    torch.testing.assert_close(got.cpu(), (x * 5).cpu(), rtol=1e-5, atol=1e-5)
    assert "mode_" in str(torch.ops.nki_test.scale_into_with_mode.default._schema)


@nki.jit
def _write_row_kernel(src, dst, row):
    """Copies src (1, n) into dst[row] where row is a one-element tile read at run time;
    a row outside dst is skipped."""
    index = nl.load(row)
    i_f = nl.arange(src.shape[1])[None, :]
    nisa.dma_copy(dst=dst[index, i_f], src=src, oob_mode=nisa.oob_mode.skip)
    return dst


@pytest.mark.parametrize("row", [0, 2, 3, 7])
def test_dma_to_a_row_read_at_run_time_skips_out_of_bounds(row):
    src = torch.randn(1, 16, device=DEVICE)
    dst = torch.zeros(4, 16, device=DEVICE)
    wrap_nki(_write_row_kernel)(src, dst, torch.tensor([row], dtype=torch.int32, device=DEVICE))
    want = torch.zeros(4, 16)
    if row < 4:
        want[row] = src.cpu()[0]
    torch.testing.assert_close(dst.cpu(), want, rtol=0, atol=0)


def test_dma_out_of_bounds_without_skip_is_an_error():
    @nki.jit
    def kernel(src, dst, row):
        nisa.dma_copy(dst=dst[nl.load(row), nl.arange(16)[None, :]], src=src)
        return dst

    with pytest.raises(Exception, match="out of bounds"):
        wrap_nki(kernel)(torch.randn(1, 16, device=DEVICE), torch.zeros(4, 16, device=DEVICE),
                         torch.tensor([5], dtype=torch.int32, device=DEVICE))


def test_register_autograd_trains():
    torch.manual_seed(0)
    x = torch.randn(64, 48, device=DEVICE, requires_grad=True)
    w = torch.randn(48, device=DEVICE, requires_grad=True)
    nki_rmsnorm(x, w, 1e-5).square().sum().backward()
    xr, wr = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    _rmsnorm_reference(xr, wr, 1e-5).square().sum().backward()
    torch.testing.assert_close(x.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.cpu(), wr.grad, rtol=1e-4, atol=1e-4)


class _NormMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(48, 96)
        self.weight = torch.nn.Parameter(torch.ones(96))
        self.down = torch.nn.Linear(96, 8)

    def forward(self, x):
        return self.down(nki_rmsnorm(torch.relu(self.up(x)), self.weight, 1e-5))


def test_op_inside_torch_compile_forward_and_backward():
    torch.manual_seed(0)
    eager = _NormMLP().to(DEVICE)
    compiled_model = _NormMLP().to(DEVICE)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="neuron", fullgraph=True)
    x = torch.randn(16, 48, device=DEVICE)
    torch_neuronx.reset_dynamo_metrics()
    out_c, out_e = compiled(x), eager(x)
    torch.testing.assert_close(out_c.cpu(), out_e.cpu(), rtol=1e-4, atol=1e-4)
    out_c.sum().backward()
    out_e.sum().backward()
    for pc, pe in zip(compiled_model.parameters(), eager.parameters()):
        torch.testing.assert_close(pc.grad.cpu(), pe.grad.cpu(), rtol=1e-4, atol=1e-4)
    assert torch_neuronx.get_dynamo_metrics()["compiles"] >= 2  # the pieces around the op


@nki.jit
def _too_many_partitions_kernel(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)  # all rows in one tile: > 128 partitions for a tall input
    nl.store(out, tile)
    return out


@nki_op("nki_test::too_tall", mutates_args=())
def nki_too_tall(x: torch.Tensor) -> torch.Tensor:
    return _too_many_partitions_kernel(x)


def test_hardware_rule_violation_raises_in_eager_and_at_compile_time():
    x = torch.randn(256, 4, device=DEVICE)
    with pytest.raises(nki.NKIError, match="128"):
        nki_too_tall(x)
    compiled = torch.compile(lambda t: nki_too_tall(t) + 1, backend="neuron", fullgraph=True)
    with pytest.raises(Exception, match="128"):
        compiled(torch.randn(300, 4, device=DEVICE))  # a new signature, first seen while tracing


def test_missing_annotations_give_a_clear_error():
    with pytest.raises(TypeError, match="explicit type annotations for 'x', 'return'"):
        @nki_op("nki_test::unannotated")
        def unannotated(x):
            return ADD(x, x)


@nki.jit
def _annotated_add_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ADD(a, b)


def test_wrap_nki_makes_a_kernel_an_op():
    op = wrap_nki(_annotated_add_kernel, "nki_test::wrapped_add")
    a, b = torch.randn(40, 16, device=DEVICE), torch.randn(40, 16, device=DEVICE)
    torch.testing.assert_close(op(a, b).cpu(), (a + b).cpu())
    assert torch.ops.nki_test.wrapped_add.default(a, b).shape == (40, 16)
    with pytest.raises(TypeError, match="annotations"):
        wrap_nki(ADD, "nki_test::unannotated_kernel")  # naming an operator needs a schema


# --------------------------------------- TorchNeuron's form: wrap_nki(kernel)[grid](...) in an nki_op
@nki.jit
def _scaled_add_rows(a, scale, out: nki.typing.mutable_tensor):
    """out[rows of this program] += a * scale: unannotated tensors, one mutated argument."""
    rows = nl.ds(nl.program_id(0) * 64, 64)
    total = nl.ndarray((64, a.shape[1]), a.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(total, nl.load(a[rows, :]), nl.multiply, scale)
    nl.store(out[rows, :], nl.add(total, nl.load(out[rows, :])))
    return out


@nki_op("nki_test::scaled_add_inplace", mutates_args={"out"})
def nki_scaled_add_inplace(a: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    wrap_nki(_scaled_add_rows)[a.shape[0] // 64](a, scale, out)


@pytest.mark.parametrize("rows", [64, 192])
def test_wrap_nki_launches_an_unannotated_kernel_on_a_grid_inside_an_nki_op(rows):
    a, out = torch.randn(rows, 32, device=DEVICE), torch.randn(rows, 32, device=DEVICE)
    expected = (out + a * 2.5).cpu()
    nki_scaled_add_inplace(a, 2.5, out)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)

    def step(x, y):
        nki_scaled_add_inplace(x * 2, -1.0, y)
        return y + 1

    y = torch.randn(rows, 32, device=DEVICE)
    expected = (y - a * 2 + 1).cpu()
    compiled = torch.compile(step, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(a, y).cpu(), expected, rtol=1e-5, atol=1e-5)


@nki.jit
def _add_and_scale_in_place(a, b: nki.typing.mutable_tensor):
    """Returns a new tensor (a + b) and b itself, which it scales by 2 in place."""
    rows = nl.ds(nl.program_id(0) * 64, 64)
    total = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a[rows, :]), nl.load(b[rows, :])
    nl.store(total[rows, :], nl.add(x, y))
    nl.store(b[rows, :], nl.multiply(y, 2.0))
    return total, b


@pytest.mark.parametrize("rows", [64, 128])
def test_wrap_nki_called_in_compiled_code_is_one_graph_node(rows):
    """As TorchNeuron traces a wrapped kernel into the graph: fullgraph works, the kernel's
    in-place write reaches the caller's tensor, a returned argument is that tensor."""
    a, b = torch.randn(rows, 16, device=DEVICE), torch.randn(rows, 16, device=DEVICE)
    a_cpu, b_cpu = a.cpu(), b.cpu()

    def step(x, y):
        total, same = wrap_nki(_add_and_scale_in_place)[x.shape[0] // 64](x * 3, y)
        return total + 1, same

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.backends.registry.lookup_backend("neuron")(gm, example_inputs)

    total, same = torch.compile(step, backend=backend, fullgraph=True)(a, b)
    torch.testing.assert_close(total.cpu(), a_cpu * 3 + b_cpu + 1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.cpu(), b_cpu * 2, rtol=0, atol=0)
    torch.testing.assert_close(same.cpu(), b_cpu * 2, rtol=0, atol=0)
    assert len(graphs) == 1
    assert [n.target for n in graphs[0].graph.nodes if n.op == "call_function"].count(torch.ops.nki.launch) == 1


def test_wrap_nki_launcher_is_not_an_operator_unless_named():
    launcher = wrap_nki(_scaled_add_rows)
    assert launcher.op is None and launcher[2].grid == (2,)
    with pytest.raises(AttributeError, match="not an operator"):
        launcher.register_autograd  # noqa: B018
