"""The lowering table (ATen op -> jax) against PyTorch's own CPU kernels, and
torch.compile(backend="neuron") of real models against eager execution.

Op level: PyTorch's OpInfo samples (op_db and the _foreach_ databases, matched
to the lowered ops by name) are run on CPU under a dispatch mode that records
every ATen call that has a lowering, with its arguments and its result.
float32 samples also run backward, so backward ops (convolution_backward,
gelu_backward, ...) are recorded from their forward op's samples. Each
recorded call is then run through the lowering under jax.jit (as the compiler
runs it) on the same inputs; results must have the same dtype and shape, and
values within

    float32 (and bfloat16 results of float32 math):  rtol 1.3e-6, atol 1e-5
        (torch.testing's float32 defaults; transcendental functions included)
    sums of many terms (a lowering that emits dot_general, conv_general_dilated,
        fft or reduce_sum; found in its jaxpr, see contraction_length): atol raised
        to 2 * K * eps(dtype) * max|expected|, K the longest sum
    integers and bools:                                exact

Ops that OpInfo does not reach, and the semantics the compiler relies on
(type promotion, rounding modes, reduction dtypes, negative dims, slicing
with sys.maxsize, ...), have direct cases (_direct_cases). Every lowered op
must be exercised by at least one call, or its test fails. Calls per op are
capped (CAPS; each op's calls share one XLA compile) to keep the file fast.

Model level: a CNN, a TransformerEncoderLayer, a Llama-style block and a tiny
transformers LlamaForCausalLM, forward
and backward through torch.compile(backend="neuron", fullgraph=True), against
eager on the neuron device: within 1e-4 in float32, 1e-2 under
torch.autocast("neuron", dtype=torch.bfloat16); tiny transformers MoE models
(afmoe, ernie4_5_moe) forward, within 1e-4, and topk on ties (eager and the
lowering take the same indices).
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import torch_neuronx  # noqa: F401
import seeds
from torch_neuronx import lowering

jax = pytest.importorskip("jax")
import jax.extend.core  # noqa: E402
import jax.numpy as jnp  # noqa: E402

aten = torch.ops.aten
DEVICE = "neuron"

lowering.load()

# ----------------------------------------------------------------- tolerances
TIGHT = (1.3e-6, 1e-5)
# Primitives that sum many products or terms: XLA (dot/convolution/ducc FFT/reductions) sums in
# another order than MKL/oneDNN/pocketfft/ATen. Everything else, transcendental functions
# included, passes TIGHT.
CONTRACTIONS = ("dot_general", "conv_general_dilated", "fft", "reduce_sum")

FAST_COMPILE = {"xla_backend_optimization_level": 0}

# Calls checked per op: (float32, integer, bool) samples.
CAPS = {torch.float32: 2, torch.int64: 1, torch.bool: 1}
SAMPLES_PER_OPINFO = 3  # samples recorded per OpInfo and dtype

# Outputs whose indices may legitimately differ on ties: checked by the values they point at.
TIE_INDEX_OPS = {"sort", "topk", "kthvalue", "median", "max", "min", "cummax", "cummin"}
# Singular / eigen vectors are unique only up to sign (LAPACK builds and XLA may pick either):
# op -> (output index of the vectors, output index of the vectors sharing their sign or None).
# Both results are brought to one sign convention (largest entry of each vector positive).
SIGN_AMBIGUOUS_OPS = {"_linalg_eigh": (1, None), "_linalg_svd": (0, 2)}
# Outputs that are uninitialized memory in PyTorch: only shape and dtype are compared.
UNINITIALIZED_OPS = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}


def _ctc_backward_tolerance(call):
    """(rtol, atol) of _ctc_loss_backward: its gradient is grad * (exp(lp) - exp(log_alpha + log_beta
    + nll - lp)), an exponential of log-probabilities the size of the loss, each accumulated over T
    time steps. Each implementation's exponent is off by up to T * eps * |nll| (Higham's bound for a
    chain of T roundings of numbers that size), which scales a term of size at most |grad|."""
    grad, log_probs, neg_log_likelihood = call.args[0], call.args[1], call.args[5]
    finite = neg_log_likelihood[torch.isfinite(neg_log_likelihood)].abs()
    size = finite.max().item() if finite.numel() else 0.0
    steps = log_probs.shape[0]
    return TIGHT[0], max(TIGHT[1], 2 * steps * torch.finfo(log_probs.dtype).eps * size * grad.abs().max().item())


# Ops whose rounding error is not that of a sum of products: op -> (rtol, atol) for a call.
OWN_TOLERANCES = {"_ctc_loss_backward": _ctc_backward_tolerance}


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def _eqn_length(eqn):
    """Terms summed per output element by one contraction equation."""
    shapes = [v.aval.shape for v in eqn.invars]
    if eqn.primitive.name == "dot_general":
        (lhs_contracting, _), _ = eqn.params["dimension_numbers"]
        return math.prod(shapes[0][d] for d in lhs_contracting)
    if eqn.primitive.name == "conv_general_dilated":
        numbers = eqn.params["dimension_numbers"]
        kernel = math.prod(shapes[1]) // shapes[1][numbers.rhs_spec[0]]  # in-features x window
        groups = eqn.params["batch_group_count"]  # >1: weight gradients also sum over the batch
        return kernel * (shapes[0][numbers.lhs_spec[0]] // groups if groups > 1 else 1)
    if eqn.primitive.name == "reduce_sum":  # e.g. a vjp's sum over channels (grid_sampler_2d_backward)
        return math.prod(shapes[0][a] for a in eqn.params["axes"])
    return math.prod(eqn.params["fft_lengths"])


def _jaxpr_length(jaxpr):
    lengths = [0]
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in CONTRACTIONS:
            lengths.append(_eqn_length(eqn))
        lengths.extend(_jaxpr_length(sub) for sub in _sub_jaxprs(eqn))
    return max(lengths)


def contraction_length(call):
    """K, the longest sum (dot, convolution, FFT, reduce_sum) in the call's lowering; 0 if none.
    Read from the lowering's jaxpr, so a new contraction cannot be held to elementwise tolerance."""
    inputs, traced = _bind(call.op, call.args, call.kwargs)
    return _jaxpr_length(jax.make_jaxpr(traced)(inputs).jaxpr)


def _tolerance(length, want):
    """(rtol, atol). A sum of K products in float arithmetic is off by at most K * eps * (|a| @ |b|)
    (Higham, Accuracy and Stability, 3.1), in each of the two implementations compared; max|result|
    stands in for |a| @ |b| (the same size on random data: atol stays ~sqrt(K) above the typical
    random-walk error of K * eps * |a||b| / sqrt(K) even where the result cancels to ~0)."""
    rtol, atol = TIGHT
    if length and (want.is_floating_point() or want.is_complex()):
        finite = want[torch.isfinite(want)].abs()
        scale = finite.max().item() if finite.numel() else 0.0
        atol = max(atol, 2 * length * torch.finfo(want.dtype).eps * scale)
    return rtol, atol


# ------------------------------------------------------------------ recording
@dataclass
class Call:
    op: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    expected: object
    source: str

    @property
    def name(self):
        return self.op.overloadpacket.__name__


def _detached(tree):
    return pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone().resolve_conj().resolve_neg(), tree)


def _skipped(op) -> bool:
    return torch.Tag.nondeterministic_seeded in op.tags or lowering.lookup(op) is None


class _Recorder(TorchDispatchMode):
    """Records every ATen call that has a lowering: op, inputs, result."""

    def __init__(self, calls, source):
        super().__init__()
        self.calls, self.source = calls, source

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.OpOverload) or _skipped(func):
            return func(*args, **kwargs)
        saved = _detached((args, kwargs))
        out = func(*args, **kwargs)
        self.calls.append(Call(func, saved[0], saved[1], _detached(out), self.source))
        return out


EXTRA_OPINFOS = {
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d", "nn.functional.cross_entropy",
    "nn.functional.interpolate", "nn.functional.scaled_dot_product_attention", "nn.functional.prelu",
    "nn.functional.relu6", "nn.functional.celu", "nn.functional.selu", "nn.functional.glu", "__getitem__",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.upsample_nearest",
    "nn.functional.upsample_bilinear", "square", "nn.functional.normalize", "nn.functional.fold",
    "nn.functional.softsign", "nn.functional.tanhshrink", "nn.functional.kl_div", "nn.functional.grid_sample",
}
EXCLUDED_OPINFOS = {"bernoulli", "nn.functional.dropout", "rand_like", "randn", "randn_like", "sparse.mm",
                    "linalg.norm", "linalg.diagonal", "nn.functional.multi_head_attention_forward"}


def _packet_names():
    names = set()
    for target in lowering.LOWERINGS:
        if isinstance(target, torch._ops.HigherOrderOperator):
            continue  # graph glue (with_effects): tested with the ops it wraps, in test_registry_invariant
        packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
        overloads = [getattr(packet, o) for o in packet.overloads()]
        if packet.__name__ not in SEEDED_BUT_CHECKED and overloads and all(
                torch.Tag.nondeterministic_seeded in o.tags for o in overloads):
            continue  # random ops: lowered by the compiler's RNG work, not checked against CPU values
        names.add(packet.__name__)
    return sorted(names)


# Tagged random only for dropout: deterministic with dropout_p=0, as in every direct case.
SEEDED_BUT_CHECKED = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"}
PACKETS = _packet_names()


def _name_variants(name):
    out, base = {name}, name
    for prefix in ("_", "native_"):
        if base.startswith(prefix):
            base = base[len(prefix):]
            out.add(base)
    for suffix in ("_backward_data", "_backward", "_with_indices", "_forward", "_legit_functional",
                   "_legit_no_training", "_legit", "_copy", "_for_cpu", "_overrideable"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            out.add(base)
    return out


@functools.cache
def _opinfos():
    from torch.testing._internal import common_methods_invocations as cmi

    wanted = set().union(*[_name_variants(p) for p in PACKETS])
    chosen = []
    for info in cmi.op_db:
        base = info.name.split(".")[-1]
        if info.name in EXCLUDED_OPINFOS:
            continue
        if info.name.startswith("masked."):
            continue
        if base in wanted or (info.aten_name or "") in wanted or info.name in EXTRA_OPINFOS:
            chosen.append(info)
    foreach = [info for db in (cmi.foreach_unary_op_db, cmi.foreach_binary_op_db, cmi.foreach_pointwise_op_db,
                               cmi.foreach_reduce_op_db, cmi.foreach_other_op_db) for info in db]
    return chosen, [info for info in foreach if info.name in wanted]


def _grad_inputs(sample):
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]


