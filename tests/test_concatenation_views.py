"""Adaptive Eager Execution's queue (csrc/Concatenation.h), December 2026 additions: the .Scalar
overloads of add/sub/mul/div (what autograd's formulas and C++ code call), and strided operands:
clone, cat and unary ops of views (slices, transposes, expands) whose last dim has stride 1, the
rows copied by the queue (rotary embeddings' rotate_half, a KV cache's cat, attention's
.contiguous()).

The reference is the same call on CPU tensors. The Scalar overloads are PyTorch's .Tensor overloads
with the number wrapped in a CPU tensor, and the queue computes them as it computes those: bit for
bit where PyTorch computes one IEEE operation per element (mul, div, add/sub with alpha 1), at
float32 rounding (assert_close's float32 tolerances) for add/sub with another alpha (PyTorch's
fused multiply-add depends on the instruction set)."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx
from torch_neuronx import _C

from test_concatenation import concatenation, device_thread_launches, executed_launches, queued_since, small_queue, stats  # noqa: F401

DEV = "neuron"


@pytest.fixture
def queueing():
    with concatenation(True):
        yield


# ------------------------------------------------------------------------- .Scalar overloads

SCALAR_CALLS = [
    ("mul", 2.0, {}), ("mul", -0.5, {}), ("mul", 3, {}), ("mul", 1e39, {}), ("div", 64, {}), ("div", 0.0, {}),
    ("div", -3.7, {}), ("add", 1e-6, {}), ("add", 3, {}), ("sub", 0.25, {}), ("add", 3, {"alpha": 0.5}),
    ("sub", 1.5, {"alpha": -2}), ("add", 0.1, {}), ("sub", 0.9, {}), ("add", 1 / 96, {}), ("mul", 0.1, {}),
    ("div", 0.9, {}),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, number, kwargs", SCALAR_CALLS, ids=str)
def test_scalar_overloads_are_queued_and_match_cpu(queueing, dtype, name, number, kwargs):
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 5, 7, generator=g) * 4).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    out_of_place = getattr(torch.ops.aten, name).Scalar
    in_place = getattr(torch.ops.aten, name + "_").Scalar
    want, want_inplace = out_of_place(x, number, **kwargs), in_place(x.clone(), number, **kwargs)
    before = stats()
    got, got_inplace = out_of_place(x.to(DEV), number, **kwargs), in_place(x.to(DEV), number, **kwargs)
    # bfloat16 add/sub with an alpha other than 1 run unqueued (as the .Tensor overloads do)
    queued = 0 if dtype == torch.bfloat16 and kwargs.get("alpha", 1) != 1 else 2
    assert queued_since(before) == queued
    for have, expected in ((got, want), (got_inplace, want_inplace)):
        assert have.dtype == expected.dtype and have.shape == expected.shape
        if kwargs.get("alpha", 1) != 1:
            torch.testing.assert_close(have.cpu(), expected, equal_nan=True)
        else:
            assert torch.equal(have.cpu().isnan(), expected.isnan())
            assert torch.equal(have.cpu().nan_to_num(), expected.nan_to_num())


def test_scalar_overloads_with_a_boolean_or_float64_run_unqueued_and_match_cpu(queueing):
    x = torch.randn(4, 6)
    before = stats()
    got = [torch.ops.aten.mul.Scalar(x.to(DEV), True), torch.ops.aten.add.Scalar(x.to(DEV), False)]
    assert queued_since(before) == 0
    assert torch.equal(got[0].cpu(), torch.ops.aten.mul.Scalar(x, True))
    assert torch.equal(got[1].cpu(), torch.ops.aten.add.Scalar(x, False))
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        torch.ops.aten.add.Scalar(x.to(DEV), 1.0, alpha=1e300)


def test_backward_formulas_that_scale_by_a_number_queue_and_match_cpu(queueing):
    """pow's and mean's gradients (mul.Scalar, div.Scalar from autograd's C++ formulas)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 16, generator=g)
    xd = x.to(DEV).requires_grad_()
    xc = x.clone().requires_grad_()
    for t in (xd, xc):
        (t.pow(2) * 0.5 + t.pow(3)).sum(-1).backward(torch.ones(4, device=t.device))
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)


# ------------------------------------------------------------------------------ strided operands

