#include "DeviceLimits.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace torch_neuronx {
namespace {

std::atomic<bool> g_enforced{false};

// AWS's prefix: the error of a device kernel that the variable kept from
// being retried on the CPU.
[[noreturn]] void throwRefused(const std::string& op, const std::string& reason, const std::string& remedy) {
  TORCH_CHECK(
      false, "CPU fallback disabled because TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1. "
      "Operation ", op, " failed to execute on Neuron: ", reason, " ", remedy,
      " Unset TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS (or set it to 0) to let such "
      "calls run on the CPU.");
}

} // namespace

void setDeviceLimitsEnforced(bool enforced) {
  g_enforced = enforced;
}

bool deviceLimitsEnforced() noexcept {
  return g_enforced.load(std::memory_order_relaxed);
}

void checkContiguousOutput(const std::string& op, const at::Tensor& output, const std::string& argument) {
  if (!deviceLimitsEnforced() || output.is_contiguous()) {
    return;
  }
  throwRefused(
      op, "Cannot process non-contiguous tensors: '" + argument + "' is written in place and is " +
      "a non-contiguous view (sizes " + c10::str(output.sizes()) + ", strides " +
      c10::str(output.strides()) + "); Trainium's kernels write contiguous outputs only.",
      "Compute into a contiguous tensor and copy_ it into the view.");
}

void checkSameCore(
    const std::string& op, c10::Device first, c10::Device second, const std::string& argument) {
  if (!deviceLimitsEnforced() || first == second) {
    return;
  }
  throwRefused(
      op, "Device-to-device copy requires tensors on same Neuron core, got " + first.str() +
      " and " + second.str() + " (argument '" + argument + "').",
      "Move one tensor through the host first (t.cpu().to('" + first.str() + "')).");
}

} // namespace torch_neuronx
