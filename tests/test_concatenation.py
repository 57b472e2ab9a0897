"""Adaptive Eager Execution's queue (TORCH_NEURONX_ENABLE_CONCATENATION; csrc/Concatenation.h):
float32 elementwise add/sub/mul/div (with broadcast operands), sqrt, neg, abs, relu, reciprocal,
rsqrt, pow (exponents 2, 3, -2, 0.5, -0.5, -1), lerp, addcmul, addcdiv, fill and zero, exp, tanh,
sigmoid and silu, the activation gradients (threshold_backward, sigmoid_backward,
tanh_backward, silu_backward), and softmax, log_softmax and their gradients over the last dim, queued and run as one
launch when a value is needed or a matmul-class op (which joins the launch) is called. The reference is the same program on CPU tensors; the queued formulas are
PyTorch's own, so results are compared bit for bit where PyTorch computes one IEEE operation per
element (alpha 1, mul, div) and at float32 rounding (assert_close's float32 rtol 1.3e-6, atol 1e-5)
where PyTorch's CPU result depends on the instruction set (its fused multiply-adds on AVX2/AVX-512,
its vectorized sqrt, which is not correctly rounded, its SLEEF exp and tanh); the device's own exp
and tanh (csrc/FloatMath.h) are also held to their measured distance from the exact result.
bfloat16 calls are computed in float32 and rounded once, as PyTorch's kernels do: bit for bit where
PyTorch's bits do not depend on the CPU or an element's position, else within one bfloat16 rounding."""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import torch_neuronx
from torch_neuronx import _C

DEV = "neuron"


@contextlib.contextmanager
def concatenation(on: bool):
    """The queue on or off inside; as it was after (the suite may run with
    TORCH_NEURONX_ENABLE_CONCATENATION=1, and the tests after these must keep that)."""
    was = _C._concatenation_enabled()
    torch_neuronx.ops.set_concatenation(on)
    try:
        yield
    finally:
        torch_neuronx.ops.set_concatenation(was)


@pytest.fixture
def queueing():
    with concatenation(True):
        yield


def stats():
    return _C._concatenation_stats()[:2]


def queued_since(before) -> int:
    """Ops queued and run since `before` (a stats pair); runs what is queued."""
    _C._run_queued()
    return stats()[1] - before[1]


def chain(x, b):
    for i in range(20):
        x = x * 1.0001 if i % 2 else x + b
    return x


@pytest.mark.parametrize("shape", [(1024,), (3, 5, 7), (1,)])
def test_chain_runs_as_one_launch_and_matches_cpu_bit_for_bit(queueing, shape):
    a, b = torch.randn(shape), torch.randn(shape)
    before = stats()
    got = chain(a.to(DEV), b.to(DEV))
    assert stats() == before  # nothing has run yet
    assert torch.equal(got.cpu(), chain(a, b))
    assert stats()[0] - before[0] == 1 and stats()[1] - before[1] == 20


def test_every_overload_and_operand_kind_matches_cpu(queueing):
    a, b = torch.randn(64), torch.rand(64) + 0.5
    na, nb = a.to(DEV), b.to(DEV)
    before = stats()
    results = [na + nb, na - nb, na * nb, na / nb, na + 2, 3 - na, na * 0.5, na / 7, 1 / nb,
               na + torch.tensor(2.5), na * torch.tensor(3)]
    expected = [a + b, a - b, a * b, a / b, a + 2, 3 - a, a * 0.5, a / 7, 1 / b, a + torch.tensor(2.5),
                a * torch.tensor(3)]
    inplace, reference = a.to(DEV), a.clone()
    for op in ("add_", "sub_", "mul_", "div_"):
        getattr(inplace, op)(nb)
        getattr(reference, op)(b)
        getattr(inplace, op)(1.5)
        getattr(reference, op)(1.5)
    # Every call but `3 - na` (rsub: PyTorch passes the scalar first, on the CPU, so it runs unqueued);
    # `1 / nb` is reciprocal times 1 (both queued).
    assert queued_since(before) == len(results) + 8
    for got, want in zip(results, expected):
        assert torch.equal(got.cpu(), want)
    assert torch.equal(inplace.cpu(), reference)
    scaled = [na.add(nb, alpha=0.3), na.sub(nb, alpha=-2.5), na.clone().add_(nb, alpha=1e-3)]
    for got, want in zip(scaled, [a.add(b, alpha=0.3), a.sub(b, alpha=-2.5), a.clone().add_(b, alpha=1e-3)]):
        torch.testing.assert_close(got.cpu(), want, rtol=1.3e-6, atol=1e-7)


def test_inputs_written_after_queueing_keep_their_values_at_queue_time(queueing):
    x = torch.randn(32, device=DEV)
    x0 = x.cpu()
    y = x + 1            # queued: reads x as it is now
    x.add_(5)            # queued after it, in program order
    z = x * 2
    x.fill_(3)           # not queued: runs the queue first
    assert torch.equal(y.cpu(), x0 + 1)
    assert torch.equal(z.cpu(), (x0 + 5) * 2)
    assert torch.equal(x.cpu(), torch.full((32,), 3.0))


def test_a_queued_op_writes_the_memory_its_tensor_had_when_it_was_queued(queueing):
    """Program order when a tensor gets new memory (`.data = ...`, set_) after an op on it was
    queued: the op updates the old memory, as it does on CPU, and emptying the cache (which gives
    cached blocks back to the host, the old one among them) runs it first."""
    for replace in ("data", "set_"):
        ref = torch.full((4096,), 2.0)
        ref.mul_(3)
        x = torch.full((4096,), 2.0, device=DEV)
        keep = x.view(-1)  # another view of the old memory: what the queued op wrote must be there
        x.mul_(3)
        new = torch.full((4096,), 5.0, device=DEV)
        if replace == "data":
            x.data = new
        else:
            x.set_(new)
        assert torch.equal(keep.cpu(), ref), replace
        assert torch.equal(x.cpu(), torch.full((4096,), 5.0)), replace
        # The old memory with nothing else holding it: back in the cache, then to the host.
        y = torch.full((4096,), 2.0, device=DEV)
        y.mul_(3)
        y.data = torch.full((4096,), 7.0, device=DEV)
        before = stats()
        torch.neuron.empty_cache()
        assert stats()[1] > before[1], "empty_cache ran the queued op before releasing its memory"
        assert torch.equal(y.cpu(), torch.full((4096,), 7.0))


def test_every_way_of_reading_a_value_sees_the_queued_result(queueing):
    a = torch.randn(8)
    x = a.to(DEV) * 2
    assert x[3].item() == (a * 2)[3].item()
    x = a.to(DEV) * 3
    assert str(a * 3)[len("tensor("):-1] in repr(x)
    x = a.to(DEV) + 1
    assert torch.equal(x.sum().cpu(), (a + 1).sum())            # a native op reads it
    x = a.to(DEV) - 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's once-per-op warning
        assert torch.equal(torch.special.erfcx(x).cpu(), torch.special.erfcx(a - 1))  # a CPU fallback reads it
    x = a.to(DEV) / 3
    assert torch.equal(x.view(2, 4).t().contiguous().cpu(), (a / 3).view(2, 4).t().contiguous())
    x = a.to(DEV) * 5
    assert torch.equal(torch.from_numpy(x.cpu().numpy()), a * 5)


def test_a_program_read_on_another_thread_sees_the_queue(queueing):
    a = torch.randn(100)
    x = a.to(DEV) * 4
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(value=x.cpu()))
    thread.start()
    thread.join()
    assert torch.equal(seen["value"], a * 4)