def _views():
    """(name, CPU view) of the layouts a model makes: slices of the last dim, transposed heads,
    slices of those, strided rows, an expanded (stride 0) outer dim, a 5-D permutation with a
    sliced last dim, a transposed matrix, a 0-dim tensor."""
    g = torch.Generator().manual_seed(9)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return [
        ("rotary half, 1 row", r(1, 4, 1, 64)[..., 32:]),
        ("rotary half of transposed heads", r(1, 1, 4, 64).transpose(1, 2)[..., :32]),
        ("transposed heads", r(2, 16, 4, 16).transpose(1, 2)),
        ("slice of transposed heads", r(2, 16, 4, 16).transpose(1, 2)[..., 8:]),
        ("columns", r(8, 6)[:, 1:4]),
        ("every other row", r(8, 6)[::2]),
        ("transposed matrix", r(8, 6).t()),
        ("size-1 dim", r(3, 1, 5)[:, :, 1:]),
        ("expanded outer dim", r(4, 5).unsqueeze(1).expand(4, 3, 5)),
        ("5-D permuted, sliced", r(2, 3, 4, 5, 6).permute(0, 2, 1, 3, 4)[..., 1:]),
        ("0-dim", r(())),
    ]


def _on_device(view):
    """The same view of the same bytes on the device (its base copied, then viewed alike)."""
    base = view if view._base is None else view._base
    return base.to(DEV).as_strided(view.size(), view.stride(), view.storage_offset())


