"""Eager execution on the neuron device, compared against the same ops on CPU.

Native ops run PyTorch's CPU kernels over device memory, so for most of what
is checked here the neuron result must equal the CPU result exactly
(``rtol=0, atol=0``): views, copies, indexing, dtype conversions, integer
and boolean math. Floating-point compute is compared with
``torch.testing.assert_close`` defaults for the dtype (float32: rtol 1.3e-6,
atol 1e-5), which leaves room for a kernel that vectorizes differently.
Every check also asserts the result lives on the neuron device and has the
dtype CPU PyTorch gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import seeds
import torch_neuronx

NEURON = torch.device("neuron", 0)
EXACT = dict(rtol=0, atol=0)

needs_two_cores = pytest.mark.skipif(
    torch.neuron.device_count() < 2, reason="needs at least two NeuronCores"
)


def to_neuron(value, device=NEURON):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_neuron(v, device) for v in value)
    return value


def assert_matches(actual, expected, **tolerances):
    """actual (neuron) equals expected (CPU): device, dtype, shape, values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.device.type == "neuron", actual.device
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, **tolerances)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_matches(a, e, **tolerances)
    else:
        assert actual == expected


def compare(fn, *cpu_args, **tolerances):
    """Runs fn on CPU inputs and on neuron copies of them; results must match."""
    expected = fn(*cpu_args)
    actual = fn(*to_neuron(cpu_args))
    assert_matches(actual, expected, **tolerances)
    return actual


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(seeds.seed(1234))


# --------------------------------------------------------------------- views

VIEWS = {
    "view": lambda t: t.view(6, 4),
    "reshape": lambda t: t.reshape(2, 12),
    "transpose": lambda t: t.transpose(0, 1),
    "t": lambda t: t.t(),
    "permute": lambda t: t.view(2, 2, 6).permute(2, 0, 1),
    "slice": lambda t: t[1:3, ::2],
    "negative_slice": lambda t: t[-2:, -3:],
    "select": lambda t: t[2],
    "narrow": lambda t: t.narrow(1, 1, 3),
    "expand": lambda t: t[:1].expand(3, 6),
    "as_strided": lambda t: t.as_strided((3, 3), (1, 2), 1),
    "unfold": lambda t: t.unfold(1, 2, 2),
    "split": lambda t: t.split(2)[1],
    "split_sizes": lambda t: t.split([1, 5], dim=1)[1],
    "chunk": lambda t: t.chunk(3, dim=1)[2],
    "unbind": lambda t: t.unbind(0)[3],
    "diagonal": lambda t: t.diagonal(),
    "movedim": lambda t: t.movedim(0, 1),
    "unsqueeze_squeeze": lambda t: t.unsqueeze(0).unsqueeze(-1).squeeze(0),
    "flatten": lambda t: t.flatten(),
    "unflatten": lambda t: t.unflatten(1, (2, 3)),
    "view_dtype": lambda t: t.view(torch.int32),
    "real_of_complex": lambda t: torch.view_as_complex(t.view(4, 3, 2)).real,
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_matches_cpu_and_aliases_base(name):
    fn = VIEWS[name]
    base_cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = base_cpu.to(NEURON)
    expected, actual = fn(base_cpu), fn(base)
    assert actual.device == NEURON
    # Same geometry as on CPU, and over the base's memory (no copy).
    assert actual.shape == expected.shape
    assert actual.stride() == expected.stride()
    assert actual.storage_offset() == expected.storage_offset()
    assert actual.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    torch.testing.assert_close(actual.cpu(), expected, **EXACT)


@pytest.mark.parametrize("name", ["view", "transpose", "slice", "select", "narrow", "as_strided",
                                  "unfold", "split", "chunk", "unbind", "diagonal", "flatten"])
def test_write_through_view_is_visible_in_base(name):
    fn = VIEWS[name]
    base_cpu = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    base = base_cpu.to(NEURON)
    fn(base_cpu).mul_(-3).add_(1)
    fn(base).mul_(-3).add_(1)
    torch.testing.assert_close(base.cpu(), base_cpu, **EXACT)


def test_base_write_is_visible_in_view():
    base = torch.zeros(4, 6, device=NEURON)
    view = base.t()[1:3]
    base[1:3, :].fill_(7)
    expected = torch.zeros(4, 6)
    expected[1:3, :] = 7
    torch.testing.assert_close(view.cpu(), expected.t()[1:3], **EXACT)


def test_setitem_through_views():
    cpu = torch.zeros(5, 6)
    dev = cpu.to(NEURON)
    for t in (cpu, dev):
        t[1:4, 2] = torch.tensor([1.0, 2.0, 3.0], device=t.device)
        t[:, -1] = 9
        t.t()[0, 1:3] = -1
        t[4].unfold(0, 2, 2)[1] = 5
    torch.testing.assert_close(dev.cpu(), cpu, **EXACT)


def test_expand_then_contiguous_and_reduction():
    compare(lambda t: t[:, :1].expand(4, 5).contiguous(), torch.randn(4, 3))
    compare(lambda t: t.unsqueeze(1).expand(3, 4, 2).sum(1), torch.randn(3, 2))


# ------------------------------------------------------------------ in-place

IN_PLACE = {
    "add_": lambda t, o: t.add_(o, alpha=2),
    "mul_": lambda t, o: t.mul_(o),
    "sub_": lambda t, o: t.sub_(o),
    "div_": lambda t, o: t.div_(o.abs() + 1),
    "clamp_": lambda t, o: t.clamp_(min=-0.5, max=0.5),
    "relu_": lambda t, o: t.relu_(),
    "addcmul_": lambda t, o: t.addcmul_(o, o, value=0.5),
    "lerp_": lambda t, o: t.lerp_(o, 0.25),
    "masked_fill_": lambda t, o: t.masked_fill_(o > 0, -2.0),
    "index_add_": lambda t, o: t.index_add_(0, torch.tensor([0, 2, 2], device=t.device), o[:3]),
    "copy_": lambda t, o: t.copy_(o),
    "zero_": lambda t, o: t.zero_(),
    "fill_": lambda t, o: t.fill_(3.5),
    "exp_": lambda t, o: t.exp_(),
    "transposed_add_": lambda t, o: t.t().add_(o.t()),
    "sliced_mul_": lambda t, o: t[::2, 1:].mul_(o[::2, 1:]),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE))
