"""linear's autograd kernel (csrc/Linear.cpp): one `linear` kernel forward and one
`linear_backward` kernel backward on plain neuron tensors, PyTorch's composite for
tensor subclasses and functorch transforms, the differentiable formula for
create_graph=True; results against CPU PyTorch (float32: rtol 1e-5, atol 1e-5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _pair(*shape, requires_grad=True):
    cpu = torch.randn(*shape, dtype=torch.float32)
    return cpu.clone().requires_grad_(requires_grad), cpu.to("neuron").requires_grad_(requires_grad)


def _counts():
    executed = torch_neuronx.get_executed_ops()
    return (sum(n for name, n in executed.items() if name.startswith("aten::linear.")
                or name == "aten::linear"),
            sum(n for name, n in executed.items() if name.startswith("aten::linear_backward")),
            sum(n for name, n in executed.items() if name.split("::")[1].split(".")[0] in ("addmm", "mm", "t")))


@pytest.mark.parametrize("input_shape", [(5, 8), (2, 3, 8), (8,)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("grads", [(True, True, True), (True, False, False), (False, True, True),
                                   (False, False, True)])
def test_forward_and_backward_match_cpu_as_one_kernel_each(input_shape, bias, grads):
    torch.manual_seed(0)
    x_cpu, x = _pair(*input_shape, requires_grad=grads[0])
    w_cpu, w = _pair(6, 8, requires_grad=grads[1])
    b_cpu, b = _pair(6, requires_grad=grads[2]) if bias else (None, None)
    torch_neuronx.clear_op_tracking()
    y = F.linear(x, w, b)
    y_cpu = F.linear(x_cpu, w_cpu, b_cpu)
    torch.testing.assert_close(y.cpu(), y_cpu, **TOL)
    needs = any(t is not None and t.requires_grad for t in (x, w, b))
    if not needs:
        assert not y.requires_grad
        return
    assert y.grad_fn is not None
    grad = torch.randn_like(y_cpu)
    y.backward(grad.to("neuron"))
    y_cpu.backward(grad)
    for got, want in ((x, x_cpu), (w, w_cpu), (b, b_cpu)):
        if want is not None and want.requires_grad:
            torch.testing.assert_close(got.grad.cpu(), want.grad, **TOL)
        elif got is not None:
            assert got.grad is None
    linear, linear_backward, matmuls = _counts()
    assert (linear, linear_backward) == (1, 1) and matmuls == 0


def test_no_grad_and_inference_mode_run_the_kernel_without_a_graph():
    _, x = _pair(4, 8)
    _, w = _pair(3, 8)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            y = F.linear(x, w)
        assert y.grad_fn is None and not y.requires_grad
        torch.testing.assert_close(y.cpu(), F.linear(x.detach().cpu(), w.detach().cpu()), **TOL)


def test_double_backward_matches_cpu():
    torch.manual_seed(1)
    x_cpu, x = _pair(4, 5)
    w_cpu, w = _pair(3, 5)
    b_cpu, b = _pair(3)
    results = []
    for xs, ws, bs in ((x, w, b), (x_cpu, w_cpu, b_cpu)):
        y = torch.tanh(F.linear(xs, ws, bs)).sum()
        gx, gw = torch.autograd.grad(y, (xs, ws), create_graph=True)
        (gx.pow(2).sum() + gw.pow(2).sum()).backward()
        results.append([t.detach().cpu() for t in (gx, gw, xs.grad, ws.grad, bs.grad)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **TOL)


def test_functorch_transforms_keep_the_composite():
    torch.manual_seed(2)
    w_cpu = torch.randn(3, 5)
    x_cpu = torch.randn(7, 5)
    w, x = w_cpu.to("neuron"), x_cpu.to("neuron")
    got = torch.vmap(lambda row: F.linear(row, w))(x)
    torch.testing.assert_close(got.cpu(), torch.vmap(lambda row: F.linear(row, w_cpu))(x_cpu), **TOL)
    grad = torch.func.grad(lambda weight: F.linear(x, weight).sin().sum())(w)
    want = torch.func.grad(lambda weight: F.linear(x_cpu, weight).sin().sum())(w_cpu)
    torch.testing.assert_close(grad.cpu(), want, **TOL)


def test_a_one_dimensional_weight_differentiates_the_composite():
    x_cpu, x = _pair(4, 5)
    w_cpu, w = _pair(5)
    F.linear(x, w).sum().backward()
    F.linear(x_cpu, w_cpu).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad, **TOL)
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, **TOL)


def test_modifying_a_saved_weight_before_backward_raises_as_on_cpu():
    for device in ("cpu", "neuron"):
        x = torch.randn(4, 5, device=device, requires_grad=True)
        w = torch.randn(3, 5, device=device, requires_grad=True)
        y = F.linear(x, w.clone())
        weight = w.detach().clone().requires_grad_(False)
        z = F.linear(x, weight)
        with torch.no_grad():
            weight.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (y.sum() + z.sum()).backward()


def test_mixed_devices_raise_the_usual_error():
    x = torch.randn(4, 5, device="neuron", requires_grad=True)
    w = torch.randn(3, 5, requires_grad=True)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        F.linear(x, w)


def _executed(*names):
    executed = torch_neuronx.get_executed_ops()
    return sum(n for name, n in executed.items() if name.split("::")[1].split(".")[0] in names)


@pytest.mark.parametrize("shape, view", [((5, 3, 8), lambda t: t.transpose(0, 1)),        # [3, 5, 8]
                                         ((2, 8, 4, 3), lambda t: t.permute(0, 3, 2, 1)),  # [2, 3, 4, 8]
                                         ((3, 16, 5), lambda t: t.transpose(1, 2))])       # [3, 5, 16]: strided rows
@pytest.mark.parametrize("bias", [True, False])
def test_a_non_contiguous_input_is_folded_into_one_matrix_as_on_cpu(shape, view, bias):
    """PyTorch's matmul copies a >= 3-D input into one matrix when the weight requires grad
    (nn.MultiheadAttention's batch_first in-projection): one linear kernel on the copy, not a
    batched product against an expanded weight; values, gradients and the result's layout (not
    a view) as on the CPU."""
    torch.manual_seed(3)
    base_cpu = torch.randn(*shape)
    x_cpu = view(base_cpu).requires_grad_()
    x = view(base_cpu.to("neuron")).requires_grad_()
    assert not x.is_contiguous()
    features = x.shape[-1]
    w_cpu, w = _pair(6, features)
    b_cpu, b = _pair(6) if bias else (None, None)
    torch_neuronx.clear_op_tracking()
    y = F.linear(x, w, b)
    y_cpu = F.linear(x_cpu, w_cpu, b_cpu)
    assert _executed("clone") == 1 and _executed("linear") == 1  # the copy PyTorch's matmul makes
    assert y.shape == y_cpu.shape and y.stride() == y_cpu.stride() and y._base is None
    torch.testing.assert_close(y.cpu(), y_cpu, **TOL)
    grad = torch.randn_like(y_cpu)
    y.backward(grad.to("neuron"))
    y_cpu.backward(grad)
    for got, want in ((x, x_cpu), (w, w_cpu), (b, b_cpu)):
        if want is not None:
            assert got.grad.stride() == want.grad.stride()
            torch.testing.assert_close(got.grad.cpu(), want.grad, **TOL)
    assert _executed("linear_backward") == 1


def test_a_frozen_weight_keeps_the_batched_product_as_on_cpu():
    """Without a weight that requires grad PyTorch does not copy a non-contiguous input (nor
    does it under no_grad): the same values either way."""
    torch.manual_seed(4)
    base_cpu = torch.randn(5, 3, 8)
    w_cpu = torch.randn(6, 8)
    x_cpu = base_cpu.transpose(0, 1).requires_grad_()
    x = base_cpu.to("neuron").transpose(0, 1).requires_grad_()
    torch_neuronx.clear_op_tracking()
    y, y_cpu = F.linear(x, w_cpu.to("neuron")), F.linear(x_cpu, w_cpu)
    assert _executed("clone") == 0
    torch.testing.assert_close(y.cpu(), y_cpu, **TOL)
    y.sum().backward()
    y_cpu.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, **TOL)
    w = w_cpu.to("neuron").requires_grad_()
    with torch.no_grad():
        torch.testing.assert_close(F.linear(x, w).cpu(), F.linear(x_cpu, w_cpu), **TOL)


def test_multihead_attention_batch_first_trains_as_on_cpu():
    """The case the fold is for: a batch_first MultiheadAttention's in-projection sees its
    [batch, seq, embed] input as [seq, batch, embed] through a transpose (need_weights=False:
    attention itself is then one device kernel, so no batched product runs at all)."""
    torch.manual_seed(5)
    mha_cpu = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True).to("neuron")
    mha.load_state_dict(mha_cpu.state_dict())
    x_cpu = torch.randn(3, 7, 32)
    for need_weights in (False, True):
        out_cpu, _ = mha_cpu(x_cpu, x_cpu, x_cpu, need_weights=need_weights)
        x = x_cpu.to("neuron")
        torch_neuronx.clear_op_tracking()
        out, _ = mha(x, x, x, need_weights=need_weights)
        assert need_weights or _executed("bmm", "baddbmm") == 0
        torch.testing.assert_close(out.cpu(), out_cpu, **TOL)
        out.square().sum().backward()
        out_cpu.square().sum().backward()
        for (name, p), p_cpu in zip(mha.named_parameters(), mha_cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), p_cpu.grad, **TOL, msg=lambda m, name=name: f"{name}: {m}")
