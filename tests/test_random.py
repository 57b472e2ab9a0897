"""RNG of the neuron device, as TorchNeuron's (docs/device-and-memory.md, "Random
numbers"): eager random ops draw from the CPU's default generator, so seeded code
gives the CPU's numbers on the device; each core's neuron generator holds a 16-byte
state (seed, offset) that keys what is drawn on the device (random ops a compiled
graph computes, ops given an explicit neuron generator). Compiled graphs draw
dropout masks and the other shape-only random ops on the host, as eager does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import seeds
import torch_neuronx

needs_two = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs 2 NeuronCores")

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
SHAPES = ((7,), (64, 33), (2, 3, 17))  # below and above the 16 elements of CPU's vectorized normal

# Random ops as a user writes them: (device, shape, dtype) -> tensor.
RANDOM_OPS = {
    "randn": lambda d, s, t: torch.randn(s, device=d, dtype=t),
    "rand": lambda d, s, t: torch.rand(s, device=d, dtype=t),
    "randint": lambda d, s, t: torch.randint(-5, 1000, s, device=d),
    "randint_int32": lambda d, s, t: torch.randint(0, 7, s, device=d, dtype=torch.int32),
    "randperm": lambda d, s, t: torch.randperm(s[-1] * 3, device=d),
    "normal_": lambda d, s, t: torch.empty(s, device=d, dtype=t).normal_(2.0, 3.0),
    "uniform_": lambda d, s, t: torch.empty(s, device=d, dtype=t).uniform_(-1.0, 4.0),
    "bernoulli": lambda d, s, t: torch.bernoulli(torch.linspace(0, 1, s[-1], device=d, dtype=t).expand(s)),
    "bernoulli_p": lambda d, s, t: torch.empty(s, device=d, dtype=t).bernoulli_(0.3),
    "native_dropout": lambda d, s, t: torch.native_dropout(torch.ones(s, device=d, dtype=t), 0.4, True),
    "randn_like": lambda d, s, t: torch.randn_like(torch.zeros(s, device=d, dtype=t)),
    "rand_like": lambda d, s, t: torch.rand_like(torch.zeros(s, device=d, dtype=t)),
    "randint_like": lambda d, s, t: torch.randint_like(torch.zeros(s, device=d), 3, 9),
    "exponential_": lambda d, s, t: torch.empty(s, device=d, dtype=t).exponential_(1.5),
    "multinomial": lambda d, s, t: torch.multinomial(torch.arange(1.0, s[-1] + 1, device=d), 5, True),
    "normal_tensor": lambda d, s, t: torch.normal(torch.arange(float(s[-1]), device=d), 0.5),
}


def _cpu(value):
    if isinstance(value, (tuple, list)):
        return [_cpu(v) for v in value]
    return value.cpu()


def _equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _seeded(run, seed):
    torch.manual_seed(seed)
    return _cpu(run())


@pytest.fixture(autouse=True)
def _restore_generators():
    cpu_state = torch.get_rng_state()
    neuron_states = torch.neuron.get_rng_state_all()
    yield
    torch.set_rng_state(cpu_state)
    torch.neuron.set_rng_state_all(neuron_states)


# --------------------------------------------------------------------------- the generators
def test_default_generators():
    gens = torch.neuron.default_generators
    assert len(gens) == torch.neuron.device_count()
    for index, gen in enumerate(gens):
        assert gen.device == torch.device("neuron", index)
    assert gens[0] is not torch.default_generator
    with pytest.raises(IndexError):
        gens[torch.neuron.device_count()]


def test_state_is_a_seed_and_an_offset():
    """16 bytes, as TorchNeuron's (and CUDA's): the seed, then the offset, little-endian."""
    torch.neuron.manual_seed(0x0102030405060708)
    state = torch.neuron.get_rng_state()
    assert (state.dtype, state.shape, state.device.type) == (torch.uint8, (16,), "cpu")
    assert state.tolist() == [8, 7, 6, 5, 4, 3, 2, 1] + [0] * 8
    gen = torch.neuron.default_generators[torch.neuron.current_device()]
    gen.set_offset(5)
    assert torch.neuron.get_rng_state()[8:].tolist() == [5] + [0] * 7
    assert gen.initial_seed() == torch.neuron.initial_seed() == 0x0102030405060708


def test_set_rng_state_round_trips_and_checks_the_size():
    torch.neuron.manual_seed(42)
    gen = torch.neuron.default_generators[torch.neuron.current_device()]
    gen.set_offset(3)
    state = torch.neuron.get_rng_state()
    torch.neuron.manual_seed(100)
    assert (torch.neuron.initial_seed(), gen.get_offset()) == (100, 0)  # manual_seed resets the offset
    torch.neuron.set_rng_state(state)
    assert (torch.neuron.initial_seed(), gen.get_offset()) == (42, 3)
    state.zero_()  # the caller's tensor is copied
    assert torch.neuron.initial_seed() == 42
    torch.neuron.set_rng_state(torch.tensor([9, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8))  # a seed alone
    assert (torch.neuron.initial_seed(), gen.get_offset()) == (9, 0)
    with pytest.raises(RuntimeError, match=r"RNG state is wrong size: a neuron generator's state is 16 bytes"):
        torch.neuron.set_rng_state(torch.get_rng_state())  # the CPU's 5056-byte state
    with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
        torch.neuron.set_rng_state(torch.zeros(16, dtype=torch.int32))


def test_manual_seed_variants():
    torch.manual_seed(2)  # seeds the CPU and every core, as TorchNeuron's
    assert torch.initial_seed() == 2
    assert all(g.initial_seed() == 2 for g in torch.neuron.default_generators)
    torch.neuron.manual_seed_all(1234)
    assert all(g.initial_seed() == 1234 for g in torch.neuron.default_generators)
    assert torch.initial_seed() == 2  # the CPU's is not the device's
    torch.neuron.seed()
    s1 = torch.neuron.initial_seed()
    torch.neuron.seed()
    assert s1 != torch.neuron.initial_seed()  # nondeterministic; equal with probability 2**-64
    torch.neuron.seed_all()
    assert len({g.initial_seed() for g in torch.neuron.default_generators}) == 1


@needs_two
def test_generators_are_per_core():
    torch.neuron.manual_seed_all(3)
    with torch.neuron.device(1):
        torch.neuron.manual_seed(4)  # the current core only
    assert [g.initial_seed() for g in torch.neuron.default_generators][:2] == [3, 4]
    states = torch.neuron.get_rng_state_all()
    assert not torch.equal(states[0], states[1])
    torch.neuron.manual_seed_all(0)
    torch.neuron.set_rng_state_all(states)
    assert [g.initial_seed() for g in torch.neuron.default_generators][:2] == [3, 4]


# --------------------------------------------------------------------------- eager: the CPU's numbers
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(RANDOM_OPS))
def test_seeded_random_op_gives_the_cpus_numbers(name, dtype, shape):
    """torch.manual_seed(s), then the same call: exactly the CPU's result."""
    if dtype != torch.float32 and name in ("randint", "randint_int32", "randperm", "randint_like",
                                           "multinomial", "normal_tensor"):
        pytest.skip("no float dtype argument")
    op = RANDOM_OPS[name]
    torch_neuronx.clear_op_tracking()
    neuron = _seeded(lambda: op("neuron", shape, dtype), seeds.seed(31))
    cpu = _seeded(lambda: op("cpu", shape, dtype), seeds.seed(31))
    assert _equal(neuron, cpu), name
    if shape != (7,):  # enough draws that another seed cannot give the same ones
        assert not _equal(_seeded(lambda: op("neuron", shape, dtype), seeds.seed(32)), cpu), name
    assert torch_neuronx.get_fallback_ops() == {}, "random ops are native"


