"""What the release this emulator models (TorchNeuron: torch-neuronx 2.14.3 with
Neuron 2.33/2.34) does with an ATen op on a neuron tensor, and how we know it:
one record per decision, each with its source. The registry (registry.py) reads
the routes from here (HOST_FALLBACK, ONE_KERNEL, MASK_INDEX), so the eager
path, the compiler, the audit, ``torch-neuronx ops`` and
docs/supported-operators.md follow one set; ``torch-neuronx ops --differences``
lists where the emulator still differs, with why.

Sources, in order of weight (a later public document wins over the snapshot):

- AWS's published operator support (Neuron docs, "Supported PyTorch APIs and
  operators", modified 2026-11-06): unsupported ops fall back to the CPU in
  eager mode; per-op status lives in the torch-neuronx compatibility table,
  which this project could not read, so no decision below rests on it alone.
- AWS's source snapshot (public repository parmoham-aws/test-repo-parmoham,
  2026-04-21): which ops it registers for the device (python_ops/, csrc/), which
  it sends to the CPU on purpose, and what its tests assert about each
  ("did not run on neuron", "runs on neuron"). Read for facts only.

Routes:

- HOST: the release runs the op on the host CPU (inputs copied out, results
  copied back). Here: not in the native op set, so the CPU fallback runs it,
  with its warning, counted by get_fallback_ops() and by the audit.
- ONE_KERNEL: an op PyTorch implements as a composite of other ops, which the
  release registers as one device kernel. Here: native where the record says
  so (``emulated``), so the audit counts one kernel, not its parts.
- HOST_STEP: the release splits the op into device work and a host read.
"""

from __future__ import annotations

import dataclasses

HOST = "cpu fallback"
ONE_KERNEL = "one kernel"
HOST_STEP = "device + host read"

SNAPSHOT = "AWS snapshot (parmoham-aws/test-repo-parmoham, 2026-04-21)"
DOCS = ("Neuron docs, Supported PyTorch APIs and operators (awsdocs-neuron.readthedocs-hosted.com/en/latest/"
        "torch/reference/api/supported-operators.html, modified 2026-11-06)")

_FALLBACK_LIST = ("torch_neuronx/python_ops/cpu_fallback_registrations.py lists it among the linear algebra ops "
                  "sent to the CPU (their results are column-major); no device kernel registers it")
_FALLBACK_TEST = "tests/python_ops/test_cpu_fallback_registrations.py asserts it does not run on the device"
_PY_REGISTERED = f"{SNAPSHOT}: registered for PrivateUse1 in torch_neuronx/python_ops/"


@dataclasses.dataclass(frozen=True)
class Evidence:
    op: str          # the registry's base name
    route: str       # HOST, ONE_KERNEL or HOST_STEP
    source: str      # where the fact comes from
    emulated: bool   # whether this emulator routes the op the same way
    note: str = ""   # what the emulator does instead, when it differs, and why

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _host(op: str, tested: bool) -> Evidence:
    """An op AWS's fallback list names; `tested`: AWS's tests also assert it falls back."""
    facts = [_FALLBACK_TEST, _FALLBACK_LIST] if tested else [_FALLBACK_LIST]
    return Evidence(op, HOST, f"{SNAPSHOT}: " + "; ".join(facts), emulated=True)


def _one_kernel(op: str, where: str, emulated: bool, note: str = "") -> Evidence:
    return Evidence(op, ONE_KERNEL, f"{_PY_REGISTERED}{where}", emulated, note)


_COMPOSITE = ("a CompositeImplicitAutograd op: here in registry.ONE_KERNEL_COMPOSITES, its composite runs "
              "inside one device kernel")

