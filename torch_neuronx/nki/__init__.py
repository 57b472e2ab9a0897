"""torch_neuronx.nki: the NKI language, a vectorized simulator and a cost model for trn2/trn3.

    from torch_neuronx import nki
    import torch_neuronx.nki.language as nl
    import torch_neuronx.nki.isa as nisa

or, as AWS's kernels are written, `import nki` / `import neuronxcc.nki as nki` (aliases of this
package where AWS's packages are not installed; torch_neuronx/_nki_aliases.py).

Pure Python + NumPy (+ ml_dtypes); torch is imported only when a torch tensor is passed in.
See docs/nki.md.
"""

from torch_neuronx import _nki_aliases

from . import collectives, compiler, isa, language, typing
from .dtypes import dtype
from .cost import BenchmarkResult, dma_efficiency, roofline_us
from .errors import NKIError
from .kernel import (Kernel, Launcher, baremetal, benchmark, cpu_simulate, jit, multi_rank_simulate, profile,
                     simulate, simulate_kernel)
from .runtime import Instr
from .targets import TARGETS, Target, get_target
from .tensor import NkiTensor

# `nki.tensor` is the tile type, as in AWS's older reference (`isinstance(t, nki.tensor)`, `nki.tensor.shape`):
# the attribute is the class; the simulator's module stays importable as torch_neuronx.nki.tensor
# (sys.modules), which is what `from .tensor import ...` and `import nki.tensor` find.
tensor = NkiTensor

# Every public submodule is imported above, so that `import nki` mirrors them all (_nki_aliases).
_nki_aliases.install()

__all__ = [
    "collectives", "compiler", "isa", "language", "typing", "dtype", "jit", "Kernel", "Launcher", "simulate", "simulate_kernel", "cpu_simulate", "multi_rank_simulate", "baremetal",
    "benchmark", "profile",
    "BenchmarkResult", "roofline_us", "dma_efficiency", "NKIError", "NkiTensor", "Instr",
    "TARGETS", "Target", "get_target", "tensor",
]
