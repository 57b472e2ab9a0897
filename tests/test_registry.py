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
    # ONE_KERNEL_COMPOSITES excepted: their CPU key resolves to PyTorch's composite.
    for name, _flags in ops.native_overloads():
        assert ops._has_own_cpu_kernel("aten::" + name) or registry.base_name(name) in registry.ONE_KERNEL_COMPOSITES, name


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


# ------------------------------------------------- the taxonomy: each class in one place

import ast  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch_neuronx"
REGISTRY = PACKAGE / "ops" / "registry.py"

# Every class of ops the package tests a name against.
CLASSES = ("HOST_SYNC", "COPIES", "DATA_DEPENDENT", "VIEWS", "METADATA", "NO_KERNEL", "FP8_COMPUTE",
           "CPP_KERNELS", "PYTHON_KERNELS", "FAST_PATH_OVERLOADS", "TENSOR_ENGINE")


def _string_collections(tree):
    """(is_a_set, strings) of each collection of strings written in a module: set, list and
    tuple displays, a dict's keys when its values are constants too ({"aten::x": "item"}),
    and the '''a b c'''.split() blocks. Dicts of functions (the ops' KERNELS) register
    kernels: they are implementations, not classes."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            is_set, items = isinstance(node, ast.Set), node.elts
        elif isinstance(node, ast.Dict) and all(isinstance(v, ast.Constant) for v in node.values):
            is_set, items = True, node.keys
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
              and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
            yield False, node.func.value.value.split()
            continue
        else:
            continue
        strings = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if strings:
            yield is_set, strings


def _defines(strings: list[str], name: str, is_set: bool = True) -> bool:
    """Whether a collection restates the class: two of its ops, or a set (or mapping) of
    nothing but its ops, in any spelling ("aten::nonzero", "resize_", "set_.source_Tensor").
    A one-string tuple is a record, not a class (("matmul", m, n) in nki/isa.py)."""
    members = getattr(registry, name)
    if name == "FAST_PATH_OVERLOADS":
        found = [s for s in strings if s.rpartition("::")[2] in members]
    else:
        found = [s for s in strings if registry.base_name(s) in members]
    return len(found) >= 2 or bool(is_set and found and len(found) == len(strings))


# Collections of op names elsewhere that overlap a class without being one.
NOT_CLASSES = {
    # the view ops whose *_copy lowering reuses the view's rule: the lowering table's own choice
    ("torch_neuronx/lowering/shapes.py", ("as_strided", "permute", "select", "slice", "split", "unbind", "view")),
    # NKI's activation functions the vector engine's ALU computes: names of nki.language functions
    ("torch_neuronx/nki/isa/__init__.py", ("abs", "square", "relu", "rsqrt", "reciprocal")),
}


def test_each_class_is_defined_in_one_module():
    where = {name: set() for name in CLASSES}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for is_set, strings in _string_collections(ast.parse(path.read_text(), module)):
            if (module, tuple(strings)) in NOT_CLASSES:
                continue
            for name in CLASSES:
                if _defines(strings, name, is_set):
                    where[name].add(module)
    assert where == {name: {"torch_neuronx/ops/registry.py"} for name in CLASSES}


def test_the_scan_finds_a_restated_class():
    """The check above is not vacuous: the old spellings of the audit's sets count."""
    assert _defines(["aten::_local_scalar_dense"], "HOST_SYNC")
    assert _defines(["aten::nonzero", "aten::masked_select", "aten::nonzero_static"], "DATA_DEPENDENT")
    assert _defines(["set_", "resize_", "resize_as_"], "METADATA")
    assert _defines(["aten::add.Tensor", "aten::add_.Tensor"], "FAST_PATH_OVERLOADS")
    assert not _defines(["copy", "index", "index_put"], "COPIES")  # ACCEPTS_HOST_TENSORS


