"""`nki.typing` / `neuronxcc.nki.typing` (`nt`): the names kernels annotate parameters with.

    def kernel(a, out: nt.mutable_tensor): ...

As annotations they are accepted and not enforced: AWS's older compiler refuses a store into a
parameter not annotated `nt.mutable_tensor`, while the simulator lets a kernel write any HBM
argument (and copies it back to the caller's array). Subscripted, `nt.tensor[shape, dtype]` is a
placeholder argument, as AWS's samples pass to `nki.benchmark` where only shapes matter: the launch
allocates a zero-filled HBM tensor of that shape and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import dtypes as _dt


@dataclass(frozen=True)
class TensorSpec:
    """`nt.tensor[shape, dtype]`: a kernel argument given by shape and dtype only."""

    shape: tuple
    dtype: object
    mutable: bool = False


class _TensorAnnotation:
    def __init__(self, name: str, mutable: bool):
        self._name = name
        self._mutable = mutable

    def __getitem__(self, spec) -> TensorSpec:
        shape, dtype = spec
        return TensorSpec(tuple(int(n) for n in shape), _dt.normalize(dtype, f"nt.{self._name}"), self._mutable)

    def __repr__(self):
        return f"nt.{self._name}"


tensor = _TensorAnnotation("tensor", mutable=False)
mutable_tensor = _TensorAnnotation("mutable_tensor", mutable=True)


class scalar:  # noqa: N801 - the NKI name
    """`nt.scalar`: the annotation of a parameter that takes a number (accepted, not enforced)."""


__all__ = ["tensor", "mutable_tensor", "scalar", "TensorSpec"]
