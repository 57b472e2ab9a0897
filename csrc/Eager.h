// Eager execution on the emulated NeuronCore.
//
// Native ops (the registry in torch_neuronx/ops/) run PyTorch's CPU kernel
// directly on the device memory: every device tensor argument is re-wrapped as
// a CPU tensor over the same bytes (no copy), results allocated by the kernel
// land in device memory (see CaptureScope) and are adopted as device tensors.
// Every other op takes the fallback path: copied to real CPU tensors, run,
// copied back, with a once-per-op warning and a record in the op tracker.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <map>
#include <string>

namespace torch_neuronx {

// Per-op flags given by the Python registry (exported to Python as
// _C._op_flags).
enum OpFlags : int {
  kCrossDevice = 1,      // copies and host-indexed ops: tensors may live anywhere
  kExactFp64 = 2,        // data movement: float64 is copied, never rounded
};

// A CPU tensor over the same memory as `tensor` (a neuron tensor).
at::Tensor cpuAlias(const at::Tensor& tensor);

// cpuAlias for a neuron tensor, the tensor itself for a CPU one: the host
// operand of a kernel that runs PyTorch's CPU implementation.
at::Tensor hostView(const at::Tensor& tensor);

// cpuAlias whose storage holds a reference to the device storage, so the
// device memory lives as long as the view (handed to gloo, kept by a Work).
at::Tensor owningHostView(const at::Tensor& tensor);

// A neuron tensor owning the result `cpu` of a CPU kernel run on `device`:
// adopted without a copy when its memory came from the device allocator.
at::Tensor adoptOnDevice(const at::Tensor& cpu, c10::DeviceIndex device);

// A neuron tensor taking over the memory of a CPU tensor produced outside
// PyTorch's kernels (an XLA result received by DLPack): no copy when the CPU
// tensor is the only owner of its storage. Such memory is owned by its
// producer, so it is not counted in the allocator's statistics.
at::Tensor adoptHost(const at::Tensor& cpu, c10::DeviceIndex device);

// Registers the alias kernel for each (name.overload, flags).
void registerNativeOps(const std::vector<std::pair<std::string, int>>& ops);

// Runs a native op through the generic alias path (boxed).
void runNative(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// True when `tensor` is float64/complex128 and the fp64 rule (compute in
// fp32) is in force: such calls need the generic path.
bool needsFp64Emulation(const at::Tensor& tensor);

// The call counter of one op in get_executed_ops(), for direct kernels.
std::atomic<int64_t>* executedCounter(const std::string& name);

inline void count(std::atomic<int64_t>* counter) {
  counter->fetch_add(1, std::memory_order_relaxed);
}

// Op tracking: call counts of every op run on the device, and of the subset
// that took the CPU fallback path.
std::map<std::string, int64_t> executedOps();
std::map<std::string, int64_t> fallbackOps();
void clearOpTracking();

} // namespace torch_neuronx
