"""float64 on the neuron device (issue item 8).

Trainium has no float64 arithmetic: float64 tensors keep dtype float64 on the
device, but compute ops run in float32 and the result is widened back, with a
one-time warning. So the oracle for a compute op is the CPU op on float32
copies, widened: ``op(x64) == op(x64.float()).double()`` exactly (same CPU
kernel, same float32 inputs). Pure data movement (copies, cat, indexing,
clone, ...) keeps every float64 bit. TORCH_NEURONX_FP64=native computes in
float64 (exact CPU result); the warning and the environment variable are
checked in fresh subprocesses because the warning is once per process.
complex128 follows the same rule with complex64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import seeds
NEURON = torch.device("neuron", 0)
EXACT = dict(rtol=0, atol=0)


def narrow(dtype: torch.dtype) -> torch.dtype:
    return {torch.float64: torch.float32, torch.complex128: torch.complex64}[dtype]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("TORCH_NEURONX_FP64", "TORCH_NEURONX_FALLBACK")}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environment, timeout=180)


def last_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _setup():
    torch.manual_seed(seeds.seed(7))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch_neuronx: float64")
        yield


def pair(*shape, dtype=torch.float64):
    """Two CPU tensors whose float32 rounding matters (not exactly representable in fp32)."""
    return torch.randn(*shape, dtype=dtype), torch.randn(*shape, dtype=dtype)


# ------------------------------------------------------------- compute ops

COMPUTE = {
    "mul": lambda a, b: a * b,
    "add": lambda a, b: a + b,
    "div": lambda a, b: a / b,
    "exp": lambda a, b: a.exp(),
    "sin": lambda a, b: torch.sin(a),
    "sum": lambda a, b: a.sum(),
    "mean_dim": lambda a, b: a.mean(0),
    "matmul": lambda a, b: a @ b.T,
    "softmax": lambda a, b: torch.softmax(a, -1),
    "cumsum": lambda a, b: a.cumsum(1),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=3),
    "pow_tensor": lambda a, b: a.abs() ** b,
}


@pytest.mark.parametrize("name", sorted(COMPUTE))
def test_compute_is_float32_widened(name):
    fn = COMPUTE[name]
    a, b = pair(16, 8)
    result = fn(a.to(NEURON), b.to(NEURON))
    assert result.device == NEURON
    assert result.dtype == torch.float64  # dtype preserved
    emulated = fn(a.float(), b.float()).double()
    torch.testing.assert_close(result.cpu(), emulated, **EXACT, equal_nan=True)


def test_product_is_exactly_the_float32_product_and_not_the_float64_one():
    x64, y64 = pair(1000)
    got = (x64.to(NEURON) * y64.to(NEURON)).cpu()
    assert got.dtype == torch.float64
    assert torch.equal(got, (x64.float() * y64.float()).double())
    assert not torch.equal(got, x64 * y64)  # proves it is not computed in float64


def test_in_place_and_out_keep_float64():
    a, b = pair(5, 4)
    dev = a.to(NEURON)
    ptr = dev.data_ptr()
    assert dev.mul_(b.to(NEURON)) is dev
    assert dev.dtype == torch.float64 and dev.data_ptr() == ptr
    torch.testing.assert_close(dev.cpu(), (a.float() * b.float()).double(), **EXACT)
    out = torch.empty(0, dtype=torch.float64, device=NEURON)
    result = torch.add(a.to(NEURON), b.to(NEURON), out=out)
    assert result is out and out.dtype == torch.float64 and out.shape == (5, 4)
    torch.testing.assert_close(out.cpu(), (a.float() + b.float()).double(), **EXACT)
    view = a.to(NEURON)
    view.t()[1:3].exp_()
    expected = a.clone()
    expected.t()[1:3] = expected.t()[1:3].float().exp().double()
    torch.testing.assert_close(view.cpu(), expected, **EXACT)


def test_mixed_float32_and_float64_follow_cpu_promotion():
    a64 = torch.randn(6, dtype=torch.float64)
    b32 = torch.randn(6)
    result = a64.to(NEURON) * b32.to(NEURON)
    assert result.dtype == (a64 * b32).dtype == torch.float64
    torch.testing.assert_close(result.cpu(), (a64.float() * b32).double(), **EXACT)
    ints = torch.arange(6)
    result = ints.to(NEURON) + a64.to(NEURON)
    assert result.dtype == torch.float64
    torch.testing.assert_close(result.cpu(), (ints + a64.float()).double(), **EXACT)


@pytest.mark.filterwarnings("ignore:.*float64 arithmetic")
def test_foreach_lists_mixing_float32_and_float64_keep_each_elements_dtype():
    """A foreach op computes each element apart: only the elements with a float64 operand are
    float64 results (until December 2026 every element of the result list was widened)."""
    a = [torch.randn(4), torch.randn(3, dtype=torch.float64), torch.randn(2)]
    b = [torch.randn(4), torch.randn(3), torch.randn(2, dtype=torch.float64)]
    calls = [lambda x, y: torch._foreach_add(x, y, alpha=0.5), lambda x, y: torch._foreach_mul(x, 3.0),
             lambda x, y: torch._foreach_sqrt([t.abs() for t in x]), lambda x, y: torch.broadcast_tensors(*x[:1], *y[:1])]
    for call in calls:
        want = call(a, b)
        got = call([t.to(NEURON) for t in a], [t.to(NEURON) for t in b])
        assert [t.dtype for t in got] == [t.dtype for t in want]
        narrowed = call([t.float() for t in a], [t.float() for t in b])
        for g, w, n in zip(got, want, narrowed):
            torch.testing.assert_close(g.cpu(), n.to(w.dtype), **EXACT)


def test_reductions_returning_indices_and_bools():
    a, _ = pair(4, 7)
    dev = a.to(NEURON)
    values, indices = dev.max(1)
    assert values.dtype == torch.float64 and indices.dtype == torch.int64
    torch.testing.assert_close(indices.cpu(), a.float().max(1).indices, **EXACT)
    assert (dev > 0).dtype == torch.bool
    torch.testing.assert_close((dev > 0).cpu(), a > 0, **EXACT)


def test_complex128_is_complex64_widened():
    z, w = pair(50, dtype=torch.complex128)
    result = z.to(NEURON) * w.to(NEURON)
    assert result.dtype == torch.complex128
    narrowed = (z.to(torch.complex64) * w.to(torch.complex64)).to(torch.complex128)
    torch.testing.assert_close(result.cpu(), narrowed, **EXACT)
    assert not torch.equal(result.cpu(), z * w)
    magnitude = z.to(NEURON).abs()
    assert magnitude.dtype == torch.float64
    torch.testing.assert_close(magnitude.cpu(), z.to(torch.complex64).abs().double(), **EXACT)


# ----------------------------------------------------------- data movement

MOVEMENT = {
    "to_device_and_back": lambda a, b: a,
    "clone": lambda a, b: a.clone(),
    "contiguous_of_transpose": lambda a, b: a.t().contiguous(),
    "cat": lambda a, b: torch.cat([a, b], 1),
    "stack": lambda a, b: torch.stack([a, b]),
    "index_tensor": lambda a, b: a[torch.tensor([3, 0, 2], device=a.device)],
    "index_select": lambda a, b: a.index_select(1, torch.tensor([1, 1, 0], device=a.device)),
    "mask": lambda a, b: a[a > 0],
    "gather": lambda a, b: a.gather(1, torch.zeros(4, 2, dtype=torch.long, device=a.device)),
    "where": lambda a, b: torch.where(a > b, a, b),
    "flip": lambda a, b: a.flip(0),
    "roll": lambda a, b: a.roll(2, 1),
    "repeat": lambda a, b: a.repeat(2, 1),
    "tril": lambda a, b: a.tril(),
    "pad": lambda a, b: torch.nn.functional.pad(a, (1, 2)),
    "masked_fill": lambda a, b: a.masked_fill(a < 0, 0),
    "view_ops": lambda a, b: a.view(2, 2, 5).permute(2, 0, 1).reshape(5, 4),
}


@pytest.mark.parametrize("name", sorted(MOVEMENT))
def test_data_movement_keeps_float64_exact(name):
    fn = MOVEMENT[name]
    a, b = pair(4, 5)
    result = fn(a.to(NEURON), b.to(NEURON))
    assert result.dtype == torch.float64 and result.device == NEURON
    torch.testing.assert_close(result.cpu(), fn(a, b), **EXACT)


def test_copies_keep_float64_exact():
    a, _ = pair(6, 3)
    target = torch.zeros(6, 3, dtype=torch.float64, device=NEURON)
    target.copy_(a)  # host -> device
    torch.testing.assert_close(target.cpu(), a, **EXACT)
    target[2:4] = a[:2].to(NEURON)  # device -> device
    expected = a.clone()
    expected[2:4] = a[:2]
    torch.testing.assert_close(target.cpu(), expected, **EXACT)
    host = torch.empty(6, 3, dtype=torch.float64)
    host.copy_(target)  # device -> host
    torch.testing.assert_close(host, expected, **EXACT)
    assert target[1, 2].item() == expected[1, 2].item()
    assert target.tolist() == expected.tolist()


def test_index_put_keeps_float64_exact():
    a, b = pair(5, 3)
    dev = a.to(NEURON)
    rows = torch.tensor([4, 1])
    dev[rows.to(NEURON)] = b[:2].to(NEURON)
    expected = a.clone()
    expected[rows] = b[:2]
    torch.testing.assert_close(dev.cpu(), expected, **EXACT)


def test_complex128_data_movement_exact():
    z, w = pair(3, 4, dtype=torch.complex128)
    dev = z.to(NEURON)
    torch.testing.assert_close(dev.cpu(), z, **EXACT)
    torch.testing.assert_close(torch.cat([dev, w.to(NEURON)]).cpu(), torch.cat([z, w]), **EXACT)
    torch.testing.assert_close(dev.t().clone().cpu(), z.t().clone(), **EXACT)
    torch.testing.assert_close(dev.conj().resolve_conj().cpu(), z.conj().resolve_conj(), **EXACT)


def test_conversions_to_and_from_float64():
    a, _ = pair(8)
    dev = a.to(NEURON)
    torch.testing.assert_close(dev.float().cpu(), a.float(), **EXACT)
    torch.testing.assert_close(dev.half().cpu(), a.half(), **EXACT)
    x32 = torch.randn(8)
    torch.testing.assert_close(x32.to(NEURON).double().cpu(), x32.double(), **EXACT)


# ------------------------------------------------- warning and env variable

_WARNING_SCRIPT = """
    import json, warnings
    import torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a32 = torch.randn(8, device="neuron")
        _ = a32 * a32 + a32, a32.exp(), a32.sum()           # float32 only: no warning
        before = len([w for w in caught if "float64" in str(w.message)])
        x = torch.randn(100, dtype=torch.float64)
        y = torch.randn(100, dtype=torch.float64)
        xd, yd = x.to("neuron"), y.to("neuron")
        prod = (xd * yd).cpu()
        _ = xd.exp(), xd + yd, xd.sum(), xd @ yd
    messages = [str(w.message) for w in caught if "torch_neuronx" in str(w.message)]
    print(json.dumps({
        "before": before,
        "messages": messages,
        "dtype": str(prod.dtype),
        "native": torch.equal(prod, x * y),
        "emulated": torch.equal(prod, (x.float() * y.float()).double()),
        "exp_native": torch.equal(xd.exp().cpu(), x.exp()),
        "mm_native": torch.equal((xd @ yd).cpu(), x @ y),
    }))
