"""Sparse layouts (COO, CSR, CSC, BSR, BSC) are not supported on the device.

PyTorch runs sparse ops through their own dispatch keys (SparsePrivateUse1,
SparseCsrPrivateUse1), which have no kernels and which the CPU fallback cannot
serve: a sparse neuron tensor either failed with a dump of the dispatcher's keys
or, for the compressed layouts, was built and then broke at every use. Every
way to make one (``to_sparse*``, the ``sparse_*_tensor`` constructors with
``device="neuron"``, ``.to("neuron")`` of a sparse CPU tensor, sparse factory
calls) therefore raises one error that says what to do instead.
"""

from __future__ import annotations

import torch

_REMEDY = (
    "Keep sparse tensors on the CPU (sparse @ dense runs there: torch.sparse.mm(a, b.cpu())), "
    "or call .to_dense() and move the dense tensor to neuron."
)


def unsupported(op: str) -> NotImplementedError:
    return NotImplementedError(
        f"Sparse tensors are not supported on the neuron device ({op} was called to make or use "
        f"one). {_REMEDY}")


def _rejecting(op: str):
    def kernel(*args, **kwargs):
        raise unsupported(f"aten::{op}")

    return kernel


def _fallback(op, *args, **kwargs):
    raise unsupported(op._schema.name)


# Dense neuron -> sparse: rejected before the CPU fallback converts (and warns) for nothing.
KERNELS = {
    name: _rejecting(name)
    for name in ("_to_sparse", "_to_sparse.sparse_dim", "_to_sparse_csr", "_to_sparse_csc",
                 "_to_sparse_bsr", "_to_sparse_bsc")
}
# _sparse_compressed_tensor_unsafe builds CSR/CSC/BSR/BSC tensors without passing through
# a sparse dispatch key (it is composite), so it is rejected for neuron components too: at
# the autograd key (a device kernel for a composite would hide it from autograd, as
# TorchNeuron's own test of its registrations checks) and at the CSR key.
CSR_KERNELS = {"_sparse_compressed_tensor_unsafe": _rejecting("_sparse_compressed_tensor_unsafe")}

# Every other op on a sparse neuron layout (COO construction included).
FALLBACK_KEYS = ("SparsePrivateUse1", "SparseCsrPrivateUse1")


def register_fallbacks(libraries: list) -> None:
    library = torch.library.Library("_", "IMPL")
    for key in FALLBACK_KEYS:
        library.fallback(_fallback, key)
    libraries.append(library)