def test_errors_are_raised_by_the_call_that_causes_them(queueing):
    x = torch.arange(6.0, device=DEV)
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor refer "
                                           "to a single memory location"):
        x[1:].add_(x[:-1])
    with pytest.raises(RuntimeError, match="must match the size"):
        x + torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(6)
    assert torch.equal(x.cpu(), torch.arange(6.0))


SCALAR_ARGUMENT_CALLS = {
    "add alpha beyond float32": lambda a, b: torch.add(a, b, alpha=1e300),
    "add_ alpha beyond float32": lambda a, b: a.clone().add_(b, alpha=1e300),
    "add complex alpha": lambda a, b: torch.add(a, b, alpha=1j),
    "sub_ complex alpha": lambda a, b: a.clone().sub_(b, alpha=2j),
    "lerp weight beyond float32": lambda a, b: torch.lerp(a, b, 1e300),
    "lerp_ complex weight": lambda a, b: a.clone().lerp_(b, 0.5j),
    "addcmul value beyond float32": lambda a, b: torch.addcmul(a, b, b, value=-1e300),
    "addcdiv_ complex value": lambda a, b: a.clone().addcdiv_(b, b, value=1j),
    "threshold_backward threshold beyond float32": lambda a, b: torch.ops.aten.threshold_backward(a, b, 1e300),
    "add alpha inf": lambda a, b: torch.add(a, b, alpha=float("inf")),
    "mul by a number beyond float32": lambda a, b: a * 1e300,
    "complex tensors, complex alpha": lambda a, b: torch.sub(a.to(torch.complex64), b.to(torch.complex64), alpha=1j),
    "complex tensors, complex weight": lambda a, b: a.to(torch.complex64).lerp_(b.to(torch.complex64), 0.5j),
    "fill_ beyond float32": lambda a, b: a.clone().fill_(1e300),
    "fill complex value": lambda a, b: torch.ops.aten.fill(a, 2j),
    "fill_ inf": lambda a, b: a.clone().fill_(float("-inf")),
}


@pytest.mark.parametrize("name", SCALAR_ARGUMENT_CALLS)
def test_scalar_arguments_pytorch_refuses_raise_its_error(queueing, name):
    """A number argument the float32 kernel cannot take (a complex number, a finite value beyond
    float32's range) is PyTorch's error, raised by the call, not a queued inf or NaN; what PyTorch
    accepts (inf, complex numbers on complex tensors, a wrapped number that overflows to inf)
    gives its result."""
    call = SCALAR_ARGUMENT_CALLS[name]
    a, b = torch.rand(8) + 0.5, torch.rand(8) + 0.5
    try:
        expected = call(a, b)
    except RuntimeError as error:
        with pytest.raises(RuntimeError) as got:
            call(a.to(DEV), b.to(DEV))
        assert str(got.value) == str(error)
    else:
        assert torch.equal(call(a.to(DEV), b.to(DEV)).cpu(), expected)


def test_autograd_through_queued_ops_matches_cpu(queueing):
    w = torch.randn(16, requires_grad=True)
    nw = w.detach().to(DEV).requires_grad_()
    before = stats()
    for t in (w, nw):
        ((t * 2 + 1) * t / 3 - t).sum().backward()
    assert queued_since(before) > 0
    assert torch.equal(nw.grad.cpu(), w.grad)


def test_not_queued_when_deterministic_profiling_or_off():
    x = torch.randn(16, device=DEV)
    before = stats()
    with concatenation(False):
        x * 2
    assert queued_since(before) == 0
    with concatenation(True):
        torch.use_deterministic_algorithms(True)
        try:
            y = x * 2
        finally:
            torch.use_deterministic_algorithms(False)
        with torch.profiler.profile() as prof:
            z = x + 1
        assert queued_since(before) == 0
        assert any(e.name == "aten::add" for e in prof.events())
        assert torch.equal(y.cpu(), x.cpu() * 2) and torch.equal(z.cpu(), x.cpu() + 1)


def test_launch_blocking_keeps_it_off(monkeypatch):
    was = _C._concatenation_enabled()
    monkeypatch.setenv("NEURON_LAUNCH_BLOCKING", "1")
    torch_neuronx.ops.set_concatenation(True)
    try:
        assert not _C._concatenation_enabled()
    finally:
        monkeypatch.delenv("NEURON_LAUNCH_BLOCKING")
        torch_neuronx.ops.set_concatenation(was)


def test_buffer_size_limit_runs_a_full_queue(monkeypatch):
    was = _C._concatenation_enabled()
    monkeypatch.setenv("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT", "5")
    torch_neuronx.ops.set_concatenation(True)
    try:
        x = torch.ones(4, device=DEV)
        before = stats()
        for _ in range(12):
            x = x + 1
        assert stats()[0] - before[0] == 2 and stats()[1] - before[1] == 10
        assert torch.equal(x.cpu(), torch.full((4,), 13.0))
        assert stats()[0] - before[0] == 3
    finally:
        monkeypatch.delenv("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT")
        torch_neuronx.ops.set_concatenation(was)  # and the limit back to its default


def test_synchronize_and_events_run_the_queue(queueing):
    x = torch.randn(64, device=DEV)
    before = stats()
    x * 2
    torch.neuron.synchronize()
    assert stats()[0] - before[0] == 1
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    x + 1
    end.record()
    assert stats()[0] - before[0] == 2
    end.synchronize()
    assert start.elapsed_time(end) >= 0


def test_compiled_graph_reads_a_queued_output(queueing):
    a = torch.randn(32)
    x = a.to(DEV) * 2 + 1
    compiled = torch.compile(lambda t: torch.sin(t) * 3, backend="neuron")
    torch.testing.assert_close(compiled(x).cpu(), torch.sin(a * 2 + 1) * 3, rtol=1e-6, atol=1e-6)


def test_queued_outputs_are_allocated_at_the_call(queueing):
    torch.neuron.synchronize()
    start = torch.neuron.memory_allocated()
    x = torch.ones(1024, device=DEV)
    y = x * 2
    assert torch.neuron.memory_allocated() - start == 2 * 4096
    del y
    _C._run_queued()
    assert torch.neuron.memory_allocated() - start == 4096


@pytest.mark.parametrize("value, enabled", [("1", True), ("0", False)])
def test_the_variable_switches_it_at_import(value, enabled):
    probe = ("import torch, torch_neuronx; from torch_neuronx import _C; "
             "x = torch.ones(3, device='neuron') * 2; print(_C._concatenation_enabled(), x.cpu().tolist())")
    env = {**__import__("os").environ, "TORCH_NEURONX_ENABLE_CONCATENATION": value}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == f"{enabled} [2.0, 2.0, 2.0]"


def test_executed_ops_name_each_launch_by_its_ops_joined_with_a_bar(queueing):
    """TorchNeuron lists a concatenated operation in get_executed_ops() under its ops' names joined
    by '|' (AWS's tests look for the bar); each call also counts under its own name."""
    x = torch.ones(4, device=DEV)
    torch_neuronx.clear_op_tracking()
    for _ in range(3):
        y = x * 2 + x
        y.add_(1)
        y.cpu()
    executed = torch_neuronx.get_executed_ops()
    assert executed["aten::mul.Tensor|aten::add.Tensor|aten::add_.Tensor"] == 3
    assert executed["aten::mul.Tensor"] == 3 and executed["aten::add_.Tensor"] == 3


