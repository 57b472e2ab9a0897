"""The supported PyTorch releases and the refusal outside them (torch_neuronx/_torch_version.py).

A PyTorch outside the range cannot be installed here, so the subprocess tests
make the installed one report another version: they load torch/version.py
themselves, with ``__version__`` replaced, before ``import torch`` reads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_neuronx import _torch_version

SUPPORTED_TEXT = "2.13 and 2.14"


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.14.1+cu130", "2.14.3"])
def test_supported_releases_pass(version):
    assert _torch_version.problem(version, built=version) is None
    assert _torch_version.problem(version, built=None) is None


@pytest.mark.parametrize("version", ["2.12.1+cpu", "2.15.0", "3.0.0", "2.1.3"])
def test_unsupported_release_names_both_versions(version):
    message = _torch_version.problem(version, built=None)
    assert f"the installed PyTorch is {version}" in message
    assert f"supports PyTorch {SUPPORTED_TEXT}" in message
    assert "pip install torch==2.13.0" in message


def test_core_built_for_another_release_says_rebuild():
    message = _torch_version.problem("2.14.1+cu130", built="2.13.0+cpu")
    assert "built against PyTorch 2.13.0+cpu" in message
    assert "installed PyTorch is 2.14.1+cu130" in message
    assert "pip install --no-build-isolation -e ." in message
    # A patch release of the same minor one keeps the ABI: no rebuild asked for.
    assert _torch_version.problem("2.14.3", built="2.14.1+cu130") is None


def test_the_build_records_the_torch_it_links_against():
    """setup.py's build_ext writes _C.torch_version; the tree under test was built by it."""
    assert _torch_version.built_for() == torch.__version__
    assert _torch_version.release(torch.__version__) in _torch_version.SUPPORTED


def _run_as_torch(version: str, body: str, autoload: bool) -> subprocess.CompletedProcess:
    prelude = f"""
        import importlib.util, sys
        spec = importlib.util.find_spec("torch")
        path = spec.submodule_search_locations[0] + "/version.py"
        fake = importlib.util.module_from_spec(importlib.util.spec_from_file_location("torch.version", path))
        fake.__spec__.loader.exec_module(fake)
        fake.__version__ = {version!r}
        sys.modules["torch.version"] = fake
    """
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    if not autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    code = textwrap.dedent(prelude) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_import_outside_the_range_is_one_clear_error():
    result = _run_as_torch("2.12.0", """
        import torch
        try:
            import torch_neuronx
        except ImportError as error:
            print("IMPORT-ERROR:", error)
        print("loaded-core:", "torch_neuronx._C" in sys.modules)
    """, autoload=False)
    assert result.returncode == 0, result.stderr
    assert "IMPORT-ERROR: torch-neuronx supports PyTorch 2.13 and 2.14; the installed PyTorch is 2.12.0" \
        in result.stdout
    assert "loaded-core: False" in result.stdout  # the C++ core was never loaded
    assert "undefined symbol" not in result.stdout + result.stderr


def test_autoload_outside_the_range_warns_and_torch_still_imports():
    result = _run_as_torch("2.15.0", """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        for w in caught:
            if "torch-neuronx" in str(w.message):
                print("WARNED:", w.category.__name__, w.message)
        print("backend:", torch._C._get_privateuse1_backend_name())
        print("tensor-ok:", float(torch.ones(2).sum()))
        try:
            import torch_neuronx  # a later explicit import is refused the same way
        except ImportError as error:
            print("IMPORT-ERROR:", error)
    """, autoload=True)
    assert result.returncode == 0, result.stderr
    assert "WARNED: RuntimeWarning torch-neuronx supports PyTorch 2.13 and 2.14; the installed PyTorch " \
        "is 2.15.0" in result.stdout
    assert "The 'neuron' device is not registered" in result.stdout
    assert "backend: privateuseone" in result.stdout
    assert "tensor-ok: 2.0" in result.stdout
    assert "IMPORT-ERROR: torch-neuronx supports PyTorch" in result.stdout
