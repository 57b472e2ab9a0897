"""Which of AWS's tests are tests of TorchNeuron's public behaviour (issue #25).

A test is private when the code it runs names AWS's internals: its own text,
the setup methods and fixtures of its class, the module's and conftests'
fixtures it takes as parameters or that are autouse, and the names its module
imported from AWS-only modules. The markers are the issue's list: AWS's own C++
(`torch_neuronx._C`), `torch_neuronx.python_ops`, `neuron_dynamo_backend`
internals, `kernels`, `neuronx-cc` and `NEURON_CC_FLAGS`, `/dev/neuron`; with
AWS's NRT bindings, its profiler's private helpers, mocks of torch_neuronx's
functions (a test that patches `torch_neuronx.X` checks how AWS's modules call
each other), and tests that *set*
TORCH_NEURONX_MLIR_ATEN_OPS (they test the other lowering path). Whole folders
out of scope: distributed (the issue), blocks (hardware timing), kernels,
xla_builder and cache (AWS's compiler and its cache), pytorch_tests (clones
PyTorch from GitHub).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

EXCLUDED_FOLDERS = {
    "distributed": "torch.distributed suite (out of the issue's scope)",
    "blocks": "hardware timing (block_perf)",
    "kernels": "AWS's XLA kernel and HLO internals",
    "xla_builder": "AWS's XLA builder",
    "cache": "AWS's compiler cache (neuronx-cc artifacts)",
    "pytorch_tests": "PyTorch's own test files, cloned from GitHub at collection (no network here; "
                     "this project runs PyTorch's OpInfo database itself: tests/conformance)",
}

MARKERS = [
    (r"torch_neuronx\._C\b|from torch_neuronx import\s[^\n]*\b_C\b|from torch_neuronx\._C\b|\b_C\._nrt",
     "AWS's C++ (torch_neuronx._C)"),
    (r"python_ops", "torch_neuronx.python_ops"),
    (r"neuron_dynamo_backend", "neuron_dynamo_backend internals"),
    (r"torch_neuronx\.kernels\b|from torch_neuronx import\s[^\n]*\bkernels\b", "AWS's kernels package"),
    (r"nki_kernel\b", "AWS's nki_kernel module"),
    (r"neuronx-cc|neuronxcc\.(?!nki\b)|NEURON_CC_FLAGS", "AWS's compiler"),
    (r"/dev/neuron", "Neuron device files"),
    (r"patch\(\s*['\"]torch_neuronx\.", "mocks a torch_neuronx function (AWS's internal wiring)"),
    (r"\b_nrt_|\bmock_nrt|nrt_bindings", "AWS's NRT bindings"),
    (r"_parse_neuroncore_|profiling\.logger\b", "AWS's profiler internals"),
    (r"_test_serialization_subcmul", "an op AWS's python_ops implements to fail on purpose (its fallback test)"),
    (r"setenv\(\s*['\"]TORCH_NEURONX_MLIR_ATEN_OPS|environ\[\s*['\"]TORCH_NEURONX_MLIR_ATEN_OPS['\"]\s*\]\s*=",
     "sets TORCH_NEURONX_MLIR_ATEN_OPS (the other lowering path)"),
]
# Names from AWS-only modules that state a public fact, answered by plugin.py:
# `from neuronxcc import nki` is the NKI import itself; IS_NKI_V2_AVAILABLE says
# whether `import nki` (the standalone package) works, as it does here.
PUBLIC_NAMES = {("neuronxcc", "nki"), ("torch_neuronx.nki_kernel", "IS_NKI_V2_AVAILABLE")}
_MARKERS = [(re.compile(pattern), why) for pattern, why in MARKERS]
_PRIVATE_MODULE = re.compile(r"python_ops|neuron_dynamo_backend|nki_kernel|^torch_mlir|^torch_neuronx\._C|"
                             r"^torch_neuronx\.kernels|^neuronxcc(?!\.nki)")


def _is_fixture(node) -> bool:
    return any("fixture" in ast.unparse(d) for d in getattr(node, "decorator_list", ()))


def _autouse(node) -> bool:
    return any("autouse=True" in ast.unparse(d) for d in getattr(node, "decorator_list", ()))


@lru_cache(maxsize=None)
def _module(path: str):
    """(source, tree, fixtures {name: text}, autouse texts, private imported names,
    helpers {name: (module, attr)} imported from the suite's own `tests.` package)."""
    source = Path(path).read_text()
    tree = ast.parse(source)
    fixtures, autouse, private_names, helpers = {}, [], set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not _is_fixture(node) \
                and not node.name.startswith(("test", "Test")):
            helpers[node.name] = (None, node.name)  # the module's own helper
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
            helpers.update({a.asname or a.name: (node.module, a.name) for a in node.names})
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_fixture(node):
            text = ast.get_source_segment(source, node) or ""
            fixtures[node.name] = text
            if _autouse(node):
                autouse.append(text)
        elif isinstance(node, ast.ImportFrom) and node.module and _PRIVATE_MODULE.search(node.module):
            private_names.update(a.asname or a.name for a in node.names
                                 if (node.module, a.name) not in PUBLIC_NAMES)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch_neuronx":
            private_names.update(a.asname or a.name for a in node.names if a.name in ("_C", "kernels"))
        elif isinstance(node, ast.Import):
            private_names.update((a.asname or a.name).split(".")[0] for a in node.names
                                 if _PRIVATE_MODULE.search(a.name))
    return source, tree, fixtures, autouse, private_names, helpers


def _helper_source(root: Path, here: Path, module: str | None, attr: str) -> str:
    """The source of a helper function or class: the test module's own (module None)
    or one of the suite's helper modules (tests/utils)."""
    path = here if module is None else root / (module.replace(".", "/") + ".py")
    if not path.exists():
        return ""
    source, tree = _module(str(path))[:2]
    node = next((n for n in tree.body if getattr(n, "name", None) == attr), None)
    return (ast.get_source_segment(source, node) or "") if node is not None else ""


def _conftests(test_file: Path, root: Path):
    folder = test_file.parent
    chain = []
    while True:
        candidate = folder / "conftest.py"
        if candidate.exists():
            chain.append(candidate)
        if folder == root or folder.parent == folder:
            break
        folder = folder.parent
    return chain


def _find(tree, cls: str | None, name: str):
    """(class node or None, function node) of a test."""
    body = tree.body
    owner = None
    if cls:
        owner = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if owner is None:
            return None, None
        body = owner.body
    fn = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)
    return owner, fn


