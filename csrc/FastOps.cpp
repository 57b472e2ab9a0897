// Hot kernel paths: the elementwise arithmetic that dominates eager training
// loops, called unboxed and straight into PyTorch's CPU kernels. Saves the
// boxing and the second trip through the dispatcher that the generic alias
// path pays (about 1 us per call on a tiny tensor). Anything unusual (mixed
// devices, CPU scalars, float64 under the fp32 rule) takes the generic path,
// so semantics are those of csrc/Eager.cpp.
#include "Allocator.h"
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

// The core `self` lives on, or -1 when the call needs the generic path.
// `other` may be on the same core or a CPU scalar (a wrapped Python number).
c10::DeviceIndex sameCore(const at::Tensor& self, const at::Tensor& other) {
  if (self.device().type() != kNeuron || needsFp64Emulation(self)) {
    return -1;
  }
  if (other.device() == self.device()) {
    return needsFp64Emulation(other) ? -1 : self.device().index();
  }
  return other.device().is_cpu() && other.dim() == 0 ? self.device().index() : -1;
}

const c10::OperatorHandle& handle(const char* name, const char* overload) {
  // Leaked on purpose, like every dispatcher registration here.
  auto* op = new c10::OperatorHandle(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload));
  return *op;
}

template <class... Args>
at::Tensor generic(const c10::OperatorHandle& op, Args&&... args) {
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(std::forward<Args>(args)), ...);
  runNative(op, &stack);
  return std::move(stack.back()).toTensor();
}

// One out-of-place and one in-place kernel per binary op. CpuOp / CpuInplace
// are PyTorch's CPU kernels; the op handles serve the generic path.
#define NEURON_BINARY_WITH_ALPHA(NAME)                                                       \
  at::Tensor NAME##Tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) { \
    static const auto& op = handle("aten::" #NAME, "Tensor");                                \
    static auto* counter = executedCounter("aten::" #NAME ".Tensor");                        \
    const auto core = sameCore(self, other);                                                 \
    if (core < 0) {                                                                          \
      return generic(op, self, other, alpha);                                                \
    }                                                                                        \
    count(counter);                                                                          \
    CaptureScope capture(core);                                                              \
    return adoptKernelResult(at::cpu::NAME(hostAlias(self), hostOperand(other), alpha), core);       \
  }                                                                                          \
  at::Tensor& NAME##Inplace(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) { \
    static const auto& op = handle("aten::" #NAME "_", "Tensor");                            \
    static auto* counter = executedCounter("aten::" #NAME "_.Tensor");                       \
    if (sameCore(self, other) < 0) {                                                         \
      generic(op, self, other, alpha);                                                       \
      return self;                                                                           \
    }                                                                                        \
    count(counter);                                                                          \
    at::Tensor alias = hostAlias(self);                                                       \
    at::cpu::NAME##_(alias, hostOperand(other), alpha);                                         \
    return self;                                                                             \
  }

#define NEURON_BINARY(NAME)                                                                  \
  at::Tensor NAME##Tensor(const at::Tensor& self, const at::Tensor& other) {                 \
    static const auto& op = handle("aten::" #NAME, "Tensor");                                \
    static auto* counter = executedCounter("aten::" #NAME ".Tensor");                        \
    const auto core = sameCore(self, other);                                                 \
    if (core < 0) {                                                                          \
      return generic(op, self, other);                                                       \
    }                                                                                        \
    count(counter);                                                                          \
    CaptureScope capture(core);                                                              \
    return adoptKernelResult(at::cpu::NAME(hostAlias(self), hostOperand(other)), core);              \
  }                                                                                          \
  at::Tensor& NAME##Inplace(at::Tensor& self, const at::Tensor& other) {                     \
    static const auto& op = handle("aten::" #NAME "_", "Tensor");                            \
    static auto* counter = executedCounter("aten::" #NAME "_.Tensor");                       \
    if (sameCore(self, other) < 0) {                                                         \
      generic(op, self, other);                                                              \
      return self;                                                                           \
    }                                                                                        \
    count(counter);                                                                          \
    at::Tensor alias = hostAlias(self);                                                       \
    at::cpu::NAME##_(alias, hostOperand(other));                                                \
    return self;                                                                             \
  }

NEURON_BINARY_WITH_ALPHA(add)
NEURON_BINARY_WITH_ALPHA(sub)
NEURON_BINARY(mul)
NEURON_BINARY(div)

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("add.Tensor", addTensor);
  m.impl("add_.Tensor", addInplace);
  m.impl("sub.Tensor", subTensor);
  m.impl("sub_.Tensor", subInplace);
  m.impl("mul.Tensor", mulTensor);
  m.impl("mul_.Tensor", mulInplace);
  m.impl("div.Tensor", divTensor);
  m.impl("div_.Tensor", divInplace);
}

} // namespace torch_neuronx
