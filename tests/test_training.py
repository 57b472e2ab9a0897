"""Training on the neuron device (issue item 9), compared with the same run on CPU.

fp32 runs start from the same weights (copy.deepcopy), use dropout=0 and the
same data, and must match CPU within atol=rtol=1e-5 after every step. bf16
autocast runs are compared with CPU autocast within 1e-2 (CPU's autocast
lists differ from the CUDA-like neuron ones for softmax, so results are
close, not identical).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx

NEURON = torch.device("neuron", 0)
FP32 = dict(atol=1e-5, rtol=1e-5)
BF16 = dict(atol=1e-2, rtol=1e-2)

OPTIMIZERS = {
    "adamw_default": {},
    "adamw_foreach": {"foreach": True},
    "adamw_for_loop": {"foreach": False},
    "adamw_fused": {"fused": True},
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.neuron.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, inputs=20, hidden=48, classes=5):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden), nn.GELU(), nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


class TransformerClassifier(nn.Module):
    """A TransformerEncoderLayer block with a classification head.

    bias=False by default: the key part of the attention in-projection bias
    has a gradient that is exactly zero in exact arithmetic (softmax is shift
    invariant), so its float32 value is rounding noise (~1e-9), which Adam
    normalizes to a full lr-sized step; two correct backends then disagree
    by ~lr on that one parameter. test_transformer_gradients_with_bias checks
    the biased layer's gradients directly instead.
    """

    def __init__(self, dim=32, heads=4, ff=64, classes=5, bias=False, norm_first=False):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(dim, heads, ff, dropout=0.0, batch_first=True,
                                                  bias=bias, norm_first=norm_first)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


def make_data(kind):
    if kind == "mlp":
        return torch.randn(16, 20), torch.randint(0, 5, (16,))
    return torch.randn(6, 9, 32), torch.randint(0, 5, (6,))


def train(model, optimizer, x, y, steps):
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def assert_same_parameters(neuron_model, cpu_model, **tolerances):
    for (name, p_dev), (_, p_cpu) in zip(neuron_model.named_parameters(), cpu_model.named_parameters()):
        assert p_dev.device == NEURON and p_dev.dtype == p_cpu.dtype, name
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), msg=lambda m: f"{name}: {m}", **tolerances)


# ------------------------------------------------------------ fp32 parity

@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["mlp", "transformer", "transformer_norm_first"])
def test_training_matches_cpu(kind, optimizer):
    base = MLP() if kind == "mlp" else TransformerClassifier(norm_first=kind.endswith("norm_first"))
    cpu_model = copy.deepcopy(base)
    dev_model = copy.deepcopy(base).to(NEURON)
    kwargs = dict(lr=1e-3, weight_decay=0.05, **OPTIMIZERS[optimizer])
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), **kwargs)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), **kwargs)
    x, y = make_data("mlp" if kind == "mlp" else "transformer")
    cpu_losses = train(cpu_model, cpu_opt, x, y, steps=4)
    dev_losses = train(dev_model, dev_opt, x.to(NEURON), y.to(NEURON), steps=4)
    for dev_loss, cpu_loss in zip(dev_losses, cpu_losses):
        assert dev_loss.device == NEURON and dev_loss.dtype == torch.float32
        torch.testing.assert_close(dev_loss.cpu(), cpu_loss, **FP32)
    assert dev_losses[-1].item() < dev_losses[0].item()  # it trains
    assert_same_parameters(dev_model, cpu_model, **FP32)
    for state_dev, state_cpu in zip(dev_opt.state.values(), cpu_opt.state.values()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert state_dev[key].device == NEURON
            torch.testing.assert_close(state_dev[key].cpu(), state_cpu[key], **FP32)


def test_transformer_gradients_with_bias():
    base = TransformerClassifier(bias=True)
    cpu_model, dev_model = copy.deepcopy(base), copy.deepcopy(base).to(NEURON)
    x, y = make_data("transformer")
    F.cross_entropy(cpu_model(x), y).backward()
    F.cross_entropy(dev_model(x.to(NEURON)), y.to(NEURON)).backward()
    for (name, p_dev), (_, p_cpu) in zip(dev_model.named_parameters(), cpu_model.named_parameters()):
        assert p_dev.grad.device == NEURON and p_dev.grad.dtype == torch.float32
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, msg=lambda m: f"{name}: {m}", **FP32)


def test_sgd_momentum_and_grad_clipping_match_cpu():
    base = MLP()
    cpu_model, dev_model = copy.deepcopy(base), copy.deepcopy(base).to(NEURON)
    x, y = make_data("mlp")
    for model, data, target in ((cpu_model, x, y), (dev_model, x.to(NEURON), y.to(NEURON))):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
    assert_same_parameters(dev_model, cpu_model, **FP32)


def test_multihead_attention_with_weights_keeps_float32():
    """need_weights=True scales q by a Python float: the result must stay float32."""
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16)
    expected, expected_weights = mha(x, x, x)
    dev = copy.deepcopy(mha).to(NEURON)
    xd = x.to(NEURON)
    out, weights = dev(xd, xd, xd)
    assert out.dtype == torch.float32 and weights.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), expected, **FP32)
    torch.testing.assert_close(weights.cpu(), expected_weights, **FP32)


# -------------------------------------------------------------- autocast

AUTOCAST_BF16 = {
    "mm": lambda a, b, w: a @ b,
    "linear": lambda a, b, w: F.linear(a, w),
    "addmm": lambda a, b, w: torch.addmm(torch.ones(b.shape[1], device=a.device), a, b),
    "bmm": lambda a, b, w: torch.bmm(a[None], b[None]),
    "matmul_3d": lambda a, b, w: a.view(2, 4, 16) @ b,
    "baddbmm": lambda a, b, w: torch.baddbmm(torch.zeros(1, 8, 6, device=a.device), a[None], b[None]),
}
AUTOCAST_FP32 = {
    "softmax": lambda a, b, w: F.softmax(a, -1),
    "log_softmax": lambda a, b, w: F.log_softmax(a, -1),
    "layer_norm": lambda a, b, w: F.layer_norm(a, (16,)),
    "softmax_of_matmul": lambda a, b, w: F.softmax(a @ b, -1),
    "layer_norm_of_linear": lambda a, b, w: F.layer_norm(F.linear(a, w), (12,)),
    "cross_entropy": lambda a, b, w: F.cross_entropy(a @ b, torch.arange(8, device=a.device) % 6),
}


def _autocast_inputs():
    return torch.randn(8, 16), torch.randn(16, 6), torch.randn(12, 16)


@pytest.mark.parametrize("name", sorted(AUTOCAST_BF16) + sorted(AUTOCAST_FP32))
def test_autocast_dtypes_and_values(name):
    fn = {**AUTOCAST_BF16, **AUTOCAST_FP32}[name]
    expected_dtype = torch.bfloat16 if name in AUTOCAST_BF16 else torch.float32
    a, b, w = _autocast_inputs()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("neuron")
        result = fn(a.to(NEURON), b.to(NEURON), w.to(NEURON))
    assert not torch.is_autocast_enabled("neuron")
    assert result.device == NEURON and result.dtype == expected_dtype
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = fn(a, b, w)
    torch.testing.assert_close(result.float().cpu(), reference.float(), **BF16)


def test_autocast_off_for_cpu_and_disabled_regions():
    a, b, _ = _autocast_inputs()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.float32  # CPU tensors: neuron autocast does not apply
        with torch.autocast("neuron", enabled=False):
            assert (a.to(NEURON) @ b.to(NEURON)).dtype == torch.float32
    assert (a.to(NEURON) @ b.to(NEURON)).dtype == torch.float32


def test_autocast_bans_binary_cross_entropy():
    """As CUDA and Trainium do: BCE on a sigmoid's output is unsafe in a lower precision."""
    probs, target = torch.rand(4, device=NEURON), torch.rand(4, device=NEURON)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        for call in (lambda: F.binary_cross_entropy(probs, target), lambda: nn.BCELoss()(probs, target)):
            with pytest.raises(RuntimeError, match="(?s)binary_cross_entropy and torch.nn.BCELoss are "
                                                   "unsafe to autocast.*binary_cross_entropy_with_logits"):
                call()
        assert F.binary_cross_entropy_with_logits(probs, target).dtype == torch.float32
    torch.testing.assert_close(F.binary_cross_entropy(probs, target).cpu(),
                               F.binary_cross_entropy(probs.cpu(), target.cpu()), rtol=1e-6, atol=1e-6)