def _class_setup(source, owner) -> list[str]:
    texts = []
    for node in owner.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name.startswith(("setup", "setUp", "teardown", "tearDown")) or _is_fixture(node)):
            texts.append(ast.get_source_segment(source, node) or "")
    texts.extend(ast.unparse(d) for d in owner.decorator_list)
    return texts


def private_reason(text: str) -> str | None:
    """The first marker of AWS's internals in `text` (a test's code, or the error
    of a module that failed to import), None when there is none."""
    return next((why for pattern, why in _MARKERS if pattern.search(text)), None)


def classify(root: Path, relpath: str, cls: str | None, name: str) -> str | None:
    """None for a public test, else why it is private (or out of scope)."""
    parts = Path(relpath).parts
    if len(parts) > 1 and parts[1] in EXCLUDED_FOLDERS:
        return EXCLUDED_FOLDERS[parts[1]]
    path = root / relpath
    source, tree, fixtures, autouse, private_names, helpers = _module(str(path))
    owner, fn = _find(tree, cls, name.split("[")[0])
    if fn is None:
        return None  # generated or inherited tests: judged public, nothing names internals
    texts = [ast.get_source_segment(source, fn) or ""] + [ast.unparse(d) for d in fn.decorator_list] + autouse
    if owner is not None:
        texts += _class_setup(source, owner)
    params = {a.arg for a in fn.args.args}
    fixture_sources = [fixtures] + [_module(str(c))[2] for c in _conftests(path, root / "tests")]
    for c in _conftests(path, root / "tests"):
        texts += _module(str(c))[3]
    seen = set()
    pending = list(params)
    while pending:  # fixtures and the fixtures they take
        param = pending.pop()
        if param in seen:
            continue
        seen.add(param)
        for table in fixture_sources:
            if param in table:
                texts.append(table[param])
                node = ast.parse(table[param]).body[0]
                pending.extend(a.arg for a in node.args.args)
                break
    text = "\n".join(texts)
    methods = {}  # the class's own helper methods
    if owner is not None:
        methods = {n.name: ast.get_source_segment(source, n) or "" for n in owner.body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("test")}
    pulled = set()
    for _ in range(3):  # helpers, and the helpers they call
        new = [name for name in {*helpers, *methods}
               if name not in pulled and re.search(rf"\b{re.escape(name)}\b", text)]
        if not new:
            break
        pulled.update(new)
        text += "\n" + "\n".join(methods[name] if name in methods else _helper_source(root, path, *helpers[name])
                                  for name in new)
    why = private_reason(text)
    if why:
        return why
    for used in private_names:
        if re.search(rf"\b{re.escape(used)}\b", text):
            return f"uses {used}, imported from an AWS-only module"
    return None
