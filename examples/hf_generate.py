"""Text generation with transformers on the neuron device.

    python examples/hf_generate.py [--new-tokens 12]

Builds a tiny Llama from a config (random weights, nothing downloaded), saves
it, loads it back with ``device_map="auto"`` exactly as a CUDA script would (the
layers land on the NeuronCores), decodes greedily on neuron and on CPU, and
checks that the tokens are identical. Then it reports the ops that fell back
to the CPU (there should be none).
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

import torch_neuronx  # noqa: E402  (only for the fallback report)

VOCAB = 256


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new-tokens", type=int, default=12)
    args = parser.parse_args()

    reference = tiny_llama()
    prompt = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as path:
        reference.save_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
    devices = sorted({str(p.device) for p in model.parameters()})
    print(f"loaded with device_map='auto': parameters on {', '.join(devices)}")
    print(f"layer placement: {model.hf_device_map}")

    torch_neuronx.clear_op_tracking()
    on_neuron = model.generate(prompt.to(model.device), max_new_tokens=args.new_tokens, do_sample=False).cpu()
    on_cpu = reference.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False)
    for row, (got, expected) in enumerate(zip(on_neuron.tolist(), on_cpu.tolist())):
        print(f"neuron tokens [{row}]: {got}")
        print(f"cpu    tokens [{row}]: {expected}")
    same = torch.equal(on_neuron, on_cpu)
    print(f"greedy tokens identical to CPU: {same}")

    fallback = torch_neuronx.get_fallback_ops()
    print(f"fallback ops (ran on CPU copies): {len(fallback) if fallback else 'none'}")
    for op, count in sorted(fallback.items()):
        print(f"  {op}: {count}")
    if not same:
        raise SystemExit("neuron and CPU greedy decoding differ")


if __name__ == "__main__":
    main()
