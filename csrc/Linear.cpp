// linear's autograd kernel and linear_backward's device kernel: linear as
// TorchNeuron runs it, one `linear` kernel forward and one `linear_backward`
// kernel for its gradient.
//
// PyTorch writes linear as a composite (t + addmm, differentiated through the
// matmuls); TorchNeuron registers it for the device, so here it is one of the
// registry's ONE_KERNEL_COMPOSITES (the alias kernel runs the composite on host
// aliases), and this kernel gives it the autograd PyTorch's composite had
// provided. linear_backward has CPU kernels only for MKL-DNN and nested
// tensors, so the alias kernel has nothing to run: its device kernel here runs
// the formula (linearBackwardFormula, the same as the compiler's decomposition
// in torch_neuronx/ops/linear.py) on host aliases, as one kernel.
//
// linear's device kernel is the alias kernel's (the composite on host aliases)
// but for one row of float32 (batch 1: a decoding step), which Gemv.cpp's loop
// computes.
//
// Both are C++ because every linear call on the device goes through them: as
// Python kernels the autograd kernel cost about 9 us a call (a Linear(256, 1024)
// at batch 1 took 38 us on `neuron` against 29 us on CPU) and linear_backward's
// about 40 us (a Linear(64, 128) at batch 8, forward and backward: 141 us, 101 us
// in C++, 80 us on CPU).
//
// - Tensor subclasses (DTensor, Dynamo's fake tensors, functionalization) and
//   functorch transforms keep PyTorch's composite: DTensor has sharding rules
//   for mm/addmm but none for linear or linear_backward in PyTorch 2.13, and the
//   compiler decomposes linear while tracing anyway.
// - A gradient of the gradient (create_graph=True) runs the differentiable
//   formula.
#include "Allocator.h"
#include "Concatenation.h"
#include "Eager.h"
#include "Gemv.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/accumulate.h>
#include <ATen/ops/linear_native.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <optional>

namespace torch_neuronx {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool defined(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined();
}

// Calls PyTorch's composite serves: tensor subclasses and functorch transforms.
bool keepsComposite(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const auto python = [](const at::Tensor& t) { return t.key_set().has(c10::DispatchKey::Python); };
  if (python(input) || python(weight) || (defined(bias) && python(*bias))) {
    return true;
  }
  // functorch includes its front-mode key while its stack of transforms is not empty
  // (ATen/functorch/DynamicLayer.h, whose header this build cannot include).
  return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

// The shapes linear_backward's formula serves: a 2-D weight, a bias of its rows.
bool hasLinearBackward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return weight.dim() == 2 && input.dim() > 0 &&
         (!defined(bias) || bias->sizes() == weight.sizes().slice(0, 1));
}

// (grad_input, grad_weight, grad_bias) of y = input @ weight.T + bias, each
// only where mask asks for it (undefined otherwise); written with ops autograd
// differentiates (create_graph=True runs it as it is).
std::tuple<at::Tensor, at::Tensor, at::Tensor> linearBackwardFormula(const at::Tensor& input, const at::Tensor& grad,
                                                                      const at::Tensor& weight,
                                                                      std::array<bool, 3> mask) {
  const auto rows = grad.reshape({-1, grad.size(-1)});
  return {mask[0] ? grad.matmul(weight) : at::Tensor(),
          mask[1] ? rows.t().matmul(input.reshape({-1, input.size(-1)})) : at::Tensor(),
          mask[2] ? rows.sum(0) : at::Tensor()};
}

DirectOp kLinearBackward("linear_backward");

// linear_backward on the device: the formula on host aliases, its results
// (matmul and sum results: contiguous) allocated by the device allocator and
// adopted without a copy.
std::tuple<at::Tensor, at::Tensor, at::Tensor> linearBackward(const at::Tensor& input, const at::Tensor& grad,
                                                               const at::Tensor& weight, std::array<bool, 3> mask) {
  auto call = kLinearBackward.enter(input, grad, weight, mask);
  runQueuedEndingWith(kLinearBackward.handle());
  const auto device = grad.device().index();
  std::tuple<at::Tensor, at::Tensor, at::Tensor> host;
  {
    CaptureScope capture(device);
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // plain CPU kernels: nothing to differentiate
    host = linearBackwardFormula(hostOperand(input), hostOperand(grad), hostOperand(weight), mask);
  }
  return adoptKernelResults(host, device);
}

DirectOp kLinear("linear");

// Whether the call is one float32 row through a row-major weight on one core:
// what Gemv.cpp computes.
bool isOneRow(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const auto f32 = [&](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.device() == input.device() && !t.is_neg();
  };
  if (input.device().type() != kNeuron || !f32(input) || !f32(weight) || weight.dim() != 2 || input.dim() == 0 ||
      !weight.is_contiguous() || weight.size(1) == 0 || input.size(-1) != weight.size(1) || input.stride(-1) != 1 ||
      c10::multiply_integers(input.sizes().slice(0, input.dim() - 1)) != 1) {
    return false;
  }
  return !defined(bias) || (f32(*bias) && bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->stride(0) == 1);
}

// linear on the device: Gemv.cpp's loop for one row, the alias kernel (the
// composite on host aliases) for everything else, errors included.
at::Tensor linearKernel(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!isOneRow(input, weight, bias)) {
    return kLinear.runGeneric(input, weight, bias);
  }
  auto call = kLinear.enter(input, weight, bias);
  if (concatenationEnabled()) {
    if (at::Tensor queued = queueLinearRow(kLinear, input, weight, bias); queued.defined()) {
      return queued;
    }
  }
  runQueuedEndingWith(kLinear.handle());
  const auto device = input.device().index();
  CaptureScope capture(device);
  const at::Tensor x = hostAlias(input);
  const at::Tensor w = hostAlias(weight);
  const at::Tensor b = defined(bias) ? hostAlias(*bias) : at::Tensor();
  auto sizes = input.sizes().vec();
  sizes.back() = weight.size(0);
  at::Tensor out = at::empty(sizes, x.options());
  gemv(w.const_data_ptr<float>(), x.const_data_ptr<float>(), b.defined() ? b.const_data_ptr<float>() : nullptr,
       out.mutable_data_ptr<float>(), weight.size(0), weight.size(1));
  return adoptKernelResult(out, device);
}