VIEWS = _views()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, view", VIEWS, ids=[name for name, _ in VIEWS])
def test_clone_and_unary_ops_of_views_are_queued_with_cpus_values_and_strides(queueing, dtype, name, view):
    view = view.to(dtype) if view._base is None else _views_of(dtype)[name]
    d = _on_device(view)
    calls = {"clone": lambda t: t.clone(), "contiguous": lambda t: t.contiguous(),
             "clone contiguous": lambda t: t.clone(memory_format=torch.contiguous_format),
             "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "exp": torch.exp, "square": torch.square}
    before = stats()
    got = {k: f(d) for k, f in calls.items()}
    queued = queued_since(before)
    for k, f in calls.items():
        want = f(view)
        assert got[k].stride() == want.stride(), k
        assert got[k].dtype == want.dtype
        if k == "exp":
            torch.testing.assert_close(got[k].cpu(), want)
        else:
            assert torch.equal(got[k].cpu(), want), k
    # contiguous() of a contiguous view returns it (no call); a contiguous copy of a view whose
    # last dim has another stride (a transposed matrix) is not a copy of rows: unqueued
    unqueued = 1 if view.is_contiguous() else 2 if view.dim() and view.size(-1) > 1 and view.stride(-1) != 1 else 0
    assert queued == len(calls) - unqueued


def _views_of(dtype):
    return {name: (v.to(dtype) if v._base is None else _recast(v, dtype)) for name, v in _views()}


def _recast(view, dtype):
    base = view._base.to(dtype)
    return base.as_strided(view.size(), view.stride(), view.storage_offset())


@pytest.mark.parametrize("name, view", [("last dim expanded", torch.randn(5, 4).unsqueeze(-1).expand(5, 4, 3)),
                                        ("5-D, last dim not stride 1", torch.randn(2, 3, 4, 5, 6).permute(0, 2, 1, 4, 3)[..., 1:])],
                         ids=["expanded last dim", "permuted last dim"])
def test_views_whose_last_dim_is_not_contiguous_run_unqueued_and_match_cpu(queueing, name, view):
    d = _on_device(view)
    before = stats()
    got = [d.clone(), d.neg(), torch.cat([d, d], 0)]
    assert queued_since(before) == 0
    for have, want in zip(got, [view.clone(), view.neg(), torch.cat([view, view], 0)]):
        assert have.stride() == want.stride() and torch.equal(have.cpu(), want)


CATS = [
    ("rotate_half", lambda x: torch.cat((-x[..., 32:], x[..., :32]), dim=-1), [(1, 4, 1, 64)]),
    ("kv cache", lambda k, v: torch.cat([k, v], dim=-2), [(1, 4, 16, 64), (1, 4, 1, 64)]),
    ("dim 0, three inputs", lambda a, b, c: torch.cat([a, b, c]), [(2, 5), (1, 5), (4, 5)]),
    ("middle dim of transposed heads", lambda a, b: torch.cat([a.transpose(1, 2), b.transpose(1, 2)], 1),
     [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("slices along the last dim", lambda a, b: torch.cat([a[:, 1:], b[:, :2], a[:, :1]], -1), [(6, 7), (6, 3)]),
    ("an empty input", lambda a, b: torch.cat([a, b[:0], a], 0), [(3, 4), (2, 4)]),
    ("negative dim -3", lambda a, b: torch.cat([a, b], -3), [(2, 3, 4), (1, 3, 4)]),
    ("expanded input", lambda a, b: torch.cat([a.expand(3, 4), b], 0), [(1, 4), (2, 4)]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name, f, shapes", CATS, ids=[c[0] for c in CATS])
def test_cat_is_queued_and_matches_cpu_bit_for_bit(queueing, dtype, name, f, shapes):
    g = torch.Generator().manual_seed(10)
    inputs = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    device_inputs = [t.to(DEV) for t in inputs]
    before = stats()
    got = f(*device_inputs)
    assert queued_since(before) >= 1
    want = f(*inputs)
    assert got.stride() == want.stride() and got.dtype == want.dtype and torch.equal(got.cpu(), want)


def test_a_cat_is_one_queued_op_named_once_in_its_launch(queueing):
    a, b, c = (torch.randn(3, 4).to(DEV) for _ in range(3))
    _C._run_queued()
    torch_neuronx.clear_op_tracking()
    before = stats()
    out = torch.cat([a, b, c], 1) * 2
    assert queued_since(before) == 2
    assert executed_launches() == {"aten::cat|aten::mul.Tensor": 1}
    assert torch.equal(out.cpu(), torch.cat([a.cpu(), b.cpu(), c.cpu()], 1) * 2)


def test_cats_that_do_not_qualify_run_unqueued_with_cpus_result_or_error(queueing):
    a, h, cl = torch.randn(2, 3), torch.randn(2, 3).half(), torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    before = stats()
    mixed = torch.cat([a.to(DEV), a.double().to(DEV)])  # type promotion
    halves = torch.cat([h.to(DEV), h.to(DEV)])
    channels_last = torch.cat([cl.to(DEV), cl.to(DEV)], 1)
    legacy_empty = torch.cat([torch.empty(0).to(DEV), a.to(DEV)])
    big = torch.cat([torch.zeros(70000).to(DEV), torch.ones(70000).to(DEV)])
    assert queued_since(before) == 0
    assert torch.equal(mixed.cpu(), torch.cat([a, a.double()])) and mixed.dtype == torch.float64
    assert torch.equal(halves.cpu(), torch.cat([h, h]))
    assert channels_last.stride() == torch.cat([cl, cl], 1).stride()
    assert torch.equal(legacy_empty.cpu(), a) and big.sum().item() == 70000
    for bad, message in [(lambda t: torch.cat([t, t[:, :2]]), "Sizes of tensors must match"),
                         (lambda t: torch.cat([t, t], 2), "Dimension out of range"),
                         (lambda t: torch.cat([t, t.cpu()]), "Expected all tensors to be on the same device")]:
        with pytest.raises((RuntimeError, IndexError), match=message):
            bad(a.to(DEV))


def test_queued_copies_read_their_inputs_in_program_order(queueing):
    """A queued clone or cat reads its inputs as they are at the call: in-place writes after it
    (queued or not) do not reach it, writes before it do."""
    x = torch.randn(4, 8)
    d = x.to(DEV)
    d.mul_(2)  # queued before: the copies see it
    view = d[:, 2:6]
    copies = [view.clone(), torch.cat([view, d[:, :1]], 1), view.neg()]
    d.add_(1)  # queued after
    d[0, 0] = 100.0  # an unqueued write runs the queue first
    want = (x * 2)[:, 2:6]
    assert torch.equal(copies[0].cpu(), want)
    assert torch.equal(copies[1].cpu(), torch.cat([want, (x * 2)[:, :1]], 1))
    assert torch.equal(copies[2].cpu(), -want)
    assert torch.equal(d.cpu()[1:], (x * 2 + 1)[1:])


def test_rotary_attention_forward_and_backward_match_cpu(queueing):
    """Llama's rotary embedding (its rotate_half's slices, neg and cat) and a KV cache's cat, with
    autograd through them (cat's and slicing's gradients)."""
    g = torch.Generator().manual_seed(11)
    q, cos, sin, cache = (torch.randn(s, generator=g) for s in [(2, 3, 4, 16), (1, 1, 4, 16), (1, 1, 4, 16), (2, 3, 5, 16)])

    def rotate_half(x):
        return torch.cat((-x[..., 8:], x[..., :8]), dim=-1)

    grads = []
    for dev in ("cpu", DEV):
        qq = q.clone().to(dev).requires_grad_()
        rotated = qq * cos.to(dev) + rotate_half(qq) * sin.to(dev)
        keys = torch.cat([cache.to(dev), rotated], dim=-2)
        (keys.transpose(-1, -2).contiguous() ** 2).sum().backward()
        grads.append((keys.detach().cpu(), qq.grad.cpu()))
    torch.testing.assert_close(grads[1][0], grads[0][0])
    torch.testing.assert_close(grads[1][1], grads[0][1])


def test_a_llama_decoding_step_queues_its_rotary_embedding_and_cache_and_matches_cpu(queueing):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))
    logits = []
    for dev in ("cpu", DEV):
        m = model.to(dev)
        with torch.no_grad():
            cache = m(ids[:, :-1].to(dev), use_cache=True).past_key_values
            _C._run_queued()
            torch_neuronx.clear_op_tracking()
            logits.append(m(ids[:, -1:].to(dev), past_key_values=cache, use_cache=True).logits.cpu())
    launches = " ".join(executed_launches())
    assert "aten::neg|aten::cat" in launches and "aten::cat|aten::cat" in launches  # rotary, then the cache
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-5)


def test_full_queues_of_copies_run_on_the_device_thread_with_the_same_results(small_queue):
    x = torch.randn(6, 64)
    d = x.to(DEV)
    _C._run_queued()
    before = device_thread_launches()
    outs = [torch.cat([d[:, 32:], d[:, :32]], -1).neg() for _ in range(20)]
    _C._run_queued()
    assert device_thread_launches() > before
    want = -torch.cat([x[:, 32:], x[:, :32]], -1)
    assert all(torch.equal(o.cpu(), want) for o in outs)


def test_deterministic_mode_leaves_copies_unqueued(queueing):
    x = torch.randn(4, 8).to(DEV)
    before = stats()
    torch.use_deterministic_algorithms(True)
    try:
        got = [x[:, 1:].clone(), torch.cat([x, x]), x.t().neg()]
    finally:
        torch.use_deterministic_algorithms(False)
    assert queued_since(before) == 0
    assert torch.equal(got[1].cpu(), torch.cat([x.cpu(), x.cpu()]))


def test_copies_into_views_are_queued_and_match_cpu(queueing):
    """dst.copy_(src) between views of one shape that share no memory: an assignment into a slice,
    and slicing's gradient (slice_backward: zeros, then a copy into a slice of them)."""
    g = torch.Generator().manual_seed(12)
    x, y = torch.randn(4, 8, generator=g), torch.randn(8, 4, generator=g)
    dx, dy = x.to(DEV), y.to(DEV)
    before = stats()
    dx[:, 2:6] = dy[4:]
    dx[1:3].copy_(dy[4:6].reshape(2, 4).repeat(1, 2))
    dx[2:, 1:5] = dy[:4, :2].t()  # a transposed source (last stride 4): not rows, unqueued
    assert queued_since(before) == 2
    x[:, 2:6] = y[4:]
    x[1:3].copy_(y[4:6].reshape(2, 4).repeat(1, 2))
    x[2:, 1:5] = y[:4, :2].t()
    assert torch.equal(dx.cpu(), x)
    grads = []
    for dev in ("cpu", DEV):
        t = torch.randn(3, 16, generator=torch.Generator().manual_seed(13)).to(dev).requires_grad_()
        (t[:, 4:12] * torch.arange(8.0, device=dev)).sum().backward()
        grads.append(t.grad.cpu())
    assert torch.equal(grads[1], grads[0])


def test_copies_that_do_not_qualify_run_unqueued_with_cpus_result_or_error(queueing):
    a = torch.randn(4, 6)
    d = a.to(DEV)
    before = stats()
    converted = torch.empty(4, 6, dtype=torch.bfloat16).to(DEV).copy_(d)
    broadcast = torch.empty(4, 6).to(DEV).copy_(d[0])
    same = d.copy_(d)  # itself: PyTorch returns before any copy
    assert queued_since(before) == 0
    assert torch.equal(converted.cpu(), a.to(torch.bfloat16)) and torch.equal(broadcast.cpu(), a[0].expand(4, 6))
    assert torch.equal(same.cpu(), a)
    halves = [a.clone(), d.clone()]  # one storage, apart: queued
    _C._run_queued()
    before = stats()
    for t in halves:
        t[:2].copy_(t[2:])
    assert queued_since(before) == 1 and torch.equal(halves[1].cpu(), halves[0])
    overlapping = [a.clone(), d.clone()]
    for t in overlapping:
        t[:, :3].copy_(t[:, 1:4])  # source and destination share memory: unqueued, CPU's result
    assert torch.equal(overlapping[1].cpu(), overlapping[0])


@pytest.mark.parametrize("number", [0.1, 0.9, 1 / 96, -3.3e38, 1e39])
def test_bfloat16_add_and_sub_of_a_python_number_round_it_to_bfloat16_as_pytorch_does(queueing, number):
    """TensorIterator casts the wrapped number to bfloat16 before add/sub (`x + 0.1` adds
    0.10009765625), while mul/div read it in float32: the same bits either way."""
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(14)) * 3).bfloat16()
    d = x.to(DEV)
    before = stats()
    got = [d + number, d - number, number + d, d * number, d / number]
    assert queued_since(before) == 5
    for have, want in zip(got, [x + number, x - number, number + x, x * number, x / number]):
        assert torch.equal(have.cpu().view(torch.int16), want.view(torch.int16))