def test_in_place_matches_cpu_and_returns_self(name):
    fn = IN_PLACE[name]
    cpu_self, other = torch.randn(4, 5), torch.randn(4, 5)
    dev_self, dev_other = cpu_self.to(NEURON), other.to(NEURON)
    ptr = dev_self.data_ptr()
    fn(cpu_self, other)
    result = fn(dev_self, dev_other)
    assert result.untyped_storage().data_ptr() == dev_self.untyped_storage().data_ptr()
    assert dev_self.data_ptr() == ptr  # updated in place, not reallocated
    assert dev_self.dtype == torch.float32
    torch.testing.assert_close(dev_self.cpu(), cpu_self)


def test_in_place_returns_same_tensor_object():
    t = torch.ones(3, device=NEURON)
    assert t.add_(torch.ones(3, device=NEURON)) is t
    assert t.mul_(2) is t
    assert t.zero_() is t


def test_in_place_type_error_matches_cpu():
    cpu = torch.arange(4)
    dev = cpu.to(NEURON)
    with pytest.raises(RuntimeError, match="can't be cast"):
        cpu.add_(torch.rand(4))
    with pytest.raises(RuntimeError, match="can't be cast"):
        dev.add_(torch.rand(4, device=NEURON))
    torch.testing.assert_close(dev.cpu(), cpu, **EXACT)  # untouched


def test_in_place_on_expanded_input_is_rejected_like_cpu():
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.zeros(1, 3).expand(2, 3).add_(1)
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.zeros(1, 3, device=NEURON).expand(2, 3).add_(1)


@pytest.mark.parametrize("call", [
    lambda x: x[1:].add_(x[:-1]),                  # csrc/FastOps.cpp's in-place kernel
    lambda x: x[1:].mul_(x[:-1]),
    lambda x: torch.mul(x[:-1], 2, out=x[1:]),     # the generic alias path, out=
    lambda x: torch.exp(x[:-1], out=x[1:]),
    lambda x: x[1:].copy_(x[:-1]),
], ids=["add_", "mul_", "mul_out", "exp_out", "copy_"])
def test_output_partly_overlapping_an_input_is_refused_like_cpu(call):
    """Arguments over one device storage share one host alias storage, so PyTorch's CPU kernels see
    the overlap (each argument aliased alone, they computed a running sum instead)."""
    for device in ("cpu", NEURON):
        x = torch.arange(6.0, device=device)
        with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to tensor "
                                               "refer to a single memory location"):
            call(x)
        assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    x, y = torch.arange(6.0), torch.arange(6.0, device=NEURON)
    for t in (x, y):
        t.add_(t)
        t[::2].mul_(t[1::2])  # disjoint views of one storage: allowed
    torch.testing.assert_close(y.cpu(), x, **EXACT)


# --------------------------------------------------------------------- out=

def test_out_right_size_is_written_in_place():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(3, 4, device=NEURON)
    ptr = out.data_ptr()
    result = torch.add(a.to(NEURON), b.to(NEURON), out=out)
    assert result is out and out.data_ptr() == ptr
    torch.testing.assert_close(out.cpu(), a + b)


@pytest.mark.parametrize("shape", [(0,), (5,), (100,), (2, 6)], ids=["empty", "smaller", "larger", "other_shape"])
def test_out_of_wrong_size_is_resized_like_cpu(shape):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    cpu_out = torch.empty(shape)
    dev_out = torch.empty(shape, device=NEURON)
    with warnings.catch_warnings(record=True) as cpu_warn:
        warnings.simplefilter("always")
        torch.mul(a, b, out=cpu_out)
    with warnings.catch_warnings(record=True) as dev_warn:
        warnings.simplefilter("always")
        result = torch.mul(a.to(NEURON), b.to(NEURON), out=dev_out)
    assert result is dev_out
    assert dev_out.shape == cpu_out.shape == (3, 4)
    assert dev_out.stride() == cpu_out.stride()
    torch.testing.assert_close(dev_out.cpu(), cpu_out)
    # Resizing a non-empty out= tensor warns on CPU; it must on neuron too.
    cpu_resized = [w for w in cpu_warn if "resized" in str(w.message)]
    dev_resized = [w for w in dev_warn if "resized" in str(w.message)]
    assert len(dev_resized) == len(cpu_resized)


