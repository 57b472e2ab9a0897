"""RNG of the neuron device (issue item 5): one default generator per core,
independent of the CPU generator; seeding, state round trips, and random ops
that draw from the device generator (never through the CPU fallback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_neuronx

needs_two = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs 2 NeuronCores")


def _draw(device: str = "neuron") -> torch.Tensor:
    return torch.randn(64, device=device).cpu()


# Every random op of the issue, on the default generator of the current core.
RANDOM_OPS = {
    "randn": lambda: torch.randn(256, device="neuron"),
    "rand": lambda: torch.rand(256, device="neuron"),
    "randint": lambda: torch.randint(0, 1000, (256,), device="neuron"),
    "normal_": lambda: torch.empty(256, device="neuron").normal_(2.0, 3.0),
    "uniform_": lambda: torch.empty(256, device="neuron").uniform_(-1.0, 1.0),
    "bernoulli": lambda: torch.bernoulli(torch.full((256,), 0.5, device="neuron")),
    "bernoulli_p": lambda: torch.empty(256, device="neuron").bernoulli_(0.3),
    "dropout": lambda: torch.nn.functional.dropout(torch.ones(256, device="neuron"), 0.5, training=True),
    "multinomial": lambda: torch.multinomial(torch.ones(64, device="neuron"), 32),
    "randperm_generator": lambda: torch.randperm(
        256, device="neuron", generator=torch.neuron.default_generators[torch.neuron.current_device()]),
    "randn_like": lambda: torch.randn_like(torch.zeros(256, device="neuron")),
    "exponential_": lambda: torch.empty(256, device="neuron").exponential_(),
}


@pytest.fixture(autouse=True)
def _reseed():
    cpu_state = torch.get_rng_state()
    neuron_states = torch.neuron.get_rng_state_all()
    yield
    torch.set_rng_state(cpu_state)
    torch.neuron.set_rng_state_all(neuron_states)


def test_default_generators():
    gens = torch.neuron.default_generators
    assert len(gens) == torch.neuron.device_count()
    for index, gen in enumerate(gens):
        assert gen.device == torch.device("neuron", index)
    assert gens[0] is not torch.default_generator
    with pytest.raises(IndexError):
        gens[torch.neuron.device_count()]


def test_drawing_on_neuron_does_not_advance_cpu_rng():
    torch.manual_seed(7)
    cpu_state = torch.get_rng_state()
    for op in RANDOM_OPS.values():
        op()
    assert torch.equal(torch.get_rng_state(), cpu_state)
    expected = torch.randn(16)
    torch.set_rng_state(cpu_state)
    torch.randn(64, device="neuron")
    assert torch.equal(torch.randn(16), expected)


def test_drawing_on_cpu_does_not_advance_neuron_rng():
    torch.neuron.manual_seed(11)
    state = torch.neuron.get_rng_state()
    torch.randn(1000)
    torch.rand(10)
    torch.randperm(50)
    torch.nn.functional.dropout(torch.ones(100), 0.5, training=True)
    assert torch.equal(torch.neuron.get_rng_state(), state)


def test_manual_seed_reproduces():
    torch.neuron.manual_seed(1234)
    a = _draw()
    torch.neuron.manual_seed(1234)
    b = _draw()
    torch.neuron.manual_seed(1235)
    c = _draw()
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.neuron.initial_seed() == 1235


def test_torch_manual_seed_seeds_every_core():
    torch.manual_seed(99)
    first = [_draw(f"neuron:{i}") for i in range(torch.neuron.device_count())]
    assert torch.neuron.initial_seed() == 99
    assert all(g.initial_seed() == 99 for g in torch.neuron.default_generators)
    torch.manual_seed(99)
    again = [_draw(f"neuron:{i}") for i in range(torch.neuron.device_count())]
    for x, y in zip(first, again):
        assert torch.equal(x, y)


def test_cpu_seed_alone_does_not_change_device_numbers():
    torch.neuron.manual_seed(5)
    torch.default_generator.manual_seed(1)
    a = _draw()
    torch.neuron.manual_seed(5)
    torch.default_generator.manual_seed(2)
    b = _draw()
    assert torch.equal(a, b)


@needs_two
def test_generators_are_per_core():
    torch.neuron.manual_seed_all(3)
    state1 = torch.neuron.get_rng_state(1)
    with torch.neuron.device(0):
        torch.neuron.manual_seed(4)  # seeds the current core only
        _draw("neuron:0")
    assert torch.equal(torch.neuron.get_rng_state(1), state1)
    assert torch.neuron.default_generators[0].initial_seed() == 4
    assert torch.neuron.default_generators[1].initial_seed() == 3
    _draw("neuron:1")
    assert not torch.equal(torch.neuron.get_rng_state(1), state1)
    # the same seed on two cores gives the same sequence
    torch.neuron.manual_seed_all(21)
    assert torch.equal(_draw("neuron:0"), _draw("neuron:1"))


def test_seed_and_seed_all():
    torch.neuron.seed()
    s1 = torch.neuron.initial_seed()
    torch.neuron.seed()
    s2 = torch.neuron.initial_seed()
    assert s1 != s2  # non-deterministic seeds; equal with probability 2**-64
    torch.neuron.seed_all()
    seeds = {g.initial_seed() for g in torch.neuron.default_generators}
    assert len(seeds) == 1


def test_rng_state_round_trip():
    torch.neuron.manual_seed(2024)
    _draw()
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    first = {name: op().cpu() for name, op in RANDOM_OPS.items()}
    torch.neuron.set_rng_state(state)
    second = {name: op().cpu() for name, op in RANDOM_OPS.items()}
    for name in RANDOM_OPS:
        assert torch.equal(first[name], second[name]), name
    assert torch.equal(torch.neuron.get_rng_state("neuron:0"), torch.neuron.get_rng_state(0))


def test_rng_state_all_round_trip():
    torch.neuron.manual_seed_all(8)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    before = [_draw(f"neuron:{i}") for i in range(torch.neuron.device_count())]
    torch.neuron.set_rng_state_all(states)
    after = [_draw(f"neuron:{i}") for i in range(torch.neuron.device_count())]
    for x, y in zip(before, after):
        assert torch.equal(x, y)


def test_set_rng_state_copies_the_state():
    torch.neuron.manual_seed(12)
    state = torch.neuron.get_rng_state()
    kept = state.clone()
    torch.neuron.set_rng_state(state)
    state.zero_()  # mutating the caller's tensor afterwards changes nothing
    a = _draw()
    torch.neuron.set_rng_state(kept)
    assert torch.equal(_draw(), a)


def test_fork_rng_with_device_type_neuron():
    torch.neuron.manual_seed(17)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        inside = _draw()
    outside = _draw()
    assert torch.equal(inside, outside)


def test_explicit_generator():
    g = torch.Generator("neuron")
    assert g.device == torch.device("neuron", 0)
    g.manual_seed(42)
    a = torch.randn(32, device="neuron", generator=g).cpu()
    default_state = torch.neuron.get_rng_state()
    g.manual_seed(42)
    b = torch.randn(32, device="neuron", generator=g).cpu()
    assert torch.equal(a, b)
    assert torch.equal(torch.neuron.get_rng_state(), default_state)  # default untouched
    state = g.get_state()
    c = torch.rand(8, device="neuron", generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(8, device="neuron", generator=g).cpu(), c)
    g2 = torch.Generator(device="neuron")
    g2.manual_seed(42)
    assert torch.equal(torch.randn(32, device="neuron", generator=g2).cpu(), a)
    assert g.initial_seed() == 42


@needs_two
def test_generator_on_another_core():
    g = torch.Generator("neuron:1")
    assert g.device == torch.device("neuron", 1)
    g.manual_seed(0)
    x = torch.randn(4, device="neuron:1", generator=g)
    assert x.device.index == 1


def test_cpu_generator_for_a_device_op_is_an_error():
    with pytest.raises(RuntimeError, match="Expected a 'neuron' generator"):
        torch.randn(4, device="neuron", generator=torch.Generator())


@pytest.mark.parametrize("name", sorted(RANDOM_OPS))
def test_random_op_uses_the_device_generator(name):
    op = RANDOM_OPS[name]
    torch_neuronx.clear_op_tracking()
    torch.neuron.manual_seed(31)
    torch.default_generator.manual_seed(1)
    a = op()
    torch.neuron.manual_seed(31)
    torch.default_generator.manual_seed(2)  # CPU seed differs: must not matter
    b = op()
    torch.neuron.manual_seed(32)
    c = op()
    assert a.device.type == "neuron"
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), c.cpu())
    assert torch_neuronx.get_fallback_ops() == {}, "random ops must not take the CPU fallback"


def test_randperm_without_generator_uses_the_device_generator():
    torch.manual_seed(0)
    cpu_state = torch.get_rng_state()
    torch.neuron.manual_seed(31)
    a = torch.randperm(256, device="neuron").cpu()
    assert torch.equal(torch.get_rng_state(), cpu_state)
    torch.neuron.manual_seed(31)
    torch.default_generator.manual_seed(5)
    assert torch.equal(torch.randperm(256, device="neuron").cpu(), a)


def test_random_ops_have_the_right_distributions():
    torch.neuron.manual_seed(0)
    n = 200_000
    x = torch.randn(n, device="neuron").cpu()
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01  # ~4 sigma
    u = torch.rand(n, device="neuron").cpu()
    assert u.min().item() >= 0 and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.005
    y = torch.empty(n, device="neuron").normal_(2.0, 3.0).cpu()
    assert abs(y.mean().item() - 2) < 0.03 and abs(y.std().item() - 3) < 0.03
    r = torch.randint(3, 10, (n,), device="neuron").cpu()
    assert r.dtype == torch.int64 and set(r.unique().tolist()) == set(range(3, 10))
    bern = torch.bernoulli(torch.full((n,), 0.25, device="neuron")).cpu()
    assert set(bern.unique().tolist()) <= {0.0, 1.0} and abs(bern.mean().item() - 0.25) < 0.005
    perm = torch.randperm(1000, device="neuron").cpu()
    assert torch.equal(perm.sort().values, torch.arange(1000))
    assert not torch.equal(perm, torch.arange(1000))
    weights = torch.tensor([0.0, 1.0, 3.0, 0.0])
    draws = torch.multinomial(weights.to("neuron"), 20_000, replacement=True).cpu()
    assert set(draws.unique().tolist()) == {1, 2}
    assert abs((draws == 2).float().mean().item() - 0.75) < 0.015
    picks = torch.multinomial(torch.ones(50, device="neuron"), 50).cpu()
    assert torch.equal(picks.sort().values, torch.arange(50))


def test_dropout_matches_its_definition():
    torch.neuron.manual_seed(0)
    x = torch.randn(100_000)
    out = torch.nn.functional.dropout(x.to("neuron"), p=0.2, training=True).cpu()
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.8) < 0.01
    torch.testing.assert_close(out[kept], x[kept] / 0.8, rtol=1e-6, atol=1e-6)
    evaluation = torch.nn.functional.dropout(x.to("neuron"), p=0.2, training=False).cpu()
    assert torch.equal(evaluation, x)
    layer = torch.nn.Dropout(0.5).to("neuron")
    torch.neuron.manual_seed(3)
    first = layer(torch.ones(1000, device="neuron")).cpu()
    torch.neuron.manual_seed(3)
    assert torch.equal(layer(torch.ones(1000, device="neuron")).cpu(), first)
    assert set(first.unique().tolist()) == {0.0, 2.0}


def test_same_seed_same_numbers_across_processes():
    code = (
        "import json, torch\n"
        "torch.manual_seed(2025)\n"
        "a = torch.randn(8, device='neuron')\n"
        "b = torch.randint(0, 1 << 30, (4,), device='neuron:1' if torch.neuron.device_count() > 1 else 'neuron')\n"
        "c = torch.nn.functional.dropout(torch.ones(16, device='neuron'), 0.5)\n"
        "print(json.dumps([a.cpu().tolist(), b.cpu().tolist(), c.cpu().tolist()]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX", "NEURON_"))}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    assert outputs[0] == outputs[1]
    # and this process, seeded the same way, draws the same numbers
    torch.manual_seed(2025)
    a = torch.randn(8, device="neuron").cpu().tolist()
    assert a == outputs[0][0]


# --------------------------------------------------------------------------- under torch.compile
# Compiled random ops draw their numbers with another algorithm than eager
# (docs/compile.md), so values are compared between runs from the same state;
# structure (shape, dtype, device) and the valid range are compared with eager.

COMPILED_OPS = {
    "randn": lambda x: torch.randn(x.shape, device=x.device) + x,
    "dropout": lambda x: torch.nn.functional.dropout(x, 0.5, training=True),
    "bernoulli": lambda x: torch.bernoulli(torch.full_like(x, 0.5)),
    "normal": lambda x: torch.normal(x, 2.0),
    "multinomial": lambda x: torch.multinomial(x + 1, 16),
}


def _compiled(fn):
    return torch.compile(fn, backend="neuron")


def _cpu(values):
    return [v.cpu() for v in values]


def _assert_like_eager(name, compiled, eager):
    """Same structure as the eager run on neuron, and values an eager draw could take."""
    for c, e in zip(compiled, eager):
        assert c.device.type == "neuron" and (c.shape, c.dtype) == (e.shape, e.dtype), name
        c = c.cpu()
        if name == "dropout":  # x = 1: kept entries scaled by 1 / (1 - p)
            assert set(c.unique().tolist()) <= {0.0, 2.0}, name
        elif name == "bernoulli":
            assert set(c.unique().tolist()) <= {0.0, 1.0}, name
        elif name == "multinomial":  # without replacement: distinct indices in range
            assert len(set(c.tolist())) == c.numel() and 0 <= c.min() and c.max() < 64, name
        else:
            assert torch.isfinite(c).all(), name


@pytest.mark.parametrize("name", sorted(COMPILED_OPS))
def test_compiled_rng_state_round_trip(fresh_dynamo, name):
    op = COMPILED_OPS[name]

    def fn(x):
        state = torch.neuron.get_rng_state()
        a = op(x)
        torch.neuron.set_rng_state(state)
        return a, op(x)

    x = torch.ones(64, device="neuron")
    torch.neuron.manual_seed(5)
    eager = fn(x)
    torch.neuron.manual_seed(5)
    compiled = _compiled(fn)(x)
    metrics = torch_neuronx.get_dynamo_metrics()
    # the op before and the op after the restore: each compiled, between graph breaks
    assert (metrics["inference_graphs"], metrics["graph_breaks"]) == (2, 2), metrics
    assert torch.equal(*_cpu(eager)), name
    assert torch.equal(*_cpu(compiled)), name  # the restored state drew the same numbers
    _assert_like_eager(name, compiled, eager)
    torch.neuron.manual_seed(5)
    again = _compiled(fn)(x)  # the same seed, the same compiled numbers
    assert all(torch.equal(a, b) for a, b in zip(_cpu(again), _cpu(compiled))), name


@pytest.mark.parametrize("name", sorted(COMPILED_OPS))
def test_compiled_fork_rng_restores_the_state(fresh_dynamo, name):
    op = COMPILED_OPS[name]

    def fn(x):
        with torch.random.fork_rng(devices=[0], device_type="neuron"):
            a = op(x)
        return a, op(x)

    x = torch.ones(64, device="neuron")
    results = {}
    for mode, run in (("eager", fn), ("compiled", _compiled(fn))):
        torch.neuron.manual_seed(9)
        results[mode] = run(x)
        after = torch.neuron.get_rng_state()
        torch.neuron.manual_seed(9)
        run(x)
        assert torch.equal(torch.neuron.get_rng_state(), after), (name, mode)
        assert torch.equal(*_cpu(results[mode])), (name, mode)  # the block left the state as it was
    _assert_like_eager(name, results["compiled"], results["eager"])


@pytest.mark.parametrize("module", ["neuron", "torch"])
def test_manual_seed_inside_a_compiled_function(fresh_dynamo, module):
    def seeded(x):
        (torch.neuron if module == "neuron" else torch).manual_seed(3)
        return COMPILED_OPS["randn"](x), COMPILED_OPS["dropout"](x)

    def unseeded(x):
        return COMPILED_OPS["randn"](x), COMPILED_OPS["dropout"](x)

    x = torch.ones(64, device="neuron")
    inside = _cpu(_compiled(seeded)(x))
    torch.neuron.manual_seed(3)
    outside = _cpu(_compiled(unseeded)(x))
    for a, b in zip(inside, outside):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(_cpu(seeded(x)), _cpu(seeded(x))))


@pytest.mark.parametrize("call", [
    lambda: torch.neuron.get_rng_state(),
    lambda: torch.neuron.set_rng_state(torch.neuron.get_rng_state()),
    lambda: torch.neuron.manual_seed(1),
])
def test_rng_state_under_fullgraph_is_dynamos_graph_break_error(fresh_dynamo, call):
    """As for torch.cuda's RNG functions: a graph break, an error under fullgraph=True."""
    def fn(x):
        call()
        return x + 1

    x = torch.ones(4, device="neuron")
    assert torch.equal(_compiled(fn)(x).cpu(), torch.full((4,), 2.0))
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"torch\.compiler\.disable"):
        torch.compile(fn, backend="neuron", fullgraph=True)(x)


