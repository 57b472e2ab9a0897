"""Per-generation figures used by the simulator (capacity) and the cost model (clocks, DMA).

Figures and their sources: docs/hardware-figures.md#neuroncore-and-nki-figures. The target of a plain simulated run comes from
NEURON_PLATFORM_TARGET_OVERRIDE (trn1, trn2 or trn3, default trn2), read at each launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch_neuronx import config

from .errors import NKIError

KIB = 1024
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass(frozen=True)
class Target:
    name: str
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    psum_bank_bytes: int
    clock_ghz: dict = field(default_factory=dict)  # compute engine -> GHz
    dma_queues: int = 16
    dma_queue_bytes_per_ns: float = 23.0
    dma_setup_us: float = 1.3
    fp8_matmul_speedup: float = 1.0  # TensorE rate of fp8 relative to bf16
    neuron_core: int = 3  # NeuronCore generation: trn1 NeuronCore-v2, trn2 NeuronCore-v3, trn3 NeuronCore-v4 (MX types)

    @property
    def psum_banks(self) -> int:
        return self.psum_bytes_per_partition // self.psum_bank_bytes

    def tensor_peak_flops(self, dtype_name: str = "bfloat16") -> float:
        """Peak TensorE FLOP/s of one core: a 128x128 array doing one multiply-add per PE per cycle."""
        rate = 2 * 128 * 128 * self.clock_ghz["tensor"] * 1e9
        if dtype_name in ("float32", "tfloat32"):
            return rate / 4
        if dtype_name.startswith("float8"):
            return rate * self.fp8_matmul_speedup
        if dtype_name == "mx":
            # nisa.nc_matmul_mx: each PE multiplies four MXFP8/MXFP4 pairs per cycle (the contraction
            # is 4 x 128), "4x the throughput compared to a BF16/FP16 matmul" (AWS's Trainium3 guide).
            return rate * 4
        return rate


TARGETS = {
    # NeuronCore-v2 (docs/hardware-figures.md#neuroncore-and-nki-figures): AWS's Trainium/Inferentia2
    # guide gives the engine clocks, the 92 BF16/FP16/TF32/cFP8 TensorE TFLOPS (cFP8 at the BF16 rate)
    # and the 192 KiB SBUF partitions; AWS's DMA guide 17 bytes/ns per DMA engine.
    "trn1": Target("trn1", 192 * KIB, 16 * KIB, 2 * KIB,
                   {"tensor": 2.8, "vector": 1.12, "scalar": 1.4, "gpsimd": 1.4},
                   dma_queue_bytes_per_ns=17.0, fp8_matmul_speedup=1.0, neuron_core=2),
    "trn2": Target("trn2", 224 * KIB, 16 * KIB, 2 * KIB,
                   {"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2},
                   # docs/hardware-figures.md#chip-figures, trn2 chip: FP8 1299 TFLOPS / dense BF16 667 TFLOPS
                   dma_queue_bytes_per_ns=23.0, fp8_matmul_speedup=1299 / 667),
    "trn3": Target("trn3", 256 * KIB, 16 * KIB, 2 * KIB,
                   {"tensor": 2.4, "vector": 1.2, "scalar": 1.2, "gpsimd": 1.2},
                   # docs/hardware-figures.md#chip-figures, trn3 chip: FP8 (MXFP8/MXFP4) 2517 TFLOPS / dense BF16 671 TFLOPS
                   dma_queue_bytes_per_ns=33.0, fp8_matmul_speedup=2517 / 671, neuron_core=4),
}

ENV_VAR = config.platform_target.name  # NEURON_PLATFORM_TARGET_OVERRIDE


def get_target(name: str | None = None) -> Target:
    """The named target, or the one NEURON_PLATFORM_TARGET_OVERRIDE selects (default trn2)."""
    source = "target"
    if name is None:
        name = config.platform_target()
        source = ENV_VAR
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    if key not in TARGETS:
        raise NKIError("nki", f"unknown {source} {name!r}", f"use one of {sorted(TARGETS)}")
    return TARGETS[key]