@pytest.mark.parametrize(
    "op",
    [
        lambda a, out: torch.mm(a, a.t(), out=out),
        lambda a, out: torch.sum(a, 1, out=out),
        lambda a, out: torch.cat([a, a], out=out),
        lambda a, out: torch.exp(a, out=out),
        lambda a, out: torch.index_select(a, 0, torch.tensor([2, 0], device=a.device), out=out),
    ],
    ids=["mm", "sum", "cat", "exp", "index_select"],
)
def test_out_variants_resize(op):
    a = torch.randn(3, 4)
    cpu_out, dev_out = torch.empty(0), torch.empty(0, device=NEURON)
    op(a, cpu_out)
    assert op(a.to(NEURON), dev_out) is dev_out
    assert dev_out.shape == cpu_out.shape
    torch.testing.assert_close(dev_out.cpu(), cpu_out)


def test_out_non_contiguous_keeps_its_strides():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    cpu_out = torch.empty(4, 3).t()
    dev_out = torch.empty(4, 3, device=NEURON).t()
    torch.add(a, b, out=cpu_out)
    torch.add(a.to(NEURON), b.to(NEURON), out=dev_out)
    assert dev_out.stride() == cpu_out.stride() == (1, 3)
    torch.testing.assert_close(dev_out.cpu(), cpu_out, **EXACT)


def test_out_view_writes_into_base():
    base = torch.zeros(4, 4, device=NEURON)
    torch.add(torch.ones(4, device=NEURON), torch.ones(4, device=NEURON), out=base[1])
    expected = torch.zeros(4, 4)
    expected[1] = 2
    torch.testing.assert_close(base.cpu(), expected, **EXACT)


def test_out_dtype_rules_match_cpu():
    ints = torch.arange(4)
    out = torch.empty(4, device=NEURON)
    torch.add(ints.to(NEURON), ints.to(NEURON), out=out)  # int result into float out: allowed
    torch.testing.assert_close(out.cpu(), (ints + ints).float(), **EXACT)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(torch.rand(4), torch.rand(4), out=torch.empty(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(torch.rand(4, device=NEURON), torch.rand(4, device=NEURON),
                  out=torch.empty(4, dtype=torch.long, device=NEURON))


def test_out_tuple_of_results():
    a = torch.randn(4, 5)
    values, indices = torch.empty(0, device=NEURON), torch.empty(0, dtype=torch.long, device=NEURON)
    torch.max(a.to(NEURON), 1, out=(values, indices))
    expected = torch.max(a, 1)
    torch.testing.assert_close(values.cpu(), expected.values, **EXACT)
    torch.testing.assert_close(indices.cpu(), expected.indices, **EXACT)


# ------------------------------------------------------------ non-contiguous

NON_CONTIGUOUS = {
    "transposed": lambda t: t.t(),
    "strided": lambda t: t[::2, ::3],
    "expanded": lambda t: t[:1].expand(6, 8),
    "offset": lambda t: t[2:, 1:],
    "permuted3d": lambda t: t.view(2, 3, 8).permute(2, 0, 1),
}


@pytest.mark.parametrize("layout", sorted(NON_CONTIGUOUS))
@pytest.mark.parametrize(
    "op",
    [
        lambda x: x * 2 + 1,
        lambda x: torch.sin(x),
        lambda x: x.sum(0),
        lambda x: x.softmax(-1),
        lambda x: x.cumsum(-1),
        lambda x: x.contiguous(),
        lambda x: x.clone(),
        lambda x: x.flatten(),
        lambda x: x.sort(-1).values,
        lambda x: x.flatten(end_dim=-2) @ x.flatten(end_dim=-2).t(),
    ],
    ids=["arith", "sin", "sum", "softmax", "cumsum", "contiguous", "clone", "flatten", "sort", "matmul"],
)
def test_non_contiguous_input(layout, op):
    source = torch.randn(6, 8)
    make = NON_CONTIGUOUS[layout]
    dev = make(source.to(NEURON))
    assert not dev.is_contiguous()
    assert_matches(op(dev), op(make(source)))


def test_clone_preserves_strides_like_cpu():
    src = torch.randn(6, 8)
    for make in NON_CONTIGUOUS.values():
        cpu, dev = make(src).clone(), make(src.to(NEURON)).clone()
        assert dev.stride() == cpu.stride()
    cl = torch.randn(2, 3, 4, 5)
    assert (cl.to(memory_format=torch.channels_last).stride()
            == cl.to(NEURON).to(memory_format=torch.channels_last).stride())


# ----------------------------------------------------------- conj/neg views

def test_conj_view_of_complex():
    z = torch.randn(5, dtype=torch.complex64)
    zc = z.to(NEURON).conj()
    assert zc.is_conj() and zc.device == NEURON
    torch.testing.assert_close(zc.cpu(), z.conj(), **EXACT)
    torch.testing.assert_close(zc.resolve_conj().cpu(), z.conj().resolve_conj(), **EXACT)
    assert not zc.resolve_conj().is_conj()
    compare(lambda t: t.conj() * t, z)
    compare(lambda t: t.conj() + torch.complex(t.imag, t.real), z)
    compare(lambda t: t.conj().abs(), z)
    compare(lambda t: t.conj_physical(), z)
    compare(lambda t: t.view(5, 1) @ t.view(1, 5).conj(), z)


def test_neg_view_of_complex():
    z = torch.randn(6, dtype=torch.complex64)
    imag = z.to(NEURON).conj().imag  # imag of a conjugate view is a negative view
    expected = z.conj().imag
    assert imag.is_neg() == expected.is_neg()
    torch.testing.assert_close(imag.cpu(), expected, **EXACT)
    torch.testing.assert_close((imag * 2).cpu(), expected * 2, **EXACT)
    neg = torch._neg_view(z.to(NEURON))
    assert neg.is_neg()
    torch.testing.assert_close(neg.resolve_neg().cpu(), -z, **EXACT)
    torch.testing.assert_close((neg + 0).cpu(), -z, **EXACT)


def test_conj_view_written_in_place_and_copied():
    z = torch.randn(4, dtype=torch.complex64)
    dev = z.to(NEURON)
    factor = torch.tensor(2j, dtype=torch.complex64)
    dev.conj().mul_(factor)
    expected = z.clone()
    expected.conj().mul_(factor)
    torch.testing.assert_close(dev.cpu(), expected, **EXACT)
    target = torch.empty(4, dtype=torch.complex64, device=NEURON)
    target.copy_(dev.conj())
    torch.testing.assert_close(target.cpu(), expected.conj(), **EXACT)


def test_view_as_real_and_complex():
    z = torch.randn(3, 2, dtype=torch.complex64)
    compare(torch.view_as_real, z)
    compare(lambda r: torch.view_as_complex(r), torch.randn(3, 2))
    dev = z.to(NEURON)
    torch.view_as_real(dev)[..., 1].zero_()
    torch.testing.assert_close(dev.cpu(), torch.complex(z.real, torch.zeros_like(z.real)), **EXACT)


# ----------------------------------------------------------- 0-d and empty

@pytest.mark.parametrize(
    "op",
    [
        lambda t: t + t,
        lambda t: t.sum(),
        lambda t: t.mean(),
        lambda t: t.max(),
        lambda t: t.unsqueeze(0),
        lambda t: t.view(1, 1),
        lambda t: t.expand(3),
        lambda t: torch.stack([t, t]),
        lambda t: t.exp(),
        lambda t: torch.where(t > 0, t, -t),
    ],
    ids=["add", "sum", "mean", "max", "unsqueeze", "view", "expand", "stack", "exp", "where"],
)
def test_zero_dim(op):
    compare(op, torch.tensor(-1.25))


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t + 1,
        lambda t: t.sum(),
        lambda t: t.sum(0),
        lambda t: t.mean(0),
        lambda t: t.prod(),
        lambda t: t.amax(1),
        lambda t: t.t() @ t,
        lambda t: t @ t.t(),
        lambda t: torch.cat([t, torch.ones(2, 3, device=t.device)]),
        lambda t: t[t > 0],
        lambda t: t.nonzero(),
        lambda t: t.reshape(-1, 3),
        lambda t: t.softmax(1),
        lambda t: t.clone(),
        lambda t: t.sort(0).values,
    ],
    ids=["add", "sum", "sum0", "mean0", "prod", "amax1", "tmm", "mmt", "cat", "mask", "nonzero",
         "reshape", "softmax", "clone", "sort"],
)
def test_empty(op):
    compare(op, torch.empty(0, 3))


