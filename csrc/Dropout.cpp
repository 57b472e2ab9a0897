// Dropout on the device: native_dropout (what F.dropout runs on the device in
// training, as on CUDA and TorchNeuron; the CPU runs its own `_dropout`
// composite instead), native_dropout_backward, and the same masking for
// attention's dropout (torch_neuronx/ops/attention.py, _C._dropout_mask_scale).
//
// PyTorch's CPU kernels compute `x.mul(mask)` with a boolean mask, which first
// converts the whole mask to a float32 tensor (TensorIterator's input
// promotion, an unvectorized conversion: about 290 us for 512 Ki elements here)
// and then multiplies; that cost 1.1 ms of bench_eager's transformer step. The
// loop below reads the mask's bytes directly and computes the same products,
// (x * float(mask)) * float(scale), so the results are PyTorch's bit for bit:
// a dropped inf or NaN gives NaN and a dropped negative number -0.0, as there.
// The mask is still drawn by PyTorch's CPU bernoulli_ from the CPU's default
// generator, the same call PyTorch's kernel makes, so seeded dropout on the
// device drops what it drops with the CPU kernel (TorchNeuron also draws its
// masks on the CPU). Anything but contiguous float32 takes PyTorch's kernels.
#include "Dropout.h"

#include "Allocator.h"
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

DirectOp kNativeDropout("native_dropout");
DirectOp kNativeDropoutBackward("native_dropout_backward");

// GCC vectorizes the loop at -O3 only (a possible overlap of out and x needs a
// run-time check), and only with the mask byte converted as an integer (a
// comparison or a min() keeps it scalar). A boolean tensor's bytes are 0 or 1
// (PyTorch's own conversion of any other byte is undefined). No multiply-add
// to contract.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
void maskScaleLoop(const float* x, const uint8_t* mask, float scale, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = (x[i] * static_cast<float>(static_cast<int32_t>(mask[i]))) * scale;
  }
}

// Whether (x, mask) are what the loop reads: a contiguous float32 tensor and a
// contiguous boolean mask of its shape.
bool loopApplies(const at::Tensor& x, const at::Tensor& mask) {
  return plainFloat(x) && mask.scalar_type() == at::kBool && x.sizes().equals(mask.sizes()) && mask.is_contiguous();
}

// (x * mask) * scale, on CPU tensors (host operands), into a fresh tensor (in
// device memory under a CaptureScope).
at::Tensor maskScale(const at::Tensor& x, const at::Tensor& mask, double scale) {
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  maskScaleLoop(x.const_data_ptr<float>(), static_cast<const uint8_t*>(mask.const_data_ptr()),
                static_cast<float>(scale), out.mutable_data_ptr<float>(), x.numel());
  return out;
}

// PyTorch's native_dropout in training (bernoulli_(1 - p) into a boolean mask
// like the input, then input * mask * 1 / (1 - p)) with the loop; its own
// kernel for everything else (inference, p outside (0, 1), other dtypes or
// layouts).
std::tuple<at::Tensor, at::Tensor> nativeDropoutOnHost(const at::Tensor& input, double p, std::optional<bool> train) {
  if (train.value_or(true) && p > 0 && p < 1 && plainFloat(input)) {
    const double keep = 1. - p;
    at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
    mask.bernoulli_(keep);
    return {maskScale(input, mask, 1. / keep), mask};
  }
  return at::native_dropout(input, p, train);
}

std::tuple<at::Tensor, at::Tensor> nativeDropout(const at::Tensor& input, double p, std::optional<bool> train) {
  auto call = kNativeDropout.enter(input, p, train);
  const auto device = input.device().index();
  if (input.numel() == 0) {
    return {input, at::empty_like(input)};  // as the CPU kernel: no draw, the input itself
  }
  CaptureScope capture(device);
  auto [out, mask] = nativeDropoutOnHost(hostOperand(input), p, train);
  return {adoptKernelResult(out, device), adoptKernelResult(mask, device)};
}

// grad * mask * scale, PyTorch's formula; the alias kernel (PyTorch's CPU
// kernel) for what the loop does not read and under the fp32 rule for float64.
at::Tensor nativeDropoutBackward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  if (grad.device().type() != kNeuron || mask.device() != grad.device() || !loopApplies(grad, mask)) {
    return kNativeDropoutBackward.runGeneric(grad, mask, scale);
  }
  auto call = kNativeDropoutBackward.enter(grad, mask, scale);
  const auto device = grad.device().index();
  CaptureScope capture(device);
  return adoptKernelResult(maskScale(hostAlias(grad), hostAlias(mask), scale), device);
}

} // namespace

at::Tensor dropoutMaskScale(const at::Tensor& x, const at::Tensor& mask, double scale) {
  TORCH_CHECK(x.device().is_cpu() && mask.device().is_cpu(), "_dropout_mask_scale takes host tensors");
  return loopApplies(x, mask) ? maskScale(x, mask, scale) : x.mul(mask).mul_(scale);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  kNativeDropout.registerKernel(m, nativeDropout);
  kNativeDropoutBackward.registerKernel(m, nativeDropoutBackward);
}

} // namespace torch_neuronx
