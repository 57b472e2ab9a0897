"""The on-disk executable cache (TORCH_NEURONX_NEFF_CACHE_DIR): reuse across
processes, concurrent writers, corrupted entries, and the off switch."""

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, time, torch, torch_neuronx
    from torch_neuronx.compiler import executable, get_dynamo_metrics
    traces = []
    interpret = executable.CompiledGraph._interpret
    def counted(self, *args):
        traces.append(self.name)
        return interpret(self, *args)
    executable.CompiledGraph._interpret = counted  # tracing a graph through the lowering table
    import torch._functorch.aot_autograd as aot
    captures = []
    capture = aot.aot_stage1_graph_capture
    def counted_capture(*args, **kwargs):
        captures.append(1)
        return capture(*args, **kwargs)
    aot.aot_stage1_graph_capture = counted_capture  # AOTAutograd tracing the joint graph
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    model = model.to("neuron")
    compiled = torch.compile(model, backend="neuron")
    x = torch.ones(4, 32, device="neuron")
    start = time.perf_counter()
    out = compiled(x)
    out.sum().backward()
    seconds = time.perf_counter() - start
    m = get_dynamo_metrics()
    print(json.dumps({"sum": out.sum().item(), "disk_hits": m["cache_hits_disk"],
                      "corrupt": m.get("cache_hits_corrupt", 0),
                      "compile_seconds": m["compile_seconds"], "first_call_seconds": seconds,
                      "traces": len(traces), "aot_hits": m["cache_hits_aot"],
                      "aot_traces": len(captures), "grad": model[0].weight.grad.sum().item()}))
    """
)


def run(env_overrides, script=SCRIPT, timeout=300):
    """Runs ``script`` in a fresh process; returns its last stdout line as JSON, and its stderr."""
    env = dict(os.environ, **env_overrides)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture
def cache_dir(tmp_path):
    return {"TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "neff")}


def test_second_process_reuses_graphs_and_survives_corrupted_entries(cache_dir):
    cold, _ = run(cache_dir)
    assert cold["disk_hits"] == 0
    warm, _ = run(cache_dir)
    assert warm["disk_hits"] >= 2  # forward and backward executables
    assert cold["traces"] >= 2 and warm["traces"] == 0  # a disk hit skips tracing and lowering
    # ... and AOTAutograd's joint-graph trace: its result is loaded (compiler/aot_cache.py)
    assert (cold["aot_hits"], cold["aot_traces"]) == (0, 1)
    assert (warm["aot_hits"], warm["aot_traces"]) == (1, 0)
    assert warm["sum"] == pytest.approx(cold["sum"], rel=1e-6)
    assert warm["grad"] == pytest.approx(cold["grad"], rel=1e-6)
    assert warm["compile_seconds"] < cold["compile_seconds"]

    folder = cache_dir["TORCH_NEURONX_NEFF_CACHE_DIR"]
    entries = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith((".neff", ".aot"))]
    assert len(entries) == 3  # forward and backward executables, one AOTAutograd result

    # Executables gone, AOTAutograd result kept: its graphs (stored node by
    # node) are lowered and compiled again.
    for path in entries:
        if path.endswith(".neff"):
            os.remove(path)
    rebuilt, _ = run(cache_dir)
    assert (rebuilt["aot_hits"], rebuilt["aot_traces"], rebuilt["disk_hits"]) == (1, 0, 0)
    assert rebuilt["traces"] >= 2
    assert rebuilt["sum"] == pytest.approx(cold["sum"], rel=1e-6)
    assert rebuilt["grad"] == pytest.approx(cold["grad"], rel=1e-6)
    for i, path in enumerate(entries):
        with open(path, "r+b") as handle:  # truncate one, overwrite bytes in the others
            if i == 0:
                handle.truncate(40)
            else:
                handle.seek(60)
                handle.write(b"\x00garbage\x00")
    again, _ = run(cache_dir)
    assert again["sum"] == pytest.approx(cold["sum"], rel=1e-6)
    assert again["grad"] == pytest.approx(cold["grad"], rel=1e-6)
    assert (again["aot_hits"], again["aot_traces"]) == (0, 1)
    assert again["corrupt"] == len(entries)  # each one detected (and warned about), then recompiled


def test_concurrent_processes_share_the_cache(cache_dir):
    env = dict(os.environ, **cache_dir)
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", SCRIPT], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({round(r["sum"], 4) for r in results}) == 1
    folder = cache_dir["TORCH_NEURONX_NEFF_CACHE_DIR"]
    assert [f for f in os.listdir(folder) if f.startswith(".tmp-")] == []
    assert len([f for f in os.listdir(folder) if f.endswith(".neff")]) >= 2


def test_disable_cache(cache_dir):
    result, _ = run(dict(cache_dir, TORCH_NEURONX_NEFF_DISABLE_CACHE="1"))
    assert result["disk_hits"] == 0
    folder = cache_dir["TORCH_NEURONX_NEFF_CACHE_DIR"]
    assert not os.path.exists(folder) or not os.listdir(folder)


def test_entry_from_an_incompatible_build_is_discarded(tmp_path, monkeypatch):
    """An entry whose checksum is right but whose payload does not load (written
    by another version) is reported, removed and treated as a miss."""
    from torch_neuronx.compiler import cache, metrics

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    metrics.reset()
    key = cache.graph_key([b"not a real graph"])
    cache._write(tmp_path / (key + ".neff"), b"payload of some other format")
    with pytest.warns(UserWarning, match="could not be loaded"):
        assert cache.load(key) is None
    assert not (tmp_path / (key + ".neff")).exists()
    assert metrics.snapshot()["cache_hits_corrupt"] == 1


UNUSABLE_SCRIPT = textwrap.dedent(
    """
    import warnings, torch, torch_neuronx
    warnings.simplefilter("always")
    fn = lambda x: torch.sin(x) * 2 + 1
    compiled = torch.compile(fn, backend="neuron")
    x = torch.linspace(-3, 3, 64)
    with warnings.catch_warnings(record=True) as caught:
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), fn(x), rtol=1e-6, atol=1e-6)
    messages = [str(w.message) for w in caught if "compiled-graph cache" in str(w.message)]
    print(len(messages)); print(messages[0] if messages else "")
    """
)


def test_an_unusable_cache_directory_warns_once_and_compiles_without_it(tmp_path):
    """A cache path that cannot be a directory (here under a regular file; the
    same path a read-only or full disk takes) costs the disk cache, not the run."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=str(blocker / "neff"))
    proc = subprocess.run([sys.executable, "-c", UNUSABLE_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, message = proc.stdout.strip().splitlines()[-2:]
    assert count == "1"  # once per directory, though reads and writes of several entries fail
    assert "cannot read the compiled-graph cache" in message or "cannot write to" in message
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" in message and "TORCH_NEURONX_NEFF_DISABLE_CACHE=1" in message


def test_a_full_disk_costs_the_entry_not_the_compile(tmp_path, monkeypatch):
    import errno

    from torch_neuronx.compiler import cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "full"))
    monkeypatch.setattr(cache, "_warned_unusable", set())

    def no_space(path, payload):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "_write", no_space)
    with pytest.warns(UserWarning, match="cannot write to the compiled-graph cache.*No space left"):
        cache.store_bytes("k", ".neff", b"payload")
    assert cache.load_bytes("k", ".neff") is None