def test_bf16_autocast_training_step_without_grad_scaler():
    base = TransformerClassifier(bias=False)
    cpu_model, dev_model = copy.deepcopy(base), copy.deepcopy(base).to(NEURON)
    x, y = make_data("transformer")
    results = {}
    for device, model in (("cpu", cpu_model), ("neuron", dev_model)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(x.to(device))
                loss = F.cross_entropy(logits, y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        results[device] = (losses, logits.dtype, loss.dtype)
    dev_losses, logits_dtype, loss_dtype = results["neuron"]
    assert logits_dtype == torch.bfloat16 and loss_dtype == torch.float32
    assert all(torch.isfinite(torch.tensor(dev_losses)))
    for p in dev_model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(results["cpu"][0]), **BF16)
    assert_same_parameters(dev_model, cpu_model, **BF16)
    moved = [not torch.equal(p.detach().cpu(), q.detach()) for p, q in zip(dev_model.parameters(), base.parameters())]
    assert all(moved)


def test_pure_bf16_training_step():
    base = MLP().to(torch.bfloat16)
    cpu_model, dev_model = copy.deepcopy(base), copy.deepcopy(base).to(NEURON)
    x, y = make_data("mlp")
    x = x.to(torch.bfloat16)
    for model, data, target in ((cpu_model, x, y), (dev_model, x.to(NEURON), y.to(NEURON))):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()
    for p in dev_model.parameters():
        assert p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16
    assert_same_parameters(dev_model, cpu_model, **BF16)


# --------------------------------------------------------- serialization

def test_save_and_load_with_map_location():
    model = MLP()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, map_location="neuron")
    assert all(t.device == NEURON for t in state.values())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(state[key].cpu(), value, rtol=0, atol=0)


