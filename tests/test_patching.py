"""torch_neuronx.patching: one patch-once helper (marked, recorded, listed) and
one way to hide a kernel from Dynamo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from torch_neuronx import patching


def test_patch_once_replaces_once_and_records():
    owner = types.SimpleNamespace(f=lambda x: x + 1)
    original = owner.f
    calls = []

    def build(inner):
        def f(x):
            calls.append(x)
            return inner(x) * 10
        return f

    record = patching.patch_once(owner, "f", build, why="test")
    assert record is not None and record.installed() and record.original is original
    assert owner.f(1) == 20 and calls == [1]
    assert patching.is_patched(owner.f) and not patching.is_patched(original)
    assert getattr(owner.f, patching.MARKER) is record
    assert owner.f.__wrapped__ is original  # functools.wraps
    assert patching.patch_once(owner, "f", build, why="again") is None  # once
    assert owner.f(1) == 20
    assert record in patching.applied() and record.by == __name__ and record.why == "test"


def test_patch_once_of_an_unmarkable_value_and_nothing_to_change():
    def fn():
        return 1

    def build(code):
        return (lambda: 2).__code__

    record = patching.patch_once(fn, "__code__", build, why="test", wraps=False)
    assert fn() == 2 and record.installed() and patching.is_patched(fn.__code__)
    assert patching.patch_once(fn, "__code__", build, why="test", wraps=False) is None
    owner = types.SimpleNamespace(g=len)
    assert patching.patch_once(owner, "g", lambda original: original, why="nothing") is None
    assert owner.g is len


def test_missing_attribute_is_a_loud_error():
    with pytest.raises(AttributeError, match="cannot patch .*no_such_function.*does not exist"):
        patching.patch_once(json, "no_such_function", lambda f: f, why="test")


# Imports what every patch targets, re-runs every installer (nothing may change),
# then reports each patch applied and whether it is still installed.
LIST_PATCHES = """
    import importlib, json
    import torch, torch_neuronx
    import torch._dynamo
    for name in ("accelerate", "transformers", "trl", "peft", "safetensors.torch"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    from torch_neuronx import distributed, integrations, patching
    from torch_neuronx.compiler import dynamo
    from torch_neuronx.neuron import printing
    before = patching.applied()
    printing.install(); dynamo.install(); distributed._record_device_id()
    print(json.dumps({
        "patches": [[p.target, p.by, p.why, p.installed(), patching.is_patched(p.replacement)]
                    for p in patching.applied()],
        "unchanged": patching.applied() == before,
        "integrations": integrations.applied_patches(),
    }))
"""


def test_every_listed_patch_is_installed():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(LIST_PATCHES)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["unchanged"]  # applying again changes nothing
    targets = [p[0] for p in report["patches"]]
    assert len(targets) == len(set(targets)), targets
    for target, by, why, installed, marked in report["patches"]:
        assert installed and marked, target
        assert by.startswith("torch_neuronx.") and why, target
    for expected in ("torch._tensor_str._Formatter.__init__", "torch._TorchCompileInductorWrapper.__call__",
                     "torch.distributed.init_process_group",
                     "torch.distributed.distributed_c10d.init_process_group",
                     "torch_neuronx.neuron.random.get_rng_state", "torch_neuronx.neuron.get_rng_state"):
        assert expected in targets, targets
    # Every integration applied in this process replaced something listed here.
    patched_by = {p[1] for p in report["patches"]}
    for name in report["integrations"]:
        module = name.split(":")[0]
        library = module.split(".")[0]
        owner = {"torch": "dynamo", "transformers": "transformers|trainer"}.get(library, library)
        assert any(by.split(".")[-1] in owner.split("|") for by in patched_by), (name, patched_by)


def test_hide_from_dynamo_marks_the_code_in_place():
    import torch

    calls = []

    def kernel(x):
        calls.append(1)
        return x.sin() + 1  # would be traced into a graph if Dynamo saw this frame

    assert patching.hide_from_dynamo(kernel) is kernel

    counts = {"graphs": 0}

    def backend(gm, inputs):
        counts["graphs"] += 1
        return gm

    torch._dynamo.reset()
    compiled = torch.compile(kernel, backend=backend)
    assert torch.equal(compiled(torch.ones(2)), torch.ones(2).sin() + 1)
    assert counts["graphs"] == 0 and calls == [1]


def test_no_other_patch_or_dynamo_hiding_mechanism():
    import pathlib

    package = pathlib.Path(patching.__file__).parent
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "patching.py":
            continue
        text = path.read_text()
        for word in ("set_code_exec_strategy", "_disable_dynamo", "_neuron_redirect", "_neuron_host_copy",
                     "_torch_neuronx_patched", "mark_patched", "replace_once", ".__code__ ="):
            assert word not in text, f"torch_neuronx/{relative}: {word} (use torch_neuronx.patching)"
        assert "_neuron_hook" not in text, relative


# The Dynamo hooks (compiler/dynamo.py) go through the helper: installed
# before the first compile, they keep both behaviours: static shapes per neuron
# frame (a new shape recompiles, no symbolic sizes) and recorded recompile reasons.
DYNAMO_HOOKS_THROUGH_THE_HELPER = """
    import json, torch, torch_neuronx
    from torch_neuronx import patching
    from torch_neuronx.compiler import dynamo

    fn = torch.compile(lambda x: (x * 2).sum(), backend="neuron")
    for n in (3, 4, 5):
        fn(torch.ones(n, device="neuron"))
    before = len(patching.applied())
    dynamo.install()  # again: nothing changes
    metrics = torch_neuronx.get_dynamo_metrics()
    print(json.dumps({"compiles": metrics["compiles"], "reasons": metrics["recompile_reasons"],
                      "marked": [p.target for p in patching.applied() if "convert_frame" in p.target],
                      "installed": all(p.installed() for p in patching.applied()),
                      "unchanged": len(patching.applied()) == before}))
"""


def test_dynamo_hooks_can_go_through_the_helper():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(DYNAMO_HOOKS_THROUGH_THE_HELPER)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["marked"] == ["torch._dynamo.convert_frame._compile",
                                "torch._dynamo.convert_frame.get_and_maybe_log_recompilation_reasons"]
    assert report["installed"] and report["unchanged"]
    assert report["compiles"] >= 3  # one static executable per shape (no symbolic recompile)
    assert len(report["reasons"]) == 2, report["reasons"]


# Every Dynamo patch (compiler/dynamo.py) waits for torch._dynamo's import, one
# trigger, and is the backend's own: TORCH_NEURONX_DISABLE_INTEGRATIONS
# (third-party libraries) leaves it on.
DYNAMO_PATCHES_AT_DYNAMO_IMPORT = """
    import json, sys, torch, torch_neuronx
    from torch_neuronx import patching
    before = [p.target for p in patching.applied()]
    dynamo_loaded = "torch._dynamo" in sys.modules
    import torch._dynamo
    after = [p.target for p in patching.applied()]
    print(json.dumps({"dynamo_loaded": dynamo_loaded, "new": after[len(before):],
                      "by": sorted({p.by for p in patching.applied()[len(before):]})}))
"""


@pytest.mark.parametrize("disable_integrations", ["0", "1"])
def test_every_dynamo_patch_applies_when_dynamo_is_imported(disable_integrations):
    env = {**os.environ, "TORCH_NEURONX_DISABLE_INTEGRATIONS": disable_integrations}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(DYNAMO_PATCHES_AT_DYNAMO_IMPORT)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert not report["dynamo_loaded"]  # import torch_neuronx does not pay for Dynamo
    assert report["by"] == ["torch_neuronx.compiler.dynamo"]
    for target in ("torch._dynamo.convert_frame._compile",
                   "torch._dynamo.convert_frame.get_and_maybe_log_recompilation_reasons",
                   "torch._TorchCompileInductorWrapper.__call__", "torch_neuronx.neuron.get_rng_state"):
        assert target in report["new"], report["new"]
