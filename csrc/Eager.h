// Eager execution on the emulated NeuronCore.
//
// Native ops (the registry in torch_neuronx/ops/) run PyTorch's CPU kernel
// directly on the device memory: every device tensor argument is re-wrapped as
// a CPU tensor over the same bytes (no copy), results allocated by the kernel
// land in device memory (see CaptureScope) and are adopted as device tensors.
// Every other op takes the fallback path: copied to real CPU tensors, run,
// copied back, with a once-per-op warning and a record in the op tracker.
//
// Host memory vocabulary (C++ and the _C bindings use these words only):
//
//   host alias     A CPU tensor over the bytes of a neuron tensor: same
//                  memory, same geometry, no copy. It does not own the
//                  memory; the neuron tensor must outlive it.
//                  hostAlias() / _C._host_alias.
//   owning host alias
//                  A host alias that holds a reference to the neuron
//                  tensor's storage, so the device memory lives as long as
//                  the alias (handed to code that keeps it, e.g. gloo).
//                  owningHostAlias() / _C._owning_host_alias.
//   host operand   What a CPU kernel is given for a tensor argument: the host
//                  alias of a neuron tensor, a CPU tensor itself.
//                  hostOperand().
//   adopt          Make a CPU tensor's memory the memory of a new neuron
//                  tensor (the reverse direction), without a copy when
//                  possible:
//                  - adoptKernelResult(): the result of a CPU kernel run
//                    under a CaptureScope, whose memory came from the device
//                    allocator (and is counted in its statistics);
//                  - adoptExternal() / _C._adopt_external: memory produced
//                    outside PyTorch (an XLA result received by DLPack),
//                    owned by its producer and not counted.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "Recorder.h"

#include <array>
#include <atomic>
#include <map>
#include <string>