def test_neuron_and_cpu_draws_share_one_stream():
    """The CPU generator advances on neuron draws, as on TorchNeuron (its random ops take
    the CPU path): mixed CPU and neuron code draws what all-CPU code draws."""
    def program(device):
        torch.manual_seed(seeds.seed(42))
        x = torch.randn(4, 5)  # on the CPU in both runs (a test input, say)
        y = torch.randn_like(x.to(device))
        mask = F.dropout(torch.ones(40, device=device), 0.5) != 0
        return x, y.cpu(), mask.cpu(), torch.rand(3)

    assert _equal(program("neuron"), program("cpu"))


def test_eager_draws_leave_the_neuron_generators_alone():
    states = torch.neuron.get_rng_state_all()
    for op in RANDOM_OPS.values():
        op("neuron", (8,), torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(torch.neuron.get_rng_state_all(), states))


def test_dropout_matches_cpu():
    """native_dropout: the CPU kernel's mask and values exactly. F.dropout on the device is
    native_dropout (PyTorch's fused path for accelerators), the CPU's F.dropout scales by
    a division: the same mask, values within one rounding of the scale."""
    x = torch.randn(300, 7, generator=torch.Generator().manual_seed(seeds.seed(1)))
    for p in (0.0, 0.1, 0.4, 0.9, 1.0):
        out, mask = _seeded(lambda: torch.native_dropout(x.to("neuron"), p, True), 5)
        want_out, want_mask = _seeded(lambda: torch.native_dropout(x, p, True), 5)
        assert torch.equal(mask, want_mask) and torch.equal(out, want_out), p
        functional = _seeded(lambda: F.dropout(x.to("neuron"), p, training=True), 5)
        cpu = _seeded(lambda: F.dropout(x, p, training=True), 5)
        assert torch.equal(functional != 0, cpu != 0), p
        torch.testing.assert_close(functional, cpu, rtol=2 ** -23, atol=0)
    evaluation = F.dropout(x.to("neuron"), 0.2, training=False).cpu()
    assert torch.equal(evaluation, x)


