"""The native op set is one registry (torch_neuronx/ops/registry.py). These
tests keep it honest: every entry names a real ATen op, every registered
overload has a CPU kernel of its own, and the dispatcher serves each listed
op with a neuron kernel (never the fallback)."""

import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import ops
from torch_neuronx.ops import registry


def test_every_entry_is_an_aten_op():
    missing = sorted(
        name for name in registry.NATIVE_OPS
        if getattr(torch.ops.aten, name, None) is None and getattr(torch.ops.aten, name + "_", None) is None
    )
    assert missing == []


def test_groups_are_disjoint():
    assert not set(registry.DATA_MOVEMENT) & set(registry.COMPUTE)
    assert not (set(registry.DATA_MOVEMENT) | set(registry.COMPUTE)) & registry.DIRECT_KERNELS


def test_each_entry_has_a_neuron_kernel():
    """An entry with no overload served on PrivateUse1 would be a false claim."""
    unserved = []
    for base in sorted(registry.NATIVE_OPS):
        served = False
        for name in ops._overloads(base):
            try:
                if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"):
                    served = True
                    break
            except RuntimeError:
                continue
        if not served:
            unserved.append(base)
    assert unserved == [], f"registry entries with no neuron kernel: {unserved}"


def test_registered_overloads_have_own_cpu_kernels():
    for name, _flags in ops.native_overloads():
        assert ops._has_own_cpu_kernel("aten::" + name), name


def test_native_op_does_not_fall_back():
    torch_neuronx.clear_op_tracking()
    x = torch.randn(8, 8, device="neuron")
    (x @ x).relu().sum()
    assert torch_neuronx.get_fallback_ops() == {}
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::mm", 0) >= 1
    assert executed.get("aten::relu", 0) >= 1
