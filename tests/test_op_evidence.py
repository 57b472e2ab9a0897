"""The device's op set follows the evidence of what TorchNeuron does
(torch_neuronx/ops/evidence.py): ops it runs on the host CPU fall back here too
(warned about, counted, seen by the audit), boolean-mask indexing is nonzero on
the device plus a host read, composite ops it runs as one kernel are one call
here, and `torch-neuronx ops` shows each decision's source and the
differences that remain."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import torch_neuronx
from torch_neuronx import op_support, ops
from torch_neuronx.audit import recorder
from torch_neuronx.cli import main as cli_main
from torch_neuronx.ops import evidence, registry

DEVICE = "neuron"


@pytest.fixture
def tracked():
    torch_neuronx.clear_op_tracking()
    yield
    torch_neuronx.clear_op_tracking()


def _fell_back(base: str) -> int:
    """Calls of any overload of `base` that took the CPU fallback (a structured op's
    functional form falls back as its out= overload, e.g. aten::linalg_qr.out)."""
    return sum(n for op, n in torch_neuronx.get_fallback_ops().items() if registry.base_name(op) == base)


def _recorded(fn):
    """The audit's in-process recording of fn's device calls: op -> its signatures' records."""
    rec = recorder.Recording()
    rec.start()
    try:
        fn()
    finally:
        rec.stop()
    by_op: dict[str, list] = {}
    for signature in rec.record()["signatures"]:
        by_op.setdefault(signature["op"], []).append(signature)
    return by_op


# ----------------------------------------------------------------- the records


def test_records_name_aten_ops_with_a_route_and_a_source():
    aten = op_support.aten_overloads()
    for record in evidence.RECORDS:
        assert record.op in aten, record.op
        assert record.route in (evidence.HOST, evidence.ONE_KERNEL, evidence.HOST_STEP), record
        assert record.source.startswith(("AWS snapshot", "Neuron docs")), record
        assert record.emulated or record.note, f"{record.op}: a difference must say why"
    assert len(evidence.BY_OP) == len(evidence.RECORDS), "one record per op"


def test_host_fallback_ops_are_not_native_and_their_neuron_kernel_is_the_fallback():
    """Registered by name (csrc/Eager.cpp registerFallbackOps) so that the op the program called
    is the one counted, e.g. aten::linalg_qr rather than the linalg_qr.out its generic path reaches."""
    assert registry.HOST_FALLBACK == evidence.ops_routed(evidence.HOST)
    assert not registry.HOST_FALLBACK & registry.NATIVE_OPS
    registered = set(ops.host_fallback_overloads())
    assert {"linalg_qr", "_linalg_svd", "linalg_inv_ex"} <= registered
    for base in registry.HOST_FALLBACK:
        for name in op_support.aten_overloads()[base]:
            if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"):
                assert name in registered, name
                line = next(line for line in torch._C._dispatch_dump("aten::" + name).splitlines()
                            if line.startswith("PrivateUse1"))
                assert "Eager.cpp" in line, line


@pytest.mark.parametrize("call, name", [
    (lambda x: torch.linalg.svd(x), "aten::_linalg_svd"),  # (linalg_qr's warning is tested below)
    (lambda x: torch.linalg.lu_factor(x), "aten::linalg_lu_factor_ex"),
    (lambda x: torch.linalg.inv(x @ x.mT + torch.eye(4, device=x.device)), "aten::linalg_inv_ex"),
])
def test_host_fallback_is_counted_under_the_op_called(call, name):
    x = torch.randn(4, 4).to("neuron")
    torch_neuronx.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call(x)
    fallback = torch_neuronx.get_fallback_ops()
    assert fallback.get(name) == 1 and not any(key.endswith(".out") for key in fallback), fallback


def test_emulated_one_kernel_ops_are_native():
    for record in evidence.RECORDS:
        if record.route == evidence.ONE_KERNEL and record.emulated:
            assert record.op in registry.NATIVE_OPS, record.op


# ------------------------------------------------- ops TorchNeuron runs on the host


