"""FP8 and MX dtypes, FP8 compute on Trainium3 only (docs/fp8.md).

Dtypes (float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float4_e2m1fn_x2): store,
copy, view, cast, cat, index, transpose, contiguous and save/load, eager and
compiled, byte for byte against CPU PyTorch (all 256 byte values); where CPU
PyTorch raises (float4 has no conversion kernel), the device raises the same.
One known difference, stated in docs/fp8.md: compiled data movement may change
the payload bits of float8_e5m2 NaNs (XLA), so compiled e5m2 results are
compared bit for bit on non-NaN values and by NaN-ness elsewhere, as are
widening casts of NaNs (payload) and casts through bfloat16 (NaN sign).

Compute (torch._scaled_mm, torch._scaled_grouped_mm) on a trn3 profile, against
the reference (ops/float8.py: dequantize, float32 accumulation, cast to
out_dtype) and CPU PyTorch's _scaled_mm where it implements the case
(tensor-wise, row-wise). Tolerances: eager on the device runs the reference
itself, so eager equals it exactly; CPU's _scaled_mm and compiled results
differ from it only by the order of float32 sums: float32 results within
atol = 2 * K * eps(float32) * max|expected|; lower precision results within
that plus one unit in the last place of out_dtype (rtol = eps(out_dtype)).
Independent checks: MX scales are built with PyTorch's own to_blocked and
pack_uint4 and compared with a dequantization written in the test.

In-process tests switch profile through torch_neuronx.neuron._PROFILE (what the
runtime read from TORCH_NEURONX_INSTANCE at import); one subprocess runs a
trn3.3xlarge profile set by the environment variable, as a user would.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.common_quantized import pack_uint4, to_blocked

import seeds
import torch_neuronx
from torch_neuronx.compiler import NeuronCompileError
from torch_neuronx.neuron import profiles
from torch_neuronx import op_support as support
from torch_neuronx.ops import float8

DEVICE = "neuron"
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu]
DTYPES = FP8 + [torch.float4_e2m1fn_x2]
FP4_ERROR = "\"copy_kernel\" not implemented for 'Float4_e2m1fn_x2'"


def _gen(seed):
    return torch.Generator().manual_seed(seeds.seed(seed))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(
        {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(got, want, nan_bits_free=False):
    """Bit for bit; with nan_bits_free, NaNs only need to be NaN (compiled code: XLA may
    change a NaN's payload or sign when it moves float8_e5m2 data or widens a NaN)."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if nan_bits_free and want.is_floating_point():
        nan = want.float().isnan()
        assert torch.equal(got.float().isnan(), nan)
        assert torch.equal(_bits(got)[~nan], _bits(want)[~nan])
        return
    assert torch.equal(_bits(got), _bits(want))


def _all_bytes(dtype):
    return torch.arange(256, dtype=torch.uint8).reshape(16, 16).view(dtype)


# ------------------------------------------------------------------ dtypes, eager
def _eager_ops(dtype):
    """name -> fn(x) for every operation of item 1; fn receives a neuron or CPU tensor."""
    index = torch.tensor([3, 0, 15])
    return {
        "clone": lambda x: x.clone(),
        "copy_": lambda x: torch.empty_like(x).copy_(x),
        "view": lambda x: x.view(torch.uint8),
        "float": lambda x: x.float(),
        "bfloat16": lambda x: x.to(torch.bfloat16),
        "from_float": lambda x: torch.linspace(-500, 500, 64, device=x.device).to(dtype),
        "cat": lambda x: torch.cat([x, x[:3]]),
        "slice": lambda x: x[2:9:3],
        "index": lambda x: x[index.to(x.device)],
        "transpose_contiguous": lambda x: x.t().contiguous(),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_eager_matches_cpu(dtype):
    torch_neuronx.clear_op_tracking()
    x = _all_bytes(dtype)
    on_device = x.to(DEVICE)
    assert on_device.dtype == dtype and on_device.device.type == DEVICE
    assert_same_bits(on_device.cpu(), x)  # store and load back
    for name, fn in _eager_ops(dtype).items():
        try:
            want = fn(x)
        except NotImplementedError as error:  # float4 conversions and fancy indexing: as on CPU
            with pytest.raises(NotImplementedError, match=re.escape(str(error))):
                fn(on_device)
            continue
        got = fn(on_device)
        assert got.device.type == DEVICE, name
        assert_same_bits(got, want)
    buffer = io.BytesIO()
    torch.save({"t": on_device}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)["t"]
    assert loaded.device.type == DEVICE
    assert_same_bits(loaded, x)
    assert torch_neuronx.get_fallback_ops() == {}


def test_float4_conversion_raises_like_cpu():
    x = _all_bytes(torch.float4_e2m1fn_x2)
    for fn in (lambda t: t.float(), lambda t: t.float().to(torch.float4_e2m1fn_x2)):
        with pytest.raises(NotImplementedError, match=re.escape(FP4_ERROR)):
            fn(x)
        with pytest.raises(NotImplementedError, match=re.escape(FP4_ERROR)):
            fn(x.to(DEVICE))


# ------------------------------------------------------------------ dtypes, compiled
def _data_movement(x):
    return (x.clone(), x.view(torch.uint8), x.t().contiguous(), torch.cat([x, x[:3]]), x[2:9:3],
            x.t()[1:4].contiguous(), torch.stack([x, x]))


def _casts(x, f, dtype):
    return x.float(), x.to(torch.bfloat16), f.to(dtype), f.to(torch.bfloat16).to(dtype)


def _cast_sources():
    """float32 values around every float8 boundary: random bits, saturation, NaN, inf, zeros, subnormals."""
    bits = torch.randint(-2**31, 2**31 - 1, (4096,), generator=_gen(1), dtype=torch.int64).to(torch.int32)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448.0, 449.0, 464.0, -1e6,
                            57344.0, 61440.0, 1.5, 2.5, 3.0, 2.0**-127, 2.0**-126, 1e-40, -1e-40, 3.4e38])
    return torch.cat([bits.view(torch.float32), special])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_compiled_matches_cpu(dtype, fresh_dynamo):
    x = _all_bytes(dtype)
    moved = torch.compile(_data_movement, backend="neuron", fullgraph=True)(x.to(DEVICE))
    for got, want in zip(moved, _data_movement(x)):
        assert_same_bits(got, want, nan_bits_free=dtype == torch.float8_e5m2)
    if dtype == torch.float4_e2m1fn_x2:
        with pytest.raises(Exception, match=re.escape(FP4_ERROR)) as info:
            torch.compile(lambda t: t.float() * 2, backend="neuron", fullgraph=True)(x.to(DEVICE))
        assert "test_fp8.py" in str(info.value)  # the user's line
        return
    f = _cast_sources()
    got = torch.compile(_casts, backend="neuron", fullgraph=True)(x.to(DEVICE), f.to(DEVICE), dtype)
    widened, direct, through_bf16 = got[:2], got[2], got[3]
    want = _casts(x, f, dtype)
    for g, w in zip(widened, want[:2]):
        assert_same_bits(g, w, nan_bits_free=True)
    assert_same_bits(direct, want[2])  # float32 -> float8: every bit, NaN signs included
    assert_same_bits(through_bf16, want[3], nan_bits_free=True)