// The device's linear kernel, called below autograd (from the Function's
// forward too, which would otherwise come back here).
at::Tensor belowAutograd(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  at::AutoDispatchBelowAutograd guard;
  return at::linear(input, weight, bias);
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = defined(bias);
    return belowAutograd(input, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& grad = grads[0];
    const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                      ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)};
    // create_graph=True: the formula, which autograd differentiates; else one kernel.
    auto [grad_input, grad_weight, grad_bias] = at::GradMode::is_enabled()
                                                    ? linearBackwardFormula(input, grad, weight, mask)
                                                    : at::linear_backward(input, grad, weight, mask);
    return {grad_input, grad_weight, grad_bias};
  }
};

// Whether PyTorch's composite would copy `input` into one matrix first: its
// matmul folds an input of 3 or more dims into a matrix whenever the weight
// requires grad (ATen's should_fold: otherwise the weight's gradient is a batch
// of products), with a copy when the input is not one matrix in memory already
// (a contiguous one takes linear's flattened path, no copy). Below autograd,
// where the device's linear kernel runs the composite, the weight no longer
// requires grad, so the fold is done here, as PyTorch does it: otherwise every
// row of the batch is multiplied by an expanded weight (nn.MultiheadAttention's
// batch_first in-projection, [seq, batch, embed] through a transpose, took one
// bmm of 3.5 ms where the CPU copies and runs one mm of 2.1 ms: bench_eager's
// transformer step).
bool foldsWithCopy(const at::Tensor& input, const at::Tensor& weight) {
  return weight.requires_grad() && input.dim() >= 3 && !input.is_contiguous();
}

at::Tensor linearAutograd(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (keepsComposite(input, weight, bias)) {
    return at::native::linear(input, weight, bias);
  }
  const bool needs_grad = at::GradMode::is_enabled() &&
                          (input.requires_grad() || weight.requires_grad() || (defined(bias) && bias->requires_grad()));
  if (!needs_grad) {
    return belowAutograd(input, weight, bias);
  }
  if (!hasLinearBackward(input, weight, bias)) {  // a 1-D weight: differentiate the composite
    return at::native::linear(input, weight, bias);
  }
  if (foldsWithCopy(input, weight)) {
    auto sizes = input.sizes().vec();
    sizes.back() = weight.size(0);
    return at::_unsafe_view(LinearFunction::apply(input.reshape({-1, input.size(-1)}), weight, bias), sizes);
  }
  return LinearFunction::apply(input, weight, bias);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("linear", TORCH_FN(linearAutograd));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  kLinear.registerKernel(m, linearKernel);
  kLinearBackward.registerKernel(m, linearBackward);
}

} // namespace torch_neuronx