def _run_sample(info, sample, backward):
    out = info.op(sample.input, *sample.args, **sample.kwargs)
    if not backward:
        return
    outputs = [t for t in pytree.tree_leaves(out)
               if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    inputs = _grad_inputs(sample)
    if outputs and inputs:
        generator = torch.Generator().manual_seed(seeds.seed(0))
        grads = [torch.randn(o.shape, generator=generator, dtype=o.dtype) for o in outputs]
        torch.autograd.grad(outputs, inputs, grads, allow_unused=True)


def _record_info(info, dtype, calls, foreach=False):
    supported = info.supported_dtypes("cpu")
    if dtype not in supported:
        return
    backward = dtype == torch.float32 and info.supports_autograd and not foreach
    source = f"{info.name}{'.' + info.variant_test_name if info.variant_test_name else ''}"
    torch.manual_seed(seeds.seed(0))
    try:
        # sample_inputs_func directly: OpInfo.sample_inputs inspects the whole call
        # stack on every call (for its test-tracking), which costs more than the samples.
        extra = {"num_input_tensors": [2]} if foreach else {}
        samples = info.sample_inputs_func(info, "cpu", dtype, backward, **extra)
        samples = list(itertools.islice(samples, SAMPLES_PER_OPINFO))
    except Exception:  # noqa: BLE001 - a sample generator that fails on CPU gives no samples
        return
    for sample in samples:
        recorded = []
        try:
            with _Recorder(recorded, source):
                _run_sample(info, sample, backward)
        except Exception:  # noqa: BLE001 - PyTorch rejects some samples (errors are not semantics)
            pass
        calls.extend(recorded)


@functools.cache
def recorded_calls():
    """packet name -> dtype -> calls, from OpInfo samples."""
    chosen, foreach = _opinfos()
    torch.manual_seed(seeds.seed(0))
    calls = []
    for info in chosen:
        for dtype in CAPS:
            _record_info(info, dtype, calls)
    for info in foreach:
        _record_info(info, torch.float32, calls, foreach=True)
    table = {}
    for call in calls:
        table.setdefault(call.name, {}).setdefault(_call_dtype(call), []).append(call)
    return table


def _call_dtype(call):
    tensors = [t for t in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors:
        outs = [t for t in pytree.tree_leaves(call.expected) if isinstance(t, torch.Tensor)]
        tensors = outs
    dtype = tensors[0].dtype if tensors else torch.float32
    if dtype.is_floating_point:
        return torch.float32
    return torch.bool if dtype == torch.bool else torch.int64


def _in_scope(call) -> bool:
    """Calls outside what the compiler can lower by design (documented in the lowerings)."""
    leaves = [t for t in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(t, torch.Tensor)]
    if call.name in ("index", "_unsafe_index", "index_put", "_unsafe_index_put"):
        masks = [t for t in pytree.tree_leaves(call.args[1]) if isinstance(t, torch.Tensor)
                 and t.dtype in (torch.bool, torch.uint8)]
        if masks and (call.name in ("index", "_unsafe_index") or call.args[2].numel() != 1):
            return False  # boolean-mask indexing: data-dependent shape
    if call.name in ("as_strided", "as_strided_scatter"):
        base = call.args[0]
        return base.is_contiguous() and base.storage_offset() == 0  # lowered on the contiguous base
    return bool(leaves) or call.name in ("full", "arange", "linspace", "scalar_tensor", "eye", "zeros", "ones",
                                         "empty", "empty_strided", "empty_permuted", "iota", "_assert_scalar")


def _select(calls, cap):
    """Up to `cap` calls, spread over their sources (round robin) and overloads."""
    groups = {}
    for call in filter(_in_scope, calls):
        groups.setdefault((call.source, call.op), []).append(call)
    picked = []
    for round_ in itertools.zip_longest(*groups.values()):
        for call in round_:
            if call is not None and len(picked) < cap:
                picked.append(call)
    return picked


# -------------------------------------------------------------------- checking
_BYTE_FLOATS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)


def _to_jax(t: torch.Tensor):
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
    if t.dtype in _BYTE_FLOATS:  # numpy has no float8: the bytes, as the compiler hands them to XLA
        bits = jnp.asarray(t.contiguous().view(torch.uint8).numpy())
        return jax.lax.bitcast_convert_type(bits, lowering.conversions.jax_dtype(t.dtype))
    return jnp.asarray(t.numpy())


def _to_torch(value):
    array = np.asarray(value)
    if array.dtype == jnp.bfloat16:
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    if str(array.dtype).startswith("float8"):
        bits = torch.from_numpy(np.asarray(jax.lax.bitcast_convert_type(value, jnp.uint8)).copy())
        return bits.view(lowering.conversions.torch_dtype(array.dtype))
    return torch.from_numpy(array.copy())


def _bind(op, args, kwargs):
    """(jax inputs, fn of those inputs calling the lowering with the non-tensor arguments as given)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    fn = lowering.lookup(op)

    def traced(values):
        rebuilt = list(leaves)
        for i, value in zip(positions, values):
            rebuilt[i] = value
        call_args, call_kwargs = pytree.tree_unflatten(rebuilt, spec)
        return fn(*call_args, **call_kwargs)

    return [_to_jax(leaves[i]) for i in positions], traced


def run_lowering(op, args, kwargs):
    """The lowering of `op` under jax.jit on the tensors of (args, kwargs); torch results."""
    return run_lowerings([(op, args, kwargs)])[0]


def run_lowerings(requests):
    """Several lowering calls traced into one jax.jit (one XLA compile for all)."""
    bound = [_bind(*request) for request in requests]
    inputs = [arrays for arrays, _ in bound]
    jitted = jax.jit(lambda inputs: [traced(values) for (_, traced), values in zip(bound, inputs)])
    # Same StableHLO as the compiler produces; LLVM optimizations off (they change
    # code speed, not semantics) since compiling dominates this file's run time.
    executable = jitted.lower(inputs).compile(compiler_options=FAST_COMPILE)
    return [_convert_out(out) for out in executable(inputs)]


def _convert_out(out):
    if out is None:
        return None
    if isinstance(out, (list, tuple)):
        return [_convert_out(o) for o in out]
    return _to_torch(out)


def _flat(value):
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def check_calls(calls):
    """All calls in one compile; on any failure, each call alone (to name the failing one)."""
    try:
        results = run_lowerings([(c.op, c.args, c.kwargs) for c in calls])
        for call, got in zip(calls, results):
            compare(call, got)
    except Exception:  # noqa: BLE001 - rerun one by one for a precise report
        for call in calls:
            check_call(call)
        raise


def check_call(call: Call):
    compare(call, run_lowering(call.op, call.args, call.kwargs))


def _sign_of_largest(vectors):
    """+-1 per column: the sign of its largest-magnitude entry."""
    largest = vectors.abs().argmax(dim=-2, keepdim=True)
    signs = torch.gather(vectors, -2, largest).sign()
    return torch.where(signs == 0, torch.ones_like(signs), signs)


def _canonical_signs(call, outputs):
    """Singular/eigen vectors flipped so each one's largest entry is positive. SVD: the sign of
    U's column i also flips Vh's row i (they are determined together); columns of a full U or
    rows of a full Vh past min(m, n) span a complement and are normalized on their own."""
    column, partner = SIGN_AMBIGUOUS_OPS[call.name]
    outputs = list(outputs)
    vectors = outputs[column]
    if vectors is None or vectors.numel() == 0:
        return outputs
    signs = _sign_of_largest(vectors)
    outputs[column] = vectors * signs
    if partner is not None:
        rows = outputs[partner].clone()
        k = min(signs.shape[-1], rows.shape[-2])
        rows[..., :k, :] *= signs[..., :k].mT
        rows[..., k:, :] *= _sign_of_largest(rows[..., k:, :].mT).mT
        outputs[partner] = rows
    return outputs


def compare(call: Call, got):
    expected, actual = _flat(call.expected), _flat(got)
    if call.name in SIGN_AMBIGUOUS_OPS and len(actual) == len(expected):
        expected, actual = _canonical_signs(call, expected), _canonical_signs(call, actual)
    where = f"{call.op} from {call.source}"
    assert len(actual) == len(expected), f"{where}: {len(actual)} outputs, expected {len(expected)}"
    length = contraction_length(call)
    for i, (want, have) in enumerate(zip(expected, actual)):
        if not isinstance(want, torch.Tensor):
            assert have is None or want is None, f"{where} output {i}: got {have}, expected {want}"
            continue
        assert have is not None, f"{where} output {i}: got None, expected a tensor"
        assert have.shape == want.shape and have.dtype == want.dtype, (
            f"{where} output {i}: got {tuple(have.shape)} {have.dtype}, expected {tuple(want.shape)} {want.dtype}"
        )
        if call.name in UNINITIALIZED_OPS:
            continue
        if call.name in TIE_INDEX_OPS and want.dtype == torch.int64 and i > 0 and _tie_consistent(call, i, have, want):
            continue
        rtol, atol = OWN_TOLERANCES[call.name](call) if call.name in OWN_TOLERANCES else _tolerance(length, want)
        torch.testing.assert_close(have, want, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{where} output {i}: {m}")


def _tie_consistent(call, i, have, want):
    """Indices that differ only between equal values (ties) are both right."""
    values = _flat(call.expected)[0]
    source = call.args[0]
    if values.shape != want.shape or source.ndim == 0:
        return False
    dim = call.args[1] if len(call.args) > 1 and isinstance(call.args[1], int) else call.kwargs.get("dim", -1)
    if call.name in ("topk", "kthvalue"):
        dim = call.args[2] if len(call.args) > 2 else call.kwargs.get("dim", -1)
    if call.name == "median" and len(call.args) == 1:
        return torch.equal(source.reshape(-1)[have], values) or bool(torch.isnan(values).all())
    keepdim_shape = want.dim() == source.dim()
    gather_index = have if keepdim_shape else have.unsqueeze(dim % source.dim())
    try:
        picked = torch.gather(source, dim, gather_index)
    except RuntimeError:
        return False
    if not keepdim_shape:
        picked = picked.squeeze(dim % source.dim())
    return torch.equal(picked, values) or torch.allclose(picked, values, equal_nan=True)


# -------------------------------------------------------------- direct cases
def _t(*shape, dtype=torch.float32, low=-3, high=3, seed=0):
    generator = torch.Generator().manual_seed(seeds.seed(seed + sum(shape)))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if not dtype.is_floating_point:
        return torch.randint(low, high, shape, generator=generator, dtype=dtype)
    return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)


def _grad_for(op, *args, **kwargs):
    """A random gradient shaped like op's (first) output."""
    out = op(*args, **kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return _t(*out.shape, seed=7)


def _pad_backward(forward, x, padding):
    backward = getattr(aten, forward.__name__ + "_backward").default
    return _direct(backward, _grad_for(forward.default, x, padding), x, padding)


def _pool_backward(forward, x, *params):
    backward = getattr(aten, forward.__name__ + "_backward").default
    return _direct(backward, _grad_for(forward.default, x, *params), x, *params)


def _direct(op, *args, **kwargs):
    return Call(op, args, kwargs, op(*args, **kwargs), "direct")


def _encoder_layer_cases():
    """nn.TransformerEncoderLayer's fast path: post/pre-norm, relu/gelu, each mask
    type (0: (L, S), 1: (B, S) key padding, 2: (B, H, L, S)), boolean and float
    masks, a fully masked row."""
    src = _t(2, 5, 8, low=-1, high=1)
    weights = [_t(24, 8, low=-0.5, high=0.5, seed=1), _t(24, seed=2, low=-0.1, high=0.1),
               _t(8, 8, low=-0.5, high=0.5, seed=3), _t(8, seed=4, low=-0.1, high=0.1)]
    norms = [_t(8, seed=5, low=0.5, high=1.5), _t(8, seed=6, low=-0.1, high=0.1),
             _t(8, seed=7, low=0.5, high=1.5), _t(8, seed=8, low=-0.1, high=0.1)]
    ffn = [_t(16, 8, low=-0.5, high=0.5, seed=9), _t(16, seed=10, low=-0.1, high=0.1),
           _t(8, 16, low=-0.5, high=0.5, seed=11), _t(8, seed=12, low=-0.1, high=0.1)]
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    full = torch.zeros(2, 2, 5, 5, dtype=torch.bool)
    full[1, 0, 2] = True  # one query sees no key
    float_padding = torch.zeros(2, 5).masked_fill(padding, float("-inf"))

    def case(use_gelu, norm_first, mask=None, mask_type=None):
        return _direct(aten._transformer_encoder_layer_fwd.default, src, 8, 2, *weights, use_gelu, norm_first,
                       1e-5, *norms, *ffn, mask, mask_type)

    return [case(False, False), case(True, True), case(True, False, causal, 0), case(False, True, padding, 1),
            case(False, False, float_padding, 1), case(True, False, full, 2)]


def _grouped_mm_cases():
    """torch._grouped_mm's four forms (MoE experts and their backward), with an
    empty group and groups of uneven sizes; offsets are int32, as PyTorch requires."""
    offs = torch.tensor([8, 8, 20, 32], dtype=torch.int32)  # group 1 is empty
    rows, experts = _t(32, 16, low=-1, high=1), _t(4, 16, 8, low=-1, high=1, seed=1)
    return [
        _direct(aten._grouped_mm.default, rows, experts, offs),  # 2D x 3D: tokens x expert weights
        _direct(aten._grouped_mm.default, rows.t().contiguous(), _t(32, 8, seed=2), offs),  # 2D x 2D: weight grads
        _direct(aten._grouped_mm.default, _t(4, 8, 16, seed=3), rows.t().contiguous(), offs),  # 3D x 2D
        _direct(aten._grouped_mm.default, _t(4, 8, 16, seed=3), experts),  # 3D x 3D, no offsets
    ]


def _scaled_mm_cases():
    """torch._scaled_mm against CPU PyTorch's kernel (tensor-wise and row-wise scales,
    mat2 column-major, a bias, bf16 and float32 out) and torch._scaled_grouped_mm
    against the reference of ops/float8.py (CPU PyTorch has no kernel for it);
    block scaling and every form: tests/test_fp8.py."""
    from torch_neuronx.ops import float8

    a = _t(16, 32, low=-4, high=4).to(torch.float8_e4m3fn)
    b = _t(24, 32, low=-4, high=4, seed=1).to(torch.float8_e4m3fn).t()
    row, col = _t(16, 1, low=0.1, high=1, seed=2), _t(1, 24, low=0.1, high=1, seed=3)
    offs = torch.tensor([16, 16, 32], dtype=torch.int32)
    experts = _t(3, 24, 32, low=-4, high=4, seed=4).to(torch.float8_e4m3fn).transpose(-2, -1)
    grouped = (torch.cat([a, a]), experts, _t(32, low=0.1, high=1, seed=5), _t(3, 24, low=0.1, high=1, seed=6), offs)
    return [
        _direct(aten._scaled_mm.default, a, b, torch.tensor(0.5), torch.tensor(2.0),
                bias=_t(24, seed=7).to(torch.bfloat16), out_dtype=torch.bfloat16),
        _direct(aten._scaled_mm.default, a, b, row, col, out_dtype=torch.float32),
        Call(aten._scaled_grouped_mm.default, grouped, {}, float8.scaled_grouped_mm_reference(*grouped), "direct"),
    ]


def _direct_cases():
    """Ops OpInfo does not reach (or reaches only in one form), and the semantics the
    compiler depends on: promotion, rounding modes, dtypes of reductions, dims, slicing."""
    x, y = _t(3, 4), _t(3, 4, seed=1)
    i = _t(3, 4, dtype=torch.int64)
    b = _t(3, 4, dtype=torch.bool)
    img = _t(2, 3, 7, 6)
    vol = _t(1, 2, 5, 4, 4)
    seq = _t(2, 3, 9)
    q, k, v = _t(2, 2, 5, 8), _t(2, 2, 6, 8, seed=1), _t(2, 2, 6, 8, seed=2)
    idx = torch.tensor([2, 0, -1])
    cases = [
        # type promotion
        _direct(aten.add.Tensor, i, 1.5), _direct(aten.add.Tensor, b, 2), _direct(aten.add.Tensor, b, b),
        _direct(aten.add.Tensor, i, torch.tensor(2.5, dtype=torch.float64)),
        _direct(aten.mul.Tensor, x, torch.tensor(3, dtype=torch.int64)),
        _direct(aten.add.Tensor, x.to(torch.bfloat16), x.to(torch.float16)),
        _direct(aten.sub.Tensor, i, i.flip(0), alpha=3), _direct(aten.add.Scalar, i, 2, alpha=2),
        _direct(aten.rsub.Scalar, x, 2.0, alpha=0.5),
        _direct(aten.div.Tensor, i, torch.tensor([1, 2, -3, 4])),
        _direct(aten.div.Tensor_mode, i, torch.tensor([1, 2, -3, 4]), rounding_mode="trunc"),
        _direct(aten.div.Tensor_mode, i, torch.tensor([1, 2, -3, 4]), rounding_mode="floor"),
        _direct(aten.div.Scalar_mode, x, -0.7, rounding_mode="floor"),
        _direct(aten.div.Scalar_mode, x, 0.7, rounding_mode="trunc"),
        _direct(aten.remainder.Scalar, i, -3), _direct(aten.remainder.Tensor, x, y),
        _direct(aten.fmod.Scalar, i, 3), _direct(aten.floor_divide.default, i, torch.tensor(-2)),
        _direct(aten.pow.Scalar, 2.0, i), _direct(aten.pow.Scalar, 2, x), _direct(aten.pow.Tensor_Scalar, i, 2),
        _direct(aten.pow.Tensor_Scalar, x, 0.5), _direct(aten.pow.Tensor_Scalar, x.abs(), -1.5),
        _direct(aten.where.self, b, x, torch.tensor(0.0)), _direct(aten.where.self, b, i, torch.tensor(2.5)),
        _direct(aten.where.self, b, torch.tensor(1.0, dtype=torch.float64), i),
        _direct(aten.where.ScalarOther, b, i, 2.5), _direct(aten.where.ScalarSelf, b, 1, i),
        _direct(aten.where.Scalar, b, 1.0, 0.0),
        _direct(aten.clamp.Tensor, x, y.clamp(max=0), y.clamp(min=0)), _direct(aten.clamp.default, i, 0.5),
        _direct(aten.clamp.default, x, None, 1), _direct(aten.clamp_min.default, i, -1),
        _direct(aten.masked_fill.Scalar, x, b, -1e9), _direct(aten.masked_fill.Tensor, i, b, torch.tensor(7)),
        _direct(aten.eq.Scalar, i, 1.0), _direct(aten.lt.Tensor, x, i),
        _direct(aten.logical_and.default, x, i), _direct(aten.bitwise_and.Scalar, i, 6),
        _direct(aten.maximum.default, x, torch.tensor([float("nan"), 1, 2, 3])),
        # conversions
        _direct(aten._to_copy.default, x, dtype=torch.int64), _direct(aten._to_copy.default, x, dtype=torch.bool),
        _direct(aten._to_copy.default, b, dtype=torch.float32), _direct(aten._to_copy.default, x, dtype=torch.bfloat16),
        _direct(aten._to_copy.default, i, dtype=torch.bool),
        _direct(torch.ops.prims.convert_element_type.default, x, torch.float64),
        _direct(torch.ops.prims.convert_element_type.default, x, torch.int32), _direct(aten.copy.default, x, i[0]),
        _direct(aten.copy_.default, x.clone(), y), _direct(aten.lift_fresh_copy.default, x),
        _direct(aten.alias.default, x), _direct(aten.detach.default, x), _direct(aten.lift_fresh.default, x),
        _direct(aten._unsafe_view.default, x, [2, -1]), _direct(aten.view.dtype, x, torch.int32),
        _direct(aten.view.dtype, x, torch.bfloat16), _direct(aten.view.dtype, i.int(), torch.int64),
        # reductions: dtypes, keepdim, negative dims
        _direct(aten.sum.default, b), _direct(aten.sum.dim_IntList, i, [-1], True),
        _direct(aten.sum.dim_IntList, x, [], False), _direct(aten.sum.dim_IntList, i.int(), [0]),
        _direct(aten.mean.dim, x, [-2, -1], True), _direct(aten.prod.default, i.int()),
        _direct(aten.amax.default, x, [-1], True), _direct(aten.amin.default, i, []), _direct(aten.argmax.default, x),
        _direct(aten.argmax.default, x, -1, True), _direct(aten.argmin.default, i, 0),
        _direct(aten.var.correction, x, [1], correction=0),
        _direct(aten.var.correction, x, None, correction=2, keepdim=True),
        _direct(aten.std.correction, x, [0], correction=1), _direct(aten.var_mean.correction, x, [1], correction=0),
        _direct(aten.any.dims, b, [0, 1]), _direct(aten.all.dim, b, -1),
        _direct(aten.logsumexp.default, torch.tensor([[float("-inf")] * 3, [1.0, 2.0, 3.0]]), [1]),
        _direct(aten.linalg_vector_norm.default, x, 0, [1]), _direct(aten.linalg_vector_norm.default, x, float("inf")),
        _direct(aten.linalg_vector_norm.default, x, 3.5, [0], True),
        _direct(aten.cumsum.default, b, 1), _direct(aten.cumsum.default, x, -1),
        _direct(aten.cumsum.default, i, 0, dtype=torch.float32),
        _direct(aten.sort.stable, torch.tensor([3, 1, 3, 2, 1, 3]), stable=True, descending=True),
        _direct(aten.sort.stable, torch.tensor([2.0, float("nan"), -1.0, 2.0, 0.0]), stable=True),
        _direct(aten.sort.stable, torch.tensor([2.0, float("nan"), -1.0, 2.0, 0.0]), stable=True, descending=True),
        _direct(aten.sort.default, b, 0), _direct(aten.topk.default, x, 2, 0, False),
        _direct(aten.max.dim, x, 1, True), _direct(aten.min.default, i), _direct(aten.max.other, x, y),
        # shapes and views
        _direct(aten.slice.Tensor, x, 1, 1, sys.maxsize), _direct(aten.slice.Tensor, x, -1, -3, -1, 2),
        _direct(aten.slice.Tensor, x, 0, 5, 10), _direct(aten.expand.default, x[:, :1], [2, -1, 5]),
        _direct(aten.view.default, x, [-1, 6]),
        _direct(aten.select.int, x, -1, -2),
        _direct(aten.squeeze.dims, x[None], [0, 2]),
        _direct(aten.unsqueeze.default, x, -1), _direct(aten.permute.default, img, [0, -1, 1, 2]),
        _direct(aten.cat.default, [x, i]), _direct(aten.cat.default, [x, torch.empty(0)], -1),
        _direct(aten.split_with_sizes.default, x, [1, 3], -1), _direct(aten.split.Tensor, x, 3, 1),
        _direct(aten.index.Tensor, x, [idx]), _direct(aten.index.Tensor, img, [None, idx, torch.tensor([[1], [0]])]),
        _direct(aten.index.Tensor, img, [None, None, None, idx]),
        _direct(aten.index.Tensor, img, [torch.tensor([1, 0, -1]), None, torch.tensor([0, 6, -2])]),
        _direct(aten._unsafe_index.Tensor, img, [None, None, torch.tensor([0, 0, 3]), None]),
        _direct(aten.index_put.default, x, [idx], torch.tensor(5.0)),
        _direct(aten.index_put.default, x, [torch.tensor([0, 0, 2]), torch.tensor([1, 1, -1])],
                torch.tensor([1.0, 2.0, 3.0]), True),
        _direct(aten.index_put.default, x, [None, torch.tensor([0, 0, 3])], torch.ones(3, 3), True),
        _direct(aten.index_put.default, x, [b], torch.tensor(0.0)),
        _direct(aten._unsafe_index_put.default, i, [torch.tensor([1, 2])], torch.tensor([7, 8, 9, 10]), False),
        _direct(aten._unsafe_masked_index.default, x, b[:, :2], [None, torch.tensor([0, 5])], 0.5),
        _direct(aten._unsafe_masked_index_put_accumulate.default, x, b[:, :2], [None, torch.tensor([0, 5])],
                torch.ones(3, 2)),
        _direct(aten.scatter.src, x, 1, torch.tensor([[0, 1], [2, 3], [3, 0]]), y),
        _direct(aten.scatter.value, x, 0, torch.tensor([[0, 1, 2, 0]]), 2.5),
        _direct(aten.scatter.reduce, x, 1, torch.tensor([[0, 0], [1, 1], [2, 2]]), y, reduce="add"),
        _direct(aten.scatter_add.default, x, 1, torch.tensor([[0, 0, 0], [1, 1, 3], [2, 2, 2]]), y),
        _direct(aten.scatter_reduce.two, x, 0, torch.tensor([[0, 0, 0, 0], [0, 1, 2, 2]]), y, "mean",
                include_self=False),
        _direct(aten.scatter_reduce.two, i, 1, torch.tensor([[0, 0], [1, 1], [3, 3]]), i, "amax"),
        _direct(aten.gather.default, x, 1, torch.tensor([[0, 3], [2, 1]])),
        _direct(aten.gather.default, x, 0, torch.tensor([[2, 0, 1, 1]])),
        _direct(aten.index_select.default, x, -1, torch.tensor([3, 0])),
        _direct(aten.index_copy.default, x, 1, torch.tensor([3, 0]), y[:, :2]),
        _direct(aten.index_fill.int_Scalar, x, 0, torch.tensor([1]), -2.0),
        _direct(aten.index_add.default, x, 0, torch.tensor([0, 0, 2]), y, alpha=2),
        _direct(aten.masked_scatter.default, x, b, y * 10),
        _direct(aten.embedding.default, x, torch.tensor([[0, 2], [1, 1]])),
        _direct(aten.embedding_dense_backward.default, x[:2], torch.tensor([1, 1]), 5, 1, False),
        _direct(aten.embedding_dense_backward.default, _t(2, 3, 4), torch.tensor([[0, 2, 0], [1, 2, 2]]), 4, -1, True),
        _direct(aten.slice_scatter.default, x, y[:, :2], 1, 1, sys.maxsize, 2),
        _direct(aten.select_scatter.default, x, y[0], 0, -1),
        _direct(aten.diagonal_scatter.default, x, torch.ones(3), 1, 0, 1),
        _direct(aten.as_strided.default, x, [2, 2], [1, 4], 1),
        _direct(aten.as_strided_scatter.default, x, torch.ones(2, 2), [2, 2], [1, 4], 1),
        _direct(aten.constant_pad_nd.default, img, [1, -2, -1, 3], 0.5),
        _direct(aten.constant_pad_nd.default, b, [2, 1]),
        _direct(aten.triu.default, x, 1), _direct(aten.tril.default, img, -1), _direct(aten.flip.default, x, [0, -1]),
        _direct(aten.roll.default, x, [1], []), _direct(aten.repeat.default, x, [2, 1, 2]),
        _direct(aten.unfold.default, x, -1, 2, 1), _direct(aten.diagonal.default, img, 1, -1, -2),
        # creation
        _direct(aten.full.default, [2, 3], 1), _direct(aten.full.default, [2], True),
        _direct(aten.full.default, [2, 2], 0.5, dtype=torch.bfloat16), _direct(aten.full_like.default, i, 2.7),
        _direct(aten.scalar_tensor.default, 3), _direct(aten.scalar_tensor.default, 1, dtype=torch.int64),
        _direct(aten.arange.default, 5), _direct(aten.arange.start_step, 0, 1, 0.1),
        _direct(aten.arange.start_step, 10, -3, -3), _direct(aten.arange.start, 2.0, 7, dtype=torch.int64),
        _direct(aten.linspace.default, -1, 1, 7), _direct(aten.eye.default, 3), _direct(aten.eye.m, 2, 4),
        _direct(torch.ops.prims.iota.default, 5, start=3, step=2, dtype=torch.int64, device="cpu", requires_grad=False),
        _direct(torch.ops.prims.iota.default, 4, start=0, step=1, dtype=torch.int32, device="cpu", requires_grad=False),
        _direct(aten.empty.memory_format, [2, 3]), _direct(aten.empty_permuted.default, [2, 3], [1, 0]),
        _direct(aten.empty_strided.default, [2, 3], [1, 2], dtype=torch.int64),
        _direct(aten.zeros.default, [2, 3]), _direct(aten.ones.default, [3], dtype=torch.int64),
        _direct(aten.fill.Scalar, x, 2), _direct(aten.fill.Tensor, i, torch.tensor(1.5)),
        _direct(aten.new_zeros.default, x, [2]), _direct(aten.new_full.default, i, [3], 2),
        _direct(aten.one_hot.default, torch.tensor([0, 2, 1]), 4),
        # asserts are dropped
        _direct(aten._assert_async.msg, torch.tensor(True), "ok"),
        _direct(aten._assert_tensor_metadata.default, x, dtype=torch.float32),
        _direct(aten._assert_scalar.default, True, "ok"),
        # elementwise ops with no OpInfo of their own
        _direct(torch.ops.prims.fma.default, x, y, i.float()),
        _direct(aten.lerp.Scalar, x, y, 0.3), _direct(aten.lerp.Tensor, x, y, y.sigmoid()),
        _direct(aten.addcmul.default, x, y, i.float(), value=0.5),
        _direct(aten.addcdiv.default, x, y, y.abs() + 1, value=-2),
        _direct(aten.threshold.default, x, 0.5, -1.0),
        _direct(aten.sigmoid_backward.default, x, y.sigmoid()), _direct(aten.tanh_backward.default, x, y.tanh()),
        _direct(aten.threshold_backward.default, x, y, 0.0),
        _direct(aten.gelu_backward.default, x, y), _direct(aten.gelu_backward.default, x, y, approximate="tanh"),
        _direct(aten.silu_backward.default, x, y), _direct(aten.mish_backward.default, x, y),
        _direct(aten.leaky_relu_backward.default, x, y, 0.2, False),
        _direct(aten.hardtanh_backward.default, x, y, -1.0, 1.0),
        _direct(aten.elu_backward.default, x, 1.0, 1.0, 1.0, False, y),
        _direct(aten.elu_backward.default, x, 1.5, 1.0507, 1.0, True, F.elu(y, 1.5)),
        _direct(aten.softplus_backward.default, x, y, 2.0, 1.0),
        _direct(aten.hardsigmoid_backward.default, x, y), _direct(aten.hardswish_backward.default, x, y),
        _direct(aten.log_sigmoid_forward.default, x),
        _direct(aten.log_sigmoid_backward.default, x, y, aten.log_sigmoid_forward.default(y)[1]),
        _direct(aten.logit_backward.default, x, y.sigmoid(), 1e-6),
        _direct(aten._prelu_kernel.default, img, torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1)),
        _direct(aten._prelu_kernel_backward.default, img, img.flip(0), torch.tensor([0.1, 0.2, 0.3]).view(3, 1, 1)),
        _direct(aten.round.decimals, x, decimals=2),
        # softmax and norms
        _direct(aten._softmax.default, x.to(torch.bfloat16), 1, False), _direct(aten._log_softmax.default, x, 0, False),
        _direct(aten._softmax_backward_data.default, x, y.softmax(1), 1, torch.float32),
        _direct(aten._log_softmax_backward_data.default, x, y.log_softmax(0), 0, torch.float32),
        _direct(aten.native_layer_norm.default, img, [7, 6], None, _t(7, 6), 1e-5),
        _direct(aten.native_layer_norm_backward.default, img, img.flip(0), [6], img.mean(-1, keepdim=True),
                img.var(-1, unbiased=False, keepdim=True).add(1e-5).rsqrt(), _t(6), _t(6), [True, True, True]),
        _direct(aten.native_layer_norm_backward.default, img, img.flip(0), [6], img.mean(-1, keepdim=True),
                img.var(-1, unbiased=False, keepdim=True).add(1e-5).rsqrt(), None, None, [True, False, False]),
        _direct(aten.native_group_norm.default, img, _t(3), _t(3), 2, 3, 42, 3, 1e-5),
        _direct(aten.native_group_norm_backward.default, img.flip(0), img,
                img.reshape(2, -1).mean(1, keepdim=True),
                img.reshape(2, -1).var(1, unbiased=False, keepdim=True).add(1e-5).rsqrt(),
                _t(3), 2, 3, 42, 1, [True, True, True]),
        _direct(aten._native_batch_norm_legit_functional.default, img, _t(3), _t(3), _t(3), _t(3).abs(), True, 0.1,
                1e-5),
        _direct(aten._native_batch_norm_legit_no_training.default, img, _t(3), None, _t(3), _t(3).abs(), 0.1, 1e-5),
        _direct(aten._native_batch_norm_legit.default, seq, None, None, _t(3), _t(3).abs(), True, 0.1, 1e-5),
        _direct(aten._native_batch_norm_legit.no_stats, seq, _t(3), _t(3), True, 0.1, 1e-5),
        _direct(aten.native_batch_norm.default, img, None, None, _t(3), _t(3).abs(), False, 0.1, 1e-5),
        _direct(aten.native_batch_norm_backward.default, img.flip(0), img, _t(3), _t(3), _t(3).abs(),
                img.mean((0, 2, 3)), img.var((0, 2, 3), unbiased=False).add(1e-5).rsqrt(), True, 1e-5,
                [True, True, True]),
        _direct(aten.native_batch_norm_backward.default, img.flip(0), img, None, _t(3), _t(3).abs() + 0.5,
                None, None, False, 1e-5, [True, True, True]),
        _direct(aten.batch_norm_backward.default, img.flip(0), img, _t(3), _t(3), _t(3).abs() + 0.5,
                img.mean((0, 2, 3)), img.var((0, 2, 3), unbiased=False).add(1e-5).rsqrt(), True, 1e-5,
                [True, True, True], torch.empty(0, dtype=torch.uint8)),
        # convolution: groups, stride, padding, dilation, transposed, output_padding, unbatched
        _direct(aten.convolution.default, img, _t(4, 3, 3, 2), _t(4), [2, 1], [1, 0], [1, 2], False, [0, 0], 1),
        _direct(aten.convolution.default, _t(2, 4, 7, 6), _t(6, 2, 3, 3), None, [1, 1], [2, 2], [2, 1], False,
                [0, 0], 2),
        _direct(aten.convolution.default, _t(2, 4, 5, 5), _t(4, 3, 3, 2), _t(6), [2, 3], [1, 0], [1, 1], True,
                [1, 2], 2),
        _direct(aten.convolution.default, seq, _t(3, 2, 4), _t(2), [3], [2], [2], True, [1], 1),
        _direct(aten.convolution.default, vol, _t(3, 2, 2, 3, 2), None, [1, 2, 1], [0, 1, 1], [1, 1, 2], False,
                [0, 0, 0], 1),
        _direct(aten.convolution_backward.default, _t(2, 6, 4, 3), _t(2, 4, 7, 6), _t(6, 2, 3, 3), [6], [2, 2], [1, 1],
                [1, 1], False, [0, 0], 2, [True, True, True]),
        _direct(aten.convolution_backward.default, _t(2, 6, 10, 16), _t(2, 4, 5, 5), _t(4, 3, 3, 2), None, [2, 3],
                [1, 0], [1, 1], True, [1, 2], 2, [True, True, False]),
        _direct(aten.convolution_backward.default, _t(2, 2, 7), seq, _t(2, 3, 3), [2], [1], [1], [2], False, [0], 1,
                [False, True, True]),
        # pooling
        _direct(aten.max_pool2d_with_indices.default, img, [3, 2], [2, 2], [1, 1], [1, 2], True),
        _direct(aten.max_pool2d_with_indices.default, img[0], [2, 2]),
        _direct(aten.max_pool3d_with_indices.default, vol, [2, 2, 2], [1, 2, 2], [1, 0, 1], [1, 1, 1], False),
        _direct(aten.max_pool2d_with_indices_backward.default, *_pool_backward_args(img)),
        _direct(aten.max_pool3d_with_indices_backward.default, *_pool3d_backward_args(vol)),
        _direct(aten.avg_pool2d.default, img, [3, 3], [2, 2], [1, 1], True, False),
        _direct(aten.avg_pool2d.default, img, [2, 3], [1, 2], [1, 1], False, True, 5),
        _pool_backward(aten.avg_pool2d, img, [3, 3], [2, 2], [1, 1], True, False, None),
        _direct(aten.avg_pool3d.default, vol, [2, 2, 2], [2, 1, 2], [1, 0, 1], True, True, None),
        _pool_backward(aten.avg_pool3d, vol, [2, 2, 2], [2, 1, 2], [1, 0, 1], True, True, None),
        _direct(aten._adaptive_avg_pool2d.default, img, [3, 4]),
        _direct(aten._adaptive_avg_pool3d.default, vol, [2, 3, 3]),
        _direct(aten._adaptive_avg_pool2d_backward.default, _t(2, 3, 3, 4), img),
        _direct(aten._adaptive_avg_pool3d_backward.default, _t(1, 2, 2, 3, 3), vol),
        _direct(aten.adaptive_max_pool2d.default, img, [3, 4]),
        _direct(aten.adaptive_max_pool3d.default, vol, [2, 3, 2]),
        _direct(aten.adaptive_max_pool2d_backward.default, _t(2, 3, 3, 4), img,
                aten.adaptive_max_pool2d.default(img, [3, 4])[1]),
        _direct(aten.adaptive_max_pool3d_backward.default, _t(1, 2, 2, 3, 2), vol,
                aten.adaptive_max_pool3d.default(vol, [2, 3, 2])[1]),
        _direct(aten.im2col.default, img, [2, 3], [1, 1], [1, 0], [2, 1]),
        _direct(aten.col2im.default, _t(2, 12, 15), [5, 6], [2, 2], [1, 1], [1, 0], [2, 1]),
        # padding modes
        _direct(aten.reflection_pad1d.default, seq, [2, 3]), _direct(aten.reflection_pad2d.default, img, [1, 2, 2, 0]),
        _direct(aten.reflection_pad3d.default, vol, [1, 1, 0, 2, 1, 0]),
        _direct(aten.replication_pad1d.default, seq, [2, 3]),
        _direct(aten.replication_pad2d.default, img, [1, 2, 2, 0]),
        _direct(aten.replication_pad3d.default, vol, [1, 1, 0, 2, 1, 0]),
        _pad_backward(aten.reflection_pad1d, seq, [2, 3]),
        _pad_backward(aten.reflection_pad2d, img, [1, 2, 2, 0]),
        _pad_backward(aten.reflection_pad3d, vol, [1, 1, 0, 2, 1, 0]),
        _pad_backward(aten.replication_pad1d, seq, [2, 3]),
        _pad_backward(aten.replication_pad2d, img, [1, 2, 2, 0]),
        _pad_backward(aten.replication_pad3d, vol, [1, 1, 0, 2, 1, 0]),
        # upsampling (.default and .vec)
        _direct(aten.upsample_nearest2d.vec, img, None, [2.0, 1.5]),
        _direct(aten.upsample_nearest2d.default, img, [9, 4]),
        _direct(aten.upsample_nearest1d.default, seq, [20]), _direct(aten.upsample_nearest3d.vec, vol, [7, 3, 8], None),
        _direct(aten._upsample_nearest_exact1d.default, seq, [13]),
        _direct(aten._upsample_nearest_exact2d.vec, img, [5, 11], None),
        _direct(aten._upsample_nearest_exact3d.default, vol, [3, 6, 5]),
        _direct(aten.upsample_bilinear2d.vec, img, None, False, [1.7, 2.0]),
        _direct(aten.upsample_bilinear2d.default, img, [11, 4], True),
        _direct(aten.upsample_linear1d.default, seq, [17], False),
        _direct(aten.upsample_trilinear3d.vec, vol, [6, 7, 3], True, None),
        _direct(aten.upsample_nearest2d_backward.default, _t(2, 3, 9, 4), [9, 4], [2, 3, 7, 6]),
        _direct(aten.upsample_nearest1d_backward.default, _t(2, 3, 20), [20], [2, 3, 9]),
        _direct(aten.upsample_nearest3d_backward.default, _t(1, 2, 7, 3, 8), [7, 3, 8], [1, 2, 5, 4, 4]),
        _direct(aten._upsample_nearest_exact1d_backward.default, _t(2, 3, 13), [13], [2, 3, 9]),
        _direct(aten._upsample_nearest_exact2d_backward.default, _t(2, 3, 5, 11), [5, 11], [2, 3, 7, 6]),
        _direct(aten._upsample_nearest_exact3d_backward.default, _t(1, 2, 3, 6, 5), [3, 6, 5], [1, 2, 5, 4, 4]),
        _direct(aten.upsample_bilinear2d_backward.default, _t(2, 3, 11, 4), [11, 4], [2, 3, 7, 6], True),
        _direct(aten.upsample_linear1d_backward.default, _t(2, 3, 17), [17], [2, 3, 9], False),
        _direct(aten.upsample_trilinear3d_backward.default, _t(1, 2, 6, 7, 3), [6, 7, 3], [1, 2, 5, 4, 4], False),
        # losses
        _direct(aten.nll_loss_forward.default, x.log_softmax(1), torch.tensor([1, 3, 0]), None, 1, -100),
        _direct(aten.nll_loss_forward.default, x.log_softmax(1), torch.tensor([1, -100, 0]), _t(4).abs(), 1, -100),
        _direct(aten.nll_loss_forward.default, x.log_softmax(1), torch.tensor([1, 2, 0]), None, 0, 2),
        _direct(aten.nll_loss_forward.default, x[0].log_softmax(0), torch.tensor(2), None, 2, -100),
        _direct(aten.nll_loss_backward.default, torch.tensor(0.7), x.log_softmax(1), torch.tensor([1, -100, 0]),
                _t(4).abs(), 1, -100, torch.tensor(1.3)),
        _direct(aten.nll_loss_backward.default, _t(3), x.log_softmax(1), torch.tensor([1, 2, 0]), None, 0, 2,
                torch.tensor(0.0)),
        _direct(aten.nll_loss2d_forward.default, img.log_softmax(1), torch.randint(0, 3, (2, 7, 6)), None, 1, -100),
        _direct(aten.nll_loss2d_backward.default, torch.tensor(1.0), img.log_softmax(1),
                torch.tensor([0, 1, 2, 1, 0, 2]).repeat(2, 7, 1), _t(3).abs(), 1, -100, torch.tensor(21.0)),
        _direct(aten.mse_loss.default, x, y), _direct(aten.mse_loss.default, x, y, 0),
        _direct(aten.mse_loss_backward.default, torch.tensor(0.5), x, y, 1),
        _direct(aten.mse_loss_backward.default, x, x, y, 0),
        _direct(aten.smooth_l1_loss_backward.default, torch.tensor(1.0), x, y, 1, 0.5),
        _direct(aten.huber_loss_backward.default, y, x, y.flip(0), 0, 0.7),
        _direct(aten.binary_cross_entropy_backward.default, torch.tensor(1.0), x.sigmoid(), y.sigmoid(), None, 1),
        # attention
        _direct(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v),
        _direct(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k[:, :, :5], v[:, :, :5], 0.0, True,
                scale=0.3),
        _direct(aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v, attn_mask=_t(5, 6)),
        _attention_backward(q, k, v, False, None), _attention_backward(q, k[:, :, :5], v[:, :, :5], True, None),
        # grouped-query attention (enable_gqa=True): 4 query heads share 2 key/value heads
        _direct(aten._scaled_dot_product_flash_attention_for_cpu.default, q.repeat(1, 2, 1, 1) * 0.5, k, v, 0.0,
                True),
        _attention_backward(q.repeat(1, 2, 1, 1) * 0.5, k, v, False, None),
        _attention_backward(q.repeat(1, 2, 1, 1) * 0.5, k[:, :, :5], v[:, :, :5], True, None),
        # TorchNeuron's SDPA kernels (the overrideable backend): masks, causal, scale, grouped-query
        # attention, a value head size of its own, the mask's gradient
        *_overrideable_cases(q, k, v),
        *_encoder_layer_cases(),
        *_grouped_mm_cases(),
        *_scaled_mm_cases(),
        # grid sampling: bilinear / nearest x zeros / border / reflection padding x align_corners
        *[_direct(aten.grid_sampler_2d.default, img, _t(2, 4, 5, 2, low=-1.6, high=1.6), mode, padding, align)
          for mode, padding, align in [(0, 0, False), (0, 1, True), (0, 2, False), (0, 2, True), (1, 0, True),
                                       (1, 2, False)]],
        _direct(aten.grid_sampler_2d_backward.default, _t(2, 3, 4, 5), img, _t(2, 4, 5, 2, low=-1.6, high=1.6),
                0, 2, False, [True, True]),
        # distances, layout
        _direct(aten._cdist_forward.default, _t(2, 4, 3), _t(2, 5, 3, seed=1), 2.0, None),
        _direct(aten._cdist_forward.default, _t(4, 3), _t(5, 3, seed=1), 1.0, None),
        _direct(aten._cdist_backward.default, _t(2, 4, 5), _t(2, 4, 3), _t(2, 5, 3, seed=1), 2.0,
                torch.cdist(_t(2, 4, 3), _t(2, 5, 3, seed=1))),
        _direct(aten._pdist_forward.default, _t(5, 3), 2.0),
        _direct(aten.pixel_shuffle.default, _t(2, 8, 3, 2), 2),
        _direct(aten.pixel_unshuffle.default, _t(2, 2, 4, 6), 2),
        # matrix products
        _direct(aten.addmm.default, x[:, 0], x, y.T, beta=0.5, alpha=2),
        _direct(aten.addmm.default, torch.full((3, 3), float("nan")), x, y.T, beta=0),
        _direct(aten.mm.default, x.to(torch.bfloat16), y.T.to(torch.bfloat16)),
    ]
    for overload, sample in _foreach_cases():
        cases.append(_direct(overload, *sample[0], **sample[1]))
    return cases + _linalg_cases() + _optimizer_cases() + _misc_cases() + _ctc_cases()


def _spd(n, batch=(), seed=0):
    """A well-conditioned symmetric positive-definite matrix."""
    a = _t(*batch, n, n, seed=seed)
    return a @ a.mT + n * torch.eye(n)


def _linalg_cases():
    """The options OpInfo samples leave out (upper factors, vector right-hand sides, modes)."""
    a, b = _t(4, 4), _t(4, 2, seed=1)
    batch = _t(2, 3, 3)
    lower = torch.tril(_t(4, 4, seed=2)) + 4 * torch.eye(4)
    qr_input, tau = torch.geqrf(_t(5, 3, seed=3))
    lu, pivots = torch.linalg.lu_factor(a)
    return [
        _direct(aten.linalg_cholesky_ex.default, _spd(4), upper=True),
        _direct(aten.linalg_cholesky_ex.default, _spd(3, (2,))),
        _direct(aten.linalg_inv_ex.default, batch),
        _direct(aten.linalg_lu_factor_ex.default, _t(3, 5)), _direct(aten.linalg_lu.default, _t(5, 3)),
        _direct(aten._linalg_solve_ex.default, a, b[:, 0]), _direct(aten._linalg_solve_ex.default, a, b.T, left=False),
        _direct(aten.linalg_lu_solve.default, lu, pivots, b, adjoint=True),
        _direct(aten.linalg_lu_solve.default, lu, pivots, b.T, left=False),
        _direct(aten.linalg_solve_triangular.default, lower, b, upper=False),
        _direct(aten.linalg_solve_triangular.default, lower.T, b.T, upper=True, left=False, unitriangular=True),
        _direct(aten.triangular_solve.default, b, lower, False, True),
        _direct(aten.cholesky_solve.default, b, torch.linalg.cholesky(_spd(4))),
        _direct(aten.cholesky_solve.default, b, torch.linalg.cholesky(_spd(4)).T, True),
        _direct(aten.linalg_qr.default, _t(5, 3), "complete"), _direct(aten.linalg_qr.default, _t(3, 5), "r"),
        _direct(aten.linalg_householder_product.default, qr_input, tau),
        _direct(aten.ormqr.default, qr_input, tau, _t(5, 2)),
        _direct(aten.ormqr.default, qr_input, tau, _t(2, 5), False, True),
        _direct(aten._linalg_svd.default, _t(4, 3), True), _direct(aten._linalg_svd.default, _t(3, 4), False, False),
        _direct(aten._linalg_eigh.default, _spd(4), "U"), _direct(aten._linalg_eigh.default, _spd(4), "L", False),
        _direct(aten.linalg_matrix_exp.default, _t(3, 3, low=-1, high=1)),
        _direct(aten.linalg_matrix_exp.default, _t(2, 4, 4, low=-0.5, high=0.5)),
        _direct(aten._linalg_check_errors.default, torch.zeros((), dtype=torch.int32), "linalg.inv", is_matrix=True),
        # FFT primitives: one-/two-sided, forward/inverse, the three normalizations, several dims
        # (dims already wrapped, as torch.fft passes them: the raw CPU ops crash on negative dims)
        _direct(aten._fft_r2c.default, _t(3, 8), [1], 0, True),
        _direct(aten._fft_r2c.default, _t(4, 6), [0, 1], 1, False),
        _direct(aten._fft_r2c.default, _t(2, 5, 4), [1, 2], 2, True),
        _direct(aten._fft_c2c.default, torch.fft.fft(_t(3, 8)), [1], 0, False),
        _direct(aten._fft_c2c.default, torch.fft.fft2(_t(4, 6)), [0, 1], 2, True),
        _direct(aten._fft_c2c.default, torch.fft.fft(_t(2, 5, 4)), [1], 1, False),
        _direct(aten._fft_c2r.default, torch.fft.rfft(_t(3, 8)), [1], 2, 8),
        _direct(aten._fft_c2r.default, torch.fft.rfft2(_t(4, 7)), [0, 1], 1, 7),
        _direct(aten._fft_c2r.default, torch.fft.rfft(_t(2, 9)), [1], 0, 9),
    ]


def _misc_cases():
    """Ops that OpInfo does not reach (special functions, integer math, searching, histograms,
    embedding bags, *_copy views, effects), and their options."""
    x, y = _t(3, 4), _t(3, 4, seed=1)
    i = _t(3, 4, dtype=torch.int64, low=-12, high=12)
    v, g = _t(4, 3, 2), _t(4, 1, 1, seed=1)
    norms = v.norm(dim=(1, 2), keepdim=True)
    rows = _t(5, 3)
    boundaries = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    return [
        _direct(aten._index_put_impl.default, x, [torch.tensor([0, 2])], torch.tensor(1.5), True, False),
        _direct(aten._weight_norm_interface_backward.default, _t(4, 3, 2, seed=2), v, g, norms, 0),
        _direct(aten._weight_norm_interface_backward.default, _t(3, 4, seed=2), x, _t(1, 4),
                x.norm(dim=0, keepdim=True), 1),
        _direct(aten.conj_physical.default, torch.complex(x, y)), _direct(aten.conj_physical.default, x),
        # conjugate / negative views (backward of complex rotary embeddings) and their materialization
        _direct(aten._conj.default, torch.complex(x, y)),
        _direct(aten._conj_copy.default, torch.complex(x, y)), _direct(aten._conj_physical.default, torch.complex(x, y)),
        _direct(aten._neg_view.default, x), _direct(aten._neg_view_copy.default, torch.complex(x, y)),
        # (inputs without the view bits: the harness reads inputs through numpy; a
        # functional graph holds values, for which both are the identity)
        _direct(aten.resolve_conj.default, torch.complex(x, y)), _direct(aten.resolve_neg.default, x),
        _direct(aten.select_copy.int, x, 1, -1), _direct(aten.slice_copy.Tensor, x, 1, 1, 3),
        _direct(aten.split_copy.Tensor, x, 3, 1), _direct(aten.unbind_copy.int, x, 1),
        _direct(aten.narrow_copy.default, x, 1, -3, 2), _direct(aten.permute_copy.default, x, [1, 0]),
        _direct(aten.view_copy.default, x, [2, 6]), _direct(aten.as_strided_copy.default, x, [2, 2], [1, 4], 1),
        _direct(aten.tril_indices.default, 4, 3, 1), _direct(aten.triu_indices.default, 3, 5, -1),
        _direct(aten.tril_indices.default, 3, 3, dtype=torch.int32),
        _direct(aten.nonzero_static.default, _t(3, 4, dtype=torch.bool), size=4),
        _direct(aten.nonzero_static.default, _t(3, 4, dtype=torch.bool), size=9, fill_value=7),
        _direct(aten.gcd.default, i, i.flip(0)), _direct(aten.lcm.default, i, i.flip(1)),
        _direct(aten.angle.default, torch.tensor([-2, 0, 3])),
        _direct(aten.angle.default, torch.tensor([-1.5, 0.0, float("nan"), 2.0])),
        _direct(aten.angle.default, torch.complex(x, y)), _direct(aten.polar.default, x.abs(), y),
        _direct(aten.complex.default, x, y), _direct(aten.igamma.default, x.abs(), y.abs()),
        _direct(aten.view_as_real.default, torch.complex(x, y)),
        _direct(aten.view_as_complex.default, torch.stack([x, y], -1)),
        _direct(aten.igammac.default, x.abs() + 0.5, y.abs()),
        _direct(aten.hardshrink_backward.default, x, y, 0.5), _direct(aten.softshrink_backward.default, x, y, 1.0),
        _direct(aten.searchsorted.Tensor, boundaries, x), _direct(aten.searchsorted.Tensor, boundaries, x, right=True),
        _direct(aten.searchsorted.Tensor, x.sort(-1).values, y, side="right", out_int32=True),
        _direct(aten.searchsorted.Tensor, torch.tensor([2.0, -1.0, 0.5]), x, sorter=torch.tensor([1, 2, 0])),
        _direct(aten.searchsorted.Scalar, boundaries, 0.5),
        _direct(aten.bucketize.Tensor, x, boundaries), _direct(aten.bucketize.Tensor, x, boundaries, right=True),
        _direct(aten.bucketize.Scalar, 0.7, boundaries, out_int32=True),
        _direct(aten.histc.default, x, 5), _direct(aten.histc.default, x, 4, -1, 1),
        _direct(aten.histc.default, torch.full((4,), 2.0), 3),
        _direct(aten.nanmedian.default, torch.tensor([3.0, float("nan"), 1.0, 2.0])),
        _direct(aten.nanmedian.dim, torch.tensor([[3.0, float("nan"), 1.0, 2.0], [0.5, 1.0, 2.0, -1.0]]), 1),
        _direct(aten.nanmedian.dim, x, 0, True),
        _direct(aten.mode.default, torch.tensor([3.0, 1.0, 2.0, 2.0, 3.0, 1.0, 5.0])),
        _direct(aten.mode.default, torch.tensor([[1, 2, 2, 1], [4, 4, 0, 0], [7, 7, 7, 1]]), 1, True),
        _direct(aten.mode.default, _t(4, 5, dtype=torch.int64, low=0, high=3), 0),
        *[_direct(aten._pdist_backward.default, _t(10), rows, p, torch.pdist(rows, p))
          for p in (0.0, 1.0, 1.5, 2.0, 3.0, float("inf"))],
        _direct(aten._pdist_backward.default, _t(3), torch.ones(3, 2), 2.0, torch.zeros(3)),
        *[_direct(aten.multilabel_margin_loss_forward.default, x, torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1],
                                                                                 [-1, 0, 0, 0]]), reduction)
          for reduction in (0, 1, 2)],
        _direct(aten.multilabel_margin_loss_forward.default, x[0], torch.tensor([2, 2, 1, 3]), 0),
        *_embedding_bag_cases(),
    ]