def test_dropout_gradients_match_cpu():
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(seeds.seed(2)))
    grads = {}
    for device in ("neuron", "cpu"):
        leaf = x.to(device).requires_grad_()
        torch.manual_seed(seeds.seed(999))
        (torch.nn.Dropout(0.6)(leaf) * torch.arange(9.0, device=device)).sum().backward()
        grads[device] = leaf.grad.cpu()
    torch.testing.assert_close(grads["neuron"], grads["cpu"], rtol=2 ** -23, atol=0)


def test_cpu_state_round_trip_and_fork_rng_reproduce_neuron_draws():
    torch.manual_seed(seeds.seed(2024))
    state = torch.get_rng_state()
    first = _cpu(RANDOM_OPS["randn"]("neuron", (32,), torch.float32))
    torch.set_rng_state(state)
    assert torch.equal(_cpu(RANDOM_OPS["randn"]("neuron", (32,), torch.float32)), first)
    torch.set_rng_state(state)
    with torch.random.fork_rng(device_type="neuron"):  # forks the CPU's and every core's state
        inside = _cpu(RANDOM_OPS["bernoulli_p"]("neuron", (64,), torch.float32))
    assert torch.equal(_cpu(RANDOM_OPS["bernoulli_p"]("neuron", (64,), torch.float32)), inside)


# --------------------------------------------------------------------------- explicit generators
def test_explicit_neuron_generator():
    """A neuron generator draws streams keyed by its (seed, offset), the offset advancing by
    one per op; the first after manual_seed(s) is what a CPU generator seeded s draws."""
    g = torch.Generator("neuron")
    assert g.device == torch.device("neuron", 0) and g.get_state().numel() == 16
    g.manual_seed(42)
    cpu_state, default_states = torch.get_rng_state(), torch.neuron.get_rng_state_all()
    a = torch.randn(32, device="neuron", generator=g).cpu()
    assert torch.equal(a, torch.randn(32, generator=torch.Generator().manual_seed(42)))
    assert g.get_offset() == 1
    state = g.get_state()
    b = torch.rand(8, device="neuron", generator=g).cpu()
    assert not torch.equal(b, torch.rand(8, generator=torch.Generator().manual_seed(42)))
    g.set_state(state)
    assert torch.equal(torch.rand(8, device="neuron", generator=g).cpu(), b)
    clone = g.clone_state()
    assert torch.equal(torch.randperm(50, device="neuron", generator=g).cpu(),
                       torch.randperm(50, device="neuron", generator=clone).cpu())
    # neither the CPU's nor the device's default generator moved
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert all(torch.equal(x, y) for x, y in zip(torch.neuron.get_rng_state_all(), default_states))
    assert torch.equal(torch.randn(32, device="neuron", generator=torch.Generator("neuron").manual_seed(42)).cpu(), a)


def test_explicit_cpu_generator_on_a_device_op():
    """Accepted, as on TorchNeuron (the op runs on the CPU path): the CPU's numbers."""
    got = torch.randn(16, device="neuron", generator=torch.Generator().manual_seed(3)).cpu()
    assert torch.equal(got, torch.randn(16, generator=torch.Generator().manual_seed(3)))


