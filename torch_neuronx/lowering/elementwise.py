"""Lowerings of elementwise ops (see torch_neuronx/lowering/__init__.py): arithmetic,
comparisons and logic, unary math and special functions, integer math, complex
numbers, and the activations with their backward ops.

PyTorch's type promotion decides the computation and result dtypes (common.promote).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering
from torch_neuronx.lowering.common import KIND, acc_dtype, cast, is_array, is_float, promote

aten = torch.ops.aten


# ------------------------------------------------------------------ elementwise
def _unary(fn, kind=KIND.DEFAULT, int_identity=False):
    def lower(x):
        computation, result = promote(x, kind=kind)
        if int_identity and not is_float(x.dtype):
            return x
        return fn(cast(x, computation)).astype(result)

    return lower


_FLOATING = KIND.INT_TO_FLOAT
for _op, _fn in [
    (aten.exp, jnp.exp), (aten.exp2, jnp.exp2), (aten.expm1, jnp.expm1), (aten.log, jnp.log),
    (aten.log2, jnp.log2), (aten.log10, jnp.log10), (aten.log1p, jnp.log1p), (aten.sqrt, jnp.sqrt),
    (aten.rsqrt, jax.lax.rsqrt), (aten.sin, jnp.sin), (aten.cos, jnp.cos), (aten.tan, jnp.tan),
    (aten.asin, jnp.arcsin), (aten.acos, jnp.arccos), (aten.atan, jnp.arctan), (aten.sinh, jnp.sinh),
    (aten.cosh, jnp.cosh), (aten.tanh, jnp.tanh), (aten.asinh, jnp.arcsinh), (aten.acosh, jnp.arccosh),
    (aten.atanh, jnp.arctanh), (aten.sigmoid, jax.nn.sigmoid), (aten.erf, jax.scipy.special.erf),
    (aten.erfc, jax.scipy.special.erfc), (aten.erfinv, jax.scipy.special.erfinv),
    (aten.reciprocal, jnp.reciprocal), (aten.lgamma, jax.scipy.special.gammaln),
    (aten.i0, jax.scipy.special.i0), (aten.sinc, jnp.sinc),
    (aten.deg2rad, jnp.deg2rad), (aten.rad2deg, jnp.rad2deg),
]:
    lowering(_op)(_unary(_fn, _FLOATING))

for _op, _fn in [(aten.floor, jnp.floor), (aten.ceil, jnp.ceil), (aten.trunc, jnp.trunc),
                 (aten.frac, lambda x: x - jnp.trunc(x))]:
    lowering(_op)(_unary(_fn, int_identity=True))

for _op, _fn in [(aten.isnan, jnp.isnan), (aten.isinf, jnp.isinf),
                 (aten.isposinf, jnp.isposinf), (aten.isneginf, jnp.isneginf),
                 (aten.signbit, jnp.signbit)]:
    lowering(_op)(_unary(_fn, KIND.ALWAYS_BOOL))

lowering(aten.neg, aten._neg_view, aten._neg_view_copy)(_unary(jnp.negative))  # a negative view has -x's value
lowering(aten.abs)(_unary(jnp.abs, KIND.COMPLEX_TO_FLOAT))


@lowering(aten.digamma)
def digamma(x):
    computation, result = promote(x, kind=KIND.INT_TO_FLOAT)
    v = cast(x, computation)
    out = jax.scipy.special.digamma(v)
    # PyTorch: digamma(+-0) = -+inf, negative integers -> nan
    out = jnp.where(v == 0, jnp.copysign(jnp.inf, -v), out)
    out = jnp.where((v < 0) & (v == jnp.floor(v)), jnp.nan, out)
    return out.astype(result)


@lowering(aten.sign, aten.sgn)
def sign(x):
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


@lowering(aten.round)
def round_(x, decimals=0):
    if not is_float(x.dtype):
        return x
    computation = acc_dtype(x.dtype)
    y = x.astype(computation)
    if decimals == 0:
        return jnp.round(y).astype(x.dtype)
    scale = 10.0 ** decimals
    return (jnp.round(y * scale) / scale).astype(x.dtype)


@lowering(aten.bitwise_not)
def bitwise_not(x):
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.invert(x)


@lowering(aten.logical_not)
def logical_not(x):
    return jnp.logical_not(x.astype(jnp.bool_))


@lowering(aten.nan_to_num)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not is_float(x.dtype):
        return x
    info = jnp.finfo(x.dtype)
    out = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan, x.dtype), x)
    out = jnp.where(jnp.isposinf(x), jnp.asarray(info.max if posinf is None else posinf, x.dtype), out)
    return jnp.where(jnp.isneginf(x), jnp.asarray(info.min if neginf is None else neginf, x.dtype), out)


def _binary(fn, kind=KIND.DEFAULT):
    def lower(x, y):
        computation, result = promote(x, y, kind=kind)
        return fn(cast(x, computation), cast(y, computation)).astype(result)

    return lower


for _op, _fn in [
    (aten.eq, jnp.equal), (aten.ne, jnp.not_equal), (aten.lt, jnp.less), (aten.le, jnp.less_equal),
    (aten.gt, jnp.greater), (aten.ge, jnp.greater_equal),
]:
    lowering(_op)(_binary(_fn, KIND.ALWAYS_BOOL))

for _op, _fn in [
    (aten.bitwise_and, jnp.bitwise_and), (aten.bitwise_or, jnp.bitwise_or),
    (aten.bitwise_xor, jnp.bitwise_xor), (aten.maximum, jnp.maximum), (aten.minimum, jnp.minimum),
    (aten.fmax, jnp.fmax), (aten.fmin, jnp.fmin), (aten.bitwise_left_shift, jnp.left_shift),
    (aten.bitwise_right_shift, jnp.right_shift), (aten.hypot, jnp.hypot),
    (aten.logaddexp, jnp.logaddexp), (aten.nextafter, jnp.nextafter),
    (aten.heaviside, lambda x, v: jnp.where(x == 0, v, jnp.where(x > 0, 1, 0).astype(x.dtype))),
]:
    lowering(_op)(_binary(_fn))

for _op, _fn in [(aten.atan2, jnp.arctan2), (aten.copysign, jnp.copysign),
                 (aten.xlogy, lambda x, y: jnp.where(x == 0, jnp.where(jnp.isnan(y), y, 0), x * jnp.log(y))),
                 (aten.logaddexp2, jnp.logaddexp2)]:
    lowering(_op)(_binary(_fn, KIND.INT_TO_FLOAT))


def _logical(fn):
    def lower(x, y):
        return fn(cast(x, jnp.bool_) if is_array(x) else bool(x), cast(y, jnp.bool_) if is_array(y) else bool(y))

    return lower


for _op, _fn in [(aten.logical_and, jnp.logical_and), (aten.logical_or, jnp.logical_or),
                 (aten.logical_xor, jnp.logical_xor)]:
    lowering(_op)(_logical(_fn))


def _with_alpha(combine):
    """add/sub: promote, scale the second operand by alpha, combine, cast."""

    def lower(x, y, alpha=1):
        computation, result = promote(x, y)
        y = cast(y, computation)
        if alpha != 1:
            y = y * cast(alpha, computation)
        return combine(cast(x, computation), y).astype(result)

    return lower


add = lowering(aten.add)(_with_alpha(jnp.add))
sub = lowering(aten.sub)(_with_alpha(jnp.subtract))


@lowering(aten.rsub)
def rsub(x, y, alpha=1):
    return sub(y, x, alpha)


lowering(aten.mul)(_binary(jnp.multiply))


def _floor_divide_float(a, b):
    """PyTorch's floor division of floats (as in its CPU kernel)."""
    mod = jnp.fmod(a, b)
    quotient = (a - mod) / b
    quotient = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), quotient - 1, quotient)
    floored = jnp.floor(quotient)
    floored = jnp.where(quotient - floored > 0.5, floored + 1, floored)
    floored = jnp.where(quotient == 0, jnp.copysign(jnp.zeros_like(a), a / b), floored)
    return jnp.where(b == 0, a / b, floored)