def test_cpp_kernels_are_those_of_kernels_cpp():
    """Kernels.cpp's device kernels, linear_backward's in Linear.cpp (beside linear's autograd; its
    linear is a fast path overload) and native_dropout's in Dropout.cpp (whose
    native_dropout_backward is a fast path overload); Gelu.cpp's and LayerNorm.cpp's are all fast path
    overloads."""
    names = set()
    for file in ("Kernels.cpp", "Linear.cpp", "Dropout.cpp", "Gelu.cpp", "LayerNorm.cpp"):
        source = (ROOT / "csrc" / file).read_text()
        block = source[source.index("TORCH_LIBRARY_IMPL(aten, PrivateUse1"):]
        block = block[:block.index("\n}\n")]
        names |= set(re.findall(r'DirectOp \w+\("([^"]+)"\)', source)) | set(re.findall(r'm\.impl\("([^"]+)"', block))
    assert {registry.base_name(n) for n in names - registry.FAST_PATH_OVERLOADS} == registry.CPP_KERNELS


def test_fast_path_overloads_are_those_of_fastops_cpp():
    source = (ROOT / "csrc" / "FastOps.cpp").read_text()
    binary = re.findall(r"^NEURON_BINARY_KERNELS\((\w+),", source, re.MULTILINE)
    queued = re.findall(r'^NEURON_QUEUED_KERNELS\((\w+), "([^"]*)",', source, re.MULTILINE)
    names = {f"{op}{suffix}.Tensor" for op in binary for suffix in ("", "_")}
    scalar = re.findall(r"^NEURON_SCALAR_KERNELS\((\w+),", source, re.MULTILINE)
    names |= {f"{op}{suffix}.Scalar" for op in scalar for suffix in ("", "_")}
    names |= {f"{op}{suffix}{overload}" for op, overload in queued for suffix in ("", "_")}
    out_of_place = re.findall(r'^NEURON_QUEUED_KERNEL\((\w+), "([^"]*)",', source, re.MULTILINE)
    names |= {f"{op}{overload}" for op, overload in out_of_place}
    reductions = re.findall(r'^NEURON_REDUCTION_KERNEL\((\w+), "([^"]*)",', source, re.MULTILINE)
    names |= {f"{op}.{overload}" for op, overload in reductions}
    # pow's kernels (FastOps.cpp, written out: the exponent picks the queued formula), and kernels
    # beside their ops' other kernels
    for file in ("FastOps.cpp", "Dropout.cpp", "Linear.cpp", "Gelu.cpp", "LayerNorm.cpp"):
        direct = set(re.findall(r'DirectOp \w+\("([^"]+)"\)', (ROOT / "csrc" / file).read_text()))
        names |= {name for name in direct if registry.base_name(name) not in registry.CPP_KERNELS}
    names |= _foreach_cpp_overloads()
    assert binary and scalar and queued and out_of_place and reductions and names == registry.FAST_PATH_OVERLOADS


def _foreach_cpp_overloads() -> set[str]:
    """The overloads csrc/Foreach.cpp's macros and its written-out DirectOps declare."""
    source = (ROOT / "csrc" / "Foreach.cpp").read_text()
    overloads = {"NEURON_FOREACH_BINARY": (".Scalar", ".ScalarList", ".List"), "NEURON_FOREACH_BINARY_TENSOR": (".Tensor",),
                 "NEURON_FOREACH_UNARY": ("",), "NEURON_FOREACH_POINTWISE": (".Scalar", ".ScalarList")}
    names = set()
    for macro, suffixes in overloads.items():
        ops = re.findall(rf"^{macro}\((\w+),", source, re.MULTILINE)
        assert ops, macro
        names |= {f"_foreach_{op}{inplace}{suffix}" for op in ops for inplace in ("", "_") for suffix in suffixes}
    return names | set(re.findall(r'DirectOp \w+\("([^"]+)"\)', source))


