"""The foreach ops queued by Adaptive Eager Execution (csrc/Foreach.cpp): torch.optim's default path on
the device (foreach=True, as for CUDA). A foreach call queues one op per element of its list, each as
the single-tensor op would be queued (tests/test_concatenation.py), all of the call or none of it.
The reference is the same call on CPU tensors, whose kernels are PyTorch's "slow path" (the
single-tensor op on each element in turn): bit for bit where PyTorch computes one IEEE operation per
element, within float32 rounding (assert_close's float32 tolerance) where its CPU result depends on
the instruction set (addcmul's fused multiply-add, the transcendental functions); bfloat16 within one
bfloat16 rounding."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx
from torch_neuronx import _C

from test_concatenation import concatenation, queued_since, queueing, stats  # noqa: F401 (fixture)

DEV = "neuron"
SHAPES = [(5,), (3, 7), (1,), (64, 33)]


def _lists(dtype=torch.float32, count=3, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    lists = []
    for _ in range(count):
        ts = [torch.randn(shape, generator=g) for shape in SHAPES]
        lists.append([(t.abs() + 0.5 if positive else t).to(dtype) for t in ts])
    return lists


def _run(fn, lists, device):
    """fn on copies of `lists` moved to `device`: its result (or the first list, for an in-place call)."""
    moved = [[t.clone().to(device) for t in ts] for ts in lists]
    out = fn(*moved)
    return [t.cpu() for t in (moved[0] if out is None else out)]


# (name, call, exact): exact where PyTorch's CPU kernel computes one IEEE operation per element.
CALLS = [
    ("add_.Scalar", lambda a, b, c: torch._foreach_add_(a, 0.75), True),
    ("add.Scalar int", lambda a, b, c: torch._foreach_add(a, 2), True),
    ("sub_.Scalar", lambda a, b, c: torch._foreach_sub_(a, 1.25), True),
    ("mul_.Scalar", lambda a, b, c: torch._foreach_mul_(a, 0.9), True),
    ("mul.Scalar", lambda a, b, c: torch._foreach_mul(a, -3.5), True),
    ("div_.Scalar", lambda a, b, c: torch._foreach_div_(a, 7.0), True),
    ("add_.ScalarList", lambda a, b, c: torch._foreach_add_(a, [0.1, -2, 3.5, 1e-3]), True),
    ("sub.ScalarList", lambda a, b, c: torch._foreach_sub(a, [0.1, -2, 3.5, 1e-3]), True),
    ("mul_.ScalarList", lambda a, b, c: torch._foreach_mul_(a, [0.5, 2, -1.5, 3.0]), True),
    ("div.ScalarList", lambda a, b, c: torch._foreach_div(a, [0.5, 2, -1.5, 3.0]), True),
    ("add_.List", lambda a, b, c: torch._foreach_add_(a, b), True),
    ("add_.List alpha", lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.01), False),
    ("sub.List alpha", lambda a, b, c: torch._foreach_sub(a, b, alpha=2.5), False),
    ("mul_.List", lambda a, b, c: torch._foreach_mul_(a, b), True),
    ("div.List", lambda a, b, c: torch._foreach_div(a, b), True),
    ("mul_.Tensor", lambda a, b, c: torch._foreach_mul_(a, b[3][0, 0].clone()), True),
    ("div.Tensor", lambda a, b, c: torch._foreach_div(a, b[3][0, 0].clone()), True),
    ("add_.Tensor", lambda a, b, c: torch._foreach_add_(a, b[3][1, 2].clone(), alpha=0.5), False),
    ("sqrt", lambda a, b, c: torch._foreach_sqrt(torch._foreach_abs(a)), False),
    ("sqrt_", lambda a, b, c: torch._foreach_sqrt_(torch._foreach_abs(a)), False),
    ("neg_", lambda a, b, c: torch._foreach_neg_(a), True),
    ("abs", lambda a, b, c: torch._foreach_abs(a), True),
    ("reciprocal", lambda a, b, c: torch._foreach_reciprocal(a), True),
    ("exp_", lambda a, b, c: torch._foreach_exp_(a), False),
    ("sigmoid", lambda a, b, c: torch._foreach_sigmoid(a), False),
    ("tanh_", lambda a, b, c: torch._foreach_tanh_(a), False),
    ("zero_", lambda a, b, c: torch._foreach_zero_(a), True),
    ("lerp_.Scalar", lambda a, b, c: torch._foreach_lerp_(a, b, 0.1), False),
    ("lerp.Scalar", lambda a, b, c: torch._foreach_lerp(a, b, 0.8), False),
    ("addcmul_.Scalar", lambda a, b, c: torch._foreach_addcmul_(a, b, c, 0.001), False),
    ("addcmul.ScalarList", lambda a, b, c: torch._foreach_addcmul(a, b, c, [1, 0.5, -2, 3]), False),
    ("addcdiv_.Scalar", lambda a, b, c: torch._foreach_addcdiv_(a, b, c, -0.5), True),
    ("addcdiv.ScalarList", lambda a, b, c: torch._foreach_addcdiv(a, b, c, [1, 0.5, -2, 3]), True),
]


@pytest.mark.parametrize("name, call, exact", CALLS, ids=[c[0] for c in CALLS])
def test_every_queued_foreach_overload_matches_cpu(queueing, name, call, exact):
    lists = _lists(positive=name.startswith(("div", "reciprocal", "addcdiv")))
    want = _run(call, lists, "cpu")
    before = stats()
    got = _run(call, lists, DEV)
    assert queued_since(before) >= len(SHAPES)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype and x.shape == y.shape
        if exact:
            assert torch.equal(x, y), name
        else:
            torch.testing.assert_close(x, y)


BF16_QUEUED = ["add_.List", "mul_.List", "div.List", "lerp_.Scalar", "addcmul_.Scalar", "addcdiv_.Scalar", "sqrt",
               "neg_", "zero_"]
# PyTorch's CPU foreach kernels read a number on bfloat16 otherwise than its single-tensor ops
# (_foreach_mul_ rounds 0.9 to bfloat16 first, mul_ does not): these run unqueued, and give its bits.
BF16_NUMBERS = ["add_.Scalar", "mul_.Scalar", "div_.Scalar", "mul_.ScalarList", "sub.ScalarList"]


@pytest.mark.parametrize("name", BF16_QUEUED + BF16_NUMBERS)
def test_bfloat16_foreach_calls_match_cpu_queued_unless_a_number_is_the_operand(queueing, name):
    call = dict((c[0], c[1]) for c in CALLS)[name]
    lists = _lists(torch.bfloat16, positive=name.startswith(("div", "addcdiv")))
    want = _run(call, lists, "cpu")
    before = stats()
    got = _run(call, lists, DEV)
    queued = queued_since(before)
    assert queued >= len(SHAPES) if name in BF16_QUEUED else queued == 0
    for x, y in zip(got, want):
        if name in BF16_NUMBERS:
            assert torch.equal(x, y)
        else:
            torch.testing.assert_close(x, y, rtol=2 ** -8, atol=1e-5)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=1e-2, foreach=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3, foreach=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, foreach=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2, foreach=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_optimizer_steps_with_foreach_true_queue_and_match_cpu(queueing, name, dtype):
    g = torch.Generator().manual_seed(3)
    init = [torch.randn(shape, generator=g).to(dtype) for shape in SHAPES]
    grads = [[torch.randn(t.shape, generator=g).to(dtype) for t in init] for _ in range(3)]
    finals = []
    before = stats()
    for device in ("cpu", DEV):
        params = [t.clone().to(device).requires_grad_() for t in init]
        opt = OPTIMIZERS[name](params)
        for step in grads:
            for p, grad in zip(params, step):
                p.grad = grad.clone().to(device)
            opt.step()
        finals.append([p.detach().cpu() for p in params])
    # bfloat16: the calls with a number operand, or with alpha other than 1, run unqueued
    assert queued_since(before) >= (3 if dtype == torch.float32 else 1) * len(SHAPES)
    for got, want in zip(finals[1], finals[0]):
        if dtype == torch.float32:
            torch.testing.assert_close(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-4)


def test_clip_grad_norm_and_zero_grad_with_foreach_match_cpu(queueing):
    init = _lists(count=2, seed=5)
    results = []
    for device in ("cpu", DEV):
        params = [t.clone().to(device).requires_grad_() for t in init[0]]
        for p, grad in zip(params, init[1]):
            p.grad = grad.clone().to(device)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=0.5, foreach=True)
        grads = [p.grad.cpu().clone() for p in params]
        opt = torch.optim.SGD(params, lr=0.1, foreach=True)
        opt.zero_grad(set_to_none=False)
        results.append((norm.cpu(), grads, [p.grad.cpu() for p in params]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for x, y in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(x, y)
    for x in results[1][2]:
        assert torch.equal(x, torch.zeros_like(x))


def test_elements_run_in_list_order_when_they_alias(queueing):
    """PyTorch's CPU kernel runs the single-tensor op on each element in turn: a later element
    reads what an earlier one wrote; so does the queue."""
    for device in ("cpu", DEV):
        t = torch.arange(4.0, device=device)
        u = torch.ones(4, device=device)
        torch._foreach_add_([t, t, u], [t, u, t])  # t = 2t; t = t + u; u = u + t
        torch._foreach_mul_([t[1:], t[:2]], 3.0)
        if device == "cpu":
            want = (t.clone(), u.clone())
        else:
            assert torch.equal(t.cpu(), want[0]) and torch.equal(u.cpu(), want[1])


@pytest.mark.filterwarnings("ignore:.*float64 arithmetic")
@pytest.mark.parametrize("odd", ["large", "float64", "strided", "other_device_dtype", "complex_scalar_list"])
def test_a_list_with_one_element_the_queue_cannot_take_runs_whole_unqueued(queueing, odd):
    lists = _lists(count=2)
    if odd == "large":
        lists[0][1], lists[1][1] = torch.randn(131073), torch.randn(131073)
    elif odd == "float64":
        lists[0][2], lists[1][2] = lists[0][2].double(), lists[1][2].double()
    elif odd == "strided":
        lists[0][1], lists[1][1] = torch.randn(7, 3).t(), torch.randn(7, 3).t()
    elif odd == "other_device_dtype":
        lists[1][0] = lists[1][0].to(torch.bfloat16)

    def call(a, b):
        if odd == "complex_scalar_list":
            a = [t.to(torch.complex64) for t in a]
            return torch._foreach_mul(a, [1, 2, 3j, 4])
        return torch._foreach_add(a, b, alpha=0.5)
    want = _run(call, lists, "cpu")
    before = stats()
    got = _run(call, lists, DEV)
    assert queued_since(before) == 0
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("call", [
    lambda a, b: torch._foreach_add_(a, b[:2]),
    lambda a, b: torch._foreach_addcdiv_(a, b, b[:1], 0.5),
    lambda a, b: torch._foreach_add_(a, b, alpha=1e40),
    lambda a, b: torch._foreach_lerp_(a, b, 1e39),
    lambda a, b: torch._foreach_sqrt([]),
], ids=["list_lengths", "three_lists", "alpha_overflow", "weight_overflow", "empty_unary"])
def test_foreach_errors_are_pytorchs_and_nothing_is_queued(queueing, call):
    lists = _lists(count=2)
    with pytest.raises(Exception) as cpu_error:
        call(*[[t.clone() for t in ts] for ts in lists])
    moved = [[t.clone().to(DEV) for t in ts] for ts in lists]
    before = stats()
    with pytest.raises(type(cpu_error.value)) as device_error:
        call(*moved)
    assert str(device_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]
    assert queued_since(before) == 0
    for t, original in zip(moved[0], lists[0]):
        assert torch.equal(t.cpu(), original)


@pytest.mark.parametrize("on", [True, False], ids=["queue_on", "queue_off"])
@pytest.mark.parametrize("call, message", [
    (lambda a, b: torch._foreach_add(a, [1.0, 2.0]), "Tensor list must have same number of elements as scalar list"),
    (lambda a, b: torch._foreach_mul_(a, [1.0]), "Tensor list must have same number of elements as scalar list"),
    (lambda a, b: torch._foreach_add_(a, []), "Tensor list must have same number of elements as scalar list"),
    (lambda a, b: torch._foreach_sub(a, [2, 3, 4, 5, 6]), "Tensor list must have same number of elements as scalar list"),
], ids=["scalar_list_length", "scalar_list_length_in_place", "empty_scalar_list", "longer_scalar_list"])
def test_binary_foreach_list_errors_are_torchneurons_value_errors(call, message, on):
    """TorchNeuron's add/sub/mul/div foreach kernels check their lists first and raise ValueError
    (PyTorch's CPU kernels: RuntimeError, with a period); AWS's tests expect it. (An empty list of
    tensors never reaches a device kernel: the dispatcher finds no device in it, and PyTorch's CPU
    kernel raises; unequal lists of tensors are refused by PyTorch's autograd layer first.)"""
    a, b = ([t.to(DEV) for t in ts] for ts in _lists(count=2))
    with concatenation(on), pytest.raises(ValueError, match=f"^{message}$"):
        call(a, b)


def test_a_foreach_call_is_counted_once_and_its_launch_names_each_element(queueing):
    a, b = ([t.to(DEV) for t in ts] for ts in _lists(count=2))
    _C._run_queued()
    torch_neuronx.clear_op_tracking()
    torch._foreach_mul_(a, 0.5)
    torch._foreach_add_(a, b)
    _C._run_queued()
    ops = torch_neuronx.get_executed_ops()
    assert ops["aten::_foreach_mul_.Scalar"] == 1 and ops["aten::_foreach_add_.List"] == 1
    launch = "|".join(["aten::_foreach_mul_.Scalar"] * len(SHAPES) + ["aten::_foreach_add_.List"] * len(SHAPES))
    assert ops[launch] == 1


def test_not_queued_when_deterministic_or_off():
    lists = _lists(count=2)
    want = _run(lambda a, b: torch._foreach_addcmul_(a, b, b, 0.5), lists, "cpu")
    for on, deterministic in ((False, False), (True, True)):
        with concatenation(on):
            before = stats()
            torch.use_deterministic_algorithms(deterministic)
            try:
                got = _run(lambda a, b: torch._foreach_addcmul_(a, b, b, 0.5), lists, DEV)
            finally:
                torch.use_deterministic_algorithms(False)
            assert queued_since(before) == 0
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y)


def test_autograd_through_queued_foreach_calls_matches_cpu(queueing):
    grads = []
    before = stats()
    for device in ("cpu", DEV):
        a = [torch.arange(4.0, device=device).requires_grad_(), torch.ones(3, 5, device=device).requires_grad_()]
        b = [torch.full((4,), 2.0, device=device), torch.full((3, 5), 3.0, device=device)]
        out = torch._foreach_sqrt(torch._foreach_add(torch._foreach_mul(a, b), 1.5))
        sum(o.sum() for o in out).backward()
        grads.append([t.grad.cpu() for t in a])
    assert queued_since(before) >= 6
    for x, y in zip(grads[1], grads[0]):
        torch.testing.assert_close(x, y)
