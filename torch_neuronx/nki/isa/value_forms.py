"""The older dialect's value-returning `nki.isa` calls: `res = nisa.nc_matmul(a, b)`.

AWS's `neuronxcc.nki.isa` (Neuron SDK up to 2.26) allocated each instruction's result and returned
it; the current API takes the destination first (`nisa.nc_matmul(dst, a, b)`). Every instruction
here accepts both, told apart by `is_destination_form`:

    destination form  <=>  `dst=` is given, or the arguments bind the current signature
                           with tensors for `dst` and for its tensor operands

and otherwise the call must bind the older signature (the functions below, as AWS documents
them). A value-returning call allocates its result as AWS documents (Tensor Engine results in
PSUM, float32 for matmuls; everything else in SBUF; `dtype=` or the input's dtype) and then runs
the destination form on it, so the hardware rules, the mask and the trace record are the same
code. `t[...] = nisa.x(...)` then makes the assignment target the instruction's destination
(`nl.assign`), as AWS's compiler does.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from .. import dtypes as _dt
from .. import indexing as _ix
from .. import isa as _isa
from ..access_pattern import OutOfBoundsView
from ..errors import NKIError
from ..runtime import ParDim, current
from ..v0_1 import in_nki_0_1_kernel
from ..tensor import NkiTensor, psum, sbuf

# Parameters of the destination forms that are tensors (what tells the forms apart when both bind).
_TENSOR_ROLES = frozenset({"dst", "src", "data", "data0", "data1", "data2", "stationary", "moving", "on_true_tile",
                           "src_buffer", "index", "segment_ids"})


def is_destination_form(signature: inspect.Signature, args, kwargs) -> bool:
    if "dst" in kwargs:
        return True
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return False
    return all(isinstance(value, (NkiTensor, OutOfBoundsView)) for role, value in bound.arguments.items()
               if role in _TENSOR_ROLES)


def both_forms(destination, older, instr):
    """One instruction taking the destination form (`destination`) and the value-returning one."""
    current_sig, older_sig = inspect.signature(destination), inspect.signature(older)

    @functools.wraps(destination)
    def instruction(*args, **kwargs):
        if is_destination_form(current_sig, args, kwargs):
            return destination(*args, **kwargs)
        try:
            older_sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise NKIError(instr, f"the arguments fit neither the destination form {instr}{current_sig} nor "
                           f"the value-returning form {instr}{older_sig} ({exc})",
                           "pass the destination tile first, or call the value-returning form "
                           "with its documented arguments") from None
        return older(*args, **kwargs)

    instruction.value_form = older
    return instruction


def _result(instr, shape, dtype, buffer=sbuf) -> NkiTensor:
    return current(instr).allocate(tuple(shape), dtype, buffer, None, instruction=instr)


def _operand(x, instr, role) -> NkiTensor:
    return _isa._tensor(x, instr, role)


def _free_broadcast(a: NkiTensor, b: NkiTensor):
    """NKI 0.1.0's tensor_tensor: inputs of one partition count broadcast along their free axes
    (NumPy's rule; a [P, 1] tile against a [P, F] one), as read-only views (v0_1.py). Shapes that do
    not broadcast are returned as they are, for the instruction's own shape error."""
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        return a, b
    if len(shape) != len(a.shape) or len(shape) != len(b.shape) or shape[0] != a.shape[0] or shape[0] != b.shape[0]:
        return a, b  # the partition axis never broadcasts
    return a.broadcast_to(shape), b.broadcast_to(shape)


# ---------------------------------------------------------------------------- Tensor Engine
def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), perf_mode=None, name=None):
    """stationary[K, M].T @ moving[K, N] into a new [M, N] float32 PSUM tile."""
    instr = "nisa.nc_matmul"
    st, mv = _operand(stationary, instr, "stationary"), _operand(moving, instr, "moving")
    if _isa.is_double_row(perf_mode, st, mv):  # [K, 2, M] x [K, 2, N] -> [M, N]
        dst = _result(instr, (st.shape[2], mv.shape[2]), _dt.float32, psum)
    else:
        dst = _result(instr, (st.free_size, mv.free_size), _dt.float32, psum)
    _isa.nc_matmul(dst, st, mv, is_stationary_onezero=is_stationary_onezero, is_moving_onezero=is_moving_onezero,
                   is_transpose=is_transpose, tile_position=tile_position, tile_size=tile_size, perf_mode=perf_mode)
    return dst


