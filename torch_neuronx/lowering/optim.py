"""Lowerings of the fused optimizer and AMP grad-scaling ops, and the ``_foreach_`` ops
that unfused optimizers use (register_foreach, a post-pass of lowering.load()).

In a compiled graph these ops appear in their functional form (AOTAutograd
functionalizes ``_fused_adam_`` into ``_fused_adam``, which returns the updated
copies of every list it mutates, then writes them back with ``copy_``). Each
lowering reproduces PyTorch's CPU kernel step by step (aten/src/ATen/native/
cpu/Fused*Kernel.cpp, AmpGradScalerKernels.cpp): scalar hyper-parameters are
rounded to the tensor's dtype before use, bias corrections are computed in
double, bfloat16/float16 tensors are updated in float32 and rounded on store.

Note: torch.optim wraps its fused implementations in torch.compiler.disable,
so ``opt.step()`` under torch.compile runs them eagerly; these lowerings serve
graphs that call the ops directly (and make the native claim honest).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from torch_neuronx.lowering import LOWERINGS, lowering
from torch_neuronx.lowering.common import jax_dtype

aten = torch.ops.aten


def _double():
    """PyTorch computes the per-step scalars in double; float32 under the fp64 rule."""
    return jax_dtype(torch.float64)


def _opmath(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _scalar(value, dtype):
    """A hyper-parameter (Python float or 0-dim array) as the kernel sees it: rounded to `dtype`."""
    return jnp.asarray(value, _double()).astype(dtype)


def _unscale(grad, grad_scale):
    if grad_scale is None:
        return grad
    return (grad.astype(_opmath(grad.dtype)) / grad_scale.astype(_opmath(grad.dtype))).astype(grad.dtype)


def _skip_if_inf(found_inf, new, old):
    """The kernels return before touching anything when found_inf == 1."""
    if found_inf is None:
        return new
    skip = found_inf.reshape(()) == 1.0
    return [[jnp.where(skip, o, n) for n, o in zip(news, olds)] for news, olds in zip(new, old)]


def _lerp(start, end, weight):
    """at::lerp: start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w)."""
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


def _adam_one(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, lr, beta1, beta2, weight_decay, eps,
              amsgrad, maximize, decoupled):
    dtype = _opmath(param.dtype)
    wide = _double()
    step = step.astype(wide)
    lr_wide = jnp.asarray(lr, wide)
    bias_correction1 = 1 - jnp.power(jnp.asarray(beta1, wide), step)
    bias_correction2_sqrt = jnp.sqrt(1 - jnp.power(jnp.asarray(beta2, wide), step))
    step_size = (lr_wide / bias_correction1).astype(dtype)
    p, g = param.astype(dtype), grad.astype(dtype)
    m, v = exp_avg.astype(dtype), exp_avg_sq.astype(dtype)
    if maximize:
        g = -g
    if weight_decay != 0:
        if decoupled:  # AdamW: param *= 1 - lr * weight_decay
            p = p * (1 - lr_wide * weight_decay).astype(dtype)
        else:
            g = g + p * _scalar(weight_decay, dtype)
    m = _lerp(m, g, _scalar(1 - beta1, dtype))
    v = v * _scalar(beta2, dtype) + _scalar(1 - beta2, dtype) * g * g
    peak = v
    if amsgrad:
        peak = jnp.maximum(max_exp_avg_sq.astype(dtype), v)
        max_exp_avg_sq = peak.astype(max_exp_avg_sq.dtype)
    denom = jnp.sqrt(peak) / bias_correction2_sqrt.astype(dtype) + _scalar(eps, dtype)
    p = p - step_size * m / denom
    return p.astype(param.dtype), m.astype(exp_avg.dtype), v.astype(exp_avg_sq.dtype), max_exp_avg_sq


def _fused_adam(decoupled):
    def lower(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
              weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        grads_out = [_unscale(g, grad_scale) for g in grads]
        outs = [[], [], [], []]
        for i, param in enumerate(params):
            peak = max_exp_avg_sqs[i] if amsgrad else None
            updated = _adam_one(param, grads_out[i], exp_avgs[i], exp_avg_sqs[i], peak, state_steps[i], lr, beta1,
                                beta2, weight_decay, eps, amsgrad, maximize, decoupled)
            for out, value in zip(outs, updated):
                out.append(value)
        new = [outs[0], grads_out, outs[1], outs[2], outs[3] if amsgrad else []]
        old = [list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), list(max_exp_avg_sqs)]
        return tuple(_skip_if_inf(found_inf, new, old))

    return lower


lowering(aten._fused_adam)(_fused_adam(decoupled=False))
lowering(aten._fused_adamw)(_fused_adam(decoupled=True))


def _sgd_one(param, grad, buf, weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step):
    dtype = _opmath(param.dtype)
    p, g = param.astype(dtype), grad.astype(dtype)
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + p * _scalar(weight_decay, dtype)
    if momentum != 0:
        if is_first_step:
            b = g
        else:
            b = buf.astype(dtype) * _scalar(momentum, dtype) + g * _scalar(1 - dampening, dtype)
        buf = b.astype(buf.dtype)
        g = g + b * _scalar(momentum, dtype) if nesterov else b
    p = p - g * _scalar(lr, dtype)
    return p.astype(param.dtype), buf


@lowering(aten._fused_sgd)
def fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
              is_first_step, grad_scale=None, found_inf=None):
    grads_out = [_unscale(g, grad_scale) for g in grads]
    new_params, new_bufs = [], []
    for i, param in enumerate(params):
        buf = momentum_buffer_list[i] if momentum != 0 else None
        p, b = _sgd_one(param, grads_out[i], buf, weight_decay, momentum, lr, dampening, nesterov, maximize,
                        is_first_step)
        new_params.append(p)
        if momentum != 0:
            new_bufs.append(b)
    new = [new_params, grads_out, new_bufs if momentum != 0 else list(momentum_buffer_list)]
    old = [list(params), list(grads), list(momentum_buffer_list)]
    return tuple(_skip_if_inf(found_inf, new, old))


@lowering(aten._amp_foreach_non_finite_check_and_unscale)
def amp_foreach_non_finite_check_and_unscale(tensors, found_inf, inv_scale):
    """found_inf becomes 1 if any value is inf/NaN; every tensor is multiplied by inv_scale."""
    outs, any_bad = [], jnp.zeros((), jnp.bool_)
    scale = inv_scale.reshape(())
    for t in tensors:
        any_bad = any_bad | ~jnp.all(jnp.isfinite(t))
        math = _opmath(t.dtype)
        scaled = (t.astype(math) * scale.astype(math)).astype(t.dtype)
        outs.append(jnp.where(scale == 1.0, t, scaled))
    return outs, jnp.where(any_bad, jnp.ones((), found_inf.dtype), found_inf)


@lowering(aten._amp_update_scale)
def amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """GradScaler.update: back off on inf, grow after `growth_interval` clean steps."""
    wide = _double()
    current = scale.astype(wide)
    found = found_inf != 0
    successful = growth_tracker + 1
    grown = (current * growth_factor).astype(scale.dtype)
    grow = successful == growth_interval
    grown_ok = jnp.where(jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(found, (current * backoff_factor).astype(scale.dtype), jnp.where(grow, grown_ok, scale))
    zero = jnp.zeros_like(growth_tracker)
    new_tracker = jnp.where(found, zero, jnp.where(grow, zero, successful.astype(growth_tracker.dtype)))
    return new_scale, new_tracker


# ------------------------------------------------------------ _foreach_ ops
# Optimizers (foreach=True, the default on accelerators) keep lists of tensors;
# each _foreach_ overload applies the plain op element by element. List
# arguments (Tensor[] / Scalar[]) are zipped; `Tensor scalars` holds one value
# per element; everything else is shared.
_FOREACH_BASE = {"norm": aten.linalg_vector_norm, "max": aten.amax, "zero": aten.zeros_like,
                 "clone": aten.clone, "copy": aten.copy}


def _foreach_lowering(overload, base):
    schema = overload._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    zipped = {a.name for a in schema.arguments if str(a.type) in ("List[Tensor]", "List[number]")}
    per_element = {a.name for a in schema.arguments if a.name == "scalars" and str(a.type) == "Tensor"}

    def lower(*args, **kwargs):
        named = dict(zip([a.name for a in positional], args))
        named.update(kwargs)
        length = len(next(named[n] for n in named if n in zipped))
        results = []
        for i in range(length):
            def pick(name, value):
                if name in zipped:
                    return value[i]
                if name in per_element:
                    return value[i]
                return value

            values = {n: pick(n, v) for n, v in named.items()}
            call_args = [values[a.name] for a in positional if a.name in values]
            call_kwargs = {a.name: values[a.name] for a in schema.arguments if a.kwarg_only and a.name in values}
            if base is aten.linalg_vector_norm:  # _foreach_norm(self, ord, dtype)
                call_args, call_kwargs = call_args[:2], {"dtype": values.get("dtype")}
            if base is aten.copy:
                call_kwargs = {}
                call_args = call_args[:2]
            results.append(LOWERINGS[base](*call_args, **call_kwargs))
        return results

    return lower


def register_foreach():
    """The _foreach_ variants of every lowered op (lowering.load() runs it once all are registered)."""
    names = sorted({
        name.split("::")[1].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::_foreach_") and not name.split(".")[0].endswith("_")
    })
    for name in names:
        base = _FOREACH_BASE.get(name[len("_foreach_"):]) or getattr(aten, name[len("_foreach_"):], None)
        if base is None or base not in LOWERINGS:
            continue
        packet = getattr(aten, name)
        for overload_name in packet.overloads():
            if "out" in overload_name:
                continue
            overload = getattr(packet, overload_name)
            LOWERINGS[overload] = _foreach_lowering(overload, base)