def test_host_fallback_op_falls_back_with_a_warning_and_is_counted(tracked):
    a = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q, r = torch.linalg.qr(a.to(DEVICE))
    assert any("aten::linalg_qr" in str(w.message) and "runs on the CPU" in str(w.message) for w in caught)
    assert _fell_back("linalg_qr") == 1
    want_q, want_r = torch.linalg.qr(a)
    # the same CPU kernel on the same values: equal up to the copy
    torch.testing.assert_close(q.cpu(), want_q, rtol=0, atol=0)
    torch.testing.assert_close(r.cpu(), want_r, rtol=0, atol=0)
    assert q.device.type == DEVICE and q.stride() == want_q.stride()


@pytest.mark.parametrize("name, call", [
    ("_linalg_svd", lambda m: torch.linalg.svd(m)),
    ("_linalg_eigh", lambda m: torch.linalg.eigh(m @ m.mT)),
    ("linalg_cholesky_ex", lambda m: torch.linalg.cholesky(m @ m.mT + torch.eye(4, device=m.device))),
    ("linalg_inv_ex", lambda m: torch.linalg.inv(m @ m.mT + torch.eye(4, device=m.device))),
    ("linalg_lu_factor_ex", lambda m: torch.linalg.lu_factor(m)),
    ("triangular_solve", lambda m: torch.triangular_solve(m, m.triu() + 4 * torch.eye(4, device=m.device))),
])
def test_each_host_fallback_op_takes_the_fallback(tracked, name, call):
    m = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = call(m.to(DEVICE))
    assert _fell_back(name) >= 1
    for have, want in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(call(m))):
        torch.testing.assert_close(have.cpu(), want, rtol=1e-5, atol=1e-5)


def test_the_audit_sees_the_fallback():
    m = torch.randn(4, 4).to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calls = _recorded(lambda: torch.linalg.qr(m))
    qr = [s for op, signatures in calls.items() if registry.base_name(op) == "linalg_qr" for s in signatures]
    assert qr and all("fallback" in s["hazards"] for s in qr)


def test_a_host_fallback_op_still_compiles(tracked, fresh_dynamo):
    """TorchNeuron's compile has no CPU partition; the emulator keeps its lowering (one
    graph, no fallback) and says that the release is unverified there."""
    a = torch.randn(5, 3, generator=torch.Generator().manual_seed(2))
    fn = torch.compile(lambda x: torch.linalg.qr(x).R.abs() * 2, backend="neuron", fullgraph=True)
    got = fn(a.to(DEVICE))
    torch.testing.assert_close(got.cpu(), torch.linalg.qr(a).R.abs() * 2, rtol=1e-5, atol=1e-5)
    assert _fell_back("linalg_qr") == 0
    support = op_support.op_support("linalg_qr")
    assert support.eager == op_support.FALLBACK and support.compile == op_support.LOWERED
    assert "no CPU partition" in support.compile_reason


# ---------------------------------------------------- boolean masks: nonzero + index


def test_mask_index_runs_nonzero_on_the_device_then_index(tracked):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3))
    mask = x[..., 0] > 0
    got = x.to(DEVICE)[mask.to(DEVICE)]
    torch.testing.assert_close(got.cpu(), x[mask], rtol=0, atol=0)
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::nonzero") == 1 and executed.get("aten::index.Tensor") == 1
    assert torch_neuronx.get_fallback_ops() == {}


@pytest.mark.parametrize("make", [
    lambda x: (x > 10,),                                     # all false: an empty result
    lambda x: (slice(None), x[0] > 0),                       # a mask after a full slice
    lambda x: (torch.tensor([2, 0]), torch.tensor([True, False, True], device=DEVICE)),  # integers, then a mask
    lambda x: ((x[:, :, 0] > 0).cpu(),),                     # a host mask
])
def test_mask_index_matches_the_cpu(tracked, make):
    x = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(4))
    index = tuple(i.to(DEVICE) if isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.device.type != "cpu"
                  else i for i in make(x.to(DEVICE)))
    want = x[tuple(i.cpu() if isinstance(i, torch.Tensor) else i for i in index)]
    torch.testing.assert_close(x.to(DEVICE)[index].cpu(), want, rtol=0, atol=0)
    assert torch_neuronx.get_fallback_ops() == {}


