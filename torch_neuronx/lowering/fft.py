"""Lowerings of the three FFT primitives every torch.fft function reduces to.

``normalization`` is PyTorch's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n,
where n is the product of the signal sizes over the transformed dims (for
c2r, the sizes of the real output). The jnp.fft calls are made unnormalized
(forward transforms with norm="backward", inverse ones with norm="forward")
and the scale is applied here, so each op scales exactly once.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from torch_neuronx.lowering import lowering

aten = torch.ops.aten


def _scaled(x, sizes, normalization):
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return x
    scale = 1.0 / math.sqrt(n) if normalization == 1 else 1.0 / n
    return x * jnp.asarray(scale, jnp.real(x).dtype)


def _axes(x, dim):
    return tuple(d % x.ndim for d in dim)


@lowering(aten._fft_r2c)
def fft_r2c(x, dim, normalization, onesided):
    """Real -> complex. onesided keeps the last transformed dim's n // 2 + 1 non-redundant bins."""
    axes = _axes(x, dim)
    if onesided:
        out = jnp.fft.rfftn(x, axes=axes)
    else:
        out = jnp.fft.fftn(x.astype(jnp.result_type(x.dtype, jnp.complex64)), axes=axes)
    return _scaled(out, [x.shape[a] for a in axes], normalization)


@lowering(aten._fft_c2c)
def fft_c2c(x, dim, normalization, forward):
    axes = _axes(x, dim)
    out = jnp.fft.fftn(x, axes=axes) if forward else jnp.fft.ifftn(x, axes=axes, norm="forward")
    return _scaled(out, [x.shape[a] for a in axes], normalization)


@lowering(aten._fft_c2r)
def fft_c2r(x, dim, normalization, last_dim_size):
    """Complex (one-sided along the last dim) -> real of size last_dim_size along it."""
    axes = _axes(x, dim)
    sizes = [x.shape[a] for a in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=axes, norm="forward")
    return _scaled(out, sizes, normalization)