def _ctc_cases():
    """The CTC loss's backward (the int[] overload, the lowered one; the forward is data-dependent)
    on the CPU forward's results, whose log_alpha is unset memory where no path reaches: padded
    (2-D) and concatenated (1-D) targets, an empty target, repeated labels (a blank must separate them), a blank other than
    0, an impossible alignment (infinite loss) with and without zero_infinity."""
    log_probs = _t(7, 4, 5).log_softmax(2)
    padded = torch.tensor([[1, 2, 2], [3, 0, 0], [0, 0, 0], [4, 4, 4]])
    steps, lengths = [7, 4, 3, 4], [3, 1, 0, 3]  # the last: 3 repeated labels need 5 steps
    flat = torch.cat([padded[b, :n] for b, n in enumerate(lengths)])
    grad = _t(4, seed=3).abs()
    cases = []
    for targets in (padded, flat):
        nll, log_alpha = aten._ctc_loss.default(log_probs, targets, steps, lengths, 0, False)
        cases += [_direct(aten._ctc_loss_backward.default, grad, log_probs, targets, steps, lengths, nll,
                          log_alpha, 0, zero_infinity) for zero_infinity in (False, True)]
    shifted = torch.tensor([[1, 2, 0], [3, 0, 1], [0, 1, 1], [2, 2, 0]])  # blank = 4
    nll, log_alpha = aten._ctc_loss.default(log_probs, shifted, [7, 5, 6, 7], [3, 2, 3, 2], 4, False)
    cases.append(_direct(aten._ctc_loss_backward.default, grad, log_probs, shifted, [7, 5, 6, 7], [3, 2, 3, 2],
                         nll, log_alpha, 4, False))
    return cases


