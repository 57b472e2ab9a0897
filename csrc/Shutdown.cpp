// What must happen before the interpreter shuts down.
#include "Runtime.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

namespace torch_neuronx {

// PyTorch's autograd engine runs the backward of neuron tensors on one worker
// thread per core. The worker can still hold the last reference to a finished
// backward's GraphTask after backward() has returned; dropping it releases the
// Python context that torch.autograd stashed in it, which needs the GIL. Once
// Python is finalizing, taking the GIL ends the thread with pthread_exit,
// whose unwinding through that noexcept destructor aborts the process
// ("terminate called without an active exception", exit code 134). Running one
// tiny backward on every core makes each worker finish what it held first.
// Called (GIL released) from an atexit handler, while Python is still whole.
void drainAutogradWorkers() {
  if (!isInitialized() || isInBadFork()) {
    return;  // no neuron tensor, so no neuron backward, ever ran here
  }
  at::AutoGradMode grad(true);
  for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
    // C++-only tensors: nothing this backward leaves behind needs Python.
    auto leaf = at::zeros({}, at::TensorOptions().device(kNeuron, i)).requires_grad_(true);
    torch::autograd::backward({leaf.mul(2)});
  }
}

} // namespace torch_neuronx