@pytest.mark.parametrize("shape, make", [
    ((5,), lambda m: (m,)), ((4, 5), lambda m: (m,)), ((3, 4, 5), lambda m: (m,)),
    ((4, 5), lambda m: (m[:, 0], slice(1, None))),  # a row mask, then a slice
])
def test_a_mask_that_selects_nothing_runs_only_nonzero(tracked, shape, make):
    """As on Trainium: nonzero on the device, and no gather for an empty result."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(6))
    mask = torch.zeros(shape, dtype=torch.bool)
    x_dev, mask_dev = x.to(DEVICE), mask.to(DEVICE)
    torch_neuronx.clear_op_tracking()
    got = x_dev[make(mask_dev)]
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::nonzero") == 1 and not any("index" in op for op in executed), executed
    want = x[make(mask)]
    assert got.device.type == DEVICE and got.shape == want.shape and got.dtype == want.dtype


def test_an_empty_mask_with_indices_that_do_not_broadcast_is_pytorchs_error():
    x = torch.randn(4, 5)
    with pytest.raises(IndexError) as cpu:
        x[torch.zeros(4, dtype=torch.bool), torch.tensor([0, 1, 2])]
    with pytest.raises(IndexError) as neuron:
        x.to(DEVICE)[torch.zeros(4, dtype=torch.bool, device=DEVICE), torch.tensor([0, 1, 2], device=DEVICE)]
    assert str(neuron.value) == str(cpu.value)


def test_a_gradient_through_an_empty_mask_is_zero():
    xd = torch.randn(3, 2).to(DEVICE).requires_grad_()
    (xd[torch.zeros(3, 2, dtype=torch.bool, device=DEVICE)] * 3).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), torch.zeros(3, 2), rtol=0, atol=0)


def test_integer_index_runs_one_kernel(tracked):
    x = torch.randn(4, 3).to(DEVICE)
    x[torch.tensor([3, 1], device=DEVICE)]
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::index.Tensor") == 1 and "aten::nonzero" not in executed


def test_mask_shape_mismatch_is_pytorchs_error():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError) as cpu:
        x[torch.ones(4, dtype=torch.bool)]
    with pytest.raises(IndexError) as neuron:
        x.to(DEVICE)[torch.ones(4, dtype=torch.bool, device=DEVICE)]
    assert str(neuron.value) == str(cpu.value)


def test_the_audit_sees_the_mask_index_host_read():
    x = torch.randn(8, 3).to(DEVICE)
    mask = x[:, 0] > 0
    calls = _recorded(lambda: x[mask])
    assert "data_dependent_shape" in calls["aten::nonzero"][0]["hazards"]
    assert "aten::index.Tensor" in calls


def test_mask_index_backward_matches_the_cpu():
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(5))
    mask = x[:, 0] > 0
    xd = x.to(DEVICE).requires_grad_()
    (xd[mask.to(DEVICE)] * 3).sum().backward()
    xc = x.clone().requires_grad_()
    (xc[mask] * 3).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=0, atol=0)


# ------------------------------------------------------- one kernel, as on Trainium


@pytest.mark.parametrize("op, call, want", [
    ("aten::zeros", lambda: torch.zeros(2, 3, device=DEVICE), torch.zeros(2, 3)),
    ("aten::ones", lambda: torch.ones(2, 3, device=DEVICE, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)),
    ("aten::full", lambda: torch.full((2, 2), 0.1, device=DEVICE, dtype=torch.float64),
     torch.full((2, 2), 0.1, dtype=torch.float64)),
    ("aten::scalar_tensor", lambda: torch.scalar_tensor(2.5, device=DEVICE), torch.scalar_tensor(2.5)),
])
def test_factory_runs_as_one_kernel(tracked, op, call, want):
    got = call()
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)  # float64 fills stay exact (data movement)
    executed = torch_neuronx.get_executed_ops()
    assert executed.get(op) == 1, executed
    assert not {"aten::fill_.Scalar", "aten::zero_"} & set(executed), executed


def test_slice_backward_is_one_kernel_for_the_audit():
    x = torch.randn(6, 4, device=DEVICE, requires_grad=True)
    calls = _recorded(lambda: x[1:4].sum().backward())
    assert sum(s["calls"] for s in calls["aten::slice_backward"]) == 1
    assert "aten::zeros" not in calls and "aten::slice_scatter" not in calls
    torch.testing.assert_close(x.grad.cpu(), torch.zeros(6, 4).index_fill_(0, torch.tensor([1, 2, 3]), 1.0))


def test_select_backward_is_one_kernel(tracked):
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    (x[1] * 2).sum().backward()
    assert torch_neuronx.get_executed_ops().get("aten::select_backward") == 1
    torch.testing.assert_close(x.grad.cpu(), torch.zeros(3, 4).index_fill_(0, torch.tensor([1]), 2.0))


# Each op of registry.ONE_KERNEL_COMPOSITES: one tracked call of the op itself, none of its
# parts, the CPU's result. Float32 inputs; the composites compute in float32 on both sides,
# so the same arithmetic: rtol/atol 1e-6 leaves room for summation order only.
_F = torch.nn.functional
_INDEX = torch.tensor([0, 2, 2])


@pytest.mark.parametrize("op, call, args", [
    ("aten::isfinite", torch.isfinite, (torch.tensor([1.0, float("inf"), float("nan"), -float("inf"), 0.0]),)),
    ("aten::one_hot", _F.one_hot, (torch.tensor([0, 3, 1]),)),
    ("aten::one_hot", lambda t: _F.one_hot(t, 6), (torch.tensor([[0, 5], [1, 1]]),)),
    ("aten::_fused_rms_norm", lambda x, w: torch.ops.aten._fused_rms_norm(x, [6], w, 1e-5)[0],
     (torch.randn(4, 6), torch.randn(6))),
    ("aten::silu_backward", torch.ops.aten.silu_backward, (torch.randn(4, 3), torch.randn(4, 3))),
    ("aten::index_select_backward", lambda g, i: torch.ops.aten.index_select_backward(g, [4, 3], 0, i),
     (torch.randn(3, 3), _INDEX)),
    ("aten::value_selecting_reduction_backward",
     lambda g, i: torch.ops.aten.value_selecting_reduction_backward(g, 0, i, [4, 3], False),
     (torch.randn(3), _INDEX)),
])
def test_composite_runs_as_one_kernel(tracked, op, call, args):
    on_device = [a.to(DEVICE) for a in args]
    torch_neuronx.clear_op_tracking()  # the copies to the device
    got = call(*on_device)
    executed = torch_neuronx.get_executed_ops()
    assert executed == {op: 1}, executed
    torch.testing.assert_close(got.cpu(), call(*args), rtol=1e-6, atol=1e-6)


def _grads_on_both(fn, *tensors):
    """fn's value and its inputs' gradients on the device and on the CPU, and the device
    ops the backward ran."""
    cpu = [t.clone().requires_grad_() for t in tensors]
    dev = [t.to(DEVICE).requires_grad_() for t in tensors]
    fn(*cpu).sum().backward()
    torch_neuronx.clear_op_tracking()
    fn(*dev).sum().backward()
    executed = torch_neuronx.get_executed_ops()
    for have, want in zip(dev, cpu):
        torch.testing.assert_close(have.grad.cpu(), want.grad, rtol=1e-5, atol=1e-6)
    return executed


@pytest.mark.parametrize("input_shape, weight_shape, bias", [
    ((2, 4, 3), (5, 3), True), ((3,), (5, 3), True), ((4, 3), (5, 3), False), ((1, 2, 2, 3), (2, 3), True),
])
def test_linear_and_its_gradient_are_one_kernel_each(tracked, input_shape, weight_shape, bias):
    """TorchNeuron registers linear (and linear_backward): forward one linear kernel, backward one
    linear_backward kernel, no addmm/mm of PyTorch's composite; the CPU's gradients."""
    tensors = [torch.randn(input_shape), torch.randn(weight_shape)] + ([torch.randn(weight_shape[0])] if bias else [])
    executed = _grads_on_both(_F.linear, *tensors)
    assert executed.get("aten::linear") == 1 and executed.get("aten::linear_backward") == 1, executed
    assert not {"aten::addmm", "aten::mm", "aten::t"} & set(executed), executed


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2), (torch.float16, 1e-3)])
def test_linear_without_grad_is_one_kernel(tracked, dtype, tol):
    x, w, b = torch.randn(3, 4, dtype=dtype), torch.randn(6, 4, dtype=dtype), torch.randn(6, dtype=dtype)
    on_device = [t.to(DEVICE) for t in (x, w, b)]
    torch_neuronx.clear_op_tracking()
    with torch.no_grad():
        got = _F.linear(*on_device)
    assert torch_neuronx.get_executed_ops() == {"aten::linear": 1}
    torch.testing.assert_close(got.cpu(), _F.linear(x, w, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("input_shape, weight_shape, bias_shape", [((4,), (4,), ()), ((3, 4), (4,), None)])
def test_linear_with_a_vector_weight(tracked, input_shape, weight_shape, bias_shape):
    """One kernel without grad; with grad, PyTorch's composite (linear_backward needs a 2-D weight)."""
    tensors = [torch.randn(input_shape), torch.randn(weight_shape)] + ([] if bias_shape is None else [torch.randn(bias_shape)])
    on_device = [t.to(DEVICE) for t in tensors]
    torch_neuronx.clear_op_tracking()
    got = _F.linear(*on_device)
    assert torch_neuronx.get_executed_ops() == {"aten::linear": 1}
    torch.testing.assert_close(got.cpu(), _F.linear(*tensors), rtol=1e-6, atol=1e-6)
    executed = _grads_on_both(_F.linear, *tensors)
    assert "aten::linear_backward" not in executed, executed