def _embedding_bag_cases():
    """Sum / mean / max bags, an empty bag, repeated rows, padding_idx, per-sample weights,
    include_last_offset, and the backward ops on the forward's own outputs."""
    weight = _t(6, 3)
    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 0]), torch.tensor([0, 2, 2, 5])
    cases = []
    for mode in (0, 1, 2):
        for padding_idx in (-1, 4):
            forward = (weight, indices, offsets, False, mode, False, None, False, padding_idx)
            cases.append(_direct(aten._embedding_bag.default, *forward))
            _, offset2bag, bag_size, max_indices = aten._embedding_bag.default(*forward)
            grad = _t(4, 3, seed=5)
            cases.append(_direct(aten._embedding_bag_backward.default, grad, indices, offsets, offset2bag, bag_size,
                                 max_indices, 6, False, mode, False, None, padding_idx))
            if mode != 0 or padding_idx >= 0:
                cases.append(_direct(aten._embedding_bag_dense_backward.default, grad, indices, offset2bag, bag_size,
                                     max_indices, 6, False, mode, None, padding_idx))
    weights = _t(8, seed=3)
    last = torch.tensor([0, 2, 2, 5, 8])
    cases.append(_direct(aten._embedding_bag.default, weight, indices, last, False, 0, False, weights, True))
    cases.append(_direct(aten._embedding_bag_forward_only.default, weight, indices, offsets, False, 1))
    _, offset2bag, bag_size, max_indices = aten._embedding_bag.default(weight, indices, last, False, 0, False, weights,
                                                                       True)
    cases.append(_direct(aten._embedding_bag_backward.default, _t(4, 3, seed=5), indices, last, offset2bag, bag_size,
                         max_indices, 6, False, 0, False, weights))
    return cases