def test_sqrt_lerp_addcmul_addcdiv_match_cpu(queueing):
    g = torch.Generator().manual_seed(5)
    a, b, c = torch.randn(300, generator=g), torch.randn(300, generator=g), torch.rand(300, generator=g) + 0.5
    na, nb, nc = a.to(DEV), b.to(DEV), c.to(DEV)
    before = stats()
    got = [torch.sqrt(nc), torch.lerp(na, nb, 0.2), torch.lerp(na, nb, 0.7), torch.addcmul(na, nb, nc, value=0.3),
           torch.addcdiv(na, nb, nc, value=-0.3), c.to(DEV).sqrt_(), a.to(DEV).lerp_(nb, 0.9),
           a.to(DEV).addcmul_(nb, nb, value=0.1), a.to(DEV).addcdiv_(nb, nc, value=2)]
    want = [torch.sqrt(c), torch.lerp(a, b, 0.2), torch.lerp(a, b, 0.7), torch.addcmul(a, b, c, value=0.3),
            torch.addcdiv(a, b, c, value=-0.3), c.clone().sqrt_(), a.clone().lerp_(b, 0.9),
            a.clone().addcmul_(b, b, value=0.1), a.clone().addcdiv_(b, c, value=2)]
    assert queued_since(before) == 9
    for x, y in zip(got, want):
        torch.testing.assert_close(x.cpu(), y)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        na[1:].addcmul_(na[:-1], nb[1:])
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        na[1:].lerp_(na[:-1], 0.5)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=1e-2, foreach=False),
    lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
    lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
], ids=["sgd", "adamw", "adam"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optimizer_steps_with_foreach_false_queue_and_match_cpu(queueing, make, dtype):
    g = torch.Generator().manual_seed(9)
    init = [torch.randn(32, generator=g).to(dtype) for _ in range(5)]
    grads = [[torch.randn(32, generator=g).to(dtype) for _ in init] for _ in range(3)]
    finals = []
    before = stats()
    for device in ("cpu", DEV):
        params = [t.clone().to(device).requires_grad_() for t in init]
        opt = make(params)
        for step in grads:
            for p, grad in zip(params, step):
                p.grad = grad.to(device)
            opt.step()
        finals.append([p.detach().cpu() for p in params])
    # bfloat16 SGD: its add_(..., alpha=-lr) and weight decay's add(..., alpha=wd) run unqueued (below)
    assert queued_since(before) >= 3 * 5 * (1 if dtype == torch.bfloat16 and isinstance(opt, torch.optim.SGD) else 3)
    for got, want in zip(finals[1], finals[0]):
        torch.testing.assert_close(got, want)


def test_a_compiled_graph_sees_queued_writes_to_an_input_it_read_before(queueing):
    """Compiled graphs keep the arrays they imported for a tensor's address: a queued in-place
    update of that tensor (an optimizer step between two compiled calls) must run before the
    next call reads it."""
    w = torch.ones(64, device=DEV)
    compiled = torch.compile(lambda t: t * 3, backend="neuron")
    assert torch.equal(compiled(w).cpu(), torch.full((64,), 3.0))
    w.add_(1)  # queued
    assert torch.equal(compiled(w).cpu(), torch.full((64,), 6.0))


# (self shape, other shape): the other operand, or self, repeats whole rows of the result.
BROADCASTS = [((4, 8), (8,)), ((8,), (4, 8)), ((2, 3, 4), (3, 4)), ((2, 3, 4), (1, 4)), ((5, 6), ()),
              ((), (5, 6)), ((5, 6), (1,)), ((1, 6), (6,)), ((3, 1, 4), (4,)), ((8,), (2, 1, 8)),
              ((4, 8), (2, 4, 8)),
              # several chunks of a tiled short row (csrc/Concatenation.cpp computeEntry), a last chunk
              # shorter than the others, and a row too long to tile
              ((300, 3), (3,)), ((600, 7), (1, 7)), ((5,), (400, 5)), ((3, 300), (300,))]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_operands_that_repeat_whole_rows_are_queued_and_match_cpu_bit_for_bit(queueing, shapes):
    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(shapes[0], generator=g), torch.rand(shapes[1], generator=g) + 0.5
    na, nb = a.to(DEV), b.to(DEV)
    before = stats()
    got = [na + nb, na - nb, na * nb, na / nb, na.sub(nb, alpha=2), nb - na, nb / na]
    want = [a + b, a - b, a * b, a / b, a.sub(b, alpha=2), b - a, b / a]
    inplace = None
    if a.numel() >= b.numel():  # the in-place forms need self to be the full operand
        inplace, reference = a.to(DEV), a.clone()
        inplace.mul_(nb).add_(nb, alpha=0.5).div_(nb)
        reference.mul_(b).add_(b, alpha=0.5).div_(b)
    assert queued_since(before) == len(got) + (3 if inplace is not None else 0)
    for x, y in zip(got, want):
        assert x.shape == y.shape and x.is_contiguous()
    # alpha 2: one fused multiply-add here, as PyTorch's CPU kernel on AVX2/AVX-512 only
    torch.testing.assert_close(got[4].cpu(), want[4])
    for x, y in zip(got[:4] + got[5:], want[:4] + want[5:]):
        assert torch.equal(x.cpu(), y)
    if inplace is not None:
        torch.testing.assert_close(inplace.cpu(), reference)


def test_a_repeated_operand_is_read_when_its_turn_comes(queueing):
    """A 0-dim or row operand written by a queued op before the call is read with that write."""
    x, s, row = torch.randn(4, 8), torch.tensor(2.0), torch.randn(8)
    nx, ns, nrow = x.to(DEV), s.to(DEV), row.to(DEV)
    ns.mul_(3)
    nrow.add_(1)
    got = nx * ns + nrow
    ns.add_(100)  # queued after: must not be seen
    nrow.zero_()
    assert torch.equal(got.cpu(), x * (s * 3) + (row + 1))


@pytest.mark.parametrize("shapes", [((3, 4, 8), (3, 1, 8)), ((4, 1), (1, 8)), ((2, 1, 8), (3, 8)), ((4, 1, 8), (3, 1))],
                         ids=str)
def test_other_broadcasts_run_unqueued_and_match_cpu(queueing, shapes):
    """(A [B, 1] column over [B, N], one value per row, is queued: tests/test_concatenation_layers.py.)"""
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    before = stats()
    got = a.to(DEV) * b.to(DEV)
    assert queued_since(before) == 0
    assert torch.equal(got.cpu(), a * b)


def test_an_in_place_op_that_would_broadcast_self_raises_as_on_cpu(queueing):
    with pytest.raises(RuntimeError, match=r"output with shape \[8\] doesn't match the broadcast shape \[4, 8\]"):
        torch.ones(8, device=DEV).add_(torch.ones(4, 8, device=DEV))
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        x[:3].add_(x[2])  # the repeated row lies inside the written rows: PyTorch refuses it


SPECIALS = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.25, -3.5, 1e-30, 1e30, float("inf"), float("-inf"), float("nan")])


@pytest.mark.parametrize("op", ["neg", "abs", "relu", "reciprocal", "rsqrt", "sqrt"])
def test_unary_ops_are_queued_and_match_cpu_including_special_values(queueing, op):
    g = torch.Generator().manual_seed(12)
    a = torch.cat([torch.randn(198, generator=g), SPECIALS]).reshape(11, 19)
    na = a.to(DEV)
    before = stats()
    got, got_inplace = getattr(na, op)(), getattr(a.to(DEV), op + "_")()
    assert queued_since(before) == 2
    want = getattr(a, op)()
    # one IEEE operation per element (rsqrt: 1 / sqrt, both correctly rounded) except PyTorch's
    # vectorized sqrt, which is not correctly rounded on every CPU
    rtol = 1.3e-6 if op == "sqrt" else 0
    for x in (got, got_inplace):
        torch.testing.assert_close(x.cpu(), want, rtol=rtol, atol=0, equal_nan=True)


