"""`nl.nc(n)` and `nl.spmd_dim(...)`: launch-grid annotations that spread programs over cores.

`kernel[nl.spmd_dim(4, nl.nc(2)), 2]` is a grid dimension of 4 x 2 = 8 programs, which AWS
distributes over two physical NeuronCores; `kernel[nl.nc(2), 2]` is a dimension of 2, one per core.
The simulator runs every program of a grid as a NeuronCore of its own (nki/cores.py), so an
annotated dimension is just its size: the product of its factors.
"""

from __future__ import annotations

import math
import operator


class nc(int):
    """`nl.nc(n)`: a grid dimension of `n` programs, one per physical NeuronCore."""

    def __new__(cls, n):
        n = operator.index(n)
        if n < 1:
            raise ValueError(f"nl.nc({n}): the number of NeuronCores must be >= 1")
        return super().__new__(cls, n)

    def __repr__(self):
        return f"nl.nc({int(self)})"


class spmd_dim(int):
    """`nl.spmd_dim(*factors)`: one grid dimension of prod(factors) programs (factors ints or nl.nc)."""

    def __new__(cls, *factors):
        if not factors:
            raise ValueError("nl.spmd_dim() needs at least one factor")
        size = math.prod(operator.index(f) for f in factors)
        self = super().__new__(cls, size)
        self.factors = factors
        return self

    def __repr__(self):
        return f"nl.spmd_dim({', '.join(map(repr, self.factors))})"