def _optimizer_cases():
    """Fused optimizers and AMP grad scaling (no OpInfo): float32 and bfloat16 state, the
    options each kernel branches on (amsgrad, weight decay, maximize, momentum/nesterov,
    first step, grad_scale/found_inf, tensor lr)."""
    def tensors(seed, dtype=torch.float32, positive=False):
        out = [_t(3, 2, seed=seed), _t(5, seed=seed)]
        return [(t.abs() if positive else t).to(dtype) for t in out]

    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for op, amsgrad, weight_decay, maximize in [(aten._fused_adam.default, False, 0.0, False),
                                                    (aten._fused_adam.default, True, 0.1, True),
                                                    (aten._fused_adamw.default, True, 0.1, False)]:
            cases.append(_direct(op, tensors(0, dtype), tensors(1, dtype), tensors(2, dtype), tensors(3, dtype, True),
                                 tensors(4, dtype, True) if amsgrad else [], [torch.tensor(3.0), torch.tensor(1.0)],
                                 lr=0.01, beta1=0.9, beta2=0.999, weight_decay=weight_decay, eps=1e-8,
                                 amsgrad=amsgrad, maximize=maximize))
        for momentum, nesterov, first, dampening in [(0.0, False, False, 0.0), (0.9, False, True, 0.0),
                                                     (0.9, True, False, 0.1)]:
            cases.append(_direct(aten._fused_sgd.default, tensors(0, dtype), tensors(1, dtype),
                                 tensors(2, dtype) if momentum else [], weight_decay=0.01, momentum=momentum, lr=0.1,
                                 dampening=dampening, nesterov=nesterov, maximize=nesterov, is_first_step=first))
    for found_inf in (0.0, 1.0):
        cases.append(_direct(aten._fused_adamw.tensor_lr, tensors(0), tensors(1), tensors(2), tensors(3, positive=True),
                             [], [torch.tensor(5.0)] * 2, lr=torch.tensor(0.003), beta1=0.8, beta2=0.99,
                             weight_decay=0.01, eps=1e-6, amsgrad=False, maximize=False,
                             grad_scale=torch.tensor(4.0), found_inf=torch.tensor(found_inf)))
    cases.append(_direct(aten._fused_sgd.tensor_lr, tensors(0), tensors(1), tensors(2), weight_decay=0.0, momentum=0.9,
                         lr=torch.tensor(0.1), dampening=0.0, nesterov=False, maximize=False, is_first_step=False,
                         grad_scale=torch.tensor(2.0), found_inf=torch.tensor(0.0)))
    overflowed = tensors(0)
    overflowed[1][2] = float("inf")
    for grads in (tensors(0), overflowed, tensors(0, torch.bfloat16)):
        cases.append(_direct(aten._amp_foreach_non_finite_check_and_unscale.default, grads, torch.tensor([0.0]),
                             torch.tensor([0.25])))
    for scale, tracker, found_inf in ((1024.0, 3, 0.0), (1024.0, 1, 0.0), (1024.0, 3, 1.0), (3e38, 3, 0.0)):
        cases.append(_direct(aten._amp_update_scale.default, torch.tensor([scale]),
                             torch.tensor([tracker], dtype=torch.int32), torch.tensor([found_inf]), 2.0, 0.5, 4))
    return cases