OPINFO_RANDOM_OPS = ("bernoulli", "multinomial", "nn.functional.dropout", "normal", "randn")


def test_opinfo_random_samples_under_compile(fresh_dynamo):
    """PyTorch's own samples of these ops save and restore the accelerator's RNG
    state around each call (testing._utils.freeze_rng_state, under no_dispatch)."""
    from test_conformance import harness

    ops = [op for op in harness.load_op_db() if op.name in OPINFO_RANDOM_OPS]
    assert {op.name for op in ops} == set(OPINFO_RANDOM_OPS)
    for op in ops:
        torch._dynamo.reset()
        for sample in list(op.sample_inputs("cpu", torch.float32))[:2]:
            x, args, kwargs = harness.sample_to_device(op, sample)
            before = torch.neuron.get_rng_state()
            eager = op(x, *args, **kwargs)
            compiled = _compiled(op.op)(x, *args, **kwargs)
            assert torch.equal(torch.neuron.get_rng_state(), before), op.name  # restored
            off_device = []
            harness.compare(harness.to_cpu(compiled, off_device), harness.to_cpu(eager, []),
                            shape_only=True, path=op.name)
            assert not off_device, op.name


_ROUND_TRIP_UNDER_DYNAMO = """
import torch
def fn(x):
    state = torch.neuron.get_rng_state()
    a = torch.randn(8, device="neuron") + x
    torch.neuron.set_rng_state(state)
    return a, torch.randn(8, device="neuron") + x
a, b = torch.compile(fn, backend="neuron")(torch.zeros(8, device="neuron"))
assert torch.equal(a.cpu(), b.cpu())
"""


@pytest.mark.parametrize("order", ["torch first", "torch._dynamo before torch_neuronx"])
def test_rng_graph_breaks_whatever_is_imported_first(order):
    """Installed when torch._dynamo is imported (importing torch does not import it)."""
    env = dict(os.environ)
    if order == "torch first":
        code = "import sys, torch\nassert 'torch._dynamo' not in sys.modules\n"
    else:  # torch_neuronx loaded by hand after Dynamo
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        code = "import torch._dynamo, torch_neuronx\n"
    done = subprocess.run([sys.executable, "-c", code + _ROUND_TRIP_UNDER_DYNAMO], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
