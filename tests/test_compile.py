"""torch.compile(backend="neuron"): whole graphs lowered to StableHLO and run by
XLA, compared against eager execution on the same device."""

import os
import copy
import warnings

import pytest
import torch

import seeds
import torch_neuronx  # noqa: F401
from torch_neuronx.compiler import NeuronCompileError, get_dynamo_metrics, reset_dynamo_metrics

DEVICE = "neuron"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # tests/conftest.py


def mlp():
    torch.manual_seed(seeds.seed(0))
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


def test_backend_is_found_by_name():
    assert "neuron" in torch._dynamo.list_backends(exclude_tags=())


def test_mlp_forward_backward_matches_eager():
    eager = mlp().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="neuron", fullgraph=True)
    x = torch.randn(8, 16, device=DEVICE)
    eager(x).square().mean().backward()
    out = compiled(x)
    assert out.device.type == "neuron"
    out.square().mean().backward()
    torch.testing.assert_close(out, eager(x), rtol=1e-4, atol=1e-4)
    for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-4)
    metrics = get_dynamo_metrics()
    assert metrics["forward_graphs"] == 1 and metrics["backward_graphs"] == 1
    assert metrics["compiles"] >= 2


def test_training_steps_match_eager():
    eager = mlp().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="neuron")
    # Adam moves each weight by lr * g / (|g| + eps): with the default eps=1e-8, a gradient that
    # cancels to rounding level (|g| ~ 1e-8, rounding difference ~ 2 * K * eps_f32 * max|g| ~ 1e-7
    # here) moves it by an arbitrary part of lr. eps=1e-4 bounds that part to lr * 1e-7 / eps = 1e-5
    # per step, so 3 steps stay within the 1e-4 compared below on any seed.
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2, eps=1e-4)
    opt_c = torch.optim.AdamW(compiled_model.parameters(), lr=1e-2, eps=1e-4)
    x = torch.randn(8, 16, device=DEVICE)
    y = torch.randn(8, 4, device=DEVICE)
    for _ in range(3):
        for model, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p_compiled, p_eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.AdamW(params, lr=1e-2),
    lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
], ids=["adamw", "sgd_momentum"])
def test_compiled_optimizer_step_matches_eager(make_optimizer):
    """`torch.compile(opt.step)`, as in PyTorch's compiled-optimizer recipe: the
    update of parameters and optimizer state (exp_avg, momentum buffers) runs in
    a compiled graph and is written back to those tensors in place."""
    eager = mlp().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    opt_e, opt_c = make_optimizer(eager.parameters()), make_optimizer(compiled_model.parameters())

    @torch.compile(backend="neuron")
    def compiled_step():
        opt_c.step()

    reset_dynamo_metrics()
    x, y = torch.randn(8, 16, device=DEVICE), torch.randn(8, 4, device=DEVICE)
    for _ in range(4):
        for model, opt, step in ((eager, opt_e, opt_e.step), (compiled_model, opt_c, compiled_step)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            step()
    assert get_dynamo_metrics()["compiles"] >= 1  # the update ran in a compiled graph
    for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p_compiled, p_eager, rtol=1e-5, atol=1e-5)
    for state_e, state_c in zip(opt_e.state.values(), opt_c.state.values()):
        for key in state_e:
            torch.testing.assert_close(state_c[key], state_e[key], rtol=1e-5, atol=1e-5)


def test_recompiles_per_new_shape_and_caches_seen_shapes():
    model = torch.compile(mlp().to(DEVICE).eval(), backend="neuron")
    with torch.no_grad():
        model(torch.randn(4, 16, device=DEVICE))
        first = get_dynamo_metrics()["compiles"]
        model(torch.randn(4, 16, device=DEVICE))
        assert get_dynamo_metrics()["compiles"] == first
        recompiles = get_dynamo_metrics()["recompiles"]
        model(torch.randn(6, 16, device=DEVICE))
        metrics = get_dynamo_metrics()
        assert metrics["compiles"] == first + 1
        assert metrics["recompiles"] == recompiles + 1
        assert "size" in metrics["recompile_reasons"][-1]  # the guard on the batch size failed