def _pool_backward_args(img):
    out, indices = aten.max_pool2d_with_indices.default(img, [3, 2], [2, 2], [1, 1], [1, 2], True)
    return (_t(*out.shape), img, [3, 2], [2, 2], [1, 1], [1, 2], True, indices)


def _pool3d_backward_args(vol):
    out, indices = aten.max_pool3d_with_indices.default(vol, [2, 2, 2], [1, 2, 2], [1, 0, 1], [1, 1, 1], False)
    return (_t(*out.shape), vol, [2, 2, 2], [1, 2, 2], [1, 0, 1], [1, 1, 1], False, indices)


def _attention_backward(q, k, v, causal, mask):
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, causal, attn_mask=mask)
    return _direct(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, _t(*out.shape), q, k, v, out,
                   lse, 0.0, causal, attn_mask=mask)


def _overrideable(q, k, v, mask=None, causal=False, scale=None, compare_lse=True):
    """The overrideable kernel's call, expected as PyTorch's CPU attention computes it
    (output and logsumexp of the flash kernel; the max lengths are not compared; no
    dropout, so philox seed and offset are empty scalars). A row with every key masked
    has no logsumexp (-inf here; the CPU flash kernel reports 0): compare_lse=False."""
    additive = mask if mask is None or mask.is_floating_point() else torch.zeros(mask.shape).masked_fill(
        mask.logical_not(), -math.inf)  # the CPU kernel's form of a boolean mask
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, causal, attn_mask=additive,
                                                                          scale=scale)
    lse = lse if compare_lse else None
    empty = torch.zeros((), dtype=torch.int64)
    return Call(aten._scaled_dot_product_fused_attention_overrideable.default, (q, k, v, mask, 0.0, causal),
                {"scale": scale}, (out, lse, None, None, None, None, empty, empty, None), "direct")


