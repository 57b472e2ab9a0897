"""Fused RNN cell kernels for the neuron device.

For accelerator tensors PyTorch's LSTM/GRU cells call `_thnn_fused_lstm_cell`
and `_thnn_fused_gru_cell` (and their backward ops), which only CUDA
implements. These are the device's implementations, written with ATen ops
(each of which runs natively). Workspace layouts: LSTM [i, f, g, o] (the
activated gates), GRU [r, z, n, hx, hn], as on CUDA.
"""

from __future__ import annotations

import torch


def _with_biases(input_gates, hidden_gates, input_bias, hidden_bias):
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    return input_gates, hidden_gates


def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    input_gates, hidden_gates = _with_biases(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = (input_gates + hidden_gates).chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    d_cy = torch.zeros_like(cy) if grad_cy is None else grad_cy.clone()
    d_o = torch.zeros_like(cy)
    if grad_hy is not None:
        d_o = grad_hy * tanh_cy
        d_cy = d_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = torch.cat([
        d_cy * g * i * (1 - i),
        d_cy * cx * f * (1 - f),
        d_cy * i * (1 - g * g),
        d_o * o * (1 - o),
    ], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, d_cy * f, grad_bias


def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    input_gates, hidden_gates = _with_biases(input_gates, hidden_gates, input_bias, hidden_bias)
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = (hx - n) * z + n
    return hy, torch.cat([r, z, n, hx, hn], 1)


def gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_hx = grad_hy * z
    d_n = grad_hy * (1 - z) * (1 - n * n)
    d_r = d_n * hn * r * (1 - r)
    d_z = grad_hy * (hx - n) * z * (1 - z)
    grad_input_gates = torch.cat([d_r, d_z, d_n], 1)
    grad_hidden_gates = torch.cat([d_r, d_z, d_n * r], 1)
    if has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None


KERNELS = {
    "_thnn_fused_lstm_cell": lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": lstm_cell_backward,
    "_thnn_fused_gru_cell": gru_cell,
    "_thnn_fused_gru_cell_backward": gru_cell_backward,
}