def test_linear_gradient_of_a_gradient_is_exact(tracked):
    """create_graph=True: the backward runs a formula autograd differentiates (ops/linear.py)."""
    def second(x, w):
        (g,) = torch.autograd.grad(_F.linear(x, w).pow(2).sum(), x, create_graph=True)
        return g

    executed = _grads_on_both(second, torch.randn(3, 4), torch.randn(5, 4))
    assert "aten::linear" in executed, executed


def test_linear_keeps_the_composite_for_tensor_subclasses(tracked):
    """A subclass reaching the Python key (DTensor has no sharding rule for linear in PyTorch 2.13;
    Dynamo's fake tensors) gets PyTorch's composite: its parts, not linear, reach the subclass."""
    seen = []

    class Logged(torch.Tensor):  # a wrapper subclass, as DTensor is
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

        def __init__(self, inner):
            self.inner = inner

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            seen.append(str(func))
            unwrap = lambda t: t.inner if isinstance(t, Logged) else t  # noqa: E731
            return func(*[unwrap(a) for a in args], **(kwargs or {}))

    y = _F.linear(Logged(torch.randn(3, 4).to(DEVICE)), torch.randn(5, 4).to(DEVICE))
    assert "aten.linear.default" not in seen and any("addmm" in op or "mm" in op for op in seen), seen
    assert y.shape == (3, 5)


