"""Architecture sweep: every causal-LM architecture of the installed transformers
on the ``neuron`` device (issue #6).

    python benchmarks/arch_sweep.py [--jobs N] [--only llama,gpt2] [--timeout 120]
                                    [--cache PATH] [--fresh] [--write]

For each model type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` a tiny config is
built (generic shrinking of layer counts, widths, heads, vocab, experts and
sub-configs, plus per-model overrides in ``OVERRIDES``), a model is created on
CPU with a fixed seed and copied to ``neuron``, and three things are recorded:

1. eager: the neuron forward's logits match the CPU forward's (same weights,
   float32, ``atol=1e-4, rtol=1e-3``);
2. fallback: which ops ran through the CPU fallback during that forward;
3. compile: ``torch.compile(model, backend="neuron", fullgraph=True)`` runs the
   forward and matches CPU with the same tolerance.

Models that already fail on CPU with the tiny config ("cpu-broken") are listed
separately and left out of the percentages' denominators only in the second
set of numbers ("of the architectures that run on CPU"); the headline numbers
count every architecture.

Each architecture runs in a worker subprocess with a per-architecture timeout;
a worker that crashes or hangs is killed and replaced, and the architecture is
recorded as crashed/timed out. Results go to a JSON cache as they come, so a
rerun resumes where the last one stopped (``--fresh`` ignores the cache).
``--write`` regenerates docs/architectures.md from the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_CACHE = os.path.join(HERE, "arch_sweep_results.json")
DOC = os.path.join(ROOT, "docs", "architectures.md")

ATOL, RTOL = 1e-4, 1e-3
BATCH, SEQ = 2, 8
TARGETS = {"eager": 97.0, "zero_fallback": 90.0, "compile": 90.0}

# ----------------------------------------------------------------- tiny configs
# Attribute names (across model families) and the small value each shrinks to.
# Only attributes the config already has are touched, and only downwards.
_SHRINK = (
    (2, ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
         "num_decoder_layers", "num_encoder_layers", "num_text_layers", "depth")),
    (64, ("hidden_size", "n_embd", "d_model", "n_embed", "embed_dim", "word_embed_proj_dim", "d_embed",
          "intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim", "d_ff",
          "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size",
          "expert_intermediate_size", "dim_ff", "inner_hidden_size", "projection_dim",
          "embedding_size", "hidden_dim", "mlp_dim", "ffn_embed_dim")),
    (4, ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads",
         "encoder_attention_heads", "num_heads", "linear_num_heads", "linear_num_key_heads",
         "linear_num_value_heads", "num_experts", "num_local_experts",
         "n_routed_experts", "moe_num_experts", "num_experts_per_layer")),
    (2, ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
         "num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k",
         "num_experts_per_token")),
    (1, ("topk_group", "n_group", "n_shared_experts", "num_shared_experts", "first_k_dense_replace",
         "num_nextn_predict_layers", "moe_num_shared_experts", "num_expert_group", "moe_layer_start_index",
         "moe_layer_end_index")),
    (16, ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_channels",
          "attention_head_dim", "rotary_dim", "linear_head_dim", "linear_key_head_dim",
          "linear_value_head_dim")),
    (32, ("kv_lora_rank", "q_lora_rank")),
    (512, ("vocab_size", "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
           "max_sequence_length", "model_max_length", "vocab_size_per_layer_input")),
)
SHRINK = {name: value for value, names in _SHRINK for name in names}

# Vision/audio towers of multimodal models: small images and patches.
SHRINK.update({"image_size": 32, "patch_size": 8, "num_channels": 3})

TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                 "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")

# Per-model fixes on top of the generic shrinking: keys (dotted for sub-configs)
# set after it, for configs whose attributes must agree with each other.
OVERRIDES: dict[str, dict] = {
    # MoE sizes left unset (None) by the default config
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "deepseek_v2": {"num_experts_per_tok": 2},
    "nemotron": {"num_key_value_heads": 2},
    "mamba2": {"num_heads": 8},  # num_heads * head_dim must equal hidden_size * expand
    "reformer": {"is_decoder": True, "attn_layers": ["local", "lsh"], "attention_head_size": 16,
                 "axial_pos_embds_dim": [32, 32], "axial_pos_shape": [4, 4], "max_position_embeddings": 16,
                 "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "num_buckets": 2,
                 "hash_seed": 0},  # LSH draws random rotations: same seed on both devices
    "gemma3n_text": {"num_kv_shared_layers": 0, "hidden_size_per_layer_input": 16, "laurel_rank": 8},
    # head_dim left None by the default config but read by the model
    "ministral": {"head_dim": 16},
    "hunyuan_v1_dense": {"head_dim": 16},
    "hunyuan_v1_moe": {"head_dim": 16},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "xmod": {"default_language": "en_XX"},
    # the shared attention block is tied across hybrid layers: keep two of them
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
              "attention_hidden_size": 128, "attention_head_dim": 32, "mamba_dt_rank": 8},
    # input_ids are (batch * num_codebooks, seq)
    "musicgen.decoder": {"num_codebooks": 2},
    "musicgen_melody.decoder": {"num_codebooks": 2},  # its adapters need a language to route to
    # per-layer attention pattern given as [[kinds], repeats]
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    # read by the model but left unset by the default config
    "dbrx": {"attn_config.rope_theta": 10000.0, "attn_config.clip_qkv": 8.0},
    "qwen4_exp": {"text_config.indexer_n_heads": 2, "text_config.indexer_kv_heads": 1,
                  "text_config.indexer_head_dim": 16, "text_config.indexer_compress_ratio": 2,
                  "text_config.indexer_budget": 8},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16,
                       "indexer_compress_ratio": 2, "indexer_budget": 8},
}


# MoE variants: more than one tiny config per MoE architecture (issue 15: the
# one config above missed routers that top-k meets with ties). Run with
# --moe-variants, as rows named "<model type>@<variant>"; they stay out of
# docs/architectures.md. Each variant sets, of each group of alternative
# attribute names, those the architecture's tiny config has (not None); a
# variant that changes nothing there is not run.
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_experts_per_token")
_SHARED = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
_DENSE_FIRST = ("first_k_dense_replace", "num_dense_layers", "moe_layer_start_index")
MOE_VARIANTS: dict[str, dict[tuple[str, ...], object]] = {
    "e8k1": {_EXPERTS: 8, _TOP_K: 1},  # more experts, one per token
    "e8k4": {_EXPERTS: 8, _TOP_K: 4},  # more experts, a wider top-k
    "shared2": {_SHARED: 2},
    "all_moe": {_DENSE_FIRST: 0, ("decoder_sparse_step",): 1, ("mlp_only_layers",): []},
    "dense_first": {_DENSE_FIRST: 1, ("decoder_sparse_step",): 2, ("mlp_only_layers",): [0]},
}


def _variant_kwargs(effective: dict, variant: str) -> dict:
    """The attributes `variant` sets on a config whose values are `effective`."""
    return {name: value for names, value in MOE_VARIANTS[variant].items() for name in names
            if effective.get(name) is not None}


def moe_variants(model_type: str) -> list[str]:
    """Names "<model type>@<variant>" of the variants that change its tiny config."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if "@" in model_type or model_type in SUBCONFIG:
        return []
    cls = CONFIG_MAPPING[model_type]
    effective = {**vars(cls()), **_tiny_kwargs(model_type)}
    if not any(effective.get(name) for name in _EXPERTS):
        return []
    return [f"{model_type}@{variant}" for variant in MOE_VARIANTS
            if any(effective[k] != v for k, v in _variant_kwargs(effective, variant).items())]


