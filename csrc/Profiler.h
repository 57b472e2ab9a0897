// Device activity for torch.profiler (ProfilerActivity.PrivateUse1).
//
// A Kineto child profiler, registered through PyTorch's PrivateUse1 profiler
// registry, records one device event per kernel the emulated NeuronCore runs:
// eager ops (hooked where the audit's recorder is, csrc/Recorder.h), compiled
// graph runs and NKI kernels (reported from Python through the _C bindings).
// Each event carries its core, stream, start and duration, and the
// correlation id of the CPU op that launched it, so PyTorch links it to that op
// (device time columns in key_averages(), one track per core and stream in the
// Chrome trace). The emulator runs kernels synchronously on the host: an
// event's duration is the host time of the kernel.
//
// While no profile is active, the cost on the eager path is nothing beyond the
// recorder's one relaxed atomic load (the two share one flag word).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torch_neuronx::profiler {

// One kernel run on a core, as recorded (times in ns since the epoch, the
// clock Kineto uses).
struct KernelEvent {
  std::string name;
  c10::DeviceIndex device = 0;
  int64_t stream = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t correlation = 0;       // the launching CPU op's, 0 if none
  uint64_t user_correlation = 0;  // the enclosing record_function's, 0 if none
  // The first op the kernel's own code called (see watchLaunch), 0 if none.
  uint64_t first_child = 0;
  std::vector<std::pair<std::string, std::string>> args;  // shown in the trace (values are JSON)
};

// True while a profile with PrivateUse1 activity is recording.
bool collecting();

// The current time on the trace's clock.
int64_t nowNs();

// The calling thread's innermost CPU op and record_function correlation ids.
std::pair<uint64_t, uint64_t> currentCorrelation();

// Around an eager kernel: notes the first op its own code calls. PyTorch
// merges an op with a same-named op it calls (aten::sum calling aten::sum with
// other arguments) and keeps the inner one's kernels, so a kernel launched by
// the outer op is linked to that inner op instead (resolved in the trace,
// where the names are known).
void watchLaunch();
uint64_t firstChildOfLaunch();

// Appends an event to the active profile (dropped when none is recording).
void record(KernelEvent event);

// Registers the profiler with PyTorch, and the legacy PrivateUse1 stubs of
// torch.autograd.profiler.profile(use_device="neuron", use_kineto=False)
// (once; called when _C loads).
void registerProfiler();

} // namespace torch_neuronx::profiler