@pytest.mark.parametrize("backward", ["linear", "rms_norm"])
def test_gradients_computed_on_host_aliases_are_device_memory(backward):
    """linear_backward and _fused_rms_norm_backward compute on host aliases: their
    results must be allocated by the device allocator, so that memory_allocated()
    counts them (and the core's capacity applies), as for every other kernel."""
    weight = torch.randn(512, 512, device=DEVICE, requires_grad=True)
    x = torch.randn(4, 512, device=DEVICE)
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    if backward == "linear":
        _F.linear(x, weight).sum().backward()
    else:
        _F.rms_norm(weight, [512], x[0], 1e-5).sum().backward()
    grown = torch.neuron.memory_allocated() - before
    assert grown >= weight.numel() * 4, grown  # weight.grad, 1 MiB, lives on
    assert torch.neuron.max_memory_allocated() >= before + grown


def test_rms_norm_and_its_backward_are_one_kernel_each(tracked):
    executed = _grads_on_both(lambda x, w: _F.rms_norm(x, [6], w, 1e-5), torch.randn(4, 6), torch.randn(6))
    assert executed.get("aten::_fused_rms_norm") == 1, executed
    assert executed.get("aten::_fused_rms_norm_backward") == 1, executed
    assert "aten::rsqrt" not in executed and "aten::pow.Tensor_Scalar" not in executed, executed


