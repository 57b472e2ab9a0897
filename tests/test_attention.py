"""scaled_dot_product_attention on neuron as TorchNeuron runs it: the device's backend
choice (overrideable for 4-D neuron tensors, csrc/Kernels.cpp), its two kernels
(torch_neuronx/ops/attention.py) against the CPU's F.scaled_dot_product_attention,
dropout's mask and generator, the errors, and compiled attention.

Tolerances: float32 1e-5 (the CPU's own flash kernel runs where it applies; the math
formulas reorder float32 sums); bfloat16 one bfloat16 rounding of the result
(rtol 1.6e-2, atol 1e-2: both sides compute in float32 and round once)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.nn.attention import SDPBackend, sdpa_kernel

import seeds
import torch_neuronx
from torch_neuronx import _torch_version

NEURON = torch.device("neuron", 0)
FORWARD = "aten::_scaled_dot_product_fused_attention_overrideable"
BACKWARD = "aten::_scaled_dot_product_fused_attention_overrideable_backward"
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seeds.seed(seed))).to(dtype)


def _qkv(q_heads=4, kv_heads=4, length=10, source=12, head=8, value_head=None, dtype=torch.float32):
    return (_randn(2, q_heads, length, head, seed=1, dtype=dtype),
            _randn(2, kv_heads, source, head, seed=2, dtype=dtype),
            _randn(2, kv_heads, source, value_head or head, seed=3, dtype=dtype))


def _run(device, inputs, mask=None, grad_seed=4, **kwargs):
    """Output and gradients (query, key, value, and the mask's when it requires grad)."""
    leaves = [t.to(device, copy=True).requires_grad_() for t in inputs]
    if mask is not None:
        mask = mask.detach().to(device, copy=True).requires_grad_(mask.requires_grad)
    out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, **kwargs)
    out.backward(_randn(*out.shape, seed=grad_seed, dtype=out.dtype).to(device))
    grads = [t.grad for t in leaves] + ([mask.grad] if mask is not None and mask.requires_grad else [])
    return out.detach().cpu(), [g.cpu() for g in grads]


def _assert_close(got, want, dtype):
    torch.testing.assert_close(got[0], want[0], **TOLERANCE[dtype])
    assert len(got[1]) == len(want[1])
    for have, expected in zip(got[1], want[1]):
        torch.testing.assert_close(have, expected, **TOLERANCE[dtype])


# ------------------------------------------------------------------ the backend choice
def test_the_device_chooses_the_overrideable_backend_for_4d_neuron_tensors():
    q, k, v = (t.to(NEURON) for t in _qkv())
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    assert torch._fused_sdp_choice(q, k, v, dropout_p=0.5, is_causal=True) == SDPBackend.OVERRIDEABLE.value
    assert torch._fused_sdp_choice(q[0], k[0], v[0]) == SDPBackend.MATH.value  # 3-D: the math composite
    with sdpa_kernel(SDPBackend.MATH):  # TorchNeuron does not read sdpa_kernel()'s switches
        assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    cpu = _qkv()
    assert torch._fused_sdp_choice(*cpu) == SDPBackend.FLASH_ATTENTION.value  # the CPU's own choice stands


def test_attention_is_one_kernel_forward_and_one_backward():
    torch_neuronx.clear_op_tracking()
    _run(NEURON, _qkv(), is_causal=True)
    executed = torch_neuronx.get_executed_ops()
    assert executed[FORWARD] == 1 and executed[BACKWARD] == 1, executed
    assert not any(name in op for op in executed for name in ("flash_attention_for_cpu", "bmm", "softmax")), executed
    assert torch_neuronx.get_fallback_ops() == {}


@pytest.mark.parametrize("backends", [SDPBackend.OVERRIDEABLE, SDPBackend.MATH,
                                      [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]],
                         ids=["overrideable", "math", "flash_efficient"])
def test_attention_runs_whichever_backends_sdpa_kernel_enables(backends):
    inputs = _qkv()
    torch_neuronx.clear_op_tracking()
    with sdpa_kernel(backends):
        got = _run(NEURON, inputs)
    assert torch_neuronx.get_executed_ops()[FORWARD] == 1
    _assert_close(got, _run("cpu", inputs), torch.float32)


# ------------------------------------------------------------------ against the CPU
CASES = {
    "plain": {},
    "causal": {"is_causal": True, "source": 10},
    "bool_mask": {"mask": "bool"},
    "float_mask": {"mask": "float"},
    "float_mask_with_gradient": {"mask": "float_grad"},
    "masked_query": {"mask": "masked_query"},
    "scale": {"scale": 0.3},
    "gqa": {"kv_heads": 2, "enable_gqa": True},
    "gqa_without_flag": {"kv_heads": 1},
    "value_head_size": {"value_head": 5},
    "gqa_causal_float_mask_gradient": {"kv_heads": 2, "enable_gqa": True, "mask": "float_grad"},
}