FILL_VALUES = [2.5, -0.0, float("nan"), float("inf"), -float("inf"), 1e-45, 3, True, -7 * 2.0**100]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fill_and_zero_are_queued_and_write_cpus_bits(queueing, dtype):
    """fill_/fill (a number) and zero_/zero on float32 and bfloat16: the value's bits, its sign and NaN
    included (bfloat16: the number rounded to float32, then to nearest even, as c10::BFloat16 does)."""
    a = torch.randn(5, 7).to(dtype)
    na = a.to(DEV)
    for value in FILL_VALUES:
        before = stats()
        got = [a.to(DEV).fill_(value), torch.ops.aten.fill(na, value), a.to(DEV).zero_(), torch.ops.aten.zero(na)]
        assert queued_since(before) == 4
        want = [a.clone().fill_(value), torch.ops.aten.fill(a, value), a.clone().zero_(), torch.ops.aten.zero(a)]
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g.cpu().view(bits), w.view(bits)), (value, g, w)


def test_fill_keeps_program_order_views_and_float64_exactly(queueing):
    a = torch.arange(12.0)
    na = a.to(DEV)
    doubled = na * 2  # queued before the fill: reads the old values
    na[4:8].fill_(-1.0)  # a contiguous slice: queued, the rest untouched
    na[::3].zero_()  # strided: runs unqueued after the queue, in order
    a[4:8].fill_(-1.0)
    a[::3].zero_()
    assert torch.equal(doubled.cpu(), torch.arange(12.0) * 2)
    assert torch.equal(na.cpu(), a)
    third = torch.zeros(3, dtype=torch.float64, device=DEV).fill_(1 / 3)  # data movement: exact
    assert torch.equal(third.cpu(), torch.full((3,), 1 / 3, dtype=torch.float64))
    ints = torch.zeros(4, dtype=torch.int64, device=DEV).fill_(2**40 + 1)
    assert torch.equal(ints.cpu(), torch.full((4,), 2**40 + 1))


@pytest.mark.filterwarnings("ignore:.*float64 arithmetic")
def test_float16_float64_or_integer_calls_run_unqueued_and_match_cpu(queueing):
    x = torch.randn(6, 4)
    cases = [x.double(), x.half(), (x * 10).int()]  # strided ones: test_concatenation_views.py
    before = stats()
    for t in cases:
        for op in ("neg", "abs", "relu"):
            torch.testing.assert_close(getattr(t.to(DEV), op)().cpu(), getattr(t, op)())
    assert queued_since(before) == 0


@pytest.mark.parametrize("act", [torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.relu6,
                                 torch.nn.functional.silu], ids=str)
def test_activation_gradients_are_queued_and_match_cpu(queueing, act):
    g = torch.Generator().manual_seed(13)
    x, w, grad = torch.randn(16, 32, generator=g), torch.randn(32, 32, generator=g), torch.randn(16, 32, generator=g)
    results = []
    for device in ("cpu", DEV):
        xd, wd = x.clone().to(device).requires_grad_(), w.clone().to(device).requires_grad_()
        y = act(xd @ wd) * 2
        y.backward(grad.to(device))
        results.append([t.detach().cpu() for t in (y, xd.grad, wd.grad)])
    executed = torch_neuronx.get_executed_ops()
    names = {torch.relu: "threshold_backward", torch.sigmoid: "sigmoid_backward", torch.tanh: "tanh_backward",
             torch.nn.functional.silu: "silu_backward"}
    if act in names:
        name = names[act]
        assert any(f"aten::{name}" in key and "|" in key for key in executed), sorted(executed)
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


def test_relu_keeps_nan_and_the_threshold_gradient_passes_it(queueing):
    x = torch.tensor([float("nan"), -1.0, 0.0, 2.0], device=DEV, requires_grad=True)
    y = torch.relu(x)
    y.backward(torch.ones(4, device=DEV))
    assert torch.isnan(y.cpu()[0]) and y.cpu()[1:].tolist() == [0.0, 0.0, 2.0]
    # threshold_backward: the gradient flows where the input is not <= 0 (NaN included), as on CPU
    xc = x.detach().cpu().requires_grad_()
    torch.relu(xc).backward(torch.ones(4))
    assert torch.equal(x.grad.cpu(), xc.grad)


def _every_queued_op(g):
    """Each queued op once, on 1,000 values (specials included) and a repeated row; the results."""
    a = torch.cat([torch.randn(989, generator=g) * 10, SPECIALS]).reshape(40, 25).to(DEV)
    b = (torch.rand(40, 25, generator=g) + 0.5).to(DEV)
    row = torch.randn(25, generator=g).to(DEV)
    c = b.clone()
    return [a + b, a - row, a.add(b, alpha=0.37), a.sub(row, alpha=-1.7), a * row, a / b, a * 3.3, row - a,
            b.sqrt(), a.neg(), a.abs(), a.relu(), b.reciprocal(), b.rsqrt(), torch.lerp(a, b, 0.3),
            torch.lerp(a, b, 0.8), torch.addcmul(a, b, c, value=0.7), torch.addcdiv(a, b, c, value=-1.3),
            torch.ops.aten.threshold_backward(a, b - 1, 0.1), torch.ops.aten.sigmoid_backward(a, b),
            torch.ops.aten.tanh_backward(a, b), a.clone().add_(row, alpha=2.5), torch.ops.aten.fill(a, -0.0),
            torch.ops.aten.zero(a), a.exp(), a.tanh(), a.sigmoid(), torch.nn.functional.silu(a),
            torch.ops.aten.silu_backward(b, a), a ** 2, a ** 3, a ** -2, torch.softmax(b, -1),
            torch.log_softmax(b, -1), torch.ops.aten._softmax_backward_data(a, b, -1, torch.float32),
            torch.ops.aten._log_softmax_backward_data(a, -b, -1, torch.float32)]


def _every_queued_bfloat16_op(g):
    """The same, on bfloat16 (computed in float32, rounded once)."""
    a = torch.cat([torch.randn(989, generator=g) * 10, SPECIALS]).reshape(40, 25).bfloat16().to(DEV)
    b = (torch.rand(40, 25, generator=g) + 0.5).bfloat16().to(DEV)
    row = torch.randn(25, generator=g).bfloat16().to(DEV)
    return [a + b, a - row, a * 3.3, a / b, b.sqrt(), a.relu(), torch.lerp(a, b, 0.8),
            torch.addcmul(a, b, b, value=0.7), torch.addcdiv(a, b, b, value=-1.3), a.exp(), a.tanh(), a.sigmoid(),
            torch.nn.functional.silu(a), torch.ops.aten.silu_backward(b, a), a ** 2, torch.ops.aten.fill(a, 1 / 3)]


def test_the_loops_for_any_cpu_give_the_same_bits(queueing):
    """The queue's loops are built twice (any CPU of the architecture; x86-64 with AVX2 and FMA):
    every formula is elementwise and std::fma is correctly rounded, so both give the same bits
    (on a CPU without AVX2 and FMA both runs take the first)."""
    def every_op():
        return _every_queued_op(torch.Generator().manual_seed(21)) + _every_queued_bfloat16_op(
            torch.Generator().manual_seed(22))

    fast = [t.cpu() for t in every_op()]
    _C._any_cpu_loops(True)
    try:
        portable = [t.cpu() for t in every_op()]
    finally:
        _C._any_cpu_loops(False)
    for x, y in zip(fast, portable):
        bits = torch.int32 if x.dtype == torch.float32 else torch.int16
        assert x.dtype == y.dtype and torch.equal(x.view(bits), y.view(bits))


