"""The architecture sweep script (benchmarks/arch_sweep.py) on a handful of
architectures: it runs them in worker subprocesses, and the dense ones and a
MoE one pass (eager logits match CPU with atol 1e-4 / rtol 1e-3, no CPU
fallback op, and for one of them torch.compile fullgraph matches too), and a
few MoE variants (other expert counts, top-k, shared experts, dense-first
layers) compiled. The full sweep is too heavy for the test suite;
docs/architectures.md holds it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "arch_sweep.py"
EAGER_ARCHS = ["llama", "gpt2", "qwen2", "llama4_text"]  # llama4_text: a MoE
COMPILE_ARCH = "gpt2"  # the fastest to trace; the compile pass covers the rest


def _sweep(tmp_path, *args, timeout=300):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cache", str(tmp_path / "cache.json"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    return proc


def _load_script():
    spec = importlib.util.spec_from_file_location("arch_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def eager_rows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    out = tmp / "rows.json"
    proc = _sweep(tmp, "--only", ",".join(EAGER_ARCHS), "--checks", "eager", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc, {row["arch"]: row for row in json.loads(out.read_text())["rows"]}


@pytest.mark.parametrize("arch", EAGER_ARCHS)
def test_eager_matches_cpu_without_fallback(eager_rows, arch):
    _, _, rows = eager_rows
    row = rows[arch]
    assert row["status"] == "ok", row
    assert row["eager_error"] is None, row["eager_error"]
    assert row["eager_match"] is True, row["eager_max_diff"]
    assert row["fallback_ops"] == {}
    assert row["compile_match"] is None  # --checks eager does not compile
    assert row["params"] > 0


def test_rerun_resumes_from_the_cache(eager_rows):
    # In-process: with every architecture cached, sweep() starts no worker.
    tmp, _, rows = eager_rows
    sweep = _load_script()
    cache = json.loads((tmp / "cache.json").read_text())
    assert set(cache) == set(EAGER_ARCHS) and cache == rows
    saved = []
    sweep.sweep(EAGER_ARCHS, "eager", 1, 10.0, cache, lambda: saved.append(1), log=None)
    assert saved == []  # nothing ran, nothing rewritten
    # a compile pass reruns what was cached without compile, and only that
    assert all(sweep._needs_run(cache[a], "eager,compile") for a in EAGER_ARCHS)
    assert not any(sweep._needs_run(cache[a], "eager") for a in EAGER_ARCHS)
    assert sweep._needs_run(None, "eager")


def test_compile_fullgraph_matches_cpu(eager_rows):
    tmp, _, _ = eager_rows
    out = tmp / "compile.json"
    proc = _sweep(tmp, "--only", COMPILE_ARCH, "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["compile_error"] is None, row["compile_error"]
    assert row["compile_match"] is True, row["compile_max_diff"]
    assert row["eager_match"] is True


def test_unknown_architecture_is_an_actionable_error(tmp_path):
    proc = _sweep(tmp_path, "--only", "llama,not_a_model", timeout=120)
    assert proc.returncode == 2
    assert "not_a_model" in proc.stderr and "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES" in proc.stderr
    assert not (tmp_path / "cache.json").exists()


def test_tiny_configs_are_tiny():
    sweep = _load_script()
    for arch in ("llama", "gpt2", "qwen2_moe", "gemma3"):
        config = sweep.tiny_config(arch)
        text = config.get_text_config()
        assert text.vocab_size <= 512
        layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer")
        hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd")
        assert layers <= 2 and hidden <= 64, (arch, layers, hidden)
    moe = sweep.tiny_config("qwen2_moe")
    assert moe.num_experts <= 4 and moe.num_experts_per_tok <= 2


def test_summary_counts_every_architecture():
    sweep = _load_script()
    rows = [
        {"arch": "a", "status": "ok", "eager_match": True, "fallback_ops": {}, "eager_error": None,
         "compile_match": True},
        {"arch": "b", "status": "ok", "eager_match": False, "fallback_ops": {"aten::foo": 2},
         "eager_error": None, "compile_match": None},
        {"arch": "c", "status": "cpu-broken", "error": "x"},
        {"arch": "d", "status": "timeout", "error": "y"},
    ]
    s = sweep.summarize(rows)
    assert s["counts"] == {"eager": 1, "zero_fallback": 1, "compile": 1}
    assert s["of_all"] == {"eager": 25.0, "zero_fallback": 25.0, "compile": 25.0}
    assert s["of_runnable"]["eager"] == round(100 / 3, 1)  # c is left out, the timeout is not
    assert s["cpu_broken"] == 1 and s["compile_measured"] == 1
    assert sweep.fallback_census(rows) == {"aten::foo": 1}


def test_constant_router_weights_are_redrawn():
    # A zero-initialized MoE router makes every expert score equal; CPU and XLA
    # break top-k ties differently, so the sweep redraws such matrices.
    import torch

    sweep = _load_script()
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False), torch.nn.LayerNorm(2))
    with torch.no_grad():
        model[1].weight.zero_()
    kept = model[0].weight.clone()
    assert sweep._redraw_constant_matrices(model) == ["1.weight"]
    assert model[1].weight.std() > 0
    assert torch.equal(model[0].weight, kept)  # random matrices and 1-D norms are left alone
    assert torch.equal(model[2].weight, torch.ones(2))


MOE_VARIANT_ROWS = ["afmoe@e8k4", "ernie4_5_moe@all_moe", "qwen2_moe@dense_first", "deepseek_v3@shared2"]


def test_moe_architectures_have_several_configs():
    # expert count, top-k, shared experts, dense-first layers: whichever the config has
    sweep = _load_script()
    for arch in ("afmoe", "ernie4_5_moe", "qwen2_moe", "deepseek_v3", "glm4_moe", "mixtral"):
        variants = sweep.moe_variants(arch)
        assert len(variants) >= 2, (arch, variants)
        base = sweep.tiny_config(arch).to_dict()
        for name in variants:
            changed = {k for k, v in sweep.tiny_config(name).to_dict().items() if base.get(k) != v}
            assert changed, name
    moe = sweep.tiny_config("deepseek_v3@e8k1")
    assert (moe.n_routed_experts, moe.num_experts_per_tok) == (8, 1)
    assert sweep.tiny_config("qwen2_moe@dense_first").mlp_only_layers == [0]
    assert sweep.tiny_config("ernie4_5_moe@all_moe").moe_layer_start_index == 0
    assert sweep.moe_variants("llama") == []


def test_moe_variants_compile_fullgraph_and_match_cpu(tmp_path):
    out = tmp_path / "variants.json"
    proc = _sweep(tmp_path, "--only", ",".join(MOE_VARIANT_ROWS), "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["arch"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(MOE_VARIANT_ROWS)
    for name, row in rows.items():
        assert row["eager_match"] is True and row["fallback_ops"] == {}, (name, row)
        assert row["compile_match"] is True, (name, row["compile_error"], row["compile_max_diff"])


def test_unknown_moe_variant_is_an_actionable_error(tmp_path):
    proc = _sweep(tmp_path, "--only", "llama@e8k1", timeout=120)
    assert proc.returncode == 2
    assert "llama@e8k1" in proc.stderr and "MoE variant" in proc.stderr