namespace torch_neuronx {

// Per-op flags given by the Python registry (exported to Python as
// _C._op_flags).
enum OpFlags : int {
  kCrossDevice = 1,      // copies and host-indexed ops: tensors may live anywhere
  kExactFp64 = 2,        // data movement: float64 is copied, never rounded; writes views of any strides
  kEndsFusedSequence = 4,  // matmul-class: ends a queued sequence, joining it (Concatenation.h)
};

// The host alias of `tensor` (a neuron tensor).
at::Tensor hostAlias(const at::Tensor& tensor);

// The host alias of a neuron tensor, a CPU tensor itself.
at::Tensor hostOperand(const at::Tensor& tensor);

// hostOperand(tensor) for a kernel that is also given `alias`, the host alias
// of `aliased`: over alias's storage when `tensor` shares aliased's device
// storage, so the CPU kernel sees how the two overlap as it would on CPU
// tensors (PyTorch refuses an output that partly overlaps an input).
at::Tensor hostOperandWith(const at::Tensor& tensor, const at::Tensor& aliased, const at::Tensor& alias);

// A host alias keeping the neuron tensor's storage alive.
at::Tensor owningHostAlias(const at::Tensor& tensor);

// A neuron tensor on `device` owning the result `cpu` of a CPU kernel: no copy
// when its memory came from the device allocator (a CaptureScope was active),
// a copy into device memory otherwise.
at::Tensor adoptKernelResult(const at::Tensor& cpu, c10::DeviceIndex device);

// adoptKernelResult of each of a kernel's three results (a backward's gradients,
// layer norm's output and statistics); one it did not compute (undefined) stays so.
std::tuple<at::Tensor, at::Tensor, at::Tensor> adoptKernelResults(
    const std::tuple<at::Tensor, at::Tensor, at::Tensor>& cpu, c10::DeviceIndex device);

// A neuron tensor on `device` taking over the memory of a CPU tensor produced
// outside PyTorch's kernels: no copy when the CPU tensor is the only owner of
// its storage. Not counted in the allocator's statistics.
at::Tensor adoptExternal(const at::Tensor& cpu, c10::DeviceIndex device);

// Registers the alias kernel for each (name.overload, flags).
void registerNativeOps(const std::vector<std::pair<std::string, int>>& ops);
// Flags of overloads that a kernel of their own serves in front of the alias kernel
// (csrc/MaskIndex.cpp: registry.MASK_INDEX_OVERLOADS), which reaches it through runNative.
void recordOpFlags(const std::vector<std::pair<std::string, int>>& ops);

// Registers the CPU fallback as the kernel of these overloads ("name.overload") for
// the neuron key, so a call is counted and recorded under the op the program called
// (a composite's or a structured op's generic path would reach the boxed fallback
// only through another overload, e.g. linalg_qr.out for linalg_qr).
void registerFallbackOps(const std::vector<std::string>& names);

// Runs a native op through the generic alias path (boxed).
void runNative(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// True when `tensor` is float64/complex128 and the fp64 rule (compute in
// fp32) is in force: such calls need the generic path.
bool needsFp64Emulation(const at::Tensor& tensor);

// An aten op with a kernel of its own (Kernels.cpp, FastOps.cpp) instead of
// the generic alias kernel. Its schema name is written once, here, and names
// both the registration and the op's counter in get_executed_ops(), so the two
// cannot drift apart; an op that does not exist fails when the extension
// loads, instead of silently making a counter no op ever reaches.
class DirectOp {
 public:
  // `schema`: "name.overload" (or "name") in the aten namespace.
  explicit constexpr DirectOp(const char* schema) : schema_(schema) {}

  // Registers `kernel` for this op with `library` (aten, PrivateUse1).
  template <class Kernel>
  void registerKernel(torch::Library& library, Kernel&& kernel) {
    bind();
    library.impl(schema_, std::forward<Kernel>(kernel));
  }

  // One call of the op on the device: counted, and recorded (for the audit,
  // for torch.profiler) until the returned object goes out of scope. The
  // arguments are boxed only while one of them is on.
  template <class... Args>
  [[nodiscard]] RecordedCall enter(const Args&... args) const {
    counter_->fetch_add(1, std::memory_order_relaxed);
    if (activeHooks() == 0) {
      return RecordedCall();
    }
    std::array<c10::IValue, sizeof...(Args)> boxed{c10::IValue(args)...};
    return RecordedCall(*handle_, boxed.data(), boxed.size(), CallPath::Direct);
  }

  // The dispatcher's handle, for calls that take the generic alias path.
  const c10::OperatorHandle& handle() const {
    return *handle_;
  }

  // A call that a kernel of its own hands to the generic alias path (counted and
  // recorded there): its results, on the stack.
  template <class... Args>
  torch::jit::Stack runGenericStack(Args&&... args) const {
    torch::jit::Stack stack;
    stack.reserve(sizeof...(Args));
    (stack.emplace_back(std::forward<Args>(args)), ...);
    runNative(*handle_, &stack);
    return stack;
  }

  // runGenericStack's one tensor result.
  template <class... Args>
  at::Tensor runGeneric(Args&&... args) const {
    return std::move(runGenericStack(std::forward<Args>(args)...).back()).toTensor();
  }

 private:
  void bind();  // looks up the op (throws if it does not exist) and its counter

  const char* schema_;
  const c10::OperatorHandle* handle_ = nullptr;  // leaked, like every registration
  std::atomic<int64_t>* counter_ = nullptr;
};

// A contiguous float32 tensor without a conjugate or negative bit: what the
// device's own loops read (Concatenation.cpp, Dropout.cpp, Gelu.cpp).
inline bool plainFloat(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.is_contiguous() && !t.is_neg() && !t.is_conj();
}

// Op tracking: call counts of every op run on the device, and of the subset
// that took the CPU fallback path.
std::map<std::string, int64_t> executedOps();
// The get_executed_ops() counter of `name` (created on first use; never freed).
std::atomic<int64_t>* executedCounter(const std::string& name);
std::map<std::string, int64_t> fallbackOps();
void clearOpTracking();

} // namespace torch_neuronx
