"""The nki.language / NkiTensor / nki.tensor names AWS's references list and the simulator lacked
(issue #27 items 3 and 6): math and activation operators, bit-vector helpers, reductions, softmax,
rms_norm, where, broadcast_to, gather_flattened, the loops and directives, loop_reduce, atomic_rmw,
creation helpers, the buffer predicates, NkiTensor's view API and the older `nki.tensor` type.

Small kernels written here; references are NumPy (math.erf for the erf-based ones), with the
tolerance stated at each comparison: exact where the simulator moves or selects values, float32
round-off (rtol 1e-5) for arithmetic, 1e-6 absolute for the erf approximation, and the output
dtype's rounding for bfloat16 results. Each hardware rule AWS documents is checked to raise an
NKIError that names it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki import NKIError

RNG = np.random.default_rng(2727)
BF16 = ml_dtypes.bfloat16
_erf = np.vectorize(math.erf, otypes=[np.float64])


def run(fn, *arrays):
    """Load each array into SBUF, apply fn to the tiles, store its result tile and return it."""
    @nki.jit
    def kernel(*args):
        tiles = [nl.load(a) for a in args]
        r = fn(*tiles)
        out = nl.ndarray(r.shape, r.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    return kernel(*arrays)


def run_plain(fn, *arrays):
    """fn(*hbm args) builds and returns its own output (for kernels that need the HBM arguments)."""
    return nki.jit(fn)(*arrays)


SHAPES = [((128, 64), np.float32), ((32, 4, 16), np.float32), ((64, 96), BF16)]


def _data(shape, dtype, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, shape).astype(dtype)


def _close(got, ref, dtype):
    if dtype == BF16:  # the result is rounded to bfloat16 once
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(BF16).astype(np.float32), rtol=1e-2, atol=1e-2)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- unary math / activations
UNARY_REFS = {
    "arctan": np.arctan,
    "tan": np.tan,
    "trunc": np.trunc,
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "erf_dx": lambda x: 2.0 / np.sqrt(np.pi) * np.exp(-x * x),
    "gelu_dx": lambda x: 0.5 * (1 + _erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi),
}


@pytest.mark.parametrize("shape, dtype", SHAPES)
@pytest.mark.parametrize("name", sorted(UNARY_REFS))
def test_unary_operators_match_numpy(name, shape, dtype):
    x = _data(shape, dtype, -1.4, 1.4)  # inside tan's poles
    got = run(lambda t: getattr(nl, name)(t), x)
    ref = UNARY_REFS[name](x.astype(np.float64))
    assert got.dtype == dtype and got.shape == shape
    if name in ("gelu_dx", "erf_dx") and dtype == np.float32:  # the simulator's erf: |error| < 1.5e-7
        np.testing.assert_allclose(got, ref, atol=1e-6)
    else:
        _close(got, ref.astype(np.float32), dtype)


def test_trunc_rounds_toward_zero_and_tokens_work_as_activation_ops():
    x = np.array([[3.7, -3.7, 0.5, -0.5, 2.0, -2.0]] * 4, np.float32)
    np.testing.assert_array_equal(run(nl.trunc, x), np.trunc(x))

    @nki.jit
    def act(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        dst = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.activation(dst, nl.mish, t, scale=2.0)
        nl.store(out, dst)
        return out

    y = _data((16, 32), np.float32)
    np.testing.assert_allclose(act(y), 2 * y * np.tanh(np.log1p(np.exp(2 * y))), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- binary math
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_mod_and_fmod_follow_the_divisor_and_dividend_signs(dtype):
    x = _data((64, 32), dtype, -9, 9)
    y = _data((64, 32), dtype, 0.5, 4) * np.where(RNG.random((64, 32)) < 0.5, -1, 1).astype(dtype)
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    _close(run(nl.mod, x, y), np.mod(xf, yf), dtype)
    _close(run(nl.fmod, x, y), np.fmod(xf, yf), dtype)
    _close(run(lambda t: nl.mod(t, 2.5), x), np.mod(xf, np.float32(2.5)), dtype)
    _close(run(lambda t: nl.fmod(t, -2.5), x), np.fmod(xf, np.float32(-2.5)), dtype)


def test_numpy_remainder_resolves_to_mod_in_isa_instructions():
    x = _data((32, 16), np.float32, -9, 9)

    def fn(t):
        dst = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst, t, np.remainder, 4.0)
        return dst

    np.testing.assert_allclose(run(fn, x), np.mod(x, np.float32(4.0)), rtol=1e-6)


@pytest.mark.parametrize("shape", [(128, 64), (16, 4, 8)])
def test_abs_max_abs_min_return_the_signed_value_and_y_on_ties(monkeypatch, shape):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = _data(shape, np.float32, -5, 5)
    y = _data(shape, np.float32, -5, 5)
    y.reshape(-1)[:7] = -x.reshape(-1)[:7]  # ties: |x| == |y|
    got_max, got_min = run(nl.abs_max, x, y), run(nl.abs_min, x, y)
    np.testing.assert_array_equal(got_max, np.where(np.abs(x) > np.abs(y), x, y))
    np.testing.assert_array_equal(got_min, np.where(np.abs(x) < np.abs(y), x, y))
    assert np.array_equal(got_max.reshape(-1)[:7], y.reshape(-1)[:7])  # the tie picks y
    col = _data((shape[0], 1), np.float32, -5, 5)  # a [P, 1] operand broadcasts along the free axis
    if len(shape) == 2:
        np.testing.assert_array_equal(run(nl.abs_max, x, col), np.where(np.abs(x) > np.abs(col), x, col))


def test_abs_max_needs_neuroncore_v4(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    x = _data((8, 8), np.float32)
    with pytest.raises(NKIError, match="NeuronCore-v4"):
        run(nl.abs_max, x, x)
    with pytest.raises(NKIError, match="NeuronCore-v4"):
        run(lambda t: nl.abs_min(t, 1.0), x)


# ---------------------------------------------------------------------------- bit-vector helpers
@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.uint16, np.int8])
def test_bitwise_helpers_are_exact_on_bit_patterns(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (64, 16), dtype=np.int64, endpoint=True).astype(dtype)
    y = RNG.integers(info.min, info.max, (64, 16), dtype=np.int64, endpoint=True).astype(dtype)
    np.testing.assert_array_equal(run(nl.bitwise_and, x, y), x & y)
    np.testing.assert_array_equal(run(nl.bitwise_or, x, y), x | y)
    np.testing.assert_array_equal(run(nl.bitwise_xor, x, y), x ^ y)
    np.testing.assert_array_equal(run(nl.invert, x), ~x)
    np.testing.assert_array_equal(run(lambda t: nl.bitwise_and(t, 0x0F), x), x & dtype(0x0F))
    np.testing.assert_array_equal(run(lambda t: nl.bitwise_or(0x30, t), x), x | dtype(0x30))
    shift = RNG.integers(0, 7, (64, 16)).astype(dtype)
    np.testing.assert_array_equal(run(nl.left_shift, x, shift), np.left_shift(x, shift))
    np.testing.assert_array_equal(run(nl.right_shift, x, shift), np.right_shift(x, shift))


def test_bitwise_values_above_2_pow_24_stay_exact():
    x = np.full((4, 4), 0x7F00FF01, np.int32)
    np.testing.assert_array_equal(run(lambda t: nl.bitwise_and(t, 0x7FFFFFFE), x), x & 0x7FFFFFFE)
    np.testing.assert_array_equal(run(lambda t: nl.bitwise_xor(t, 1), x), x ^ 1)


def test_bitwise_helpers_reject_floats_and_scalar_only_calls():
    x = _data((8, 8), np.float32)
    with pytest.raises(NKIError, match="not an integer type"):
        run(lambda t: nl.bitwise_and(t, 1), x)
    i = np.ones((8, 8), np.int32)
    with pytest.raises(NKIError, match="at least one of x, y must be a tile"):
        run(lambda t: nl.bitwise_or(1, 2) or t, i)
    with pytest.raises(NKIError, match="not an integer type"):
        run(lambda t: nl.bitwise_or(t, 1, dtype=nl.float32), i)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_logical_not(dtype):
    x = RNG.integers(0, 2, (32, 16)).astype(dtype)
    np.testing.assert_array_equal(run(nl.logical_not, x), (x == 0).astype(dtype))


# ---------------------------------------------------------------------------- reductions, softmax, rms_norm
def test_all_reduces_with_logical_and():
    x = (RNG.random((64, 8, 4)) < 0.9).astype(np.float32)
    x[0] = 1.0
    np.testing.assert_array_equal(run(lambda t: nl.all(t, axis=2), x), np.all(x != 0, axis=2).astype(np.float32))
    np.testing.assert_array_equal(run(lambda t: nl.all(t, axis=(1, 2)), x), np.all(x != 0, axis=(1, 2)).astype(np.float32))
    assert run(lambda t: nl.all(t, axis=(1, 2)), x)[0] == 1.0


@pytest.mark.parametrize("shape, axis", [((128, 64), 1), ((32, 4, 16), (1, 2)), ((32, 4, 16), 2), ((16, 100), -1)])
def test_var_is_the_population_variance_with_kept_dims(shape, axis):
    x = _data(shape, np.float32) + 5.0
    got = run(lambda t: nl.var(t, axis=axis), x)
    ref = np.var(x.astype(np.float64), axis=axis, keepdims=True)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape, axis, dtype", [((128, 64), 1, np.float32), ((32, 4, 16), (1, 2), np.float32),
                                                ((64, 96), -1, BF16)])
def test_softmax(shape, axis, dtype):
    x = _data(shape, dtype, -6, 6)
    got = run(lambda t: nl.softmax(t, axis=axis), x)
    xf = x.astype(np.float64)
    e = np.exp(xf - xf.max(axis=axis, keepdims=True))
    ref = e / e.sum(axis=axis, keepdims=True)
    assert got.dtype == dtype
    _close(got, ref.astype(np.float32), dtype)


def test_reductions_take_only_the_last_free_axes():
    x = _data((16, 4, 8), np.float32)
    for fn in (lambda t: nl.softmax(t, axis=1), lambda t: nl.var(t, axis=1),
               lambda t: nl.rms_norm(t, t, axis=1, n=4)):
        with pytest.raises(NKIError, match="last free dimension"):
            run(fn, x)
    with pytest.raises(NKIError, match="partition axis"):
        run(lambda t: nl.softmax(t, axis=0), x)


@pytest.mark.parametrize("shape, wshape, n, dtype", [((128, 64), (128, 64), 64, np.float32),
                                                      ((64, 96), (64, 96), 96, BF16),
                                                      ((32, 48), (32, 1), 100, np.float32)])
def test_rms_norm(shape, wshape, n, dtype):
    x = _data(shape, dtype)
    w = _data(wshape, dtype, 0.5, 1.5)
    got = run(lambda a, b: nl.rms_norm(a, b, axis=1, n=n, epsilon=1e-3), x, w)
    xf = x.astype(np.float64)
    ref = xf / np.sqrt((xf * xf).sum(axis=1, keepdims=True) / n + 1e-3) * w.astype(np.float64)
    _close(got, ref.astype(np.float32), dtype)


def test_rms_norm_rejects_a_bad_count():
    x = _data((8, 8), np.float32)
    with pytest.raises(NKIError, match="positive integer"):
        run(lambda t: nl.rms_norm(t, t, axis=1, n=0), x)


# ---------------------------------------------------------------------------- where, broadcast_to, expand_dims
@pytest.mark.parametrize("shape, dtype", [((128, 32), np.float32), ((16, 4, 8), BF16)])
def test_where(shape, dtype):
    cond = (RNG.random(shape) < 0.5).astype(np.float32)
    x, y = _data(shape, dtype), _data(shape, dtype)
    np.testing.assert_array_equal(run(nl.where, cond, x, y), np.where(cond != 0, x, y))
    np.testing.assert_array_equal(run(lambda c, a: nl.where(c, a, -7.0), cond, x),
                                  np.where(cond != 0, x, dtype(-7.0)))
    np.testing.assert_array_equal(run(lambda c: nl.where(c, 10.0, 5.0), cond), np.where(cond != 0, 10.0, 5.0))


def test_broadcast_to_copies_free_dimensions():
    col = _data((128, 1), np.float32)
    got = run(lambda t: nl.broadcast_to(t, (128, 40)), col)
    np.testing.assert_array_equal(got, np.broadcast_to(col, (128, 40)))
    mid = _data((16, 1, 8), BF16)
    got = run(lambda t: nl.broadcast_to(t, (16, 5, 8), dtype=nl.float32), mid)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.broadcast_to(mid.astype(np.float32), (16, 5, 8)))


def test_broadcast_to_rules():
    x = _data((16, 1), np.float32)
    with pytest.raises(NKIError, match="rank"):
        run(lambda t: nl.broadcast_to(t, (16, 1, 4)), x)
    with pytest.raises(NKIError, match="partition dimension"):
        run(lambda t: nl.broadcast_to(t[0:1], (16, 1)), x)
    with pytest.raises(NKIError, match="only size-1 dimensions broadcast"):
        run(lambda t: nl.broadcast_to(nl.broadcast_to(t, (16, 3)), (16, 6)), x)


def test_broadcast_to_of_the_same_shape_is_the_tile_itself():
    seen = []

    def fn(t):
        seen.append(nl.broadcast_to(t, t.shape) is t)
        return t

    run(fn, _data((8, 4), np.float32))
    assert seen == [True]


def test_expand_dims_is_a_view_and_keeps_the_partition_axis():
    x = _data((16, 12), np.float32)
    got = run(lambda t: nl.copy(nl.expand_dims(t, 1)), x)
    np.testing.assert_array_equal(got, x[:, None, :])
    got = run(lambda t: nl.copy(nl.expand_dims(t, -1)), x)
    np.testing.assert_array_equal(got, x[:, :, None])
    with pytest.raises(NKIError, match="partition dimension"):
        run(lambda t: nl.expand_dims(t, 0), x)


# ---------------------------------------------------------------------------- gather_flattened
@pytest.mark.parametrize("dshape, ishape, itype", [((128, 64), (128, 64), np.int32), ((32, 4, 8), (32, 10), np.uint32)])
def test_gather_flattened(dshape, ishape, itype):
    data = _data(dshape, np.float32)
    free = int(np.prod(dshape[1:]))
    idx = RNG.integers(0, free, ishape).astype(itype)
    got = run(nl.gather_flattened, data, idx)
    ref = np.take_along_axis(data.reshape(dshape[0], -1), idx.reshape(ishape[0], -1).astype(np.int64), axis=1)
    np.testing.assert_array_equal(got, ref.reshape(ishape))


def test_gather_flattened_rules():
    data = _data((16, 8), np.float32)
    with pytest.raises(NKIError, match="outside data's 8 elements"):
        run(nl.gather_flattened, data, np.full((16, 2), 8, np.int32))
    with pytest.raises(NKIError, match="integer type"):
        run(nl.gather_flattened, data, np.zeros((16, 2), np.float32))
    with pytest.raises(NKIError, match="same partition count"):
        run(nl.gather_flattened, data, np.zeros((8, 2), np.int32))


# ---------------------------------------------------------------------------- loops and directives
def test_while_loop_runs_while_the_register_is_nonzero():
    def kernel(count):
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((1, 1), nl.float32, buffer=nl.sbuf)
        c = nl.load(count)
        one = nl.ones((1, 1), nl.int32, buffer=nl.sbuf)
        reg = nisa.register_alloc()
        nisa.register_load(reg, c)

        def body(r):
            nisa.tensor_scalar(acc, acc, nl.add, 2.0)
            nisa.tensor_tensor(c, c, one, nl.subtract)
            nisa.register_load(r, c)
            return r

        nl.while_loop(reg, body)
        nl.store(out, acc)
        return out

    for n in (0, 1, 5):
        assert run_plain(kernel, np.full((1, 1), n, np.int32))[0, 0] == 2.0 * n


def test_while_loop_needs_registers():
    def kernel(a):
        nl.while_loop(1, lambda r: r)
        return a

    with pytest.raises(NKIError, match="init must be a register"):
        run_plain(kernel, np.zeros((1, 1), np.float32))

    def returns_nothing(a):
        nl.while_loop(nisa.register_alloc(1), lambda r: None)
        return a

    with pytest.raises(NKIError, match="must return the next condition register"):
        run_plain(returns_nothing, np.zeros((1, 1), np.float32))


def test_no_reorder_keeps_results_and_forbids_dynamic_loops():
    x = _data((8, 8), np.float32)

    def fn(t):
        with nl.no_reorder():
            a = nl.add(t, 3.0)
            b = nl.multiply(a, 2.0)
            for _ in nl.affine_range(2, precise_schedule=True):  # static loops are allowed (the hint is ignored)
                b = nl.add(b, 1.0)
        return b

    np.testing.assert_allclose(run(fn, x), (x + 3) * 2 + 2, rtol=1e-6)

    def dynamic(t):
        with nl.no_reorder():
            nl.fori_loop(0, 2, lambda i: None)
        return t

    with pytest.raises(NKIError, match="no_reorder"):
        run(dynamic, x)

    def after(t):  # the block ends: dynamic loops are allowed again
        with nl.no_reorder():
            pass
        nl.fori_loop(0, 2, lambda i: None)
        return nl.copy(t)

    np.testing.assert_array_equal(run(after, x), x)


def test_device_print_prints_the_prefix_and_values(capsys):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    def fn(t):
        nl.device_print("tile-x", t)
        return t

    run(fn, x)
    printed = capsys.readouterr().out
    assert "tile-x" in printed and "5." in printed
    with pytest.raises(NKIError, match="constant string"):
        run(lambda t: nl.device_print(3, t), x)
    with pytest.raises(NKIError, match="psum"):
        run(lambda t: nl.device_print("p", nl.transpose(t)), x)


# ---------------------------------------------------------------------------- loop_reduce, atomic_rmw
@pytest.mark.parametrize("blocks, op, ref_fn", [(3, np.add, np.add), (4, nl.maximum, np.maximum)])
def test_loop_reduce_reduces_into_the_assignment_target(blocks, op, ref_fn):
    a = _data((blocks, 128, 64), np.float32)
    b = _data((blocks, 128, 32), np.float32)

    def kernel(a, b):
        out = nl.ndarray((64, 32), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((2, nl.par_dim(64), 32), nl.float32, buffer=nl.sbuf)
        for k in nl.affine_range(blocks):
            prod = nl.ndarray((64, 32), nl.float32, buffer=nl.psum)
            nisa.nc_matmul(prod, nl.load(a[k]), nl.load(b[k]))
            acc[1] = nl.loop_reduce(prod, op=op, loop_indices=[k], dtype=nl.float32)
        nl.store(out, acc[1])
        return out

    got = run_plain(kernel, a, b)
    ref = np.zeros((64, 32))
    for k in range(blocks):
        ref = ref_fn(ref, a[k].T.astype(np.float64) @ b[k])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_loop_reduce_result_is_only_an_assignment():
    def fn(t):
        r = nl.loop_reduce(t, np.add, loop_indices=[0])
        return r.shape

    with pytest.raises(NKIError, match="right side of an assignment"):
        run(fn, _data((8, 8), np.float32))
    with pytest.raises(NKIError, match="loop_indices is required"):
        run(lambda t: nl.loop_reduce(t, np.add, None), _data((8, 8), np.float32))


def test_atomic_rmw_adds_into_hbm():
    base = _data((32, 16), np.float32)
    val = _data((32, 16), np.float32)

    def kernel(base, val):
        out = nl.ndarray(base.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(base))
        nl.atomic_rmw(out, nl.load(val), op=np.add)
        nl.atomic_rmw(out[0:4], 1.0, op=nl.add)
        return out

    ref = base + val
    ref[0:4] += 1.0
    np.testing.assert_allclose(run_plain(kernel, base, val), ref, rtol=1e-6)

    def bad(base, val):
        nl.atomic_rmw(base, nl.load(val), op=np.multiply)
        return base

    with pytest.raises(NKIError, match="only np.add"):
        run_plain(bad, base, val)


# ---------------------------------------------------------------------------- creation, buffer predicates
def test_empty_like_and_rand():
    seen = {}

    def fn(t):
        e = nl.empty_like(t)
        e2 = nl.empty_like(t, dtype=nl.bfloat16, buffer=nl.psum)
        seen["e"] = (e.shape, e.dtype, e.buffer.kind, e2.dtype, e2.buffer.kind)
        nl.random_seed(5)
        r = nl.rand((64, 128), dtype=nl.float32)
        nl.random_seed(5)
        seen["same"] = np.array_equal(nl.rand((64, 128), dtype=nl.float32).numpy(), r.numpy())
        seen["hbm"] = nl.rand((4, 4), nl.bfloat16, buffer=nl.shared_hbm).numpy()
        return r

    r = run(fn, _data((16, 8), np.float32))
    assert seen["e"] == ((16, 8), nl.float32, "sbuf", nl.bfloat16, "psum")
    assert seen["same"] and r.min() >= 0.0 and r.max() < 1.0
    assert 0.45 < r.mean() < 0.55 and len(np.unique(r)) > 1000  # uniform over [0, 1)
    assert seen["hbm"].dtype == BF16 and (seen["hbm"].astype(np.float32) >= 0).all()
    with pytest.raises(NKIError, match="float dtype"):
        run(lambda t: nl.rand((4, 4), nl.int32), _data((4, 4), np.float32))


def test_buffer_predicates():
    bufs = {nl.sbuf: (False, True, False, True), nl.psum: (True, False, False, True),
            nl.hbm: (False, False, True, False), nl.shared_hbm: (False, False, True, False),
            nl.private_hbm: (False, False, True, False)}
    for buf, want in bufs.items():
        assert (nl.is_psum(buf), nl.is_sbuf(buf), nl.is_hbm(buf), nl.is_on_chip(buf)) == want
    seen = []
    run(lambda t: seen.append((nl.is_sbuf(t), nl.is_hbm(t.buffer))) or t, _data((4, 4), np.float32))
    assert seen == [(True, False)]
    with pytest.raises(NKIError, match="expected a buffer"):
        nl.is_sbuf("sbuf")


# ---------------------------------------------------------------------------- NkiTensor view API
def test_tensor_metadata():
    seen = {}

    def kernel(a):
        t = nl.ndarray((128, 4, 8), nl.bfloat16, buffer=nl.sbuf, name="buf")
        seen["sbuf"] = (t.strides, t.size, t.name, t.is_contiguous(), t.get_pattern())
        p = t.permute(0, 2, 1)
        s = t[:, :, 0:8:2]
        seen["views"] = (p.strides, p.is_contiguous(), s.strides, s.is_contiguous(), t[:, 1].is_contiguous())
        seen["hbm"] = (a.strides, a.is_contiguous(), a.T.is_contiguous(), a.name)
        return a

    run_plain(kernel, _data((6, 10), np.float32))
    assert seen["sbuf"] == ((32, 8, 1), 128 * 32, "buf", True, [[32, 128], [8, 4], [1, 8]])
    assert seen["views"] == ((32, 1, 8), False, (32, 8, 2), False, True)
    assert seen["hbm"][:3] == ((10, 1), True, False)


def _view_case(view_fn, x):
    return run(lambda t: nl.copy(view_fn(t)), x)


def test_view_methods_match_numpy():
    x = _data((16, 24), np.float32)
    np.testing.assert_array_equal(_view_case(lambda t: t.reshape_dim(1, (4, 6)), x), x.reshape(16, 4, 6))
    np.testing.assert_array_equal(_view_case(lambda t: t.reshape_dim(1, (4, -1)), x), x.reshape(16, 4, 6))
    np.testing.assert_array_equal(_view_case(lambda t: t.reshape_dim(1, (2, 3, 4)).flatten_dims(1, 2), x),
                                  x.reshape(16, 6, 4))
    np.testing.assert_array_equal(_view_case(lambda t: t.expand_dim(1).broadcast(1, 3), x),
                                  np.broadcast_to(x[:, None], (16, 3, 24)))
    np.testing.assert_array_equal(_view_case(lambda t: t.expand_dim(2).squeeze_dim(2), x), x)
    np.testing.assert_array_equal(_view_case(lambda t: t.slice(1, 3, 21, 3), x), x[:, 3:21:3])
    np.testing.assert_array_equal(_view_case(lambda t: t.slice(0, 4, 12), x), x[4:12])
    np.testing.assert_array_equal(_view_case(lambda t: t.reshape_dim(1, (4, 6)).select(1, 2), x),
                                  x.reshape(16, 4, 6)[:, 2])
    # einops: (b, (h w)) -> (b, w, h) with h = 4
    np.testing.assert_array_equal(_view_case(lambda t: t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4}), x),
                                  x.reshape(16, 4, 6).transpose(0, 2, 1))
    y = _data((8, 2, 3, 5), np.float32)
    np.testing.assert_array_equal(_view_case(lambda t: t.rearrange(("p", "a", "b", "c"), ("p", "c", ("a", "b"))), y),
                                  y.transpose(0, 3, 1, 2).reshape(8, 5, 6))


def test_views_write_through():
    x = _data((8, 12), np.float32)

    def fn(t):
        out = nl.zeros((8, 12), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(out.reshape_dim(1, (3, 4)).select(1, 1), t[:, 0:4])
        return out

    ref = np.zeros((8, 12), np.float32)
    ref[:, 4:8] = x[:, 0:4]
    np.testing.assert_array_equal(run(fn, x), ref)


def test_view_rules():
    x = _data((16, 24), np.float32)
    cases = [
        (lambda t: t.expand_dim(0), "partition dimension"),
        (lambda t: t.squeeze_dim(1), "not 1"),
        (lambda t: t.broadcast(1, 4), "only a size-1"),
        (lambda t: t.reshape_dim(1, (5, 5)), "multiply"),
        (lambda t: t.reshape_dim(1, (-1, -1)), "at most one -1"),
        (lambda t: t.reshape_dim(1, (4, 6)).permute(0, 2, 1).flatten_dims(1, 2), "not contiguous"),
        (lambda t: t.flatten_dims(0, 1), "partition dimension"),
        (lambda t: t.slice(1, 10, 5), "start < end"),
        (lambda t: t.select(1, 24), "outside dimension"),
        (lambda t: t.select(3, 0), "outside the 2 dimensions"),
        (lambda t: t.rearrange(("a",), ("a",)), "names 1 dimensions"),
        (lambda t: t.rearrange(("a", "b"), ("a", "c")), "once"),
        (lambda t: t.rearrange(("p", ("h", "w")), ("p", ("w", "h")), {"h": 4}), "not contiguous"),
    ]
    for fn, message in cases:
        with pytest.raises(NKIError, match=message):
            run(fn, x)


def test_dynamic_select_is_indirect():
    data = _data((5, 16, 8), np.float32)
    seen = {}

    def kernel(data, index):
        out = nl.ndarray((16, 8), nl.float32, buffer=nl.shared_hbm)
        i = nl.load(index)
        view = data.select(0, i)
        seen["flags"] = (data.is_indirect(), view.is_indirect(), data.select(0, 1).is_indirect())
        try:
            view.select(0, i)
        except NKIError as exc:
            seen["again"] = str(exc)
        try:
            view.slice(0, 0, 2)
        except NKIError as exc:
            seen["slice"] = str(exc)
        seen["ap"] = data.ap([[8, 16], [1, 8]], scalar_offset=i, indirect_dim=0).is_indirect()
        nl.store(out, nl.load(view))
        return out

    got = run_plain(kernel, data, np.array([[3]], np.int32))
    np.testing.assert_array_equal(got, data[3])
    assert seen["flags"] == (False, True, False) and seen["ap"] is True
    assert "already uses indirect addressing" in seen["again"] and "cannot be sliced" in seen["slice"]
    with pytest.raises(NKIError, match="outside dimension 0 of size 5"):
        run_plain(kernel, data, np.array([[5]], np.int32))


def test_reinterpret_cast_is_a_view():
    x = _data((8, 16), np.float32)
    got = run(lambda t: nl.copy(t.reinterpret_cast(nl.uint8)), x)
    np.testing.assert_array_equal(got, x.view(np.uint8))


# ---------------------------------------------------------------------------- nki.tensor (older reference)
def test_nki_tensor_is_the_tile_type():
    import importlib

    assert nki.tensor is nl.NkiTensor
    assert importlib.import_module("torch_neuronx.nki.tensor").NkiTensor is nl.NkiTensor  # the module stays
    for name in ("assert_shape", "astype", "broadcast_to", "dtype", "expand_dims", "itemsize", "ndim",
                 "reshape", "shape", "view"):
        assert hasattr(nki.tensor, name), name
    x = _data((8, 4), np.float32)
    seen = []

    def fn(t):
        seen.append(isinstance(t, nki.tensor))
        c = t.assert_shape((8, 4)).astype(nl.bfloat16)
        seen.append((c.dtype, c.data is not t.data))
        return c

    got = run(fn, x)
    assert seen == [True, (nl.bfloat16, True)]
    np.testing.assert_array_equal(got, x.astype(BF16))
    with pytest.raises(NKIError, match="expected"):
        run(lambda t: t.assert_shape((4, 8)), x)


# ---------------------------------------------------------------------------- per-partition indirection
@pytest.mark.parametrize("shape", [(10, 6), (7, 3, 4)])
def test_vector_select_gathers_rows_per_partition(shape):
    data = _data(shape, np.float32)
    rows = RNG.integers(0, shape[0], (16, 1)).astype(np.int32)

    def kernel(data, rows):
        out = nl.ndarray((16,) + shape[1:], nl.float32, buffer=nl.shared_hbm)
        r = nl.load(rows)
        view = data.vector_select(0, r)
        assert view.is_indirect() and view.shape == (16,) + shape[1:]
        tile = nl.ndarray((16,) + shape[1:], nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(tile, view)
        nl.store(out, tile)
        return out

    np.testing.assert_array_equal(run_plain(kernel, data, rows), data[rows[:, 0]])


def test_vector_select_scatters_and_checks_bounds():
    base = np.zeros((12, 5), np.float32)
    val = _data((4, 5), np.float32)

    def kernel(base, val, rows, skip):
        out = nl.ndarray(base.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(base))
        nisa.dma_copy(out.vector_select(0, nl.load(rows)), nl.load(val),
                      oob_mode=nisa.oob_mode.skip if skip else None)
        return out

    rows = np.array([[3], [0], [11], [7]], np.int32)
    ref = base.copy()
    ref[rows[:, 0]] = val
    np.testing.assert_array_equal(run_plain(kernel, base, val, rows, False), ref)
    bad = np.array([[3], [12], [11], [-1]], np.int32)
    with pytest.raises(NKIError, match="out of bounds"):
        run_plain(kernel, base, val, bad, False)
    ref = base.copy()
    ref[[3, 11]] = val[[0, 2]]  # oob_mode=skip leaves the out-of-range rows out
    np.testing.assert_array_equal(run_plain(kernel, base, val, bad, True), ref)


def test_vector_select_rules():
    data = _data((4, 8), np.float32)

    def kernel(data, rows, case):
        r = nl.load(rows)
        if case == "dim":
            data.vector_select(1, r)
        elif case == "sbuf":
            nl.load(data).vector_select(0, r)
        elif case == "twice":
            data.select(0, r[0:1]).vector_select(0, r)
        elif case == "float":
            data.vector_select(0, nl.load(data[:, 0:1]))
        return data

    rows = np.zeros((4, 1), np.int32)
    for case, message in (("dim", "must be 0"), ("sbuf", "HBM tensors only"), ("twice", "already uses indirect"),
                          ("float", "integer type")):
        with pytest.raises(NKIError, match=message):
            run_plain(kernel, data, rows, case)


@pytest.mark.parametrize("n_rows, width", [(8, 4), (16, 1)])
def test_ap_vector_offset_indexes_the_indirect_dimension(n_rows, width):
    """As nki-library's router_topk and attention_tkg use it: partition p addresses element
    v[p] * stride(indirect_dim) (+ the inner pairs); the first pair's step is replaced."""
    table = _data((20, width), np.float32)
    rows = RNG.permutation(20)[:n_rows].reshape(n_rows, 1).astype(np.int32)

    def gather(table, rows):
        out = nl.ndarray((n_rows, width), nl.float32, buffer=nl.shared_hbm)
        tile = nl.ndarray((n_rows, width), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(tile, table.ap([[width, n_rows], [1, width]], offset=0, vector_offset=nl.load(rows),
                                     indirect_dim=0))
        nl.store(out, tile)
        return out

    np.testing.assert_array_equal(run_plain(gather, table, rows), table[rows[:, 0]])

    def scatter_1d(table, rows):  # a flattened 1-D target, one element per partition
        out = nl.ndarray((20 * width,), nl.float32, buffer=nl.shared_hbm)
        zeros = nl.zeros((1, 20 * width), nl.float32, buffer=nl.sbuf)
        nl.store(out.reshape((1, 20 * width)), zeros)
        vals = nl.load(table[0:n_rows, 0:1])
        nisa.dma_copy(out.ap([[7, n_rows], [1, 1]], offset=0, vector_offset=nl.load(rows), indirect_dim=0), vals)
        return out

    ref = np.zeros(20 * width, np.float32)
    ref[rows[:, 0]] = table[:n_rows, 0]
    np.testing.assert_array_equal(run_plain(scatter_1d, table, rows), ref)


def test_ap_vector_offset_rules():
    table = _data((8, 4), np.float32)

    def kernel(table, rows, case):
        r = nl.load(rows)
        if case == "onchip":
            nl.load(table).ap([[4, 8], [1, 4]], vector_offset=r)
        elif case == "count":
            table.ap([[4, 4], [1, 4]], vector_offset=r)
        elif case == "oob":
            t = nl.ndarray((8, 4), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(t, table.ap([[4, 8], [1, 4]], vector_offset=r))
        return table

    rows = np.arange(8, dtype=np.int32).reshape(8, 1)
    with pytest.raises(NKIError, match="HBM tensors only"):
        run_plain(kernel, table, rows, "onchip")
    with pytest.raises(NKIError, match=r"one index per partition"):
        run_plain(kernel, table, rows, "count")
    with pytest.raises(NKIError, match="out of bounds"):
        run_plain(kernel, table, rows + 1, "oob")


def test_prelu_token():
    x = _data((16, 8), np.float32)
    np.testing.assert_array_equal(nl.prelu.fn(x, relu_param=0.25), np.where(x >= 0, x, np.float32(0.25) * x))
    col = _data((16, 1), np.float32, 0.1, 0.5)  # a per-partition slope
    np.testing.assert_allclose(nl.prelu.fn(x, relu_param=col), np.where(x >= 0, x, col * x), rtol=1e-7)

    def fn(t):  # nisa.activation has no relu_param: slope 0
        dst = nl.ndarray(t.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(dst, nl.prelu, t)
        return dst

    np.testing.assert_array_equal(run(fn, x), np.maximum(x, 0))


# ---------------------------------------------------------------------------- nl.all_reduce (older reference)
@pytest.mark.parametrize("grid, axes", [((4,), 0), ((2, 3), 1), ((2, 3), (0, 1))])
@pytest.mark.parametrize("op, ref_fn", [(np.add, np.sum), (nl.maximum, np.max)])
def test_all_reduce_over_program_axes(grid, axes, op, ref_fn):
    n = int(np.prod(grid))
    x = _data((n, 16, 8), np.float32)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        ids = [nl.program_id(a) for a in range(len(grid))]
        i = int(np.ravel_multi_index(ids, grid))
        r = nl.all_reduce(nl.load(x[i]), op, program_axes=axes)
        nl.store(out[i], r)
        return out

    got = kernel[grid](x)
    xs = x.reshape(grid + (16, 8)).astype(np.float64)
    red = (axes,) if isinstance(axes, int) else axes
    ref = np.broadcast_to(ref_fn(xs, axis=red, keepdims=True), xs.shape).reshape(x.shape)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_all_reduce_rules():
    x = _data((2, 4, 4), np.float32)

    def make(op, axes):
        @nki.jit
        def kernel(x):
            out = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
            nl.store(out, nl.all_reduce(nl.load(x[nl.program_id(0)]), op, program_axes=axes))
            return out
        return kernel

    with pytest.raises(NKIError, match="not supported"):
        make(np.multiply, 0)[2](x)
    with pytest.raises(NKIError, match="must name axes of the launch grid"):
        make(np.add, 1)[2](x)


def test_loop_reduce_keeps_its_mask():
    x = _data((8, 16), np.float32)

    def fn(t):
        acc = nl.zeros((8, 16), nl.float32, buffer=nl.sbuf)
        i_p, i_f = nl.mgrid[0:8, 0:16]
        for k in nl.affine_range(2):
            acc[i_p, i_f] = nl.loop_reduce(t, np.add, loop_indices=[k], mask=(i_f < 10))
        return acc

    ref = np.where(np.arange(16) < 10, 2 * x, 0)
    np.testing.assert_allclose(run(fn, x), ref, rtol=1e-6)
