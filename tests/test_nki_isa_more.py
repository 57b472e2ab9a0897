"""The `nki.isa` names of AWS's current reference that the simulator lacked (issue #27 items 3 and 6):
tensor_copy_predicated, select_reduce, range_select, exponential, activate2, tensor_partition_reduce,
local_gather, sequence_bounds, dma_compute, the random-number instructions, engine.sync,
NkiInstruction.depends_on, and the previous reference's tensor_copy_dynamic_src / _dst.

Small kernels written here against NumPy references: exact where the instruction moves or selects
values, a stated tolerance where it computes (float32 exp / activation functions: rtol 1e-6); each
hardware rule AWS documents raises an NKIError naming it; each instruction is in the trace on its
engine and the cost model charges the formula docs/nki.md states.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki import NKIError
from torch_neuronx.nki.cost import instruction_cycles
from torch_neuronx.nki.targets import get_target

RNG = np.random.default_rng(2027)
FP32_MIN = np.finfo(np.float32).min


@pytest.fixture
def trn3(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")


def _op(trace, name):
    found = [ins for ins in trace if ins.op == name]
    assert found, f"{name} not in the trace"
    return found


def _cycles(ins, target="trn2"):
    return instruction_cycles(ins.cost, get_target(target))


# ---------------------------------------------------------------------------- tensor_copy_predicated
@nki.jit
def _predicated(x, pred, fill, scalar, reverse):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t, p = nl.load(x), nl.load(pred)
    d = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.memset(d, fill)
    nisa.tensor_copy_predicated(d, scalar if scalar is not None else t, p, reverse_pred=reverse)
    nl.store(out, d)
    return out


@pytest.mark.parametrize("shape, dtype, pdtype", [((128, 64), np.float32, np.uint8), ((32, 4, 8), ml_dtypes.bfloat16,
                                                  np.uint16), ((7, 300), np.int32, np.uint32)])
@pytest.mark.parametrize("reverse", [False, True])
def test_tensor_copy_predicated_copies_where_the_predicate_holds(shape, dtype, pdtype, reverse):
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    pred = RNG.integers(0, 3, shape).astype(pdtype)  # 0 false, 1 and 2 true
    out = _predicated(x, pred, 5, None, reverse)
    keep = (pred != 0) != reverse
    np.testing.assert_array_equal(out, np.where(keep, x, np.asarray(5, dtype)))
    ins = _op(_predicated.last_trace, "nisa.tensor_copy_predicated")[0]
    assert ins.engine == "vector"
    n = int(np.prod(shape[1:]))
    assert _cycles(ins) == max(64, 2 * n)  # AWS: both in SBUF


def test_tensor_copy_predicated_takes_a_number_and_costs_less_from_psum():
    x = np.zeros((16, 8), np.float32)
    pred = np.eye(16, 8, dtype=np.uint8)
    np.testing.assert_array_equal(_predicated(x, pred, 1.0, -3.0, False), np.where(pred != 0, -3.0, 1.0))

    @nki.jit
    def from_psum(a, p):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ps = nl.ndarray(a.shape, nl.float32, buffer=nl.psum)
        nisa.memset(ps, 2.0)
        d = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.memset(d, 0.0)
        nisa.tensor_copy_predicated(d, ps, nl.load(p))
        nl.store(out, d)
        return out

    np.testing.assert_array_equal(from_psum(x, pred), np.where(pred != 0, 2.0, 0.0))
    assert _cycles(_op(from_psum.last_trace, "nisa.tensor_copy_predicated")[0]) == 64  # max(MIN_II, N)


def test_tensor_copy_predicated_rules():
    x = np.ones((8, 8), np.float32)
    with pytest.raises(NKIError, match="predicate dtype float32 is not supported"):
        _predicated(x, x, 0.0, None, False)
    with pytest.raises(NKIError, match="does not match predicate shape"):
        _predicated(x, np.ones((8, 4), np.uint8), 0.0, None, False)

    @nki.jit
    def cast(a, p):
        d = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy_predicated(d, nl.load(a), nl.load(p))

    with pytest.raises(NKIError, match="does not convert"):
        cast(x, np.ones((8, 8), np.uint8))


# ---------------------------------------------------------------------------- select_reduce
@nki.jit
def _select_reduce(x, pred, on_false, reverse, cmd):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    f = nl.load(on_false) if not isinstance(on_false, float) else on_false
    nisa.select_reduce(d, nl.load(pred), nl.load(x), f, reduce_res=r, reduce_cmd=cmd, reverse_pred=reverse)
    nl.store(out, d)
    nl.store(red, r)
    return out, red


@pytest.mark.parametrize("shape, pdtype", [((128, 40), np.uint8), ((16, 2, 9), np.int16)])
@pytest.mark.parametrize("vector_false", [False, True])
def test_select_reduce_selects_and_reduces_the_maximum(shape, pdtype, vector_false):
    x = RNG.standard_normal(shape).astype(np.float32)
    pred = RNG.integers(0, 2, shape).astype(pdtype)
    off = RNG.standard_normal((shape[0], 1)).astype(np.float32) if vector_false else -0.25
    out, red = _select_reduce(x, pred, off, True, nisa.reduce_cmd.reset_reduce)
    flat_x, flat_p = x.reshape(shape[0], -1), pred.reshape(shape[0], -1)
    ref = np.where(flat_p == 0, flat_x, np.broadcast_to(np.float32(off) if not vector_false else off, flat_x.shape))
    np.testing.assert_array_equal(out.reshape(shape[0], -1), ref)
    np.testing.assert_array_equal(red, ref.max(axis=1, keepdims=True))


def test_select_reduce_accumulates_across_instructions():
    @nki.jit
    def two(a, b, p):
        red = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        d = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        pt = nl.load(p)
        nisa.select_reduce(d, pt, nl.load(a), FP32_MIN, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.select_reduce(d, pt, nl.load(b), FP32_MIN, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce)
        nl.store(red, r)
        return red

    a, b = (RNG.standard_normal((64, 32)).astype(np.float32) for _ in range(2))
    p = RNG.integers(0, 2, (64, 32)).astype(np.uint8)
    expect = np.maximum(np.where(p != 0, a, FP32_MIN).max(1), np.where(p != 0, b, FP32_MIN).max(1))
    np.testing.assert_array_equal(two(a, b, p)[:, 0], expect)


def test_select_reduce_rules():
    x = np.ones((8, 8), np.float32)
    with pytest.raises(NKIError, match="predicate dtype uint32 is not supported"):
        _select_reduce(x, x.astype(np.uint32), 0.0, False, None)
    with pytest.raises(NKIError, match="on_true dtype int32 is not supported"):
        _select_reduce(x.astype(np.int32), x.astype(np.uint8), 0.0, False, None)
    with pytest.raises(NKIError, match="reduce_cmd=load_reduce is not supported"):
        _select_reduce(x, x.astype(np.uint8), 0.0, False, nisa.reduce_cmd.load_reduce)


# ---------------------------------------------------------------------------- range_select
@nki.jit
def _range_select(x, lo, hi, start, op1):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    d = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    nisa.range_select(d, on_true_tile=nl.load(x), comp_op0=nl.greater_equal, comp_op1=op1, bound0=nl.load(lo),
                      bound1=nl.load(hi), reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                      reduce_op=nl.maximum, range_start=start, on_false_value=nl.fp32.min)
    nl.store(out, d)
    nl.store(red, r)
    return out, red


@pytest.mark.parametrize("shape, dtype, start", [((128, 96), np.float32, 0), ((20, 4, 16), np.float32, 512),
                                                 ((64, 128), ml_dtypes.bfloat16, 1000)])
def test_range_select_keeps_the_window_of_each_row(shape, dtype, start):
    p, f = shape[0], int(np.prod(shape[1:]))
    x = RNG.standard_normal(shape).astype(dtype)
    lo = (start + RNG.integers(0, f, (p, 1))).astype(np.float32)
    hi = lo + RNG.integers(0, f // 2, (p, 1)).astype(np.float32)
    out, red = _range_select(x, lo, hi, start, nl.less)
    j = start + np.arange(f)[None, :]
    keep = (j >= lo) & (j < hi)
    selected = np.where(keep, x.reshape(p, f).astype(np.float32), FP32_MIN)
    np.testing.assert_array_equal(out.reshape(p, f), selected.astype(dtype))
    # The maximum is of the float32 values, before the cast into dst (AWS's numerical-stability note).
    np.testing.assert_array_equal(red, selected.max(axis=1, keepdims=True))
    ins = _op(_range_select.last_trace, "nisa.range_select")[0]
    assert ins.engine == "vector" and _cycles(ins) == max(64, f)


def test_range_select_empty_window_in_bfloat16_is_minus_inf_in_dst_and_fp32_min_in_reduce_res():
    x = RNG.standard_normal((4, 32)).astype(ml_dtypes.bfloat16)
    lo = np.full((4, 1), 10.0, np.float32)
    out, red = _range_select(x, lo, lo, 0, nl.less)  # [10, 10): empty
    assert np.isneginf(out.astype(np.float32)).all()
    np.testing.assert_array_equal(red, np.full((4, 1), FP32_MIN, np.float32))


def test_range_select_rules(monkeypatch):
    x = np.ones((8, 16), np.float32)
    b = np.zeros((8, 1), np.float32)
    with pytest.raises(NKIError, match="comp_op1 nl.add is not a comparison"):
        _range_select(x, b, b, 0, nl.add)
    with pytest.raises(NKIError, match="bound0 dtype int32 must be float32"):
        _range_select(x, b.astype(np.int32), b, 0, nl.less)
    with pytest.raises(NKIError, match="2\\^24"):
        _range_select(x, b, b, 2 ** 24, nl.less)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NKIError, match="NeuronCore-v3"):
        _range_select(x, b, b, 0, nl.less)

    @nki.jit
    def other_fill(a, lo):
        d = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        t = nl.load(lo)
        nisa.range_select(d, nl.load(a), nl.greater_equal, nl.less, t, t, on_false_value=0.0)

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NKIError, match="FP32_MIN"):
        other_fill(x, b)


# ---------------------------------------------------------------------------- exponential
@nki.jit
def _exponential(x, m, cmd, init):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    mv = nl.load(m) if not isinstance(m, float) else m
    nisa.exponential(d, nl.load(x), max_value=mv, reduce_res=r, reduce_cmd=cmd, reduce_init=init)
    nl.store(out, d)
    nl.store(red, r)
    return out, red


@pytest.mark.parametrize("shape, dtype", [((128, 64), np.float32), ((16, 3, 5, 2), ml_dtypes.bfloat16)])
@pytest.mark.parametrize("vector_max", [False, True])
def test_exponential_subtracts_the_max_and_sums(trn3, shape, dtype, vector_max):
    x = RNG.standard_normal(shape).astype(dtype)
    p = shape[0]
    m = RNG.standard_normal((p, 1)).astype(np.float32) if vector_max else 0.5
    out, red = _exponential(x, m, nisa.reduce_cmd.reset_reduce, 0.0)
    ref = np.exp(x.reshape(p, -1).astype(np.float32) - np.float32(m) if not vector_max
                 else x.reshape(p, -1).astype(np.float32) - m)
    np.testing.assert_allclose(out.reshape(p, -1), ref, rtol=1e-6)
    np.testing.assert_allclose(red[:, 0], ref.sum(axis=1), rtol=1e-5)


def test_exponential_load_reduce_starts_from_reduce_init(trn3):
    x = RNG.standard_normal((32, 10)).astype(np.float32)
    out, red = _exponential(x, 0.0, nisa.reduce_cmd.load_reduce, 100.0)
    np.testing.assert_allclose(red[:, 0], 100.0 + np.exp(x).sum(axis=1), rtol=1e-6)
    ins = _op(_exponential.last_trace, "nisa.exponential")[0]
    assert ins.engine == "vector" and _cycles(ins, "trn3") == 64


def test_exponential_rules(trn3, monkeypatch):
    x = np.ones((8, 8), np.float32)
    with pytest.raises(NKIError, match="reduce_init is what load_reduce loads"):
        _exponential(x, 0.0, nisa.reduce_cmd.reset_reduce, 1.0)
    with pytest.raises(NKIError, match="reduce_cmd=idle accumulates nothing"):
        _exponential(x, 0.0, nisa.reduce_cmd.idle, 0.0)
    with pytest.raises(NKIError, match="reduce_cmd=reset is not supported"):
        _exponential(x, 0.0, nisa.reduce_cmd.reset, 0.0)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NKIError, match="NeuronCore-v4"):
        _exponential(x, 0.0, nisa.reduce_cmd.reset_reduce, 0.0)


# ---------------------------------------------------------------------------- activate2
@nki.jit
def _activate2(x, fn, imm0, imm1, op0, op1, reverse0, reduce_op):
    out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    d = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    r = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    i0 = nl.load(imm0) if not isinstance(imm0, float) else imm0
    nisa.activate2(d, fn, nl.load(x), imm0=i0, imm1=imm1, op0=op0, op1=op1, reverse0=reverse0,
                   reduce_op=reduce_op, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nl.store(out, d)
    nl.store(red, r)
    return out, red


@pytest.mark.parametrize("op0, op1, reverse0, pre", [
    (nl.multiply, nl.add, False, lambda x, a, b: x * a + b),
    (nl.multiply, nl.subtract, False, lambda x, a, b: x * a - b),
    ("bypass", "bypass", False, lambda x, a, b: x),
    (nl.subtract, None, True, lambda x, a, b: a - x),
    (nl.add, None, False, lambda x, a, b: x + a),
])
@pytest.mark.parametrize("shape, vector_imm", [((128, 32), False), ((24, 2, 7), True)])
def test_activate2_runs_the_tensor_scalar_stage_then_the_function(trn3, op0, op1, reverse0, pre, shape, vector_imm):
    x = RNG.standard_normal(shape).astype(np.float32)
    p = shape[0]
    imm0 = RNG.standard_normal((p, 1)).astype(np.float32) if vector_imm else 1.5
    out, red = _activate2(x, nl.tanh, imm0, 0.25, op0, op1, reverse0, nl.add)
    ref = np.tanh(pre(x.reshape(p, -1), np.float32(imm0) if not vector_imm else imm0, np.float32(0.25)))
    np.testing.assert_allclose(out.reshape(p, -1), ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(red[:, 0], ref.sum(axis=1), rtol=1e-5, atol=1e-6)
    ins = _op(_activate2.last_trace, "nisa.activate2")[0]
    assert ins.engine == "scalar" and _cycles(ins, "trn3") == max(64, x[0].size)


@pytest.mark.parametrize("reduce_op, fn", [(nl.maximum, lambda v: v.max(1)), ("abs_max", lambda v: np.abs(v).max(1)),
                                           ("abs_min", lambda v: np.abs(v).min(1))])
def test_activate2_register_reductions(trn3, reduce_op, fn):
    x = RNG.standard_normal((64, 20)).astype(np.float32)
    out, red = _activate2(x, nl.identity, 2.0, 0.0, nl.multiply, None, False, reduce_op)
    np.testing.assert_array_equal(red[:, 0], fn(x * 2))


def test_activate2_rules(trn3, monkeypatch):
    x = np.ones((8, 8), np.float32)
    with pytest.raises(NKIError, match="op1 requires op0"):
        _activate2(x, nl.exp, 1.0, 1.0, None, nl.add, False, nl.add)
    with pytest.raises(NKIError, match="not one of the six"):
        _activate2(x, nl.exp, 1.0, 1.0, nl.add, nl.multiply, False, nl.add)
    with pytest.raises(NKIError, match="reverse0=True requires"):
        _activate2(x, nl.exp, 1.0, 1.0, None, None, True, nl.add)
    with pytest.raises(NKIError, match="cannot reduce into the Scalar Engine"):
        _activate2(x, nl.exp, 1.0, 1.0, nl.add, None, False, nl.multiply)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NKIError, match="NeuronCore-v4"):
        _activate2(x, nl.exp, 1.0, 1.0, nl.add, None, False, nl.add)


# ---------------------------------------------------------------------------- tensor_partition_reduce
@nki.jit
def _partition_reduce(x, op, dtype):
    out = nl.ndarray((1,) + x.shape[1:], dtype, buffer=nl.shared_hbm)
    d = nl.ndarray((1,) + x.shape[1:], dtype, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(d, op, nl.load(x))
    nl.store(out, d)
    return out


@pytest.mark.parametrize("op, ref", [(nl.add, np.sum), (nl.maximum, np.max), (np.add, np.sum), ("average", np.mean)])
@pytest.mark.parametrize("shape", [(128, 32, 4), (5, 17)])
def test_tensor_partition_reduce_reduces_over_partitions(op, ref, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(_partition_reduce(x, op, nl.float32), ref(x, axis=0, keepdims=True), rtol=1e-5, atol=1e-6)
    ins = _op(_partition_reduce.last_trace, "nisa.tensor_partition_reduce")[0]
    assert ins.engine == "gpsimd" and _cycles(ins) == 150 + int(np.prod(shape[1:]))


@pytest.mark.parametrize("op, ref", [("bitwise_or", np.bitwise_or), ("bitwise_and", np.bitwise_and)])
def test_tensor_partition_reduce_bitwise(op, ref):
    x = RNG.integers(0, 2 ** 16, (48, 12)).astype(np.int32)
    np.testing.assert_array_equal(_partition_reduce(x, op, nl.int32), ref.reduce(x, axis=0, keepdims=True))


def test_tensor_partition_reduce_rules():
    with pytest.raises(NKIError, match="bitwise_or needs integer tiles"):
        _partition_reduce(np.ones((4, 4), np.float32), "bitwise_or", nl.float32)
    with pytest.raises(NKIError, match="cannot reduce across partitions"):
        _partition_reduce(np.ones((4, 4), np.float32), nl.subtract, nl.float32)

    @nki.jit
    def wrong(a):
        d = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(d, nl.add, nl.load(a))

    with pytest.raises(NKIError, match="must be one partition"):
        wrong(np.ones((4, 4), np.float32))


# ---------------------------------------------------------------------------- local_gather
@nki.jit
def _local_gather(src, index, elems, valid, out_shape):
    out = nl.ndarray(out_shape, src.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(out_shape, src.dtype, buffer=nl.sbuf)
    nisa.local_gather(d, nl.load(src), nl.load(index), num_elem_per_idx=elems, num_valid_indices=valid)
    nl.store(out, d)
    return out


def _gather_ref(src, index, elems, valid):
    p = src.shape[0]
    flat = src.reshape(p, -1)
    out = []
    for core in range(p // 16):
        rows = slice(16 * core, 16 * core + 16)
        idx = index[rows].T.reshape(-1)[:valid].astype(np.int64)  # partition first
        out.append(np.stack([flat[rows][:, i:i + elems] for i in idx], axis=1))
    return np.concatenate(out).reshape(p, -1)


@pytest.mark.parametrize("p, free, cols, elems, valid, dtype", [
    (128, (64,), 4, 1, None, np.float32), (32, (40, 4), 2, 4, 20, ml_dtypes.bfloat16), (16, (100,), 8, 2, 128, np.int16)])
def test_local_gather_gathers_within_each_gpsimd_core(p, free, cols, elems, valid, dtype):
    src = (RNG.standard_normal((p,) + free) * 50).astype(dtype)
    f = int(np.prod(free))
    index = RNG.integers(0, f - elems + 1, (p, cols)).astype(np.uint16)
    n = valid or 16 * cols
    out = _local_gather(src, index, elems, valid, (p, n, elems))
    np.testing.assert_array_equal(out.reshape(p, -1), _gather_ref(src, index, elems, n))
    ins = _op(_local_gather.last_trace, "nisa.local_gather")[0]
    size = np.dtype(dtype).itemsize
    c = ((28 + 4 * elems) / (4 * elems)) / min(4 / size, elems)
    assert ins.engine == "gpsimd" and _cycles(ins) == pytest.approx(150 + n * elems / c)


def test_local_gather_rules():
    src = np.ones((32, 16), np.float32)
    idx = np.zeros((32, 2), np.uint16)
    with pytest.raises(NKIError, match="index dtype int32 must be uint16"):
        _local_gather(src, idx.astype(np.int32), 1, None, (32, 32, 1))
    with pytest.raises(NKIError, match="num_elem_per_idx=3"):
        _local_gather(src, idx, 3, None, (32, 32, 3))
    with pytest.raises(NKIError, match="multiple of 16"):
        _local_gather(np.ones((8, 16), np.float32), np.zeros((8, 2), np.uint16), 1, None, (8, 32, 1))
    with pytest.raises(NKIError, match="num_valid_indices=33"):
        _local_gather(src, idx, 1, 33, (32, 33, 1))
    with pytest.raises(NKIError, match="undefined behavior"):
        _local_gather(src, np.full((32, 2), 15, np.uint16), 2, None, (32, 32, 2))


# ---------------------------------------------------------------------------- sequence_bounds
def _bounds_ref(ids):
    n = len(ids)
    lo, hi = np.zeros(n), np.zeros(n)
    for i in range(n):
        if ids[i] == 0:
            lo[i], hi[i] = n, -1
            continue
        a = i
        while a > 0 and ids[a - 1] == ids[i]:
            a -= 1
        b = i + 1
        while b < n and ids[b] == ids[i]:
            b += 1
        lo[i], hi[i] = a, b
    return np.stack([lo, hi])[None]


@nki.jit
def _sequence_bounds(ids):
    out = nl.ndarray((1, 2, ids.shape[1]), ids.dtype, buffer=nl.shared_hbm)
    d = nl.ndarray((1, 2, ids.shape[1]), ids.dtype, buffer=nl.sbuf)
    nisa.sequence_bounds(d, nl.load(ids))
    nl.store(out, d)
    return out


@pytest.mark.parametrize("n, dtype", [(32, np.float32), (257, np.int32), (1, np.int32)])
def test_sequence_bounds_gives_each_elements_segment(n, dtype):
    ids = np.sort(RNG.integers(0, max(2, n // 4), n)).astype(dtype)[None, :]
    np.testing.assert_array_equal(_sequence_bounds(ids), _bounds_ref(ids[0]).astype(dtype))
    assert _op(_sequence_bounds.last_trace, "nisa.sequence_bounds")[0].engine == "gpsimd"


def test_sequence_bounds_rules():
    with pytest.raises(NKIError, match="partition dimension must be 1"):
        _sequence_bounds(np.ones((2, 8), np.float32))
    with pytest.raises(NKIError, match="segment_ids dtype bfloat16 is not supported"):
        _sequence_bounds(np.ones((1, 8), ml_dtypes.bfloat16))
    with pytest.raises(NKIError, match="non-negative integers"):
        _sequence_bounds(np.array([[1, -1, 2]], np.float32))


# ---------------------------------------------------------------------------- dma_compute
@nki.jit
def _dma_compute(a, b, c, on_chip):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    srcs = [a, b] + ([c] if c is not None else [])
    if on_chip:
        d = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_compute(d, srcs, nl.add, scales=[1.0] * len(srcs))
        nl.store(out, d)
    else:
        nisa.dma_compute(dst=out, srcs=srcs, reduce_op=nl.add)
    return out


@pytest.mark.parametrize("shape, dtype, three, on_chip", [((128, 64), np.float32, False, True),
                                                          ((4, 33, 7), ml_dtypes.bfloat16, True, False),
                                                          ((64, 16), np.float16, True, True)])
def test_dma_compute_adds_its_sources_in_float32(shape, dtype, three, on_chip):
    a, b, c = (RNG.standard_normal(shape).astype(dtype) for _ in range(3))
    out = _dma_compute(a, b, c if three else None, on_chip)
    ref = a.astype(np.float32) + b.astype(np.float32) + (c.astype(np.float32) if three else 0)
    np.testing.assert_array_equal(out, ref.astype(dtype))
    ins = _op(_dma_compute.last_trace, "nisa.dma_compute")[0]
    assert ins.engine == "dma" and ins.cost[1] == (3 if three else 2) * a.nbytes


def test_dma_compute_may_add_into_a_source():
    @nki.jit
    def inplace(x):
        nisa.dma_compute(x[0:4, :], [x[0:4, :], x[4:8, :]], nl.add)

    x = RNG.standard_normal((8, 16)).astype(np.float32)
    expect = x[:4] + x[4:]
    inplace(x)
    np.testing.assert_array_equal(x[:4], expect)


def test_dma_compute_rules():
    a = np.ones((4, 4), np.float32)

    @nki.jit
    def bad(x, op, scales):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [x, x], op, scales=scales)

    with pytest.raises(NKIError, match="only nl.add"):
        bad(a, nl.multiply, None)
    with pytest.raises(NKIError, match="every scale must be 1.0"):
        bad(a, nl.add, [1.0, 2.0])

    @nki.jit
    def sizes(x, y):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [x, y], nl.add)

    with pytest.raises(NKIError, match="every source must have dst's element count"):
        sizes(a, np.ones((4, 2), np.float32))


# ---------------------------------------------------------------------------- tensor_copy_dynamic_src / _dst
@nki.jit
def _dynamic_src(src, offsets):
    out = nl.ndarray((src.shape[0], offsets.shape[1]), src.dtype, buffer=nl.shared_hbm)
    s, o = nl.load(src), nl.load(offsets)
    d = nl.ndarray((src.shape[0], offsets.shape[1]), src.dtype, buffer=nl.sbuf)
    ix, _ = nl.mgrid[0:src.shape[0], 0:1]
    for k in range(offsets.shape[1]):  # the older dialect's dynamic index: a one-element tile
        nisa.tensor_copy_dynamic_dst(dst=d[:, k:k + 1], src=nisa.tensor_copy_dynamic_src(s[ix, o[0, k]]))
    nl.store(out, d)
    return out


@pytest.mark.parametrize("shape, dtype", [((128, 64), np.float32), ((16, 300), ml_dtypes.bfloat16)])
def test_tensor_copy_dynamic_src_gathers_columns_at_runtime_offsets(shape, dtype):
    src = RNG.standard_normal(shape).astype(dtype)
    offsets = RNG.integers(0, shape[1], (1, 6)).astype(np.int32)
    np.testing.assert_array_equal(_dynamic_src(src, offsets), src[:, offsets[0]])
    for name in ("nisa.tensor_copy_dynamic_src", "nisa.tensor_copy_dynamic_dst"):
        ins = _op(_dynamic_src.last_trace, name)[0]
        assert ins.engine == "vector" and _cycles(ins) == 600  # AWS: max(MIN_II_DYNAMIC ~ 600, N)


def test_tensor_copy_dynamic_dst_scatters_at_a_scalar_offset():
    @nki.jit
    def scatter(x, where):
        out = nl.ndarray((x.shape[0], 8), x.dtype, buffer=nl.shared_hbm)
        d = nl.ndarray((x.shape[0], 8), x.dtype, buffer=nl.sbuf)
        nisa.memset(d, 0.0)
        w = nl.load(where)
        nisa.tensor_copy_dynamic_dst(dst=d.ap([[8, x.shape[0]], [1, 2]], scalar_offset=w, indirect_dim=1),
                                     src=nl.load(x), engine=nisa.engine.gpsimd)
        nl.store(out, d)
        return out

    x = RNG.standard_normal((32, 2)).astype(np.float32)
    expect = np.zeros((32, 8), np.float32)
    expect[:, 5:7] = x
    np.testing.assert_array_equal(scatter(x, np.array([[5]], np.int32)), expect)
    assert _op(scatter.last_trace, "nisa.tensor_copy_dynamic_dst")[0].engine == "gpsimd"


# ---------------------------------------------------------------------------- random numbers
@nki.jit
def _rng(shape, dtype, engine, seed):
    out = nl.ndarray(shape, dtype, buffer=nl.shared_hbm)
    if seed is not None:
        s = nl.ndarray((1, 1), nl.uint32, buffer=nl.sbuf)
        nisa.memset(s, seed)
        nisa.set_rng_seed(s)
    d = nl.ndarray(shape, dtype, buffer=nl.sbuf)
    nisa.rng(d, engine=engine)
    nl.store(out, d)
    return out


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16, np.int8])
def test_rng_draws_uniform_bits_truncated_to_the_dtype(dtype):
    bits = _rng((128, 512), dtype, nisa.engine.vector, None)
    info = np.iinfo(dtype)
    assert bits.dtype == dtype and bits.min() >= info.min and bits.max() <= info.max
    width = np.dtype(dtype).itemsize * 8
    ones = np.unpackbits(bits.view(np.uint8)).mean()  # every bit is 1 half the time
    assert abs(ones - 0.5) < 0.005
    u = (bits.astype(np.int64) - info.min) / 2.0 ** width
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert len(np.unique(bits[:, :8].astype(np.int64) if width == 32 else bits)) > 1
    assert not np.array_equal(bits[0], bits[1])  # lanes differ


def test_rng_is_repeatable_and_seeded():
    a = _rng((64, 32), np.uint32, nisa.engine.vector, 7)
    b = _rng((64, 32), np.uint32, nisa.engine.vector, 7)
    c = _rng((64, 32), np.uint32, nisa.engine.vector, 8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(_rng((64, 32), np.uint32, None, None), _rng((64, 32), np.uint32, None, None))
    ins = _op(_rng.last_trace, "nisa.rng")[0]
    assert ins.engine == "vector" and _cycles(ins) == 64


def test_rng_rules(monkeypatch):
    with pytest.raises(NKIError, match="must be an integer type"):
        _rng((8, 8), np.float32, None, None)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(NKIError, match="NeuronCore-v3"):
        _rng((8, 8), np.uint32, nisa.engine.gpsimd, None)


def test_rand_state_round_trip_replays_the_numbers():
    @nki.jit
    def replay(dummy):
        first = nl.ndarray((16, 40), nl.uint32, buffer=nl.shared_hbm)
        again = nl.ndarray((16, 40), nl.uint32, buffer=nl.shared_hbm)
        states = nl.ndarray((16, 6), nl.uint32, buffer=nl.shared_hbm)
        st = nl.ndarray((16, 6), nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(st)
        d = nl.ndarray((16, 40), nl.uint32, buffer=nl.sbuf)
        nisa.rng(d, engine=nisa.engine.gpsimd)
        nl.store(first, d)
        nisa.rand_set_state(st)
        e = nl.ndarray((16, 40), nl.uint32, buffer=nl.sbuf)
        nisa.rng(e, engine=nisa.engine.gpsimd)
        nl.store(again, e)
        nl.store(states, st)
        return first, again, states

    first, again, states = replay(np.zeros(1, np.float32))
    np.testing.assert_array_equal(first, again)
    # The first output of each lane is XORWOW's (Marsaglia 2003) on the state that was read back.
    x, y, z, w, v, d = (states[:, i].astype(np.uint64) for i in range(6))
    t = x ^ (x >> 2)
    v1 = (v ^ ((v << 4) & 0xFFFFFFFF)) ^ (t ^ ((t << 1) & 0xFFFFFFFF))
    np.testing.assert_array_equal(first[:, 0], ((v1 + d + 362437) & 0xFFFFFFFF).astype(np.uint32))
    assert _op(replay.last_trace, "nisa.rand_set_state")[0].engine == "gpsimd"


def test_rand_state_rules(trn3, monkeypatch):
    @nki.jit
    def get(words, dtype, engine):
        st = nl.ndarray((4, words), dtype, buffer=nl.sbuf)
        nisa.rand_get_state(st, engine=engine)

    get(24, nl.uint32, nisa.engine.vector)  # the Vector Engine's state on NeuronCore-v4
    with pytest.raises(NKIError, match="6 uint32 words"):
        get(24, nl.uint32, nisa.engine.gpsimd)
    with pytest.raises(NKIError, match="must be uint32"):
        get(6, nl.int32, nisa.engine.gpsimd)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NKIError, match="NeuronCore-v4"):
        get(24, nl.uint32, nisa.engine.vector)


@nki.jit
def _rand2(shape, dtype, lo, hi):
    out = nl.ndarray(shape, dtype, buffer=nl.shared_hbm)
    d = nl.ndarray(shape, dtype, buffer=nl.sbuf)
    nisa.rand2(d, nl.load(lo) if not isinstance(lo, float) else lo, hi)
    nl.store(out, d)
    return out


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_rand2_is_uniform_in_its_range(trn3, dtype):
    x = _rand2((128, 256), dtype, -2.0, 3.0).astype(np.float32)
    assert x.min() >= -2.0 and x.max() <= 3.0
    assert abs(x.mean() - 0.5) < 0.02 and abs(x.var() - 25 / 12) < 0.05
    lo = np.arange(128, dtype=np.float32).reshape(128, 1)
    y = _rand2((128, 64), np.float32, lo, 200.0)
    assert (y >= lo).all() and (y < 200.0).all()
    assert _op(_rand2.last_trace, "nisa.rand2")[0].engine == "vector"


def test_rand2_rules(trn3, monkeypatch):
    with pytest.raises(NKIError, match="min must be less than max"):
        _rand2((8, 8), np.float32, 1.0, 1.0)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NKIError, match="NeuronCore-v4"):
        _rand2((8, 8), np.float32, 0.0, 1.0)


def test_set_rng_seed_rules():
    @nki.jit
    def seed(shape, dtype):
        s = nl.ndarray(shape, dtype, buffer=nl.sbuf)
        nisa.memset(s, 1)
        nisa.set_rng_seed(s)

    with pytest.raises(NKIError, match="must be \\[1, 1\\]"):
        seed((2, 1), nl.uint32)
    with pytest.raises(NKIError, match="32-bit type"):
        seed((1, 1), nl.uint16)


# ---------------------------------------------------------------------------- engine.sync, NkiInstruction
def test_engine_sync_selects_dma_descriptor_generation():
    @nki.jit
    def copy(x, engine):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, x, engine=engine)
        return out

    x = RNG.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_array_equal(copy(x, nisa.engine.sync), x)
    np.testing.assert_array_equal(copy(x, nisa.engine.scalar), x)
    with pytest.raises(NKIError, match="cannot run this instruction"):
        copy(x, nisa.engine.vector)


def test_depends_on_orders_independent_instructions_in_the_schedule():
    def kernel(x, dep):
        a = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        b = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        first = nisa.memset(a, 1.0, engine=nisa.engine.gpsimd)
        second = nisa.memset(b, 2.0, engine=nisa.engine.vector)
        assert isinstance(first, nisa.NkiInstruction)
        if dep:
            assert second.depends_on(first) is second
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, b)
        return out

    x = np.zeros((128, 2048), np.float32)
    free = nki.benchmark(nki.jit(kernel), target="trn2")(x, False)
    tied = nki.benchmark(nki.jit(kernel), target="trn2")(x, True)
    s_free, s_tied = free.schedule, tied.schedule
    assert s_free.start_us[1] == 0.0  # independent engines start together
    assert s_tied.start_us[1] == pytest.approx(s_tied.end_us[0])  # the edge makes memset b wait
    assert tied.trace[1].after == (0,)


def test_depends_on_rules():
    @nki.jit
    def backwards(x):
        a = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        first = nisa.memset(a, 1.0)
        second = nisa.memset(a, 2.0)
        first.depends_on(second)

    with pytest.raises(NKIError, match="producer must be issued before its consumer"):
        backwards(np.zeros((2, 2), np.float32))

    @nki.jit
    def not_an_instruction(x):
        a = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.memset(a, 1.0).depends_on(a)

    with pytest.raises(NKIError, match="must be an NkiInstruction"):
        not_an_instruction(np.zeros((2, 2), np.float32))


# ---------------------------------------------------------------------------- the previous reference's value forms
def test_value_forms_of_the_previous_reference():
    @nki.jit
    def older(x, src, index, ids, lo, hi):
        reduced = nl.ndarray((1,) + x.shape[1:], x.dtype, buffer=nl.shared_hbm)
        gathered = nl.ndarray((src.shape[0], 16 * index.shape[1], 2), src.dtype, buffer=nl.shared_hbm)
        bounds = nl.ndarray((1, 2, ids.shape[1]), ids.dtype, buffer=nl.shared_hbm)
        window = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(reduced, nisa.tensor_partition_reduce(np.add, nl.load(x)))
        nl.store(gathered, nisa.local_gather(nl.load(src), nl.load(index), 2))
        nl.store(bounds, nisa.sequence_bounds(segment_ids=nl.load(ids)))
        nl.store(window, nisa.range_select(on_true_tile=nl.load(x), comp_op0=nl.greater_equal, comp_op1=nl.less,
                                           bound0=nl.load(lo), bound1=nl.load(hi)))
        return reduced, gathered, bounds, window

    x = RNG.standard_normal((16, 12)).astype(np.float32)
    src = RNG.standard_normal((16, 30)).astype(np.float32)
    index = RNG.integers(0, 29, (16, 3)).astype(np.uint16)
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3]], np.int32)
    lo, hi = np.full((16, 1), 2.0, np.float32), np.full((16, 1), 5.0, np.float32)
    reduced, gathered, bounds, window = older(x, src, index, ids, lo, hi)
    np.testing.assert_allclose(reduced, x.sum(0, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(gathered.reshape(16, -1), _gather_ref(src, index, 2, 48))
    np.testing.assert_array_equal(bounds, _bounds_ref(ids[0]).astype(np.int32))
    j = np.arange(12)
    np.testing.assert_array_equal(window, np.where((j >= 2) & (j < 5), x, FP32_MIN))


def _matmul_into(psum_dtype, is_transpose, target):
    def kernel(a, ident):
        st, mv = nl.load(a), nl.load(ident)
        res = nl.ndarray((a.shape[1], ident.shape[1]), dtype=psum_dtype, buffer=nl.psum)
        nisa.nc_matmul(dst=res, stationary=st, moving=mv, is_transpose=is_transpose)
        out = nl.ndarray(res.shape, dtype=psum_dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(res.shape, dtype=psum_dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=t, src=res)
        nl.store(out, t)
        return out
    return nki.jit(kernel, platform_target=target)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_nc_matmul_transpose_mode_writes_16_bit_psum_bit_accurately(target):
    """AWS's Trainium2 guide: from NeuronCore-v3 the transpose mode writes a BF16/FP16 input's own
    dtype to PSUM and moves NaN/Inf bit-accurately (nki-library's MoE CTE transposes so at gen3)."""
    a = RNG.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    a[3, 5], a[10, 0] = np.nan, np.inf
    ident = np.eye(64, dtype=ml_dtypes.bfloat16)
    got = _matmul_into(nl.bfloat16, True, target)(a, ident)
    np.testing.assert_array_equal(got.view(np.uint16), a.T.view(np.uint16))


def test_nc_matmul_16_bit_psum_rules_per_generation():
    a = RNG.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    ident = np.eye(64, dtype=ml_dtypes.bfloat16)
    with pytest.raises(nki.NKIError, match="matmul results are float32 in PSUM"):
        _matmul_into(nl.bfloat16, False, "trn2")(a, ident)  # a plain matmul: float32 on NeuronCore-v3
    with pytest.raises(nki.NKIError, match="matmul results are float32 in PSUM"):
        _matmul_into(nl.bfloat16, True, "trn1")(a, ident)  # no transpose mode on NeuronCore-v2
    with pytest.raises(nki.NKIError, match="matmul results are float32 in PSUM"):
        _matmul_into(nl.float16, True, "trn2")(a, ident)  # transpose mode writes the input's own dtype
    b = RNG.standard_normal((64, 48)).astype(ml_dtypes.bfloat16)
    want = (a.astype(np.float32).T @ b.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(_matmul_into(nl.bfloat16, False, "trn3")(a, b), want)  # bf16 dst on v4