def test_save_neuron_tensors_and_load_anywhere():
    dev_model = MLP().to(NEURON)
    buffer = io.BytesIO()
    torch.save({"model": dev_model.state_dict(), "extra": torch.arange(3, device=NEURON)}, buffer)
    for map_location, device in ((None, NEURON), ("cpu", torch.device("cpu")),
                                 ("neuron:0", NEURON)):
        buffer.seek(0)
        loaded = torch.load(buffer, map_location=map_location)
        assert loaded["extra"].device == device
        assert loaded["extra"].tolist() == [0, 1, 2]
        for key, value in dev_model.state_dict().items():
            assert loaded["model"][key].device == device
            torch.testing.assert_close(loaded["model"][key].cpu(), value.cpu(), rtol=0, atol=0)


def test_load_state_dict_onto_neuron_model():
    cpu_model = MLP()
    dev_model = MLP().to(NEURON)
    result = dev_model.load_state_dict(cpu_model.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(4, 20)
    for p in dev_model.parameters():
        assert p.device == NEURON
    torch.testing.assert_close(dev_model(x.to(NEURON)).detach().cpu(), cpu_model(x).detach(), **FP32)


def test_checkpoint_resume_equals_uninterrupted_training():
    base = MLP()
    x, y = make_data("mlp")
    x, y = x.to(NEURON), y.to(NEURON)
    straight = copy.deepcopy(base).to(NEURON)
    straight_opt = torch.optim.AdamW(straight.parameters(), lr=1e-3)
    train(straight, straight_opt, x, y, steps=4)

    first = copy.deepcopy(base).to(NEURON)
    first_opt = torch.optim.AdamW(first.parameters(), lr=1e-3)
    train(first, first_opt, x, y, steps=2)
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optim": first_opt.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, map_location="neuron")
    resumed = MLP().to(NEURON)
    resumed.load_state_dict(checkpoint["model"])
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=1e-3)
    resumed_opt.load_state_dict(checkpoint["optim"])
    for state in resumed_opt.state.values():
        assert state["exp_avg"].device == NEURON
    train(resumed, resumed_opt, x, y, steps=2)
    for p, q in zip(resumed.parameters(), straight.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=0, atol=0)


# ----------------------------------------------------- moving to the device

def test_non_blocking_copy_from_pinned_memory():
    host = torch.randn(64, 33)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned()
    dev = pinned.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    assert dev.device == NEURON
    torch.testing.assert_close(dev.cpu(), host, rtol=0, atol=0)
    fresh = torch.empty(8, pin_memory=True)
    assert fresh.is_pinned()
    back = dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(back, host, rtol=0, atol=0)


def test_tensor_and_module_helpers():
    t = torch.randn(3)
    assert not t.is_neuron
    moved = t.neuron()
    assert moved.is_neuron and moved.device == NEURON
    torch.testing.assert_close(moved.cpu(), t, rtol=0, atol=0)
    if torch.neuron.device_count() > 1:
        assert t.neuron(1).device == torch.device("neuron", 1)
    model = MLP()
    assert model.neuron() is model
    assert all(p.is_neuron for p in model.parameters())
    assert moved.untyped_storage().is_neuron