def _floor_divide_int(a, b):
    if a.dtype == jnp.bool_:
        return a
    return jnp.floor_divide(a, b)


@lowering(aten.div)
def div(x, y, rounding_mode=None):
    if rounding_mode is None:
        computation, result = promote(x, y, kind=KIND.INT_TO_FLOAT)
        return jnp.true_divide(cast(x, computation), cast(y, computation)).astype(result)
    computation, result = promote(x, y)
    a, b = cast(x, computation), cast(y, computation)
    if is_float(computation):
        out = jnp.trunc(a / b) if rounding_mode == "trunc" else _floor_divide_float(a, b)
    else:
        out = _floor_divide_int(a, b)
        if rounding_mode == "trunc" and a.dtype != jnp.bool_:
            out = jnp.where(((a % b) != 0) & ((a < 0) != (b < 0)), out + 1, out)
    return out.astype(result)


@lowering(aten.floor_divide)
def floor_divide(x, y):
    return div(x, y, rounding_mode="floor")


@lowering(aten.remainder)
def remainder(x, y):
    computation, result = promote(x, y)
    a, b = cast(x, computation), cast(y, computation)
    mod = jnp.fmod(a, b) if is_float(computation) else jax.lax.rem(a, b)
    mod = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)
    return mod.astype(result)