def test_size_history_from_another_backend_keeps_neuron_traces_static():
    """Dynamo remembers per code object which sizes varied. A frame compiled
    before with another backend (here "eager", with automatic dynamic shapes on,
    as a `dynamic=False` call's config patch leaves it on exit) must not make the
    neuron trace of that frame symbolic: it recompiles with static sizes."""

    def scaled_rows(x):
        return (x * 2).sum(0)

    with torch._dynamo.config.patch(automatic_dynamic_shapes=True):
        on_cpu = torch.compile(scaled_rows, backend="eager")
        on_cpu(torch.randn(3, 4))
        on_cpu(torch.randn(5, 4))  # size history: dim 0 varies
        reset_dynamo_metrics()
        compiled = torch.compile(scaled_rows, backend="neuron")
        for rows in (6, 7):
            x = torch.randn(rows, 4)
            torch.testing.assert_close(compiled(x.to(DEVICE)).cpu(), scaled_rows(x))
    assert get_dynamo_metrics()["compiles"] == 2  # one static executable per shape


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_default_backend_on_neuron_compiles_with_the_neuron_backend(mode, monkeypatch):
    """torch.compile(model) as CUDA scripts write it: Inductor cannot generate
    code for neuron, so graphs on neuron go to the neuron backend (one warning
    per process), forward and backward, and new shapes recompile statically
    (Dynamo's automatic dynamic shapes would otherwise make them symbolic)."""
    from torch_neuronx.compiler import dynamo

    monkeypatch.setattr(dynamo, "_warned", [False])
    eager = mlp().to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model) if mode is None else torch.compile(compiled_model, mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (8, 5, 3):
            x = torch.randn(rows, 16, device=DEVICE)
            out = compiled(x)
            out.square().mean().backward()
            eager(x).square().mean().backward()
            torch.testing.assert_close(out, eager(x), rtol=1e-4, atol=1e-4)
    for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-4)
    redirects = [w for w in caught if "Inductor (the default backend)" in str(w.message)]
    assert len(redirects) == 1 and "backend='neuron'" in str(redirects[0].message)
    metrics = get_dynamo_metrics()
    assert (metrics["forward_graphs"], metrics["backward_graphs"], metrics["recompiles"]) == (3, 3, 2)
    assert all("size mismatch" in reason for reason in metrics["recompile_reasons"])


def test_default_backend_keeps_inductor_for_graphs_off_neuron(monkeypatch):
    """Graphs on CPU still reach Inductor (its compile_fx, stubbed here: a real
    Inductor compile takes seconds) and do not warn."""
    import torch._inductor.compile_fx as inductor

    reached = []

    def compile_fx(model_, inputs_, **kwargs):
        reached.append(tuple(t.device.type for t in inputs_ if isinstance(t, torch.Tensor)))
        return model_

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    fn = torch.compile(lambda x: x.sin() + 1)
    x = torch.randn(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(fn(x), x.sin() + 1)
    assert reached == [("cpu",)]
    assert not [w for w in caught if "Inductor (the default backend)" in str(w.message)]
    assert get_dynamo_metrics()["compiles"] == 0


def test_dynamic_true_is_rejected_with_a_clear_error():
    model = torch.compile(mlp().to(DEVICE), backend="neuron", dynamic=True)
    with pytest.raises(Exception, match="dynamic"):
        model(torch.randn(4, 16, device=DEVICE))


def test_mode_other_than_default_warns_and_is_ignored():
    model = torch.compile(mlp().to(DEVICE), backend="neuron", mode="max-autotune")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(torch.randn(4, 16, device=DEVICE))
    assert out.shape == (4, 4)
    assert any("max-autotune" in str(w.message) for w in caught)


def test_unlowered_op_raises_naming_the_op_and_source_line():
    def f(x):
        return torch.special.bessel_j0(x) + 1

    compiled = torch.compile(f, backend="neuron")
    with pytest.raises(Exception) as info:
        compiled(torch.randn(4, device=DEVICE))
    message = str(info.value)
    assert "bessel_j0" in message and "test_compile.py" in message


def _calls_bessel(x):
    return torch.special.bessel_j0(x)


def test_enable_stack_trace_lists_the_whole_python_stack(monkeypatch):
    def f(x):
        return _calls_bessel(x) + 1

    def message():
        torch._dynamo.reset()
        with pytest.raises(Exception) as info:
            torch.compile(f, backend="neuron")(torch.randn(4, device=DEVICE))
        return str(info.value)

    innermost = message()
    assert "in _calls_bessel" in innermost and "in f\n" not in innermost
    monkeypatch.setenv("TORCH_NEURONX_ENABLE_STACK_TRACE", "1")
    whole = message()
    assert "in _calls_bessel" in whole and "in f\n" in whole and "_calls_bessel(x) + 1" in whole


def test_outputs_are_neuron_tensors_and_inputs_unchanged():
    def f(x, y):
        return (x @ y).softmax(-1), x.sum()

    x = torch.randn(4, 8, device=DEVICE)
    y = torch.randn(8, 3, device=DEVICE)
    x_before = x.cpu().clone()
    a, b = torch.compile(f, backend="neuron")(x, y)
    assert a.device.type == "neuron" and b.device.type == "neuron"
    torch.testing.assert_close(a.cpu(), (x_before @ y.cpu()).softmax(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.cpu(), x_before)


def test_dropout_in_training_is_compiled_and_seeded_by_the_device_generator():
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.5)).to(DEVICE)
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    x = torch.randn(8, 16, device=DEVICE)
    torch.manual_seed(3)
    first = compiled(x)
    torch.manual_seed(3)
    again = compiled(x)
    other = compiled(x)
    torch.testing.assert_close(first, again)
    assert not torch.equal(first.cpu(), other.cpu())
    zeros = (first == 0).float().mean().item()
    assert 0.35 < zeros < 0.65
    kept = first != 0
    eager = model[0](x)
    torch.testing.assert_close(first[kept], (eager * 2)[kept], rtol=1e-4, atol=1e-4)


