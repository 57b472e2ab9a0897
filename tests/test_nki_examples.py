"""The sample kernels in examples/nki/ against NumPy / PyTorch references, and the torch-tensor
calling convention (outputs on the input's device and dtype, in-place write-back of arguments)."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_neuronx import nki
import torch_neuronx.nki.language as nl

from nki_examples import load_example  # noqa: E402


def bf16_tensor(shape, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16).to(device)


@pytest.mark.parametrize("name", ["tensor_add", "matmul", "softmax", "rmsnorm", "layernorm", "flash_attention"])
def test_example_main_runs(name, capsys):
    load_example(name).main()
    out = capsys.readouterr().out
    assert "estimated" in out


def test_tensor_add_numpy_and_torch_devices():
    ex = load_example("tensor_add")
    a, b = np.random.default_rng(0).standard_normal((2, 300, 200), dtype=np.float32)
    out = ex.tensor_add_kernel(a, b)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, a + b)
    for device in ("cpu", "neuron"):
        ta, tb = bf16_tensor((300, 200), device, 1), bf16_tensor((300, 200), device, 2)
        tout = ex.tensor_add_kernel(ta, tb)
        assert isinstance(tout, torch.Tensor) and tout.device.type == device and tout.dtype == torch.bfloat16
        torch.testing.assert_close(tout.cpu(), (ta.cpu() + tb.cpu()), rtol=0, atol=0)


def test_in_place_write_back_of_arguments():
    @nki.jit
    def add_into(a, b, out):
        x, y = nl.load(a), nl.load(b)
        nl.store(out, nl.add(x, y))

    a, b = np.ones((128, 16), np.float32), np.full((128, 16), 2.0, np.float32)
    out = np.zeros((128, 16), np.float32)
    assert add_into(a, b, out) is None
    np.testing.assert_array_equal(out, 3.0)
    for device in ("cpu", "neuron"):
        ta, tb = torch.ones(128, 16, device=device), torch.full((128, 16), 2.0, device=device)
        tout = torch.zeros(128, 16, device=device, dtype=torch.bfloat16)
        before = tout.data_ptr()
        add_into(ta, tb, tout)
        assert tout.data_ptr() == before and tout.device.type == device
        torch.testing.assert_close(tout.cpu(), torch.full((128, 16), 3.0, dtype=torch.bfloat16))
        assert torch.equal(ta.cpu(), torch.ones(128, 16))  # inputs the kernel only read are untouched


@pytest.mark.parametrize("kernel_name", ["matmul_naive", "matmul_optimized"])
def test_matmul_vs_torch(kernel_name):
    ex = load_example("matmul")
    kernel = getattr(ex, kernel_name)
    lhsT, rhs = bf16_tensor((512, 256), "neuron", 3), bf16_tensor((512, 1024), "neuron", 4)
    out = kernel(lhsT, rhs)
    assert out.device.type == "neuron" and out.dtype == torch.bfloat16
    ref = (lhsT.cpu().float().T @ rhs.cpu().float())
    # fp32 accumulation, one bf16 rounding of the result: within bf16 resolution of the reference.
    torch.testing.assert_close(out.cpu().float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    np_out = kernel(lhsT.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16),
                    rhs.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    assert np.array_equal(np_out.view(np.uint16), out.cpu().view(torch.int16).numpy().view(np.uint16))


def test_softmax_vs_torch():
    ex = load_example("softmax")
    x = torch.randn(300, 777, generator=torch.Generator().manual_seed(5)) * 4
    out = ex.softmax_kernel(x)
    torch.testing.assert_close(out, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-6)


def test_rmsnorm_vs_torch():
    ex = load_example("rmsnorm")
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(200, 512, generator=g), torch.randn(512, generator=g)
    out = ex.rmsnorm_kernel(x, w)
    torch.testing.assert_close(out, F.rms_norm(x, (512,), w, eps=1e-6), rtol=1e-5, atol=1e-5)


def test_layernorm_vs_torch():
    ex = load_example("layernorm")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(200, 1100, generator=g) * 3 + 1  # 3 bn_stats chunks, a partial row tile
    gamma, beta = torch.randn(1100, generator=g), torch.randn(1100, generator=g)
    out = ex.layernorm_kernel(x, gamma, beta)
    torch.testing.assert_close(out, F.layer_norm(x, (1100,), gamma, beta, eps=1e-5), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seq, d, dtype", [(1024, 128, torch.bfloat16), (512, 64, torch.float32)])
def test_flash_attention_vs_torch(seq, d, dtype):
    ex = load_example("flash_attention")
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(seq, d, generator=g).to(dtype) for _ in range(3))
    out = ex.flash_attention_fwd(q, k, v)
    ref = F.scaled_dot_product_attention(q.float()[None], k.float()[None], v.float()[None], is_causal=True)[0]
    # bf16 probabilities and output: about 2^-8 relative; fp32 inputs still round P to the input dtype only.
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