def test_empty_reduction_errors_like_cpu():
    with pytest.raises(IndexError):
        torch.empty(0, 3).max(0)
    with pytest.raises(IndexError):
        torch.empty(0, 3, device=NEURON).max(0)


def test_zero_dim_metadata():
    t = torch.tensor(3.5, device=NEURON)
    assert t.dim() == 0 and t.shape == () and t.numel() == 1 and t.device == NEURON
    assert t.item() == 3.5


# ------------------------------------------------------------ type promotion

PROMOTION_CASES = {
    "int_plus_float": (lambda a, b: a + b, torch.arange(5), torch.randn(5)),
    "bool_plus_int": (lambda a, b: a + b, torch.tensor([True, False, True]), torch.arange(3)),
    "bool_plus_bool": (lambda a, b: a + b, torch.tensor([True, False]), torch.tensor([True, True])),
    "bool_times_float": (lambda a, b: a * b, torch.tensor([True, False]), torch.randn(2)),
    "int8_plus_uint8": (lambda a, b: a + b, torch.tensor([-3, 4], dtype=torch.int8),
                        torch.tensor([200, 1], dtype=torch.uint8)),
    "int32_plus_int64": (lambda a, b: a + b, torch.arange(3, dtype=torch.int32), torch.arange(3)),
    "half_plus_float": (lambda a, b: a + b, torch.randn(3).half(), torch.randn(3)),
    "bf16_plus_half": (lambda a, b: a + b, torch.randn(3).bfloat16(), torch.randn(3).half()),
    "int_div_int": (lambda a, b: a / b, torch.arange(1, 6), torch.arange(2, 7)),
    "int_floordiv": (lambda a, b: a // b, torch.arange(-5, 5), torch.full((10,), 3)),
    "float_plus_complex": (lambda a, b: a + b, torch.randn(3), torch.randn(3, dtype=torch.complex64)),
    "int_tensor_times_0d_float": (lambda a, b: a * b, torch.arange(4), torch.tensor(2.5)),
    "half_tensor_plus_0d_float": (lambda a, b: a + b, torch.randn(4).half(), torch.tensor(0.5)),
    "0d_int_plus_0d_float": (lambda a, b: a + b, torch.tensor(3), torch.tensor(0.25)),
    "int_plus_python_int": (lambda a, b: a + 7, torch.arange(4), None),
    "bool_plus_python_int": (lambda a, b: a + 1, torch.tensor([True, False]), None),
    "int_true_divide_python_int": (lambda a, b: a / 2, torch.arange(4), None),
    "half_plus_python_float": (lambda a, b: a + 0.5, torch.randn(4).half(), None),
    "comparison": (lambda a, b: a < b, torch.arange(4), torch.randn(4)),
    "where_mixed": (lambda a, b: torch.where(a > 1, a, b), torch.arange(4), torch.randn(4).half()),
}


@pytest.mark.parametrize("name", sorted(PROMOTION_CASES))
def test_type_promotion_matches_cpu(name):
    fn, a, b = PROMOTION_CASES[name]
    compare(fn, a, b)


@pytest.mark.parametrize(
    "fn, make",
    [
        (lambda t: t * 2.5, lambda: torch.randn(4)),
        (lambda t: t + 1.5, lambda: torch.arange(4)),
        (lambda t: t / 3.0, lambda: torch.randn(4)),
        (lambda t: t * 1j, lambda: torch.randn(4, dtype=torch.complex64)),
        (lambda t: t + torch.tensor(1.5, dtype=torch.float64), lambda: torch.randn(4)),
    ],
    ids=["float_times_py_float", "int_plus_py_float", "float_div_py_float", "complex64_times_py_complex",
         "float_plus_cpu_0d_double"],
)
def test_scalar_that_does_not_decide_dtype_keeps_result_dtype(fn, make):
    """Python float/complex scalars are wrapped float64/complex128 numbers and a CPU 0-d
    float64 tensor is a scalar too: neither may switch on the float64 rule."""
    compare(fn, make())


# ------------------------------------------------------- mixing CPU tensors

def test_cpu_zero_dim_tensor_with_neuron_tensor_is_allowed():
    x = torch.randn(4)
    dev = x.to(NEURON)
    for scalar in (torch.tensor(2.0), torch.tensor(3), torch.tensor(True)):
        for fn in (lambda a, s: a + s, lambda a, s: s * a, lambda a, s: torch.maximum(a, s.to(a.dtype))):
            result = fn(dev, scalar)
            assert result.device == NEURON
            assert_matches(result, fn(x, scalar))
    out = dev.clone()
    out.mul_(torch.tensor(4.0))
    torch.testing.assert_close(out.cpu(), x * 4)


def test_neuron_zero_dim_tensor_with_cpu_tensor_is_rejected_like_cuda():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.tensor(2.0, device=NEURON) + torch.ones(3)


@pytest.mark.parametrize(
    "fn",
    [
        lambda d, c: d + c,
        lambda d, c: c + d,
        lambda d, c: torch.mm(d.view(2, 2), c.view(2, 2)),
        lambda d, c: torch.cat([d, c]),
        lambda d, c: torch.where(d > 0, d, c),
        lambda d, c: d.add_(c),
    ],
    ids=["add", "radd", "mm", "cat", "where", "add_"],
)
def test_non_scalar_cpu_tensor_with_neuron_tensor_raises(fn):
    """CUDA's sentence, then TorchNeuron's ("... is on cpu device, expected neuron")."""
    with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but found at "
                                           r"least two devices, neuron:0 and cpu! Non-scalar tensor "
                                           r"argument '\w+' of aten::\w+(\.\w+)? is on cpu device, "
                                           r"expected neuron; move it"):
        fn(torch.randn(4, device=NEURON), torch.randn(4))


