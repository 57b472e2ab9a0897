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
_SHRINK = {
    2: ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers",
        "num_decoder_layers", "num_encoder_layers", "num_text_layers", "depth"),
    64: ("hidden_size", "n_embd", "d_model", "n_embed", "embed_dim", "word_embed_proj_dim", "d_embed",
         "intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim", "encoder_ffn_dim", "d_ff",
         "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size",
         "expert_intermediate_size", "dim_ff", "inner_hidden_size", "projection_dim",
         "embedding_size", "hidden_dim", "mlp_dim", "ffn_embed_dim"),
    4: ("num_attention_heads", "n_head", "n_heads", "decoder_attention_heads",
        "encoder_attention_heads", "num_heads", "num_experts", "num_local_experts",
        "n_routed_experts", "moe_num_experts", "num_experts_per_layer"),
    2.0: ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num",
          "num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "topk_group", "n_group"),
    16: ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_channels",
         "attention_head_dim"),
    32: ("kv_lora_rank", "q_lora_rank"),
    512: ("vocab_size", "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len",
          "max_sequence_length"),
    1: ("n_shared_experts", "num_shared_experts"),
}
SHRINK = {name: int(value) for value, names in _SHRINK.items() for name in names}

# Vision/audio towers of multimodal models: small images and patches.
SHRINK.update({"image_size": 32, "patch_size": 8, "num_channels": 3})

TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
                 "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")

