"""torch_neuronx.nki: the NKI language, a vectorized simulator and a cost model for trn2/trn3.

    from torch_neuronx import nki
    import torch_neuronx.nki.language as nl
    import torch_neuronx.nki.isa as nisa

Pure Python + NumPy (+ ml_dtypes); torch is imported only when a torch tensor is passed in.
See docs/nki.md.
"""

from . import isa, language
from .cost import BenchmarkResult, dma_efficiency, roofline_us
from .errors import NKIError
from .kernel import Kernel, Launcher, benchmark, jit, simulate, simulate_kernel
from .runtime import Instr
from .targets import TARGETS, Target, get_target
from .tensor import NkiTensor

__all__ = [
    "isa", "language", "jit", "Kernel", "Launcher", "simulate", "simulate_kernel", "benchmark",
    "BenchmarkResult", "roofline_us", "dma_efficiency", "NKIError", "NkiTensor", "Instr",
    "TARGETS", "Target", "get_target",
]
