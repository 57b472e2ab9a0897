"""torch_neuronx.utils: the helpers scripts written for TorchNeuron call."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from torch_neuronx import ops as neuron_ops, utils
from torch_neuronx.neuron import profiles
from torch_neuronx.nki import language as nl


def test_registered_ops_are_the_devices_kernels():
    ops = utils.get_neuron_registered_ops()
    assert {"add", "mm", "copy_", "index"} <= ops
    # TorchNeuron runs linalg_qr on the CPU through a fallback registered by name
    # (python_ops/cpu_fallback_registrations.py in AWS's snapshot); so does this package
    # (ops.host_fallback_overloads), hence it is registered
    assert "linalg_qr" in ops and "linalg_qr" in set(neuron_ops.host_fallback_overloads())
    variants = utils.get_neuron_registered_ops(as_sorted=True, keep_variant=True)
    assert variants == sorted(variants) and "add.Tensor" in variants
    assert {name.split(".")[0] for name in variants} == ops


def test_sync_mode_follows_neuron_launch_blocking():
    code = "import torch_neuronx.utils as u; print(u.is_sync_mode_enabled())"
    for value, expected in (("1", "True"), ("0", "False")):
        env = {**os.environ, "NEURON_LAUNCH_BLOCKING": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.stdout.strip() == expected, out.stderr


def test_mlir_aten_ops_is_torchneurons_default_path():
    """TorchNeuron's import sets TORCH_NEURONX_MLIR_ATEN_OPS=1 when unset (AWS's own code reads
    the variable); the emulator models that path only: `0` warns, anything else fails the import."""
    code = "import os, torch_neuronx.utils as u; print(os.environ['TORCH_NEURONX_MLIR_ATEN_OPS'], u.use_mlir_aten_ops())"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_NEURONX_MLIR_ATEN_OPS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["1", "True"], out.stderr
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], env={**env, "TORCH_NEURONX_MLIR_ATEN_OPS": "0"},
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["0", "True"] and "is not emulated" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-c", code], env={**env, "TORCH_NEURONX_MLIR_ATEN_OPS": "yes"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "TORCH_NEURONX_MLIR_ATEN_OPS='yes'" in out.stderr
    assert utils.use_mlir_aten_ops() is True


def test_logical_cores_are_the_profiles():
    assert utils.get_logical_neuron_cores() == str(profiles.active_profile().lnc)


@pytest.mark.parametrize("dtype, expected", [
    (nl.bfloat16, torch.bfloat16), (nl.float32, torch.float32), (np.float16, torch.float16),
    ("int8", torch.int8), (nl.tfloat32, torch.float32), (torch.int64, torch.int64),
])
def test_external_dtypes_map_to_torch(dtype, expected):
    assert utils.map_external_dtype_to_torch(dtype) == expected


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="no torch dtype for"):
        utils.map_external_dtype_to_torch(object())


def test_device_of_nested_tensors():
    a = torch.ones(2, device="neuron")
    assert utils.flatten_tensors([1, (a, [torch.ones(1)])])[0] is a
    assert len(utils.flatten_tensors([1, (a, [torch.ones(1)])])) == 2
    assert utils.get_device_from_tensors([[], (a,)]) == a.device
    assert utils.get_device_from_tensors([]) == torch.device("neuron", torch.neuron.current_device())
