"""`import nki` and `import neuronxcc.nki` (with their `language`, `isa`, ... submodules) resolve
to torch_neuronx.nki when AWS's packages are not installed. See docs/nki.md, "Import styles".

One mechanism: a meta path finder appended to the *end* of sys.meta_path. Every other finder
(the path finder, editable-install finders) is asked first, so an installed `nki` or `neuronxcc`
always wins; this one answers only for the names nothing else provides.

This module imports only the standard library and nothing of torch_neuronx at import time:
the `torch_neuronx-nki-aliases.pth` hook loads it by file location at interpreter start
(importing the torch_neuronx package would import torch), and the simulator is imported only
when a kernel imports `nki`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

TARGET = "torch_neuronx.nki"
# What the finder answers for: two aliases of TARGET, and `neuronxcc`, an empty package holding `nki`.
NAMES = ("nki", "neuronxcc", "neuronxcc.nki")
_MARK = "__torch_neuronx_nki_alias__"


def _is_alias(module) -> bool:
    return getattr(module, _MARK, False)


class AliasFinder:
    """Finds `nki`, `neuronxcc` and `neuronxcc.nki`; their submodules are put in sys.modules
    when the package is loaded (see _mirror), so they are never looked for.

    Finder and loader by protocol, not by subclassing importlib.abc: importing importlib.abc
    (it pulls in importlib.resources, pathlib, tempfile) would cost more than the rest of the hook."""

    def find_spec(self, name, path=None, target=None):
        if name not in NAMES:
            return None
        # `neuronxcc.nki` only under our own `neuronxcc`: a real neuronxcc that lacks `nki` keeps
        # its ModuleNotFoundError.
        if name == "neuronxcc.nki" and not _is_alias(sys.modules.get("neuronxcc")):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return None  # a plain module; exec_module swaps it for TARGET

    def exec_module(self, module) -> None:
        if module.__name__ == "neuronxcc":
            module.__doc__ = "torch_neuronx's stand-in for AWS's neuronxcc: only `neuronxcc.nki`."
            module.__path__ = []
            setattr(module, _MARK, True)
            return
        # The import system returns whatever sys.modules holds under the name after exec_module,
        # so the alias *is* the simulator's module: one copy of its state, isinstance checks hold.
        _mirror(importlib.import_module(TARGET), module.__name__)


def _mirror(target: types.ModuleType, alias: str) -> None:
    """sys.modules[alias] = target, and alias.X for every loaded TARGET.X. Done eagerly because
    the aliased package's __path__ is TARGET's directory: a submodule looked up through the path
    finder would be loaded a second time, as another module with its own state."""
    sys.modules[alias] = target
    prefix = TARGET + "."
    for name, module in list(sys.modules.items()):
        if name.startswith(prefix):
            sys.modules.setdefault(alias + "." + name[len(prefix):], module)


def install() -> None:
    """Append the finder to sys.meta_path (once). Cheap: nothing is imported until `import nki`."""
    # By name too: `python -m torch_neuronx._nki_aliases` runs a second copy of this module.
    if not any(isinstance(f, AliasFinder) or type(f).__name__ == "AliasFinder" for f in sys.meta_path):
        sys.meta_path.append(AliasFinder())


# ---------------------------------------------------------------------------- the startup hook
PTH_NAME = "torch_neuronx-nki-aliases.pth"


def pth_source() -> str:
    """The hook's text, shipped at the repository root and copied by setup.py into wheels. A .pth
    line that starts with `import` is executed by `site` at every interpreter start: it finds
    torch_neuronx without importing it, loads this file by location and installs the finder."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, PTH_NAME), encoding="utf-8") as f:
        return f.read()


def write_pth(site_dir: str | None = None) -> str:
    """Write the hook into `site_dir` (default: this interpreter's purelib site-packages) and
    return its path. For editable installs, whose wheel setuptools builds without it:
    `python -m torch_neuronx._nki_aliases`."""
    import os
    import sysconfig

    site_dir = site_dir or sysconfig.get_paths()["purelib"]
    path = os.path.join(site_dir, PTH_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(pth_source())
    return path


if __name__ == "__main__":
    print(f"wrote {write_pth(sys.argv[1] if len(sys.argv) > 1 else None)}")
