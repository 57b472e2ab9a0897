"""scaled_dot_product_attention on the device, as TorchNeuron runs it.

The device's SDPA backend choice (csrc/Kernels.cpp, sdpaChoice) is TorchNeuron's:
"overrideable" for every 4-D attention on neuron tensors. So
F.scaled_dot_product_attention runs aten::_scaled_dot_product_fused_attention_overrideable
and its gradient ..._overrideable_backward, one device kernel each. PyTorch gives
them no CPU kernel (only an error for backends that do not override them); these
are theirs, run on host aliases:

- PyTorch's flash-attention-for-CPU kernels where they apply (what the CPU's own
  choice takes: no dropout, one head size for query, key and value, no gradient
  for the mask, a 2-D or 4-D mask), PyTorch's math formulas otherwise (below:
  float32 for reduced types, as the CPU's math path computes them).
- Grouped-query attention: key/value heads that divide the query heads are
  shared by consecutive query heads (enable_gqa's repeat_interleave), with or
  without enable_gqa: the op has no such argument and TorchNeuron's kernel
  shares them (the CPU raises without enable_gqa). Other head counts raise
  TorchNeuron's error.
- Dropout: the keep-mask is drawn by the CPU kernel from the CPU's default
  generator, one bernoulli_(1 - p) over the attention weights' shape, the draw
  the CPU's math path makes: after torch.manual_seed(s) the device drops what
  the CPU drops, as TorchNeuron's kernel does (it draws on the CPU from the CPU
  generator's state). The mask reaches the backward in the philox_seed output
  (philox_offset is empty), so the backward draws nothing.
- The backward returns grad_attn_bias when grad_input_mask asks for it (a
  floating mask that requires grad), summed to the mask's shape.

The math functions are also the compiler's decompositions of the two ops when
dropout_p > 0 (compiler/aot.py): there the mask comes from native_dropout, which
the compiler draws on the host (compiler/host_random.py), so compiled dropout
drops what eager code and the CPU drop. Without dropout the ops stay in the
graph and are lowered (lowering/nn.py).
"""

from __future__ import annotations

import math

import torch

from torch_neuronx import _C
from torch_neuronx.ops.composites import on_host_aliases

aten = torch.ops.aten

_REDUCED = (torch.float16, torch.bfloat16)
_FLASH_DTYPES = (torch.float32, torch.float64, *_REDUCED)


def _scale(query: torch.Tensor, scale: float | None) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])


def _check(query, key, value, attn_bias, is_causal):
    """TorchNeuron's refusals: head counts that do not divide (its wording) and a
    mask given with is_causal (the CPU's wording)."""
    heads = query.shape[-3] if query.dim() >= 3 else 1
    for other in (key, value):
        kv_heads = other.shape[-3] if other.dim() >= 3 else 1
        if kv_heads == 0 or heads % kv_heads:
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query")
    if is_causal and attn_bias is not None:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")


def _share_heads(query, tensor):
    """Key or value with each head repeated for the consecutive query heads sharing it."""
    if tensor.dim() < 3 or tensor.shape[-3] == query.shape[-3]:
        return tensor
    groups = query.shape[-3] // tensor.shape[-3]
    shape = tensor.shape
    return tensor.unsqueeze(-3).expand(*shape[:-2], groups, *shape[-2:]).reshape(
        *shape[:-3], shape[-3] * groups, *shape[-2:])