# ------------------------------------------------------------------ profiles
@pytest.fixture
def trn3(monkeypatch):
    monkeypatch.setattr(torch_neuronx.neuron, "_PROFILE", profiles.PROFILES["trn3.3xlarge"])


@pytest.fixture
def trn2(monkeypatch):
    monkeypatch.setattr(torch_neuronx.neuron, "_PROFILE", profiles.PROFILES["trn2.3xlarge"])


# ------------------------------------------------------------------ _scaled_mm
def _fp8(shape, dtype, seed, scale=3.0):
    return (torch.randn(shape, generator=_gen(seed)) * scale).to(dtype)


def _scales(shape, seed):
    return torch.rand(shape, generator=_gen(seed)) + 0.1


def _tolerance(k, expected, out_dtype):
    atol = 2 * k * torch.finfo(torch.float32).eps * float(expected.float().abs().max())
    rtol = 0.0 if out_dtype == torch.float32 else torch.finfo(out_dtype).eps
    return dict(rtol=rtol, atol=atol + (1e-6 if rtol else 0.0))


def _cpu_cases():
    """(name, args, kwargs): tensor-wise and row-wise, the cases CPU PyTorch implements."""
    cases = []
    for m, k, n in [(16, 32, 16), (7, 96, 5), (64, 256, 48)]:
        for i, dtype in enumerate((torch.float8_e4m3fn, torch.float8_e5m2)):
            a, b = _fp8((m, k), dtype, m + i), _fp8((n, k), dtype, n + 7 + i).t()  # mat2 column-major
            for mode, (sa, sb) in {"tensorwise": (torch.tensor(0.37), torch.tensor(1.7)),
                                   "rowwise": (_scales((m, 1), 3), _scales((1, n), 4))}.items():
                for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
                    cases.append((f"{mode}-{m}x{k}x{n}-{dtype}-{out_dtype}", (a, b, sa, sb),
                                  dict(out_dtype=out_dtype)))
                bias = torch.randn(n, generator=_gen(5)).to(torch.bfloat16)
                cases.append((f"{mode}-bias-{m}x{k}x{n}-{dtype}", (a, b, sa, sb),
                              dict(bias=bias, out_dtype=torch.bfloat16)))
    a, b = _fp8((16, 32), torch.float8_e4m3fn, 9), _fp8((24, 32), torch.float8_e4m3fn, 10).t()
    cases.append(("fp8-out-scale-result", (a, b, torch.tensor(0.5), torch.tensor(2.0)),
                  dict(scale_result=torch.tensor(4.0), out_dtype=torch.float8_e4m3fn)))
    cases.append(("default-out-dtype", (a, b, torch.tensor(0.01), torch.tensor(0.02)), {}))
    return cases