@needs_two_cores
@pytest.mark.parametrize(
    "fn",
    [lambda a, b: a + b, lambda a, b: torch.mm(a.view(2, 2), b.view(2, 2)), lambda a, b: torch.cat([a, b])],
    ids=["add", "mm", "cat"],
)
def test_neuron0_with_neuron1_raises(fn):
    a = torch.randn(4, device="neuron:0")
    b = torch.randn(4, device="neuron:1")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*neuron:0.*neuron:1"):
        fn(a, b)


@needs_two_cores
def test_ops_on_second_core_stay_there():
    x = torch.randn(3, 4)
    dev = x.to("neuron:1")
    assert dev.device == torch.device("neuron", 1)
    result = (dev * dev).sum(1)
    assert result.device == torch.device("neuron", 1)
    torch.testing.assert_close(result.cpu(), (x * x).sum(1))
    assert torch.arange(3, device="neuron:1").device.index == 1
    with torch.neuron.device(1):
        assert torch.ones(2, device="neuron").device.index == 1


# -------------------------------------------------------- advanced indexing

def test_bool_mask_on_neuron_and_on_cpu():
    x = torch.randn(5, 6)
    mask = x > 0
    dev = x.to(NEURON)
    assert_matches(dev[mask.to(NEURON)], x[mask], **EXACT)
    assert_matches(dev[mask], x[mask], **EXACT)  # CPU mask, as CUDA allows
    row_mask = torch.tensor([True, False, True, True, False])
    assert_matches(dev[row_mask.to(NEURON)], x[row_mask], **EXACT)
    assert_matches(dev[row_mask], x[row_mask], **EXACT)


@pytest.mark.parametrize("index_device", ["cpu", "neuron"])
@pytest.mark.parametrize(
    "fn",
    [
        lambda t, i: t[i],
        lambda t, i: t[:, i],
        lambda t, i: t[i, 1:4],
        lambda t, i: t[i, i],
        lambda t, i: t[..., i],
        lambda t, i: t[None, i],
        lambda t, i: t[i.view(3, 1), i.view(1, 3)],
        lambda t, i: t[-i - 1],
    ],
    ids=["rows", "cols", "rows_slice", "pairs", "ellipsis", "none", "broadcast", "negative"],
)
def test_index_tensor(index_device, fn):
    x = torch.randn(5, 6)
    idx = torch.tensor([0, 2, 4])
    dev = x.to(NEURON)
    assert_matches(fn(dev, idx.to(index_device)), fn(x, idx), **EXACT)


