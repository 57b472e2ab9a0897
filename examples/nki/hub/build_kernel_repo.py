"""Packages examples/nki/rmsnorm.py as a Hugging Face `kernels` repository for Neuron.

    python examples/nki/hub/build_kernel_repo.py OUT_DIR

writes the noarch layout the `kernels` library loads on a `neuron` device:

    OUT_DIR/build/torch-neuron/metadata.json     backend.type = "neuron"
    OUT_DIR/build/torch-neuron/__init__.py       the op: torch.ops.nki_rmsnorm.rmsnorm (nki_op)
    OUT_DIR/build/torch-neuron/rmsnorm.py        the NKI kernel (copied from examples/nki/)
    OUT_DIR/build/torch-neuron/layers.py         `RMSNorm`, the layer `kernelize` swaps in

Push OUT_DIR to the Hub (`huggingface-cli upload org/name OUT_DIR`) to share it,
or load it offline with `kernels.get_local_kernel(OUT_DIR)` or
`LOCAL_KERNELS="org/name=OUT_DIR"`. The kernel source is copied at build time,
like a kernel builder packaging its sources, so the repository is self-contained.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "nki-rmsnorm"

METADATA = {
    "id": "_nki_rmsnorm_neuron",  # the module name the kernel is imported under
    "name": NAME,
    "version": 1,
    "license": "Apache-2.0",
    "backend": {"type": "neuron"},
    "python-depends": [],
}

INIT = '''"""nki-rmsnorm: RMSNorm as an NKI kernel, exposed as torch.ops.nki_rmsnorm.rmsnorm."""

import torch
from torch_neuronx import nki_op

from . import layers
from .rmsnorm import rmsnorm_kernel


@nki_op("nki_rmsnorm::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension of a 2-D [tokens, hidden] tensor."""
    return rmsnorm_kernel(x, weight, eps)


__all__ = ["layers", "rmsnorm"]
'''

LAYERS = '''"""Layers for `kernels.kernelize`: forward only, using the replaced module's attributes."""

import torch


class RMSNorm(torch.nn.Module):
    """Replaces transformers' LlamaRMSNorm (and the RMSNorms that share its attributes)."""

    weight: torch.Tensor
    variance_epsilon: float

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        from . import rmsnorm

        shape = hidden_states.shape
        out = rmsnorm(hidden_states.reshape(-1, shape[-1]).contiguous(), self.weight, self.variance_epsilon)
        return out.reshape(shape)
'''


def build(out_dir: Path) -> Path:
    """Writes the repository; returns the variant directory."""
    variant = Path(out_dir) / "build" / "torch-neuron"
    variant.mkdir(parents=True, exist_ok=True)
    (variant / "metadata.json").write_text(json.dumps(METADATA, indent=2) + "\n")
    (variant / "__init__.py").write_text(INIT)
    (variant / "layers.py").write_text(LAYERS)
    shutil.copyfile(HERE.parent / "rmsnorm.py", variant / "rmsnorm.py")
    return variant


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(Path(sys.argv[1])))
