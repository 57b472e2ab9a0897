"""Builds torch_neuronx._C, the C++ core of the neuron device.

Build without isolation so the extension compiles against the torch that is
installed (an isolated build would fetch its own, multi-GB torch):
    pip install --no-build-isolation -e .
"""
import glob
import os
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py

# Building must not import the (possibly stale or half-built) backend itself.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

TORCH_VERSION_FILE = "_C.torch_version"  # torch_neuronx/_torch_version.py reads it
TORCH_RELEASE = ".".join(torch.__version__.split("+")[0].split(".")[:2])

# Compile the core's sources in parallel (one job per file).
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 2))

ROOT = os.path.dirname(os.path.abspath(__file__))


class PersistentBuildExt(BuildExtension.with_options(use_ninja=True)):
    """Compiles into build/temp.<platform>-<python> of the source tree, the
    directory `setup.py build_ext --inplace` uses, whatever temporary directory
    the caller chose: pip's editable install picks a fresh one on every run,
    which made ninja recompile every source each time. Kept here, ninja
    recompiles only the sources (or headers) that changed."""

    def finalize_options(self):
        super().finalize_options()
        # One directory per PyTorch release: switching between the supported releases
        # (TORCH_VERSION=... scripts/setup.sh) relinks instead of recompiling everything.
        tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}-torch{TORCH_RELEASE}"
        self.build_temp = os.path.join(ROOT, "build", f"temp.{tag}")

    def build_extensions(self):
        super().build_extensions()
        # Which PyTorch the core links against, next to the library: import checks it
        # before loading the core (torch_neuronx/_torch_version.py), so a PyTorch upgraded
        # after the build gives a message instead of an undefined symbol.
        with open(self._torch_version_file(), "w") as f:
            f.write(torch.__version__ + "\n")

    def _torch_version_file(self, source_tree: bool = False) -> str:
        folder = ROOT if source_tree else self.build_lib
        return os.path.join(folder, "torch_neuronx", TORCH_VERSION_FILE)

    def copy_extensions_to_source(self):  # --inplace and editable installs: beside the library
        super().copy_extensions_to_source()
        self.copy_file(self._torch_version_file(), self._torch_version_file(source_tree=True))

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        if self.inplace:
            mapping[self._torch_version_file()] = self._torch_version_file(source_tree=True)
        return mapping

    def get_outputs(self):
        return [*super().get_outputs(), self._torch_version_file()]


# The startup hook that lets kernels `import nki` / `import neuronxcc.nki` (torch_neuronx/_nki_aliases.py).
NKI_ALIASES_PTH = "torch_neuronx-nki-aliases.pth"


class BuildPyWithNkiAliases(build_py):
    """Also copies the hook to the root of the build, so that a wheel installs it in site-packages,
    where `site` runs it at interpreter start. An editable install (pip install -e) does not carry
    it: setuptools builds that wheel from its own finder only. There, run once
    `python -m torch_neuronx._nki_aliases` (docs/nki.md, "Import styles")."""

    def run(self):
        super().run()
        if not self.editable_mode:
            self.copy_file(os.path.join(ROOT, NKI_ALIASES_PTH), os.path.join(self.build_lib, NKI_ALIASES_PTH))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, os.path.join(self.build_lib, NKI_ALIASES_PTH)]


setup(
    ext_modules=[
        CppExtension(
            name="torch_neuronx._C",
            sources=sorted(glob.glob("csrc/*.cpp")),
            # Kineto's headers (csrc/Profiler.cpp) include each other by bare name.
            include_dirs=[os.path.join(p, "kineto") for p in include_paths() if p.endswith("include")],
            extra_compile_args=["-O2", "-std=c++20", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": PersistentBuildExt, "build_py": BuildPyWithNkiAliases},
)
