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


def _is_aten_overload(key: str) -> bool:
    """'aten::name.overload' (or 'aten::name') names an existing ATen overload."""
    namespace, _, qualified = key.partition("::")
    name, _, overload = qualified.partition(".")
    packet = getattr(torch.ops.aten, name, None) if namespace == "aten" else None
    return packet is not None and (overload or "default") in packet.overloads()


def test_direct_kernel_counters_name_real_ops():
    """The kernels of csrc/Kernels.cpp and csrc/FastOps.cpp count their calls
    under their op's schema name: each shows up under its own name, and every
    name in get_executed_ops() is a real ATen overload (a misspelt counter
    would be a key no op has)."""
    aten = torch.ops.aten
    x = torch.randn(4, 4, device="neuron")
    w = torch.randn(2, 1, 3, 3, device="neuron", requires_grad=True)
    image = torch.randn(1, 1, 5, 5, device="neuron")
    torch_neuronx.clear_op_tracking()
    torch.empty(4, device="neuron")
    torch.empty_strided((2, 2), (1, 2), device="neuron")
    y = torch.randn(4).to("neuron")
    aten._copy_from_and_resize(torch.randn(3), torch.empty(0, device="neuron"))
    y.resize_(8)
    y[0].item()
    y.set_(x.untyped_storage(), 0, (2,), (1,))
    y.set_(x.untyped_storage())
    y.set_(x)
    y.set_()
    torch.nn.functional.conv2d(image, w).sum().backward()
    aten.native_dropout(x, 0.5, True)
    x + x, x - x, x * x, x / x
    x.add_(x), x.sub_(x), x.mul_(x), x.div_(x)
    executed = torch_neuronx.get_executed_ops()
    direct = {
        "aten::empty.memory_format", "aten::empty_strided", "aten::_copy_from",
        "aten::_copy_from_and_resize", "aten::resize_", "aten::_local_scalar_dense",
        "aten::set_.source_Storage_storage_offset", "aten::set_.source_Storage",
        "aten::set_.source_Tensor", "aten::set_", "aten::convolution_overrideable",
        "aten::convolution_backward_overrideable", "aten::native_dropout",
        "aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::sub_.Tensor",
        "aten::mul.Tensor", "aten::mul_.Tensor", "aten::div.Tensor", "aten::div_.Tensor",
    }
    assert sorted(direct - set(executed)) == []
    assert sorted(key for key in executed if not _is_aten_overload(key)) == []


# ------------------------------------------------- the taxonomy

import pathlib  # noqa: E402
import re  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]

def test_cpp_kernels_are_those_of_kernels_cpp():
    source = (ROOT / "csrc" / "Kernels.cpp").read_text()
    block = source[source.index("TORCH_LIBRARY_IMPL(aten, PrivateUse1"):]
    block = block[:block.index("\n}\n")]
    names = set(re.findall(r'DirectOp \w+\("([^"]+)"\)', source)) | set(re.findall(r'm\.impl\("([^"]+)"', block))
    assert {registry.base_name(n) for n in names} == registry.CPP_KERNELS


def test_fast_path_overloads_are_those_of_fastops_cpp():
    source = (ROOT / "csrc" / "FastOps.cpp").read_text()
    ops_ = re.findall(r"^NEURON_BINARY_KERNELS\((\w+),", source, re.MULTILINE)
    assert ops_ and {f"{op}{suffix}.Tensor" for op in ops_ for suffix in ("", "_")} == registry.FAST_PATH_OVERLOADS


def test_fast_path_overloads_are_served_by_fastops_not_the_alias_kernel():
    """Two implementations, one stated choice: the alias kernel is not registered for them."""
    alias = {name for name, _flags in ops.native_overloads()}
    assert not alias & registry.FAST_PATH_OVERLOADS
    for name in registry.FAST_PATH_OVERLOADS:
        assert registry.base_name(name) in registry.NATIVE_OPS - registry.DIRECT_KERNELS, name
        assert "FastOps.cpp" in torch._C._dispatch_dump("aten::" + name), name


def test_python_kernels_are_those_of_the_ops_modules():
    from torch_neuronx.ops import float8, histogram, rnn, topk

    kernels = set(rnn.KERNELS) | set(histogram.KERNELS) | set(topk.KERNELS) | set(float8.KERNELS)
    assert {registry.base_name(n) for n in kernels} == registry.PYTHON_KERNELS
    assert not registry.CPP_KERNELS & registry.PYTHON_KERNELS


def test_classes_nest_as_stated():
    assert registry.FP8_COMPUTE <= registry.PYTHON_KERNELS
    assert registry.NO_KERNEL <= registry.CPP_KERNELS
    assert registry.DATA_DEPENDENT < registry.DATA_DEPENDENT_SHAPE
    assert registry.HOST_SYNC & registry.NO_KERNEL == {"_local_scalar_dense"}


def test_base_name_reads_every_spelling():
    assert registry.base_name("aten::add_.Tensor") == "add"
    assert registry.base_name("add.out") == "add"
    assert registry.base_name("aten::__and__.Tensor") == "__and__"
    assert registry.base_name("_local_scalar_dense") == "_local_scalar_dense"