def _exact(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None):
    """Tensor-wise or row-wise torch._scaled_mm as PyTorch defines it, in float64 on the host:
    the yardstick that does not depend on the machine. CPU PyTorch's own FP8 kernels take
    instruction-set-specific paths (oneDNN, AMX), so their last bits depend on the CPU."""
    out = (a.double() * scale_a.double()) @ (b.double() * scale_b.double())
    if bias is not None:
        out = out + bias.double()
    out_dtype = out_dtype or a.dtype
    if out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and scale_result is not None:
        out = out / scale_result.double()
    return out.to(out_dtype)


def _to(args, kwargs, device):
    move = lambda v: v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return [move(a) for a in args], {k: move(v) for k, v in kwargs.items()}


def _assert_close(got, want, k, out_dtype):
    if want.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        got, want = got.float(), want.float()
        torch.testing.assert_close(got.cpu(), want, rtol=0.125, atol=float(want.abs().max()) * 2**-8)
        return
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu().float(), want.float(), **_tolerance(k, want, out_dtype))


def test_scaled_mm_eager_matches_reference_and_exact(trn3):
    torch_neuronx.clear_op_tracking()
    for name, args, kwargs in _cpu_cases():
        reference = float8.scaled_mm_reference(*args, **kwargs)
        exact = _exact(*args, **kwargs)
        dargs, dkwargs = _to(args, kwargs, DEVICE)
        got = torch._scaled_mm(*dargs, **dkwargs)
        assert got.device.type == DEVICE and got.dtype == exact.dtype, name
        assert torch.equal(_bits(got.cpu()), _bits(reference)), name  # eager runs the reference
        _assert_close(reference, exact, args[0].shape[1], kwargs.get("out_dtype", torch.float32))
    out = torch.empty(0, dtype=torch.bfloat16, device=DEVICE)
    args, kwargs = _cpu_cases()[0][1:]
    torch._scaled_mm(*_to(args, {}, DEVICE)[0], out_dtype=torch.bfloat16, out=out)
    assert torch.equal(out.cpu(), float8.scaled_mm_reference(*args, out_dtype=torch.bfloat16))
    assert torch_neuronx.get_fallback_ops() == {}  # it ran as the device's kernel, not by CPU fallback


