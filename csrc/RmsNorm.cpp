// rms_norm's kernel for both neuron keys (PrivateUse1 and AutogradPrivateUse1),
// as TorchNeuron registers it: a 16-bit input with a weight of another dtype
// (PyTorch's composite would then take its unfused formula, several kernels) is
// raised to float32 for one _fused_rms_norm and the result returned in the
// input's dtype; every other call, and tensor subclasses (DTensor, Dynamo's fake
// tensors), take PyTorch's composite, which reaches _fused_rms_norm itself.
//
// It is C++ because every rms_norm call on the device goes through it (twice per
// layer of a Llama-style model): as a Python kernel it cost about 8 us a call
// (an rms_norm of [4, 64] float32: 19.9 us on `neuron` against 10.5 us on CPU;
// 11.7 us against 10.9 us in C++).
#include <ATen/ATen.h>
#include <ATen/ops/rms_norm_compositeimplicitautograd_dispatch.h>
#include <torch/library.h>

#include <optional>

namespace torch_neuronx {
namespace {

bool python(const at::Tensor& tensor) {
  return tensor.key_set().has(c10::DispatchKey::Python);
}

at::Tensor rmsNorm(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                   const std::optional<at::Tensor>& weight, std::optional<double> eps) {
  const bool half = input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
  const bool mixed = weight.has_value() && weight->defined() && weight->scalar_type() != input.scalar_type() && half;
  if (!mixed || python(input) || python(*weight)) {
    return at::compositeimplicitautograd::rms_norm_symint(input, normalized_shape, weight, eps);
  }
  auto normed = std::get<0>(at::_fused_rms_norm(input.to(at::kFloat), C10_AS_INTARRAYREF_SLOW(normalized_shape),
                                                weight->to(at::kFloat), eps));
  return normed.to(input.scalar_type());
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("rms_norm", TORCH_FN(rmsNorm));
}

// Reached with autograd too: the same route (_fused_rms_norm has its autograd formula).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("rms_norm", TORCH_FN(rmsNorm));
}

} // namespace torch_neuronx