# -- the device thread (asynchronous execution) ---------------------------------------------------


@pytest.fixture
def small_queue(monkeypatch):
    """The queue on with room for 3 ops, so that chains hand batches to the device thread."""
    was = _C._concatenation_enabled()
    monkeypatch.setenv("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT", "3")
    torch_neuronx.ops.set_concatenation(True)
    try:
        yield
    finally:
        _C._concatenation_async(True)
        monkeypatch.delenv("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT")
        torch_neuronx.ops.set_concatenation(was)


def device_thread_launches() -> int:
    return _C._concatenation_stats()[3]


def test_a_queue_goes_to_the_device_thread_on_its_fresh_bytes_or_a_batch_worth_of_writes(queueing):
    """The byte limits (csrc/Concatenation.cpp): 512 KiB of out-of-place results hands the queue to
    the device thread, while in-place ops (which hold no new memory) count only towards 4 MiB of
    writes, so an optimizer step's few hundred KiB of in-place updates runs at the next read
    instead of being handed over just before it."""
    x = torch.randn(32768).to(DEV)  # 128 KiB
    _C._run_queued()
    before = device_thread_launches()
    for _ in range(6):  # 768 KiB written in place
        x.mul_(1.0)
    _C._run_queued()
    assert device_thread_launches() == before
    results = [x * 1.0 for _ in range(6)]  # 768 KiB of fresh results
    _C._run_queued()
    assert device_thread_launches() == before + 1
    expected = results[0].cpu()
    for _ in range(40):  # 5 MiB written in place
        x.add_(1.0)
        expected.add_(1.0)
    _C._run_queued()
    assert device_thread_launches() == before + 2
    assert torch.equal(x.cpu(), expected)


@pytest.mark.parametrize("n", [1024, 32768])
def test_full_queues_run_on_the_device_thread_with_the_same_bits(small_queue, n):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    results = {}
    for threaded in (True, False):
        _C._concatenation_async(threaded)
        before = device_thread_launches()
        x = a.to(DEV)
        for _ in range(5):
            x = chain(x, b.to(DEV))
        results[threaded] = x.cpu()
        ran_there = device_thread_launches() - before
        assert (ran_there >= 20) if threaded else (ran_there == 0), (threaded, ran_there)
    expected = a
    for _ in range(5):
        expected = chain(expected, b)
    assert torch.equal(results[True], expected) and torch.equal(results[False], expected)


def test_every_read_and_write_waits_for_the_device_thread(small_queue):
    """Values computed on the device thread, read or overwritten by the caller right after:
    a host copy, an unqueued op (sum, mm), an in-place op, a copy into a queued result."""
    g = torch.Generator().manual_seed(6)
    host = torch.randn(64, 64, generator=g)
    x = host.to(DEV)
    for i in range(40):
        x = x * 0.5 + 1
        host = host * 0.5 + 1
        if i % 5 == 0:
            assert torch.equal(x.cpu(), host)
        if i % 7 == 0:
            torch.testing.assert_close(x.sum().cpu(), host.sum())
            torch.testing.assert_close((x @ x).cpu(), host @ host)
        if i % 9 == 0:
            x.mul_(2)
            host.mul_(2)
        if i % 11 == 0:
            x.copy_(host.neg().to(DEV))
            host = host.neg()
    torch.neuron.synchronize()
    assert torch.equal(x.cpu(), host)


def test_threads_queueing_at_once_each_get_their_own_results(small_queue):
    g = torch.Generator().manual_seed(7)
    inputs = [(torch.randn(2048, generator=g), torch.randn(2048, generator=g)) for _ in range(4)]
    got = {}

    def work(i):
        a, b = inputs[i]
        x = a.to(DEV)
        for _ in range(10):
            x = chain(x, b.to(DEV))
        got[i] = x.cpu()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (a, b) in enumerate(inputs):
        expected = a
        for _ in range(10):
            expected = chain(expected, b)
        assert torch.equal(got[i], expected), i


def test_fork_waits_for_the_device_thread():
    """os.fork() while batches run on the device thread: the parent goes on with the right values
    and the child neither hangs nor inherits a half-computed batch."""
    script = """
import os, sys, torch, torch_neuronx
torch_neuronx.ops.set_concatenation(True)
a, b = torch.randn(32768), torch.randn(32768)
x, ref = a.to("neuron"), a.clone()
for _ in range(200):
    x, ref = x * 0.999 + b.to("neuron"), ref * 0.999 + b
pid = os.fork()
if pid == 0:
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert status == 0, status
assert torch.equal(x.cpu(), ref), "parent's values"
print("ok", torch_neuronx._C._concatenation_stats()[3] > 0)
"""
    env = {**__import__("os").environ, "TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT": "2"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "True"], out.stdout


