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

from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

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
        tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
        self.build_temp = os.path.join(ROOT, "build", f"temp.{tag}")


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
