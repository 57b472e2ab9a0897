"""torch.compile(backend="neuron") of Hugging Face causal LMs in training mode:
labels in, the model's own loss out, backward through the compiled graphs.

The architecture sweep (benchmarks/arch_sweep.py) checks compiled inference
(logits) across every architecture; this checks the training step, which
takes other paths (the loss, the backward graphs, and SDPA with
enable_gqa=True, which transformers uses when there is no attention mask), on
the architectures people fine-tune most. Tiny configs come from the sweep's
tiny_config; dropout is set to 0 so that both sides compute the same function.
Reference: the same model in eager mode on the neuron device (itself checked
against CPU elsewhere). Tolerances: fp32 1e-4 on the loss and every gradient,
bf16 autocast 3e-2. Run as a script, it checks the architectures named on the
command line (docs/huggingface.md lists the ones that passed).
"""

from __future__ import annotations

import contextlib
import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

import torch_neuronx  # noqa: E402,F401
from test_arch_sweep import _load_script as _load_sweep  # noqa: E402  (benchmarks/arch_sweep.py as a module)

ARCHS = ["llama", "mistral", "qwen2", "gemma2", "gpt2", "phi3", "opt", "llama4_text"]  # mixtral: below


@pytest.fixture(scope="module")
def sweep():
    return _load_sweep()


def _tiny_model(sweep, arch: str, checkpointing: bool = False, dtype=torch.float32):
    config = sweep.tiny_config(arch)
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "layerdrop" in key or key.endswith("_pdrop")) and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    model = sweep._build(arch, config).float().train()
    sweep._redraw_constant_matrices(model)  # MoE routers: no ties between experts
    model = model.to(dtype)
    if checkpointing:  # TRL's default; activations are recomputed in the backward
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    inputs = sweep._inputs(config, "neuron")
    inputs["labels"] = inputs["input_ids"]
    return model.to("neuron"), inputs


def _loss_and_grads(call, module, inputs, autocast: bool):
    context = torch.autocast("neuron", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        loss = call(**inputs).loss
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in module.named_parameters() if p.grad is not None}


def compiled_vs_eager(sweep, arch: str, autocast: bool, checkpointing: bool = False,
                      dtype=torch.float32) -> tuple[dict, dict]:
    """One training step of the tiny model, compiled and eager: (largest
    difference of the loss and of each gradient, by name; dynamo metrics)."""
    eager, inputs = _tiny_model(sweep, arch, checkpointing, dtype)
    compiled_model = copy.deepcopy(eager)
    want_loss, want_grads = _loss_and_grads(eager, eager, inputs, autocast)

    torch._dynamo.reset()
    torch_neuronx.reset_dynamo_metrics()
    compiled = torch.compile(compiled_model, backend="neuron")
    got_loss, got_grads = _loss_and_grads(compiled, compiled_model, inputs, autocast)
    assert set(got_grads) == set(want_grads)
    errors = {"loss": (got_loss - want_loss).abs().item()}
    errors.update({name: (got_grads[name] - want_grads[name]).abs().max().item() for name in want_grads})
    if dtype != torch.float32:  # bf16 gradients: relative to the gradient's size
        errors.update({name: errors[name] / max(want_grads[name].abs().max().item(), 1e-6)
                       for name in want_grads})
    return errors, torch_neuronx.get_dynamo_metrics()


@pytest.mark.parametrize("arch,autocast", [(a, False) for a in ARCHS] + [("llama", True)],
                         ids=[a for a in ARCHS] + ["llama-bf16_autocast"])
def test_compiled_training_step_matches_eager(sweep, arch, autocast):
    errors, metrics = compiled_vs_eager(sweep, arch, autocast)
    assert metrics["forward_graphs"] >= 1 and metrics["backward_graphs"] >= 1, metrics
    tolerance = 3e-2 if autocast else 1e-4
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tolerance, f"{arch}: {worst} differs by {errors[worst]:.3g} (> {tolerance})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_moe_training_step_compiles_to_one_graph_and_matches_eager(sweep, dtype):
    """Mixtral's experts under torch.compile: in bfloat16 transformers multiplies
    through torch._grouped_mm, which the backend lowers; in float32 through its
    own custom op transformers::grouped_mm_fallback, whose backward reads the
    group offsets on the host, which the backend replaces by a compiled
    equivalent (compiler/op_replacements.py). Either way forward and backward are
    one graph each. Tolerances: float32 1e-4 on the loss and every gradient;
    bfloat16 3e-2 on the loss and on each gradient relative to its largest entry."""
    errors, metrics = compiled_vs_eager(sweep, "mixtral", autocast=False, dtype=dtype)
    assert (metrics["forward_graphs"], metrics["backward_graphs"], metrics["graph_breaks"]) == (1, 1, 0), metrics
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tolerance, f"{worst} differs by {errors[worst]:.3g} (> {tolerance})"


def test_compiled_training_step_with_gradient_checkpointing_matches_eager(sweep):
    """gradient_checkpointing_enable() (non-reentrant, as TRL turns it on): the
    checkpointed layers are traced into the same forward and backward graphs."""
    errors, metrics = compiled_vs_eager(sweep, "llama", autocast=False, checkpointing=True)
    assert metrics["forward_graphs"] == 1 and metrics["backward_graphs"] == 1, metrics
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-4, f"{worst} differs by {errors[worst]:.3g}"


if __name__ == "__main__":
    # The same check on other architectures: python tests/test_hf_compile_training.py qwen3 gemma
    import sys

    module = _load_sweep()
    for name in sys.argv[1:]:
        try:
            found, _ = compiled_vs_eager(module, name, autocast=False)
            worst = max(found, key=found.get)
            print(f"{name}: {'ok' if found[worst] <= 1e-4 else 'MISMATCH'} (worst {worst}: {found[worst]:.3g})")
        except Exception as error:  # noqa: BLE001  (report and go on with the next one)
            print(f"{name}: ERROR {type(error).__name__}: {str(error).splitlines()[0][:300]}")