def _case(name, dtype):
    spec = dict(CASES[name])
    inputs = _qkv(kv_heads=spec.pop("kv_heads", 4), source=spec.pop("source", 12),
                  value_head=spec.pop("value_head", None), dtype=dtype)
    kind, mask = spec.pop("mask", None), None
    length, source = inputs[0].shape[2], inputs[1].shape[2]
    if kind in ("bool", "masked_query"):
        mask = torch.rand(length, source, generator=torch.Generator().manual_seed(seeds.seed(5))) > 0.3
        mask[:, 0] = True  # every query sees a key ...
        if kind == "masked_query":
            mask[0] = False  # ... but the first
    elif kind in ("float", "float_grad"):
        mask = _randn(2, 1, length, source, seed=6, dtype=dtype).requires_grad_(kind == "float_grad")
    return inputs, mask, spec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_match_the_cpu(name, dtype):
    inputs, mask, kwargs = _case(name, dtype)
    torch_neuronx.clear_op_tracking()
    got = _run(NEURON, inputs, mask, **kwargs)
    assert torch_neuronx.get_executed_ops()[BACKWARD] == 1
    if name == "gqa_without_flag":
        kwargs["enable_gqa"] = True  # the CPU shares the heads only when asked; TorchNeuron always does
    want = _run("cpu", inputs, mask, **kwargs)
    _assert_close(got, want, dtype)
    if name == "masked_query":
        assert got[0][:, :, 0].eq(0).all()  # zeros, not NaN, as the CPU gives


def test_attention_on_3d_tensors_runs_natively():
    inputs = [t[0] for t in _qkv()]
    torch_neuronx.clear_op_tracking()
    got = _run(NEURON, inputs, is_causal=True)
    # PyTorch 2.13 runs the math composite for 3-D inputs; 2.14 sends them through the backend
    # choice too (observed: the overrideable kernel serves them). Native either way.
    on_2_14 = _torch_version.release(torch.__version__) >= "2.14"
    assert (FORWARD in torch_neuronx.get_executed_ops()) == on_2_14
    assert torch_neuronx.get_fallback_ops() == {}
    _assert_close(got, _run("cpu", inputs, is_causal=True), torch.float32)


# ------------------------------------------------------------------ dropout
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_results_have_the_cpus_strides_for_heads_transposed_out_of_a_projection(dropout_p):
    """The layout an attention layer gives SDPA ([batch, seq, heads, dim] seen as [batch, heads,
    seq, dim]): the output and the gradient have the CPU's strides, so code that views the
    output's transpose works as on the CPU."""
    strides = {}
    for device in ("cpu", NEURON):
        torch.manual_seed(seeds.seed(9))
        x = torch.randn(2, 8, 3 * 64, device=device, requires_grad=True)
        q, k, v = (t.view(2, 8, 4, 16).transpose(1, 2) for t in x.split(64, -1))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        out.sum().backward()
        strides[str(device)] = (out.stride(), x.grad.stride())
        if out.transpose(1, 2).is_contiguous():
            assert out.transpose(1, 2).view(2, 8, 64).shape == (2, 8, 64)
    assert strides["neuron:0"] == strides["cpu"]


def test_dropout_drops_what_the_cpu_drops_from_the_cpu_generator():
    inputs, mask, _ = _case("float_mask_with_gradient", torch.float32)
    torch.manual_seed(seeds.seed(7))
    want = _run("cpu", inputs, mask, dropout_p=0.3)
    cpu_state = torch.get_rng_state()
    torch.manual_seed(seeds.seed(7))
    got = _run(NEURON, inputs, mask, dropout_p=0.3)
    _assert_close(got, want, torch.float32)
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU generator advanced as on the CPU
    torch.manual_seed(seeds.seed(8))
    assert not torch.equal(_run(NEURON, inputs, mask, dropout_p=0.3)[0], got[0])  # another draw


def test_dropout_keeps_each_weight_with_probability_one_minus_p():
    """Uniform weights (q = 0) and an identity value: the output is the dropped weights
    themselves, 0 or 1 / (S (1 - p)); the mask travels to the backward as philox_seed."""
    p, source = 0.25, 64
    q = torch.zeros(4, 8, 64, 16, device=NEURON)
    k = torch.randn(4, 8, source, 16, device=NEURON)
    v = torch.eye(source, device=NEURON).expand(4, 8, source, source)
    out, *_, seed, offset, _ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, None, p)
    weights = out.cpu()
    kept = weights != 0
    assert seed.dtype == torch.bool and torch.equal(seed.cpu(), kept) and offset.numel() == 1
    torch.testing.assert_close(weights[kept], torch.full_like(weights[kept], 1 / (source * (1 - p))))
    n = kept.numel()
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5