def test_inference_graph_writes_back_in_place_input_updates():
    def f(x, buf):
        buf.add_(1)
        return x * buf

    x = torch.randn(4, device=DEVICE)
    buf = torch.zeros(4, device=DEVICE)
    compiled = torch.compile(f, backend="neuron")
    with torch.no_grad():
        out = compiled(x, buf)
        out = compiled(x, buf)
    torch.testing.assert_close(buf.cpu(), torch.full((4,), 2.0))
    torch.testing.assert_close(out, x * 2)


def test_cpu_inputs_are_accepted_or_rejected_by_env(monkeypatch):
    def f(x):
        return x * 2 + 1

    compiled = torch.compile(f, backend="neuron")
    x_cpu = torch.randn(4)
    out = compiled(x_cpu)
    torch.testing.assert_close(out.cpu(), x_cpu * 2 + 1)
    assert out.device.type == "neuron"
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")
    with pytest.raises(RuntimeError, match="Input tensor at index 0 is on cpu device"):
        compiled(x_cpu)


def test_fp64_graph_follows_the_fp32_rule():
    def f(x, y):
        return x * y + 1

    x = torch.randn(16, dtype=torch.float64)
    y = torch.randn(16, dtype=torch.float64)
    out = torch.compile(f, backend="neuron")(x.to(DEVICE), y.to(DEVICE))
    assert out.dtype == torch.float64
    expected = (x.float() * y.float() + 1).double()
    # float32 arithmetic (XLA may fuse the multiply-add: one rounding, not two)
    torch.testing.assert_close(out.cpu(), expected, rtol=3e-7, atol=3e-7)
    assert (out.cpu() - (x * y + 1)).abs().max() > 1e-10  # not computed in float64


def test_inputs_and_outputs_cross_without_copies():
    from torch_neuronx.lowering import conversions

    x = torch.randn(1024, device=DEVICE)
    array, = conversions.jax_inputs([x])
    assert array.unsafe_buffer_pointer() == x.data_ptr()  # XLA reads the tensor's own bytes
    assert conversions.jax_inputs([x])[0] is array  # imported once per address and layout
    assert conversions.jax_inputs([x.view(32, 32)])[0] is not array  # another shape: its own array
    result = array * 3
    out, = conversions.from_jax_all([result], x.device, [None])
    assert out.device.type == "neuron"
    assert out.data_ptr() == result.unsafe_buffer_pointer()  # the tensor takes XLA's buffer
    torch.testing.assert_close(out.cpu(), x.cpu() * 3)


