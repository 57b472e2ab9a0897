"""Calibrates the audit's step-time estimate (torch_neuronx/audit/estimate.py) against
published Trainium2 figures.

For each published figure the workload is rebuilt from its published configuration,
without a device: the Hugging Face Llama modules are instantiated on the ``meta`` device
with the per-rank shapes of the published tensor-parallel layout, and one step (a
context-encoding pass or one token-generation step) runs under a TorchDispatchMode that
records every ATen call as an audit signature (the format of the C++ recorder:
``{"op", "path", "args", "calls_per_step", "host_ns_per_call"}``, tensors as
``{"dtype", "shape", "device": "neuron:0"}``). The tensor-parallel collectives are added
by hand. ``estimate_step`` then gives a step-time range, turned into tokens/s and
compared with the published number.

The figures (all Trn2, bf16, NxD Inference, LLMPerf with 10000 input / 1500 output
tokens, batch 1, TP=64 over the 64 logical cores of one trn2.48xlarge):

- Llama-3.3-70B: TTFT P50 814.2 ms, TPOT P50 19.6 ms
  (AWS Neuron docs, "Tutorial: Using Speculative Decoding to improve Llama-3.3-70B
  inference performance on Trn2 instances", table llama70b_perf_comparison.csv).
- Llama-3.1-405B: TTFT P50 2442 ms, TPOT P50 37.9 ms
  (AWS Neuron docs, "Tutorial: Using Speculative Decoding and Quantization to improve
  Llama-3.1-405B inference performance on Trn2 instances", llama405b_perf_comparison.csv).

What is rebuilt, per rank, as the tutorials configure it: the context-encoding bucket
(12288 tokens for the 10000-token prompt) with sequence parallelism (norms and residual
adds on 12288/64 tokens, an all-gather before and a reduce-scatter after each parallel
block), and token generation over the 12800-position KV-cache bucket (in-place cache
update, attention over the whole bucket with a mask, an all-reduce after each parallel
block). Attention is recorded as the fused op TorchNeuron records for SDPA
(``aten::_scaled_dot_product_flash_attention_for_cpu``; csrc/Kernels.cpp picks it).

NxD Inference runs compiled programs, so the main estimate uses mode="compiled" (the
per-op roofline without per-op launches); the eager range (each op launched) is shown
too. No constant of estimate.py is changed here: the ratios are the calibration result.

Usage: python benchmarks/calibrate_audit.py [--write] [--json PATH] [--only KEY ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_file import publish  # noqa: E402

from torch_neuronx.audit.estimate import estimate_step  # noqa: E402
from torch_neuronx.neuron.profiles import PROFILES  # noqa: E402

SECTION = "audit_calibration"
COMMAND = "python benchmarks/calibrate_audit.py --write"
BAND = 3.0  # the tolerance the test asserts: published within [low / 3, high * 3]
DEVICE = "neuron:0"
FLASH_FOR_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"


# --- the published figures ---------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    title: str
    url: str
    date: str
    table: str  # where in the source the number is


@dataclass(frozen=True)
class LlamaShape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 128


@dataclass(frozen=True)
class Figure:
    key: str
    model: LlamaShape
    phase: str  # "prefill" (TTFT) | "decode" (TPOT)
    published_ms: float  # the published latency (P50)
    metric: str  # what the published number is
    source: Source
    tp: int = 64
    instance: str = "trn2.48xlarge"
    prompt_tokens: int = 10000  # LLMPerf --mean-input-tokens (stddev 0)
    context_bucket: int = 12288  # --context-encoding-buckets: the bucket holding 10000 tokens
    kv_bucket: int = 12800  # --token-generation-buckets / --seq-len: positions attended per step
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        what = (f"{self.model.name} prefill, {self.prompt_tokens} tokens" if self.phase == "prefill"
                else f"{self.model.name} decode, KV bucket {self.kv_bucket}")
        return f"{what} (TP={self.tp}, bf16, {self.instance})"

    @property
    def tokens_per_step(self) -> int:
        """Tokens one step produces or consumes, as the published rate counts them."""
        return self.prompt_tokens if self.phase == "prefill" else 1

    @property
    def published_tokens_per_s(self) -> float:
        return self.tokens_per_step / (self.published_ms * 1e-3)


LLAMA_33_70B = LlamaShape("Llama-3.3-70B", hidden=8192, intermediate=28672, layers=80, heads=64,
                          kv_heads=8, vocab=128256)
LLAMA_31_405B = LlamaShape("Llama-3.1-405B", hidden=16384, intermediate=53248, layers=126, heads=128,
                           kv_heads=8, vocab=128256)

SRC_70B = Source(
    title="Tutorial: Using Speculative Decoding to improve Llama-3.3-70B inference performance "
          "on Trn2 instances (AWS Neuron documentation, NxD Inference)",
    url="https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/tutorials/"
        "trn2-llama3.3-70b-tutorial.html",
    date="2025-02-04 (table revision; tutorial first published 2024-12-18 with Neuron 2.21)",
    table="llama70b_perf_comparison.csv, row 'No speculative decoding'",
)
SRC_405B = Source(
    title="Tutorial: Using Speculative Decoding and Quantization to improve Llama-3.1-405B "
          "inference performance on Trn2 instances (AWS Neuron documentation, NxD Inference)",
    url="https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/tutorials/"
        "trn2-llama3.1-405b-speculative-tutorial.html",
    date="2025-02-04 (table; tutorial revised with Neuron 2.22, 2025-04-03)",
    table="llama405b_perf_comparison.csv, row 'No speculative decoding' (bf16 weights)",
)

FIGURES: dict[str, Figure] = {f.key: f for f in (
    Figure("llama70b-prefill", LLAMA_33_70B, "prefill", 814.2, "TTFT P50 814.2 ms", SRC_70B,
           notes=("The 2024-12-18 revision of the same table gave TTFT P50 575.6 ms, "
                  "TPOT P50 19.8 ms: the published figure itself moved by 1.4x.",)),
    Figure("llama70b-decode", LLAMA_33_70B, "decode", 19.6, "TPOT P50 19.6 ms", SRC_70B),
    Figure("llama405b-prefill", LLAMA_31_405B, "prefill", 2442.0, "TTFT P50 2442 ms", SRC_405B),
    Figure("llama405b-decode", LLAMA_31_405B, "decode", 37.9, "TPOT P50 37.9 ms", SRC_405B),
)}
SMALL_FIGURE = "llama70b-decode"  # the one tests/test_audit_calibration.py runs


# --- recording ATen calls as audit signatures ------------------------------------------------

def _describe(value):
    """One argument as the C++ recorder describes it (csrc/Recorder.cpp, describe)."""
    if isinstance(value, torch.Tensor):
        return {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "device": DEVICE}
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return DEVICE
    if isinstance(value, (torch.layout, torch.memory_format)):
        return None  # shape-neutral; the estimate's meta run does not need it
    return {"type": type(value).__name__}


def _op_name(func) -> str:
    schema = func._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _schema_args(func, args, kwargs) -> list:
    """The call's arguments in schema order, defaults filled in (the boxed stack)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if not arg.kwarg_only and i < len(args):
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            value = arg.default_value if arg.has_default_value() else None
        out.append(_describe(value))
    return out