# ---------------------------------------------------------------- size limit (eviction)
def _entry_at(cache, key, suffix, size, mtime):
    """Stores a `size`-byte payload under key and dates it `mtime`."""
    cache.store_bytes(key, suffix, b"x" * size)
    os.utime(cache._path(key, suffix), (mtime, mtime))


def test_least_recently_used_entries_are_evicted_over_the_size_limit(tmp_path, monkeypatch):
    from torch_neuronx.compiler import cache, metrics

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", "-1")
    metrics.reset()
    entry = 1000 + 40  # payload plus the header (magic + checksum)
    for i, suffix in enumerate([".neff", ".aot", ".neff", ".aot"]):
        _entry_at(cache, f"e{i}", suffix, 1000, mtime=1_000_000 + i)
    assert cache.load_bytes("e0", ".neff") is not None  # a hit: e0 becomes the most recent
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("not an entry")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", str(3 * entry))
    cache.store_bytes("e4", ".neff", b"x" * 1000)  # 5 entries, room for 3: e1 and e2 go
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["e0.neff", "e3.aot", "e4.neff", "notes.txt"]
    snapshot = metrics.snapshot()
    assert snapshot["cache_evictions"] == 2
    assert cache.load_bytes("e1", ".aot") is None  # evicted: a plain miss, no warning
    assert metrics.snapshot()["cache_hits_corrupt"] == 0