# ------------------------------------------------------------------- SDPA

SDPA_CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bool_mask": {"attn_mask": "bool"},
    "float_mask": {"attn_mask": "float"},
    "scale": {"scale": 0.3},
    "gqa": {"enable_gqa": True},
}


@pytest.mark.parametrize("case", sorted(SDPA_CASES))
def test_scaled_dot_product_attention_forward_backward(case):
    kwargs = dict(SDPA_CASES[case])
    q = torch.randn(2, 4, 10, 8)
    kv_heads = 2 if case == "gqa" else 4
    k, v = torch.randn(2, kv_heads, 12 if case != "causal" else 10, 8), torch.randn(2, kv_heads, 12 if case != "causal" else 10, 8)
    mask = kwargs.get("attn_mask")
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(10, k.shape[2]) > 0.3
        kwargs["attn_mask"][:, 0] = True
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(2, 1, 10, k.shape[2])

    def run(device):
        inputs = [t.to(device, copy=True).requires_grad_() for t in (q, k, v)]
        extra = {key: (value.to(device) if isinstance(value, torch.Tensor) else value) for key, value in kwargs.items()}
        out = F.scaled_dot_product_attention(*inputs, **extra)
        grad = torch.linspace(-1, 1, out.numel()).view(out.shape).to(device)
        out.backward(grad)
        return out.detach(), [t.grad for t in inputs]

    torch_neuronx.clear_op_tracking()
    expected, expected_grads = run("cpu")
    actual, grads = run(NEURON)
    assert actual.device == NEURON and actual.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), expected, **FP32)
    for got, want in zip(grads, expected_grads):
        assert got.device == NEURON
        torch.testing.assert_close(got.cpu(), want, **FP32)
    assert torch_neuronx.get_fallback_ops() == {}




@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_recurrent_layers_match_cpu(cell):
    layer = getattr(nn, cell)(8, 6, batch_first=True)
    x = torch.randn(3, 5, 8)
    dev_layer = copy.deepcopy(layer).to(NEURON)
    expected = layer(x)[0]
    actual = dev_layer(x.to(NEURON))[0]
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), **FP32)
    expected.sum().backward()
    actual.sum().backward()
    for p_dev, p_cpu in zip(dev_layer.parameters(), layer.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_cpu.grad, **FP32)


def test_module_to_neuron_keeps_parameter_objects_like_cuda():
    """module.to("neuron") moves each parameter's data in place (param.data = moved), so an
    optimizer created before the move still holds the module's parameters and trains them."""
    model = torch.nn.Linear(3, 2)
    weight = model.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.to("neuron")
    assert model.weight is weight and weight.device.type == "neuron"
    before = weight.detach().cpu().clone()
    model(torch.randn(4, 3, device="neuron")).sum().backward()
    optimizer.step()
    assert not torch.equal(weight.detach().cpu(), before)
    model.to("cpu")
    assert model.weight is weight and weight.device.type == "cpu"


def _backward_thread(x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(thread id the gradient hook ran on, x's gradient) of (x * 3).sum().backward()."""
    import threading

    ran_on = []
    leaf = x.detach().clone().requires_grad_()
    y = leaf * 3
    y.register_hook(lambda g: ran_on.append(threading.get_ident()))
    y.sum().backward()
    return ran_on[0], leaf.grad.cpu()


def test_backward_runs_on_the_calling_thread_and_a_device_thread_on_request():
    """The importing thread runs its backward passes itself (torch_neuronx/_startup.py: the
    autograd engine's hand-off to a device thread only costs time here); another thread, or a
    block under set_multithreading_enabled(True), uses the engine's device thread; the same
    gradients either way."""
    import threading

    x = torch.randn(5, device=NEURON)
    here, grad = _backward_thread(x)
    assert here == threading.get_ident()
    assert torch.equal(grad, torch.full((5,), 3.0))
    with torch.autograd.set_multithreading_enabled(True):
        there, grad_there = _backward_thread(x)
    assert there != threading.get_ident() and torch.equal(grad_there, grad)
    assert _backward_thread(x)[0] == threading.get_ident()  # the block restored the setting
    other = {}
    worker = threading.Thread(target=lambda: other.update(zip(("thread", "grad"), _backward_thread(x))))
    worker.start()
    worker.join()
    assert other["thread"] != worker.ident and torch.equal(other["grad"], grad)