@needs_two
def test_generator_on_another_core():
    g = torch.Generator("neuron:1")
    assert g.device == torch.device("neuron", 1)
    g.manual_seed(0)
    x = torch.randn(4, device="neuron:1", generator=g)
    assert x.device.index == 1 and torch.equal(x.cpu(), torch.randn(4, generator=torch.Generator().manual_seed(0)))


# --------------------------------------------------------------------------- across processes and threads
_FRESH_PROCESS = """
import json, torch
state = torch.get_rng_state()
draws = torch.randn(8, device='neuron').cpu()  # never seeded
torch.set_rng_state(state)
print(json.dumps([torch.neuron.initial_seed(), torch.equal(draws, torch.randn(8))]))
"""


def test_fresh_processes():
    """Unseeded, a core's generator starts from a nondeterministic seed (as TorchNeuron's);
    unseeded eager draws are the CPU generator's (whose start this PyTorch also randomizes)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX", "NEURON_"))}
    runs = [json.loads(subprocess.run([sys.executable, "-c", _FRESH_PROCESS], env=env, capture_output=True,
                                      text=True, timeout=180, check=True).stdout.splitlines()[-1])
            for _ in range(2)]
    (seed1, same1), (seed2, same2) = runs
    assert seed1 != seed2 and same1 and same2


_THREADS = """
import json, torch
def draws(device):
    torch.manual_seed(7)
    return [torch.randn(100_000, device=device).sum().item(),
            torch.empty(100_000, device=device).bernoulli_(0.3).sum().item(),
            torch.nn.functional.dropout(torch.ones(100_000, device=device), 0.25).sum().item()]
