"""Sharing NKI kernels through the Hugging Face `kernels` library, offline.

examples/nki/hub/build_kernel_repo.py packages the RMSNorm NKI kernel in the
noarch layout build/torch-neuron/ (metadata.json with backend.type "neuron").
The repository is loaded with get_local_kernel and through LOCAL_KERNELS, and
kernelize swaps it into a tiny transformers Llama on neuron: logits must match
the unkernelized model within 1e-5 (both fp32) and the NKI op must have run.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "examples" / "nki" / "hub" / "build_kernel_repo.py"


@pytest.fixture(scope="module")
def kernel_repo(tmp_path_factory) -> Path:
    """Built once per session: loading registers the op nki_rmsnorm::rmsnorm process-wide."""
    out = tmp_path_factory.mktemp("nki-rmsnorm")
    proc = subprocess.run([sys.executable, str(BUILDER), str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_repo_layout_and_metadata(kernel_repo):
    from kernels._rust import Metadata

    variant = kernel_repo / "build" / "torch-neuron"
    assert sorted(p.name for p in variant.iterdir()) == ["__init__.py", "layers.py", "metadata.json", "rmsnorm.py"]
    metadata = Metadata.read_from_file(variant / "metadata.json")
    assert str(metadata.backend.backend_type) == "neuron"
    assert metadata.name.python_name == "nki_rmsnorm"


def test_kernels_selects_its_neuron_backend():
    from kernels.backends import _backend

    assert _backend().name == "neuron"


def test_get_local_kernel_runs_the_nki_op_on_neuron(kernel_repo):
    module = kernels.get_local_kernel(kernel_repo)
    x = torch.randn(300, 64, device="neuron")
    w = torch.randn(64, device="neuron")
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(module.rmsnorm(x, w, 1e-6).cpu(), expected.cpu(), rtol=1e-5, atol=1e-5)


def test_kernelize_swaps_llama_rmsnorm_for_the_nki_kernel(kernel_repo, monkeypatch):
    from kernels import LayerRepository, Mode, kernelize, use_kernel_mapping
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setenv("LOCAL_KERNELS", f"local/nki-rmsnorm={kernel_repo}")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval().to("neuron")
    ids = torch.randint(0, 128, (2, 12), device="neuron")
    with torch.no_grad():
        reference = model(ids).logits

    repo = LayerRepository(repo_id="local/nki-rmsnorm", layer_name="RMSNorm", revision="main")
    with use_kernel_mapping({"RMSNorm": {"neuron": repo}}):
        kernelized = kernelize(copy.deepcopy(model), mode=Mode.INFERENCE, device="neuron")
    op = kernels.get_local_kernel(kernel_repo).rmsnorm
    calls_before = op.nki_cache.compiles + op.nki_cache.hits
    with torch.no_grad():
        logits = kernelized(ids).logits
    norms = 2 * config.num_hidden_layers + 1  # input + post-attention norm per layer, final norm
    assert op.nki_cache.compiles + op.nki_cache.hits - calls_before == norms
    torch.testing.assert_close(logits.cpu(), reference.cpu(), rtol=1e-5, atol=1e-5)