def test_unaligned_or_strided_inputs_are_copied_once_and_still_correct():
    from torch_neuronx.lowering import conversions

    base = torch.randn(1025, device=DEVICE)
    shifted = base[1:]  # 4 bytes past an aligned block
    strided = base[::2]
    for tensor in (shifted, strided):
        array, = conversions.jax_inputs([tensor])
        assert array.unsafe_buffer_pointer() != tensor.data_ptr()
        torch.testing.assert_close(torch.from_dlpack(array), tensor.cpu())
    out = torch.compile(lambda a, b: a + b, backend="neuron")(shifted[:513], strided)
    torch.testing.assert_close(out.cpu(), shifted.cpu()[:513] + strided.cpu())


def test_cached_imports_see_in_place_updates_and_reused_memory():
    """Imports are reused per address and layout: a graph must still read the
    current bytes after an in-place update, and another tensor at the same
    address (here a second view; after a free, a new tensor) is read as itself."""
    compiled = torch.compile(lambda w, x: (w * x).sum(), backend="neuron")
    storage = torch.ones(512, device=DEVICE)
    w = storage[:256]
    x = torch.arange(256.0, device=DEVICE)
    total = float(torch.arange(256.0).sum())
    assert compiled(w, x).item() == pytest.approx(total)
    with torch.no_grad():
        w.mul_(2)  # what optimizers do to parameters
    assert compiled(w, x).item() == pytest.approx(2 * total)
    del w
    other = storage.narrow(0, 0, 256)
    other.fill_(3.0)
    assert compiled(other, x).item() == pytest.approx(3 * total)
    assert compiled(storage[256:], x).item() == pytest.approx(total)  # another address


def test_debug_dir_receives_fx_graphs_and_stablehlo(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    torch.compile(lambda x: x.relu() + 2, backend="neuron")(torch.randn(5, device=DEVICE))
    fx = list((tmp_path / "rank0" / "fx_graphs").iterdir())
    hlo = list((tmp_path / "rank0" / "stablehlo").iterdir())
    assert fx and hlo
    assert "stablehlo" in hlo[0].read_text() or "func.func" in hlo[0].read_text()


@torch.library.custom_op("neuron_test::scaled_square", mutates_args=())
def scaled_square(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * x * scale


@scaled_square.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_square_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 2 * x * ctx.scale, None


def _scaled_square_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


scaled_square.register_autograd(_scaled_square_backward, setup_context=_scaled_square_setup)


def test_custom_op_inside_a_compiled_region_splits_the_graph():
    def f(x):
        y = torch.sin(x) + 1
        z = scaled_square(y, 3.0)
        return (z.relu() * 2).sum()

    x = torch.randn(6, device=DEVICE, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out = torch.compile(f, backend="neuron", fullgraph=True)(x)
    out.backward()
    expected = f(x_ref)
    expected.backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    assert get_dynamo_metrics()["compiles"] >= 2  # the pieces around the custom op


@torch.library.custom_op("neuron_test::triple_into", mutates_args=("out",))
def triple_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 3)


@triple_into.register_fake
def _(x, out):
    return None


def test_custom_op_that_writes_its_output_in_place_inside_a_compiled_region():
    """mutates_args (how NKI kernels write outputs): AOTAutograd wraps the op in
    auto_functionalized; the graph is split around it as around any custom op,
    and a mutated graph input is written back."""
    def into_scratch(x):
        scratch = torch.empty_like(x)
        triple_into(x.sin(), scratch)
        return scratch + 1

    def into_argument(x, out):
        triple_into(x.cos(), out)
        return out * 2

    x = torch.randn(4, 3, device=DEVICE)
    got = torch.compile(into_scratch, backend="neuron", fullgraph=True)(x)
    torch.testing.assert_close(got, into_scratch(x), rtol=1e-5, atol=1e-5)
    out, out_ref = torch.zeros(4, 3, device=DEVICE), torch.zeros(4, 3, device=DEVICE)
    got = torch.compile(into_argument, backend="neuron", fullgraph=True)(x, out)
    torch.testing.assert_close(got, into_argument(x, out_ref), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)


def test_tensor_constants_created_in_the_function_are_compiled():
    def f(x):
        return torch.where(x > 0, x, torch.tensor(-1e9, device=x.device))

    x = torch.randn(8, device=DEVICE)
    out = torch.compile(f, backend="neuron", fullgraph=True)(x)
    torch.testing.assert_close(out, f(x))


def test_log_level_env_var_shows_compiles_and_rejects_unknown_levels():
    import subprocess
    import sys

    script = ("import torch\n"
              "m = torch.compile(torch.nn.Linear(4, 4).to('neuron'), backend='neuron')\n"
              "m(torch.randn(2, 4, device='neuron'))\n")
    env = dict(os.environ, TORCH_NEURONX_LOG_LEVEL="info")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[torch_neuronx.compiler INFO] compiled the forward graph" in out.stderr
    env["TORCH_NEURONX_LOG_LEVEL"] = "loud"
    out = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "TORCH_NEURONX_LOG_LEVEL='LOUD' is not a log level" in out.stderr


def test_graphs_that_differ_only_in_constant_values_do_not_share_executables():
    """Two functions whose graphs have the same code but different tensor
    constants (lifted as _tensor_constant0) must not be served each other's
    executable, in memory or on disk."""
    def plus(value):
        def f(x):
            return x + torch.tensor([value, value * 2], device=x.device)
        return f

    x = torch.zeros(2, device=DEVICE)
    first = torch.compile(plus(1.0), backend="neuron")(x)
    second = torch.compile(plus(5.0), backend="neuron")(x)
    torch.testing.assert_close(first.cpu(), torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(second.cpu(), torch.tensor([5.0, 10.0]))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_inference_fast_path_compiles(norm_first):
    """In eval mode under no_grad, nn.TransformerEncoderLayer calls the fused
    aten._transformer_encoder_layer_fwd (its fast path); compiled, it is lowered
    as a whole and matches eager, with and without a key padding mask."""
    torch.manual_seed(seeds.seed(0))
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             activation="gelu").to(DEVICE).eval()
    x = torch.randn(2, 5, 32, device=DEVICE)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]], device=DEVICE)
    compiled = torch.compile(layer, backend="neuron")
    with torch.no_grad():
        for kwargs in ({}, {"src_key_padding_mask": padding}):
            torch.testing.assert_close(compiled(x, **kwargs).cpu(), layer(x, **kwargs).cpu(),
                                       rtol=1e-5, atol=1e-5)
    assert get_dynamo_metrics()["inference_graphs"] >= 1