RECORDS: tuple[Evidence, ...] = (
    # ----------------------------------------------------- run on the host by the release
    _host("linalg_qr", tested=True),
    _host("_linalg_svd", tested=True),
    _host("_linalg_eigh", tested=True),
    _host("linalg_cholesky_ex", tested=True),
    _host("linalg_inv_ex", tested=True),
    _host("linalg_lu_factor_ex", tested=True),
    _host("_linalg_det", tested=True),
    _host("_linalg_slogdet", tested=True),
    _host("linalg_ldl_factor_ex", tested=False),
    _host("cholesky_inverse", tested=False),
    _host("triangular_solve", tested=False),
    # ----------------------------------------------------- device work plus a host read
    Evidence("index", HOST_STEP,
             f"{SNAPSHOT}: torch_neuronx/python_ops/torch_mlir/ops/indexing.py turns boolean indices into "
             "nonzero on the device before its index kernel; tests/python_ops/test_index.py asserts that an "
             "all-false mask runs nonzero on the device", emulated=True,
             note="boolean masks only (csrc/MaskIndex.cpp); integer indices take one index kernel"),
    # ----------------------------------------------------- one device kernel in the release
    _one_kernel("linear", "torch_mlir/ops/linear_algebra.py (aten::linear, linear.out)", True,
                "its gradient is one linear_backward kernel (csrc/Linear.cpp); tensor subclasses (DTensor, "
                "which has no sharding rule for linear in PyTorch 2.13) and functorch keep PyTorch's composite"),
    _one_kernel("full", "torch_mlir/ops/creation.py (aten::full, full.out)", True),
    _one_kernel("zeros", "torch_mlir/ops/creation.py (aten::zeros, zeros.out)", True),
    _one_kernel("ones", "torch_mlir/ops/creation.py (aten::ones, ones.out)", True),
    _one_kernel("scalar_tensor", "torch_mlir/ops/creation.py (aten::scalar_tensor)", True),
    Evidence("new_empty", ONE_KERNEL, f"{SNAPSHOT}: torch_neuronx/csrc/core/NeuronBindings.cpp registers it "
             "for PrivateUse1 (an allocation); tests/operations/test_new_empty.py asserts it ran on the device",
             emulated=True, note="a direct kernel (csrc/Kernels.cpp): one allocation, which the audit "
                                 "does not count as a kernel"),
    _one_kernel("isfinite", "torch_mlir/ops/comparison.py (aten::isfinite)", True, _COMPOSITE),
    _one_kernel("one_hot", "torch_mlir/ops/embedding.py (aten::one_hot)", True,
                _COMPOSITE + " (without num_classes it reads the maximum inside the kernel, no separate host read)"),
    Evidence("arange", ONE_KERNEL, f"{_PY_REGISTERED}torch_mlir/ops/creation.py (arange, arange.start_out)",
             emulated=True, note="as in the release: arange(end) is one kernel; arange(start, end[, step]) is "
                                 "PyTorch's composite, an allocation and one arange.start_out kernel "
                                 "(registry COMPOSITE_OVERLOADS)"),
    _one_kernel("_fused_rms_norm", "torch_mlir/ops/normalization.py; python_ops/rms_norm.py registers rms_norm "
                "for PrivateUse1 and AutogradPrivateUse1: a 16-bit input with a weight of another dtype is "
                "raised to float32 for one _fused_rms_norm", True,
                _COMPOSITE + "; its gradient is PyTorch's formula, one _fused_rms_norm_backward kernel; rms_norm's "
                "mixed-dtype route is ops/composites.py's rms_norm"),
    _one_kernel("_fused_rms_norm_backward", "torch_mlir/ops/normalization.py", True,
                "a direct kernel (ops/composites.py): PyTorch's decomposition on host aliases"),
    _one_kernel("silu_backward", "torch_mlir/ops/activation.py (aten::silu_backward)", True,
                "the functional overload: " + _COMPOSITE[2:]),
    _one_kernel("index_select_backward", "torch_mlir/ops/indexing.py", True,
                _COMPOSITE + "; a call a gradient flows through (double backward) runs the composite"),
    _one_kernel("slice_backward", "torch_mlir/ops/indexing.py", True),
    Evidence("select_backward", ONE_KERNEL, f"{SNAPSHOT}: torch_neuronx/csrc/core/NeuronBindings.cpp registers it "
             "for PrivateUse1", emulated=True),
    _one_kernel("value_selecting_reduction_backward", "torch_mlir/ops/reduction.py", True,
                _COMPOSITE + "; a call a gradient flows through (double backward) runs the composite"),
    Evidence("embedding_dense_backward", ONE_KERNEL, f"{_PY_REGISTERED}torch_mlir/ops/misc.py",
             emulated=True, note="native here too"),
    Evidence("addmv", ONE_KERNEL, f"{_PY_REGISTERED}torch_mlir/ops/linear_algebra.py (addmv, addmv_, addmv.out)",
             emulated=True, note="native here too"),
    Evidence("_scaled_dot_product_fused_attention_overrideable", ONE_KERNEL,
             f"{SNAPSHOT}: torch_neuronx/csrc/aten/SdpBackendSelection.cpp answers SDPA's backend choice "
             "(_fused_sdp_choice_stub) with overrideable whenever query, key and value are 4-D neuron tensors "
             "(math otherwise), without reading sdpa_kernel()'s switches; python_ops/__init__.py registers this "
             "op for PrivateUse1 (python_ops/scaled_dot_product_fused_attention.py: key/value heads shared by "
             "the query heads they divide, the dropout mask drawn on the CPU from the CPU generator's state); "
             "tests/python_ops/test_scaled_dot_product_attention.py asserts it runs on neuron",
             emulated=True, note="F.scaled_dot_product_attention runs as this one kernel: PyTorch's flash "
                                 "attention for the CPU where it applies, its math formulas otherwise "
                                 "(ops/attention.py); the choice is csrc/Kernels.cpp's sdpaChoice"),
    Evidence("_scaled_dot_product_fused_attention_overrideable_backward", ONE_KERNEL,
             f"{_PY_REGISTERED}scaled_dot_product_fused_attention.py (the gradient of the overrideable "
             "kernel; tests/python_ops/test_scaled_dot_product_attention.py asserts it runs on neuron)",
             emulated=True, note="also returns the mask's gradient when grad_input_mask asks for it "
                                 "(the snapshot's NKI path returns none)"),
    Evidence("_to_copy", ONE_KERNEL, f"{_PY_REGISTERED}to_copy.py (aten::_to_copy)", emulated=False,
             note="here PyTorch's composite allocates and copies (empty_strided + copy_); both are the "
                  "device's copy machinery, which the audit counts as copies, not kernels"),
)

BY_OP: dict[str, Evidence] = {record.op: record for record in RECORDS}


def ops_routed(route: str) -> frozenset[str]:
    """The ops the release routes `route`, by base name."""
    return frozenset(record.op for record in RECORDS if record.route == route)


def differences() -> list[Evidence]:
    """The records this emulator does not follow yet."""
    return [record for record in RECORDS if not record.emulated]
