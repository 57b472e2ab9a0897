"""`nki.isa.constants`: the enum-valued options of the instructions, importable as current
kernels do (`from nki.isa.constants import oob_mode, dge_mode`).

The simulator accepts them where AWS's instructions take them and does not act on them: a DMA's
descriptor generation (`dge_mode`) and engine (`dma_engine`) change how the hardware issues it, not
what it copies, and `matmul_perf_mode` how fast the Tensor Engine runs a matmul, not its result.
`oob_mode.skip` makes nisa.dma_copy leave out the elements whose address is out of bounds (an
error otherwise). `reduce_cmd` is acted on: it drives the engines' accumulation registers
(`nisa.activation`, `nisa.tensor_scalar_reduce`).
"""

from __future__ import annotations

import enum


class dge_mode(enum.Enum):  # noqa: N801 - the NKI name
    """Who generates a DMA's descriptors."""

    unknown = 0  # the compiler decides
    swdge = 1    # software DGE (GpSimd)
    hwdge = 2    # hardware DGE
    none = 3     # no DGE: descriptors built ahead of time


class oob_mode(enum.Enum):  # noqa: N801
    """What an indirect DMA does with an out-of-bounds index."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):  # noqa: N801
    """nc_matmul's Tensor Engine mode: `double_row` packs two FP8 rows per PE for twice the
    throughput (trn2/trn3). With 2-D operands the result is the same matmul and the mode is not costed;
    with [K, 2, M] x [K, 2, N] operands (the older double_row_matmul layout) both rows are contracted."""

    none = 0
    double_row = 1


class dma_engine(enum.Enum):  # noqa: N801
    """Which DMA engine moves a transfer: the shared queues (`dma`, default) or GpSimd's own
    (`gpsimd_dma`, low-latency SBUF-to-SBUF swaps between the cores of an LNC=2 pair)."""

    dma = 0
    gpsimd_dma = 1


class reduce_cmd(enum.Enum):  # noqa: N801
    """What an instruction does with its engine's accumulation registers (one float32 register per
    partition lane; Scalar Engine: `activation`, Vector Engine: `tensor_scalar_reduce`)."""

    idle = 0          # leave the registers alone
    reset = 1         # reset them (to the reduction's identity: 0 for add) and accumulate nothing
    reduce = 2        # accumulate this instruction's reduction onto their current values
    reset_reduce = 3  # reset, then accumulate this instruction's reduction
    load_reduce = 4   # load reduce_init into them, then accumulate this instruction's reduction


__all__ = ["dge_mode", "oob_mode", "matmul_perf_mode", "dma_engine", "reduce_cmd"]
