// Device memory: a caching allocator with a per-core capacity (the core's HBM).
//
// Device memory is host memory, 64-byte aligned so that it can be handed to
// XLA through DLPack without a copy. Freed blocks stay cached in a small pool
// (< 1 MiB, 512-byte size classes) or a large pool (>= 1 MiB, four size
// classes per power of two) and are reused; going over the capacity raises
// torch.OutOfMemoryError with CUDA's wording. On request it records a history
// of what it did, in the vocabulary of CUDA's caching allocator, for PyTorch's
// memory visualizer (torch.neuron.memory._record_memory_history).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_neuronx {

// What torch.neuron.memory._record_memory_history asked for; the meaning of
// each field is that of CUDA's allocator (c10::CachingDeviceAllocator).
struct HistorySettings {
  bool enabled = false;  // record a trace of the allocator's actions
  c10::CachingDeviceAllocator::RecordContext context =
      c10::CachingDeviceAllocator::RecordContext::NEVER;  // which actions get a stack
  c10::CachingDeviceAllocator::CreateContextFn recorder = nullptr;  // gathers a stack
  size_t max_entries = 1;  // the trace keeps the newest this many actions
  bool clear = false;      // drop what was recorded so far
  uint32_t skip_actions = 0;  // bit (1 << TraceEntry::Action) set: not recorded
};

// The allocator's state in CUDA's terms: one segment per host allocation
// (holding exactly one block: blocks are never split), sorted by (device,
// address), and each core's trace, oldest action first.
struct MemorySnapshot {
  std::vector<c10::CachingDeviceAllocator::SegmentInfo> segments;
  std::vector<std::vector<c10::CachingDeviceAllocator::TraceEntry>> device_traces;
};

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DataPtr allocateOn(c10::DeviceIndex device, size_t nbytes);
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dst, const void* src, size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Bytes currently allocated on `device` (the allocated_bytes.all.current stat).
  int64_t allocatedBytes(c10::DeviceIndex device);
  // The most bytes allocated on `device` at any moment since the previous
  // call (or since start), then starts a new window. The audit reads it at
  // each step, without touching the peak stats a user may read and reset.
  int64_t takeWindowPeak(c10::DeviceIndex device);

  // True when the DataPtr's memory belongs to this allocator.
  static bool owns(const c10::DataPtr& ptr);

  // Starts, changes or (settings.enabled false) stops and clears the history
  // of every core. With history off, an allocation or a free pays one relaxed
  // atomic load and one test of a flag it already holds the lock for.
  void recordHistory(const HistorySettings& settings);
  // The state of every core; records a "snapshot" action in each trace, as
  // CUDA's allocator does.
  MemorySnapshot snapshot();
};

NeuronAllocator& neuronAllocator();

// While a CaptureScope is alive on a thread, CPU allocations made by that
// thread come from the device allocator of `device`. The eager path uses it so
// that results computed by PyTorch's CPU kernels land in device memory and can
// be adopted by a device tensor without a copy.
class CaptureScope {
 public:
  explicit CaptureScope(c10::DeviceIndex device);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

// Installs the capturing CPU allocator (once).
void installCaptureAllocator();

std::string formatBytes(size_t bytes);

} // namespace torch_neuronx
