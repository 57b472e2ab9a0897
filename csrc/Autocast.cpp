// Autocast for device_type="neuron": the same op lists as CUDA's (matmuls and
// convolutions in the lower precision, numerically sensitive ops in fp32,
// mixed-input ops promoted) and the same banned op, registered under
// AutocastPrivateUse1.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using at::Tensor;
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;

#define NEURON_LOW_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define NEURON_DIFFERENT_SIGNATURE(FUNC, NAME, SIGNATURE, REDISPATCH, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(FUNC, NAME, SIGNATURE, REDISPATCH, POLICY)

// binary_cross_entropy in a lower precision is unsafe (its input is usually a
// sigmoid's output, which saturates): CUDA and Trainium refuse it, in CUDA's words.
Tensor binaryCrossEntropyBanned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
      "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
      "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
      "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
      "safe to autocast.");
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOW_PRECISION)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(NEURON_DIFFERENT_SIGNATURE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binaryCrossEntropyBanned));
}

// Ops outside the lists run unchanged under autocast.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

} // namespace
