"""The CPU fallback for ops outside the native op set, and op tracking.

An op that is not in torch_neuronx/ops/registry.py runs on CPU copies of its
inputs (results copied back to the device), warns once per op, and is
recorded by torch_neuronx.get_fallback_ops(). TORCH_NEURONX_FALLBACK selects
warn (default) / silent / error. The warning is shown once per op per
process, so the checks of the warning and of the environment variable run in
fresh subprocesses; the rest runs here.

Fallback results are compared with CPU exactly where the same CPU kernel runs
on the same values (rtol=0, atol=0).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import ops as neuron_ops
from torch_neuronx.ops import registry

NEURON = torch.device("neuron", 0)
EXACT = dict(rtol=0, atol=0)

# Ops that are outside the native set today (checked by test_probe_ops_are_not_native).
PROBE = "special_bessel_j0"
PROBE_2 = "special_bessel_j1"


def _counts(table: dict[str, int], base: str) -> int:
    """Calls of aten::base under any overload in an op-tracking table."""
    return sum(n for name, n in table.items() if name.split("::")[-1].split(".")[0] == base)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ)
    for key in ("TORCH_NEURONX_FALLBACK", "TORCH_NEURONX_FP64"):
        environment.pop(key, None)
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environment, timeout=180)


def last_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _clean_tracking():
    torch.manual_seed(0)
    torch_neuronx.clear_op_tracking()
    yield
    neuron_ops.set_fallback_mode("warn")


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch_neuronx:")
        yield


def test_probe_ops_are_not_native():
    for name in (PROBE, PROBE_2, "polygamma", "frexp"):
        assert name not in registry.NATIVE_OPS


# ------------------------------------------------------ results and tracking

def test_fallback_op_gives_cpu_result_on_device(quiet):
    x = torch.rand(3, 7) * 10
    result = torch.special.bessel_j0(x.to(NEURON))
    assert result.device == NEURON and result.dtype == x.dtype
    torch.testing.assert_close(result.cpu(), torch.special.bessel_j0(x), **EXACT)
    assert _counts(torch_neuronx.get_fallback_ops(), PROBE) == 1


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.special.bessel_j0(x.t()[1:]),                       # non-contiguous input
        lambda x: torch.special.zeta(x.abs() + 2, x.abs() + 1),                  # two inputs
        lambda x: torch.polygamma(1, x.abs() + 1),                          # extra scalar arg
        lambda x: torch.frexp(x),                                            # tuple result
        lambda x: torch.special.bessel_j0(x.double()),                       # float64 input
        lambda x: torch.special.bessel_j0(torch.fft.rfft(x).abs()),          # complex intermediate
    ],
    ids=["non_contiguous", "two_inputs", "polygamma", "tuple_result", "float64", "fft"],
)
def test_fallback_results_match_cpu(quiet, fn):
    x = torch.randn(4, 6)
    expected = fn(x)
    actual = fn(x.to(NEURON))
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for a, e in zip(actual, expected):
        assert a.device == NEURON and a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a.cpu(), e, **EXACT)
    assert torch_neuronx.get_fallback_ops(), "expected at least one op to fall back"


def test_fallback_in_place_updates_device_tensor(quiet):
    x = torch.rand(5) + 0.5
    dev = x.to(NEURON)
    ptr = dev.data_ptr()
    assert dev.polygamma_(2) is dev
    assert dev.data_ptr() == ptr
    torch.testing.assert_close(dev.cpu(), x.polygamma(2), **EXACT)
    view_base = torch.rand(4, 4).to(NEURON)
    expected = view_base.cpu()
    view_base.t()[1].polygamma_(1)
    expected.t()[1].polygamma_(1)
    torch.testing.assert_close(view_base.cpu(), expected, **EXACT)
    # polygamma_ is carried out by its out= overload, which is the op that falls back
    assert _counts(torch_neuronx.get_fallback_ops(), "polygamma") == 2


def test_fallback_out_is_resized(quiet):
    x = torch.rand(3, 4)
    out = torch.empty(0, device=NEURON)
    result = torch.special.bessel_j0(x.to(NEURON), out=out)
    assert result is out and out.shape == (3, 4) and out.device == NEURON
    torch.testing.assert_close(out.cpu(), torch.special.bessel_j0(x), **EXACT)


def test_fallback_counts_every_call_and_only_fallback_ops(quiet):
    x = torch.rand(8, device=NEURON)
    for _ in range(3):
        torch.special.bessel_j0(x)
    torch.special.bessel_j1(x)
    _ = x + x, x * x  # native: not fallback
    fallback = torch_neuronx.get_fallback_ops()
    assert _counts(fallback, PROBE) == 3
    assert _counts(fallback, PROBE_2) == 1
    assert _counts(fallback, "add") == 0 and _counts(fallback, "mul") == 0
    assert all(name.startswith("aten::") for name in fallback)
    assert all(isinstance(n, int) and n > 0 for n in fallback.values())


def test_executed_ops_counts_native_ops():
    a, b = torch.randn(4, 4, device=NEURON), torch.randn(4, 4, device=NEURON)
    torch_neuronx.clear_op_tracking()
    for _ in range(5):
        a + b
    for _ in range(2):
        torch.mm(a, b)
    a.relu_()
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::add.Tensor") == 5
    assert executed.get("aten::mm") == 2
    assert executed.get("aten::relu_") == 1
    assert torch_neuronx.get_fallback_ops() == {}


def test_executed_ops_include_ops_served_by_python_kernels(quiet):
    # topk and histc are native ops implemented in Python (ops/topk.py, histogram.py)
    x = torch.rand(16, device=NEURON)
    torch_neuronx.clear_op_tracking()
    torch.topk(x, 3)
    torch.topk(x, 2)
    torch.histc(x, bins=4)
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::topk") == 2
    assert executed.get("aten::histc") == 1
    assert torch_neuronx.get_fallback_ops() == {}
    torch_neuronx.clear_op_tracking()
    assert "aten::topk" not in torch_neuronx.get_executed_ops()
    with pytest.raises(NotImplementedError, match="Sparse tensors are not supported"):
        x.to_sparse()  # a Python kernel that refuses: it did not run
    assert "aten::_to_sparse" not in torch_neuronx.get_executed_ops()


def test_executed_ops_include_fallback_ops(quiet):
    torch.special.bessel_j0(torch.rand(3, device=NEURON))
    executed = torch_neuronx.get_executed_ops()
    assert _counts(executed, PROBE) == 1


def test_clear_op_tracking_resets_both_tables(quiet):
    x = torch.rand(3, device=NEURON)
    torch.special.bessel_j0(x)
    x + x
    assert torch_neuronx.get_fallback_ops() and torch_neuronx.get_executed_ops()
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_fallback_ops() == {}
    assert torch_neuronx.get_executed_ops() == {}
    torch.special.bessel_j0(x)
    assert _counts(torch_neuronx.get_fallback_ops(), PROBE) == 1  # counting starts again at 0


def test_tracking_tables_are_snapshots(quiet):
    torch.special.bessel_j0(torch.rand(3, device=NEURON))
    snapshot = torch_neuronx.get_fallback_ops()
    snapshot.clear()
    assert torch_neuronx.get_fallback_ops()
    assert torch_neuronx.get_fallback_ops is neuron_ops.get_fallback_ops


def test_cpu_only_work_is_not_tracked():
    torch.special.bessel_j0(torch.rand(3))
    torch.rand(3) + torch.rand(3)
    assert torch_neuronx.get_fallback_ops() == {}
    assert torch_neuronx.get_executed_ops() == {}


# --------------------------------------------------------------- modes here

def test_error_mode_set_at_runtime_raises_naming_op():
    x = torch.rand(4, device=NEURON)
    neuron_ops.set_fallback_mode("error")
    assert neuron_ops.get_fallback_mode() == "error"
    with pytest.raises(NotImplementedError, match=PROBE) as info:
        torch.special.bessel_j0(x)
    message = str(info.value)
    assert "TORCH_NEURONX_FALLBACK" in message and "native op set" in message
    torch.testing.assert_close((x + 1).cpu(), x.cpu() + 1)  # native ops unaffected


def test_silent_mode_set_at_runtime_still_records():
    neuron_ops.set_fallback_mode("silent")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.special.spherical_bessel_j0(torch.rand(4, device=NEURON))
    assert not [w for w in caught if "torch_neuronx" in str(w.message)]
    assert _counts(torch_neuronx.get_fallback_ops(), "special_spherical_bessel_j0") == 1


def test_set_fallback_mode_rejects_unknown_mode():
    with pytest.raises(ValueError, match="TORCH_NEURONX_FALLBACK.*expected one of"):
        neuron_ops.set_fallback_mode("loud")
    assert neuron_ops.get_fallback_mode() == "warn"


# ------------------------------------------------- env variable, subprocess

_WARN_SCRIPT = """
    import json, warnings
    import torch, torch_neuronx
    x = torch.rand(6, device="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            y = torch.special.bessel_j0(x)
        torch.special.bessel_j1(x)
        z = (x + x).view(1, 6).mm(x.view(6, 1))
    ok = torch.equal(y.cpu(), torch.special.bessel_j0(x.cpu()))
    print(json.dumps({
        "warnings": [str(w.message) for w in caught if "torch_neuronx" in str(w.message)],
        "fallback": torch_neuronx.get_fallback_ops(),
        "ok": ok,
        "mode": torch_neuronx.ops.get_fallback_mode(),
    }))
"""


@pytest.mark.parametrize("env", [{}, {"TORCH_NEURONX_FALLBACK": " Warn "}], ids=["default", "warn_spelled_loosely"])
def test_warns_once_per_op(env):
    report = last_json(run_python(_WARN_SCRIPT, **env))
    assert report["ok"] and report["mode"] == "warn"
    warned = report["warnings"]
    assert len(warned) == 2, warned  # one per op, not one per call
    j0 = [w for w in warned if "bessel_j0" in w]
    j1 = [w for w in warned if "bessel_j1" in w]
    assert len(j0) == 1 and len(j1) == 1
    for message in warned:
        assert "TORCH_NEURONX_FALLBACK=silent" in message  # how to silence
        assert "TORCH_NEURONX_FALLBACK=error" in message  # how to enforce
        assert "get_fallback_ops" in message
    assert _counts(report["fallback"], PROBE) == 3
    assert _counts(report["fallback"], PROBE_2) == 1


def test_env_silent_gives_no_warning_but_records():
    report = last_json(run_python(_WARN_SCRIPT, TORCH_NEURONX_FALLBACK="silent"))
    assert report["ok"] and report["mode"] == "silent"
    assert report["warnings"] == []
    assert _counts(report["fallback"], PROBE) == 3


def test_env_error_raises_clear_error_naming_op():
    proc = run_python(
        """
        import json, torch, torch_neuronx
        x = torch.rand(4, device="neuron")
        native_ok = torch.equal((x * x).cpu(), x.cpu() * x.cpu())
        try:
            torch.special.bessel_j0(x)
        except NotImplementedError as error:
            print(json.dumps({"error": str(error), "native_ok": native_ok}))
        else:
            print(json.dumps({"error": None, "native_ok": native_ok}))
        """,
        TORCH_NEURONX_FALLBACK="error",
    )
    report = last_json(proc)
    assert report["native_ok"]
    assert report["error"] is not None, "bessel_j0 should have raised in error mode"
    assert "aten::special_bessel_j0" in report["error"]
    assert "TORCH_NEURONX_FALLBACK" in report["error"]


def test_env_bad_value_gives_clear_error(value="warning"):
    proc = run_python("import torch; torch.ones(1, device='neuron'); print('started')",
                      TORCH_NEURONX_FALLBACK=value)
    assert proc.returncode != 0
    assert "started" not in proc.stdout
    assert f"TORCH_NEURONX_FALLBACK={value!r}" in proc.stderr
    assert "expected one of" in proc.stderr and "'silent'" in proc.stderr and "'error'" in proc.stderr


# ----------------------------------------------- core ops never fall back

class _TinyLM(nn.Module):
    def __init__(self, vocab=50, dim=32, classes=7):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.GELU(), nn.Linear(64, dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.norm(self.embed(tokens))
        scores = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / 8, dim=-1)
        h = h + scores @ h
        h = h + self.mlp(h)
        return self.head(h.mean(1))


@pytest.mark.parametrize(
    "optimizer_kwargs",
    [{}, {"foreach": True}, {"foreach": False}, {"fused": True}],
    ids=["default", "foreach", "for_loop", "fused"],
)
def test_core_training_ops_do_not_fall_back(optimizer_kwargs):
    """add, linear (mm in attention), softmax, layer_norm, embedding, cross_entropy and an
    AdamW step run natively: in error mode any fallback would raise."""
    model = _TinyLM().to(NEURON)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **optimizer_kwargs)
    tokens = torch.randint(0, 50, (4, 9), device=NEURON)
    labels = torch.randint(0, 7, (4,), device=NEURON)
    neuron_ops.set_fallback_mode("error")
    torch_neuronx.clear_op_tracking()
    for _ in range(2):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    assert torch_neuronx.get_fallback_ops() == {}
    executed = torch_neuronx.get_executed_ops()
    for op in ("add", "linear", "linear_backward", "_softmax", "native_layer_norm", "embedding", "nll_loss_forward",
               "_log_softmax", "native_layer_norm_backward", "embedding_dense_backward"):
        assert any(name.split("::")[1].split(".")[0] in (op, op + "_") for name in executed), op
    optimizer_ops = {"fused": "_fused_adamw_", "foreach": "_foreach_", "default": "_foreach_"}
    key = "fused" if optimizer_kwargs.get("fused") else (
        "default" if not optimizer_kwargs else ("foreach" if optimizer_kwargs.get("foreach") else None))
    if key:
        assert any(optimizer_ops[key] in name for name in executed), sorted(executed)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + x,
        lambda x: x @ x.t(),
        lambda x: F.softmax(x, -1),
        lambda x: F.log_softmax(x, -1),
        lambda x: F.layer_norm(x, (x.shape[-1],)),
        lambda x: F.embedding(torch.tensor([0, 2], device=x.device), x),
        lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3], device=x.device)),
        lambda x: F.gelu(x),
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: F.silu(x),
        lambda x: F.scaled_dot_product_attention(x[None], x[None], x[None]),
        lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
        lambda x: x.sum(-1).mean(),
        lambda x: torch.cat([x, x]).view(-1).topk(3).values,
    ],
    ids=["add", "mm", "softmax", "log_softmax", "layer_norm", "embedding", "cross_entropy", "gelu", "gelu_tanh",
         "silu", "sdpa", "where", "sum_mean", "topk"],
)
def test_core_op_is_native(fn):
    x = torch.randn(3, 4, device=NEURON, requires_grad=True)
    neuron_ops.set_fallback_mode("error")
    out = fn(x)
    out.float().sum().backward()
    assert torch_neuronx.get_fallback_ops() == {}
    cpu_x = x.detach().cpu().requires_grad_()
    expected = fn(cpu_x)
    expected.float().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach())
    torch.testing.assert_close(x.grad.cpu(), cpu_x.grad)


def _upsampling_and_padding_with_grads(x3, x4, x5):
    outs = [F.interpolate(x3, scale_factor=2, mode="linear"),
            F.interpolate(x5, scale_factor=2, mode="trilinear"),
            F.interpolate(x3, scale_factor=2, mode="nearest-exact"),
            F.interpolate(x4, scale_factor=2, mode="nearest-exact"),
            F.interpolate(x5, scale_factor=2, mode="nearest-exact"),
            F.interpolate(x5, scale_factor=2, mode="nearest"),
            F.adaptive_max_pool3d(x5, 2),
            F.pad(x3, (1, 2), mode="reflect"), F.pad(x4, (1, 2, 1, 1), mode="reflect"),
            F.pad(x5, (1, 1, 1, 1, 1, 1), mode="reflect"),
            F.pad(x3, (1, 2), mode="replicate"), F.pad(x4, (1, 2, 1, 1), mode="replicate"),
            F.pad(x5, (1, 1, 1, 1, 1, 1), mode="replicate"),
            F.pixel_shuffle(x4, 2), F.pixel_unshuffle(x4, 2)]
    sum(o.square().sum() for o in outs).backward()
    return outs + [x3.grad, x4.grad, x5.grad]


def test_upsampling_padding_and_foreach_ops_run_natively(quiet):
    """Lowered ops that joined the native set: upsampling (linear, trilinear,
    nearest-exact, their backward), adaptive_max_pool3d, the pads' backward,
    pixel_(un)shuffle, vdot, log_normal_ and the unary/clamp _foreach ops run on
    the device (no fallback) and match the CPU."""
    g = torch.Generator().manual_seed(0)
    shapes = ((2, 4, 6), (2, 4, 6, 6), (1, 2, 4, 4, 4))
    cpu = [torch.randn(s, generator=g, requires_grad=True) for s in shapes]
    dev = [c.detach().to(NEURON).requires_grad_() for c in cpu]
    torch_neuronx.clear_op_tracking()
    got, want = _upsampling_and_padding_with_grads(*dev), _upsampling_and_padding_with_grads(*cpu)
    a, b = torch.randn(7, generator=g), torch.randn(7, generator=g)
    got.append(torch.vdot(a.to(NEURON), b.to(NEURON)))
    want.append(torch.vdot(a, b))
    tensors = [torch.rand(5, generator=g) + 0.5 for _ in range(3)]
    for name in ("acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "expm1", "floor",
                 "frac", "lgamma", "log", "log10", "log1p", "log2", "reciprocal", "round", "rsqrt",
                 "sigmoid", "sin", "sinh", "tan", "tanh", "trunc"):
        op = getattr(torch, f"_foreach_{name}")
        got += op([t.to(NEURON) - 0.5 if name in ("acos", "asin") else t.to(NEURON) for t in tensors])
        want += op([t - 0.5 if name in ("acos", "asin") else t for t in tensors])
    for op, arg in ((torch._foreach_clamp_max, 0.7), (torch._foreach_clamp_min, 0.7),
                    (torch._foreach_minimum, 0.7)):
        got += op([t.to(NEURON) for t in tensors], arg)
        want += op(tensors, arg)
    got += torch._foreach_max([t.to(NEURON) for t in tensors])
    want += torch._foreach_max(tensors)
    sample = torch.empty(1000, device=NEURON).log_normal_(0.0, 0.5)
    assert torch_neuronx.get_fallback_ops() == {}
    for have, expected in zip(got, want, strict=True):
        torch.testing.assert_close(have.cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    assert (sample.cpu() > 0).all() and abs(sample.cpu().log().mean().item()) < 0.1