def _fold_heads(grad, like):
    """The gradient of shared heads summed back into `like`'s heads."""
    if grad.dim() < 3 or grad.shape[-3] == like.shape[-3]:
        return grad
    return grad.unflatten(-3, (like.shape[-3], grad.shape[-3] // like.shape[-3])).sum(-3)


def _additive(attn_bias, dtype):
    """A boolean mask (True takes part) as the additive mask the kernels take."""
    if attn_bias is None or attn_bias.dtype != torch.bool:
        return attn_bias
    return torch.zeros(attn_bias.shape, dtype=dtype, device=attn_bias.device).masked_fill(
        attn_bias.logical_not(), -math.inf)


def flash_applies(query, key, value, attn_bias, dropout_p, bias_grad) -> bool:
    """Whether PyTorch's flash attention for the CPU computes the call (the CPU's
    own choice, sdp_utils_cpp.cpp, less the sdpa_kernel() switches)."""
    if dropout_p > 0 or bias_grad or query.dim() != 4 or query.dtype not in _FLASH_DTYPES:
        return False
    if not query.shape[-1] == key.shape[-1] == value.shape[-1] or 0 in (query.shape[-2], key.shape[-2]):
        return False
    if attn_bias is None:
        return True
    batch, heads, length, source = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    if attn_bias.shape[-2] not in (length, 1) or attn_bias.shape[-1] not in (source, 1):
        return False
    return attn_bias.dim() == 2 or (attn_bias.dim() == 4 and attn_bias.shape[0] in (1, batch)
                                    and attn_bias.shape[1] in (1, heads))


# ------------------------------------------------------------------ the math formulas
def _accumulation(dtype):
    return torch.float32 if dtype in _REDUCED else dtype


def _scores(query, key, attn_bias, is_causal, scale):
    """q k^T * scale plus the mask, in the accumulation type; -inf where masked."""
    acc = _accumulation(query.dtype)
    scores = torch.matmul(query.to(acc), _share_heads(query, key).to(acc).transpose(-2, -1)) * scale
    if is_causal:
        length, source = scores.shape[-2:]
        causal = torch.ones(length, source, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(causal.logical_not(), -math.inf)
    if attn_bias is not None:
        scores = scores + _additive(attn_bias, acc).to(acc)
    return scores


def _dropped(probs, keep, dropout_p):
    """The weights after dropout: kept ones scaled by 1 / (1 - p). On host aliases (the
    device kernels) the same products without converting the boolean mask to float first
    (csrc/Dropout.cpp); traced (the decompositions), the formula itself."""
    if keep is None:
        return probs
    scale = 0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p)
    if type(probs) is torch.Tensor and type(keep) is torch.Tensor and probs.device.type == "cpu":
        return _C._dropout_mask_scale(probs, keep, scale)
    return probs * keep * scale


def attention_math(query, key, value, attn_bias, dropout_p, is_causal, scale, keep=None):
    """(output, logsumexp) of softmax(q k^T * scale + mask) v, dropping what `keep`
    does not keep. A row with every key masked gives zeros (PyTorch's _safe_softmax)."""
    scores = _scores(query, key, attn_bias, is_causal, _scale(query, scale))
    probs = aten._safe_softmax(scores, -1)
    out = torch.matmul(_dropped(probs, keep, dropout_p), _share_heads(query, value).to(probs.dtype))
    return out.to(query.dtype), torch.logsumexp(scores, -1).float()


def attention_math_backward(grad_out, query, key, value, attn_bias, bias_grad, dropout_p, is_causal, scale,
                            keep=None):
    """(grad_query, grad_key, grad_value, grad_attn_bias) of attention_math; the last
    is None unless bias_grad."""
    scale = _scale(query, scale)
    scores = _scores(query, key, attn_bias, is_causal, scale)
    acc = scores.dtype
    probs = aten._safe_softmax(scores, -1)
    grad = grad_out.to(acc)
    grad_value = torch.matmul(_dropped(probs, keep, dropout_p).transpose(-2, -1), grad)
    grad_probs = _dropped(torch.matmul(grad, _share_heads(query, value).to(acc).transpose(-2, -1)), keep, dropout_p)
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    grad_query = torch.matmul(grad_scores, _share_heads(query, key).to(acc)) * scale
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), query.to(acc)) * scale
    grad_bias = grad_scores.sum_to_size(attn_bias.shape).to(attn_bias.dtype) if bias_grad else None
    return (grad_query.to(query.dtype), _fold_heads(grad_key, key).to(key.dtype),
            _fold_heads(grad_value, value).to(value.dtype), grad_bias)


# ------------------------------------------------------------------ the device kernels
def _dense(*tensors):
    """The math formulas' operands in contiguous memory. Attention's query, key and value are
    usually views with the heads transposed out of a projection ([batch, seq, heads, dim] seen
    as [batch, heads, seq, dim]); each torch.matmul over such a view copies it first (the
    backward's five products copied each operand again: 17 copies of 512 KiB per step of the
    transformer benchmark, about 2.5 ms). Copying once gives the same values."""
    return tuple(t.contiguous() for t in tensors)