@pytest.mark.parametrize("index_device", ["cpu", "neuron"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_(index_device, accumulate):
    x = torch.randn(5, 6)
    rows = torch.tensor([0, 2, 2, 4])
    values = torch.randn(4, 6)
    expected = x.clone().index_put_((rows,), values, accumulate=accumulate)
    dev = x.to(NEURON)
    result = dev.index_put_((rows.to(index_device),), values.to(NEURON), accumulate=accumulate)
    assert result is dev
    if accumulate:
        torch.testing.assert_close(dev.cpu(), expected)
    else:  # duplicate indices: either write may win, on CPU too; check the unique rows
        torch.testing.assert_close(dev.cpu()[[0, 1, 3, 4]], expected[[0, 1, 3, 4]], **EXACT)


def test_setitem_with_masks_and_indices():
    x = torch.randn(5, 6)
    cpu, dev = x.clone(), x.to(NEURON)
    for t in (cpu, dev):
        t[t > 1] = 0.0
        t[torch.tensor([1, 3], device=t.device), 2] = torch.tensor([5.0, 6.0], device=t.device)
        t[torch.tensor([0, 4])] = -1.0  # CPU index into either
        t[:, torch.tensor([True, False, True, False, False, False], device=t.device)] += 1
    torch.testing.assert_close(dev.cpu(), cpu, **EXACT)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t, i: t.gather(1, i),
        lambda t, i: t.index_select(0, i[:, 0]),
        lambda t, i: torch.zeros_like(t).scatter_(1, i, t),
        lambda t, i: torch.zeros_like(t).scatter_add_(1, i, t),
        lambda t, i: t.take(i),
        lambda t, i: torch.take_along_dim(t, i, 1),
        lambda t, i: t.masked_select(t > 0),
        lambda t, i: t.nonzero(),
        lambda t, i: torch.zeros(4, 3, device=t.device).index_fill_(0, i[:2, 0], 2.0),
    ],
    ids=["gather", "index_select", "scatter", "scatter_add", "take", "take_along_dim",
         "masked_select", "nonzero", "index_fill"],
)
def test_gather_scatter_family(fn):
    x = torch.randn(4, 3)
    idx = torch.randint(0, 3, (4, 3))
    compare(fn, x, idx, **EXACT)


def test_index_out_of_range_raises():
    dev = torch.randn(3, device=NEURON)
    with pytest.raises(IndexError):
        dev[torch.tensor([5], device=NEURON)]


# ----------------------------------------------------------- item / tolist

@pytest.mark.parametrize(
    "value",
    [torch.tensor(1.5), torch.tensor(-7), torch.tensor(True), torch.tensor(2 - 3j),
     torch.tensor(0.1, dtype=torch.float64), torch.tensor(1.3).bfloat16(), torch.tensor(200, dtype=torch.uint8)],
    ids=["float", "int", "bool", "complex", "double", "bf16", "uint8"],
)
def test_item(value):
    result = value.to(NEURON).item()
    assert type(result) is type(value.item())
    assert result == value.item()


def test_item_of_element_and_errors():
    x = torch.randn(3, 4)
    dev = x.to(NEURON)
    assert dev[1, 2].item() == x[1, 2].item()
    assert dev.sum().item() == pytest.approx(x.sum().item(), rel=1e-6)
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        dev.item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16, torch.complex64])
def test_tolist(dtype):
    x = (torch.randn(3, 4) * 5).to(dtype)
    assert x.to(NEURON).tolist() == x.tolist()
    assert x.to(NEURON).t()[1:].tolist() == x.t()[1:].tolist()
    assert torch.tensor(3, device=NEURON).tolist() == 3


def test_bool_and_float_conversion_of_zero_dim():
    assert bool(torch.tensor(True, device=NEURON)) is True
    assert float(torch.tensor(2.5, device=NEURON)) == 2.5
    assert int(torch.tensor(7, device=NEURON)) == 7
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(torch.ones(2, device=NEURON))


def test_numpy_requires_cpu():
    with pytest.raises(TypeError, match="neuron"):
        torch.ones(2, device=NEURON).numpy()


# ------------------------------------------------------ copies across devices

def test_cpu_to_neuron_and_back():
    x = torch.randn(7, 5)
    dev = x.to(NEURON)
    assert dev.device == NEURON and dev.is_contiguous()
    back = dev.cpu()
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, x, **EXACT)
    assert back.data_ptr() != x.data_ptr()
    back.add_(1)  # independent memory
    torch.testing.assert_close(dev.cpu(), x, **EXACT)


def test_copy_non_contiguous_across_devices():
    x = torch.randn(6, 8)
    dev = x.t().to(NEURON)
    torch.testing.assert_close(dev.cpu(), x.t(), **EXACT)
    target = torch.zeros(8, 6, device=NEURON)
    target[::2].copy_(x.t()[::2])  # strided CPU source into strided device view
    expected = torch.zeros(8, 6)
    expected[::2] = x.t()[::2]
    torch.testing.assert_close(target.cpu(), expected, **EXACT)
    host = torch.zeros(4, 6)
    host.copy_(dev[1::2])  # strided device source into CPU tensor
    torch.testing.assert_close(host, x.t()[1::2], **EXACT)


