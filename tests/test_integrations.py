"""The import hook that applies third-party patches (torch_neuronx.integrations)."""

import subprocess
import sys
import textwrap

import pytest


def _run(code: str, tmp_path, env_extra=None) -> str:
    import os
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _fake_library(tmp_path):
    pkg = tmp_path / "fakelib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("def device():\n    return 'cpu'\n")


PATCH = """
    from torch_neuronx.integrations import patches
    @patches("fakelib.mod")
    def neuron_device(module):
        module.device = lambda: "neuron"
"""


def test_patch_applies_when_module_is_imported_later(tmp_path):
    _fake_library(tmp_path)
    out = _run(PATCH + """
    import sys
    assert "fakelib.mod" not in sys.modules
    import fakelib.mod
    from torch_neuronx.integrations import applied_patches
    print(fakelib.mod.device(), applied_patches()[-1])
    """, tmp_path)
    assert out == "neuron fakelib.mod:neuron_device"


def test_patch_applies_at_once_when_module_already_imported(tmp_path):
    _fake_library(tmp_path)
    out = _run("""
    import fakelib.mod
    """ + PATCH + """
    print(fakelib.mod.device())
    """, tmp_path)
    assert out == "neuron"


def test_importing_torch_imports_no_patched_library():
    out = subprocess.run([sys.executable, "-c",
                          "import sys, torch; torch.zeros(1, device='neuron'); "
                          "print(sorted(m for m in ('transformers', 'accelerate', 'peft', 'trl', "
                          "'diffusers', 'kernels') if m in sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


SAFETENSORS_ON_NEURON = """
    import os, tempfile, torch
    from safetensors.torch import load_file, save_file
    path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    save_file({"w": torch.arange(4.0)}, path)
    try:
        loaded = load_file(path, device="neuron")["w"]
        print(loaded.device, loaded.cpu().tolist())
    except Exception as error:
        print("error:", error)
"""


def test_safetensors_load_file_onto_neuron(tmp_path):
    """safetensors' reader rejects device="neuron"; the patch reads on CPU and moves."""
    assert _run(SAFETENSORS_ON_NEURON, tmp_path) == "neuron:0 [0.0, 1.0, 2.0, 3.0]"
    unpatched = _run(SAFETENSORS_ON_NEURON, tmp_path, {"TORCH_NEURONX_DISABLE_INTEGRATIONS": "1"})
    assert unpatched.startswith("error:") and "neuron" in unpatched


def test_patch_applies_when_registered_while_its_module_is_mid_import(tmp_path):
    """The case of a library imported before torch: the patch is registered while its
    module executes (its finder already ran). Applied too early, the later `def`
    would undo it; never applied, device() stays "cpu"."""
    _fake_library(tmp_path)
    (tmp_path / "fakelib" / "mod.py").write_text(textwrap.dedent(PATCH) + "def device():\n    return 'cpu'\n")
    out = _run("""
    import fakelib.mod
    from torch_neuronx.integrations import applied_patches
    print(fakelib.mod.device(), applied_patches()[-1])
    """, tmp_path)
    assert out == "neuron fakelib.mod:neuron_device"


# Imports every library (the first statement is given; torch comes second), then every
# patched module, and reports the registered and applied patches and what they changed:
# the tagged replacement functions (patching.patch_once) and whether fp16 Accelerator works.
EVERY_PATCH = """
    import importlib, json, sys
    exec(sys.argv[1])
    import torch
    for name in ("accelerate", "transformers", "trl", "peft", "diffusers", "safetensors.torch", "kernels"):
        importlib.import_module(name)
    from torch_neuronx.integrations import already_patched, applied_patches, registered_patches
    modules = {name.split(":")[0] for name in registered_patches()}
    tagged = []
    for module in map(importlib.import_module, sorted(modules)):
        for name, value in vars(module).items():
            owners = [(name, value)] + ([(f"{name}.{n}", v) for n, v in vars(value).items()]
                                        if isinstance(value, type) and value.__module__ == module.__name__ else [])
            tagged += [f"{module.__name__}.{n}" for n, v in owners if already_patched(v)]
    from accelerate import Accelerator
    try:
        fp16 = str(Accelerator(mixed_precision="fp16", cpu=False).device)
    except ValueError as error:
        fp16 = str(error)
    print(json.dumps({"registered": registered_patches(), "applied": applied_patches(),
                      "tagged": sorted(tagged), "fp16": fp16}))
"""


def _every_patch(first: str) -> dict:
    import json
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(EVERY_PATCH), first],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def torch_first():
    return _every_patch("import torch")


def test_every_patch_applies_with_torch_imported_first(torch_first):
    assert sorted(torch_first["applied"]) == sorted(torch_first["registered"])
    assert torch_first["tagged"], "no replacement function found"
    assert torch_first["fp16"] == "neuron"


# Each first import leaves other modules mid-import when torch (and so the patches)
# loads: accelerate -> accelerate.accelerator; Trainer -> transformers.trainer and
# transformers.modeling_utils; trl.trainer.utils; safetensors.torch; ...
@pytest.mark.parametrize("first", [
    "from accelerate import Accelerator",
    "from transformers import Trainer",
    "import trl.trainer.utils",
    "from peft import LoraConfig",
    "import diffusers",
    "from safetensors.torch import load_file",
    "import kernels",
])
def test_every_patch_applies_with_a_library_imported_first(first, torch_first):
    report = _every_patch(first)
    assert sorted(report["applied"]) == sorted(report["registered"]) == sorted(torch_first["registered"])
    assert report["tagged"] == torch_first["tagged"]
    assert report["fp16"] == "neuron"


def test_patch_stays_pending_when_the_import_fails_and_applies_on_retry(tmp_path):
    """A failed import applies nothing (the module is gone); the next import of it does."""
    _fake_library(tmp_path)
    (tmp_path / "fakelib" / "mod.py").write_text(
        "import os\nif os.environ.pop('FAKELIB_FAIL_ONCE', None):\n    raise ImportError('once')\n"
        "def device():\n    return 'cpu'\n")
    out = _run(PATCH + """
    import os
    os.environ["FAKELIB_FAIL_ONCE"] = "1"
    try:
        import fakelib.mod
    except ImportError:
        pass
    import fakelib.mod
    print(fakelib.mod.device())
    """, tmp_path)
    assert out == "neuron"
