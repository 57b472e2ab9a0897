"""Shared helpers of the conformance suite: run PyTorch's OpInfo database
(``op_db``) and ``module_db`` on the ``neuron`` device and compare against CPU.

Comparison rules (documented in docs/conformance.md, produced by run_opinfo.py):

* Each sample is generated on CPU (``op.sample_inputs("cpu", dtype)``), copied
  to ``neuron`` with the same sizes, strides and storage offset, and the op is
  run on both. Outputs are compared with ``torch.testing.assert_close`` at the
  default tolerances of the output dtype; dtype must match exactly and every
  tensor the neuron run returns must live on the neuron device.
* float64 / complex128 are computed in float32 / complex64 on the device (as on
  Trainium), so outputs of those dtypes are compared against the CPU float64
  result with the float32 / complex64 default tolerances (rtol 1.3e-6,
  atol 1e-5). A failure that disappears when the device computes float64
  natively (TORCH_NEURONX_FP64=native) is still counted as a failure and
  flagged ``[fp64-emu]`` (the fp32 rule's precision, or a bug of the emulation).
* Random ops (seeded nondeterminism, uninitialized memory) only check that the
  outputs have the same structure, shapes and dtypes and live on the device.
* A sample is skipped (with its reason) when the CPU reference itself raises,
  when it uses a non-strided (sparse) or quantized tensor, or when the CPU
  reference exceeded the time limit.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import gc
import math
import signal
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from numbers import Number

import torch

import torch_neuronx
from torch_neuronx import ops as neuron_ops

DEVICE = "neuron"
SAMPLE_TIMEOUT_S = 30.0
SAMPLE_SEED = 0

# Ops whose result depends on an RNG stream or on uninitialized memory: only
# structure, shape, dtype and device are checked. Derived from the ATen tag
# nondeterministic_seeded, plus the Python-level random ops and the empty family.
RANDOM_OPS = frozenset("""
    bernoulli cauchy exponential geometric log_normal multinomial normal uniform
    rand_like randint randint_like randn randn_like
    nn.functional.alpha_dropout nn.functional.dropout nn.functional.dropout2d
    nn.functional.dropout3d nn.functional.feature_alpha_dropout nn.functional.rrelu
    nn.functional.fractional_max_pool2d nn.functional.fractional_max_pool3d
    svd_lowrank pca_lowrank
    empty empty_like empty_permuted empty_strided new_empty new_empty_strided
""".split())

# Modules whose training-mode output is random.
RANDOM_MODULES = frozenset("""
    nn.Dropout nn.Dropout1d nn.Dropout2d nn.Dropout3d nn.AlphaDropout nn.FeatureAlphaDropout
    nn.RReLU nn.FractionalMaxPool2d nn.FractionalMaxPool3d
