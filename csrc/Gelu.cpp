// GELU on the device: gelu and gelu_backward of small float32 tensors through
// ATen's own GELU loops (its GeluKernel / GeluBackwardKernel dispatch stubs,
// which PyTorch's CPU op runs where oneDNN is off or not applicable).
//
// PyTorch's CPU gelu (exact form) and its backward hand a contiguous float32
// tensor of more than one element to oneDNN's eltwise primitive, which the
// device inherited through the alias kernel: about 6 us of fixed cost per call
// (F.gelu on 16 floats 7.2 us, through ATen's loop 1.6 us; its backward 15 us
// vs 3 us). ATen's loops evaluate the formula elementwise and, below PyTorch's
// grain size, on one thread. oneDNN is faster on large tensors (1 Mi floats:
// 487 us vs 722 us), so from kMaxElements on the alias kernel runs it as
// before, as do other dtypes, layouts and mixed or shape-mismatched operands.
// Either way the results agree with PyTorch's CPU op within float32 tolerance
// (oneDNN's code depends on the host's instruction set; ATen's loops on its CPU
// capability).
//
// ATen's dispatch stubs are declared with one function pointer per CPU
// capability that libtorch_cpu was built with; these say which (PyTorch's x86-64
// builds have AVX2 and AVX-512 kernels), so that the stub's inline call matches
// the library's exported DispatchStubImpl::get_call_ptr. Other architectures'
// builds differ (SVE, VSX, ...): there the alias kernel serves every call.
#if defined(__x86_64__)
#define NEURON_ATEN_GELU_LOOPS 1
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#else
#define NEURON_ATEN_GELU_LOOPS 0
#endif
#include "Allocator.h"
#include "Concatenation.h"
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/Activation.h>
#include <torch/library.h>

#include <string_view>

namespace torch_neuronx {
namespace {

DirectOp kGelu("gelu");
DirectOp kGeluBackward("gelu_backward");

// Below this many elements ATen's loop is the faster (8 Ki floats: 7.0 us vs
// oneDNN's 10.5 us; 32 Ki: 23.9 vs 21.6 us, on one thread).
constexpr int64_t kMaxElements = 16384;

// A contiguous float32 neuron tensor small enough for ATen's loop.
bool loopApplies(const at::Tensor& t) {
  return NEURON_ATEN_GELU_LOOPS && t.device().type() == kNeuron && plainFloat(t) && t.numel() < kMaxElements;
}

// gelu and gelu_backward queued (float32): the call's result, or an undefined
// tensor (run it now). The approximation's name is checked first (PyTorch's error).
at::Tensor queued(const DirectOp& op, std::string_view approximate, bool backward, const at::Tensor& self,
                  const at::Tensor* input) {
  if (!concatenationEnabled()) {
    return at::Tensor();
  }
  const bool tanh = at::native::get_gelutype_enum(approximate) == at::native::GeluType::Tanh;
  const QueuedOp kind = backward ? (tanh ? QueuedOp::GeluTanhBackward : QueuedOp::GeluBackward)
                                 : (tanh ? QueuedOp::GeluTanh : QueuedOp::Gelu);
  return queueTensors(kind, op, self, input, nullptr, 0.0);
}

at::Tensor gelu(const at::Tensor& self, std::string_view approximate) {
  if (at::Tensor out = queued(kGelu, approximate, false, self, nullptr); out.defined()) {
    auto call = kGelu.enter(self, approximate);
    return out;
  }
  if (!loopApplies(self)) {
    return kGelu.runGeneric(self, approximate);
  }
  const auto type = at::native::get_gelutype_enum(approximate);  // PyTorch's error for another string
  auto call = kGelu.enter(self, approximate);
  const auto device = self.device().index();
  CaptureScope capture(device);
  at::Tensor x = hostAlias(self);
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
#if NEURON_ATEN_GELU_LOOPS
  auto iter = at::TensorIterator::unary_op(out, x);
  at::native::GeluKernel(at::kCPU, iter, type);
#endif
  return adoptKernelResult(out, device);
}

at::Tensor geluBackward(const at::Tensor& grad, const at::Tensor& self, std::string_view approximate) {
  if (at::Tensor out = queued(kGeluBackward, approximate, true, grad, &self); out.defined()) {
    auto call = kGeluBackward.enter(grad, self, approximate);
    return out;
  }
  if (!loopApplies(self) || !loopApplies(grad) || grad.device() != self.device() ||
      !grad.sizes().equals(self.sizes())) {
    return kGeluBackward.runGeneric(grad, self, approximate);
  }
  const auto type = at::native::get_gelutype_enum(approximate);
  auto call = kGeluBackward.enter(grad, self, approximate);
  const auto device = self.device().index();
  CaptureScope capture(device);
  at::Tensor g = hostAlias(grad);
  at::Tensor x = hostAlias(self);
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
#if NEURON_ATEN_GELU_LOOPS
  auto iter = at::TensorIterator::binary_op(out, g, x);
  at::native::GeluBackwardKernel(at::kCPU, iter, type);
#endif
  return adoptKernelResult(out, device);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  kGelu.registerKernel(m, gelu);
  kGeluBackward.registerKernel(m, geluBackward);
}

} // namespace torch_neuronx