def _mx_case(m, k, n, element, seed):
    """MXFP8 / MXFP4 / NVFP4 operands, scales in PyTorch's blocked layout (to_blocked),
    and the expected float32 product, dequantized independently of ops/float8.py."""
    block = 16 if element == "nvfp4" else 32
    sa_matrix = torch.randint(122, 132, (m, k // block), generator=_gen(seed), dtype=torch.uint8)
    sb_matrix = torch.randint(122, 132, (n, k // block), generator=_gen(seed + 1), dtype=torch.uint8)
    if element == "nvfp4":
        sa_matrix = (torch.rand(m, k // block, generator=_gen(seed)) + 0.5).to(torch.float8_e4m3fn)
        sb_matrix = (torch.rand(n, k // block, generator=_gen(seed + 1)) + 0.5).to(torch.float8_e4m3fn)
    else:
        sa_matrix, sb_matrix = sa_matrix.view(torch.float8_e8m0fnu), sb_matrix.view(torch.float8_e8m0fnu)
    if element == "mxfp8":
        a, b = _fp8((m, k), torch.float8_e4m3fn, seed + 2, 1.0), _fp8((n, k), torch.float8_e4m3fn, seed + 3, 1.0)
        av, bv, mat_a, mat_b = a.float(), b.float(), a, b.t()
    else:  # float4: codes 0..15, packed two per byte along K
        codes_a = torch.randint(0, 16, (m, k), generator=_gen(seed + 2), dtype=torch.uint8)
        codes_b = torch.randint(0, 16, (n, k), generator=_gen(seed + 3), dtype=torch.uint8)
        e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
        av, bv = e2m1[codes_a.long()], e2m1[codes_b.long()]
        mat_a = pack_uint4(codes_a).view(torch.float4_e2m1fn_x2)
        mat_b = pack_uint4(codes_b).view(torch.float4_e2m1fn_x2).t()
    expected = (av * sa_matrix.float().repeat_interleave(block, 1)) @ (bv * sb_matrix.float().repeat_interleave(block, 1)).t()
    return (mat_a, mat_b, to_blocked(sa_matrix), to_blocked(sb_matrix)), expected


def _blockwise_case(m, k, n, seed):
    """DeepSeek-style blocks: self 1x128 (per row, 128 of K), mat2 128x128."""
    a, b = _fp8((m, k), torch.float8_e4m3fn, seed), _fp8((n, k), torch.float8_e4m3fn, seed + 1).t()
    kb, nb = math.ceil(k / 128), math.ceil(n / 128)
    sa, sb = _scales((m, kb), seed + 2), _scales((kb, nb), seed + 3)
    full_a = sa.repeat_interleave(128, 1)[:, :k]
    full_b = sb.repeat_interleave(128, 0).repeat_interleave(128, 1)[:k, :n]
    return (a, b, sa, sb), (a.float() * full_a) @ (b.float() * full_b)


MX_CASES = [("mxfp8", 40, 96, 20), ("mxfp8", 130, 64, 129), ("mxfp4", 33, 128, 17), ("nvfp4", 20, 64, 36)]


@pytest.mark.parametrize("element,m,k,n", MX_CASES)
def test_scaled_mm_block_scaling_eager(element, m, k, n, trn3):
    args, expected = _mx_case(m, k, n, element, seed=m + n)
    got = torch._scaled_mm(*_to(args, {}, DEVICE)[0], out_dtype=torch.float32)
    torch.testing.assert_close(got.cpu(), expected, **_tolerance(k, expected, torch.float32))
    bf16 = torch._scaled_mm(*_to(args, {}, DEVICE)[0], out_dtype=torch.bfloat16)
    torch.testing.assert_close(bf16.cpu().float(), expected, **_tolerance(k, expected, torch.bfloat16))
    with pytest.raises(ValueError, match="Invalid scaling configuration"):
        torch._scaled_mm(*args, out_dtype=torch.float32)  # CPU PyTorch does not implement block scaling


def test_scaled_mm_blockwise_eager(trn3):
    for m, k, n in [(5, 256, 130), (129, 200, 64)]:
        args, expected = _blockwise_case(m, k, n, seed=m)
        got = torch._scaled_mm(*_to(args, {}, DEVICE)[0], out_dtype=torch.float32)
        torch.testing.assert_close(got.cpu(), expected, **_tolerance(k, expected, torch.float32))


def _compiled_cases(a, b, sa, sb, mx_args, fp4_args, block_args, bias):
    return (
        torch._scaled_mm(a, b, sa[0, 0], sb[0, 0], bias=bias, out_dtype=torch.bfloat16),
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float32),
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float16),
        torch._scaled_mm(*mx_args, out_dtype=torch.bfloat16),
        torch._scaled_mm(*fp4_args, out_dtype=torch.float32),
        torch._scaled_mm(*block_args, out_dtype=torch.float32),
        torch._scaled_mm(a, b, sa[0, 0], sb[0, 0], scale_result=sa[0, 0], out_dtype=torch.float8_e4m3fn),
    )


def test_scaled_mm_compiled_matches_reference(trn3, fresh_dynamo):
    m, k, n = 48, 128, 40
    a, b = _fp8((m, k), torch.float8_e4m3fn, 1), _fp8((n, k), torch.float8_e4m3fn, 2).t()
    sa, sb = _scales((m, 1), 3), _scales((1, n), 4)
    mx_args, _ = _mx_case(40, 96, 20, "mxfp8", 5)
    fp4_args, _ = _mx_case(33, 128, 17, "mxfp4", 6)
    block_args, _ = _blockwise_case(20, 256, 36, 7)
    bias = torch.randn(n, generator=_gen(8)).to(torch.bfloat16)
    args = (a, b, sa, sb, mx_args, fp4_args, block_args, bias)
    device_args = [tuple(t.to(DEVICE) for t in v) if isinstance(v, tuple) else v.to(DEVICE) for v in args]
    got = torch.compile(_compiled_cases, backend="neuron", fullgraph=True)(*device_args)
    want = _compiled_cases(*device_args)  # eager on the device: the reference
    for g, w, length in zip(got, want, (k, k, k, 96, 128, 256, k)):
        _assert_close(g, w.cpu(), length, w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.float32)
    _assert_close(got[1], _exact(a, b, sa, sb, out_dtype=torch.float32), k, torch.float32)


def test_torchao_style_float8_linear_compiled(trn3, fresh_dynamo):
    """What TorchAO's float8 training does per linear: amax scales, cast with clamp,
    _scaled_mm with mat2 column-major and bf16 output, in one compiled graph."""
    def float8_linear(x, w, mm=torch._scaled_mm):
        def to_float8(t, dim=None):
            amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
            scale = 448.0 / amax.float().clamp(min=1e-12)
            return (t.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale.reciprocal()
        xq, xs = to_float8(x)
        wq, ws = to_float8(w)
        tensorwise = mm(xq, wq.t(), xs, ws, out_dtype=torch.bfloat16)
        xq, xs = to_float8(x, -1)
        wq, ws = to_float8(w, -1)
        rowwise = mm(xq, wq.t(), xs, ws.t(), out_dtype=torch.bfloat16)
        return tensorwise, rowwise
    x = torch.randn(32, 64, generator=_gen(11)).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=_gen(12)).to(torch.bfloat16)
    compiled = torch.compile(float8_linear, backend="neuron", fullgraph=True)(x.to(DEVICE), w.to(DEVICE))
    eager = float8_linear(x.to(DEVICE), w.to(DEVICE))
    host = float8_linear(x, w, mm=_exact)  # the same casts on the host, the product in float64
    exact = (x.float() @ w.float().t())
    for c, e, want in zip(compiled, eager, host):
        _assert_close(e, want, 64, torch.bfloat16)
        _assert_close(c, want, 64, torch.bfloat16)
        # fp8 quantization error against the bf16 product: a few percent of its scale
        assert float((e.cpu().float() - exact).abs().max()) < 0.1 * float(exact.abs().max())


def _malformed():
    a, b = _fp8((16, 32), torch.float8_e4m3fn, 1), _fp8((24, 32), torch.float8_e4m3fn, 2).t()
    one = torch.tensor(1.0)
    return {
        "3d input": (a[None], b, one, one),
        "bf16 input": (a.bfloat16(), b, one, one),
        "float64 tensor-wise scale": (a, b, torch.tensor(1.0, dtype=torch.float64), one),
        "row-wise scale shape": (a, b, torch.rand(16, 1), torch.rand(24, 1)),
        "1-D row-wise scales": (a, b, torch.rand(16), torch.rand(24)),
        "MX scale size": (a, b, torch.ones(64, dtype=torch.uint8).view(torch.float8_e8m0fnu),
                          torch.ones(64, dtype=torch.uint8).view(torch.float8_e8m0fnu)),
    }


def _pytorch_error(args):
    """PyTorch's own check of the call, for CPU tensors (its meta kernel, under FakeTensorMode)."""
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args]
        with pytest.raises(RuntimeError) as info:
            torch._scaled_mm(*fake, out_dtype=torch.bfloat16)
    return str(info.value)


def test_malformed_scaled_mm_raises_pytorch_error(trn3, fresh_dynamo):
    for name, args in _malformed().items():
        want = _pytorch_error(args)
        with pytest.raises(RuntimeError) as info:
            torch._scaled_mm(*_to(args, {}, DEVICE)[0], out_dtype=torch.bfloat16)
        assert str(info.value) == want, name
    # Mismatched K: PyTorch's meta function does not check it; its generic CPU kernel's wording
    # (ATen's Blas.cpp) is the device's. Spelled here, not read from CPU PyTorch: CPU kernels
    # of other instruction sets (oneDNN's FP8 path) word it otherwise.
    a, b = _fp8((16, 32), torch.float8_e4m3fn, 1), _fp8((24, 16), torch.float8_e4m3fn, 2).t()
    with pytest.raises(RuntimeError) as device:
        torch._scaled_mm(a.to(DEVICE), b.to(DEVICE), torch.tensor(1.0, device=DEVICE), torch.tensor(1.0, device=DEVICE))
    assert str(device.value) == "mat_a and mat_b shapes cannot be multiplied (16x32 and 16x24)"
    args = _to(_malformed()["row-wise scale shape"], {}, DEVICE)[0]
    with pytest.raises(Exception, match=re.escape("Invalid scaling configuration")):  # at compile time
        torch.compile(lambda *t: torch._scaled_mm(*t, out_dtype=torch.bfloat16), backend="neuron")(*args)


# ------------------------------------------------------------------ _scaled_grouped_mm
def _grouped_cases():
    """The four forms of torch._scaled_grouped_mm with row-wise scales, offsets with an
    empty group and uneven groups (multiples of 16, as PyTorch aligns them)."""
    e4 = torch.float8_e4m3fn
    cases = []
    for offs in ([16, 16, 48, 64], [32, 64]):
        offs = torch.tensor(offs, dtype=torch.int32)
        g = offs.numel()
        rows = _fp8((64, 32), e4, 1)
        experts = _fp8((g, 48, 32), e4, 2).transpose(-2, -1)  # (G, K, N) column-major
        cases.append(("2d-3d", (rows, experts, _scales((64,), 3), _scales((g, 48), 4), offs)))
        a2, b2 = _fp8((32, 64), e4, 5), _fp8((48, 64), e4, 6).t()  # K split into groups
        cases.append(("2d-2d", (a2, b2, _scales((32 * g,), 7), _scales((48 * g,), 8), offs)))
        a3, b3 = _fp8((g, 16, 32), e4, 9), _fp8((64, 32), e4, 10).t()  # N split into groups
        cases.append(("3d-2d", (a3, b3, _scales((g, 16), 11), _scales((64,), 12), offs)))
    a, b = _fp8((3, 16, 32), e4, 13), _fp8((3, 48, 32), e4, 14).transpose(-2, -1)
    cases.append(("3d-3d", (a, b, _scales((3, 16), 15), _scales((3, 48), 16), None)))
    return cases


def _grouped_exact(name, a, b, sa, sb, offs):
    """The same product from row-wise _scaled_mm in float64 (_exact), one group at a time."""
    mm = lambda x, y, s, t: _exact(x, y, s, t, out_dtype=torch.float32)  # noqa: E731
    bounds = [] if offs is None else list(zip([0] + offs.tolist()[:-1], offs.tolist()))
    if name == "3d-3d":
        return torch.stack([mm(a[i], b[i], sa[i][:, None], sb[i][None]) for i in range(a.shape[0])])
    if name == "2d-3d":
        out = torch.zeros(a.shape[0], b.shape[2])
        for i, (s, e) in enumerate(bounds):
            if e > s:
                out[s:e] = mm(a[s:e], b[i], sa[s:e, None], sb[i][None])
        return out
    if name == "3d-2d":
        out = torch.zeros(a.shape[1], b.shape[1])
        for i, (s, e) in enumerate(bounds):
            if e > s:
                out[:, s:e] = mm(a[i], b[:, s:e], sa[i][:, None], sb[None, s:e].contiguous())
        return out
    m, n = a.shape[0], b.shape[1]
    return torch.stack([mm(a[:, s:e], b[s:e], sa[i * m:(i + 1) * m, None], sb[None, i * n:(i + 1) * n])
                        if e > s else torch.zeros(m, n) for i, (s, e) in enumerate(bounds)])


def _grouped(*args):
    return torch._scaled_grouped_mm(*args, out_dtype=torch.bfloat16)


def test_scaled_grouped_mm_eager_and_compiled(trn3, fresh_dynamo):
    torch_neuronx.clear_op_tracking()
    compiled = torch.compile(_grouped, backend="neuron", fullgraph=True)
    for name, args in _grouped_cases():
        k = args[0].shape[-1]
        by_group = _grouped_exact(name, *args)
        reference = float8.scaled_grouped_mm_reference(*args, out_dtype=torch.bfloat16)
        _assert_close(reference, by_group.to(torch.bfloat16), k, torch.bfloat16)
        dargs = [t.to(DEVICE) if t is not None else None for t in args]
        eager = _grouped(*dargs)
        assert torch.equal(eager.cpu(), reference), name
        _assert_close(compiled(*dargs), reference, k, torch.bfloat16)
    assert torch_neuronx.get_fallback_ops() == {}


# ------------------------------------------------------------------ the v2 API
def _v2(*args, **kwargs):
    return torch.nn.functional.scaled_mm(*args, **kwargs)


def _v2_cases():
    """torch.nn.functional.scaled_mm calls (the _scaled_mm_v2 op) and the _scaled_mm call each is."""
    S, Z = torch.nn.functional.ScalingType, torch.nn.functional.SwizzleType
    a, b = _fp8((24, 64), torch.float8_e4m3fn, 1), _fp8((40, 64), torch.float8_e4m3fn, 2).t()
    sa, sb = torch.tensor(0.75), torch.tensor(1.5)
    ra, rb = _scales((24, 1), 3), _scales((1, 40), 4)
    (ma, mb, mxa, mxb), _ = _mx_case(40, 96, 20, "mxfp8", seed=5)
    bf16 = dict(output_dtype=torch.bfloat16)
    return [
        ((a, b, sa, S.TensorWise, sb, S.TensorWise), bf16, (a, b, sa, sb)),
        ((a, b, ra, S.RowWise, rb, S.RowWise), bf16, (a, b, ra, rb)),
        ((ma, mb, mxa, S.BlockWise1x32, mxb, S.BlockWise1x32, Z.SWIZZLE_32_4_4, Z.SWIZZLE_32_4_4), bf16,
         (ma, mb, mxa, mxb)),
    ]


def test_scaled_mm_v2_is_scaled_mm_eager_and_compiled(trn3, fresh_dynamo):
    torch_neuronx.clear_op_tracking()
    compiled = torch.compile(_v2, backend="neuron", fullgraph=True)
    for args, kwargs, v1 in _v2_cases():
        want = float8.scaled_mm_reference(*v1, out_dtype=torch.bfloat16)
        dargs = [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in args]
        assert torch.equal(_v2(*dargs, **kwargs).cpu(), want)
        _assert_close(compiled(*dargs, **kwargs).cpu(), want, v1[0].shape[1], torch.bfloat16)
    S = torch.nn.functional.ScalingType
    for name, (a, b, sa, sb, offs) in (_grouped_cases()[0], _grouped_cases()[-1]):  # 2d-3d, 3d-3d
        want = float8.scaled_grouped_mm_reference(a, b, sa, sb, offs, out_dtype=torch.bfloat16)
        d = [t.to(DEVICE) if t is not None else None for t in (a, b, sa, sb, offs)]
        got = torch.nn.functional.scaled_grouped_mm(d[0], d[1], d[2], S.RowWise, d[3], S.RowWise, offs=d[4])
        assert torch.equal(got.cpu(), want), name
    assert torch_neuronx.get_fallback_ops() == {}
    a, b, ra, _, rb, _ = [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in _v2_cases()[1][0]]
    with pytest.raises(ValueError, match="row-wise scaling, but the recipes say TensorWise"):
        _v2(a, b, ra, S.TensorWise, rb, S.TensorWise, output_dtype=torch.bfloat16)
    (ma, mb, mxa, _, mxb, _, _, _), _, _ = _v2_cases()[2]
    with pytest.raises(NotImplementedError, match="must be swizzled"):
        _v2(ma.to(DEVICE), mb.to(DEVICE), mxa.to(DEVICE), S.BlockWise1x32, mxb.to(DEVICE), S.BlockWise1x32,
            output_dtype=torch.bfloat16)


def test_scaled_mm_v2_on_trn2_raises_the_fp8_error(trn2, fresh_dynamo):
    args, kwargs, _ = _v2_cases()[0]
    dargs = [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in args]
    with pytest.raises(RuntimeError, match="torch._scaled_mm_v2: FP8 compute needs Trainium3"):
        _v2(*dargs, **kwargs)
    with pytest.raises(Exception, match="FP8 compute needs Trainium3"):
        torch.compile(_v2, backend="neuron", fullgraph=True)(*dargs, **kwargs)
    assert torch_neuronx.get_fallback_ops() == {}


# ------------------------------------------------------------------ trn1/trn2: one clear error
def _fp8_call():
    a, b = _fp8((16, 32), torch.float8_e4m3fn, 1), _fp8((24, 32), torch.float8_e4m3fn, 2).t()
    return [t.to(DEVICE) for t in (a, b, torch.tensor(1.0), torch.tensor(1.0))]


def _user_function(a, b, sa, sb):
    y = a.float().sum()
    return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) + y  # the user's line


def test_trn2_raises_fp8_compute_error_eager_and_at_compile_time(monkeypatch, fresh_dynamo):
    args = _fp8_call()
    # compiled first on trn3: a warm AOTAutograd cache (which skips the backend's checks)
    # must not carry the graph over to trn2
    monkeypatch.setattr(torch_neuronx.neuron, "_PROFILE", profiles.PROFILES["trn3.3xlarge"])
    torch.compile(_user_function, backend="neuron", fullgraph=True)(*args)
    torch._dynamo.reset()
    monkeypatch.setattr(torch_neuronx.neuron, "_PROFILE", profiles.PROFILES["trn2.3xlarge"])
    with pytest.raises(RuntimeError) as eager:
        torch._scaled_mm(*args, out_dtype=torch.bfloat16)
    message = str(eager.value)
    for part in ("FP8 compute needs Trainium3", "trn2.3xlarge", "TORCH_NEURONX_INSTANCE=trn3.3xlarge"):
        assert part in message
    with pytest.raises(Exception) as compiled:
        torch.compile(_user_function, backend="neuron", fullgraph=True)(*args)
    text = str(compiled.value)
    assert "FP8 compute needs Trainium3" in text and "NeuronCompileError" in text
    line = _user_function.__code__.co_firstlineno + 2
    assert f'test_fp8.py", line {line}' in text  # the user's line
    grouped = _grouped_cases()[-1][1]
    with pytest.raises(RuntimeError, match="torch._scaled_grouped_mm: FP8 compute needs Trainium3"):
        _grouped(*[t.to(DEVICE) if t is not None else None for t in grouped])
    # storage and casts still work, and nothing fell back to the CPU
    assert torch.equal(args[0].float().cpu(), args[0].cpu().float())
    assert "_scaled_mm" not in str(torch_neuronx.get_fallback_ops())


def test_trn1_message_names_the_profile(monkeypatch):
    monkeypatch.setattr(torch_neuronx.neuron, "_PROFILE", profiles.PROFILES["trn1.32xlarge"])
    with pytest.raises(RuntimeError, match=r"this instance profile is trn1\.32xlarge \(trn1, NeuronCore-v2\)"):
        torch._scaled_mm(*_fp8_call())


def test_ops_command_answers_per_profile(monkeypatch):
    for name, runs in (("trn2.3xlarge", False), ("trn3.48xlarge", True)):
        monkeypatch.setattr(torch_neuronx.neuron, "_PROFILE", profiles.PROFILES[name])
        for op in ("_scaled_mm", "_scaled_grouped_mm"):
            record = support.op_support(op)
            assert (record.eager, record.compile) == (support.DIRECT, support.LOWERED)
            assert name in record.eager_reason and name in record.compile_reason
            assert ("FP8 compute runs on this profile" in record.eager_reason) == runs
            assert ("has no FP8 compute: it raises" in record.eager_reason) == (not runs)
            assert "Trainium3 only" in support._limitations(record)


# ------------------------------------------------------------------ a trn3 instance, as a user sets it
TRN3_SCRIPT = r"""
import json, torch
import torch_neuronx
from torch_neuronx import op_support as support
a = (torch.randn(32, 64) * 3).to(torch.float8_e4m3fn)
b = (torch.randn(16, 64) * 3).to(torch.float8_e4m3fn).t()
sa, sb = torch.rand(32, 1) + 0.1, torch.rand(1, 16) + 0.1
f = lambda *t: torch._scaled_mm(*t, out_dtype=torch.float32)
cpu = ((a.double() * sa.double()) @ (b.double() * sb.double())).float()  # float64: not CPU's ISA-specific FP8 kernel
args = [t.to("neuron") for t in (a, b, sa, sb)]
eager = f(*args).cpu()
compiled = torch.compile(f, backend="neuron", fullgraph=True)(*args).cpu()
print(json.dumps({
    "profile": torch.neuron.get_device_properties(0).instance,
    "eager_err": float((eager - cpu).abs().max()), "compiled_err": float((compiled - cpu).abs().max()),
    "scale": float(cpu.abs().max()), "fallbacks": torch_neuronx.get_fallback_ops(),
    "ops": support.op_support("_scaled_mm").eager_reason,
}))
"""


@pytest.fixture(scope="module")
def trn3_process():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_INSTANCE"] = "trn3.3xlarge"
    proc = subprocess.Popen([sys.executable, "-c", TRN3_SCRIPT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_trn3_instance_from_the_environment(trn3_process):
    out, err = trn3_process.communicate(timeout=300)
    assert trn3_process.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["profile"] == "trn3.3xlarge"
    assert result["fallbacks"] == {}
    atol = 2 * 64 * torch.finfo(torch.float32).eps * result["scale"]
    assert result["eager_err"] <= atol and result["compiled_err"] <= atol
    assert "FP8 compute runs on this profile (trn3.3xlarge" in result["ops"]


def test_audit_records_scaled_mm_and_costs_it_per_profile(trn3):
    """The eager kernel is Python: the audit records its calls (path "direct", an fp8
    hazard at the user's line), not the copies it makes inside; the estimate costs the
    recorded call at trn3's FP8 rate and lists it as not runnable on trn2."""
    from torch_neuronx.audit import estimate, recorder

    args = _fp8_call()
    recording = recorder.Recording()
    recording.start()
    try:
        torch._scaled_mm(*args, out_dtype=torch.bfloat16)  # the user's line
    finally:
        recording.stop()
    signatures = recording.record()["signatures"]
    scaled = [s for s in signatures if s["op"] == "aten::_scaled_mm"]
    assert len(scaled) == 1 and scaled[0]["calls"] == 1, signatures
    assert scaled[0]["path"] == "direct" and scaled[0]["hazards"] == ["fp8"]
    assert scaled[0]["sites"][0]["file"] == __file__
    assert [s["op"] for s in signatures] == ["aten::_scaled_mm"]  # its inner copy is not a call of its own
    sig = dict(scaled[0], calls_per_step=1.0)
    work = estimate.op_work(sig["op"], sig["args"])
    assert work["engine"] == "tensor" and work["flops"] == 2 * 16 * 32 * 24
    trn3_rates = estimate.core_rates(profiles.PROFILES["trn3.3xlarge"])
    trn3_est = estimate.estimate_step([sig], [], [], "trn3.3xlarge")
    low = max(work["flops"] / trn3_rates.fp8, work["bytes"] / trn3_rates.hbm)
    assert trn3_est["by_class"]["matmul"][0] == pytest.approx(low) and trn3_est["not_runnable"] == []
    assert estimate.estimate_step([sig], [], [], "trn2.3xlarge")["not_runnable"] == ["aten::_scaled_mm"]