def test_copy_with_broadcast_and_dtype_change_across_devices():
    target = torch.zeros(3, 4, dtype=torch.float16, device=NEURON)
    row = torch.arange(4, dtype=torch.int64)
    target.copy_(row)
    torch.testing.assert_close(target.cpu(), row.half().expand(3, 4), **EXACT)
    host = torch.zeros(3, 4, dtype=torch.int32)
    host.copy_(torch.full((4,), 2.7, device=NEURON))
    torch.testing.assert_close(host, torch.full((3, 4), 2, dtype=torch.int32), **EXACT)


def test_to_other_tensor_and_non_blocking():
    x = torch.randn(3)
    dev = x.to(torch.zeros(1, dtype=torch.float16, device=NEURON))
    assert dev.device == NEURON and dev.dtype == torch.float16
    back = dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(back, x.half(), **EXACT)


def test_to_same_device_is_a_no_op():
    dev = torch.randn(3, device=NEURON)
    assert dev.to(NEURON) is dev
    assert dev.to("neuron") is dev
    assert dev.to(NEURON, copy=True) is not dev


def test_copy_from_and_resize_takes_host_sources_of_the_same_size():
    """PyTorch's CPU fallback writes results back through _copy_from_and_resize: from the host
    into a tensor of the same size, or an empty one (resized), as TorchNeuron and OpenReg do."""
    src = torch.randn(10, 20)
    empty = torch.empty(0, device=NEURON)
    assert torch._copy_from_and_resize(src, empty) is empty
    torch.testing.assert_close(empty.cpu(), src, **EXACT)
    with pytest.raises(RuntimeError, match=r"^_copy_from_and_resize now only support copy with same "
                                           r"size, or dst.numel\(\) == 0! Got src \[10, 20\] and "
                                           r"dst \[5, 5\]"):
        torch._copy_from_and_resize(src, torch.empty(5, 5, device=NEURON))
    device_src = torch.empty(10, 10, device=NEURON)
    for dst in (torch.empty(0, device=NEURON), torch.empty(0)):
        with pytest.raises(RuntimeError, match="^_copy_from_and_resize now only support copy from "
                                               f"cpu tensor to neuron tensor, but got src tensor "
                                               f"device is neuron:0 and dst device is {dst.device}"):
            torch._copy_from_and_resize(device_src, dst)


def test_set_takes_neuron_memory_only():
    target = torch.empty(0, device=NEURON)
    with pytest.raises(RuntimeError, match="^set_: expected neuron source tensor, but got source "
                                           "tensor on device cpu"):
        target.set_(torch.randn(3))
    with pytest.raises(RuntimeError, match="^set_: expected neuron storage, but got storage on "
                                           "device cpu"):
        target.set_(torch.randn(3).untyped_storage())
    with pytest.raises(RuntimeError, match="^set_: expected neuron storage"):
        target.set_(torch.randn(3).untyped_storage(), 0, (3,), (1,))
    source = torch.arange(3.0, device=NEURON)
    assert target.set_(source).data_ptr() == source.data_ptr()


@needs_two_cores
def test_copy_neuron0_to_neuron1_with_copy_():
    x = torch.randn(5, 6)
    target = torch.empty(5, 6, device="neuron:1")
    target.copy_(x.to("neuron:0"))
    torch.testing.assert_close(target.cpu(), x, **EXACT)


@needs_two_cores
def test_copy_neuron0_to_neuron1_with_to():
    x = torch.randn(5, 6)
    moved = x.to("neuron:0").to("neuron:1")
    assert moved.device == torch.device("neuron", 1)
    torch.testing.assert_close(moved.cpu(), x, **EXACT)
    torch.testing.assert_close(moved.t().to("neuron:0").cpu(), x.t(), **EXACT)


# -------------------------------------------------------- dtype conversions

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("source", DTYPES, ids=str)
@pytest.mark.parametrize("target", DTYPES, ids=str)
def test_dtype_conversion(source, target):
    x = (torch.randn(4, 5) * 50).to(source)
    if source == torch.bool:
        x = torch.rand(4, 5) > 0.5
    compare(lambda t: t.to(target), x, **EXACT)
    compare(lambda t: t.t().to(target), x, **EXACT)  # non-contiguous source


def test_dtype_shortcuts():
    x = torch.randn(3, 3) * 10
    for method in ("half", "bfloat16", "float", "double", "long", "int", "short", "char", "byte", "bool"):
        compare(lambda t: getattr(t, method)(), x, **EXACT)
    compare(lambda t: t.type(torch.int16), x, **EXACT)
    compare(lambda t: t.to(NEURON if t.device.type == "neuron" else "cpu", torch.float16), x, **EXACT)


def test_special_values_survive_conversion():
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e-40, 65504.0, 1e6])
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        compare(lambda t: t.to(dtype), x, **EXACT)


# ------------------------------------- CPU kernels that allocate through oneDNN

