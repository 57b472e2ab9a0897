"""The native op set (see registry.py), its registration with the dispatcher,
the fallback policy and op tracking."""

from __future__ import annotations

import collections
import warnings

import torch

from torch_neuronx import _C, config, observe, patching
from torch_neuronx.ops.registry import (
    ACCEPTS_HOST_TENSORS,
    COMPOSITE_OVERLOADS,
    DATA_MOVEMENT,
    DIRECT_KERNELS,
    ENDS_FUSED_SEQUENCE,
    FAST_PATH_OVERLOADS,
    HOST_FALLBACK,
    MASK_INDEX_OVERLOADS,
    NATIVE_OPS,
    ONE_KERNEL_COMPOSITES,
    base_name,
)

# The C++ enums (csrc/Eager.h OpFlags, csrc/Runtime.h FallbackMode and
# Fp64Mode), as the extension exports them: name -> value.
CROSS_DEVICE = _C._op_flags["cross_device"]
EXACT_FP64 = _C._op_flags["exact_fp64"]
ENDS_SEQUENCE = _C._op_flags["ends_fused_sequence"]

_FALLBACK_MODES = dict(_C._fallback_modes)
_FP64_MODES = dict(_C._fp64_modes)


def _overloads(base: str):
    """Every overload of aten::base and aten::base_ (in-place), as 'name.overload'."""
    for name in (base, base + "_"):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:
            continue
        for overload in packet.overloads():
            yield name if overload == "default" else f"{name}.{overload}"


def _has_own_cpu_kernel(qualified: str) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    try:
        if has(qualified, "CompositeImplicitAutograd"):
            return False
    except RuntimeError:  # a Python-only alias overload (e.g. *.hacked_twin)
        return False
    return has(qualified, "CPU") or has(qualified, "CompositeExplicitAutograd") or has(
        qualified, "CompositeExplicitAutogradNonFunctional"
    )


def _served_by_alias(base: str, qualified: str) -> bool:
    """The alias kernel can run the overload: it has a CPU kernel of its own, or it is
    one of ONE_KERNEL_COMPOSITES, whose CPU key resolves to PyTorch's composite."""
    return _has_own_cpu_kernel(qualified) or base in ONE_KERNEL_COMPOSITES


def _draws_from_default_generator(name: str) -> bool:
    """A random op overload without a Generator argument (randperm(n), rand(...)):
    left to its composite, which calls the generator overload with None; the
    device serves that one like every random op (csrc/Eager.cpp
    useCpuGenerators), so each random op has one served overload that draws."""
    base, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, base), overload or "default")
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "CPU"):
        return False  # a CPU kernel of its own, not a forwarding composite
    return not any("Generator" in str(arg.type) for arg in op._schema.arguments)


def _flags(base: str) -> int:
    return (CROSS_DEVICE if base in ACCEPTS_HOST_TENSORS else 0) | (EXACT_FP64 if base in DATA_MOVEMENT else 0) \
        | (ENDS_SEQUENCE if base in ENDS_FUSED_SEQUENCE else 0)


def native_overloads() -> list[tuple[str, int]]:
    """(name.overload, flags) of every overload the alias kernel serves: those of
    the native set less the direct kernels' ops, FAST_PATH_OVERLOADS,
    MASK_INDEX_OVERLOADS and COMPOSITE_OVERLOADS."""
    result = []
    for base in sorted(NATIVE_OPS - DIRECT_KERNELS):
        for name in _overloads(base):
            qualified = "aten::" + name
            if name in FAST_PATH_OVERLOADS or name in MASK_INDEX_OVERLOADS or name in COMPOSITE_OVERLOADS \
                    or not _served_by_alias(base, qualified) or _draws_from_default_generator(name):
                continue
            result.append((name, _flags(base)))
    return result


def host_fallback_overloads() -> list[str]:
    """The overloads of registry.HOST_FALLBACK ops that run a kernel of their own on the
    CPU: the fallback is registered for each by name (csrc/Eager.cpp registerFallbackOps),
    so get_fallback_ops() and the audit name the op called, as TorchNeuron's tracking does."""
    return [name for base in sorted(HOST_FALLBACK) for name in _overloads(base)
            if _has_own_cpu_kernel("aten::" + name)]


def fronted_overloads() -> list[tuple[str, int]]:
    """(name.overload, flags) of the overloads a kernel of its own serves in front of the
    alias kernel, which runs the calls it does not take (csrc/MaskIndex.cpp's,
    FAST_PATH_OVERLOADS): registration records only their flags (csrc/Eager.cpp,
    recordOpFlags), so that such a call gets its op's flags there (fill_ on float64 is
    data movement, written exactly); their own kernels stay."""
    return [(name, _flags(base_name(name))) for name in sorted(MASK_INDEX_OVERLOADS | FAST_PATH_OVERLOADS)]


_python_kernels: list[torch.library.Library] = []  # kept alive: a dropped Library unregisters
# Calls of the ops served by Python kernels: get_executed_ops() adds them to the
# C++ kernels' counts (csrc/Eager.cpp counts only what runs through C++).
_python_executed: collections.Counter[str] = collections.Counter()


def _tracked(qualified: str, kernel):
    """The kernel, counted in get_executed_ops() and, while device work is observed
    (torch_neuronx/observe.py: the audit records, torch.profiler collects), recorded
    as csrc records its own kernels: one RecordedCall (_C._AuditKernelCall) gives
    the audit its signature and the profiler its device event."""
    name, _, overload = qualified.partition(".")

    def run(*args, **kwargs):
        if not observe.observed():
            result = kernel(*args, **kwargs)
        else:
            with _C._AuditKernelCall(name, overload, args):
                result = kernel(*args, **kwargs)
        _python_executed[qualified] += 1  # a kernel that raised (a sparse layout) did not run
        return result

    return run