def test_python_kernels_run_eagerly_untraced_inside_compiled_regions():
    """A native op implemented in Python (integer histc, as MoE routers call it)
    that runs eagerly inside a torch.compile region (here a frame Dynamo skips,
    as when it falls back on a frame) is not traced by Dynamo: no graph is
    compiled from the kernel's own code, and the result is the CPU one."""
    compiled_graphs = []

    def counting(gm, example_inputs):
        compiled_graphs.append(gm.code)
        return gm.forward

    @torch.compiler.disable(recursive=False)
    def eager_part(x):
        return torch.histc(x, bins=4, min=0, max=3)

    def f(x):
        return eager_part(x)

    x = torch.tensor([0, 1, 1, 3, 2, 1], dtype=torch.int32)
    out = torch.compile(f, backend=counting)(x.to(DEVICE))
    torch.testing.assert_close(out.cpu(), torch.tensor([1, 3, 1, 1], dtype=torch.int32))
    assert compiled_graphs == []


def test_unlowered_op_in_the_backward_raises_when_the_backward_runs(tmp_path, monkeypatch):
    """Backward graphs reach the backend together with the forward (the
    AOTAutograd result cache needs both); an op missing from the backward's
    lowering is reported when backward runs, so a forward whose backward never
    runs (evaluation without no_grad) works."""
    from torch_neuronx import lowering

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))  # a fresh disk cache: no hits
    lowering.lookup(torch.ops.aten.mm.default)  # the table is loaded
    monkeypatch.delitem(lowering.LOWERINGS, torch.ops.aten.mm)  # forward: addmm; backward: mm
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU()).to(DEVICE)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(3, 5, device=DEVICE)
    out = compiled(x)  # forward only: fine
    torch.testing.assert_close(out.cpu(), model(x).cpu(), rtol=1e-5, atol=1e-5)
    with pytest.raises(NeuronCompileError, match="aten.mm.default"):
        out.sum().backward()


IMPORT_SCRIPT = """
import sys, torch, torch_neuronx
fn = torch.compile(lambda x: (x.sin() * 2).sum(), backend="neuron")
x = torch.randn(8, device="neuron", requires_grad=True)
fn(x).backward()
assert torch.allclose(x.grad.cpu(), 2 * x.detach().cpu().cos(), atol=1e-5)
print("torch._inductor.debug" in sys.modules)
"""


