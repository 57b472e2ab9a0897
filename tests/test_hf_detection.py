"""The Hugging Face libraries find the neuron device, and the patches in
torch_neuronx/integrations/ close the gaps they still have.

Detection runs in fresh processes that do nothing but ``import torch`` and
import the library, as a user script would. Each patch is checked twice in
fresh processes: with TORCH_NEURONX_DISABLE_INTEGRATIONS=1 the gap must show
(so the test fails if the patch stops doing anything or the gap closes
upstream), and with the patches on it must be closed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_TIMEOUT_S = 300


def _start(code: str, disable_integrations: bool = False) -> subprocess.Popen:
    """Starts ``code`` in a fresh interpreter (its last stdout line must be a JSON object)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_NEURONX_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", TOKENIZERS_PARALLELISM="false")
    if disable_integrations:
        env["TORCH_NEURONX_DISABLE_INTEGRATIONS"] = "1"
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _result(proc: subprocess.Popen) -> dict:
    try:
        stdout, stderr = proc.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, stderr[-4000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    """Every fresh-process check of this file, run side by side (as many as there are CPUs),
    keyed by detection library name or by "patched" / "unpatched"."""
    pending = [("unpatched", PATCH_FACTS, True), ("patched", PATCH_FACTS, False)]
    pending += [(library, code, False) for library, code in DETECTION.items()]
    running, results = [], {}
    while pending or running:
        # As many at once as there are CPUs: more only makes them compete.
        while pending and len(running) < (os.cpu_count() or 1):
            name, code, disable = pending.pop(0)
            running.append((name, _start(code, disable)))
        name, proc = running.pop(0)
        results[name] = _result(proc)
    return results


# --- detection: only `import torch` and the library ------------------------------------------------

DETECTION = {
    "transformers": """
        import json, tempfile, torch
        from transformers import TrainingArguments
        from transformers.utils import is_torch_neuron_available
        out = tempfile.mkdtemp()
        args = TrainingArguments(output_dir=out, report_to=[])
        compiled = TrainingArguments(output_dir=out, report_to=[], torch_compile=True)
        print(json.dumps({"available": is_torch_neuron_available(), "device": str(args.device),
                          "compile_backend": compiled.torch_compile_backend}))
    """,
    "accelerate": """
        import json, torch
        from accelerate import PartialState
        state = PartialState()
        print(json.dumps({"device": str(state.device), "distributed": state.distributed_type.value}))
    """,
    "diffusers": """
        import json, torch
        from diffusers.utils.torch_utils import get_device
        print(json.dumps({"device": get_device()}))
    """,
    "kernels": """
        import json, torch
        from kernels.backends import _backend
        from kernels.layer.kernelize import _has_neuron_ops
        backend = _backend()
        print(json.dumps({"backend": type(backend).__name__, "variant": backend.variant_str,
                          "neuron_ops": _has_neuron_ops()}))
    """,
}

EXPECTED_DETECTION = {
    "transformers": {"available": True, "device": "neuron:0", "compile_backend": "neuron"},
    # single process: accelerate names the device without index, as it does "cuda"
    "accelerate": {"device": "neuron", "distributed": "NO"},
    "diffusers": {"device": "neuron"},
    "kernels": {"backend": "Neuron", "variant": "neuron", "neuron_ops": True},
}


@pytest.mark.parametrize("library", sorted(DETECTION))
def test_library_detects_neuron_after_import_torch_only(runs, library):
    assert runs[library] == EXPECTED_DETECTION[library]


# --- patches: each gap shown unpatched, closed patched ----------------------------------------------

PATCH_FACTS = """
    import json, tempfile, warnings
    import torch
    facts = {}

    def fact(name):
        def record(fn):
            try:
                facts[name] = fn()
            except Exception as exc:  # the unpatched run reports the failure instead of stopping
                facts[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return record

    @fact("max_memory_keys")
    def _():
        from accelerate.utils import get_max_memory
        return [str(key) for key in get_max_memory()]

    facts["neuron_cores"] = torch.neuron.device_count()

    @fact("auto_device_types")
    def _():
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
        path = tempfile.mkdtemp()
        LlamaForCausalLM(config).save_pretrained(path)
        model = LlamaForCausalLM.from_pretrained(path, device_map="auto")
        return sorted({p.device.type for p in model.parameters()})

    @fact("explicit_budgets")
    def _():
        import logging
        from accelerate.utils import get_max_memory
        warnings_seen = []
        handler = logging.Handler()
        handler.emit = lambda record: warnings_seen.append(record.getMessage())
        logging.getLogger("accelerate.utils.modeling").addHandler(handler)
        budgets = get_max_memory({1: "1MiB", "cpu": "2MiB", 0: 1000})
        return {"budgets": [[str(k), v] for k, v in budgets.items()],
                "unavailable_warnings": sum("is not available" in w for w in warnings_seen)}

    @fact("grad_scaler")
    def _():
        from accelerate.utils import get_grad_scaler
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the CUDA scaler warns that it disables itself
            scaler = get_grad_scaler()
        return {"device": scaler._device, "enabled": scaler.is_enabled()}

    @fact("fp16_accelerator")
    def _():
        from accelerate import Accelerator
        accelerator = Accelerator(mixed_precision="fp16")
        # A prepared model returns fp32 outputs by design; the autocast context itself must give fp16.
        layer = torch.nn.Linear(4, 4).to(accelerator.device)
        with accelerator.autocast():
            out = layer(torch.randn(2, 4, device=accelerator.device))
        return {"device": accelerator.device.type, "dtype": str(out.dtype), "native_amp": accelerator.native_amp}

    @fact("peft_infer_device")
    def _():
        from peft.utils import infer_device
        return infer_device()

    @fact("peft_adapter_load_device")
    def _():
        # What users see: a saved adapter is read back onto infer_device()'s answer.
        from peft import LoraConfig, get_peft_model, load_peft_weights
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
        model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj"]))
        path = tempfile.mkdtemp()
        model.save_pretrained(path)
        facts["peft_adapter"] = path
        return sorted({t.device.type for t in load_peft_weights(path).values()})

    @fact("peft_adapter_load_on_neuron")
    def _():
        from peft import load_peft_weights
        on_neuron = load_peft_weights(facts["peft_adapter"], device="neuron")
        on_cpu = load_peft_weights(facts["peft_adapter"], device="cpu")
        return {"device": sorted({t.device.type for t in on_neuron.values()}),
                "equal_to_cpu_load": on_neuron.keys() == on_cpu.keys()
                and all(torch.equal(on_neuron[k].cpu(), on_cpu[k]) for k in on_cpu)}

    @fact("explicit_compile_config")
    def _():
        # Records what generate() would hand torch.compile, without compiling.
        from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
        model = LlamaForCausalLM(config).to("neuron")
        seen = {}
        real_compile = torch.compile
        torch.compile = lambda fn, **kwargs: seen.update(kwargs) or fn
        try:
            model.get_compiled_call(CompileConfig(fullgraph=True))
        finally:
            torch.compile = real_compile
        return {key: seen[key] for key in ("backend", "mode", "dynamic", "fullgraph")}

    @fact("pipeline_devices")
    def _():
        # CUDA scripts pass device=0 or nothing (both mean "the first accelerator").
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, pipeline
        backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[UNK]")
        config = LlamaConfig(vocab_size=3, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
        model = LlamaForCausalLM(config)
        found = {}
        for name, kwargs, where in [("device=0", {"device": 0}, "cpu"), ("device=1", {"device": 1}, "cpu"),
                                    ("default", {}, "cpu"), ("default, model on neuron:2", {}, "neuron:2"),
                                    ("device=-1", {"device": -1}, "neuron:0")]:
            generator = pipeline("text-generation", model=model.to(where), tokenizer=tokenizer, **kwargs)
            out = generator("a b", max_new_tokens=2, do_sample=False)[0]["generated_text"]
            found[name] = [str(generator.device), str(generator.model.device), out.startswith("a b")]
        path = tempfile.mkdtemp()
        model.save_pretrained(path)
        dispatched = LlamaForCausalLM.from_pretrained(path, device_map="auto")
        generator = pipeline("text-generation", model=dispatched, tokenizer=tokenizer)
        out = generator("a b", max_new_tokens=2, do_sample=False)[0]["generated_text"]
        found["device_map=auto"] = [str(generator.device), str(generator.model.device), out.startswith("a b")]
        return found

    @fact("reapplied_changes_nothing")
    def _():
        import accelerate.accelerator, accelerate.utils.modeling as modeling, peft.utils.other as other
        import peft.utils.save_and_load as save_and_load, transformers.modeling_utils as mu
        import transformers.pipelines.base as pipelines
        import safetensors.torch as st
        from torch_neuronx.integrations import accelerate as acc, peft, safetensors as sf, transformers as tf
        def snapshot():
            return (modeling.get_max_memory, modeling.get_grad_scaler, other.infer_device,
                    save_and_load.safe_load_file, st.load_file, mu.PreTrainedModel.get_compiled_call,
                    accelerate.accelerator.Accelerator.__init__.__code__, pipelines.Pipeline.__init__)
        before = snapshot()
        acc.neuron_max_memory(modeling)
        acc.neuron_grad_scaler(modeling)
        acc.neuron_fp16_mixed_precision(accelerate.accelerator)
        peft.neuron_infer_device(other)
        sf.neuron_load_file(st)
        tf.neuron_compile_config(mu)
        tf.neuron_pipeline_device(pipelines)
        consts = accelerate.accelerator.Accelerator.__init__.__code__.co_consts
        return {"same": [a is b for a, b in zip(before, snapshot())],
                "neuron_in_tuples": sum("neuron" in c for c in consts if isinstance(c, tuple))}

    print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def unpatched(runs):
    return runs["unpatched"]


@pytest.fixture(scope="module")
def patched(runs):
    return runs["patched"]


def test_max_memory_reports_neuron_cores(unpatched, patched):
    assert unpatched["max_memory_keys"] == ["cpu"]  # the gap: no accelerator memory found
    cores = [str(i) for i in range(patched["neuron_cores"])]
    assert cores  # at least one core, whatever the instance profile
    assert patched["max_memory_keys"] == cores + ["cpu"]


def test_max_memory_budgets_given_for_neuron_cores(unpatched, patched):
    budgets = [["0", 1000], ["1", 2**20], ["cpu", 2 * 2**20]]
    # The gap: every NeuronCore given a budget is reported as "not available" (checked against CUDA).
    assert unpatched["explicit_budgets"] == {"budgets": budgets, "unavailable_warnings": 2}
    assert patched["explicit_budgets"] == {"budgets": budgets, "unavailable_warnings": 0}


def test_device_map_auto_loads_onto_neuron(unpatched, patched):
    assert unpatched["auto_device_types"] == ["cpu"]
    assert patched["auto_device_types"] == ["neuron"]


def test_grad_scaler_is_a_neuron_scaler(unpatched, patched):
    assert unpatched["grad_scaler"] == {"device": "cuda", "enabled": False}
    assert patched["grad_scaler"] == {"device": "neuron", "enabled": True}


def test_fp16_mixed_precision_accepted(unpatched, patched):
    assert unpatched["fp16_accelerator"].startswith("ValueError: fp16 mixed precision requires a device in")
    assert patched["fp16_accelerator"] == {"device": "neuron", "dtype": "torch.float16", "native_amp": True}


def test_peft_infers_neuron(unpatched, patched):
    assert unpatched["peft_infer_device"] == "cpu"
    assert patched["peft_infer_device"] == "neuron"
    assert unpatched["peft_adapter_load_device"] == ["cpu"]
    assert patched["peft_adapter_load_device"] == ["neuron"]


def test_peft_loads_adapter_weights_onto_neuron(unpatched, patched):
    """load_peft_weights(device="neuron"), also what infer_device() now answers: safetensors'
    reader does not know the device name."""
    assert unpatched["peft_adapter_load_on_neuron"].startswith("SafetensorError: device neuron is invalid")
    assert patched["peft_adapter_load_on_neuron"] == {"device": ["neuron"], "equal_to_cpu_load": True}


def test_explicit_compile_config_uses_neuron_backend(unpatched, patched):
    # CUDA scripts write CompileConfig(fullgraph=True): its default backend is inductor.
    assert unpatched["explicit_compile_config"] == {
        "backend": "inductor", "mode": "reduce-overhead", "dynamic": None, "fullgraph": True}
    assert patched["explicit_compile_config"] == {
        "backend": "neuron", "mode": "default", "dynamic": False, "fullgraph": True}


def test_pipeline_integer_and_default_devices_mean_neuron(unpatched, patched):
    assert unpatched["pipeline_devices"] == {  # the gap: an integer or no device means the CPU
        "device=0": ["cpu", "cpu", True], "device=1": ["cpu", "cpu", True], "default": ["cpu", "cpu", True],
        "default, model on neuron:2": ["cpu", "cpu", True], "device=-1": ["neuron:0", "neuron:0", True],
        "device_map=auto": ["cpu", "cpu", True]}
    assert patched["pipeline_devices"] == {
        "device=0": ["neuron:0", "neuron:0", True], "device=1": ["neuron:1", "neuron:1", True],
        "default": ["neuron:0", "neuron:0", True], "default, model on neuron:2": ["neuron:2", "neuron:2", True],
        "device=-1": ["neuron:0", "neuron:0", True],  # -1 keeps the model where it is, as before
        "device_map=auto": ["neuron:0", "neuron:0", True]}


def test_patches_are_idempotent(patched):
    """Applying every patch a second time changes nothing (same functions, same code)."""
    assert patched["reapplied_changes_nothing"] == {"same": [True] * 8, "neuron_in_tuples": 1}