class SignatureRecorder(TorchDispatchMode):
    """Counts ATen calls by signature; ``weight`` scales the count (a layer recorded once
    stands for all identical layers); ``paused()`` hides stand-in ops (collective outputs)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()
        self.weight = 1
        self._paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._paused and not func.is_view:  # views: metadata only, 0 in the estimate
            key = json.dumps([_op_name(func), _schema_args(func, args, kwargs)])
            self.calls[key] += self.weight
        return out

    @contextlib.contextmanager
    def paused(self):
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    @contextlib.contextmanager
    def weighted(self, weight: int):
        self.weight = weight
        try:
            yield
        finally:
            self.weight = 1

    def signatures(self) -> list[dict]:
        rows = []
        for key, calls in self.calls.items():
            op, args = json.loads(key)
            rows.append({"op": op, "path": "native", "args": args, "calls_per_step": float(calls),
                         "host_ns_per_call": 0.0})
        return rows


@contextlib.contextmanager
def _fused_sdpa():
    """SDPA as TorchNeuron records it: one fused flash-attention op (the meta device would
    otherwise take the math path and materialize the score matrix)."""
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(groups, dim=-3)
            value = value.repeat_interleave(groups, dim=-3)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


class _StaticKV:
    """A static KV cache of one bucket: the new token written in place (index_copy_, as HF's
    StaticCache and NxD Inference do), the whole bucket returned for attention."""

    def __init__(self, key, value, position):
        self.key, self.value, self.position = key, value, position

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.key.index_copy_(2, self.position, key_states)
        self.value.index_copy_(2, self.position, value_states)
        return self.key, self.value


# --- one step of a figure's workload, per rank ------------------------------------------------

def _rank_config(figure: Figure):
    """The Hugging Face config of one tensor-parallel rank: heads, KV heads (replicated up to
    one per rank), MLP width and vocabulary split by TP; hidden size and head size kept."""
    from transformers import LlamaConfig

    m, tp = figure.model, figure.tp
    for what, n in (("heads", m.heads), ("intermediate", m.intermediate), ("vocab", m.vocab)):
        if n % tp:
            raise ValueError(f"{m.name}: {what}={n} is not divisible by TP={tp}")
    config = LlamaConfig(
        hidden_size=m.hidden, intermediate_size=m.intermediate // tp, num_hidden_layers=1,
        num_attention_heads=m.heads // tp, num_key_value_heads=max(1, m.kv_heads // tp),
        head_dim=m.head_dim, vocab_size=m.vocab // tp, rms_norm_eps=1e-5,
        max_position_embeddings=max(figure.context_bucket, figure.kv_bucket),
    )
    config._attn_implementation = "sdpa"
    return config


def record_step(figure: Figure) -> tuple[list[dict], list[dict]]:
    """(signatures, collectives) of one step of one rank. The layers are identical, so one
    is recorded and weighted by the layer count."""
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding)

    config = _rank_config(figure)
    m, tp, bf16 = figure.model, figure.tp, torch.bfloat16
    with torch.device("meta"):
        layer = LlamaDecoderLayer(config, layer_idx=0).to(bf16).eval()
        embed = torch.nn.Embedding(config.vocab_size, m.hidden, dtype=bf16)
        final_norm = LlamaRMSNorm(m.hidden, eps=config.rms_norm_eps).to(bf16)
        lm_head = torch.nn.Linear(m.hidden, config.vocab_size, bias=False, dtype=bf16)
        rotary = LlamaRotaryEmbedding(config)

    hidden_bytes = m.hidden * 2  # one token's hidden state, bf16
    collectives: Counter = Counter()

    def coll(op: str, nbytes: int, calls: int) -> None:
        collectives[(op, nbytes)] += calls

    rec = SignatureRecorder()
    meta = dict(device="meta")
    with torch.no_grad(), _fused_sdpa(), rec:
        if figure.phase == "prefill":
            s, shard = figure.context_bucket, figure.context_bucket // tp
            ids = torch.zeros(1, s, dtype=torch.long, **meta)
            positions = torch.arange(s, **meta)[None]
            x = embed(ids)  # vocab-parallel embedding: partial sums, then reduce-scatter (SP)
            coll("reduce_scatter_tensor", s * hidden_bytes, 1)
            with rec.paused():
                x = torch.empty(1, shard, m.hidden, dtype=bf16, **meta)
            cos_sin = rotary(x, positions)
            with rec.weighted(m.layers):
                # attention block: norm on the sequence shard, all-gather, column/row-parallel
                # projections and attention on the whole bucket, reduce-scatter, residual add
                h = layer.input_layernorm(x)
                coll("all_gather_into_tensor", s * hidden_bytes, m.layers)
                with rec.paused():
                    h = torch.empty(1, s, m.hidden, dtype=bf16, **meta)
                h, _ = layer.self_attn(hidden_states=h, position_embeddings=cos_sin,
                                       attention_mask=None)
                coll("reduce_scatter_tensor", s * hidden_bytes, m.layers)
                with rec.paused():
                    h = torch.empty(1, shard, m.hidden, dtype=bf16, **meta)
                x = x + h
                h = layer.post_attention_layernorm(x)
                coll("all_gather_into_tensor", s * hidden_bytes, m.layers)
                with rec.paused():
                    h = torch.empty(1, s, m.hidden, dtype=bf16, **meta)
                h = layer.mlp(h)
                coll("reduce_scatter_tensor", s * hidden_bytes, m.layers)
                with rec.paused():
                    h = torch.empty(1, shard, m.hidden, dtype=bf16, **meta)
                x = x + h
            last = x[:, -1:]  # logits of the last prompt token only (on-device sampling)
        else:
            kv = config.num_key_value_heads
            ids = torch.zeros(1, 1, dtype=torch.long, **meta)
            position = torch.tensor([figure.prompt_tokens], **meta)
            x = embed(ids)
            coll("all_reduce", hidden_bytes, 1)
            cos_sin = rotary(x, position[None])
            with rec.paused():
                cache = _StaticKV(torch.empty(1, kv, figure.kv_bucket, m.head_dim, dtype=bf16, **meta),
                                  torch.empty(1, kv, figure.kv_bucket, m.head_dim, dtype=bf16, **meta),
                                  position)
                mask = torch.empty(1, 1, 1, figure.kv_bucket, dtype=torch.bool, **meta)
            with rec.weighted(m.layers):
                h, _ = layer.self_attn(hidden_states=layer.input_layernorm(x), position_embeddings=cos_sin,
                                       attention_mask=mask, past_key_values=cache)
                coll("all_reduce", hidden_bytes, m.layers)
                x = x + h
                h = layer.mlp(layer.post_attention_layernorm(x))
                coll("all_reduce", hidden_bytes, m.layers)
                x = x + h
            last = x
        logits = lm_head(final_norm(last))  # vocab-parallel: gather the logits
        coll("all_gather_into_tensor", logits.shape[-1] * tp * 2, 1)

    rows = [{"op": op, "bytes": nbytes, "world_size": tp, "calls_per_step": float(calls)}
            for (op, nbytes), calls in collectives.items()]
    return rec.signatures(), rows


# --- estimate and comparison -------------------------------------------------------------------

def _throughput(figure: Figure, seconds: float) -> float:
    return figure.tokens_per_step / seconds


def calibrate(figure: Figure) -> dict:
    started = time.perf_counter()
    signatures, collectives = record_step(figure)
    profile = PROFILES[figure.instance]
    compiled = estimate_step(signatures, [], collectives, profile, mode="compiled")
    eager = estimate_step(signatures, [], collectives, profile, mode="eager")
    published = figure.published_tokens_per_s
    low_tps = _throughput(figure, compiled["high_s"])  # slow end of the estimate
    high_tps = _throughput(figure, compiled["low_s"])  # fast end
    attn_calls = sum(s["calls_per_step"] for s in signatures if s["op"] == FLASH_FOR_CPU)

    def subset_ms(op: str) -> list[float]:
        part = estimate_step([s for s in signatures if s["op"] == op], [], [], profile, mode="compiled")
        return [part["low_s"] * 1e3, part["high_s"] * 1e3]
    return {
        "key": figure.key,
        "label": figure.label,
        "metric": figure.metric,
        "source": {"title": figure.source.title, "url": figure.source.url, "date": figure.source.date,
                   "table": figure.source.table},
        "published_ms": figure.published_ms,
        "published_tokens_per_s": published,
        "estimate_ms": [compiled["low_s"] * 1e3, compiled["high_s"] * 1e3],
        "estimate_tokens_per_s": [low_tps, high_tps],
        "ratio": [published / high_tps, published / low_tps],  # published / estimate
        "within_band": low_tps / BAND <= published <= high_tps * BAND,
        "by_class_ms": {k: [v[0] * 1e3, v[1] * 1e3] for k, v in compiled["by_class"].items()},
        "eager_ms": [eager["low_s"] * 1e3, eager["high_s"] * 1e3],
        "eager_tokens_per_s": [_throughput(figure, eager["high_s"]), _throughput(figure, eager["low_s"])],
        "attention_calls_per_step": attn_calls,
        "attention_op_ms": subset_ms(FLASH_FOR_CPU),  # TensorE: sdpa formulas
        "kv_update_ms": subset_ms("aten::index_copy_"),  # whole cache read + written per call
        "op_calls_per_step": sum(s["calls_per_step"] for s in signatures),
        "signatures": len(signatures),
        "collective_calls_per_step": sum(c["calls_per_step"] for c in collectives),
        "assumptions": compiled["assumptions"],
        "notes": list(figure.notes),
        "seconds": time.perf_counter() - started,
    }


# --- report ----------------------------------------------------------------------------------------

def _rng(pair, fmt="{:,.0f}") -> str:
    return f"{fmt.format(pair[0])}–{fmt.format(pair[1])}"


def _git_commit() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except Exception:  # noqa: BLE001 - informational only
        return "?"


def render(results: list[dict], seconds: float) -> str:
    import transformers

    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Audit estimate calibration (`benchmarks/calibrate_audit.py`)",
        "",
        f"- Date: {now}",
        f"- Command: `{COMMAND}`",
        f"- Build: commit {_git_commit()}; run time {seconds:.1f} s (meta tensors, no device)",
        f"- Software: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {platform.python_version()}",
        "",
        "Method: each published Trn2 figure's workload is rebuilt per tensor-parallel rank from its "
        "published configuration (Hugging Face Llama modules on the `meta` device, one step recorded "
        "as audit signatures under a TorchDispatchMode, tensor-parallel collectives added by hand) "
        "and costed by `estimate_step(..., mode=\"compiled\")` on the trn2.48xlarge profile "
        "(NxD Inference runs compiled programs). Throughput: prompt tokens / TTFT for prefill, "
        "1 / TPOT for decode (batch 1, per instance). The estimate's constants are unchanged; "
        f"the test band is published within [low / {BAND:g}, high x {BAND:g}].",
        "",
        "| workload | published | published tok/s | estimate (ms) | estimate tok/s (low–high) | "
        "ratio published/estimate | within x3 band |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['metric']} | {r['published_tokens_per_s']:,.1f} | "
            f"{_rng(r['estimate_ms'], '{:,.1f}')} | {_rng(r['estimate_tokens_per_s'], '{:,.1f}')} | "
            f"{_rng(r['ratio'], '{:.2f}')} | {'yes' if r['within_band'] else 'NO'} |")
    lines += [
        "",
        "Where the estimated time goes (compiled mode, ms per step, low–high), and the eager-mode "
        "variant (each op launched).",
        "",
        "| workload | matmul | vector | data | collectives | attention op / KV-cache update | "
        "ops / collectives per step | eager tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = r["by_class_ms"]
        lines.append(
            f"| {r['key']} | {_rng(c['matmul'], '{:,.2f}')} | {_rng(c['vector'], '{:,.2f}')} | "
            f"{_rng(c['data'], '{:,.2f}')} | {_rng(c['collectives'], '{:,.3f}')} | "
            f"{_rng(r['attention_op_ms'], '{:,.2f}')} / {_rng(r['kv_update_ms'], '{:,.2f}')} | "
            f"{r['op_calls_per_step']:,.0f} / {r['collective_calls_per_step']:,.0f} | "
            f"{_rng(r['eager_tokens_per_s'], '{:,.1f}')} |")
    lines += ["", "Sources:", ""]
    seen = set()
    for r in results:
        s = r["source"]
        if s["url"] in seen:
            continue
        seen.add(s["url"])
        lines.append(f"- {s['title']}, {s['url']} ({s['date']}); {s['table']}.")
    lines += [
        "",
        "Findings:",
        "",
        f"- Summary: published throughput is {min(r['ratio'][0] for r in results):.2f}–"
        f"{max(r['ratio'][1] for r in results):.2f} x the estimate over these figures: the estimate is "
        "optimistic, the published figures lie at or beyond its slow end (high_s), and all are inside "
        f"the x{BAND:g} band.",
        "- The attention op TorchNeuron records for SDPA (`aten::_scaled_dot_product_flash_attention_for_cpu`, "
        "chosen in csrc/Kernels.cpp) has no formula in PyTorch's FlopCounterMode; `estimate.py` counts its "
        "FLOPs with PyTorch's sdpa formulas, which count the full s x s score matrix even when causal (a "
        "flash kernel skips about half).",
        "- Decode: the estimate is HBM-bound (weights and KV cache streamed once per token); the published "
        "TPOT is longer mostly by fixed per-layer costs with no term in the estimate: collective latency "
        "(two all-reduces of 16–32 KB across 64 ranks per layer are costed by bandwidth only, ~0 ms) and "
        "the instruction/DMA overheads of small per-rank shards. The gap is larger for 70B (smaller "
        "shards, same layer-count order) than for 405B.",
        "- In-place ops (`index_copy_` into the KV cache) are costed as reading and writing the whole cache "
        "(inputs + outputs), not the one token written: the KV-cache column is time the real step does "
        "not spend, so the decode estimate's slow end is padded by that much.",
        "- Prefill: ops are summed (no overlap of compute, memory and communication), TensorE efficiency is "
        "fixed (1.0 low, 0.5 high) whatever the shape, and fusion is not modelled: Hugging Face computes "
        "q, k and v as three projections that each re-read the activations (HBM-bound with one head per "
        "rank), where NxD Inference fuses QKV (--fused-qkv) and runs NKI QKV/MLP/attention kernels.",
        "- Collectives use the chip's NeuronLink-v3 figure (1.28 TB/s, Trainium2 page); the trn2.48xlarge "
        "instance page lists 1,024 GB/s per chip intra-instance, so collective time is about 20% "
        "optimistic there, besides having no latency term.",
    ]
    for r in results:
        for note in r["notes"]:
            lines.append(f"- {r['key']}: {note}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace this section of benchmarks/RESULTS.md")
    parser.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="run these figures only")
    args = parser.parse_args(argv)
    if args.write and args.only:
        parser.error("--write needs every figure (leave out --only)")
    started = time.perf_counter()
    results = [calibrate(FIGURES[key]) for key in (args.only or FIGURES)]
    seconds = time.perf_counter() - started
    text = render(results, seconds)
    publish(SECTION, text, write=args.write, json_path=args.json,
            payload={"results": results, "seconds": seconds, "band": BAND})
    return 0


if __name__ == "__main__":
    sys.exit(main())