print(json.dumps([torch.get_num_threads(), draws('neuron'), draws('cpu')]))
"""


@pytest.mark.parametrize("threads", ["1", None], ids=["OMP_NUM_THREADS=1", "default threads"])
def test_large_draws_match_cpu_whatever_the_thread_count(threads):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads:
        env["OMP_NUM_THREADS"] = threads
    done = subprocess.run([sys.executable, "-c", _THREADS], env=env, capture_output=True, text=True,
                          timeout=180, check=True)
    count, neuron, cpu = json.loads(done.stdout.splitlines()[-1])
    assert threads is None or count == 1
    assert neuron == cpu


# --------------------------------------------------------------------------- under torch.compile
class DropoutMLP(torch.nn.Module):
    """Dropout after activations and on attention-like probabilities (AWS's dropout models)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)
        self.drop1, self.drop2 = torch.nn.Dropout(0.1), torch.nn.Dropout(0.3)

    def forward(self, x):
        h1 = self.drop1(F.gelu(self.fc1(x)))
        probs = F.dropout(torch.softmax(h1 @ h1.T, dim=-1), p=0.2, training=self.training)
        h2 = self.drop2(F.relu(self.fc2(probs @ h1)))
        return h1, probs, self.fc3(h2)


def _compiled(fn):
    return torch.compile(fn, backend="neuron")


def _model_inputs():
    torch.manual_seed(seeds.seed(0))
    return DropoutMLP(), torch.randn(6, 16)


def test_compiled_dropout_matches_eager_cpu(fresh_dynamo):
    """As TorchNeuron: a compiled graph's dropout masks are drawn by the CPU kernel from the
    CPU generator at each call, so the compiled model drops what the CPU model drops."""
    model, x = _model_inputs()
    torch.manual_seed(seeds.seed(42))
    cpu = [_cpu(model(x)) for _ in range(2)]  # two steps: the second draws new masks
    compiled = _compiled(model.to("neuron"))
    torch.manual_seed(seeds.seed(42))
    neuron = [_cpu(compiled(x.to("neuron"))) for _ in range(2)]
    assert torch_neuronx.get_dynamo_metrics()["graph_breaks"] == 0
    for step_cpu, step_neuron in zip(cpu, neuron):
        for want, got in zip(step_cpu, step_neuron):
            assert torch.equal(want == 0, got == 0)  # the same elements dropped
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # float32 matmuls
    assert not torch.equal(cpu[0][0] == 0, cpu[1][0] == 0)


def test_compiled_dropout_backward_matches_cpu(fresh_dynamo):
    model, x = _model_inputs()
    grads = {}
    for device, run in (("cpu", model), ("neuron", None)):
        if device == "neuron":
            model = model.to("neuron")
            run = _compiled(model)
        model.zero_grad()
        torch.manual_seed(seeds.seed(7))
        run(x.to(device))[-1].square().sum().backward()
        grads[device] = [p.grad.cpu().clone() for p in model.parameters()]
    for got, want in zip(grads["neuron"], grads["cpu"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _shape_only(x):
    """Random ops whose numbers depend on shapes, dtypes and constants only."""
    return (
        torch.rand(x.shape, device=x.device) + x,
        torch.randn_like(x),
        torch.rand(5, device=x.device, dtype=torch.bfloat16),
        torch.randint(0, 10, (5,), device=x.device),
        torch.randperm(9, device=x.device),
        x.clone().uniform_(-2.0, 2.0),
        (x * 2).normal_(1.0, 3.0),
        torch.empty_like(x).bernoulli_(0.3),
        x.clone().exponential_(),
        torch.native_dropout(x, 0.5, True)[0],
    )


def test_compiled_shape_only_random_ops_match_eager_cpu(fresh_dynamo):
    x = torch.randn(4, 20, generator=torch.Generator().manual_seed(seeds.seed(3)))
    want = _seeded(lambda: _shape_only(x), seeds.seed(11))
    compiled = _compiled(_shape_only)
    got = _seeded(lambda: compiled(x.to("neuron")), seeds.seed(11))
    assert _equal(got, want)
    again = _seeded(lambda: compiled(x.to("neuron")), seeds.seed(11))  # an executable cache hit
    assert _equal(again, want)


def _in_graph(x):
    """Random ops whose parameters the graph computes: drawn on the device. (torch.bernoulli(p)
    is not one: PyTorch decomposes it to rand_like(p) < p, and that rand is drawn on the host.)"""
    return (torch.empty_like(x).bernoulli_(torch.sigmoid(x)), torch.multinomial(x.abs() + 1, 4),
            torch.normal(x, 2.0), torch.poisson(x.abs()))


def test_compiled_in_graph_random_ops_draw_from_the_neuron_generator(fresh_dynamo):
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(seeds.seed(4))).to("neuron")
    compiled = _compiled(_in_graph)
    gen = torch.neuron.default_generators[torch.neuron.current_device()]
    torch.manual_seed(seeds.seed(5))
    cpu_state = torch.get_rng_state()
    first = _cpu(compiled(x))
    assert gen.get_offset() == 1  # one stream per run of the graph
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU generator is not used
    state = torch.neuron.get_rng_state()
    second = _cpu(compiled(x))
    assert not _equal(first, second)
    torch.neuron.set_rng_state(state)
    assert _equal(_cpu(compiled(x)), second)
    torch.manual_seed(seeds.seed(5))
    assert _equal(_cpu(compiled(x)), first)
    for values in first:  # valid draws: 0/1, distinct category indices, finite normals
        assert torch.isfinite(values.float()).all()
    assert set(first[0].unique().tolist()) <= {0.0, 1.0}


def test_compiled_fork_rng_restores_both_generators(fresh_dynamo):
    def fn(x):
        with torch.random.fork_rng(devices=[0], device_type="neuron"):
            a = _in_graph(x)[0], torch.rand_like(x)
        return a, (_in_graph(x)[0], torch.rand_like(x))

    x = torch.zeros(2, 64, device="neuron")
    for run in (fn, _compiled(fn)):
        torch.manual_seed(seeds.seed(9))
        inside, outside = _cpu(run(x))
        assert _equal(inside, outside)  # the block left both generators as it found them


@pytest.mark.parametrize("module", ["neuron", "torch"])
def test_manual_seed_inside_a_compiled_function(fresh_dynamo, module):
    def seeded(x):
        (torch.neuron if module == "neuron" else torch).manual_seed(3)
        return F.dropout(x, 0.5), _in_graph(x)[0]

    x = torch.ones(64, device="neuron")
    first, second = _cpu(_compiled(seeded)(x)), _cpu(_compiled(seeded)(x))
    assert _equal(first[1], second[1])  # the device draw follows the cores' seed
    if module == "torch":  # the host draw follows the CPU's
        assert _equal(first[0], second[0])
        assert _equal(first[0], _seeded(lambda: F.dropout(x.cpu(), 0.5), 3))


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
    a = torch.empty_like(x).bernoulli_(torch.sigmoid(x))
    torch.neuron.set_rng_state(state)
    return a, torch.empty_like(x).bernoulli_(torch.sigmoid(x))
a, b = torch.compile(fn, backend="neuron")(torch.zeros(64, device="neuron"))
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
