"""`nisa.tensor_scalar_reduce` and the engines' accumulation registers (`nisa.reduce_cmd`).

AWS's semantics (NKI ISA reference): tensor_scalar_reduce computes `dst = data <op0> operand0` on
the Vector Engine and reduces dst along its free axes into `reduce_res` ([P, 1]); `reduce_cmd`
drives an engine's accumulation registers (one float32 per partition lane) that persist across
instructions: reset / reset_reduce / reduce / load_reduce / idle. activation's registers are the
Scalar Engine's, tensor_scalar_reduce's the Vector Engine's. The simulator keeps them per program
of a launch, starting unknown: accumulating onto or reading unknown registers is an NKIError.

References are NumPy in float32 / float64: sums and products to rtol 1e-5 (float32 accumulation
order differs), max/min exactly, bfloat16 destinations to the bfloat16 rounding of the reference
(rtol 1e-2); traces compared field by field.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
from torch_neuronx.nki.cost import instruction_cycles
from torch_neuronx.nki.targets import get_target
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(27)
X = RNG.standard_normal((128, 96), dtype=np.float32)
COL = RNG.uniform(0.5, 2.0, (128, 1)).astype(np.float32)

REDUCERS = {"add": (nl.add, np.sum), "multiply": (nl.multiply, np.prod),
            "maximum": (nl.maximum, np.max), "minimum": (nl.minimum, np.min)}


def _tol(name):
    return dict(rtol=1e-5, atol=1e-5) if name in ("add", "multiply") else dict(rtol=0, atol=0)


# ---------------------------------------------------------------------------- tensor_scalar_reduce
@nki.jit
def _tsr(x, col, op0, reduce_op, dtype, reverse0):
    """Destination form: dst = x <op0> col, reduce_res = reduce_op over dst's free axes."""
    t, c = nl.load(x), nl.load(col)
    dst = nl.ndarray(x.shape, dtype, buffer=nl.sbuf)
    res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst, t, op0, c, reduce_op, res, reverse0=reverse0)
    out = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, dst)
    nl.store(red, res)
    return out, red


@pytest.mark.parametrize("reduce_name", sorted(REDUCERS))
def test_tensor_scalar_reduce_matches_numpy(reduce_name):
    op, ref = REDUCERS[reduce_name]
    x = RNG.uniform(0.9, 1.1, (128, 96)).astype(np.float32) if reduce_name == "multiply" else X
    out, red = _tsr(x, COL, nl.multiply, op, nl.float32, False)
    expected = x * COL
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(red[:, 0], ref(expected, axis=1), **_tol(reduce_name))


def test_tensor_scalar_reduce_reverse0_and_scalar_operand():
    out, red = _tsr(X, COL, nl.subtract, nl.minimum, nl.float32, True)      # col - x
    np.testing.assert_allclose(out, COL - X, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(red[:, 0], (COL - X).min(axis=1))

    @nki.jit
    def scalar_operand(x):
        t = nl.load(x)
        dst = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=dst, data=t, op0=nl.add, operand0=2.5, reduce_op=nl.add, reduce_res=res)
        red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(red, res)
        return red

    x = X[:64, :40]
    np.testing.assert_allclose(scalar_operand(x)[:, 0], (x + 2.5).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_tensor_scalar_reduce_bfloat16_dst_reduces_the_written_values():
    out, red = _tsr(X, COL, nl.multiply, nl.add, nl.bfloat16, False)
    written = (X * COL).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, written)
    # AWS: reduce_res = reduce_op(dst): the sum of the bfloat16 values, accumulated in float32.
    np.testing.assert_allclose(red[:, 0], written.astype(np.float32).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_tensor_scalar_reduce_reduces_all_free_axes_of_a_3d_tile():
    x3 = RNG.standard_normal((64, 3, 40), dtype=np.float32)

    @nki.jit
    def kernel(x):
        t = nl.load(x)
        dst = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst, t, nl.maximum, 0.0, nl.maximum, res)      # relu, row max
        red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(red, res)
        return red

    np.testing.assert_array_equal(kernel(x3)[:, 0], np.maximum(x3, 0).max(axis=(1, 2)))