def test_the_entry_just_written_is_kept_even_above_the_limit(tmp_path, monkeypatch):
    from torch_neuronx.compiler import cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", "1K")
    _entry_at(cache, "old", ".neff", 100, mtime=1_000_000)
    cache.store_bytes("big", ".neff", b"x" * 5000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.neff"]
    assert cache.load_bytes("big", ".neff") == b"x" * 5000


def test_stale_temporary_files_of_killed_writers_are_removed(tmp_path, monkeypatch):
    from torch_neuronx.compiler import cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    stale, fresh = tmp_path / ".tmp-stale.neff", tmp_path / ".tmp-fresh.neff"
    stale.write_bytes(b"half an entry")
    fresh.write_bytes(b"being written right now")
    os.utime(stale, (1_000_000, 1_000_000))
    cache.store_bytes("k", ".neff", b"payload")
    assert not stale.exists() and fresh.exists()


@pytest.mark.parametrize("value, expected", [("", 10 * 2**30), ("500M", 500 * 2**20), ("1.5GiB", 3 * 2**29),
                                             ("2kb", 2048), ("123", 123), ("-1", None), ("unlimited", None)])
def test_cache_size_limit_values(monkeypatch, value, expected):
    from torch_neuronx.compiler import cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", value)
    assert cache.max_size() == expected


def test_a_malformed_cache_size_limit_is_a_clear_error(tmp_path, monkeypatch):
    from torch_neuronx.compiler import cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_MAX_SIZE", "10 gigs")
    with pytest.raises(ValueError, match=r"TORCH_NEURONX_NEFF_CACHE_MAX_SIZE='10 gigs' is not a size.*500M"):
        cache.store_bytes("k", ".neff", b"payload")


def test_training_under_a_tiny_cache_limit_stays_correct(cache_dir):
    """With room for one entry, every write evicts the others: each process
    still computes the same numbers, and the directory stays at one entry."""
    env = dict(cache_dir, TORCH_NEURONX_NEFF_CACHE_MAX_SIZE="1")
    first, _ = run(env)
    second, _ = run(env)
    assert (first["sum"], first["grad"]) == (second["sum"], second["grad"])
    folder = cache_dir["TORCH_NEURONX_NEFF_CACHE_DIR"]
    assert len([f for f in os.listdir(folder) if f.endswith((".neff", ".aot"))]) == 1


EFFECTS_SCRIPT = textwrap.dedent(
    """
    import torch, torch_neuronx
    a = torch.eye(4) * 3 + 1
    fn = lambda m: torch.linalg.inv(m) + torch.linalg.cholesky(m)
    out = torch.compile(fn, backend="neuron", fullgraph=True)(a.to("neuron"))
    torch.testing.assert_close(out.cpu(), fn(a), rtol=1e-5, atol=1e-5)
    print("ok")
    """
)


def test_graphs_with_effect_tokens_run_in_a_warm_process(cache_dir):
    """linalg error checks give graphs a None effect-token input; such graphs are
    compiled in every process (a deserialized jax executable called with None
    crashed the process in a warm start)."""
    env = dict(os.environ, **cache_dir)
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-W", "ignore", "-c", EFFECTS_SCRIPT], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ---------------------------------------------------------------- AOTAutograd result cache
def _aot_config():
    from torch._functorch.aot_autograd import AOTConfig

    return AOTConfig(fw_compiler=None, bw_compiler=None, partition_fn=None, decompositions={},
                     num_params_buffers=0, aot_id=0, keep_inference_input_mutations=True)


def _graph(fn):
    import torch.fx

    return torch.fx.symbolic_trace(fn)


def test_aot_result_key_covers_what_tracing_depends_on():
    import torch

    from torch_neuronx.compiler import aot_cache

    gm = _graph(lambda x, y: torch.add(x, y))
    x, y = torch.ones(4, 3), torch.ones(4, 3)

    def key(*args, graph=gm):
        return aot_cache.key(graph, list(args), _aot_config())

    base = key(x, y)
    assert base is not None and base == key(torch.zeros(4, 3), torch.zeros(4, 3))  # values are not in it
    variants = {
        "shape": key(torch.ones(2, 3), torch.ones(2, 3)),
        "dtype": key(x.double(), y.double()),
        "stride": key(torch.ones(3, 4).t(), y),
        "requires_grad": key(x.clone().requires_grad_(), y),
        "aliasing": key(x, x),
        "code": key(x, y, graph=_graph(lambda x, y: torch.mul(x, y))),
    }
    with torch.no_grad():
        variants["grad mode"] = key(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        variants["autocast"] = key(x, y)
    assert {name: k for name, k in variants.items() if k == base} == {}
    assert len(set(variants.values())) == len(variants)


def _user_function(x):
    return x * 2


def test_aot_result_of_a_graph_calling_python_code_is_not_cached():
    """A call_function on arbitrary Python code: its name does not decide what
    it computes, so the graph gets no key (AOTAutograd runs as usual)."""
    import torch
    import torch.fx

    from torch_neuronx.compiler import aot_cache

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(_user_function, (x,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert aot_cache.key(gm, [torch.ones(3)], _aot_config()) is None


def test_aot_result_from_an_incompatible_build_is_discarded(tmp_path, monkeypatch):
    import torch

    from torch_neuronx.compiler import aot_cache, cache, metrics

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    metrics.reset()
    gm = _graph(lambda x: torch.neg(x))
    args = [torch.ones(3)]
    key = aot_cache.key(gm, args, _aot_config())
    cache.store_bytes(key, ".aot", b"not a pickle")
    with pytest.warns(UserWarning, match="could not be loaded"):
        compiled, config = aot_cache._try_load(gm, args, _aot_config(), None, True, False)
    assert compiled is None and config.cache_info.cache_key == key  # a miss that will save its result
    assert not (tmp_path / (key + ".aot")).exists()
    assert metrics.snapshot()["cache_hits_corrupt"] == 1


RANDOM_SCRIPT = textwrap.dedent(
    """
    import json, torch, torch_neuronx
    f = lambda x: torch.empty_like(x).uniform_(-1, 2) + torch.rand_like(x) + x
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    x = torch.zeros(64, device="neuron")
    torch.manual_seed(7)
    a = compiled(x).cpu()
    torch.manual_seed(7)
    b = compiled(x).cpu()
    c = compiled(x).cpu()
    print(json.dumps({"a": a.tolist(), "reseeded": torch.equal(a, b), "next_differs": not torch.equal(a, c),
                      "aot_hits": torch_neuronx.get_dynamo_metrics()["cache_hits_aot"]}))
    """
)


def test_random_graphs_from_the_aot_result_cache_stay_random(cache_dir):
    """A stored graph is rebuilt node by node: rebuilding it by tracing its code
    would run `uniform_(empty(...))` once at load time (drawing from the
    generator) and keep the numbers as a constant."""
    cold, _ = run(cache_dir, RANDOM_SCRIPT)
    warm, _ = run(cache_dir, RANDOM_SCRIPT)
    folder = cache_dir["TORCH_NEURONX_NEFF_CACHE_DIR"]
    for name in os.listdir(folder):
        if name.endswith(".neff"):
            os.remove(os.path.join(folder, name))
    rebuilt, _ = run(cache_dir, RANDOM_SCRIPT)  # the stored graph lowered and compiled again
    assert [cold["aot_hits"], warm["aot_hits"], rebuilt["aot_hits"]] == [0, 1, 1]
    for result in (cold, warm, rebuilt):
        assert result["reseeded"] and result["next_differs"]
        assert result["a"] == cold["a"]  # same seed, same numbers, in every process


def test_fx_graph_round_trips_node_by_node():
    import pickle

    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from torch_neuronx.compiler import fx_pickle

    constant = torch.tensor([1.0, -2.0, 3.0])

    def fn(x):
        values, indices = x.max(dim=0)  # operator.getitem nodes
        return values * constant + torch.ones(3, dtype=torch.int64) + indices, torch.empty(3).uniform_()

    gm = make_fx(fn)(torch.randn(4, 3))
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    rebuilt = fx_pickle.loads_state(pickle.loads(pickle.dumps(fx_pickle.dumps_state(gm))))
    assert rebuilt.code == gm.code
    x = torch.randn(4, 3)
    torch.testing.assert_close(rebuilt(x)[0], gm(x)[0], rtol=0, atol=0)
    assert any("uniform" in str(n.target) for n in rebuilt.graph.nodes)  # still a draw, not a constant


# ---------------------------------------------------------------- warm starts of every kind of graph
WARM_START_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, torch, torch_neuronx
    from torch._higher_order_ops.scan import scan
    from torch_neuronx.compiler import get_dynamo_metrics

    def t(*shape, seed=0):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

    def square(n, seed=0):  # well conditioned: LU and triangular solves stay accurate
        return t(n, n, seed=seed) + n * torch.eye(n)

    a, b = square(5), t(5, 3, seed=1)
    lu, pivots = torch.linalg.lu_factor(a)
    qr_input, tau = torch.geqrf(t(5, 3, seed=2))

    def running_sum(x):
        def combine(carry, row):
            return carry + row, (carry + row) * 2
        last, rows = scan(combine, torch.zeros_like(x[0]), x)
        return rows.sum(0) + last

    CASES = {  # name: (function, inputs, tolerance)
        "qr": (lambda x: torch.linalg.qr(x), [a], 1e-5),
        "lu": (lambda x: torch.lu(x), [a], 1e-5),
        "lu_solve": (lambda lu, p, b: torch.linalg.lu_solve(lu, p, b), [lu, pivots, b], 1e-5),
        "triangular_solve": (lambda b, a: torch.triangular_solve(b, a, upper=False), [b, a.tril()], 1e-5),
        "matrix_exp": (lambda x: torch.linalg.matrix_exp(x * 0.1), [a], 1e-5),
        "ormqr": (lambda q, tau, c: torch.ormqr(q, tau, c), [qr_input, tau, t(5, 2, seed=3)], 1e-5),
        "fft": (lambda x: (torch.fft.fft(x), torch.fft.rfft(x), torch.fft.irfft(torch.fft.rfft(x)), torch.fft.fft2(x)),
                [t(4, 8)], 1e-5),
        "cond": (lambda x: torch.cond(x.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos() - 1, (x,)), [t(5, 3)], 1e-6),
        "scan": (running_sum, [t(5, 3)], 1e-6),
        # outputs of every kind: views, aliases of one buffer, bool, integer, bfloat16, 0-d, empty
        "outputs": (lambda x: ((x * 2).t(), (x + 1)[1:], x > 0, x.to(torch.int64), x.to(torch.bfloat16), x.sum(),
                               x[:0] * 3, *(lambda y: (y, y, y.view(-1)))(x - 1)), [t(4, 6)], 1e-2),
    }

    results = {}
    for name, (fn, inputs, tol) in CASES.items():
        before = get_dynamo_metrics()["cache_hits_disk"]
        out = torch.compile(fn, backend="neuron", fullgraph=True)(*[i.to("neuron") for i in inputs])
        out = [o.cpu() for o in (out if isinstance(out, (tuple, list)) else [out])]
        torch.testing.assert_close(out, list(fn(*inputs)) if isinstance(fn(*inputs), (tuple, list)) else [fn(*inputs)],
                                   rtol=tol, atol=tol)
        results[name] = {"hits": get_dynamo_metrics()["cache_hits_disk"] - before,
                         "sha": hashlib.sha256(b"".join(o.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                                                        for o in out)).hexdigest()}

    # random ops: no CPU reference for the numbers (another generator), only their range
    def draws(x):
        return (torch.empty_like(x).uniform_(-1, 2), torch.rand_like(x), torch.randn_like(x),
                torch.nn.functional.dropout(x + 1, 0.5), torch.multinomial(x[:8] + 1, 4))  # XLA's TopK
    torch.manual_seed(7)
    before = get_dynamo_metrics()["cache_hits_disk"]
    out = [o.cpu() for o in torch.compile(draws, backend="neuron", fullgraph=True)(torch.zeros(256, device="neuron"))]
    assert out[0].min() >= -1 and out[0].max() < 2 and out[1].min() >= 0 and out[1].max() < 1
    assert set(out[3].unique().tolist()) <= {0.0, 2.0}
    assert out[4].unique().numel() == 4 and out[4].min() >= 0 and out[4].max() < 8
    results["random"] = {"hits": get_dynamo_metrics()["cache_hits_disk"] - before, "values": [o.tolist() for o in out]}

    # a tiny Qwen3.5: a linear-attention (gated delta rule, LAPACK triangular solves) and a full-attention layer
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(
        "qwen3_5_text", vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        expected = model(ids).logits
        before = get_dynamo_metrics()["cache_hits_disk"]
        logits = torch.compile(model.to("neuron"), backend="neuron", fullgraph=True)(ids.to("neuron")).logits.cpu()
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    results["qwen3_5"] = {"hits": get_dynamo_metrics()["cache_hits_disk"] - before, "values": logits.tolist()}
    print(json.dumps(results))
    """
)


def test_a_second_process_runs_every_kind_of_graph_from_the_disk_cache(cache_dir):
    """A warm start loads executables without lowering them: whatever lowering
    prepares in the process (jaxlib's LAPACK function pointers, set while a
    linalg op is lowered) must be prepared before a loaded executable runs. It
    segfaulted for every graph with a LAPACK call (QR, LU, triangular solves,
    matrix_exp, ormqr, Qwen3.5's linear attention). Each graph: the same
    results in both processes, matching CPU PyTorch, and loaded from disk."""
    cold, _ = run(cache_dir, WARM_START_SCRIPT, timeout=600)
    warm, _ = run(cache_dir, WARM_START_SCRIPT, timeout=600)
    assert {name: result["hits"] for name, result in cold.items()} == dict.fromkeys(cold, 0)
    assert {name: result["hits"] for name, result in warm.items()} == dict.fromkeys(cold, 1)
    for result in (*cold.values(), *warm.values()):
        del result["hits"]
    assert warm == cold


def test_executables_are_stored_with_the_custom_calls_a_warm_start_prepares(tmp_path, monkeypatch):
    """An executable calling a custom-call target that a warm start cannot
    prepare (here a Python host callback) is not stored: it is compiled in
    every process instead of crashing one. A LAPACK one is stored with its
    targets, which loading prepares."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from torch_neuronx.compiler import cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    x = jnp.eye(3, dtype=jnp.float32) * 2

    def host(v):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

    cache.store("callback", jax.jit(host).lower(x).compile())
    assert not (tmp_path / "callback.neff").exists()
    cache.store("qr", jax.jit(jnp.linalg.qr).lower(x).compile())
    targets = pickle.loads(cache.load_bytes("qr", ".neff"))[3]
    assert targets and all(name.startswith("lapack_") for name in targets)
    q, r = cache.load("qr")(x)
    np.testing.assert_allclose(np.asarray(q @ r), np.asarray(x), rtol=1e-6, atol=1e-6)


def test_a_decomposition_changed_outside_lowering_and_compiler_changes_the_key(tmp_path, monkeypatch):
    """An upgrade that changes only ops/float8.py (the _scaled_mm_v2
    decomposition compiler/aot.py applies) must not load executables built by
    the old code: the key covers every source file of the package."""
    import pathlib
    import shutil

    import torch_neuronx
    from torch_neuronx.compiler import cache

    package = pathlib.Path(torch_neuronx.__file__).parent
    copy = tmp_path / "torch_neuronx"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    decompositions = copy / "ops" / "float8.py"
    assert decompositions in cache.package_sources(copy)

    def key_of(root: pathlib.Path) -> str:
        monkeypatch.setattr(torch_neuronx, "__file__", str(root / "__init__.py"))
        cache._toolchain_fingerprint.cache_clear()
        return cache.graph_key([b"the same graph"])

    try:
        installed, copied = key_of(package), key_of(copy)
        text = decompositions.read_text()
        old = "return torch.ops.aten._scaled_mm.default(*scaled_mm_v2_as_v1(*args, **kwargs))"
        assert old in text
        decompositions.write_text(text.replace(old, "out = " + old[len("return "):] + "\n    return out"))
        changed = key_of(copy)
    finally:
        cache._toolchain_fingerprint.cache_clear()
    assert installed == copied  # same sources, same key (the digest names files relative to the package)
    assert changed != copied
