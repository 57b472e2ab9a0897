"""Lowerings added for the architecture sweep (benchmarks/arch_sweep.py), each
compiled with torch.compile(backend="neuron", fullgraph=True) and compared with
CPU PyTorch."""

import pytest
import torch

import seeds
# float32 complex products: a few ulps of reordering at most
ATOL, RTOL = 1e-5, 1e-5


def _compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", fullgraph=True)


def _llama4_rotary(xq, freqs_cis):
    # transformers' Llama 4 rotary embedding: real pairs viewed as complex, rotated, viewed back
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    return torch.view_as_real(xq_ * freqs_cis[:, :, None, :]).flatten(3)


def test_llama4_rotary_view_as_complex_and_back():
    g = torch.Generator().manual_seed(seeds.seed(0))
    xq = torch.randn(2, 8, 4, 16, generator=g)
    freqs = torch.polar(torch.ones(2, 8, 8), torch.randn(2, 8, 8, generator=g))
    expected = _llama4_rotary(xq, freqs)
    got = _compile(_llama4_rotary)(xq.to("neuron"), freqs.to("neuron"))
    assert got.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("shape", [(2,), (3, 5, 2)])
def test_view_as_complex_matches_cpu(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seeds.seed(1)))
    fn = lambda t: torch.view_as_complex(t) * (1 + 2j)  # noqa: E731  (an op after the view)
    got = _compile(fn)(x.to("neuron"))
    assert got.dtype == torch.complex64 and got.shape == shape[:-1]
    torch.testing.assert_close(got.cpu(), fn(x), atol=ATOL, rtol=RTOL)


def test_view_as_real_matches_cpu():
    g = torch.Generator().manual_seed(seeds.seed(2))
    z = torch.complex(torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g))
    fn = lambda t: torch.view_as_real(t * t) + 1  # noqa: E731
    got = _compile(fn)(z.to("neuron"))
    assert got.dtype == torch.float32 and got.shape == (4, 3, 2)
    torch.testing.assert_close(got.cpu(), fn(z), atol=ATOL, rtol=RTOL)