@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_of_a_16_bit_input_with_a_float32_weight_is_one_fused_kernel(tracked, input_dtype):
    """TorchNeuron raises both to float32 for one _fused_rms_norm (PyTorch's composite takes its
    unfused formula for mixed dtypes); the CPU computes in float32 as well: the same values."""
    x, w = torch.randn(4, 8).to(input_dtype), torch.randn(8)
    xd, wd = x.to(DEVICE).requires_grad_(), w.to(DEVICE).requires_grad_()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch_neuronx.clear_op_tracking()
    got = _F.rms_norm(xd, [8], wd, 1e-5)
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::_fused_rms_norm") == 1 and "aten::rsqrt" not in executed, executed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU's "Cannot dispatch to fused implementation"
        want = _F.rms_norm(xc, [8], wc, 1e-5)
    assert got.dtype == want.dtype == input_dtype
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=0, atol=0)
    grad = torch.randn(4, 8).to(input_dtype)
    got.backward(grad.to(DEVICE))
    want.backward(grad)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(wd.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        torch_neuronx.clear_op_tracking()
        _F.rms_norm(x.to(DEVICE), [8], w.to(DEVICE), 1e-5)
        assert torch_neuronx.get_executed_ops().get("aten::_fused_rms_norm") == 1


def test_max_backward_is_one_value_selecting_kernel(tracked):
    executed = _grads_on_both(lambda x: x.max(1)[0], torch.randn(4, 5))
    assert executed.get("aten::value_selecting_reduction_backward") == 1, executed


_WEIGHTS = torch.arange(8.0).view(4, 2)  # makes the gradient differ per element


@pytest.mark.parametrize("call, grad, index", [
    (lambda g, i: torch.ops.aten.index_select_backward(g, [4, 2], 0, i), torch.randn(3, 2), torch.tensor([1, 3, 3])),
    (lambda g, i: torch.ops.aten.value_selecting_reduction_backward(g, 0, i, [4, 2], False), torch.randn(2),
     torch.tensor([3, 0])),
], ids=["index_select_backward", "value_selecting_reduction_backward"])
def test_a_gradient_through_a_backward_composite_stays_exact(tracked, call, grad, index):
    # No autograd formula for these (the CPU differentiates the composite): a call whose
    # input requires grad runs the composite on the device too (ops/composites.py).
    executed = _grads_on_both(lambda g: call(g, index.to(g.device)) * _WEIGHTS.to(g.device), grad)
    assert not any("index_select_backward" in op or "value_selecting" in op for op in executed), executed


def test_composites_still_compile(tracked, fresh_dynamo):
    # The compiler decomposes them while tracing, as before they were native.
    def fn(x, w):
        return _F.rms_norm(_F.linear(torch.isfinite(x).float() * x, w), [5], None, 1e-5)

    compiled = torch.compile(fn, backend="neuron", fullgraph=True)
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    torch.testing.assert_close(compiled(x.to(DEVICE), w.to(DEVICE)).cpu(), fn(x, w), rtol=1e-5, atol=1e-5)
    assert torch_neuronx.get_fallback_ops() == {}


# ----------------------------------------------------------------- the command


def _ops(capsys, *argv) -> str:
    assert cli_main(["ops", *argv]) == 0
    return capsys.readouterr().out


def test_ops_command_prints_the_source(capsys):
    out = _ops(capsys, "linalg_qr")
    assert "TorchNeuron" in out and "cpu fallback, the same here" in out
    assert "test_cpu_fallback_registrations.py" in out
    record = json.loads(_ops(capsys, "linalg_qr", "--json"))["ops"][0]
    assert record["eager"] == "cpu fallback" and record["release"]["route"] == "cpu fallback"
    assert json.loads(_ops(capsys, "add", "--json"))["ops"][0]["release"] is None


def test_ops_command_lists_the_differences(capsys):
    out = _ops(capsys, "--differences")
    differing = {record.op for record in evidence.differences()}
    assert "_to_copy" in differing and not {"linear", "new_empty"} & differing
    assert "linalg_qr" not in differing
    for name in differing:
        assert f"  {name}: TorchNeuron:" in out
    listed = {op["op"] for op in json.loads(_ops(capsys, "--differences", "--json"))["ops"]}
    assert listed == differing


def test_ops_command_rejects_differences_with_a_name(capsys):
    assert cli_main(["ops", "linear", "--differences"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_the_page_lists_every_record():
    page = op_support.render_page()
    section = page[page.index("## What TorchNeuron does"):]
    for record in evidence.RECORDS:
        assert f"| aten::{record.op} | {record.route} |" in section
    assert "**differs**" in section
