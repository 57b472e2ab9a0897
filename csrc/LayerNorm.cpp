// native_layer_norm and native_layer_norm_backward on the device: PyTorch's CPU
// kernels (at::native::layer_norm_cpu, layer_norm_backward_cpu) called
// directly on host aliases, without the generic alias path.
//
// The alias path boxes the call, finds each of its tensors' device and dtype,
// redispatches to the CPU key and adopts each result: for layer norm's three
// inputs and three results about 1.2 us a call, a fifth of a LayerNorm over
// 1,024 floats at batch 1 (F.layer_norm: 7.6 us on `neuron` against 6.3 us on
// CPU). The kernels are the ones PyTorch's CPU op runs, so the results are its
// bits. Calls with an operand on another device or core, a float64 operand
// under the fp64 rule, or an empty input keep the alias path (its errors, its
// rounding, its handling of empty results).
#include "Allocator.h"
#include "Concatenation.h"
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/ops/native_layer_norm_backward_native.h>
#include <ATen/ops/native_layer_norm_native.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <tuple>

namespace torch_neuronx {
namespace {

DirectOp kLayerNorm("native_layer_norm");
DirectOp kLayerNormBackward("native_layer_norm_backward");

using Results = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Whether the CPU kernel can read `t` through a host alias for a call on
// `device`: on that device, not rounded by the fp64 rule. An optional operand
// may also be absent.
bool readable(const at::Tensor& t, c10::Device device) {
  return t.defined() && t.device() == device && !needsFp64Emulation(t);
}
bool readable(const std::optional<at::Tensor>& t, c10::Device device) {
  return !t.has_value() || !t->defined() || readable(*t, device);
}

// Whether the CPU kernel runs on the operands' host aliases: a non-empty neuron
// `input`, every other operand readable beside it.
template <class... Others>
bool direct(const at::Tensor& input, const Others&... others) {
  return input.device().type() == kNeuron && readable(input, input.device()) && input.numel() > 0 &&
         (readable(others, input.device()) && ...);
}

std::optional<at::Tensor> hostAliasOf(const std::optional<at::Tensor>& tensor) {
  if (!tensor.has_value() || !tensor->defined()) {
    return std::nullopt;
  }
  return hostAlias(*tensor);
}

Results fromStack(torch::jit::Stack stack) {
  return {std::move(stack[0]).toTensor(), std::move(stack[1]).toTensor(), std::move(stack[2]).toTensor()};
}

Results layerNorm(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                  const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  if (concatenationEnabled()) {
    auto queued = queueLayerNorm(kLayerNorm, input, C10_AS_INTARRAYREF_SLOW(normalized_shape), weight, bias, eps);
    if (std::get<0>(queued).defined()) {
      auto call = kLayerNorm.enter(input, normalized_shape, weight, bias, eps);
      return queued;
    }
  }
  if (!direct(input, weight, bias)) {
    return fromStack(kLayerNorm.runGenericStack(input, normalized_shape, weight, bias, eps));
  }
  auto call = kLayerNorm.enter(input, normalized_shape, weight, bias, eps);
  const auto device = input.device().index();
  CaptureScope capture(device);
  return adoptKernelResults(at::native::layer_norm_cpu(hostAlias(input), C10_AS_INTARRAYREF_SLOW(normalized_shape),
                                                       hostAliasOf(weight), hostAliasOf(bias), eps),
                            device);
}

Results layerNormBackward(const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                          const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  if (!direct(input, grad_out, mean, rstd, weight, bias)) {
    return fromStack(kLayerNormBackward.runGenericStack(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                                        output_mask));
  }
  auto call = kLayerNormBackward.enter(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
  const auto device = input.device().index();
  CaptureScope capture(device);
  return adoptKernelResults(at::native::layer_norm_backward_cpu(hostAlias(grad_out), hostAlias(input),
                                                                C10_AS_INTARRAYREF_SLOW(normalized_shape),
                                                                hostAlias(mean), hostAlias(rstd), hostAliasOf(weight),
                                                                hostAliasOf(bias), output_mask),
                            device);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  kLayerNorm.registerKernel(m, layerNorm);
  kLayerNormBackward.registerKernel(m, layerNormBackward);
}

} // namespace torch_neuronx