def nc_transpose(data, *, dtype=None, engine=None, name=None):
    """data[P, F].T into a new tile: PSUM on the Tensor Engine (the default here), SBUF on the
    Vector Engine (`engine=nisa.vector_engine`, at most 32 x 32)."""
    instr = "nisa.nc_transpose"
    data = _operand(data, instr, "data")
    eng = _isa._engine(engine, "tensor", ("tensor", "vector"), instr)
    dst = _result(instr, (data.free_size, data.partitions), dtype or data.dtype, psum if eng == "tensor" else sbuf)
    _isa.nc_transpose(dst, data.reshape(data.partitions, data.free_size), engine=eng)
    return dst


# ---------------------------------------------------------------------------- Vector / Scalar / GpSimd
def tensor_copy(src, *, dtype=None, engine=None, name=None):
    instr = "nisa.tensor_copy"
    src = _operand(src, instr, "src")
    dst = _result(instr, src.shape, dtype or src.dtype)
    _isa.tensor_copy(dst, src, engine=engine)
    return dst


def memset(shape, value, dtype, *, engine=None, name=None):
    """A new SBUF tile of `shape` filled with `value`; the first axis is the partition axis
    (AWS: memset ignores nl.par_dim)."""
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) if isinstance(s, ParDim) else s for s in shape)
    dst = _result("nisa.memset", shape, dtype)
    _isa.memset(dst, value, engine=engine)
    return dst


def tensor_tensor(data1, data2, op, *, dtype=None, engine=None, name=None):
    instr = "nisa.tensor_tensor"
    a, b = _operand(data1, instr, "data1"), _operand(data2, instr, "data2")
    if a.shape != b.shape and in_nki_0_1_kernel():
        a, b = _free_broadcast(a, b)
    dst = _result(instr, a.shape, dtype or _dt.higher_precision(a.dtype, b.dtype))
    _isa.tensor_tensor(dst, a, b, op, engine=engine)
    return dst


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, name=None):
    instr = "nisa.tensor_tensor_scan"
    a, b = _operand(data0, instr, "data0"), _operand(data1, instr, "data1")
    dst = _result(instr, a.shape, dtype or _dt.higher_precision(a.dtype, b.dtype))
    _isa.tensor_tensor_scan(dst, a, b, initial, op0, op1, reverse0=reverse0, reverse1=reverse1)
    return dst


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  engine=None, name=None):
    instr = "nisa.tensor_scalar"
    data = _operand(data, instr, "data")
    dst = _result(instr, data.shape, dtype or data.dtype)
    _isa.tensor_scalar(dst, data, op0, operand0, reverse0=reverse0, op1=op1, operand1=operand1, reverse1=reverse1,
                       engine=engine)
    return dst


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         engine=None, name=None):
    instr = "nisa.scalar_tensor_tensor"
    data, other = _operand(data, instr, "data"), _operand(operand1, instr, "operand1")
    dst = _result(instr, data.shape, dtype or _dt.higher_precision(data.dtype, other.dtype))
    _isa.scalar_tensor_tensor(dst, data, op0, operand0, op1, other, reverse0=reverse0, reverse1=reverse1,
                              engine=engine)
    return dst


def tensor_reduce(op, data, axis, *, dtype=None, negate=False, keepdims=False, name=None):
    instr = "nisa.tensor_reduce"
    data = _operand(data, instr, "data")
    axes = _isa._reduce_axes(instr, data, axis)
    dst = _result(instr, _isa.reduced_shape(data, axes, keepdims), dtype or data.dtype)
    _isa.tensor_reduce(dst, op, data, axes, negate=negate, keepdims=keepdims)
    return dst


