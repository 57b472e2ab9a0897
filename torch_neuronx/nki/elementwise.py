"""Operator tokens (`nl.add`, `nl.exp`, ...): what an instruction computes, on float32 arrays.

A token is also callable: `nl.exp(tile)` runs the language helper bound to it by `language.py`.
"""

from __future__ import annotations

import numpy as np

from .errors import NKIError

_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def erf(x):
    """Vectorized erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7): NumPy has no erf."""
    x = np.asarray(x, dtype=np.float32)
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (1.0 / np.sqrt(x)).astype(np.float32)


def _reciprocal(x):
    with np.errstate(divide="ignore"):
        return np.float32(1.0) / x


def _gelu(x):
    return (0.5 * x * (1.0 + erf(x * np.float32(1 / np.sqrt(2.0))))).astype(np.float32)


# AWS's nki-library references compute gelu_apprx_sigmoid as x * sigmoid(1.702 x) (the "quick GELU"):
# 1.702 is the slope that makes the logistic curve fit the normal CDF.
_GELU_SIGMOID_SLOPE = np.float32(1.702)


def _gelu_sigmoid(x):
    return (x * _sigmoid(_GELU_SIGMOID_SLOPE * x)).astype(np.float32)


def _gelu_sigmoid_dx(x):
    """d/dx x*s(kx) = s(kx) + kx*s(kx)*(1 - s(kx)), s the logistic function."""
    s = _sigmoid(_GELU_SIGMOID_SLOPE * x)
    return (s + _GELU_SIGMOID_SLOPE * x * s * (1.0 - s)).astype(np.float32)


def _silu_dx(x):
    """d/dx x*s(x) = s(x) * (1 + x*(1 - s(x)))."""
    s = _sigmoid(x)
    return (s * (1.0 + x * (1.0 - s))).astype(np.float32)


def _gelu_tanh(x):
    return (0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))).astype(np.float32)


def _gelu_dx(x):
    """d/dx x*Phi(x) = Phi(x) + x*phi(x), Phi/phi the standard normal CDF/density (exact GELU)."""
    x = np.asarray(x, dtype=np.float32)
    cdf = 0.5 * (1.0 + erf(x * np.float32(1 / np.sqrt(2.0))))
    pdf = np.exp(-0.5 * x * x) * np.float32(1 / np.sqrt(2.0 * np.pi))
    return (cdf + x * pdf).astype(np.float32)


def _erf_dx(x):
    """d/dx erf(x) = 2/sqrt(pi) * exp(-x^2)."""
    x = np.asarray(x, dtype=np.float32)
    return (np.float32(2 / np.sqrt(np.pi)) * np.exp(-x * x)).astype(np.float32)


def _mish(x):
    """x * tanh(softplus(x))."""
    x = np.asarray(x, dtype=np.float32)
    return (x * np.tanh(np.logaddexp(np.float32(0), x))).astype(np.float32)