@pytest.mark.parametrize("compile_debug", ["0", "1"])
def test_compiling_does_not_import_inductor_debug_unless_compile_debug_is_on(compile_debug, tmp_path):
    """PyTorch's aot_autograd() helper imports torch._inductor.debug (0.15 s per
    process) for TORCH_COMPILE_DEBUG's logs; the backend skips it otherwise, and
    still uses the helper, logs and all, when that is set."""
    import subprocess
    import sys

    env = dict(os.environ, TORCH_COMPILE_DEBUG=compile_debug, TORCH_NEURONX_NEFF_DISABLE_CACHE="1")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", IMPORT_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == ("True" if compile_debug == "1" else "False")


def _split_by_counts(x, counts):
    parts = x.split(counts.tolist(), dim=0)  # shapes from tensor values
    return torch.cat([part * (i + 1) for i, part in enumerate(parts)])


def _scale_by_positives(x):
    return x * (x > 0).sum().item()


def _positive_sum(x):
    return x[x > 0].sum()  # boolean-mask indexing: nonzero, a data-dependent shape


@pytest.mark.parametrize("fn", [_split_by_counts, _scale_by_positives, _positive_sum],
                         ids=["tolist-split", "item", "bool-mask-index"])
def test_value_dependence_under_fullgraph_names_the_line_and_the_remedies(fn):
    """With fullgraph=True Dynamo captures .item()/.tolist() and ops with
    data-dependent output shapes in the graph; a static-shape graph cannot
    contain them. The error names the op, the line and the ways out, not the
    symbolic sizes and checks they brought along; with fullgraph=False Dynamo
    breaks the graph there and the result is right."""
    x = torch.randn(6, 3, device=DEVICE)
    args = (x, torch.tensor([2, 4], device=DEVICE)) if fn is _split_by_counts else (x,)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as caught:
        torch.compile(fn, backend="neuron", fullgraph=True)(*args)
    message = str(caught.value)
    line = fn.__code__.co_firstlineno + 1
    assert "depends on tensor values" in message and f'line {line}, in {fn.__name__}' in message, message
    assert "sym_size" not in message, message
    assert "fullgraph=False" in message and "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0" in message
    assert "built-in function" not in message and "sym_" not in message, message
    torch._dynamo.reset()
    got = torch.compile(fn, backend="neuron")(*args)
    torch.testing.assert_close(got.cpu(), fn(*args).cpu())


def test_host_read_runs_eagerly_with_fallback_execution(monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    x, counts = torch.randn(6, 3, device=DEVICE), torch.tensor([2, 4], device=DEVICE)
    with pytest.warns(UserWarning, match="running the inference graph eagerly"):
        got = torch.compile(_split_by_counts, backend="neuron", fullgraph=True)(x, counts)
    torch.testing.assert_close(got.cpu(), _split_by_counts(x, counts).cpu())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8])
def test_shift_operators_compile_as_bitwise_shifts(dtype):
    """`x >> n` / `x << n` trace as __rshift__ / __lshift__ (no lowering of their
    own): the backend decomposes them to bitwise_right/left_shift, arithmetic for
    signed types, by a Python int, a 0-d tensor and a tensor of amounts."""

    def shifts(x, amounts):
        return x >> 3, x << 2, x >> amounts, x << amounts, x.__rshift__(torch.tensor(1, dtype=dtype))

    low = -100 if dtype.is_signed else 0
    x = torch.randint(low, 100, (4, 8), dtype=dtype)
    amounts = torch.randint(0, 6, (4, 8), dtype=dtype)
    compiled = torch.compile(shifts, backend="neuron", fullgraph=True)  # raises if a graph op has no lowering
    got = compiled(x.to(DEVICE), amounts.to(DEVICE))
    for result, expected in zip(got, shifts(x, amounts)):
        assert result.dtype == expected.dtype
        assert torch.equal(result.cpu(), expected)


def _recording_graphs(monkeypatch):
    """The (graph, inputs, outputs) of each compiled-graph call."""
    from torch_neuronx.compiler import executable

    calls = []
    original = executable.CompiledGraph.__call__

    def recorded(self, args):
        outputs = original(self, args)
        calls.append((self, list(args), outputs))
        return outputs

    monkeypatch.setattr(executable.CompiledGraph, "__call__", recorded)
    return calls