def test_tensor_scalar_reduce_reads_psum_and_writes_psum():
    @nki.jit
    def kernel(a, b):
        sa, sb = nl.load(a), nl.load(b)
        ps = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, sa, sb)
        dst = nl.ndarray(ps.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((ps.shape[0], 1), nl.float32, buffer=nl.psum)
        nisa.tensor_scalar_reduce(dst, ps, nl.multiply, 0.125, nl.maximum, res)
        res_sb = nl.ndarray(res.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(res_sb, res)
        out = nl.ndarray(res.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res_sb)
        return out

    a = RNG.standard_normal((64, 128), dtype=np.float32)
    b = RNG.standard_normal((64, 256), dtype=np.float32)
    np.testing.assert_allclose(kernel(a, b)[:, 0], ((a.T @ b) * 0.125).max(axis=1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- value-returning form
@nki.jit
def _older_form(x, col):
    t, c = nl.load(x), nl.load(col)
    res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    buf = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
    buf[...] = nisa.tensor_scalar_reduce(data=t, op0=np.multiply, operand0=c, reduce_op=np.max, reduce_res=res,
                                         dtype=nl.bfloat16)
    out = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.shared_hbm)
    red = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, buf)
    nl.store(red, res)
    return out, red


def _trace(kernel):
    return [(i.op, i.engine, i.shapes, i.dtypes, i.buffers, i.cost) for i in kernel.last_trace]


def test_value_form_computes_and_traces_like_the_destination_form():
    out_v, red_v = _older_form(X, COL)
    trace_v = _trace(_older_form)
    out_d, red_d = _tsr(X, COL, nl.multiply, nl.maximum, nl.bfloat16, False)
    trace_d = _trace(_tsr)
    np.testing.assert_array_equal(out_v, out_d)
    np.testing.assert_array_equal(red_v, red_d)
    np.testing.assert_array_equal(red_v[:, 0], (X * COL).astype(ml_dtypes.bfloat16).astype(np.float32).max(axis=1))
    # The assignment made buf the instruction's destination: no extra copy, the same instructions.
    assert trace_v == trace_d
    assert [t[0] for t in trace_v].count("nisa.tensor_scalar_reduce") == 1


def test_value_form_allocates_sbuf_in_the_inputs_dtype():
    seen = {}

    @nki.jit
    def kernel(x):
        t = nl.load(x)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        r = nisa.tensor_scalar_reduce(data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add, reduce_res=res)
        seen["r"] = (r.buffer, r.dtype, r.shape)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    np.testing.assert_allclose(kernel(X[:, :32]), X[:, :32] + 1.0, rtol=1e-6)
    assert seen["r"] == (nl.sbuf, nl.float32, (128, 32))


# ---------------------------------------------------------------------------- Vector Engine registers
@nki.jit
def _vector_accumulate(x, init, mode):
    """Reduce the row max of x's four column blocks through the Vector Engine's registers."""
    t, i0 = nl.load(x), nl.load(init)
    n = x.shape[1] // 4
    dst = nl.ndarray((x.shape[0], n), nl.float32, buffer=nl.sbuf)
    res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
    for j in range(4):
        block = t[:, j * n:(j + 1) * n]
        last = j == 3
        if j == 0:
            first = (dict(reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=i0) if mode == "load"
                     else dict(reduce_cmd=nisa.reduce_cmd.reset_reduce))
            nisa.tensor_scalar_reduce(dst, block, nl.multiply, 1.0, nl.maximum, None, **first)
        else:
            nisa.tensor_scalar_reduce(dst, block, nl.multiply, 1.0, nl.maximum, res if last else None,
                                      reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=(mode == "negate"))
    out = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, res)
    return out


def test_vector_registers_accumulate_across_instructions():
    init = np.full((128, 1), 0.5, np.float32)
    np.testing.assert_array_equal(_vector_accumulate(X, init, "reset")[:, 0], X.max(axis=1))
    np.testing.assert_array_equal(_vector_accumulate(X, init, "negate")[:, 0], -X.max(axis=1))
    # load_reduce starts from reduce_init (a [P, 1] tile): max(0.5, row max).
    np.testing.assert_array_equal(_vector_accumulate(X, init, "load")[:, 0], np.maximum(0.5, X.max(axis=1)))


def test_vector_registers_sum_with_a_scalar_reduce_init_and_reset():
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        dst = nl.ndarray((x.shape[0], 32), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 3), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst, t[:, 0:32], nl.add, 0.0, nl.add, None,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=10.0)
        nisa.tensor_scalar_reduce(dst, t[:, 32:64], nl.add, 0.0, nl.add, res[:, 0:1], reduce_cmd=nisa.reduce_cmd.reduce)
        # reset: the registers go back to the identity (0 for add); reduce_res reads them.
        nisa.tensor_scalar_reduce(dst, t[:, 0:32], nl.add, 0.0, nl.add, res[:, 1:2], reduce_cmd=nisa.reduce_cmd.reset)
        nisa.tensor_scalar_reduce(dst, t[:, 64:96], nl.add, 0.0, nl.add, res[:, 2:3], reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((x.shape[0], 3), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    out = kernel(X)
    np.testing.assert_allclose(out[:, 0], 10.0 + X[:, :64].sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(out[:, 1], 0.0)
    np.testing.assert_allclose(out[:, 2], X[:, 64:96].sum(axis=1), rtol=1e-5, atol=1e-4)


def test_idle_reduces_into_reduce_res_and_leaves_the_registers_unknown():
    @nki.jit
    def kernel(x, then_reduce):
        t = nl.load(x)
        dst = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst, t, nl.add, 0.0, nl.add, None, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.tensor_scalar_reduce(dst, t, nl.multiply, 2.0, nl.add, res, reduce_cmd=nisa.reduce_cmd.idle)
        if then_reduce:  # AWS: an idle instruction may modify the registers; reset_reduce after it
            nisa.tensor_scalar_reduce(dst, t, nl.add, 0.0, nl.add, res, reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    np.testing.assert_allclose(kernel(X, False)[:, 0], (2 * X).sum(axis=1), rtol=1e-5, atol=1e-4)
    with pytest.raises(nki.NKIError, match=r"reduce_cmd=reduce accumulates onto the Vector Engine's accumulation "
                                           r"registers.*unknown.*reset_reduce"):
        kernel(X, True)


# ---------------------------------------------------------------------------- Scalar Engine registers
@nki.jit
def _exp_row_sums(x, neg_max, pattern):
    """exp(x - max) per 128-column block; the row sums through the Scalar Engine's registers."""
    t, b = nl.load(x), nl.load(neg_max)
    nblk = x.shape[1] // 128
    e = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    sums = nl.ndarray((x.shape[0], nblk), nl.float32, buffer=nl.sbuf)
    for j in range(nblk):
        cols = slice(j * 128, (j + 1) * 128)
        if pattern == "per_block":     # attention v6/v7: one sum per block
            nisa.activation(e[:, cols], nl.exp, t[:, cols], bias=b, reduce_op=nl.add, reduce_res=sums[:, j:j + 1],
                            reduce_cmd=nisa.reduce_cmd.reset_reduce)
        else:                          # running: reset once, accumulate, read out after each block
            cmd = nisa.reduce_cmd.reset_reduce if j == 0 else nisa.reduce_cmd.reduce
            nisa.activation(e[:, cols], nl.exp, t[:, cols], bias=b, reduce_op=nl.add, reduce_res=sums[:, j:j + 1],
                            reduce_cmd=cmd)
    out = nl.ndarray((x.shape[0], nblk), nl.float32, buffer=nl.shared_hbm)
    nl.store(out, sums)
    return out


@pytest.mark.parametrize("shape", [(128, 384), (48, 256)])
def test_activation_reset_reduce_and_reduce(shape):
    x = RNG.standard_normal(shape, dtype=np.float32)
    neg_max = -x.max(axis=1, keepdims=True)
    blocks = np.exp(x + neg_max).reshape(shape[0], -1, 128).sum(axis=2)
    np.testing.assert_allclose(_exp_row_sums(x, neg_max, "per_block"), blocks, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_exp_row_sums(x, neg_max, "running"), np.cumsum(blocks, axis=1), rtol=1e-5,
                               atol=1e-5)


def test_activation_reset_idle_reads_and_activation_reduce():
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 4), nl.float32, buffer=nl.sbuf)
        nisa.activation(y, nl.square, t, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)  # no read-out
        nisa.activation(y, nl.exp, t, reduce_res=res[:, 0:1])          # idle (default): reads, does not add
        nisa.activation(y, nl.copy, t, reduce_res=res[:, 1:2], reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.activation(y, nl.copy, t, reduce_res=res[:, 2:3], reduce_cmd=nisa.reduce_cmd.reset)
        nisa.activation_reduce(y, nl.abs, t, nl.add, res[:, 3:4])    # = activation with reset_reduce
        out = nl.ndarray((x.shape[0], 4), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    out = kernel(X)
    squares = (X.astype(np.float64) ** 2).sum(axis=1)
    np.testing.assert_allclose(out[:, 0], squares, rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], squares + X.sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(out[:, 2], 0.0)
    np.testing.assert_allclose(out[:, 3], np.abs(X).sum(axis=1), rtol=1e-5)


def test_activation_max_register_resets_to_the_identity():
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(y, nl.negative, t, reduce_op=nl.maximum, reduce_res=res,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        out = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    x = np.abs(X) + 0.1  # -x < 0 everywhere: a reset to 0 would give 0
    np.testing.assert_array_equal(kernel(x)[:, 0], (-x).max(axis=1))


def test_registers_follow_partitions_and_engines():
    """Registers are per partition lane: a reset of partitions 0..63 leaves 64..127 unknown; and per
    engine: the Scalar Engine's reset does not set the Vector Engine's."""
    @nki.jit
    def kernel(x, case):
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(y[0:64], nl.copy, t[0:64], reduce_cmd=nisa.reduce_cmd.reset_reduce)
        if case == "lanes_ok":
            nisa.activation(y[0:64], nl.copy, t[0:64], reduce_res=res[0:64], reduce_cmd=nisa.reduce_cmd.reduce)
        elif case == "lanes_unknown":
            nisa.activation(y[64:128], nl.copy, t[64:128], reduce_res=res[64:128], reduce_cmd=nisa.reduce_cmd.reduce)
        else:
            nisa.tensor_scalar_reduce(y[0:64], t[0:64], nl.add, 0.0, nl.add, res[0:64],
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((64, 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res[0:64])
        return out

    np.testing.assert_allclose(kernel(X, "lanes_ok")[:, 0], 2 * X[:64].sum(axis=1), rtol=1e-5, atol=1e-4)
    with pytest.raises(nki.NKIError, match=r"Scalar Engine's accumulation registers of partitions 64\.\.127"):
        kernel(X, "lanes_unknown")
    with pytest.raises(nki.NKIError, match="Vector Engine's accumulation registers"):
        kernel(X, "engine")


def test_register_state_does_not_leak_between_launches_or_programs():
    @nki.jit
    def kernel(x, first):
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        cmd = nisa.reduce_cmd.reset_reduce if (first and nl.program_id(0) == 0) else nisa.reduce_cmd.reduce
        nisa.activation(y, nl.copy, t, reduce_res=res, reduce_cmd=cmd)
        out = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    np.testing.assert_allclose(kernel(X, True)[:, 0], X.sum(axis=1), rtol=1e-5, atol=1e-4)
    with pytest.raises(nki.NKIError, match="unknown"):     # a new launch: the last one's sums are gone
        kernel(X, False)
    with pytest.raises(nki.NKIError, match="unknown"):     # program 1 of the grid starts unknown too
        kernel[2](X, True)


def test_reading_registers_no_instruction_set_is_an_error():
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(y, nl.exp, t, reduce_op=nl.add, reduce_res=res)   # idle: a read-out only
        return None

    with pytest.raises(nki.NKIError, match=r"reduce_res reads the Scalar Engine's accumulation registers.*"
                                           r"reduce_cmd=nisa.reduce_cmd.reset_reduce") as err:
        kernel(X)
    assert "test_nki_reduce.py" in str(err.value)  # the kernel line that issued it


# ---------------------------------------------------------------------------- masks, trace, cost
def test_mask_excludes_elements_from_dst_and_reduction():
    @nki.jit
    def kernel(x, n):
        i_p, i_f = nl.mgrid[0:128, 0:96]
        t = nl.load(x)
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        dst = nl.full((128, 96), -7.0, nl.float32, buffer=nl.sbuf)
        dst[i_p, i_f] = nisa.tensor_scalar_reduce(data=t[i_p, i_f], op0=nl.multiply, operand0=2.0, reduce_op=nl.add,
                                                  reduce_res=res, mask=(i_f < n))
        out = nl.ndarray((128, 96), nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, dst)
        nl.store(red, res)
        return out, red

    out, red = kernel(X, 40)
    np.testing.assert_allclose(out[:, :40], 2 * X[:, :40], rtol=1e-6)
    np.testing.assert_array_equal(out[:, 40:], -7.0)
    np.testing.assert_allclose(red[:, 0], 2 * X[:, :40].sum(axis=1), rtol=1e-5, atol=1e-4)


def test_trace_record_and_cost():
    _tsr(X, COL, nl.multiply, nl.add, nl.float32, False)
    ins = [i for i in _tsr.last_trace if i.op == "nisa.tensor_scalar_reduce"]
    assert len(ins) == 1
    (rec,) = ins
    assert rec.engine == "vector"
    assert rec.shapes == ((128, 96), (128, 1), (128, 96), (128, 1))       # dst, reduce_res, data, operand0
    assert rec.buffers == ("sbuf",) * 4
    # AWS: max(MIN_II, N) + MIN_II Vector Engine cycles.
    assert instruction_cycles(rec.cost, get_target("trn2")) == max(64, 96) + 64
    small = nki.benchmark(_tsr, target="trn2")(X[:, :16], COL, nl.multiply, nl.add, nl.float32, False)
    rec = next(i for i in small.trace if i.op == "nisa.tensor_scalar_reduce")
    assert instruction_cycles(rec.cost, get_target("trn2")) == 64 + 64
    assert small.engines["vector"] > 0


# ---------------------------------------------------------------------------- hardware-rule errors
def _run_tsr(**kw):
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        args = dict(dst=nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf), data=t, op0=nl.add, operand0=1.0,
                    reduce_op=nl.add, reduce_res=nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf))
        for key, make in kw.items():  # a lambda builds a tile argument inside the kernel
            args[key] = make(x, t) if getattr(make, "__name__", "") == "<lambda>" else make
        nisa.tensor_scalar_reduce(**args)
        return None

    kernel(X[:, :32])


@pytest.mark.parametrize("kwargs, message", [
    (dict(reduce_res=lambda x, t: nl.ndarray((128, 2), nl.float32, buffer=nl.sbuf)),
     r"reduce_res shape \(128, 2\) must be \[128, 1\]"),
    (dict(reduce_op=lambda x, t: nl.subtract), r"reduce_op nl.subtract cannot reduce into the accumulation registers.*nl.add"),
    (dict(reduce_cmd=nisa.reduce_cmd.load_reduce), r"reduce_init is the value reduce_cmd=load_reduce loads"),
    (dict(reduce_init=1.0), r"reduce_init=1.0 with reduce_cmd=reset_reduce"),
    (dict(reduce_cmd=nisa.reduce_cmd.idle, reduce_res=None), r"reduce_cmd=idle keeps no reduction"),
    (dict(reduce_cmd="sometimes"), r"reduce_cmd 'sometimes' is not a nisa.reduce_cmd member"),
    (dict(dst=lambda x, t: nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)),
     r"dst is in nl.shared_hbm, but the Vector Engine cannot write"),
    (dict(data=lambda x, t: x), r"data is in nl.shared_hbm, but the Vector Engine cannot read"),
    (dict(dst=lambda x, t: nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)), r"dst shape \(128, 16\) does not match"),
    (dict(operand0=lambda x, t: t), r"operand0 of shape \(128, 32\) must be a scalar or a \[128, 1\]"),
    (dict(data=lambda x, t: nl.ndarray((128, 2, 2, 2, 4), nl.float32, buffer=nl.sbuf),
          dst=lambda x, t: nl.ndarray((128, 2, 2, 2, 4), nl.float32, buffer=nl.sbuf)),
     r"more than three free dimensions"),
])
def test_tensor_scalar_reduce_errors(kwargs, message):
    with pytest.raises(nki.NKIError, match=message):
        _run_tsr(**kwargs)


def test_activation_register_errors():
    @nki.jit
    def kernel(x, kw):
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        nisa.activation(y, nl.exp, t, **kw)
        return None

    with pytest.raises(nki.NKIError, match=r"reduce_cmd=load_reduce is not supported by this instruction"):
        kernel(X, dict(reduce_cmd=nisa.reduce_cmd.load_reduce))
    with pytest.raises(nki.NKIError, match=r"reduce_op nl.multiply cannot reduce into the accumulation registers"):
        kernel(X, dict(reduce_op=nl.multiply, reduce_cmd=nisa.reduce_cmd.reset_reduce))
    with pytest.raises(nki.NKIError, match=r"reduce_cmd=reduce accumulates onto the Scalar Engine's"):
        kernel(X, dict(reduce_cmd=nisa.reduce_cmd.reduce))


def test_reduce_cmd_enum_is_aws_names():
    assert [m.name for m in nisa.reduce_cmd] == ["idle", "reset", "reduce", "reset_reduce", "load_reduce"]
    assert nisa.constants.reduce_cmd is nisa.reduce_cmd
    import nki.isa as aws_isa  # the import alias AWS's kernels use

    assert aws_isa.reduce_cmd.reset_reduce is nisa.reduce_cmd.reset_reduce


# ---------------------------------------------------------------------------- scalar_tensor_tensor
def test_scalar_tensor_tensor_reduces_through_the_vector_registers():
    y = RNG.standard_normal((128, 96), dtype=np.float32)

    @nki.jit
    def kernel(x, y, col):
        t, u, c = nl.load(x), nl.load(y), nl.load(col)
        dst = nl.ndarray((x.shape[0], 48), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 2), nl.float32, buffer=nl.sbuf)
        # (x * col) + y per half; the sum of the first half alone, then of both halves.
        nisa.scalar_tensor_tensor(dst, t[:, 0:48], nl.multiply, c, nl.add, u[:, 0:48], reduce_op=nl.add,
                                  reduce_res=res[:, 0:1])
        nisa.scalar_tensor_tensor(dst, t[:, 48:96], nl.multiply, c, nl.add, u[:, 48:96], reduce_op=nl.add,
                                  reduce_res=res[:, 1:2], reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((x.shape[0], 48), nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((x.shape[0], 2), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, dst)
        nl.store(red, res)
        return out, red

    out, red = kernel(X, y, COL)
    full = X * COL + y
    np.testing.assert_allclose(out, full[:, 48:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(red[:, 0], full[:, :48].sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(red[:, 1], full.sum(axis=1), rtol=1e-5, atol=1e-4)
    (rec,) = [i for i in kernel.last_trace if i.op == "nisa.scalar_tensor_tensor"][:1]
    assert rec.shapes[1] == (128, 1)  # reduce_res is a traced write

    @nki.jit
    def on_gpsimd(x, y):
        t, u = nl.load(x), nl.load(y)
        dst = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst, t, nl.multiply, 2.0, nl.add, u, engine=nisa.gpsimd_engine, reduce_res=res)
        return None

    with pytest.raises(nki.NKIError, match="runs on the Vector Engine's accumulation registers, not on the GpSimd"):
        on_gpsimd(X, y)


# ---------------------------------------------------------------------------- tensor_scalar_cumulative
@nki.jit
def _cumulative(x, op0, imm0, op1, dtype, first):
    """Two column halves: the first with `first` (reset_reduce or load_reduce from a [P, 1] tile),
    the second continuing with reduce, so the running value crosses the instruction boundary."""
    t = nl.load(x)
    n = x.shape[1] // 2
    dst = nl.ndarray(x.shape, dtype, buffer=nl.sbuf)
    kw = dict(reduce_cmd=nisa.reduce_cmd.reset_reduce)
    if first is not None:
        kw = dict(reduce_cmd=nisa.reduce_cmd.load_reduce, imm1=nl.load(first))
    nisa.tensor_scalar_cumulative(dst[:, 0:n], t[:, 0:n], op0, op1, imm0, **kw)
    nisa.tensor_scalar_cumulative(dst[:, n:], t[:, n:], op0, op1, imm0, reduce_cmd=nisa.reduce_cmd.reduce)
    out = nl.ndarray(x.shape, dtype, buffer=nl.shared_hbm)
    nl.store(out, dst)
    return out


@pytest.mark.parametrize("shape", [(128, 64), (32, 10)])
def test_tensor_scalar_cumulative_sum_and_max_match_numpy(shape):
    x = RNG.standard_normal(shape, dtype=np.float32)
    np.testing.assert_allclose(_cumulative(x, nl.multiply, 2.0, nl.add, nl.float32, None), np.cumsum(2 * x, axis=1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(_cumulative(x, nl.add, 1.0, nl.maximum, nl.float32, None),
                                  np.maximum.accumulate(x + 1, axis=1))
    start = np.full((shape[0], 1), 3.0, np.float32)
    np.testing.assert_allclose(_cumulative(x, nl.add, 0.0, nl.add, nl.float32, start),
                               3.0 + np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)
    got = _cumulative(x, nl.add, 0.0, nl.add, nl.bfloat16, None)
    np.testing.assert_allclose(got.astype(np.float32), np.cumsum(x, axis=1), rtol=1e-2, atol=2e-2)


def test_tensor_scalar_cumulative_subtract_follows_aws_operand_order():
    # AWS: reg = op1(op0(src[i], imm0), reg), so subtract gives src[i] - reg (an alternating sum).
    x = RNG.standard_normal((16, 6), dtype=np.float32)
    got = _cumulative(x, nl.multiply, 1.0, nl.subtract, nl.float32, None)
    ref = np.zeros_like(x)
    reg = np.zeros(16, np.float32)
    for i in range(6):
        reg = x[:, i] - reg
        ref[:, i] = reg
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_tensor_scalar_cumulative_shares_the_vector_registers():
    @nki.jit
    def kernel(x):
        t = nl.load(x)
        dst = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst, t, nl.add, nl.add, 0.0)                  # leaves the row sum in reg
        nisa.tensor_scalar_reduce(dst, t, nl.multiply, 1.0, nl.add, res, reduce_cmd=nisa.reduce_cmd.reduce)
        out = nl.ndarray((x.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    np.testing.assert_allclose(kernel(X)[:, 0], 2 * X.sum(axis=1), rtol=1e-5, atol=1e-4)


def test_tensor_scalar_cumulative_errors():
    @nki.jit
    def kernel(x, case):
        t = nl.load(x)
        dst = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        if case == "reduce_first":
            nisa.tensor_scalar_cumulative(dst, t, nl.add, nl.add, 0.0, reduce_cmd=nisa.reduce_cmd.reduce)
        elif case == "int32":
            i = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
            nisa.tensor_scalar_cumulative(i, t, nl.add, nl.add, 0.0)
        elif case == "imm1":
            nisa.tensor_scalar_cumulative(dst, t, nl.add, nl.add, 0.0, imm1=1.0)
        elif case == "op1":
            nisa.tensor_scalar_cumulative(dst, t, nl.add, nl.divide, 0.0)
        return None

    for case, message in [("reduce_first", r"reduce_cmd=reduce continues the Vector Engine's accumulation"),
                          ("int32", r"dst dtype int32 is not supported"),
                          ("imm1", r"imm1=1.0 with reduce_cmd=reset_reduce"),
                          ("op1", r"op1 nl.divide cannot accumulate")]:
        with pytest.raises(nki.NKIError, match=message):
            kernel(X[:, :8], case)
