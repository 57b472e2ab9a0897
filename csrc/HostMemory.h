// The host's memory, which holds the emulated HBM: how much more this process
// can allocate before the machine (not the emulated device) runs out.
#pragma once

#include <cstdint>
#include <string>

namespace torch_neuronx {

struct HostMemoryLimit {
  int64_t available = -1;  // bytes this process can still get; -1: unknown
  std::string source;      // which limit is the smallest: "MemAvailable", "cgroup memory.max", "RLIMIT_AS"
};

// The smallest of: the kernel's estimate of memory available without swapping
// (/proc/meminfo MemAvailable), the room left under this process's cgroup v2
// memory.max, and the room left under its address-space limit (RLIMIT_AS).
// Reads a few small files: called for new large segments only.
HostMemoryLimit hostMemoryLimit();

} // namespace torch_neuronx
