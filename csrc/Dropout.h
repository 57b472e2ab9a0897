// Dropout's masking on host tensors (csrc/Dropout.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_neuronx {

// x * mask * scale as PyTorch computes it with a boolean mask (the same bits),
// without converting the mask to x's dtype first where x is contiguous float32;
// attention's dropout (torch_neuronx/ops/attention.py) calls it on host aliases.
at::Tensor dropoutMaskScale(const at::Tensor& x, const at::Tensor& mask, double scale);

} // namespace torch_neuronx
