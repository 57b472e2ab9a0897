"""Printing a neuron tensor formats a host copy of it.

PyTorch's formatter measures the values to print in float64; on the device
that would trip the fp64-in-fp32 rule (and its warning) for a plain
print(tensor). Real accelerators pay a device-to-host copy to print anyway,
so the formatter is handed that copy, as PyTorch already does for XLA.
"""

from __future__ import annotations

import torch._tensor_str as tensor_str

from torch_neuronx import patching


def install() -> None:
    def build(formatter_init):
        def __init__(self, tensor):
            if tensor.device.type == "neuron":
                tensor = tensor.cpu()
            formatter_init(self, tensor)

        return __init__

    patching.patch_once(
        tensor_str._Formatter, "__init__", build,
        why="printing a neuron tensor formats a host copy (the formatter measures values in float64)")