def _overrideable_backward(q, k, v, mask=None, causal=False, scale=None):
    """Its backward, expected as autograd through the CPU's scaled_dot_product_attention
    (grouped-query attention as enable_gqa=True; the mask's gradient when it is floating)."""
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    bias = mask.detach().clone().requires_grad_() if mask is not None and mask.is_floating_point() else mask
    out = F.scaled_dot_product_attention(*inputs, attn_mask=bias, is_causal=causal, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    grad = _t(*out.shape, seed=9)
    out.backward(grad)
    bias_grad = bias is not None and bias.requires_grad
    lse = torch.zeros(q.shape[:3])  # read by the CPU kernels only; the lowering recomputes the attention
    args = (grad, q, k, v, mask, [True, True, True, bias_grad], out.detach(), lse, None, None, q.shape[2],
            k.shape[2], 0.0, causal, torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64))
    expected = (*[t.grad for t in inputs], bias.grad if bias_grad else None)
    return Call(aten._scaled_dot_product_fused_attention_overrideable_backward.default, args, {"scale": scale},
                expected, "direct")


def _overrideable_cases(q, k, v):
    gqa_q = q.repeat(1, 2, 1, 1) * 0.5  # 4 query heads share 2 key/value heads
    bias = _t(2, 1, 5, 6, seed=3)
    keys = torch.rand(5, 6, generator=torch.Generator().manual_seed(4)) > 0.3
    masked_row = keys.clone()
    masked_row[2] = False  # a query that sees no key: zeros, as the CPU kernels give
    return [
        _overrideable(q, k, v), _overrideable(q, k, v, bias), _overrideable(q, k, v, keys, scale=0.3),
        _overrideable(q, k, v, masked_row, compare_lse=False), _overrideable(q, k[:, :, :5], v[:, :, :5], causal=True),
        _overrideable(gqa_q, k, v), _overrideable(gqa_q, k[:, :, :5], v[:, :, :5], causal=True),
        _overrideable_backward(q, k, v), _overrideable_backward(q, k, v, bias, scale=0.3),
        _overrideable_backward(q, k, v, keys), _overrideable_backward(q, k[:, :, :5], v[:, :, :5], causal=True),
        _overrideable_backward(gqa_q, k, v, bias), _overrideable_backward(gqa_q, k, v[..., :3]),
    ]


def _foreach_cases():
    """The overloads optimizers use (AdamW / SGD / Adam, foreach=True)."""
    xs = [_t(3, 2), _t(4)]
    ys = [_t(3, 2, seed=1), _t(4, seed=1)]
    zs = [t.abs() + 0.5 for t in ys]
    return [
        (aten._foreach_add.List, ((xs, ys), {"alpha": 0.5})), (aten._foreach_add.Scalar, ((xs, 1.5), {})),
        (aten._foreach_add.Tensor, ((xs, torch.tensor(2.0)), {"alpha": 2})),
        (aten._foreach_sub.List, ((xs, ys), {})), (aten._foreach_sub.Scalar, ((xs, 1), {})),
        (aten._foreach_mul.Scalar, ((xs, 0.9), {})), (aten._foreach_mul.List, ((xs, ys), {})),
        (aten._foreach_mul.Tensor, ((xs, torch.tensor(0.3)), {})),
        (aten._foreach_mul.ScalarList, ((xs, [0.5, 2.0]), {})),
        (aten._foreach_div.List, ((xs, zs), {})), (aten._foreach_div.Scalar, ((xs, 3.0), {})),
        (aten._foreach_addcmul.Scalar, ((xs, ys, zs), {"value": 0.1})),
        (aten._foreach_addcmul.Tensor, ((xs, ys, zs, torch.tensor([0.5, -1.0])), {})),
        (aten._foreach_addcdiv.Scalar, ((xs, ys, zs), {"value": -0.01})),
        (aten._foreach_addcdiv.ScalarList, ((xs, ys, zs, [0.1, 0.2]), {})),
        (aten._foreach_pow.ScalarAndTensor, ((0.9, [torch.tensor(3.0), torch.tensor(5.0)]), {})),
        (aten._foreach_pow.Scalar, ((zs, 2.0), {})), (aten._foreach_neg.default, ((xs,), {})),
        (aten._foreach_reciprocal.default, ((zs,), {})), (aten._foreach_sqrt.default, ((zs,), {})),
        (aten._foreach_lerp.Scalar, ((xs, ys, 0.1), {})),
        (aten._foreach_lerp.List, ((xs, ys, [z.sigmoid() for z in zs]), {})),
        (aten._foreach_maximum.List, ((xs, ys), {})), (aten._foreach_norm.Scalar, ((xs, 2), {})),
        (aten._foreach_copy.default, ((xs, ys), {})), (aten._foreach_zero.default, ((xs,), {})),
        (aten._foreach_clamp_min.Scalar, ((xs, 0.0), {})), (aten._foreach_sign.default, ((xs,), {})),
        (aten._foreach_max.default, ((xs,), {})), (aten._foreach_abs.default, ((xs,), {})),
    ]


@functools.cache
def direct_calls():
    table = {}
    for call in _direct_cases():
        table.setdefault(call.name, []).append(call)
    return table


# ------------------------------------------------------------------ op tests
@pytest.mark.parametrize("name", PACKETS)
def test_lowering_matches_aten(name):
    calls = list(direct_calls().get(name, []))
    recorded = recorded_calls().get(name, {})
    for dtype, cap in CAPS.items():
        calls.extend(_select(recorded.get(dtype, []), cap))
    assert calls, f"no OpInfo sample or direct case exercises the lowering of aten.{name}"
    check_calls(calls)


# Name words of the contraction families (mm, bmm, matmul, addmm, baddbmm, conv*, einsum, linear,
# _foreach_mm, _grouped_mm, fft_*, ...): only to check contraction_length, which reads the jaxpr.
# (addr is an outer product: one product per element, no sum, so elementwise.)
CONTRACTION_WORDS = {"mm", "bmm", "mv", "dot", "vdot", "matmul", "addmm", "addmv", "addbmm", "baddbmm",
                     "einsum", "linear", "bilinear", "tensordot", "convolution", "fft"}


def _named_contraction(name):
    return any(w in CONTRACTION_WORDS or w.startswith(("conv1d", "conv2d", "conv3d")) or w == "conv"
               for w in name.split("_"))


def test_contraction_length_finds_every_contraction():
    """Every lowered op of a contraction family gets K > 0 (so the scaled tolerance) from its
    jaxpr in at least one of its test calls; elementwise ops get 0, reductions their length."""
    names = [n for n in PACKETS if _named_contraction(n)]
    assert {"mm", "addmm", "baddbmm", "convolution", "convolution_backward", "_foreach_mm", "_grouped_mm",
            "_fft_r2c"} <= set(names), names
    missed = []
    for name in names:
        calls = list(direct_calls().get(name, [])) + [
            c for cs in recorded_calls().get(name, {}).values() for c in filter(_in_scope, cs)]
        if not any(contraction_length(c) for c in calls[:8]):
            missed.append(name)
    assert not missed, f"lowered contractions without dot_general/conv/fft in their jaxpr: {missed}"
    x = _t(3, 4)
    assert contraction_length(_direct(aten.mm.default, x, _t(4, 5))) == 4
    assert contraction_length(_direct(aten.add.Tensor, x, x)) == 0
    assert contraction_length(_direct(aten.sum.default, x)) == 12
    assert contraction_length(_direct(aten.mul.Tensor, x, x)) == 0