"""


def test_one_time_warning_in_default_mode():
    report = last_json(run_python(_WARNING_SCRIPT))
    assert report["before"] == 0, "float32-only work must not warn about float64"
    assert len(report["messages"]) == 1, report["messages"]  # five fp64 ops, one warning
    message = report["messages"][0]
    assert "float64" in message and "float32" in message
    assert "TORCH_NEURONX_FP64=native" in message
    assert report["dtype"] == "torch.float64"
    assert report["emulated"] and not report["native"]


def test_native_mode_gives_exact_float64_and_no_warning():
    report = last_json(run_python(_WARNING_SCRIPT, TORCH_NEURONX_FP64="native"))
    assert report["messages"] == []
    assert report["dtype"] == "torch.float64"
    assert report["native"] and not report["emulated"]
    assert report["exp_native"] and report["mm_native"]


def test_bad_fp64_mode_gives_clear_error():
    proc = run_python("import torch; torch.ones(1, device='neuron'); print('started')", TORCH_NEURONX_FP64="double")
    assert proc.returncode != 0 and "started" not in proc.stdout
    assert "TORCH_NEURONX_FP64='double'" in proc.stderr
    assert "expected one of" in proc.stderr and "'native'" in proc.stderr and "'emulate'" in proc.stderr


def test_float32_with_python_scalars_does_not_warn_or_widen():
    report = last_json(run_python(
        """
        import json, warnings, torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.randn(8, device="neuron")
            y = x * 0.5 + 1.25
        print(json.dumps({"dtype": str(y.dtype),
                          "warned": any("float64" in str(w.message) for w in caught)}))
        """
    ))
    assert report == {"dtype": "torch.float32", "warned": False}