@lowering(aten.fmod)
def fmod(x, y):
    computation, result = promote(x, y)
    a, b = cast(x, computation), cast(y, computation)
    return (jnp.fmod(a, b) if is_float(computation) else jax.lax.rem(a, b)).astype(result)


@lowering(aten.pow)
def pow_(x, y):
    computation, result = promote(x, y, kind=KIND.BOOL_TO_LONG)
    if is_array(x) and not is_array(y):
        base = cast(x, computation)
        exponent = y
        if isinstance(exponent, float) and exponent.is_integer() and abs(exponent) <= 4:
            exponent = int(exponent)
        if isinstance(exponent, int) and not isinstance(exponent, bool):
            if is_float(computation) or exponent >= 0:
                return jax.lax.integer_pow(base, exponent).astype(result) if exponent != 0 else \
                    jnp.ones_like(base).astype(result)
        if exponent == 0.5:
            return jnp.sqrt(base).astype(result)
        if exponent == -0.5:
            return jax.lax.rsqrt(base).astype(result)
        return jnp.power(base, cast(exponent, computation)).astype(result)
    return jnp.power(cast(x, computation), cast(y, computation)).astype(result)


@lowering(aten.where)
def where(condition, x=None, y=None):
    if x is None:
        raise NotImplementedError("where(condition) has a data-dependent shape")
    computation, result = promote(x, y, kind=KIND.NO_OPMATH)
    return jnp.where(cast(condition, jnp.bool_), cast(x, result), cast(y, result))


@lowering(aten.clamp)
def clamp(x, min=None, max=None):
    computation, result = promote(x, min, max, kind=KIND.DEFAULT)
    out = cast(x, computation)
    if min is not None:
        lo = cast(min, computation)
        out = jnp.where(jnp.isnan(lo), lo, jnp.maximum(out, lo)) if is_float(computation) else jnp.maximum(out, lo)
    if max is not None:
        hi = cast(max, computation)
        out = jnp.where(jnp.isnan(hi), hi, jnp.minimum(out, hi)) if is_float(computation) else jnp.minimum(out, hi)
    return out.astype(result)


@lowering(aten.clamp_min)
def clamp_min(x, min):
    return clamp(x, min, None)


@lowering(aten.clamp_max)
def clamp_max(x, max):
    return clamp(x, None, max)


@lowering(aten.lerp)
def lerp(x, end, weight):
    computation, result = promote(x, end, weight)
    a, b, w = cast(x, computation), cast(end, computation), cast(weight, computation)
    diff = b - a
    return jnp.where(jnp.abs(w) < 0.5, a + w * diff, b - diff * (1 - w)).astype(result)


@lowering(aten.addcmul)
def addcmul(x, tensor1, tensor2, value=1):
    computation, result = promote(x, tensor1, tensor2)
    product = cast(tensor1, computation) * cast(tensor2, computation)
    return (cast(x, computation) + cast(value, computation) * product).astype(result)


@lowering(aten.addcdiv)
def addcdiv(x, tensor1, tensor2, value=1):
    computation, result = promote(x, tensor1, tensor2)
    quotient = cast(tensor1, computation) / cast(tensor2, computation)
    return (cast(x, computation) + cast(value, computation) * quotient).astype(result)


def _fma(a, b, c):
    computation, result = promote(a, b, c)
    return (cast(a, computation) * cast(b, computation) + cast(c, computation)).astype(result)


try:  # Dynamo emits prims.fma for addcmul_ / add_(alpha=tensor); the prim lives in inductor_prims
    import torch._inductor.inductor_prims  # noqa: F401

    lowering(torch.ops.prims.fma)(_fma)
except (ImportError, AttributeError):  # pragma: no cover - older or trimmed PyTorch builds
    pass