# CPU kernels that allocate through c10::Allocator::raw_allocate (oneDNN: convolution,
# exact GELU) once aborted the process (std::terminate) when run over device memory, or
# on plain CPU tensors after the first device op. Each snippet runs in its own
# process so that a regression fails one test instead of killing the session.
ONEDNN_SNIPPETS = {
    "conv2d_on_device": """
        x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
        got = F.conv2d(x.to("neuron"), w.to("neuron"))
        torch.testing.assert_close(got.cpu(), F.conv2d(x, w), rtol=1e-4, atol=1e-4)
    """,
    "depthwise_conv2d_on_device": """
        x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 1, 3, 3)
        got = F.conv2d(x.to("neuron"), w.to("neuron"), groups=4)
        torch.testing.assert_close(got.cpu(), F.conv2d(x, w, groups=4), rtol=1e-4, atol=1e-4)
    """,
    "cpu_conv2d_after_device_use": """
        x, w = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3)
        expected = F.conv2d(x, w)
        torch.ones(2, device="neuron").add_(1)   # first device op installs the capture allocator
        torch.testing.assert_close(F.conv2d(x, w), expected)
    """,
    "gelu_on_device": """
        x = torch.randn(16, 64)
        dev = x.to("neuron").requires_grad_()
        out = F.gelu(dev)
        torch.testing.assert_close(out.detach().cpu(), F.gelu(x))
        out.sum().backward()
        cpu = x.clone().requires_grad_()
        F.gelu(cpu).sum().backward()
        torch.testing.assert_close(dev.grad.cpu(), cpu.grad)
    """,
    "cpu_gelu_after_device_use": """
        x = torch.randn(16, 64)
        expected = F.gelu(x)
        torch.ones(2, device="neuron").add_(1)
        torch.testing.assert_close(F.gelu(x), expected)
    """,
}


# One interpreter imports torch (without touching the device) and forks a child
# per snippet, so a snippet that aborts takes down only its own child.
_FORK_RUNNER = """
import json, os, sys, textwrap, traceback
import torch
import torch.nn.functional as F
snippets = json.loads(sys.argv[1])
status = {}
for name, code in snippets.items():
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            exec(textwrap.dedent(code), {"torch": torch, "F": F})
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, code = os.waitpid(pid, 0)
    status[name] = os.waitstatus_to_exitcode(code)
print(json.dumps(status))
"""


@pytest.fixture(scope="module")
def onednn_status():
    proc = subprocess.run([sys.executable, "-c", _FORK_RUNNER, json.dumps(ONEDNN_SNIPPETS)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("name", sorted(ONEDNN_SNIPPETS))
def test_onednn_kernels_do_not_abort(onednn_status, name):
    status, stderr = onednn_status
    assert status[name] == 0, f"{name}: exit status {status[name]}\n{stderr[-1500:]}"


@pytest.mark.parametrize("output_mask", [(True, True, True), (True, False, True), (False, True, False),
                                         (False, False, True)])
def test_convolution_backward_leaves_out_the_gradients_output_mask_does_not_ask_for(output_mask):
    """As CUDA and TorchNeuron: an unrequested gradient is undefined (None), the others match
    the CPU's (some CPU paths compute every gradient whatever the mask)."""
    x, w, g = torch.randn(2, 3, 7, 7), torch.randn(4, 3, 3, 3), torch.randn(2, 4, 7, 7)
    args = dict(bias_sizes=[4], stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False,
                output_padding=(0, 0), groups=1, output_mask=list(output_mask))
    want = torch.ops.aten.convolution_backward(g, x, w, **args)
    got = torch.ops.aten.convolution_backward(g.to(NEURON), x.to(NEURON), w.to(NEURON), **args)
    for asked, have, cpu in zip(output_mask, got, want):
        if asked:
            torch.testing.assert_close(have.cpu(), cpu, rtol=1e-4, atol=1e-4)
        else:
            assert have is None


def test_native_ops_used_here_do_not_fall_back():
    torch_neuronx.clear_op_tracking()
    x = torch.randn(4, 5, device=NEURON)
    x.t()[1:3].mul_(2)
    _ = x[x > 0], x[torch.tensor([0, 2])], x.to(torch.float16), x.tolist(), x.sum().item()
    torch.add(x, x, out=torch.empty(0, device=NEURON))
    assert torch_neuronx.get_fallback_ops() == {}


def test_histc_on_integer_tensors_like_cuda():
    """transformers' MoE layers call torch.histc on int32 expert ids (CUDA supports it, the
    CPU kernel does not); the device bins them as float32 and returns the input dtype."""
    ids = torch.tensor([0, 1, 1, 3, 7], dtype=torch.int32, device="neuron")
    counts = torch.histc(ids, bins=4, min=0, max=3)
    assert counts.dtype == torch.int32 and counts.device.type == "neuron"
    assert counts.cpu().tolist() == [1, 2, 0, 1]  # 7 lies outside [min, max]
    values = torch.randn(1000)
    torch.testing.assert_close(torch.histc(values.to("neuron"), 20, -2, 2).cpu(), torch.histc(values, 20, -2, 2))
    out = torch.empty(0, device="neuron")
    assert torch.histc(values.to("neuron"), 5, out=out) is out and out.shape == (5,)


def test_histc_out_of_another_dtype_is_refused():
    """As on CPU, CUDA and Trainium (TorchNeuron's wording: torch dtype names)."""
    x = torch.randn(100, device="neuron")
    out = torch.zeros(10, dtype=torch.int32, device="neuron")
    with pytest.raises(RuntimeError, match=r"^torch\.histogram: input tensor and hist tensor should "
                                           r"have the same dtype, but got input torch\.float32 and "
                                           r"hist torch\.int32"):
        torch.histc(x, bins=10, out=out)
    assert out.cpu().eq(0).all()