def _shrunk_value(key, value):
    target = SHRINK.get(key)
    if target is None or isinstance(value, bool) or not isinstance(value, int) or value <= target:
        return value
    return target


def _fix_token_ids(kwargs: dict, vocab: int) -> None:
    for key in TOKEN_ID_KEYS:
        value = kwargs.get(key)
        if isinstance(value, int) and value >= vocab:
            kwargs[key] = vocab - 1 - TOKEN_ID_KEYS.index(key)
        elif isinstance(value, list):
            kwargs[key] = [v if v < vocab else vocab - 1 for v in value]


def tiny_config_kwargs(config) -> dict:
    """Constructor kwargs that shrink `config` (a default-constructed config)."""
    from transformers import PreTrainedConfig

    kwargs = {}
    for key, value in vars(config).items():
        if key.startswith("_"):
            continue
        if isinstance(value, PreTrainedConfig):
            kwargs[key] = type(value)(**tiny_config_kwargs(value)).to_dict()
            continue
        new = _shrunk_value(key, value)
        if new is not value:
            kwargs[key] = new
    attrs = vars(config)  # plain attributes only: per-layer configs raise on some getattr calls

    def current(key):
        return kwargs.get(key, attrs.get(key))

    heads = current("num_attention_heads")
    for key in ("num_key_value_heads", "num_kv_heads"):
        value = current(key)
        if isinstance(value, int) and isinstance(heads, int):
            # grouped-query attention needs heads % kv_heads == 0; latent (MLA)
            # attention expands keys to every head
            if heads % max(value, 1) or "kv_lora_rank" in attrs:
                kwargs[key] = heads
    if attrs.get("head_dim") is not None and isinstance(heads, int) and isinstance(current("hidden_size"), int):
        kwargs["head_dim"] = max(current("hidden_size") // heads, 8)
    layers = kwargs.get("num_hidden_layers")
    for key in ("layer_types", "mlp_layer_types", "layers_block_type", "block_types", "hybrid_override_pattern"):
        value = attrs.get(key)  # derived properties are recomputed from the layer count
        if isinstance(value, (list, str)) and layers is not None and len(value) != layers:
            kwargs[key] = _spread(value, layers)
    vocab = current("vocab_size")
    if isinstance(vocab, int):
        for key in TOKEN_ID_KEYS:
            if key not in kwargs and key in attrs:
                kwargs[key] = attrs[key]
        _fix_token_ids(kwargs, vocab)
        # image/audio/... placeholder ids beyond the small vocab: distinct ids
        # just below those of TOKEN_ID_KEYS (inputs stay below vocab - 16)
        spare = iter(range(vocab - 1 - len(TOKEN_ID_KEYS), vocab - 16, -1))
        for key, value in sorted(attrs.items()):
            if (key.endswith("token_index") or key.endswith("token_id")) and key not in TOKEN_ID_KEYS:
                if isinstance(value, int) and value >= vocab:
                    kwargs[key] = next(spare, vocab - 16)
    return kwargs


def _spread(pattern, layers: int):
    """Keeps one of each distinct layer kind of a per-layer pattern, then repeats."""
    kinds = list(dict.fromkeys(pattern))
    picked = (kinds * layers)[:layers] if len(kinds) < layers else kinds[:layers]
    return "".join(picked) if isinstance(pattern, str) else picked


def _tiny_kwargs(model_type: str) -> dict:
    """Constructor kwargs of the tiny config of a model type (without variant)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kwargs = tiny_config_kwargs(CONFIG_MAPPING[model_type]())
    for key, value in OVERRIDES.get(model_type, {}).items():
        _set_dotted(kwargs, key, value)
    for key, value in OVERRIDES.get(f"{model_type}.{SUBCONFIG.get(model_type)}", {}).items():
        _set_dotted(kwargs, f"{SUBCONFIG[model_type]}.{key}", value)
    return kwargs


def tiny_config(name: str):
    """The tiny config of a model type, or of "<model type>@<variant>" (MOE_VARIANTS)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type, _, variant = name.partition("@")
    cls = CONFIG_MAPPING[model_type]
    kwargs = _tiny_kwargs(model_type)
    if variant:
        kwargs.update(_variant_kwargs({**vars(cls()), **kwargs}, variant))
    config = cls(**kwargs)
    if model_type in SUBCONFIG:
        config = getattr(config, SUBCONFIG[model_type])
    if model_type in EAGER_ATTENTION:
        config._attn_implementation = "eager"
    return config


def _set_dotted(kwargs: dict, key: str, value) -> None:
    *path, last = key.split(".")
    for part in path:
        kwargs = kwargs.setdefault(part, {})
    kwargs[last] = value


EAGER_ATTENTION: set[str] = set()

# Composite configs whose causal-LM class takes one of their sub-configs.
SUBCONFIG = {"musicgen": "decoder", "musicgen_melody": "decoder"}


# ------------------------------------------------------------- one architecture
def _logits(output):
    if hasattr(output, "logits") and output.logits is not None:
        return output.logits
    if isinstance(output, (tuple, list)):
        return output[0]
    return output


def _inputs(config, device):
    import torch

    vocab = getattr(config.get_text_config(), "vocab_size", None) or 256
    g = torch.Generator().manual_seed(1)
    # Stay below the special/image token ids the tiny configs park near the top.
    ids = torch.randint(3, max(min(vocab, 512) - 16, 4), (BATCH, SEQ), generator=g)
    return {"input_ids": ids.to(device), "use_cache": False}


def _build(model_type: str, config):
    """AutoModelForCausalLM's model; for a SUBCONFIG type, its class on the sub-config."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = model_type.partition("@")[0]

    if model_type in SUBCONFIG:
        return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])._from_config(config)
    return transformers.AutoModelForCausalLM.from_config(config)


def _redraw_constant_matrices(model) -> list[str]:
    """Matrices initialized to a constant (MoE routers start at zero) make every
    router score equal, and the top-k choice among equal scores is left
    unspecified (CPU and XLA break ties differently). Random values instead keep
    the comparison about numerics; returns the names redrawn."""
    import torch

    names = []
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2 and param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
                names.append(name)
    return names


def _compare(a, b) -> tuple[bool, float]:
    import torch

    a = a.detach().to("cpu", torch.float32)
    b = b.detach().to("cpu", torch.float32)
    if a.shape != b.shape:
        return False, float("inf")
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    return bool(torch.allclose(a, b, atol=ATOL, rtol=RTOL, equal_nan=False)), diff


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = [line for line in text.splitlines() if line.strip()]
    return " | ".join(first[:3])[:400]


def _compile_check(neuron_model, neuron_inputs, expected, result) -> None:
    import torch

    start = time.perf_counter()
    torch._dynamo.reset()  # each architecture compiles from scratch, whatever ran before
    try:
        compiled = torch.compile(neuron_model, backend="neuron", fullgraph=True)
        with torch.no_grad():
            got = _logits(compiled(**neuron_inputs))
        result["compile_match"], result["compile_max_diff"] = _compare(got, expected)
    except Exception as exc:
        result["compile_match"] = False
        result["compile_error"] = _short(exc)
    finally:
        torch._dynamo.reset()
    result["compile_s"] = round(time.perf_counter() - start, 1)


def run_one(model_type: str, compile_check: bool = True) -> dict:
    """Builds the tiny model and runs the three checks; returns a result row."""
    import copy

    import torch
    import torch_neuronx

    result = {"arch": model_type, "status": "ok", "eager_match": False, "fallback_ops": {},
              "compile_match": None, "eager_max_diff": None, "compile_max_diff": None,
              "error": None, "eager_error": None, "compile_error": None}
    start = time.perf_counter()
    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        model = _build(model_type, config).eval().float()
        result["redrawn"] = _redraw_constant_matrices(model)
        inputs = _inputs(config, "cpu")
        with torch.no_grad():
            expected = _logits(model(**inputs))
        if not torch.isfinite(expected).all():
            raise FloatingPointError("CPU logits are not finite with the tiny config")
    except Exception as exc:  # the model itself does not run: not a device problem
        result.update(status="cpu-broken", error=_short(exc))
        result["seconds"] = round(time.perf_counter() - start, 1)
        return result
    result["params"] = sum(p.numel() for p in model.parameters())
    result["cpu_s"] = round(time.perf_counter() - start, 1)

    neuron_model = copy.deepcopy(model).to("neuron")
    neuron_inputs = _inputs(config, "neuron")
    torch_neuronx.clear_op_tracking()
    try:
        with torch.no_grad():
            got = _logits(neuron_model(**neuron_inputs))
        result["eager_match"], result["eager_max_diff"] = _compare(got, expected)
    except Exception as exc:
        result["eager_error"] = _short(exc)
    result["fallback_ops"] = torch_neuronx.get_fallback_ops()
    result["eager_s"] = round(time.perf_counter() - start - result["cpu_s"], 1)

    if compile_check:
        _compile_check(neuron_model, neuron_inputs, expected, result)
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def worker_main() -> None:
    """Reads "<model type> <checks>" lines from stdin; writes one JSON result line each."""
    os.environ.setdefault("TORCH_NEURONX_FALLBACK", "silent")
    import warnings

    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    out = sys.stdout
    sys.stdout = sys.stderr  # model code that prints must not corrupt the result stream
    import torch_neuronx  # noqa: F401  (pay the imports before the first deadline starts)
    from transformers import AutoModelForCausalLM  # noqa: F401

    out.write("READY\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        model_type, checks = line.split()
        try:
            row = run_one(model_type, compile_check="compile" in checks.split(","))
        except BaseException as exc:  # keep the worker alive for the next one
            row = {"arch": model_type, "status": "sweep-error", "error": _short(exc),
                   "trace": traceback.format_exc()[-2000:]}
        out.write("RESULT " + json.dumps(row, default=str) + "\n")
        out.flush()


# ----------------------------------------------------------------- the driver
def all_architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


class Worker:
    """One worker subprocess; `run` sends an architecture and waits for its row."""

    def __init__(self, log):
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     text=True, bufsize=1, env=env)
        self.arch = None
        self.deadline = None
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        if not ready or self.proc.stdout.readline().strip() != "READY":
            self.kill()
            raise RuntimeError(f"arch_sweep worker did not start; see {log.name}")

    def send(self, arch: str, checks: str, timeout: float) -> None:
        self.arch, self.deadline = arch, time.monotonic() + timeout
        self.proc.stdin.write(f"{arch} {checks}\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _read_row(worker: Worker):
    line = worker.proc.stdout.readline()
    if not line:
        return {"arch": worker.arch, "status": "crashed", "error": f"worker exited with {worker.proc.wait()}"}
    if not line.startswith("RESULT "):
        return None
    return json.loads(line[len("RESULT "):])


def _needs_run(row, checks: str) -> bool:
    if row is None:
        return True
    return "compile" in checks and row.get("status") == "ok" and row.get("compile_match") is None


def sweep(archs: list[str], checks: str, jobs: int, timeout: float, cache: dict, save, log) -> None:
    todo = [a for a in archs if _needs_run(cache.get(a), checks)]
    workers: list[Worker] = []
    busy: dict[int, Worker] = {}
    total, done = len(todo), 0
    while todo or busy:
        while todo and len(busy) < jobs:
            idle = [w for w in workers if w.arch is None]
            worker = idle[0] if idle else Worker(log)
            if not idle:
                workers.append(worker)
            worker.send(todo.pop(0), checks, timeout)
            busy[worker.proc.stdout.fileno()] = worker
        wait = max(0.1, min(w.deadline for w in busy.values()) - time.monotonic())
        ready, _, _ = select.select(list(busy), [], [], wait)
        for fd in ready:
            worker = busy[fd]
            row = _read_row(worker)
            if row is None:
                continue
            del busy[fd]
            if row["status"] == "crashed":
                workers.remove(worker)
                worker.kill()
            worker.arch = None
            done += 1
            _record(row, cache, save, done, total)
        now = time.monotonic()
        for fd, worker in list(busy.items()):
            if now > worker.deadline:
                del busy[fd]
                workers.remove(worker)
                worker.kill()
                done += 1
                _record(_timeout_row(cache.get(worker.arch), worker.arch, checks, timeout), cache, save, done, total)
    for worker in workers:
        worker.proc.stdin.close()
        worker.proc.wait()


def merge_cache(cache: dict, path: str) -> None:
    """Rows of `path` replace missing rows and rows without a compile result."""
    with open(path) as f:
        other = json.load(f)
    for arch, row in other.items():
        mine = cache.get(arch)
        if mine is None or (mine.get("compile_match") is None and row.get("compile_match") is not None):
            cache[arch] = row


def _timeout_row(previous, arch: str, checks: str, timeout: float) -> dict:
    """A compile pass that times out keeps the eager results of the earlier pass."""
    if "compile" in checks and previous and previous.get("status") == "ok":
        return dict(previous, compile_match=False, compile_error=f"timed out (whole run > {timeout:.0f} s)")
    return {"arch": arch, "status": "timeout", "error": f"no result in {timeout:.0f} s"}


def _record(row, cache, save, done, total) -> None:
    cache[row["arch"]] = row
    save()
    print(f"[{done}/{total}] {row['arch']}: {verdict(row)}  ({row.get('seconds', '-')} s)", flush=True)


def verdict(row) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error')}"
    parts = ["eager " + ("match" if row["eager_match"] else "MISMATCH/ERROR"),
             f"fallback {len(row['fallback_ops'])}",
             "compile " + {True: "match", False: "FAIL", None: "not run"}[row["compile_match"]]]
    return ", ".join(parts)


# ------------------------------------------------------------------- summary
def summarize(rows: list[dict]) -> dict:
    """Percentages over every architecture, and over those that run on CPU."""
    total = len(rows)
    runnable = [r for r in rows if r["status"] not in ("cpu-broken",)]
    ok = [r for r in rows if r["status"] == "ok"]

    def pct(n, d):
        return round(100.0 * n / d, 1) if d else 0.0

    counts = {
        "eager": sum(r["eager_match"] for r in ok),
        "zero_fallback": sum(r["eager_error"] is None and not r["fallback_ops"] for r in ok),
        "compile": sum(r["compile_match"] is True for r in ok),
    }
    return {
        "total": total,
        "compile_measured": sum(r["compile_match"] is not None for r in ok),
        "cpu_broken": total - len(runnable),
        "counts": counts,
        "of_all": {k: pct(v, total) for k, v in counts.items()},
        "of_runnable": {k: pct(v, len(runnable)) for k, v in counts.items()},
    }


def fallback_census(rows: list[dict]) -> dict[str, int]:
    """Fallback op -> number of architectures that hit it."""
    census: dict[str, int] = {}
    for row in rows:
        for op in row.get("fallback_ops") or {}:
            census[op] = census.get(op, 0) + 1
    return dict(sorted(census.items(), key=lambda kv: (-kv[1], kv[0])))


def render_markdown(rows: list[dict], command: str) -> str:
    import torch
    import transformers

    s = summarize(rows)
    lines = [
        "# Causal-LM architecture sweep",
        "",
        "Generated by `benchmarks/arch_sweep.py --write`; do not edit by hand.",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- Commands:",
        "",
        "```",
        command,
        "```",
        "",
        f"- Software: torch {torch.__version__}, transformers {transformers.__version__}",
        f"- Architectures: every model type in transformers' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` ({s['total']}).",
        f"- Per architecture: a tiny config (2 layers, hidden 64, 4 heads, vocab <= 512, <= 4 experts, small "
        f"vision/audio towers), random weights with seed 0, float32, input_ids of shape ({BATCH}, {SEQ}), "
        "`use_cache=False`. The CPU forward is the reference.",
        f"- eager: neuron logits vs CPU logits, `torch.allclose(atol={ATOL}, rtol={RTOL})`. "
        "fallback: ops that ran through the CPU fallback during the eager forward. "
        "compile: `torch.compile(model, backend=\"neuron\", fullgraph=True)` forward vs CPU, same tolerance.",
        "",
        "## Summary",
        "",
        f"torch.compile was measured on {s['compile_measured']} architectures; the others count as not passing.",
        "",
        "| check | architectures | % of all | % of those that run on CPU | target (% of all) |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"eager": "eager forward matches CPU", "zero_fallback": "no CPU-fallback op",
             "compile": "torch.compile fullgraph matches CPU"}
    for key, label in names.items():
        lines.append(f"| {label} | {s['counts'][key]} / {s['total']} | {s['of_all'][key]}% | "
                     f"{s['of_runnable'][key]}% | >= {TARGETS[key]}% |")
    lines += ["", f"Architectures that fail on CPU with the tiny config (not a device problem): "
              f"{s['cpu_broken']}, listed below.", "", "## Per architecture", "",
              "| architecture | eager | max abs diff | fallback ops | compile | max abs diff | note |",
              "|---|---|---:|---|---|---:|---|"]
    for row in sorted(rows, key=lambda r: r["arch"]):
        if row["status"] != "ok":
            continue
        fb = ", ".join(f"{k} ({v})" for k, v in row["fallback_ops"].items()) or "none"
        note = row.get("compile_error") or row.get("eager_error") or ""
        lines.append(
            f"| {row['arch']} | {_yes_no(row['eager_match'])} | {_fmt(row['eager_max_diff'])} "
            f"| {fb} | {_yes_no(row['compile_match'])} | {_fmt(row['compile_max_diff'])} "
            f"| {_cell(note)} |")
    broken = [r for r in rows if r["status"] != "ok"]
    lines += ["", "## Not run on the device", "",
              "Architectures whose tiny model fails on CPU (cpu-broken), or whose worker crashed or timed out.",
              "", "| architecture | status | reason |", "|---|---|---|"]
    for row in sorted(broken, key=lambda r: r["arch"]):
        lines.append(f"| {row['arch']} | {row['status']} | {_cell(row.get('error') or '')} |")
    census = fallback_census(rows)
    lines += ["", "## Fallback ops", "", "Op -> number of architectures whose eager forward hit it.", ""]
    lines += [f"- `{op}`: {n}" for op, n in census.items()] or ["- none"]
    return "\n".join(lines) + "\n"


COMMANDS = (
    "python benchmarks/arch_sweep.py --checks eager --jobs 1 --timeout 120   # fast pass, every architecture",
    "python benchmarks/arch_sweep.py --jobs 1 --timeout 180   # adds torch.compile, resumes from the cache",
    "python benchmarks/arch_sweep.py --checks eager --write   # regenerates this page from the cache",
)


def write_reports(rows: list[dict]) -> None:
    """docs/architectures.md (full table) and the arch_sweep section of RESULTS.md."""
    from results_file import write_section  # benchmarks/ is on sys.path when run as a script

    with open(DOC, "w") as f:
        f.write(render_markdown(rows, "\n".join(COMMANDS)))
    s = summarize(rows)
    lines = ["## Causal-LM architecture sweep (`benchmarks/arch_sweep.py`)", "",
             f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; full table: docs/architectures.md",
             "- Commands:", "", "```", *COMMANDS, "```", "",
             "| check | architectures | % of all | % of those that run on CPU | target |", "|---|---:|---:|---:|---:|"]
    for key, label in (("eager", "eager matches CPU"), ("zero_fallback", "no fallback op"),
                       ("compile", "compile fullgraph matches CPU")):
        lines.append(f"| {label} | {s['counts'][key]} / {s['total']} | {s['of_all'][key]}% | "
                     f"{s['of_runnable'][key]}% | >= {TARGETS[key]}% |")
    lines += ["", f"cpu-broken (tiny model fails on CPU): {s['cpu_broken']}; torch.compile measured on "
              f"{s['compile_measured']} of {s['total'] - s['cpu_broken']} runnable architectures (the others "
              "count as not passing)."]
    write_section("arch_sweep", "\n".join(lines))
    print(f"wrote {DOC} and the arch_sweep section of benchmarks/RESULTS.md ({len(rows)} architectures)")


def _yes_no(value) -> str:
    return {True: "match", False: "**no**", None: "not run"}[value]


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")[:200]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checks", default="eager,compile", choices=["eager", "eager,compile"],
                        help="eager only (fast pass), or eager and compile; a later compile pass "
                             "fills in architectures cached without it")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes in parallel")
    parser.add_argument("--only", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per architecture")
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="results JSON (resumed from)")
    parser.add_argument("--fresh", action="store_true", help="ignore cached results for the selected architectures")
    parser.add_argument("--write", action="store_true", help="regenerate docs/architectures.md from the cache")
    parser.add_argument("--json", help="also write the selected rows and summary here")
    parser.add_argument("--merge", action="append", default=[], metavar="PATH",
                        help="take rows from another results JSON (a run in parallel) where they carry more "
                             "checks than the cache's")
    parser.add_argument("--moe-variants", action="store_true",
                        help="also run each selected MoE architecture's variants (MOE_VARIANTS)")
    parser.add_argument("--log", help="workers' stderr (default: arch_sweep_workers.log in the temp dir)")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0

    known = all_architectures()
    archs = [a.strip() for a in args.only.split(",") if a.strip()] or known
    unknown = sorted({a for a in archs if a.partition("@")[0] not in known})
    if unknown:
        parser.error(f"--only: unknown model type(s) {unknown}: not in transformers' "
                     f"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (e.g. llama, gpt2, qwen2, mixtral)")
    bad = sorted({a for a in archs if "@" in a and a not in moe_variants(a.partition("@")[0])})
    if bad:
        parser.error(f"--only: unknown MoE variant(s) {bad}: a variant is <model type>@<one of "
                     f"{sorted(MOE_VARIANTS)}> that changes the model type's tiny config")
    if args.moe_variants:
        archs += [v for a in list(archs) for v in moe_variants(a) if v not in archs]
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    cache = {}
    if os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = json.load(f)
    if args.fresh:
        for arch in archs:
            cache.pop(arch, None)
    for path in args.merge:
        merge_cache(cache, path)

    def save():
        tmp = args.cache + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cache, f, indent=1, sort_keys=True)
        os.replace(tmp, args.cache)

    log_path = args.log or os.path.join(tempfile.gettempdir(), "arch_sweep_workers.log")
    with open(log_path, "a") as log:
        sweep(archs, args.checks, args.jobs, args.timeout, cache, save, log)

    rows = [cache[a] for a in archs if a in cache]
    s = summarize(rows)
    print(json.dumps(s, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": s}, f, indent=1, default=str)
    if args.write:
        write_reports([cache[a] for a in known if a in cache])
    return 0


if __name__ == "__main__":
    sys.exit(main())