def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=None, dtype=None,
               name=None):
    instr = "nisa.activation"
    data = _operand(data, instr, "data")
    dst = _result(instr, data.shape, dtype or data.dtype)
    _isa.activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                    reduce_cmd=reduce_cmd)
    return dst


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, dtype=None, name=None):
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=_isa.reduce_cmd.reset_reduce, dtype=dtype)


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res, reverse0=False, reduce_cmd=None,
                         reduce_init=None, reduce_res_negate=False, dtype=None, name=None):
    """data <op0> operand0 into a new SBUF tile (`dtype` or data's), its free-axis reduction into
    reduce_res (AWS's older signature is keyword-only)."""
    instr = "nisa.tensor_scalar_reduce"
    data = _operand(data, instr, "data")
    dst = _result(instr, data.shape, dtype or data.dtype)
    _isa.tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0=reverse0,
                              reduce_cmd=reduce_cmd, reduce_init=reduce_init, reduce_res_negate=reduce_res_negate)
    return dst


def reciprocal(data, *, dtype=None, name=None):
    data = _operand(data, "nisa.reciprocal", "data")
    dst = _result("nisa.reciprocal", data.shape, dtype or data.dtype)
    _isa.reciprocal(dst, data)
    return dst


def dropout(data, prob, *, dtype=None, name=None):
    data = _operand(data, "nisa.dropout", "data")
    dst = _result("nisa.dropout", data.shape, dtype or data.dtype)
    _isa.dropout(dst, data, prob)
    return dst


def iota(expr, dtype, *, name=None):
    """The values of an affine index expression (`nl.arange(8)[:, None] * 4 + nl.arange(4)[None, :]`)
    in a new SBUF tile of the expression's shape: the destination form's [step, num] pattern,
    offset and channel multiplier are read off the expression."""
    instr = "nisa.iota"
    if not isinstance(expr, _ix.IndexExpr):
        raise NKIError(instr, f"expr must be an affine expression of nl.arange / nl.mgrid indices, got {expr!r}",
                       "e.g. nisa.iota(nl.arange(128)[:, None] + nl.arange(64)[None, :], dtype=nl.int32)")
    shape = expr.shape if len(expr.shape) > 1 else (1,) + expr.shape
    coef = expr.coef if len(expr.shape) > 1 else (0,) + expr.coef
    dst = _result(instr, shape, dtype)
    _isa.iota(dst, [[c, n] for c, n in zip(coef[1:], shape[1:])], offset=expr.const, channel_multiplier=coef[0])
    return dst


def affine_select(pred, on_true_tile, on_false_value, *, dtype=None, name=None):
    """on_true_tile where `pred` (a comparison of index expressions, e.g. `i_q - i_k >= 0`) holds,
    else on_false_value, in a new SBUF tile."""
    instr = "nisa.affine_select"
    src = _operand(on_true_tile, instr, "on_true_tile")
    if not isinstance(pred, _ix.Mask):
        raise NKIError(instr, f"pred must be a comparison of nl.arange / nl.mgrid indices, got {pred!r}",
                       "e.g. pred=(i_q - i_k >= 0)")
    dst = _result(instr, src.shape, dtype or src.dtype)
    _isa.select_where(dst, src, on_false_value, lambda d: _predicate(pred, d.shape, instr))
    return dst


def _predicate(pred, shape, instr):
    try:
        return np.broadcast_to(pred.array, shape)
    except ValueError:
        raise NKIError(instr, f"pred spans {pred.array.shape}, on_true_tile is {tuple(shape)}",
                       "build pred from the indices that index on_true_tile") from None


# ---------------------------------------------------------------------------- statistics
def bn_stats(data, *, dtype=None, name=None):
    data = _operand(data, "nisa.bn_stats", "data")
    dst = _result("nisa.bn_stats", (data.partitions, _isa.BN_STATS_DIM), dtype or data.dtype)
    _isa.bn_stats(dst, data)
    return dst


def bn_aggr(data, *, dtype=None, name=None):
    data = _operand(data, "nisa.bn_aggr", "data")
    dst = _result("nisa.bn_aggr", (data.partitions, _isa.BN_AGGR_DIM), dtype or data.dtype)
    _isa.bn_aggr(dst, data)
    return dst


OLDER = {fn.__name__: fn for fn in (
    nc_matmul, nc_transpose, tensor_copy, memset, tensor_tensor, tensor_tensor_scan, tensor_scalar,
    tensor_scalar_reduce, scalar_tensor_tensor, tensor_reduce, activation, activation_reduce, reciprocal, dropout,
    iota, affine_select, bn_stats, bn_aggr)}