# ----------------------------------------------------- activations (+ backward)
def _floating(*values):
    """Values cast to the float computation dtype of the first, and the result dtype."""
    computation, result = promote(*values, kind=KIND.INT_TO_FLOAT)
    return [cast(v, computation) if v is not None else None for v in values], result


@lowering(aten.relu)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x


_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@lowering(aten.gelu)
def gelu(x, approximate="none"):
    (v,), result = _floating(x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        return (0.5 * v * (1 + jnp.tanh(inner))).astype(result)
    return (0.5 * v * (1 + jax.scipy.special.erf(v / _SQRT_2))).astype(result)


@lowering(aten.gelu_backward)
def gelu_backward(grad, x, approximate="none"):
    (g, v), result = _floating(grad, x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        t = jnp.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * v * v)
        derivative = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * d_inner
    else:
        cdf = 0.5 * (1 + jax.scipy.special.erf(v / _SQRT_2))
        pdf = jnp.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)
        derivative = cdf + v * pdf
    return (g * derivative).astype(result)


@lowering(aten.silu)
def silu(x):
    (v,), result = _floating(x)
    return (v * jax.nn.sigmoid(v)).astype(result)


@lowering(aten.silu_backward)
def silu_backward(grad, x):
    (g, v), result = _floating(grad, x)
    s = jax.nn.sigmoid(v)
    return (g * s * (1 + v * (1 - s))).astype(result)


@lowering(aten.sigmoid_backward)
def sigmoid_backward(grad, out):
    (g, y), result = _floating(grad, out)
    return (g * y * (1 - y)).astype(result)


@lowering(aten.tanh_backward)
def tanh_backward(grad, out):
    (g, y), result = _floating(grad, out)
    return (g * (1 - y * y)).astype(result)


@lowering(aten.threshold)
def threshold(x, threshold, value):
    computation, result = promote(x, threshold, value)
    return jnp.where(x <= threshold, cast(value, result), cast(x, result))


@lowering(aten.threshold_backward)
def threshold_backward(grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lowering(aten.leaky_relu)
def leaky_relu(x, negative_slope=0.01):
    (v,), result = _floating(x)
    return jnp.where(v > 0, v, v * negative_slope).astype(result)


@lowering(aten.leaky_relu_backward)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad, grad * negative_slope).astype(grad.dtype)


@lowering(aten.hardtanh)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    # the bounds take the tensor's dtype (no promotion, unlike clamp)
    return jnp.clip(x, cast(min_val, x.dtype), cast(max_val, x.dtype))


@lowering(aten.hardtanh_backward)
def hardtanh_backward(grad, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)


@lowering(aten.elu)
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    (v,), result = _floating(x)
    negative = alpha * jnp.expm1(v * input_scale)
    return (scale * jnp.where(v > 0, v, negative)).astype(result)


@lowering(aten.elu_backward)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    (g, v), result = _floating(grad, self_or_result)
    if is_result:
        negative = g * input_scale * (v + alpha * scale)
    else:
        negative = g * input_scale * scale * alpha * jnp.exp(v * input_scale)
    return jnp.where(v > 0, g * scale, negative).astype(result)


@lowering(aten.softplus)
def softplus(x, beta=1.0, threshold=20.0):
    (v,), result = _floating(x)
    scaled = v * beta
    return jnp.where(scaled > threshold, v, jnp.log1p(jnp.exp(scaled)) / beta).astype(result)


@lowering(aten.softplus_backward)
def softplus_backward(grad, x, beta, threshold):
    (g, v), result = _floating(grad, x)
    scaled = v * beta
    return jnp.where(scaled > threshold, g, g * jax.nn.sigmoid(scaled)).astype(result)


@lowering(aten.hardsigmoid)
def hardsigmoid(x):
    (v,), result = _floating(x)
    return (jnp.clip(v + 3, 0, 6) / 6).astype(result)


@lowering(aten.hardsigmoid_backward)
def hardsigmoid_backward(grad, x):
    (g, v), result = _floating(grad, x)
    return jnp.where((v > -3) & (v < 3), g / 6, 0).astype(result)


@lowering(aten.hardswish)
def hardswish(x):
    (v,), result = _floating(x)
    return (v * jnp.clip(v + 3, 0, 6) / 6).astype(result)


