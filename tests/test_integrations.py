"""The import hook that applies third-party patches (torch_neuronx.integrations)."""

import subprocess
import sys
import textwrap


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