def _prelu(x, relu_param=0.0):
    """PReLU: x where x >= 0, else relu_param * x (AWS: the slope is nisa.activate2's `relu_param`,
    a number or a [P, 1] column; 0 without one, i.e. relu)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(x >= 0, x, np.asarray(relu_param, np.float32) * x).astype(np.float32)


def _tan(x):
    with np.errstate(invalid="ignore"):
        return np.tan(x)


# AWS: nl.fmod has the sign of the dividend (numpy.fmod), nl.mod that of the divisor (numpy.mod).
def _fmod(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmod(a, b, dtype=np.float32)


def _mod(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.mod(a, b, dtype=np.float32)


def _abs_pick(larger):
    """abs_max / abs_min: the signed operand of the larger (smaller) magnitude; y on a tie (AWS)."""
    def fn(a, b):
        a, b = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32))
        pick_a = np.abs(a) > np.abs(b) if larger else np.abs(a) < np.abs(b)
        return np.where(pick_a, a, b).astype(np.float32)
    return fn


def _cmp(fn):
    return lambda a, b: fn(a, b).astype(np.float32)


def _logical(fn):
    return lambda a, b: fn(a != 0, b != 0).astype(np.float32)


def _divide(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(a, b, dtype=np.float32)


def _log(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _sqrt(x):
    with np.errstate(invalid="ignore"):
        return np.sqrt(x)


def _power(a, b):
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.power(a, b, dtype=np.float32)


class Op:
    """An operator token. `arity` 1 (activation functions) or 2 (binary ALU ops)."""

    __slots__ = ("name", "fn", "arity", "reducer", "helper")

    def __init__(self, name, fn, arity, reducer=None):
        self.name = name
        self.fn = fn
        self.arity = arity
        self.reducer = reducer  # NumPy ufunc used when this op reduces along free axes
        self.helper = None

    def __call__(self, *args, **kwargs):
        if self.helper is None:
            raise NKIError(f"nl.{self.name}", "this operator token has no language helper")
        return self.helper(*args, **kwargs)

    def __repr__(self):
        return f"nl.{self.name}"


def _exp(x):
    with np.errstate(over="ignore"):
        return np.exp(x)


UNARY = {op.name: op for op in (
    Op("exp", _exp, 1), Op("log", _log, 1), Op("tanh", np.tanh, 1), Op("sigmoid", _sigmoid, 1),
    Op("relu", lambda x: np.maximum(x, np.float32(0)), 1), Op("gelu", _gelu, 1),
    Op("gelu_apprx_tanh", _gelu_tanh, 1), Op("gelu_apprx_sigmoid", _gelu_sigmoid, 1),
    Op("gelu_apprx_sigmoid_dx", _gelu_sigmoid_dx, 1), Op("silu", lambda x: x * _sigmoid(x), 1),
    Op("silu_dx", _silu_dx, 1),
    Op("sqrt", _sqrt, 1), Op("rsqrt", _rsqrt, 1), Op("reciprocal", _reciprocal, 1),
    Op("abs", np.abs, 1), Op("negative", np.negative, 1), Op("square", np.square, 1),
    Op("sin", np.sin, 1), Op("cos", np.cos, 1), Op("sign", np.sign, 1), Op("erf", erf, 1),
    Op("softplus", lambda x: np.logaddexp(np.float32(0), x), 1), Op("floor", np.floor, 1),
    Op("ceil", np.ceil, 1), Op("copy", lambda x: x, 1), Op("identity", lambda x: x, 1),
    Op("arctan", np.arctan, 1), Op("tan", _tan, 1), Op("trunc", np.trunc, 1), Op("gelu_dx", _gelu_dx, 1),
    Op("mish", _mish, 1), Op("erf_dx", _erf_dx, 1), Op("prelu", _prelu, 1),
)}

BINARY = {op.name: op for op in (
    Op("add", np.add, 2, np.add), Op("subtract", np.subtract, 2), Op("multiply", np.multiply, 2, np.multiply),
    Op("divide", _divide, 2), Op("maximum", np.maximum, 2, np.maximum),
    Op("minimum", np.minimum, 2, np.minimum), Op("power", _power, 2),
    Op("equal", _cmp(np.equal), 2), Op("not_equal", _cmp(np.not_equal), 2),
    Op("greater", _cmp(np.greater), 2), Op("greater_equal", _cmp(np.greater_equal), 2),
    Op("less", _cmp(np.less), 2), Op("less_equal", _cmp(np.less_equal), 2),
    Op("logical_and", _logical(np.logical_and), 2, np.logical_and),
    Op("logical_or", _logical(np.logical_or), 2, np.logical_or),
    Op("logical_xor", _logical(np.logical_xor), 2),
    Op("mod", _mod, 2), Op("fmod", _fmod, 2),
    Op("abs_max", _abs_pick(True), 2), Op("abs_min", _abs_pick(False), 2),
    # `nl.bypass`: the stage of a tensor_scalar / activation pipeline that passes data through.
    Op("bypass", lambda a, b: np.asarray(a, np.float32), 2),
)}

# Bit-vector operators (`nl.bitwise_and`, ...): their nl helpers compute on the integer bit patterns
# exactly (language.py). Passed as an `op` to a nisa instruction they apply to the float32 values the
# simulator computes in: exact for integers below 2**24.
def _bits(fn):
    def apply(a, b):
        return fn(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64)).astype(np.float32)
    apply.exact = fn
    return apply


BITVEC = {op.name: op for op in (
    Op("bitwise_and", _bits(np.bitwise_and), 2), Op("bitwise_or", _bits(np.bitwise_or), 2),
    Op("bitwise_xor", _bits(np.bitwise_xor), 2), Op("left_shift", _bits(np.left_shift), 2),
    Op("right_shift", _bits(np.right_shift), 2),
)}

# Ops VectorE runs at one element per cycle on all-bfloat16 operands (docs/hardware-figures.md#neuroncore-and-nki-figures).
FAST_BF16 = frozenset({"add", "subtract", "multiply"})

_UFUNC_ALIASES = {"true_divide": "divide", "max": "maximum", "min": "minimum", "amax": "maximum",
                  "amin": "minimum", "sum": "add", "prod": "multiply", "absolute": "abs",
                  "remainder": "mod"}


def resolve(op, instruction: str, arity: int | None = None) -> Op:
    """The token for `op`: an `Op`, a NumPy ufunc/function of the same name, or an `nl` reduction."""
    token = op if isinstance(op, Op) else getattr(op, "_nki_op", None)
    if token is None and callable(op):
        name = getattr(op, "__name__", "")
        name = _UFUNC_ALIASES.get(name, name)
        token = UNARY.get(name) or BINARY.get(name) or BITVEC.get(name)
    if token is None:
        raise NKIError(instruction, f"unsupported operator {op!r}", "use an nl operator such as nl.add or nl.exp")
    if arity is not None and token.arity != arity:
        kind = "binary (two operands)" if arity == 2 else "unary (an activation function)"
        raise NKIError(instruction, f"operator {token!r} is not {kind}")
    return token
