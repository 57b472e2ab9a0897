"""TorchAO's FP8 and MX formats on the neuron device (docs/fp8.md, "TorchAO").

examples/fp8_torchao.py runs once, as a user runs it, on an emulated
Trainium3 (the profile is read at import, hence a child process); the tests
compare its losses with the bf16 run of the same tiny Llama. A trn2 child
checks that the same float8 training stops with the Trainium3 error.

Tolerances (absolute, on a cross-entropy loss of about 4.9 over 128 tokens):
FP8 training and MXFP8 runs stay within 0.03 of the bf16 run at every step
(measured: at most 0.002), eager and compiled float8 within 0.03 of each other.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torch_neuronx import config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fp8_torchao.py"
LOSS_TOLERANCE = 0.03


def _run(code_or_path: list[str], instance: str) -> subprocess.CompletedProcess:
    env = config.child_environment(TORCH_NEURONX_INSTANCE=instance)
    return subprocess.run([sys.executable, *code_or_path], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def trn3_run() -> dict:
    done = _run([str(EXAMPLE), "--json"], "trn3.3xlarge")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _close(losses, reference, tolerance=LOSS_TOLERANCE):
    assert len(losses) == len(reference)
    for step, (got, want) in enumerate(zip(losses, reference)):
        assert abs(got - want) <= tolerance, f"step {step}: {got} vs {want} (tolerance {tolerance})"


def test_runs_on_trn3_without_cpu_fallback(trn3_run):
    assert trn3_run["instance"] == "trn3.3xlarge"
    assert trn3_run["fallback_ops"] == {}
    # The FP8 matmuls ran natively on the device (the eager runs go through the op tracker).
    assert trn3_run["executed_ops"].get("aten::_scaled_mm", 0) > 0


def test_float8_training_follows_bf16(trn3_run):
    losses = trn3_run["losses"]
    assert losses["bf16"][-1] < losses["bf16"][0]  # the runs train
    _close(losses["float8"], losses["bf16"])
    assert losses["float8"] != losses["bf16"]  # quantization happened


def test_float8_training_compiled_matches_eager(trn3_run):
    losses = trn3_run["losses"]
    _close(losses["float8_compiled"], losses["float8"])
    _close(losses["float8_compiled"], losses["bf16"])


def test_mxfp8(trn3_run):
    losses = trn3_run["losses"]
    _close(losses["mxfp8_training_emulated"], losses["bf16"])
    _close(losses["mxfp8_inference"], losses["bf16_eval"])
    _close(losses["mxfp8_inference_compiled"], losses["mxfp8_inference"])
    assert losses["mxfp8_inference"] != losses["bf16_eval"]


TRN2_SCRIPT = """
import torch, torchao.float8 as f8
model = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(torch.bfloat16).to("neuron")
f8.convert_to_float8_training(model)
try:
    model(torch.randn(16, 32, dtype=torch.bfloat16, device="neuron"))
except Exception as error:
    print(type(error).__name__, error)
else:
    print("no error")
"""


def test_float8_training_on_trn2_names_trainium3():
    done = _run(["-c", TRN2_SCRIPT], "trn2.3xlarge")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Trainium3" in done.stdout and "TORCH_NEURONX_INSTANCE=trn3" in done.stdout, done.stdout