""".split())

# Tensor arguments an op requires on the host even when its input is on the device
# (as on CUDA): (op name, index into sample.args). They are not moved to neuron.
HOST_ARGS = frozenset({("tensor_split", 0)})

# float64 / complex128 are compared with these (the float32 / complex64 defaults).
FP32_RULE_TOLERANCE = {torch.float64: (1.3e-6, 1e-5), torch.complex128: (1.3e-6, 1e-5)}
EMULATED_DTYPES = frozenset(FP32_RULE_TOLERANCE)
# Marks failures that go away when the device computes float64 natively
# (the fp32 rule's precision loss, or a bug in the fp64 emulation).
FP32_TAG = "[fp64-emu] "

# The representative subset (tests/test_conformance.py, and run_opinfo.py without --full).
SUBSET_DTYPES = (torch.float32, torch.int64, torch.bool)
SUBSET_MAX_SAMPLES = 6

# Core ops that must pass with zero failures in the subset.
CORE_OPS = (
    "add", "sub", "mul", "div.no_rounding_mode", "mm", "matmul", "bmm", "addmm", "softmax", "log_softmax",
    "nn.functional.layer_norm", "nn.functional.conv2d", "nn.functional.embedding",
    "nn.functional.linear", "nn.functional.gelu", "nn.functional.relu", "cat", "stack",
    "index_select", "sum", "mean", "exp", "tanh", "sigmoid", "where", "transpose", "reshape",
    "view", "clone", "gather", "scatter", "masked_fill", "argmax", "max.reduction_with_dim",
    "topk", "cumsum", "pow", "sqrt", "rsqrt", "nn.functional.cross_entropy",
    "nn.functional.dropout", "zeros_like", "ones_like", "full_like", "arange",
)


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raises SampleTimeout in the main thread after `seconds` (no-op elsewhere)."""
    usable = seconds and hasattr(signal, "setitimer")
    if usable:
        import threading

        usable = threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def _raise(signum, frame):
        raise SampleTimeout(f"exceeded {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def error_line(exc: BaseException, limit: int = 240) -> str:
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------- moving data


def _unsupported_layout(obj) -> str | None:
    """Reason string if obj holds a tensor the device cannot take (sparse, quantized, ...)."""
    for t in iter_tensors(obj):
        if t.layout != torch.strided:
            return f"{str(t.layout).replace('torch.', '')} layout not supported on neuron"
        if t.is_quantized:
            return "quantized tensors not supported on neuron"
        if t.is_nested:
            return "nested tensors not supported on neuron"
    return None


def iter_tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_tensors(item)


def tensor_to_device(t: torch.Tensor, device=DEVICE) -> torch.Tensor:
    """A copy of t on `device` with the same sizes, strides and storage offset (so
    non-contiguous, overlapping and offset inputs reach the device as they are)."""
    requires_grad = t.requires_grad
    t = t.detach()
    if t.is_conj() or t.is_neg() or t.numel() == 0:
        out = t.to(device, copy=True)
    else:
        # every byte of the storage, then the same view of it
        flat = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
        dev_flat = flat.to(device, copy=True).view(t.dtype)
        out = dev_flat.as_strided(t.size(), t.stride(), t.storage_offset())
    if requires_grad:
        out.requires_grad_(True)
    return out


def _device_arg(obj, device):
    if isinstance(obj, torch.device) and obj.type == "cpu":
        return torch.device(device)
    if isinstance(obj, str) and obj == "cpu":
        return device
    if isinstance(obj, torch.Generator) and obj.device.type == "cpu":
        gen = torch.Generator(device)
        gen.manual_seed(obj.initial_seed())
        return gen
    return obj


def to_device(obj, device=DEVICE):
    """Copies every tensor in a (nested) structure to `device`; device and
    generator arguments that name the CPU are redirected too."""
    if isinstance(obj, torch.Tensor):
        return tensor_to_device(obj, device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(x, device) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return _device_arg(obj, device)


def sample_to_device(op, sample, device=DEVICE):
    """(input, args, kwargs) of an OpInfo sample on `device`, host-only args kept."""
    args = list(sample.args)
    for i, arg in enumerate(args):
        if (op.name, i) in HOST_ARGS and isinstance(arg, torch.Tensor):
            args[i] = arg.clone()
        else:
            args[i] = to_device(arg, device)
    return to_device(sample.input, device), tuple(args), to_device(sample.kwargs, device)


def _mentions_device(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.device.type == DEVICE
    if isinstance(obj, torch.device):
        return obj.type == DEVICE
    if isinstance(obj, torch.Generator):
        return obj.device.type == DEVICE
    if isinstance(obj, str):
        return obj == DEVICE
    if isinstance(obj, (list, tuple)):
        return any(_mentions_device(x) for x in obj)
    if isinstance(obj, dict):
        return any(_mentions_device(x) for x in obj.values())
    return False


def leaf_copy(obj):
    """Detached copies (same layout) of every tensor, leaves keeping requires_grad."""
    return to_device(obj, "cpu")


def to_cpu(obj, off_device: list):
    """Copies device outputs back to CPU; records tensors not on the device."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type != DEVICE:
            off_device.append(str(obj.device))
        return obj.detach().to("cpu") if obj.layout == torch.strided else obj.detach().to_dense().cpu()
    if isinstance(obj, (list, tuple)):
        return [to_cpu(x, off_device) for x in obj]
    if isinstance(obj, dict):
        return {k: to_cpu(v, off_device) for k, v in obj.items()}
    return obj


def _plain(obj):
    """CPU outputs in the same plain containers to_cpu produces."""
    if isinstance(obj, torch.Tensor):
        return obj.detach() if obj.layout == torch.strided else obj.detach().to_dense()
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


# --------------------------------------------------------------------------- comparing


def tolerance(dtype: torch.dtype):
    """(rtol, atol) for a tensor of `dtype`; None means assert_close's default."""
    return FP32_RULE_TOLERANCE.get(dtype)


def compare(actual, expected, *, shape_only: bool = False, path: str = "output") -> None:
    """Raises AssertionError when the device result (already on CPU) differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: expected a tensor, got {type(actual).__name__}")
        if actual.dtype != expected.dtype:
            raise AssertionError(f"{path}: dtype {actual.dtype} != {expected.dtype}")
        if actual.shape != expected.shape:
            raise AssertionError(f"{path}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
        if shape_only:
            return
        with contextlib.suppress(RuntimeError, TypeError):
            if torch.equal(actual, expected):
                return  # identical: the common case, and much cheaper than assert_close
        tol = tolerance(expected.dtype)
        kwargs = {"rtol": tol[0], "atol": tol[1]} if tol else {}
        try:
            torch.testing.assert_close(actual, expected, equal_nan=True, check_stride=False,
                                       check_layout=False, **kwargs)
        except AssertionError as exc:
            raise AssertionError(f"{path}: {error_line(exc)}; {_mismatch_summary(exc)}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise AssertionError(f"{path}: expected a sequence of {len(expected)}, got {actual!r:.80}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            compare(a, e, shape_only=shape_only, path=f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise AssertionError(f"{path}: keys differ")
        for k in expected:
            compare(actual[k], expected[k], shape_only=shape_only, path=f"{path}[{k!r}]")
        return
    if isinstance(expected, Number) and not isinstance(expected, bool):
        if not isinstance(actual, Number):
            raise AssertionError(f"{path}: expected a number, got {type(actual).__name__}")
        if shape_only:
            return
        if isinstance(expected, complex) or isinstance(actual, complex):
            close = cmath_close(complex(actual), complex(expected))
        else:
            close = (math.isnan(expected) and math.isnan(actual)) or math.isclose(
                actual, expected, rel_tol=1.3e-6, abs_tol=1e-5)
        if not close:
            raise AssertionError(f"{path}: {actual!r} != {expected!r}")
        return
    if actual != expected and not shape_only:
        raise AssertionError(f"{path}: {actual!r:.80} != {expected!r:.80}")


def cmath_close(a: complex, b: complex) -> bool:
    return abs(a - b) <= 1e-5 + 1.3e-6 * abs(b) or (a != a and b != b)


def _mismatch_summary(exc: AssertionError) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    keep = [line for line in lines if line.startswith(("Mismatched elements", "Greatest absolute"))]
    return " ".join(keep)[:200]


# --------------------------------------------------------------------------- results


@dataclass
class CaseResult:
    """Counts for one (op or module, dtype)."""

    kind: str  # "op" or "module"
    name: str
    dtype: str
    passed: int = 0
    failed: int = 0
    failed_fp32: int = 0  # failures that pass when the device computes float64 natively (FP32_TAG)
    skipped: int = 0
    failures: list = field(default_factory=list)  # [sample index, error line]
    skips: Counter = field(default_factory=Counter)  # reason -> count
    fallback: list = field(default_factory=list)  # aten ops that took the CPU fallback
    seconds: float = 0.0

    def fail(self, index, message: str) -> None:
        self.failed += 1
        self.failed_fp32 += message.startswith(FP32_TAG)
        if len(self.failures) < 5:
            self.failures.append([index, message])

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.skips[reason] += 1

    def to_json(self) -> dict:
        return {
            "kind": self.kind, "name": self.name, "dtype": self.dtype, "passed": self.passed,
            "failed": self.failed, "failed_fp32": self.failed_fp32, "skipped": self.skipped, "failures": self.failures,
            "skips": dict(self.skips), "fallback": self.fallback, "seconds": round(self.seconds, 3),
        }


def dtype_name(dtype: torch.dtype | None) -> str:
    return "-" if dtype is None else str(dtype).replace("torch.", "")


def parse_dtypes(spec: str) -> list[torch.dtype]:
    out = []
    for name in spec.split(","):
        name = name.strip()
        if name:
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {name!r}")
            out.append(dtype)
    return out


def op_full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select(items, patterns: list[str] | None, name_of):
    """Items whose name matches one of the fnmatch patterns (all if none given)."""
    if not patterns:
        return list(items)
    return [it for it in items if any(fnmatch.fnmatchcase(name_of(it), p) for p in patterns)]


def load_op_db():
    """op_db, and the foreach ops' databases (torch.optim's default path on the device: their
    OpInfos live apart from op_db), out-of-place and in-place variants alike."""
    from torch.testing._internal import common_methods_invocations as cmi

    foreach = [op for name in ("foreach_unary_op_db", "foreach_binary_op_db", "foreach_pointwise_op_db",
                               "foreach_reduce_op_db", "foreach_other_op_db") for op in getattr(cmi, name, [])]
    in_place = [InPlaceForeach(op) for op in foreach if getattr(op, "inplace_variant", None) is not None]
    return list(cmi.op_db) + foreach + in_place


class InPlaceForeach:
    """A foreach op's in-place variant as an op of its own (`_foreach_add_`, what optimizers call):
    called as the out-of-place op, it returns the list it updated."""

    def __init__(self, op):
        self._op = op
        self.name = op.name + "_"

    def __getattr__(self, attr):
        return getattr(self._op, attr)

    def __call__(self, tensors, *args, **kwargs):
        self._op.inplace_variant(tensors, *args, **kwargs)
        return tensors


def load_module_db():
    from torch.testing._internal.common_modules import module_db

    return module_db


def case_dtypes(supported, dtypes: list[torch.dtype] | None, subset: bool):
    """The dtypes to run for one op: the requested ones it supports; with `subset`,
    the SUBSET_DTYPES it supports (or its first supported dtype if none)."""
    ordered = sorted(supported, key=str)
    if dtypes:
        return [d for d in dtypes if d in supported]
    if subset:
        chosen = [d for d in SUBSET_DTYPES if d in supported]
        return chosen or ordered[:1]
    return ordered


def _fallback_snapshot() -> list[str]:
    return sorted(neuron_ops.get_fallback_ops())


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# --------------------------------------------------------------------------- op_db


def is_random_op(op, sample=None) -> bool:
    if op.name in RANDOM_OPS:
        return True
    if op.name == "nn.functional.scaled_dot_product_attention" and sample is not None:
        return float(sample.kwargs.get("dropout_p", 0.0) or 0.0) > 0.0
    return False


@contextlib.contextmanager
def native_fp64():
    """Device float64 computed in float64 (TORCH_NEURONX_FP64=native) inside the block."""
    previous = torch_neuronx._C._get_fp64_mode()
    torch_neuronx._C._set_fp64_mode(torch_neuronx._C._fp64_modes["native"])
    try:
        yield
    finally:
        torch_neuronx._C._set_fp64_mode(previous)


def _has_wide(obj) -> bool:
    return any(t.dtype in EMULATED_DTYPES for t in iter_tensors(obj))


def _fp32_only(op, pristine, expected, random, timeout) -> bool:
    """Whether a failing sample passes once the device computes float64 natively,
    i.e. whether the failure is the fp32 rule's doing."""
    if random or not (_has_wide(pristine) or _has_wide(expected)):
        return False
    try:
        with native_fp64(), time_limit(timeout):
            dev = sample_to_device(op, _Sample(*pristine))
            off: list = []
            actual = to_cpu(op(dev[0], *dev[1], **dev[2]), off)
        compare(actual, expected)
        return not off
    except Exception:  # noqa: BLE001
        return False


# Ops whose indices the device picks in its own order among equal values, which
# PyTorch leaves unspecified (torch_neuronx/ops/topk.py): their indices are
# checked by the input values they point at.
TIE_INDEX_OPS = frozenset({"topk"})


def _pointed_values(op, sample, result):
    """topk's (values, indices) as (values, the input's values at those indices)."""
    if op.name not in TIE_INDEX_OPS or not isinstance(result, (list, tuple)) or sample.input.ndim == 0:
        return result
    dim = sample.args[1] if len(sample.args) > 1 else sample.kwargs.get("dim", -1)
    values, indices = result
    return values, torch.gather(sample.input, dim, indices)


def run_op_sample(op, sample, dtype, timeout=SAMPLE_TIMEOUT_S):
    """One sample: ('pass'|'fail'|'skip', message)."""
    reason = _unsupported_layout((sample.input, sample.args, sample.kwargs))
    if reason:
        return "skip", reason
    pristine = leaf_copy((sample.input, sample.args, sample.kwargs))  # ops may mutate inputs
    try:
        dev = sample_to_device(op, sample)
    except Exception as exc:  # noqa: BLE001
        return "fail", "moving inputs to neuron: " + error_line(exc)
    if not _mentions_device(dev):
        return "skip", "sample has no tensor or device argument (nothing to run on neuron)"
    random = is_random_op(op, sample)
    try:
        with time_limit(timeout):
            expected_raw = op(sample.input, *sample.args, **sample.kwargs)
            expected = _plain(expected_raw)
    except SampleTimeout:
        return "skip", "CPU reference exceeded the time limit"
    except Exception as exc:  # noqa: BLE001
        return "skip", "CPU reference raises " + error_line(exc, 110)
    try:
        with time_limit(timeout):
            result = op(dev[0], *dev[1], **dev[2])
            off_device: list = []
            actual = to_cpu(result, off_device)
    except SampleTimeout:
        return "fail", "timeout: neuron run exceeded the time limit"
    except Exception as exc:  # noqa: BLE001
        layout = _unsupported_layout(expected_raw)
        if layout:
            return "skip", layout.replace("not supported", "output not supported")
        if "FP8 compute needs Trainium3" in str(exc):  # _scaled_mm off trn3 profiles: docs/fp8.md
            return "skip", "FP8 compute needs Trainium3; this instance profile has none (docs/fp8.md)"
        message = error_line(exc)
    else:
        message = f"output tensor on {off_device[0]}, expected neuron" if off_device else None
        if message is None:
            try:
                compare(_pointed_values(op, sample, actual), _pointed_values(op, sample, expected),
                        shape_only=random)
                return "pass", ""
            except AssertionError as exc:
                message = str(exc)[:300]
    if _fp32_only(op, pristine, expected, random, timeout):
        message = FP32_TAG + message
    return "fail", message


class _Sample:
    def __init__(self, input, args, kwargs):
        self.input, self.args, self.kwargs = input, args, kwargs


class Hooks:
    """Optional per-sample callbacks (the runner streams results with them so a
    crash in the core loses nothing but the sample that crashed)."""

    def begin(self, index) -> None:
        pass

    def end(self, index, status: str, message: str) -> None:
        pass


def _record(result: CaseResult, hooks: Hooks, index, status: str, message: str) -> None:
    if status == "pass":
        result.passed += 1
    elif status == "fail":
        result.fail(index, message)
    else:
        result.skip(message)
    hooks.end(index, status, message)


def _guarded(fn, *args):
    """A sample runner's verdict; an exception escaping it is the harness's own
    error, reported as such (a failure, so it cannot hide)."""
    try:
        return fn(*args)
    except SampleTimeout:
        return "fail", "timeout (harness)"
    except Exception as exc:  # noqa: BLE001
        return "fail", "harness error: " + error_line(exc)


def iter_samples(op, dtype, timeout=SAMPLE_TIMEOUT_S):
    """The samples of ``op.sample_inputs("cpu", dtype, requires_grad=False)``.

    Calls the OpInfo's generator function directly: ``sample_inputs`` wraps it in
    a TrackedInputIter that inspects the whole call stack once per call and
    reseeds every device's RNG (queuing lazy CUDA/XPU/MTIA calls with stack
    traces) before every sample, which made sample generation most of the run
    time. As there, the CPU generator is reseeded before each sample, so a sample
    does not depend on what ran before it (random ops, resumed runs)."""
    torch.default_generator.manual_seed(SAMPLE_SEED)
    with time_limit(timeout):
        samples = iter(op.sample_inputs_func(op, "cpu", dtype, False))
    while True:
        torch.default_generator.manual_seed(SAMPLE_SEED)
        with time_limit(timeout):
            sample = next(samples, None)
        if sample is None:
            return
        yield sample


def run_op(op, dtype, *, max_samples=None, timeout=SAMPLE_TIMEOUT_S, first_sample=0,
           hooks: Hooks | None = None) -> CaseResult:
    """Every sample of `op` at `dtype` (up to max_samples), CPU vs neuron.
    Samples before `first_sample` are generated but not run (resuming)."""
    hooks = hooks or Hooks()
    result = CaseResult("op", op_full_name(op), dtype_name(dtype))
    start = time.perf_counter()
    neuron_ops.clear_op_tracking()
    if dtype is None:
        _record(result, hooks, 0, "skip", "the OpInfo lists no dtype for CPU (a device-specific op)")
        return result
    with quiet():
        index = 0
        try:
            samples = iter_samples(op, dtype, timeout)
            while max_samples is None or index < max_samples:
                sample = next(samples, None)
                if sample is None:
                    break
                if index >= first_sample:
                    hooks.begin(index)
                    status, message = _guarded(run_op_sample, op, sample, dtype, timeout)
                    _record(result, hooks, index, status, message)
                index += 1
        except SampleTimeout:
            _record(result, hooks, index, "skip", "sample generation exceeded the time limit")
        except Exception as exc:  # noqa: BLE001
            _record(result, hooks, index, "skip", f"sample generation raises {type(exc).__name__}")
    result.fallback = _fallback_snapshot()
    result.seconds = time.perf_counter() - start
    return result


# --------------------------------------------------------------------------- module_db


def module_name(info) -> str:
    return info.name  # e.g. "nn.Linear"


def _outputs_sum(out):
    total = None
    for t in iter_tensors(out):
        if t.requires_grad and (t.is_floating_point() or t.is_complex()):
            part = t.sum().abs() if t.is_complex() else t.sum()
            total = part if total is None else total + part
    return total


def _run_module(module, forward, backward: bool):
    out = module(*forward.args, **forward.kwargs)
    grads_in = None
    if backward:
        loss = _outputs_sum(out)
        if loss is not None:
            loss.backward()
            grads_in = [t.grad for t in iter_tensors((forward.args, forward.kwargs)) if t.requires_grad]
    return out, grads_in


def run_module_sample(info, module_input, dtype, training: bool, timeout=SAMPLE_TIMEOUT_S):
    from torch.testing._internal.common_modules import FunctionInput

    ctor, fwd = module_input.constructor_input, module_input.forward_input
    if fwd is None:
        return "skip", "module input has no forward input"
    reason = _unsupported_layout((ctor.args, ctor.kwargs, fwd.args, fwd.kwargs))
    if reason:
        return "skip", reason
    random = training and module_name(info) in RANDOM_MODULES
    try:
        with time_limit(timeout):
            torch.default_generator.manual_seed(SAMPLE_SEED)
            m_cpu = info.module_cls(*ctor.args, **ctor.kwargs).to(dtype)
            m_cpu.train(training)
            if info.is_lazy:  # materialize parameters on CPU so both copies share them
                with torch.no_grad():
                    m_cpu(*leaf_copy(fwd.args), **leaf_copy(fwd.kwargs))
            m_dev = copy.deepcopy(m_cpu).to(DEVICE)
    except SampleTimeout:
        return "skip", "CPU module construction exceeded the time limit"
    except Exception as exc:  # noqa: BLE001
        return "skip", f"CPU module construction raises {type(exc).__name__}"
    cpu_fwd = FunctionInput(*leaf_copy(fwd.args), **leaf_copy(fwd.kwargs))
    try:
        dev_fwd = FunctionInput(*to_device(fwd.args), **to_device(fwd.kwargs))
    except Exception as exc:  # noqa: BLE001
        return "fail", "moving inputs to neuron: " + error_line(exc)
    backward = any(p.requires_grad for p in m_cpu.parameters()) or any(
        t.requires_grad for t in iter_tensors((fwd.args, fwd.kwargs)))
    try:
        with time_limit(timeout):
            out_cpu, gin_cpu = _run_module(m_cpu, cpu_fwd, backward)
    except SampleTimeout:
        return "skip", "CPU reference exceeded the time limit"
    except Exception as exc:  # noqa: BLE001
        return "skip", "CPU reference raises " + error_line(exc, 110)
    try:
        with time_limit(timeout):
            out_dev, gin_dev = _run_module(m_dev, dev_fwd, backward)
            off: list = []
            actual = {
                "output": to_cpu(out_dev, off),
                "input_grads": to_cpu(gin_dev, off),
                "param_grads": to_cpu([p.grad for p in m_dev.parameters()], off),
                "buffers": to_cpu(list(m_dev.buffers()), off),
            }
    except SampleTimeout:
        return "fail", "timeout: neuron run exceeded the time limit"
    except Exception as exc:  # noqa: BLE001
        return "fail", error_line(exc)
    if off:
        return "fail", f"output tensor on {off[0]}, expected neuron"
    expected = {
        "output": _plain(out_cpu),
        "input_grads": _plain(gin_cpu),
        "param_grads": _plain([p.grad for p in m_cpu.parameters()]),
        "buffers": _plain(list(m_cpu.buffers())),
    }
    try:
        if random:
            compare(actual, expected, shape_only=True)
        else:
            compare(actual, expected)
    except AssertionError as exc:
        return "fail", str(exc)[:300]
    return "pass", ""


def run_module(info, dtype, *, max_samples=None, timeout=SAMPLE_TIMEOUT_S, first_sample=0,
               hooks: Hooks | None = None) -> CaseResult:
    """Forward + backward of every module input at `dtype`, training mode (and eval
    mode too when the module behaves differently)."""
    hooks = hooks or Hooks()
    result = CaseResult("module", module_name(info), dtype_name(dtype))
    start = time.perf_counter()
    neuron_ops.clear_op_tracking()
    modes = (True, False) if info.train_and_eval_differ else (True,)
    index = 0
    with quiet():
        for training in modes:
            torch.default_generator.manual_seed(SAMPLE_SEED)
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=dtype,
                                                 requires_grad=True, training=training)
            except Exception as exc:  # noqa: BLE001
                if index >= first_sample:
                    _record(result, hooks, index, "skip",
                            f"module input generation raises {type(exc).__name__}")
                index += 1
                continue
            for count, module_input in enumerate(inputs):
                if max_samples is not None and count >= max_samples:
                    break
                if index >= first_sample:
                    hooks.begin(index)
                    status, message = _guarded(run_module_sample, info, module_input, dtype, training,
                                               timeout)
                    if status == "fail" and dtype in EMULATED_DTYPES:
                        with native_fp64():
                            if _guarded(run_module_sample, info, module_input, dtype, training,
                                        timeout)[0] == "pass":
                                message = FP32_TAG + message
                    tag = "train" if training else "eval"
                    _record(result, hooks, f"{index} ({tag})" if status == "fail" else index,
                            status, message)
                index += 1
    result.fallback = _fallback_snapshot()
    result.seconds = time.perf_counter() - start
    return result


def tidy() -> None:
    gc.collect()
    with contextlib.suppress(Exception):
        torch_neuronx.empty_cache()