def test_saved_views_of_inputs_are_host_views_not_xla_copies(monkeypatch):
    """AOTAutograd saves the matmuls' transposed weights and the input for the
    backward: the forward returns them as views of the inputs (no copy in XLA),
    the backward reads them where they are, and gradients equal eager's."""
    calls = _recording_graphs(monkeypatch)
    eager, compiled_model = mlp().to(DEVICE), mlp().to(DEVICE)
    compiled = torch.compile(compiled_model, backend="neuron")
    x = torch.randn(8, 16, device=DEVICE)
    eager(x).square().sum().backward()
    compiled(x).square().sum().backward()
    for p, q in zip(eager.parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-5, atol=1e-5)
    forward, inputs, outputs = calls[0]
    assert forward.input_views  # the transposed weights and x
    input_pointers = {t.data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
    for position in forward.input_views:
        assert outputs[position].data_ptr() in input_pointers  # a view, not a copy
    transposed = [outputs[p] for p in forward.input_views if not outputs[p].is_contiguous()]
    assert transposed  # the backward is handed transposed weights ...
    backward, _, _ = calls[1]
    assert any(key[1][-1][0] == "layouts" for key in _executable_keys(backward))  # ... read in place


def _executable_keys(graph):
    from torch_neuronx.compiler import executable

    return [key for key in executable._EXECUTABLES if key[0] == graph.key and key[1] and
            isinstance(key[1][-1], tuple) and key[1][-1][:1] == ("layouts",)]


def test_weight_updated_between_forward_and_backward_raises_as_in_eager():
    """The saved transposed weight is a view of the parameter, so autograd's
    version check sees an in-place update, as in eager (a copy would silently
    give gradients of the old weight)."""
    for model in (mlp().to(DEVICE), torch.compile(mlp().to(DEVICE), backend="neuron")):
        loss = model(torch.randn(8, 16, device=DEVICE)).sum()
        with torch.no_grad():
            list(model.parameters())[2].add_(1.0)  # the second Linear's weight, saved transposed
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transposed_inputs_are_read_in_place_and_give_the_same_results(dtype):
    from torch_neuronx.compiler.executable import _dense_layout

    fn = torch.compile(lambda a, b: a @ b + 1, backend="neuron")
    a = torch.randn(6, 5, device=DEVICE, dtype=dtype)
    b3 = torch.randn(4, 7, 5, device=DEVICE, dtype=dtype)
    dense, order = _dense_layout(b3.permute(2, 0, 1))
    assert order is not None and dense.is_contiguous() and dense.data_ptr() == b3.data_ptr()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for b in (torch.randn(5, 3, device=DEVICE, dtype=dtype),  # contiguous
              torch.randn(3, 5, device=DEVICE, dtype=dtype).t(),  # same shape, transposed
              torch.randn(5, 5, device=DEVICE, dtype=dtype).t()[:, :3]):  # not dense: copied
        expected = (a.cpu().float() @ b.cpu().float() + 1).to(dtype)
        torch.testing.assert_close(fn(a, b).cpu(), expected, **tol)
    batched = torch.compile(lambda p, q: torch.bmm(p, q), backend="neuron")
    p = torch.randn(4, 6, 5, device=DEVICE, dtype=dtype)
    q = torch.randn(5, 4, 7, device=DEVICE, dtype=dtype).permute(1, 0, 2)  # batch dim not outermost
    torch.testing.assert_close(batched(p, q).cpu(), torch.bmm(p.cpu().float(), q.cpu().float()).to(dtype), **tol)


def test_executables_run_on_the_calling_thread():
    """The backend sets jax's CPU client to run each executable on the calling
    thread (docs/compile.md, step speed): the worker-thread hand-off only cost
    wake-ups, as the backend waits for every graph's outputs at once. A compiled
    call still gives the eager result."""
    import jax

    from torch_neuronx import lowering

    lowering.load()
    assert jax.config.values["jax_cpu_enable_async_dispatch"] is False
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16)).to("neuron")
    x = torch.randn(4, 16, device="neuron")
    compiled = torch.compile(model, backend="neuron")
    for _ in range(3):
        torch.testing.assert_close(compiled(x).cpu(), model(x).cpu(), rtol=1e-5, atol=1e-5)
