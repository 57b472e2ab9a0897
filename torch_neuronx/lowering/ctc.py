"""Lowering of the CTC loss's backward (aten::_ctc_loss_backward): the backward
(beta) recursion of Graves et al. (2006) as a lax.scan over time steps, every
batch element and every position of the extended target (blank, l1, blank,
l2, ..., blank) at once, and the gradient from log_alpha and log_beta.

Semantics are those of PyTorch's CPU kernel (aten/src/ATen/native/LossCTC.cpp).
The forward, aten::_ctc_loss, is not lowered: its log_alpha is [batch, time,
2 * max(target_lengths) + 1], a shape that depends on the lengths' values
(PyTorch tags it dynamic_output_shape), so Dynamo breaks the graph before it
and it runs natively in eager (ops/registry.py, DATA_DEPENDENT). That
log_alpha holds unset memory past each sequence's input and extended-target
lengths: the backward reads only the entries a path reaches. Lengths must be
known when tracing (the int[] overload; the .Tensor one would need values).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_neuronx.lowering import lowering

aten = torch.ops.aten


def _padded_targets(targets, target_lengths):
    """Targets as [B, S], S the longest target length (log_alpha's width is 2S+1, as on
    CPU): 2-D targets cut to S columns, 1-D (concatenated) ones split at the lengths' offsets."""
    width = max(target_lengths, default=0)
    if targets.ndim == 2:
        return targets[:, :width]
    offsets = np.concatenate([[0], np.cumsum(target_lengths)[:-1]]).astype(np.int64)
    index = np.minimum(offsets[:, None] + np.arange(width)[None, :], max(targets.shape[0] - 1, 0))
    return targets[jnp.asarray(index)] if width else jnp.zeros((len(target_lengths), 0), targets.dtype)


def _lengths(lengths):
    return jnp.asarray(lengths).astype(jnp.int64)


def _extended(targets, blank):
    """The extended targets [B, 2S+1] (blank between and around the labels) and where a
    position may be reached from two positions back (a label unlike the one before it)."""
    batch, width = targets.shape
    labels = jnp.full((batch, 2 * width + 1), blank, dtype=targets.dtype)
    labels = labels.at[:, 1::2].set(targets)
    previous = jnp.pad(labels[:, :-2], ((0, 0), (2, 0)), constant_values=blank)
    skip = (labels != previous) & (jnp.arange(2 * width + 1) >= 2)
    return labels, skip


def _log_add3(a, b, c):
    """log(exp(a) + exp(b) + exp(c)) as the CPU kernel computes it (max taken out; all -inf gives -inf)."""
    top = jnp.maximum(jnp.maximum(a, b), c)
    top = jnp.where(top == -jnp.inf, 0, top)
    return jnp.log(jnp.exp(a - top) + jnp.exp(b - top) + jnp.exp(c - top)) + top


def _unshift(x, by):
    """x[..., s + by] at position s (-inf past the end)."""
    return jnp.pad(x[:, by:], ((0, 0), (0, by)), constant_values=-jnp.inf) if x.shape[1] > by \
        else jnp.full_like(x, -jnp.inf)


def _setup(log_probs, targets, input_lengths, target_lengths, blank):
    padded = _padded_targets(targets, target_lengths)
    labels, skip = _extended(padded, blank)
    # log_probs [T, B, C] -> the extended labels' log-probabilities [T, B, 2S+1]
    emissions = jnp.take_along_axis(log_probs, jnp.broadcast_to(labels[None], (log_probs.shape[0],) + labels.shape)
                                    .astype(jnp.int64), axis=2)
    positions = jnp.arange(labels.shape[1])
    valid = positions[None, :] <= 2 * _lengths(target_lengths)[:, None]  # [B, 2S+1]
    return labels, skip, emissions, valid, _lengths(input_lengths), _lengths(target_lengths)


def _betas(emissions, skip, valid, input_lengths, target_lengths):
    """log_beta [T, B, 2S+1], run backwards from each sequence's last input step."""
    neginf = jnp.array(-jnp.inf, emissions.dtype)
    positions = jnp.arange(emissions.shape[2])
    ends = (positions[None, :] == 2 * target_lengths[:, None]) | \
        ((positions[None, :] == 2 * target_lengths[:, None] - 1) & (target_lengths[:, None] > 0))
    skip_ahead = _unshift(skip, 2) if skip.shape[1] > 2 else jnp.zeros_like(skip)

    def step(beta, inputs):
        t, emission = inputs
        # beta is -inf past 2 * target_length, so s + 1 and s + 2 need no bound check
        recursed = _log_add3(beta, _unshift(beta, 1), jnp.where(skip_ahead, _unshift(beta, 2), neginf)) + emission
        last = t == input_lengths - 1
        new = jnp.where(last[:, None], jnp.where(ends, emission, neginf),
                        jnp.where((t < input_lengths - 1)[:, None] & valid, recursed, neginf))
        return new, new

    times = jnp.arange(emissions.shape[0] - 1, -1, -1)
    start = jnp.full(emissions.shape[1:], -jnp.inf, emissions.dtype)
    _, betas = jax.lax.scan(step, start, (times, emissions[::-1]))
    return betas[::-1]


def _collect_by_label(log_values, labels, num_labels):
    """log(sum of exp(log_values[t, b, s]) over the positions s whose label is c): [T, B, C]."""
    steps, batch, _ = log_values.shape
    t = jnp.arange(steps)[:, None, None]
    b = jnp.arange(batch)[None, :, None]
    c = jnp.broadcast_to(labels[None], log_values.shape)
    top = jnp.full((steps, batch, num_labels), -jnp.inf, log_values.dtype).at[t, b, c].max(log_values)
    safe_top = jnp.where(top == -jnp.inf, 0, top)
    sums = jnp.zeros_like(top).at[t, b, c].add(jnp.exp(log_values - safe_top[t, b, c]))
    return jnp.log(sums) + safe_top


@lowering(aten._ctc_loss_backward.default)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                      blank, zero_infinity=False):
    labels, skip, emissions, valid, inputs, lengths = _setup(log_probs, targets, input_lengths, target_lengths,
                                                            blank)
    betas = _betas(emissions, skip, valid, inputs, lengths)
    # only the entries a path reaches: an eager log_alpha holds unset memory elsewhere
    reached = valid[None] & (jnp.arange(log_probs.shape[0])[:, None] < inputs[None, :])[:, :, None]
    alphas = jnp.where(reached, jnp.swapaxes(log_alpha, 0, 1), -jnp.inf)
    collected = _collect_by_label(alphas + betas, labels, log_probs.shape[2])
    nll = neg_log_likelihood[None, :, None]
    result = (jnp.exp(log_probs) - jnp.exp(collected + nll - log_probs)) * grad[None, :, None]
    keep = jnp.arange(log_probs.shape[0])[:, None] < inputs[None, :]  # [T, B]
    if zero_infinity:
        keep = keep & (neg_log_likelihood != jnp.inf)[None, :]
    return jnp.where(keep[:, :, None], result, 0).astype(log_probs.dtype)