def test_contraction_tolerance_scales_with_length_and_magnitude():
    want = torch.full((2, 2), 150.0)
    assert _tolerance(0, want) == TIGHT
    rtol, atol = _tolerance(16, want)
    assert rtol == TIGHT[0] and atol == pytest.approx(2 * 16 * torch.finfo(torch.float32).eps * 150)
    assert _tolerance(16, torch.ones(3, dtype=torch.int64)) == TIGHT


def test_every_core_aten_op_seen_in_models_is_lowered():
    """The ops real models produce after core_aten_decompositions (collected from an
    MLP, CNN, TransformerEncoderLayer, Llama block, losses and AdamW) all have lowerings."""
    import torch._inductor.inductor_prims  # noqa: F401

    seen = [
        "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_assert_async", "_cdist_forward",
        "_foreach_add", "_foreach_addcdiv", "_foreach_addcmul", "_foreach_div", "_foreach_mul", "_foreach_neg",
        "_foreach_pow", "_foreach_reciprocal", "_foreach_sqrt", "_foreach_sub", "_log_softmax",
        "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
        "_scaled_dot_product_flash_attention_for_cpu_backward", "_softmax", "_to_copy", "abs",
        "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "add", "addmm", "addmv", "alias", "amax", "amin",
        "any", "arange", "argmax", "avg_pool2d", "avg_pool2d_backward", "bitwise_and", "bitwise_not",
        "bitwise_or", "bmm", "cat", "clamp", "clone", "constant_pad_nd", "convolution", "convolution_backward",
        "copy", "copy_", "cos", "cumprod", "cumsum", "diagonal", "digamma", "div", "elu", "embedding",
        "empty_permuted", "eq", "erf", "erfc", "exp", "exp2", "expand", "flip", "fmod", "full", "full_like",
        "gather", "ge", "gelu", "gt", "hardtanh", "hypot", "index", "index_put", "index_select", "isnan",
        "kthvalue", "le", "leaky_relu", "lgamma", "linalg_vector_norm", "log", "log1p", "logcumsumexp",
        "logical_and", "logical_not", "lt", "max", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
        "mean", "median", "min", "minimum", "mm", "mul", "native_group_norm", "native_layer_norm", "ne", "neg",
        "permute", "pow", "prod", "reciprocal", "relu", "remainder", "repeat", "rsqrt", "scalar_tensor",
        "scatter", "scatter_add", "select", "sigmoid", "sign", "sin", "slice", "slice_scatter", "sort", "sqrt",
        "squeeze", "sub", "sum", "tanh", "topk", "trunc", "unfold", "unsqueeze", "var", "view", "where",
    ]
    def lowered(name):
        packet = getattr(aten, name)
        return any(lowering.lookup(getattr(packet, o)) is not None for o in packet.overloads())

    missing = [n for n in seen if not lowered(n)]
    assert not missing
    assert lowering.lookup(torch.ops.prims.fma.default) is not None


def test_checks_can_fail():
    """The harness notices a wrong lowering (here: add ignoring alpha)."""
    call = _direct(aten.add.Tensor, _t(3), _t(3, seed=1), alpha=2)
    original = lowering.LOWERINGS[aten.add]
    lowering.LOWERINGS[aten.add] = lambda x, y, alpha=1: x + y
    try:
        with pytest.raises(AssertionError):
            check_call(call)
    finally:
        lowering.LOWERINGS[aten.add] = original
    check_call(call)


def test_unsupported_index_forms_raise_clearly():
    with pytest.raises(NotImplementedError, match="data-dependent"):
        run_lowering(aten.index.Tensor, (_t(3, 4), [_t(3, dtype=torch.bool)]), {})
    with pytest.raises(NotImplementedError, match="data-dependent"):
        run_lowering(aten.index_put.default, (_t(3, 4), [_t(3, 4, dtype=torch.bool)], _t(5)), {})


# ------------------------------------------------------------ end-to-end models
class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.flatten(1))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, hidden=64):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.embed = nn.Embedding(vocab, dim)
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)

    def rotary(self, seq, device):
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
        freqs = torch.outer(torch.arange(seq, device=device).float(), inv)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, tokens):
        x = self.embed(tokens)
        batch, seq, dim = x.shape
        h = self.attn_norm(x)
        q, k, v = (p(h).view(batch, seq, self.heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        cos, sin = self.rotary(seq, x.device)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(batch, seq, dim))
        h = self.mlp_norm(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(x)


def _cnn():
    return SmallCNN(), (torch.randn(4, 3, 16, 16),)


def _encoder():
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return layer, (torch.randn(2, 7, 32),)


def _llama():
    return LlamaBlock(), (torch.randint(0, 64, (2, 9)),)


class HFLlamaLogits(nn.Module):
    """A tiny transformers LlamaForCausalLM (random weights, from a config), returning logits."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        self.model = LlamaForCausalLM(config)

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _hf_llama():
    pytest.importorskip("transformers")
    return HFLlamaLogits(), (torch.randint(0, 64, (2, 9)),)


class HFLlamaLoss(HFLlamaLogits):
    """The same model trained the way HF scripts do: labels in, its own loss out,
    no attention mask. transformers then calls SDPA with enable_gqa=True (4 query
    heads over 2 key/value heads), which reaches the attention lowering as
    grouped-query attention."""

    def forward(self, ids):
        return self.model(input_ids=ids, labels=ids).loss


def _hf_llama_loss():
    pytest.importorskip("transformers")
    return HFLlamaLoss(), (torch.randint(0, 64, (2, 9)),)


MODELS = {"cnn": _cnn, "transformer_encoder": _encoder, "llama_block": _llama, "hf_llama": _hf_llama,
          "hf_llama_gqa_loss": _hf_llama_loss}


def _forward_backward(model, module, inputs, autocast):
    context = torch.autocast(DEVICE, dtype=torch.bfloat16) if autocast else torch.autocast(DEVICE, enabled=False)
    with context:
        out = model(*inputs)
    loss = out.float().square().mean()
    loss.backward()
    return out.detach(), {name: p.grad.detach() for name, p in module.named_parameters()}


def _max_error(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_forward_backward_matches_eager(name, autocast, fresh_dynamo):
    torch.manual_seed(seeds.seed(0))
    model, inputs = MODELS[name]()
    eager = model.to(DEVICE)
    compiled_model = copy.deepcopy(eager)
    inputs = tuple(t.to(DEVICE) for t in inputs)
    compiled = torch.compile(compiled_model, backend="neuron", fullgraph=True)

    want_out, want_grads = _forward_backward(eager, eager, inputs, autocast)
    torch_neuronx.reset_dynamo_metrics()
    got_out, got_grads = _forward_backward(compiled, compiled_model, inputs, autocast)
    metrics = torch_neuronx.get_dynamo_metrics()
    assert metrics["forward_graphs"] == 1 and metrics["backward_graphs"] == 1, metrics

    assert got_out.device.type == DEVICE and got_out.dtype == want_out.dtype
    tolerance = 1e-2 if autocast else 1e-4
    # bf16 keeps 8 significant bits: besides the absolute 1e-2, each tensor may differ by two
    # roundings (2 * 2**-8) of its own largest magnitude (gradients reach ~3 with some seeds).
    scaled = 2 * 2.0 ** -8 if autocast else 0.0
    pairs = {"output": (got_out, want_out), **{f"grad {n}": (got_grads[n], want_grads[n]) for n in want_grads}}
    excess = {}
    for key, (got, want) in pairs.items():
        allowed = tolerance + scaled * want.float().abs().max().item()
        excess[key] = (_max_error(got, want), allowed)
    worst = max(excess, key=lambda k: excess[k][0] / excess[k][1])
    error, allowed = excess[worst]
    assert error <= allowed, f"{name}: {worst} differs by {error:.3g} (> {allowed:.3g})"
    if name == "cnn":  # BatchNorm running stats are updated in place by the compiled graph too
        for (n, a), (_, b) in zip(eager.named_buffers(), compiled_model.named_buffers()):
            assert _max_error(a, b) <= tolerance, f"buffer {n}"


# ------------------------------------------------------------------ topk ties
def _tie_cases():
    """(input, k, dim, largest): rows of equal values (a MoE router whose scores
    are all equal), ties across the k-th place, NaN ties, long rows (the CPU
    kernel's partial-sort regime, k * 64 <= n), smallest-k and dim=0."""
    partial = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0, 1.0, 2.0, 1.0]] * 3)
    nan = torch.tensor([[1.0, float("nan"), 3.0, 3.0, float("nan"), 1.0]])
    return [
        (torch.full((32, 4), 0.5), 2, -1, True), (torch.full((6, 8), 0.25), 3, -1, True),
        (partial, 2, -1, True), (partial, 5, -1, True), (partial, 3, -1, False),
        (nan, 3, -1, True), (nan, 4, -1, False), (torch.zeros(2, 300), 2, -1, True),
        (torch.full((5, 3), 7.0), 2, 0, True), (torch.tensor([2, 5, 5, 1, 5]), 2, 0, True),
        (torch.tensor([[1.0, 3.0, 0.0, 3.0] * 40]), 2, -1, True),  # ties within the k selected only
    ]


def test_topk_ties_take_the_lowest_indices_eager_and_compiled():
    """PyTorch leaves the order of equal values unspecified; the CPU kernel's
    (std::nth_element) depends on the row length and k. The device takes the
    lowest indices among equal values in both modes, the first k of CPU's
    stable sort, so an eager and a compiled MoE router pick the same experts
    (issue 15: afmoe and ernie4_5_moe, zero-initialized routers)."""
    cases = _tie_cases()
    lowered = run_lowerings([(aten.topk.default, (x, k, dim, largest), {}) for x, k, dim, largest in cases])
    for (x, k, dim, largest), got in zip(cases, lowered):
        want = torch.sort(x, dim=dim, descending=largest, stable=True)
        want_values, want_indices = want.values.narrow(dim, 0, k), want.indices.narrow(dim, 0, k)
        eager = torch.topk(x.to(DEVICE), k, dim, largest)
        for mode, (values, indices) in (("lowering", got), ("eager", eager)):
            torch.testing.assert_close(values.cpu(), want_values, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda m: f"{mode} topk{(tuple(x.shape), k, dim, largest)}: {m}")
            assert torch.equal(indices.cpu(), want_indices), (mode, x.shape, k, dim, largest, indices)


# Issue 15: tiny MoE models as transformers builds them from a config (routers
# zero-initialized, so every router score is equal and top-k meets ties).
MOE_CONFIGS = {
    "afmoe": {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16, "max_position_embeddings": 512,
              "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "sliding_window": 8,
              "layer_types": ["sliding_attention", "full_attention"]},
    "ernie4_5_moe": {"vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                     "moe_intermediate_size": 64, "moe_k": 2, "moe_num_experts": 4, "moe_num_shared_experts": 1},
}


@pytest.mark.parametrize("arch", sorted(MOE_CONFIGS))
def test_hf_moe_inference_matches_eager(arch, fresh_dynamo):
    """Compiled (fullgraph) logits of the issue's MoE configs within 1e-4 of
    eager on the device (float32, no_grad, input ids [2, 16])."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[arch](**MOE_CONFIGS[arch], attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().to(DEVICE)
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        want = model(input_ids=ids).logits
        got = torch.compile(model, backend="neuron", fullgraph=True)(input_ids=ids).logits
    torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=1e-4)