# ------------------------------------------------------------------ errors
def test_errors_say_what_is_wrong():
    q, k, v = _qkv(q_heads=12, kv_heads=5)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide the number of heads in query"):
        F.scaled_dot_product_attention(q.to(NEURON), k.to(NEURON), v.to(NEURON), enable_gqa=True)
    q, k, v = (t.to(NEURON) for t in _qkv())
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        F.scaled_dot_product_attention(q, k.half(), v)
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same device type"):
        F.scaled_dot_product_attention(q.cpu(), k, v)
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(10, 12, device=NEURON), is_causal=True)
    with pytest.raises(NotImplementedError, match="Debug mask not supported in Neuron implementation"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, return_debug_mask=True)


# ------------------------------------------------------------------ compiled
def _graphs_of(fn, *inputs):
    """The forward and backward ATen graphs AOTAutograd makes of fn on neuron tensors."""
    graphs = []

    def capture(gm, _inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm)

    out = torch.compile(fn, backend=aot_autograd(fw_compiler=capture, bw_compiler=capture))(*inputs)
    out.sum().backward()
    return graphs


def test_compile_traces_the_backend_eager_code_runs(fresh_dynamo):
    inputs = [t.to(NEURON).requires_grad_() for t in _qkv()]
    forward, backward = _graphs_of(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), *inputs)
    assert "_scaled_dot_product_fused_attention_overrideable.default" in forward
    assert "_scaled_dot_product_fused_attention_overrideable_backward.default" in backward
    assert "flash_attention_for_cpu" not in forward + backward


@pytest.mark.parametrize("name", ["plain", "causal", "gqa_without_flag", "gqa_causal_float_mask_gradient",
                                  "bool_mask", "value_head_size"])
def test_compiled_attention_matches_the_cpu(name, fresh_dynamo):
    inputs, mask, kwargs = _case(name, torch.float32)

    def attention(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)

    leaves = [t.to(NEURON, copy=True).requires_grad_() for t in inputs]
    dev_mask = None if mask is None else mask.detach().to(NEURON, copy=True).requires_grad_(mask.requires_grad)
    out = torch.compile(attention, backend="neuron", fullgraph=True)(*leaves, dev_mask)
    out.backward(_randn(*out.shape, seed=4).to(NEURON))
    grads = [t.grad.cpu() for t in leaves] + ([dev_mask.grad.cpu()] if mask is not None and mask.requires_grad else [])
    kwargs.setdefault("enable_gqa", inputs[0].shape[1] != inputs[1].shape[1])
    _assert_close((out.detach().cpu(), grads), _run("cpu", inputs, mask, **kwargs), torch.float32)


def test_compiled_dropout_drops_what_eager_code_and_the_cpu_drop(fresh_dynamo):
    inputs = _qkv(kv_heads=2)

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, enable_gqa=True)

    leaves = [t.to(NEURON, copy=True).requires_grad_() for t in inputs]
    compiled = torch.compile(attention, backend="neuron", fullgraph=True)
    torch.manual_seed(seeds.seed(9))
    out = compiled(*leaves)
    out.backward(_randn(*out.shape, seed=4).to(NEURON))
    torch.manual_seed(seeds.seed(9))
    want = _run("cpu", inputs, dropout_p=0.4, enable_gqa=True)
    _assert_close((out.detach().cpu(), [t.grad.cpu() for t in leaves]), want, torch.float32)


def test_sdpa_kernel_overrideable_works_inside_a_compiled_function(fresh_dynamo):
    """AWS's own compile test: `with sdpa_kernel(SDPBackend.OVERRIDEABLE)` in the compiled
    function (before: "No viable backend for scaled_dot_product_attention was found")."""

    def attention(q, k, v):
        with sdpa_kernel(SDPBackend.OVERRIDEABLE):
            return F.scaled_dot_product_attention(q, k, v)

    inputs = _qkv()
    got = torch.compile(attention, backend="neuron")(*(t.to(NEURON) for t in inputs))
    torch.testing.assert_close(got.cpu(), F.scaled_dot_product_attention(*inputs), **TOLERANCE[torch.float32])


def test_compiled_attention_under_activation_checkpointing_matches_the_cpu(fresh_dynamo):
    """Checkpointing recomputes the attention kernel in the backward graph, wrapped in
    run_and_save_rng_state / run_with_rng_state (the kernel is tagged random for its dropout)."""
    from torch.utils.checkpoint import checkpoint

    def block(q, k, v):
        return F.scaled_dot_product_attention(q.sin(), k, v, is_causal=True, enable_gqa=True).cos()

    def step(q, k, v):
        return checkpoint(block, q, k, v, use_reentrant=False)

    inputs = _qkv(kv_heads=2, source=10)
    leaves = [t.to(NEURON, copy=True).requires_grad_() for t in inputs]
    out = torch.compile(step, backend="neuron", fullgraph=True)(*leaves)
    out.backward(_randn(*out.shape, seed=4).to(NEURON))
    cpu = [t.clone().requires_grad_() for t in inputs]
    want = block(*cpu)
    want.backward(_randn(*want.shape, seed=4))
    _assert_close((out.detach().cpu(), [t.grad.cpu() for t in leaves]),
                  (want.detach(), [t.grad for t in cpu]), torch.float32)
