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
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/ops/native_layer_norm_backward_native.h>
#include <ATen/ops/native_layer_norm_native.h>
#include <torch/library.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <tuple>

namespace torch_neuronx {
namespace {

DirectOp kLayerNorm("native_layer_norm");
DirectOp kLayerNormBackward("native_layer_norm_backward");

using Results = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Whether the CPU kernel can run on these operands' host aliases: every one
// given on `input`'s neuron device, none rounded by the fp64 rule, input not empty.
bool direct(const at::Tensor& input, std::initializer_list<const std::optional<at::Tensor>*> others) {
  if (input.device().type() != kNeuron || input.numel() == 0 || needsFp64Emulation(input)) {
    return false;
  }
  for (const auto* other : others) {
    if (other->has_value() && (*other)->defined() &&
        ((*other)->device() != input.device() || needsFp64Emulation(**other))) {
      return false;
    }
  }
  return true;
}

std::optional<at::Tensor> hostAliasOf(const std::optional<at::Tensor>& tensor) {
  if (!tensor.has_value() || !tensor->defined()) {
    return std::nullopt;
  }
  return hostAlias(*tensor);
}

at::Tensor adoptDefined(const at::Tensor& cpu, c10::DeviceIndex device) {
  return cpu.defined() ? adoptKernelResult(cpu, device) : cpu;
}

Results adoptAll(const Results& cpu, c10::DeviceIndex device) {
  return {adoptDefined(std::get<0>(cpu), device), adoptDefined(std::get<1>(cpu), device),
          adoptDefined(std::get<2>(cpu), device)};
}

Results fromStack(torch::jit::Stack stack) {
  return {std::move(stack[0]).toTensor(), std::move(stack[1]).toTensor(), std::move(stack[2]).toTensor()};
}

Results layerNorm(const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                  const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps) {
  if (!direct(input, {&weight, &bias})) {
    return fromStack(kLayerNorm.runGenericStack(input, normalized_shape, weight, bias, eps));
  }
  auto call = kLayerNorm.enter(input, normalized_shape, weight, bias, eps);
  const auto device = input.device().index();
  CaptureScope capture(device);
  return adoptAll(at::native::layer_norm_cpu(hostAlias(input), C10_AS_INTARRAYREF_SLOW(normalized_shape),
                                             hostAliasOf(weight), hostAliasOf(bias), eps),
                  device);
}

Results layerNormBackward(const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef normalized_shape,
                          const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
                          const std::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  const std::optional<at::Tensor> tensors[] = {grad_out, mean, rstd};
  if (!direct(input, {&tensors[0], &tensors[1], &tensors[2], &weight, &bias})) {
    return fromStack(kLayerNormBackward.runGenericStack(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                                                        output_mask));
  }
  auto call = kLayerNormBackward.enter(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
  const auto device = input.device().index();
  CaptureScope capture(device);
  return adoptAll(at::native::layer_norm_backward_cpu(hostAlias(grad_out), hostAlias(input),
                                                      C10_AS_INTARRAYREF_SLOW(normalized_shape), hostAlias(mean),
                                                      hostAlias(rstd), hostAliasOf(weight), hostAliasOf(bias),
                                                      output_mask),
                  device);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  kLayerNorm.registerKernel(m, layerNorm);
  kLayerNormBackward.registerKernel(m, layerNormBackward);
}

} // namespace torch_neuronx
