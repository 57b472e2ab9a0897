"""`nki.isa.constants`: the enum-valued options of the instructions, importable as current
kernels do (`from nki.isa.constants import oob_mode, dge_mode`).

The simulator accepts them where AWS's instructions take them and does not act on them: a DMA's
descriptor generation (`dge_mode`) changes how the hardware issues it, not what it copies, and
out-of-bounds indices (`oob_mode`) are reported as errors whatever the mode.
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


__all__ = ["dge_mode", "oob_mode"]
