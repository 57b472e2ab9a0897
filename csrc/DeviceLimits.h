// What Trainium's device kernels refuse, raised under
// TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS=1.
//
// On Trainium a native op whose device kernel cannot take its arguments (an
// output that is a non-contiguous view, tensors on two NeuronCores) is retried
// on the CPU; with the variable at 1 it raises instead, naming the variable.
// The emulator's kernels are CPU kernels on device memory and could run these
// calls, so the limits are only checked when the variable asks for the
// device's behaviour. Off: one relaxed atomic load per check. Not emulated:
// Trainium's refusal of channels-last in contiguous() and .to(), since its
// empty() and clone() accept it and here all four allocate alike.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace torch_neuronx {

void setDeviceLimitsEnforced(bool enforced);
bool deviceLimitsEnforced() noexcept;

// Each check raises RuntimeError (in AWS's words, then what to do) when the
// limits are enforced and the call breaks them; `op` is the schema name.
void checkContiguousOutput(const std::string& op, const at::Tensor& output, const std::string& argument);
void checkSameCore(
    const std::string& op, c10::Device first, c10::Device second, const std::string& argument);

} // namespace torch_neuronx
