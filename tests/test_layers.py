"""Layers keep their direction (docs/architecture.md): eager dispatch knows no
compiler. ops/, neuron/, lowering/ and nki/ never import torch_neuronx.compiler;
what reads both the eager and the compile tables (op_support.py) sits above
both. A source scan, as tests/test_config.py's for the environment."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "torch_neuronx"
BELOW_THE_COMPILER = ("ops", "neuron", "lowering", "nki")
COMPILER = "torch_neuronx.compiler"


def _imported_modules(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every import in a module of the package at `root`,
    relative ones resolved, and of every string naming a torch_neuronx module
    (importlib.import_module, ...)."""
    package = ".".join(("torch_neuronx", *path.relative_to(root).parent.parts))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # `from torch_neuronx import compiler` imports the submodule.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("torch_neuronx."):
            found.append((node.lineno, node.value))
    return found


def _imports_compiler(module: str) -> bool:
    return module == COMPILER or module.startswith(COMPILER + ".")


@pytest.mark.parametrize("layer", BELOW_THE_COMPILER)
def test_layer_never_imports_the_compiler(layer):
    paths = sorted((PACKAGE / layer).rglob("*.py"))
    assert paths, layer
    offenders = [f"torch_neuronx/{path.relative_to(PACKAGE).as_posix()}:{line} ({module})"
                 for path in paths for line, module in _imported_modules(path) if _imports_compiler(module)]
    assert not offenders, "the compiler sits above this layer:\n" + "\n".join(offenders)


def test_the_scan_sees_every_import_form(tmp_path):
    """Absolute, relative, `from package import module` and importlib forms."""
    layer = tmp_path / "torch_neuronx" / "ops"
    layer.mkdir(parents=True)
    probe = layer / "probe.py"
    probe.write_text("import torch_neuronx.compiler.aot\n"
                     "from torch_neuronx import compiler\n"
                     "from ..compiler.aot import decomposition_table\n"
                     "from torch_neuronx.compiler import cache\n"
                     "import importlib\nimportlib.import_module('torch_neuronx.compiler.backend')\n"
                     "from torch_neuronx import config\n"
                     "from . import registry\n")
    found = _imported_modules(probe, tmp_path / "torch_neuronx")
    assert sorted(line for line, module in found if _imports_compiler(module)) == [1, 2, 3, 4, 6]
    assert (8, "torch_neuronx.ops.registry") in found