def _draw_keep(query, key, dropout_p):
    """The keep-mask, drawn as the CPU's math path draws it (bernoulli_(1 - p) over
    the attention weights' shape, from the CPU's default generator)."""
    shape = (*query.shape[:-1], key.shape[-2])
    return torch.empty(shape, dtype=_accumulation(query.dtype)).bernoulli_(1.0 - dropout_p).bool()


def _forward_on_host(q, k, v, bias, dropout_p, is_causal, scale, bias_grad):
    """(out, logsumexp, keep-mask or None) on host aliases."""
    keep = _draw_keep(q, k, dropout_p) if dropout_p > 0 else None
    if flash_applies(q, k, v, bias, dropout_p, bias_grad):
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, _share_heads(q, k), _share_heads(q, v), 0.0, is_causal, attn_mask=_additive(bias, q.dtype),
            scale=scale)
    else:  # contiguous once: matmul would copy a transposed head layout at each product
        out, lse = attention_math(*_dense(q, k, v), bias, dropout_p, is_causal, scale, keep)
    return out, lse, keep


def fused_attention(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                    *, scale=None):
    if return_debug_mask:
        raise NotImplementedError("Debug mask not supported in Neuron implementation.")
    _check(query, key, value, attn_bias, is_causal)
    device = query.device
    bias_grad = attn_bias is not None and attn_bias.requires_grad
    out, lse, seed = on_host_aliases(_forward_on_host, device.index, query, key, value, attn_bias, dropout_p,
                                     is_causal, scale, bias_grad)
    if seed is None:
        seed = torch.empty((), dtype=torch.long, device=device)
    offset = torch.empty((), dtype=torch.long, device=device)
    return (out, lse, None, None, query.shape[-2], key.shape[-2], seed, offset, None)


def _backward_on_host(grad, q, k, v, bias, out, lse, keep, bias_grad, dropout_p, is_causal, scale):
    """(grad_query, grad_key, grad_value, grad_attn_bias or None) on host aliases."""
    if flash_applies(q, k, v, bias, dropout_p, bias_grad):
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, _share_heads(q, k), _share_heads(q, v), out, lse, 0.0, is_causal,
            attn_mask=_additive(bias, q.dtype), scale=scale)
        return grads[0], _fold_heads(grads[1], k), _fold_heads(grads[2], v), None
    return attention_math_backward(*_dense(grad, q, k, v), bias, bias_grad, dropout_p, is_causal, scale,
                                   keep if dropout_p > 0 else None)


def fused_attention_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                             cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                             scale=None):
    _check(query, key, value, attn_bias, is_causal)
    bias_grad = attn_bias is not None and bool(grad_input_mask[3])
    return on_host_aliases(_backward_on_host, query.device.index, grad_out, query, key, value, attn_bias, out,
                           logsumexp, philox_seed, bias_grad, dropout_p, is_causal, scale)


KERNELS = {
    "_scaled_dot_product_fused_attention_overrideable": fused_attention,
    "_scaled_dot_product_fused_attention_overrideable_backward": fused_attention_backward,
}


# ------------------------------------------------------------------ the compiler's decompositions
def _decompose(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
               scale=None):
    """With dropout: the math formulas, the mask drawn by native_dropout (on the host,
    compiler/host_random.py) and handed to the backward as philox_seed. Without:
    NotImplemented, the op stays in the graph (its lowering)."""
    if dropout_p <= 0:
        return NotImplemented
    _check(query, key, value, attn_bias, is_causal)
    weights = torch.empty((*query.shape[:-1], key.shape[-2]), dtype=_accumulation(query.dtype), device=query.device)
    keep = aten.native_dropout.default(weights, dropout_p, True)[1]  # only its shape and dtype are read
    out, lse = attention_math(query, key, value, attn_bias, dropout_p, is_causal, scale, keep)
    empty = torch.zeros((), dtype=torch.long, device=query.device)
    return (out, lse, None, None, query.shape[-2], key.shape[-2], keep, empty, None)


def _decompose_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                        cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    if dropout_p <= 0:
        return NotImplemented
    return attention_math_backward(grad_out, query, key, value, attn_bias,
                                   attn_bias is not None and bool(grad_input_mask[3]), dropout_p, is_causal, scale,
                                   philox_seed)


DECOMPOSITIONS = {
    aten._scaled_dot_product_fused_attention_overrideable.default: _decompose,
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: _decompose_backward,
}
