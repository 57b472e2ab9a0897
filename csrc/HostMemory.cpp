#include "HostMemory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace torch_neuronx {
namespace {

void lower(HostMemoryLimit& limit, int64_t available, const char* source) {
  if (available < 0) {
    available = 0;
  }
  if (limit.available < 0 || available < limit.available) {
    limit.available = available;
    limit.source = source;
  }
}

// MemAvailable: what the kernel can give without swapping (Linux >= 3.14).
int64_t memAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      return kib * 1024;
    }
  }
  return -1;
}

// cgroup v2: memory.max - memory.current of this process's cgroup ("max": no limit).
int64_t cgroupRoom() {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) != 0) {
      continue;  // cgroup v1 hierarchies: not read
    }
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    std::ifstream max_file(dir + "/memory.max");
    std::ifstream current_file(dir + "/memory.current");
    std::string max_text;
    int64_t current = 0;
    if (!(max_file >> max_text) || max_text == "max" || !(current_file >> current)) {
      return -1;
    }
    return std::stoll(max_text) - current;
  }
  return -1;
}

// RLIMIT_AS minus this process's address space now (/proc/self/statm: pages).
int64_t addressSpaceRoom() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return -1;
  }
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  if (!(statm >> pages)) {
    return -1;
  }
  return static_cast<int64_t>(limit.rlim_cur) - pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

} // namespace

HostMemoryLimit hostMemoryLimit() {
  HostMemoryLimit limit;
  const int64_t available = memAvailable();
  if (available >= 0) {
    lower(limit, available, "MemAvailable");
  }
  const int64_t cgroup = cgroupRoom();
  if (cgroup != -1) {
    lower(limit, cgroup, "cgroup memory.max");
  }
  const int64_t address_space = addressSpaceRoom();
  if (address_space != -1) {
    lower(limit, address_space, "RLIMIT_AS");
  }
  return limit;
}

} // namespace torch_neuronx