TRANSCENDENTAL = {"exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "silu": torch.nn.functional.silu}
# Where the results leave float32's normal range or its exp's, and tanh's two formulas meet (0.625).
EDGES = torch.tensor([88.5, 88.72, 88.8, 89.5, -87.3, -88.8, -103.5, -104.5, 1e-6, -1e-6, 0.6249, -0.6251, 9.1, -20.0])


def _in_place(name, t):
    return torch.nn.functional.silu(t, inplace=True) if name == "silu" else getattr(t, name + "_")()


@pytest.mark.parametrize("name", sorted(TRANSCENDENTAL))
def test_transcendental_functions_are_queued_and_match_cpu_within_float32_rounding(queueing, name):
    """exp, tanh, sigmoid and silu run in the queue with the device's own float32 exp and tanh
    (csrc/FloatMath.h; sigmoid and silu are PyTorch's formulas on that exp). PyTorch's CPU results
    come from SLEEF's vector code or the C library, by CPU and by position, so the comparison is at
    float32 rounding; infinities, zeros' signs and NaN exactly."""
    g = torch.Generator().manual_seed(31)
    a = torch.cat([torch.randn(900, generator=g) * 10, torch.randn(80, generator=g) * 60, SPECIALS, EDGES])
    na = a.to(DEV)
    before = stats()
    got = [TRANSCENDENTAL[name](na), _in_place(name, a.to(DEV))]
    assert queued_since(before) == 2
    want = TRANSCENDENTAL[name](a)
    for x in got:
        x = x.cpu()
        torch.testing.assert_close(x, want, equal_nan=True)
        exact = ~torch.isfinite(want) | (want == 0)
        assert torch.equal(x[exact].view(torch.int32), want[exact].view(torch.int32)), (a[exact], x[exact], want[exact])


def _ulps_from_exact(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in units of the last place of float32 at the exact value (normal or subnormal);
    0 where both are the same infinity or NaN."""
    rounded = exact.float()
    _, exponent = torch.frexp(exact)
    ulp = torch.ldexp(torch.ones_like(exact), torch.clamp(exponent - 1, min=-126) - 23)
    err = (got.double() - exact).abs() / ulp
    same_special = (torch.isinf(rounded) & (got == rounded)) | (torch.isnan(exact) & torch.isnan(got))
    return torch.where(same_special, torch.zeros_like(err), err)


@pytest.mark.parametrize("name, bound", [("exp", 1.013), ("tanh", 1.33)])
def test_the_devices_exp_and_tanh_stay_within_their_measured_distance_of_the_exact_result(queueing, name, bound):
    """Measured once over every float32 input against the double result (exp 1.013 ulp at most,
    tanh 1.330; csrc/FloatMath.h); here a million random bit patterns and a dense sweep of the range
    where the results change, every op queued (32,768 values each)."""
    g = torch.Generator().manual_seed(32)
    patterns = torch.randint(-2**31, 2**31, (1 << 20,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    sweep = torch.linspace(-110.0, 92.0, 1 << 18) if name == "exp" else torch.linspace(-12.0, 12.0, 1 << 18)
    x = torch.cat([patterns, sweep, EDGES])
    before = stats()
    got = torch.cat([getattr(chunk.to(DEV), name)().cpu() for chunk in x.split(32768)])
    assert queued_since(before) == len(x.split(32768))
    exact = getattr(torch, name)(x.double())
    err = _ulps_from_exact(got, exact)
    assert err.max().item() <= bound, (x[err.argmax()].item(), got[err.argmax()].item(), exact[err.argmax()].item())
    if name == "tanh":  # odd: the sign of every result, -0.0 included, is the input's
        finite = ~torch.isnan(x)
        assert torch.equal(torch.signbit(got[finite]), torch.signbit(x[finite]))


def _new_gelu(x):
    """GPT-2's activation as Hugging Face writes it out (NewGELUActivation): eight elementwise ops."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.mark.parametrize("shape", [(1024,), (4, 96), (3, 5, 7)])
def test_activations_written_out_run_as_one_launch_and_match_cpu(queueing, shape):
    """GPT-2's GELU written out (pow, tanh and six arithmetic ops) and a SiLU-gated product (Llama's
    MLP activation) each queue whole: one launch per read, results at float32 rounding of CPU's."""
    g = torch.Generator().manual_seed(33)
    x, up = torch.randn(shape, generator=g) * 3, torch.randn(shape, generator=g)
    nx, nup = x.to(DEV), up.to(DEV)
    for fn, args, cpu_args, ops in [(_new_gelu, (nx,), (x,), 8),
                                     (lambda a, b: torch.nn.functional.silu(a) * b, (nx, nup), (x, up), 2)]:
        _C._run_queued()
        launches, queued = stats()
        got = fn(*args).cpu()
        assert stats()[0] - launches == 1 and stats()[1] - queued == ops
        torch.testing.assert_close(got, fn(*cpu_args))


@pytest.mark.parametrize("exponent", [2, 3, -2, 0.5, -0.5, -1, 2.0, 3.0])
def test_pow_with_an_exponent_pytorch_computes_by_formula_is_queued_bit_for_bit(queueing, exponent):
    """PyTorch's CPU pow computes x * x, x * x * x, 1 / (x * x), sqrt, 1 / sqrt and 1 / x for these
    exponents, one IEEE operation at a time: the queue gives its bits (sqrt: at float32 rounding, as
    PyTorch's vectorized sqrt is not correctly rounded on every CPU)."""
    g = torch.Generator().manual_seed(34)
    a = torch.cat([torch.randn(180, generator=g) * 10, SPECIALS, torch.tensor([1e13, -1e13, 1e-13, -1e-13, 3e38, 1e-40])])
    na = a.to(DEV)
    before = stats()
    got = [na ** exponent, torch.pow(na, exponent), a.to(DEV).pow_(exponent)]
    assert queued_since(before) == 3
    want = a ** exponent
    rtol = 1.3e-6 if exponent == 0.5 else 0
    for x in got:
        torch.testing.assert_close(x.cpu(), want, rtol=rtol, atol=0, equal_nan=True)


@pytest.mark.parametrize("exponent", [2.5, 1, 0, -3, 4.0])
def test_pow_with_other_exponents_runs_unqueued_and_matches_cpu(queueing, exponent):
    a = torch.rand(50) * 4 + 0.1
    before = stats()
    got = a.to(DEV) ** exponent
    assert queued_since(before) == 0
    torch.testing.assert_close(got.cpu(), a ** exponent)


# bfloat16 calls PyTorch's CPU kernels compute in float32 and round once, as the queue does: the same
# bits (NaN compared as NaN: PyTorch writes 0x7FC0 or 0xFFFF by the element's position).
BF16_EXACT = {
    "add": lambda a, b, c: a + b, "sub": lambda a, b, c: a - b, "mul": lambda a, b, c: a * b,
    "div": lambda a, b, c: a / b, "add_number": lambda a, b, c: a + 2.5, "mul_number": lambda a, b, c: a * 1.0001,
    "div_number": lambda a, b, c: a / 7, "add_row": lambda a, b, c: a + b[0], "sqrt": lambda a, b, c: c.sqrt(), "neg": lambda a, b, c: -a,
    "abs": lambda a, b, c: a.abs(), "relu": lambda a, b, c: a.relu(), "reciprocal": lambda a, b, c: c.reciprocal(),
    "pow2": lambda a, b, c: a ** 2, "pow_half": lambda a, b, c: c ** 0.5, "pow_minus_one": lambda a, b, c: a ** -1,
    "addcdiv": lambda a, b, c: torch.addcdiv(a, b, c, value=-1.3),
    "threshold_backward": lambda a, b, c: torch.ops.aten.threshold_backward(a, b, 0.1),
    "sigmoid_backward": lambda a, b, c: torch.ops.aten.sigmoid_backward(a, c),
    "tanh_backward": lambda a, b, c: torch.ops.aten.tanh_backward(a, c),
    "fill": lambda a, b, c: torch.ops.aten.fill(a, 1 / 3), "fill_nan": lambda a, b, c: torch.ops.aten.fill(a, float("nan")),
    "zero": lambda a, b, c: torch.ops.aten.zero(a), "add_inplace": lambda a, b, c: a.clone().add_(b),
}
# Within bfloat16 rounding of the exact result: PyTorch's addcmul and lerp are fused multiply-adds on
# AVX2 and AVX-512, not with ATEN_CPU_CAPABILITY=default (the queue's lerp is one on every CPU, its
# addcmul is not), its exp/tanh are SLEEF's.
BF16_ROUNDED = {
    "lerp_small": lambda a, b, c: torch.lerp(a, b, 0.3), "lerp_large": lambda a, b, c: torch.lerp(a, b, 0.8),
    "addcmul": lambda a, b, c: torch.addcmul(a, b, c, value=0.7), "exp": lambda a, b, c: a.exp(),
    "tanh": lambda a, b, c: a.tanh(), "sigmoid": lambda a, b, c: a.sigmoid(),
    "silu": lambda a, b, c: torch.nn.functional.silu(a),
    "silu_backward": lambda a, b, c: torch.ops.aten.silu_backward(b, a),
}


def _bf16_operands(shape):
    g = torch.Generator().manual_seed(35)
    n = math.prod(shape)
    specials = torch.cat([SPECIALS, torch.tensor([1e-40, -1e-40, 3e38, -3e38])])
    a = torch.cat([torch.randn(n - len(specials), generator=g) * 10, specials]).reshape(shape)
    b = (torch.randn(shape, generator=g) * 10)
    c = torch.rand(shape, generator=g) + 0.5
    return [t.bfloat16() for t in (a, b, c)]


@pytest.mark.parametrize("shape", [(4096 + 21,), (64, 13)])
@pytest.mark.parametrize("name", sorted(BF16_EXACT) + sorted(BF16_ROUNDED))
def test_bfloat16_calls_are_queued_and_match_cpu(queueing, name, shape):
    """(64, 13): 832 elements, every one in PyTorch's vector loop (AVX2 and AVX-512); 4,117: a tail too."""
    cpu = _bf16_operands(shape)
    fn = BF16_EXACT.get(name) or BF16_ROUNDED[name]
    before = stats()
    got = fn(*(t.to(DEV) for t in cpu)).cpu()
    assert queued_since(before) >= 1
    want = fn(*cpu)
    assert got.dtype == want.dtype == torch.bfloat16
    if name in BF16_EXACT:
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
        return
    exact = fn(*(t.double() for t in cpu))  # the formula in float64: ours is within one bfloat16 rounding
    torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-5, equal_nan=True)
    if math.prod(shape) % 64 == 0:
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("n", [4096 + 21, 25])
def test_bfloat16_add_and_sub_with_an_alpha_other_than_one_run_unqueued(queueing, n):
    """PyTorch's bfloat16 add/sub with alpha != 1 compute a float32 fused multiply-add in its vector loop
    but bfloat16 steps in its scalar loop (a tensor's last elements, all of a small one): results that
    differ by more than a rounding where the terms cancel (op_db's add, bfloat16, 25 elements). They
    run unqueued, with CPU's bits; alpha 1 is one rounding either way, and queued."""
    a, b, _ = _bf16_operands((n,))
    na, nb = a.to(DEV), b.to(DEV)
    before = stats()
    got = [na.add(nb, alpha=0.37), na.sub(nb, alpha=1.7), a.to(DEV).add_(nb, alpha=-0.3)]
    assert queued_since(before) == 0
    want = [a.add(b, alpha=0.37), a.sub(b, alpha=1.7), a.clone().add_(b, alpha=-0.3)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)
    before = stats()
    got = na.add(nb, alpha=1).cpu()
    assert queued_since(before) == 1 and torch.equal(got.view(torch.int16), a.add(b).view(torch.int16))


@pytest.mark.parametrize("name", ["rsqrt", "cube", "inverse_square", "mixed_dtypes", "float16"])
def test_bfloat16_calls_pytorch_computes_in_bfloat16_steps_run_unqueued(queueing, name):
    """rsqrt and pow's exponents 3 and -2 are computed by PyTorch's CPU kernel in bfloat16 arithmetic,
    rounding after each step; a bfloat16 and a float32 operand promote to float32; float16 is not
    queued: all run unqueued, with CPU's bits."""
    a, b, c = _bf16_operands((257,))
    fn = {"rsqrt": lambda a, b, c: c.rsqrt(), "cube": lambda a, b, c: a ** 3, "inverse_square": lambda a, b, c: a ** -2,
          "mixed_dtypes": lambda a, b, c: a + b.float(), "float16": lambda a, b, c: a.half() * c.half()}[name]
    before = stats()
    got = fn(a.to(DEV), b.to(DEV), c.to(DEV)).cpu()
    assert queued_since(before) == 0
    want = fn(a, b, c)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_bfloat16_training_step_queues_and_matches_cpu(queueing):
    """A small SiLU MLP in bfloat16: forward, backward and an AdamW(foreach=False) step, against CPU."""
    results = []
    for device in ("cpu", DEV):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.SiLU(), torch.nn.Linear(64, 16)).bfloat16()
        model = model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        g = torch.Generator().manual_seed(1)
        x, target = torch.randn(8, 32, generator=g).bfloat16().to(device), torch.randn(8, 16, generator=g).bfloat16().to(device)
        before = stats()
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), target).backward()
            opt.step()
        if device == DEV:
            assert queued_since(before) > 20
        results.append([p.detach().cpu() for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)


# ------------------------------------------------- matmul-class ops end a sequence and join it

def executed_launches():
    """get_executed_ops()'s concatenated launches: name -> count."""
    return {name: count for name, count in torch_neuronx.get_executed_ops().items() if "|" in name}


MATMUL_CLASS_CALLS = {
    # name in get_executed_ops(): (the call on a queued operand `q` and inputs, its inputs' shapes)
    "aten::mm": (lambda q, b: q @ b, [(6, 8), (8, 5)]),
    "aten::bmm": (lambda q, b: torch.bmm(q, b), [(2, 6, 8), (2, 8, 5)]),
    "aten::addmm": (lambda q, b, c: torch.addmm(c, q, b), [(6, 8), (8, 5), (6, 5)]),
    "aten::baddbmm": (lambda q, b, c: torch.baddbmm(c, q, b), [(2, 6, 8), (2, 8, 5), (2, 6, 5)]),
    # linear: csrc/Linear.cpp's one-row kernel and the alias kernel's (a batch of rows)
    "aten::linear": (lambda q, w: torch.nn.functional.linear(q, w), [(8,), (5, 8)]),
    "aten::linear ": (lambda q, w, b: torch.nn.functional.linear(q, w, b), [(3, 4, 8), (5, 8), (5,)]),
    "aten::convolution_overrideable": (lambda q, w: torch.nn.functional.conv2d(q, w, padding=1),
                                       [(1, 3, 6, 6), (4, 3, 3, 3)]),
}


@pytest.mark.parametrize("name", MATMUL_CLASS_CALLS)
def test_a_matmul_class_op_ends_the_queued_sequence_and_joins_its_launch(queueing, name):
    """TorchNeuron's MatMulToMatMul rule: the ops queued before a matmul-class call run with it, as
    one launch named "<queued ops>|<the call>"; the results are CPU's within float32 rounding (the
    one-row linear is csrc/Gemv.cpp's own loop, whose order of summation differs)."""
    call, shapes = MATMUL_CLASS_CALLS[name]
    g = torch.Generator().manual_seed(21)
    inputs = [torch.randn(s, generator=g) for s in shapes]
    expected = call(inputs[0] + 1, *inputs[1:])
    on_device = [t.to(DEV) for t in inputs]
    _C._run_queued()
    torch_neuronx.clear_op_tracking()
    before = stats()
    got = call(on_device[0] + 1, *on_device[1:])
    assert stats()[0] - before[0] == 1 and stats()[1] - before[1] == 1  # one launch; the add was queued
    assert executed_launches() == {"aten::add.Tensor|" + name.strip(): 1}
    torch.testing.assert_close(got.cpu(), expected, rtol=1.3e-6, atol=1e-5)


def test_linear_backward_joins_the_queued_gradient(queueing):
    g = torch.Generator().manual_seed(22)
    x, w, grad = torch.randn(4, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(4, 5, generator=g)
    grads = []
    for dev in ("cpu", DEV):
        xd, wd = x.to(dev).detach().requires_grad_(), w.to(dev).detach().requires_grad_()
        y = torch.nn.functional.linear(xd, wd)
        _C._run_queued()
        torch_neuronx.clear_op_tracking()
        y.backward(grad.to(dev) * 2)
        grads.append((xd.grad.cpu(), wd.grad.cpu()))
    assert executed_launches() == {"aten::mul.Tensor|aten::linear_backward": 1}
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_nothing_queued_a_matmul_runs_as_its_own_launch(queueing):
    a, b = torch.randn(6, 8, device=DEV), torch.randn(8, 5, device=DEV)
    _C._run_queued()
    torch_neuronx.clear_op_tracking()
    before = stats()
    (a @ b).cpu()
    assert stats() == before and executed_launches() == {}


def test_a_failing_matmul_raises_its_error_and_the_queued_ops_still_ran(queueing):
    a = torch.randn(6, 8)
    x = a.to(DEV) * 3
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied \(6x8 and 7x5\)"):
        x @ torch.randn(7, 5, device=DEV)
    assert torch.equal(x.cpu(), a * 3)


# ------------------------------------------------- tensors above PyTorch's grain size

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [32769, 65536, 131072])
def test_tensors_above_the_grain_size_are_queued_split_across_threads_bit_for_bit(queueing, threads, n):
    """Up to 131,072 elements are queued; above PyTorch's grain size (32,768) an op's loop is split
    across the intra-op threads by whole rows, and gives the same bits on any split."""
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n // 128 if n % 128 == 0 else n, generator=g)
        x = x.reshape(-1, 128) if n % 128 == 0 else x
        bias = torch.randn(x.shape[-1], generator=g)
        nx, nb = x.to(DEV), bias.to(DEV)
        before = stats()
        got = torch.relu(chain(nx, nb)) * 0.5 - nb
        assert queued_since(before) == 23
        assert torch.equal(got.cpu(), torch.relu(chain(x, bias)) * 0.5 - bias)
    finally:
        torch.set_num_threads(was)


def test_tensors_above_the_limit_run_unqueued_and_match_cpu(queueing):
    x = torch.randn(131073)
    before = stats()
    assert torch.equal((x.to(DEV) * 2 + 1).cpu(), x * 2 + 1)
    assert queued_since(before) == 0


# ------------------------------------------------- softmax over the last dim

SOFTMAX_SHAPES = [(8, 64, 64), (3, 5), (2, 1000), (4, 33), (1,), (7, 1), (2, 3, 17)]
# softmax and log_softmax: the forward, and the gradient's op.
SOFTMAXES = {"softmax": (torch.softmax, torch.ops.aten._softmax_backward_data),
             "log_softmax": (torch.log_softmax, torch.ops.aten._log_softmax_backward_data)}


@pytest.mark.parametrize("kind", sorted(SOFTMAXES))
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
@pytest.mark.parametrize("dim", [-1, "last"])
def test_softmax_over_the_last_dim_is_queued_and_matches_cpu(queueing, kind, shape, dim):
    """Computed as PyTorch's kernel computes it (max, exp(x - max), sum, times its reciprocal; for
    log_softmax (x - max) - log(sum)) with the device's exp and its own order of summation: within
    float32 rounding of CPU's."""
    forward = SOFTMAXES[kind][0]
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[-1])
    x = torch.randn(shape, generator=g) * 4
    d = len(shape) - 1 if dim == "last" else dim
    before = stats()
    got = forward(x.to(DEV) * 0.5, dim=d)
    assert queued_since(before) == 2
    # log_softmax near 0 (a row dominated by one value): its float32 rounding, not a relative one
    torch.testing.assert_close(got.cpu(), forward(x * 0.5, dim=d), rtol=1.3e-6, atol=1e-7 if kind == "softmax" else 1e-6)


