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


def _mod(fn):
    def mod(x, y):
        with np.errstate(divide="ignore", invalid="ignore"):
            return fn(x, y)
    return mod


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
    # AWS: nl.mod "has the same sign as the divisor" (numpy.mod), nl.fmod "the same sign as the dividend"
    Op("mod", _mod(np.mod), 2), Op("fmod", _mod(np.fmod), 2),
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
        token = UNARY.get(name) or BINARY.get(name)
    if token is None:
        raise NKIError(instruction, f"unsupported operator {op!r}", "use an nl operator such as nl.add or nl.exp")
    if arity is not None and token.arity != arity:
        kind = "binary (two operands)" if arity == 2 else "unary (an activation function)"
        raise NKIError(instruction, f"operator {token!r} is not {kind}")
    return token
