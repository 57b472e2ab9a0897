"""FP8 with TorchAO on an emulated Trainium3 (docs/fp8.md, "TorchAO").

    TORCH_NEURONX_INSTANCE=trn3.3xlarge python examples/fp8_torchao.py [--json]

Trains a tiny random-weight Llama for a few steps in bf16, then the same model
with TorchAO's float8 training (`convert_to_float8_training`: tensor-wise
scaled e4m3 forward, e5m2 gradients, through `torch._scaled_mm`) in eager and
under torch.compile(backend="neuron"), and runs MXFP8 inference
(`MXDynamicActivationMXWeightConfig`: 32-element blocks, e8m0 scales, through
`torch._scaled_mm`) and TorchAO's emulated MXFP8 training. It prints each
run's losses next to the bf16 run's. FP8 compute needs a Trainium3 profile:
on trn1/trn2 `torch._scaled_mm` raises an error that says so.
"""

import copy
import json
import sys
import warnings

import torch
from torchao.float8 import convert_to_float8_training
from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig
from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
from torchao.quantization import quantize_
from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
from transformers import LlamaConfig, LlamaForCausalLM

import torch_neuronx

STEPS = 4
DEVICE = "neuron"


def tiny_llama() -> LlamaForCausalLM:
    # torchao's float8 and MX casts need feature sizes divisible by 16 and 32.
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def linear_layers(module, fqn) -> bool:
    # The output head stays in bf16, as TorchAO's recipes recommend.
    return isinstance(module, torch.nn.Linear) and fqn != "lm_head"


def train(model, batch, compiled=False) -> list[float]:
    model = model.to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(model, backend="neuron") if compiled else model
    losses = []
    for _ in range(STEPS):
        loss = step(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def evaluate(model, batch, compiled=False, quantize=None) -> float:
    model = model.to(DEVICE).eval()
    if quantize is not None:  # MX weights are made on the device (an MXTensor does not move)
        model = quantize(model)
    forward = torch.compile(model, backend="neuron") if compiled else model
    with torch.no_grad():
        return forward(input_ids=batch, labels=batch).loss.item()


def float8(model):
    convert_to_float8_training(model, module_filter_fn=linear_layers)
    return model


def mxfp8_inference(model):
    quantize_(model, MXDynamicActivationMXWeightConfig(), filter_fn=linear_layers)
    return model


def mxfp8_training_emulated(model):
    # KernelPreference.AUTO casts with Triton/CUDA kernels, which no Neuron device has.
    quantize_(model, MXFP8TrainingOpConfig(kernel_preference=KernelPreference.EMULATED),
              filter_fn=linear_layers)
    return model


def main() -> dict:
    warnings.filterwarnings("ignore", module="torchao")
    base = tiny_llama()
    batch = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    runs = {"bf16": train(copy.deepcopy(base), batch)}
    torch_neuronx.clear_op_tracking()
    runs["float8"] = train(float8(copy.deepcopy(base)), batch)
    runs["float8_compiled"] = train(float8(copy.deepcopy(base)), batch, compiled=True)
    runs["mxfp8_training_emulated"] = train(mxfp8_training_emulated(copy.deepcopy(base)), batch)
    runs["bf16_eval"] = [evaluate(copy.deepcopy(base), batch)]
    runs["mxfp8_inference"] = [evaluate(copy.deepcopy(base), batch, quantize=mxfp8_inference)]
    runs["mxfp8_inference_compiled"] = [evaluate(copy.deepcopy(base), batch, compiled=True,
                                                 quantize=mxfp8_inference)]
    return {
        "losses": runs,
        "executed_ops": torch_neuronx.get_executed_ops(),
        "fallback_ops": torch_neuronx.get_fallback_ops(),
        "instance": torch.neuron.get_device_properties(0).instance,
    }


if __name__ == "__main__":
    result = main()
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for name, losses in result["losses"].items():
            print(f"{name:28s}", " ".join(f"{x:.4f}" for x in losses))
        print("CPU fallbacks:", result["fallback_ops"] or "none")