@pytest.mark.parametrize("kind", sorted(SOFTMAXES))
@pytest.mark.parametrize("shape", [(8, 64, 64), (3, 5), (2, 1000), (1,)], ids=str)
def test_softmax_gradient_over_the_last_dim_is_queued_and_matches_cpu(queueing, kind, shape):
    """_softmax_backward_data as PyTorch's kernel computes it: output * (grad - sum(grad * output));
    _log_softmax_backward_data: grad - exp(output) * sum(grad)."""
    forward, backward = SOFTMAXES[kind]
    g = torch.Generator().manual_seed(shape[-1])
    x, grad = torch.randn(shape, generator=g) * 3, torch.randn(shape, generator=g)
    y = forward(x, dim=-1)
    before = stats()
    got = backward(grad.to(DEV) * 1, y.to(DEV), -1, torch.float32)
    assert queued_since(before) == 2
    expected = backward(grad, y, -1, torch.float32)
    torch.testing.assert_close(got.cpu(), expected, rtol=1.3e-6, atol=1e-6)


def test_cross_entropy_forward_and_backward_match_cpu_with_log_softmax_queued(queueing):
    """A language model's loss: log_softmax queued (nll_loss is not: it runs the queue first)."""
    g = torch.Generator().manual_seed(31)
    logits, target = torch.randn(6, 50, generator=g), torch.randint(0, 50, (6,), generator=g)
    results = []
    for dev in ("cpu", DEV):
        x = logits.clone().to(dev).requires_grad_()
        loss = torch.nn.functional.cross_entropy(x * 2, target.to(dev))
        loss.backward()
        results.append((loss.detach().cpu(), x.grad.cpu()))
    torch.testing.assert_close(results[1], results[0], rtol=1.3e-6, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(SOFTMAXES))