@lowering(aten.hardswish_backward)
def hardswish_backward(grad, x):
    (g, v), result = _floating(grad, x)
    inner = jnp.where(v < 3, g * (2 * v + 3) / 6, g)
    return jnp.where(v <= -3, 0, inner).astype(result)


@lowering(aten.mish)
def mish(x):
    (v,), result = _floating(x)
    return (v * jnp.tanh(jax.nn.softplus(v))).astype(result)


@lowering(aten.log_sigmoid_forward)
def log_sigmoid_forward(x):
    (v,), result = _floating(x)
    buffer = jnp.exp(-jnp.abs(v))  # what PyTorch's CPU kernel saves for the backward
    out = jnp.minimum(v, 0) - jnp.log1p(buffer)
    return out.astype(result), buffer.astype(result)


@lowering(aten.log_sigmoid_backward)
def log_sigmoid_backward(grad, x, buffer):
    (g, v), result = _floating(grad, x)
    return (g * jax.nn.sigmoid(-v)).astype(result)


@lowering(aten.logit)
def logit(x, eps=None):
    (v,), result = _floating(x)
    if eps is not None:
        v = jnp.clip(v, eps, 1 - eps)
    return jnp.log(v / (1 - v)).astype(result)


@lowering(aten.logit_backward)
def logit_backward(grad, x, eps=None):
    (g, v), result = _floating(grad, x)
    out = g / (v * (1 - v))
    if eps is None:
        out = jnp.where((v < 0) | (v > 1), jnp.nan, out)
    else:
        out = jnp.where((v < eps) | (v > 1 - eps), 0, out)
    return out.astype(result)


@lowering(aten._prelu_kernel)
def prelu_kernel(x, weight):
    return jnp.where(x > 0, x, weight * x).astype(x.dtype)


@lowering(aten._prelu_kernel_backward)
def prelu_kernel_backward(grad, x, weight):
    return (jnp.where(x > 0, grad, weight * grad).astype(x.dtype),
            jnp.where(x > 0, 0, x * grad).astype(weight.dtype))


# ------------------------------ special functions, integer math, complex numbers
def _float_pair(a, b):
    from torch_neuronx.lowering.common import KIND, cast, promote

    computation, result = promote(a, b, kind=KIND.INT_TO_FLOAT)
    return cast(a, computation), cast(b, computation), result


@lowering(aten.igamma)
def igamma(a, x):
    """Regularized lower incomplete gamma P(a, x)."""
    a, x, result = _float_pair(a, x)
    return jax.scipy.special.gammainc(a, x).astype(result)


@lowering(aten.igammac)
def igammac(a, x):
    """Regularized upper incomplete gamma Q(a, x) = 1 - P(a, x)."""
    a, x, result = _float_pair(a, x)
    return jax.scipy.special.gammaincc(a, x).astype(result)


def _integer_pair(a, b):
    from torch_neuronx.lowering.common import cast, promote

    _, result = promote(a, b)
    return cast(a, result), cast(b, result)


@lowering(aten.gcd)
def gcd(a, b):
    return jnp.gcd(*_integer_pair(a, b))


@lowering(aten.lcm)
def lcm(a, b):
    return jnp.lcm(*_integer_pair(a, b))


@lowering(aten.angle)
def angle(x):
    """Complex: arg(x). Real: 0 for x >= 0, pi for x < 0, NaN kept (integers become float)."""
    from torch_neuronx.lowering.common import KIND, cast, promote

    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    _, result = promote(x, kind=KIND.INT_TO_FLOAT)
    x = cast(x, result)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(jnp.pi, result), jnp.zeros((), result)))


@lowering(aten.complex)
def complex_(real, imag):
    return jax.lax.complex(real, imag)


@lowering(aten.polar)
def polar(magnitude, phase):
    return jax.lax.complex(magnitude * jnp.cos(phase), magnitude * jnp.sin(phase))


@lowering(aten.conj_physical, aten._conj, aten._conj_copy, aten._conj_physical)
def conj_physical(x):
    """The conjugate. `_conj` (the conjugate view, in the backward of complex
    products such as complex rotary embeddings) is the same value in a
    functional graph."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _shrink_backward(grad, x, lambd):
    """Both shrink functions are flat on [-lambd, lambd] and have slope 1 outside."""
    inside = (x >= -lambd) & (x <= lambd)
    return jnp.where(inside, jnp.zeros((), grad.dtype), grad)


lowering(aten.hardshrink_backward, aten.softshrink_backward)(_shrink_backward)