# Per-model fixes on top of the generic shrinking: keys (dotted for sub-configs)
# set after it, for configs whose attributes must agree with each other.
OVERRIDES: dict[str, dict] = {}


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
    heads = kwargs.get("num_attention_heads", getattr(config, "num_attention_heads", None))
    for key in ("num_key_value_heads", "num_kv_heads"):
        if key in kwargs or isinstance(getattr(config, key, None), int):
            value = kwargs.get(key, getattr(config, key))
            if isinstance(heads, int) and heads % max(value, 1):
                kwargs[key] = heads
    if "head_dim" in vars(config) and getattr(config, "head_dim", None) is not None:
        hidden = kwargs.get("hidden_size", getattr(config, "hidden_size", None))
        if isinstance(hidden, int) and isinstance(heads, int):
            kwargs["head_dim"] = max(hidden // heads, 8)
    for key in ("layer_types", "mlp_layer_types", "layers_block_type", "block_types", "hybrid_override_pattern"):
        value = getattr(config, key, None)
        layers = kwargs.get("num_hidden_layers")
        if isinstance(value, (list, str)) and layers is not None and len(value) != layers:
            kwargs[key] = _spread(value, layers)
    vocab = kwargs.get("vocab_size", getattr(config, "vocab_size", None))
    if isinstance(vocab, int):
        for key in TOKEN_ID_KEYS:
            if key not in kwargs and key in vars(config):
                kwargs[key] = getattr(config, key)
        _fix_token_ids(kwargs, vocab)
        for key, value in vars(config).items():
            if key.endswith("token_index") or key.endswith("token_id") and key not in TOKEN_ID_KEYS:
                if isinstance(value, int) and value >= vocab:
                    kwargs[key] = vocab - 8 + hash(key) % 4
    return kwargs


def _spread(pattern, layers: int):
    """Keeps one of each distinct layer kind of a per-layer pattern, then repeats."""
    kinds = list(dict.fromkeys(pattern))
    picked = (kinds * layers)[:layers] if len(kinds) < layers else kinds[:layers]
    return "".join(picked) if isinstance(pattern, str) else picked


def tiny_config(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    kwargs = tiny_config_kwargs(cls())
    for key, value in OVERRIDES.get(model_type, {}).items():
        _set_dotted(kwargs, key, value)
    config = cls(**kwargs)
    if model_type in EAGER_ATTENTION:
        config._attn_implementation = "eager"
    return config


def _set_dotted(kwargs: dict, key: str, value) -> None:
    *path, last = key.split(".")
    for part in path:
        kwargs = kwargs.setdefault(part, {})
    kwargs[last] = value


EAGER_ATTENTION: set[str] = set()


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


def run_one(model_type: str) -> dict:
    """Builds the tiny model and runs the three checks; returns a result row."""
    import copy

    import torch
    import torch_neuronx
    from transformers import AutoModelForCausalLM

    result = {"arch": model_type, "status": "ok", "eager_match": False, "fallback_ops": {},
              "compile_match": False, "eager_max_diff": None, "compile_max_diff": None,
              "error": None, "eager_error": None, "compile_error": None}
    start = time.perf_counter()
    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval().float()
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

    torch._dynamo.reset()
    try:
        compiled = torch.compile(neuron_model, backend="neuron", fullgraph=True)
        with torch.no_grad():
            got = _logits(compiled(**neuron_inputs))
        result["compile_match"], result["compile_max_diff"] = _compare(got, expected)
    except Exception as exc:
        result["compile_error"] = _short(exc)
    finally:
        torch._dynamo.reset()
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def worker_main() -> None:
    """Reads model types from stdin, one per line; writes one JSON result line each."""
    os.environ.setdefault("TORCH_NEURONX_FALLBACK", "silent")
    import warnings

    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    out = sys.stdout
    sys.stdout = sys.stderr  # model code that prints must not corrupt the result stream
    for line in sys.stdin:
        model_type = line.strip()
        if not model_type:
            continue
        try:
            row = run_one(model_type)
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

    def send(self, arch: str, timeout: float) -> None:
        self.arch, self.deadline = arch, time.monotonic() + timeout
        self.proc.stdin.write(arch + "\n")
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


def sweep(archs: list[str], jobs: int, timeout: float, cache: dict, save, log) -> None:
    todo = [a for a in archs if a not in cache]
    workers: list[Worker] = []
    busy: dict[int, Worker] = {}
    total, done = len(todo), 0
    while todo or busy:
        while todo and len(busy) < jobs:
            idle = [w for w in workers if w.arch is None]
            worker = idle[0] if idle else Worker(log)
            if not idle:
                workers.append(worker)
            worker.send(todo.pop(0), timeout)
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
                _record({"arch": worker.arch, "status": "timeout", "error": f"no result in {timeout:.0f} s"},
                        cache, save, done, total)
    for worker in workers:
        worker.proc.stdin.close()
        worker.proc.wait()


def _record(row, cache, save, done, total) -> None:
    cache[row["arch"]] = row
    save()
    print(f"[{done}/{total}] {row['arch']}: {verdict(row)}  ({row.get('seconds', '-')} s)", flush=True)


def verdict(row) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error')}"
    parts = ["eager " + ("match" if row["eager_match"] else "MISMATCH/ERROR"),
             f"fallback {len(row['fallback_ops'])}",
             "compile " + ("match" if row["compile_match"] else "FAIL")]
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
        "compile": sum(r["compile_match"] for r in ok),
    }
    return {
        "total": total,
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
        f"- Command: `{command}`",
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
            f"| {row['arch']} | {'match' if row['eager_match'] else '**no**'} | {_fmt(row['eager_max_diff'])} "
            f"| {fb} | {'match' if row['compile_match'] else '**no**'} | {_fmt(row['compile_max_diff'])} "
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


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")[:200]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes in parallel")
    parser.add_argument("--only", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per architecture")
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="results JSON (resumed from)")
    parser.add_argument("--fresh", action="store_true", help="ignore cached results for the selected architectures")
    parser.add_argument("--write", action="store_true", help="regenerate docs/architectures.md from the cache")
    parser.add_argument("--json", help="also write the selected rows and summary here")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0

    known = all_architectures()
    archs = [a.strip() for a in args.only.split(",") if a.strip()] or known
    unknown = sorted(set(archs) - set(known))
    if unknown:
        parser.error(f"--only: unknown model type(s) {unknown}: not in transformers' "
                     f"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (e.g. llama, gpt2, qwen2, mixtral)")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    cache = {}
    if os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = json.load(f)
    if args.fresh:
        for arch in archs:
            cache.pop(arch, None)

    def save():
        tmp = args.cache + ".tmp"
        with open(tmp, "w") as f:
            json.dump(cache, f, indent=1, sort_keys=True)
        os.replace(tmp, args.cache)

    log_path = args.cache + ".log"
    with open(log_path, "a") as log:
        sweep(archs, args.jobs, args.timeout, cache, save, log)

    rows = [cache[a] for a in archs if a in cache]
    s = summarize(rows)
    print(json.dumps(s, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": s}, f, indent=1, default=str)
    if args.write:
        full = [cache[a] for a in known if a in cache]
        command = "python benchmarks/arch_sweep.py --jobs 1 --timeout 120 --write"
        with open(DOC, "w") as f:
            f.write(render_markdown(full, command))
        print(f"wrote {DOC} ({len(full)} architectures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