def test_softmax_gradient_of_other_dims_or_dtypes_runs_unqueued_and_matches_cpu(queueing, kind):
    forward, backward = SOFTMAXES[kind]
    x, grad = torch.randn(4, 6, 5), torch.randn(4, 6, 5)
    cases = [(1, torch.float32, torch.float32), (-1, torch.bfloat16, torch.bfloat16), (-1, torch.float16, torch.float32)]
    before = stats()
    for dim, dtype, input_dtype in cases:
        y = forward(x, dim=dim).to(dtype)
        call = lambda t, o: backward(t, o, dim, input_dtype)  # noqa: E731
        torch.testing.assert_close(call(grad.to(dtype).to(DEV), y.to(DEV)).cpu(), call(grad.to(dtype), y))
    assert queued_since(before) == 0


@pytest.mark.parametrize("kind", sorted(SOFTMAXES))
def test_softmax_rows_with_nan_or_infinities_give_cpus_result(queueing, kind):
    forward = SOFTMAXES[kind][0]
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, inf, 2.0], [-inf, -inf, -inf], [0.0, 0.0, -inf], [nan, 1.0, 2.0], [1e30, -1e30, 0.0]])
    before = stats()
    got = forward(x.to(DEV) + 0, dim=-1)
    assert queued_since(before) == 2
    torch.testing.assert_close(got.cpu(), forward(x, dim=-1), equal_nan=True)


@pytest.mark.filterwarnings("ignore:.*float64 arithmetic")
@pytest.mark.parametrize("kind", sorted(SOFTMAXES))
def test_softmax_over_other_dims_dtypes_or_strides_runs_unqueued_and_matches_cpu(queueing, kind):
    forward = SOFTMAXES[kind][0]
    x = torch.randn(4, 6, 5)
    cases = [(x, 1), (x, 0), (x.transpose(1, 2), -1), (x.bfloat16(), -1), (x.half(), -1), (x.double(), -1)]
    before = stats()
    for t, dim in cases:
        torch.testing.assert_close(forward(t.to(DEV), dim=dim).cpu(), forward(t, dim=dim))
    assert queued_since(before) == 0


def test_softmax_errors_are_pytorchs(queueing):
    x = torch.randn(3, 4)
    for call in (lambda t: torch._softmax(t, -1, True), lambda t: torch.softmax(t, dim=2),
                 lambda t: torch._log_softmax(t, -1, True), lambda t: torch.log_softmax(t, dim=2)):
        with pytest.raises((RuntimeError, IndexError)) as expected:
            call(x)
        with pytest.raises(type(expected.value)) as got:
            call(x.to(DEV))
        assert str(got.value) == str(expected.value)


def test_attention_scores_scale_softmax_and_bmm_run_as_one_launch(queueing):
    """scores * scale, softmax and the product with the values: one launch, as TorchNeuron joins
    them; the gradients through it match CPU's."""
    g = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(2, 16, 8, generator=g) for _ in range(3))
    outs = []
    for dev in ("cpu", DEV):
        qd, kd, vd = (t.to(dev).detach().requires_grad_() for t in (q, k, v))
        scores = torch.bmm(qd, kd.transpose(1, 2))
        _C._run_queued()
        torch_neuronx.clear_op_tracking()
        out = torch.bmm(torch.softmax(scores * 8 ** -0.5, dim=-1), vd)
        launches = executed_launches()
        out.sum().backward()
        outs.append([out.detach().cpu()] + [t.grad.cpu() for t in (qd, kd, vd)])
    assert launches == {"aten::mul.Tensor|aten::_softmax|aten::bmm": 1}
    torch.testing.assert_close(outs[1], outs[0], rtol=1.3e-6, atol=1e-5)