def test_fast_path_overloads_are_served_by_fastops_not_the_alias_kernel():
    """Two implementations, one stated choice: the alias kernel is not registered for them."""
    alias = {name for name, _flags in ops.native_overloads()}
    assert not alias & registry.FAST_PATH_OVERLOADS
    for name in registry.FAST_PATH_OVERLOADS:
        assert registry.base_name(name) in registry.NATIVE_OPS - registry.DIRECT_KERNELS, name
        file = {"native_dropout_backward": "Dropout.cpp", "linear": "Linear.cpp", "gelu": "Gelu.cpp",
                "gelu_backward": "Gelu.cpp", "native_layer_norm": "LayerNorm.cpp",
                "native_layer_norm_backward": "LayerNorm.cpp"}.get(
                    name, "Foreach.cpp" if name.startswith("_foreach_") else "FastOps.cpp")
        assert file in torch._C._dispatch_dump("aten::" + name), name


def test_mask_index_overload_is_served_by_maskindex_cpp_not_the_alias_kernel():
    """index.Tensor: csrc/MaskIndex.cpp's kernel, which hands the alias kernel the gather."""
    alias = {name for name, _flags in ops.native_overloads()}
    assert not alias & registry.MASK_INDEX_OVERLOADS
    for name in registry.MASK_INDEX_OVERLOADS:
        assert registry.base_name(name) in registry.DATA_MOVEMENT, name
        assert "MaskIndex.cpp" in torch._C._dispatch_dump("aten::" + name), name


def test_composite_overloads_run_as_pytorch_composite_with_one_device_kernel():
    """arange(start, end, step) on neuron: PyTorch's composite allocates and calls
    arange.start_out, the one kernel the release registers for it (ops/evidence.py)."""
    alias = {name for name, _flags in ops.native_overloads()}
    assert registry.COMPOSITE_OVERLOADS and not alias & registry.COMPOSITE_OVERLOADS
    assert "arange.start_out" in alias and "arange" in alias
    torch_neuronx.clear_op_tracking()
    x = torch.arange(1, 7, 2, dtype=torch.float32, device="neuron")
    y = torch.arange(4, device="neuron")
    executed = torch_neuronx.get_executed_ops()
    assert executed.get("aten::arange.start_out") == 1 and executed.get("aten::arange") == 1, executed
    assert "aten::arange.start_step" not in executed
    torch.testing.assert_close(x.cpu(), torch.arange(1, 7, 2, dtype=torch.float32), rtol=0, atol=0)
    torch.testing.assert_close(y.cpu(), torch.arange(4), rtol=0, atol=0)


def test_ops_the_release_runs_on_the_host_are_not_native():
    assert registry.HOST_FALLBACK and not registry.HOST_FALLBACK & registry.NATIVE_OPS


def test_python_kernels_are_those_of_the_ops_modules():
    from torch_neuronx.ops import attention, composites, float8, histogram, rnn, sync_batch_norm, topk

    kernels = set(rnn.KERNELS) | set(histogram.KERNELS) | set(topk.KERNELS) | set(float8.KERNELS) \
        | set(sync_batch_norm.KERNELS) | set(composites.KERNELS) | set(attention.KERNELS)
    assert {registry.base_name(n) for n in kernels} == registry.PYTHON_KERNELS
    assert not registry.CPP_KERNELS & registry.PYTHON_KERNELS


def test_classes_nest_as_stated():
    assert registry.FP8_COMPUTE <= registry.PYTHON_KERNELS
    assert registry.NO_KERNEL <= registry.CPP_KERNELS
    assert registry.DATA_DEPENDENT <= registry.DATA_DEPENDENT_SHAPE
    assert registry.HOST_SYNC & registry.NO_KERNEL == {"_local_scalar_dense"}


def test_base_name_reads_every_spelling():
    assert registry.base_name("aten::add_.Tensor") == "add"
    assert registry.base_name("add.out") == "add"
    assert registry.base_name("aten::__and__.Tensor") == "__and__"
    assert registry.base_name("_local_scalar_dense") == "_local_scalar_dense"