def _register_python_kernels(kernels: dict, key: str = "PrivateUse1") -> None:
    """Native ops implemented in Python (ops/rnn.py, histogram.py, topk.py, float8.py, sparse.py,
    sync_batch_norm.py, composites.py, attention.py) for a neuron key."""
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in kernels.items():
        library.impl(name, patching.hide_from_dynamo(_tracked("aten::" + name, kernel)), key)
    _python_kernels.append(library)


def _register_autograd_kernels(kernels: dict) -> None:
    """AutogradPrivateUse1 kernels of ONE_KERNEL_COMPOSITES that have no autograd formula
    (ops/composites.py; linear's and rms_norm's are C++: csrc/Linear.cpp, csrc/RmsNorm.cpp);
    not counted: they run the op's kernel, another op's or the op's composite."""
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in kernels.items():
        library.impl(name, patching.hide_from_dynamo(kernel), "AutogradPrivateUse1")
    _python_kernels.append(library)


def _register_meta_kernels(kernels: dict) -> None:
    """Shape functions for ops PyTorch gives none (only CUDA kernels): the kernel
    itself, run on meta tensors, so Dynamo's fake tensors can trace calls on neuron."""
    library = torch.library.Library("aten", "IMPL")
    for name, kernel in kernels.items():
        library.impl(name, kernel, "Meta")
    _python_kernels.append(library)


def register() -> None:
    from torch_neuronx.ops import attention, composites, float8, histogram, rnn, sparse, sync_batch_norm, topk

    _C._register_native_ops(native_overloads())
    _C._record_op_flags(fronted_overloads())
    _C._register_fallback_ops(host_fallback_overloads())
    if not _python_kernels:
        _register_python_kernels(rnn.KERNELS)
        _register_python_kernels(histogram.KERNELS)
        _register_python_kernels(topk.KERNELS)
        _register_python_kernels(float8.KERNELS)
        _register_python_kernels(sync_batch_norm.KERNELS)
        _register_meta_kernels(sync_batch_norm.META_KERNELS)
        _register_python_kernels(composites.KERNELS)
        _register_autograd_kernels(composites.AUTOGRAD_KERNELS)
        _register_python_kernels(attention.KERNELS)
        _register_python_kernels(sparse.KERNELS)
        _register_python_kernels(sparse.CSR_KERNELS, "SparseCsrPrivateUse1")
        _register_python_kernels(sparse.CSR_KERNELS, "AutogradPrivateUse1")
        sparse.register_fallbacks(_python_kernels)


def apply_env_policies() -> None:
    """Reads TORCH_NEURONX_FALLBACK, TORCH_NEURONX_FP64, NEURON_LAUNCH_BLOCKING,
    TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS, TORCH_NEURONX_MLIR_ATEN_OPS and
    TORCH_NEURONX_ENABLE_CONCATENATION (with its buffer size limit)."""
    # The emulator already runs every launch synchronously (an op's error is
    # raised by the call that launched it): that value is only validated (a typo
    # is an error). It never retries a failed op on the CPU (its kernels are CPU
    # kernels: a retry would fail the same way); what `1` adds is the device
    # kernels' limits, raised instead of retried (csrc/DeviceLimits.h).
    # docs/env-vars.md says what is not emulated.
    config.launch_blocking()
    _C._set_device_limits_enforced(config.fallback_only_for_unimplemented_ops())
    _C._set_fallback_mode(_FALLBACK_MODES[config.fallback_mode()])
    _C._set_fp64_mode(_FP64_MODES[config.fp64_mode()])
    set_concatenation(config.enable_concatenation())
    # TorchNeuron's import writes its default (torch-mlir lowering) into the environment,
    # where AWS's own code and tests read it; the emulator models that path only.
    config.mlir_aten_ops.export_default("1")
    if not config.mlir_aten_ops():
        warnings.warn(f"{config.mlir_aten_ops.name}=0 (TorchNeuron's older XLA lowering of eager ops) is not "
                      "emulated: ops behave as with the default 1 (docs/env-vars.md)", stacklevel=2)


def set_fallback_mode(mode: str) -> None:
    """'warn' (default): CPU fallback with a warning per op; 'silent'; 'error'.
    Checked as TORCH_NEURONX_FALLBACK is (any letter case; an error names the variable)."""
    _C._set_fallback_mode(_FALLBACK_MODES[config.fallback_mode.parse_text(mode)])


def get_fallback_mode() -> str:
    code = _C._get_fallback_mode()
    return next(name for name, value in _FALLBACK_MODES.items() if value == code)


def set_concatenation(enabled: bool) -> None:
    """Adaptive Eager Execution on or off (TORCH_NEURONX_ENABLE_CONCATENATION at import); what is
    queued runs first. NEURON_LAUNCH_BLOCKING=1 keeps it off (csrc/Concatenation.h)."""
    _C._set_concatenation(bool(enabled), config.launch_blocking(), config.concatenation_buffer_size_limit())


def get_fp64_mode() -> str:
    """'emulate' (float64 computed in float32, as on Trainium) or 'native'."""
    code = _C._get_fp64_mode()
    return next(name for name, value in _FP64_MODES.items() if value == code)


def get_fallback_ops() -> dict[str, int]:
    """Ops that ran through the CPU fallback since the last clear, with call counts."""
    return dict(_C._fallback_ops())


def get_executed_ops() -> dict[str, int]:
    """Every op that ran on the neuron device since the last clear, with call counts."""
    executed = collections.Counter(dict(_C._executed_ops()))
    executed.update(_python_executed)
    return dict(sorted(executed.items()))


def clear_op_tracking() -> None:
    _C._clear_op_tracking()
    _python_executed.clear()
