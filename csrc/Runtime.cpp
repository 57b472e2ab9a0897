#include "Runtime.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <pthread.h>

namespace torch_neuronx {
namespace {

std::atomic<int64_t> g_num_devices{0};
// Trivially destructible: allocations on threads still running at exit read it.
std::array<int64_t, kMaxDevices> g_capacity{};
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_in_bad_fork{false};
std::atomic<int> g_fallback_mode{static_cast<int>(FallbackMode::Warn)};
std::atomic<int> g_fp64_mode{static_cast<int>(Fp64Mode::Emulate)};
thread_local c10::DeviceIndex t_current_device = 0;

void markChildAfterFork() {
  g_in_bad_fork = true;
}

} // namespace

void configure(int64_t num_devices, std::vector<int64_t> capacity_bytes) {
  TORCH_CHECK(
      !g_initialized,
      "The Neuron runtime is already initialized; the instance profile, "
      "NEURON_LOGICAL_NC_CONFIG and NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES must be set "
      "before the first device use.");
  TORCH_CHECK(
      static_cast<int64_t>(capacity_bytes.size()) == num_devices,
      "configure: need one capacity per device");
  TORCH_CHECK(
      num_devices >= 0 && num_devices <= kMaxDevices,
      "configure: at most ", kMaxDevices, " NeuronCores per process");
  std::copy(capacity_bytes.begin(), capacity_bytes.end(), g_capacity.begin());
  g_num_devices = num_devices;
}

c10::DeviceIndex deviceCount() noexcept {
  return static_cast<c10::DeviceIndex>(g_num_devices.load());
}

int64_t deviceCapacity(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  return g_capacity[index];
}

void checkDeviceIndex(c10::DeviceIndex index) {
  // AWS's wording first, then where the count comes from.
  TORCH_CHECK(
      index >= 0 && index < deviceCount(),
      "Device index ", static_cast<int>(index), " is out of range. Valid range is 0 to ",
      static_cast<int>(deviceCount()) - 1, " for this process (it sees ",
      static_cast<int>(deviceCount()), " NeuronCore(s): see TORCH_NEURONX_INSTANCE, "
      "NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES and NEURON_RT_NUM_CORES).");
}

c10::DeviceIndex currentDevice() {
  return t_current_device;
}

void setCurrentDevice(c10::DeviceIndex index) {
  checkDeviceIndex(index);
  t_current_device = index;
}

c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) {
  auto previous = t_current_device;
  if (index != previous) {
    setCurrentDevice(index);
  }
  return previous;
}

void lazyInit() {
  TORCH_CHECK(
      !g_in_bad_fork,
      "Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron "
      "with multiprocessing, use the 'spawn' start method");
  if (g_initialized.load(std::memory_order_acquire)) {
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr, &markChildAfterFork);
    g_initialized.store(true, std::memory_order_release);
  });
}

bool isInitialized() {
  return g_initialized;
}

bool isInBadFork() {
  return g_in_bad_fork;
}

FallbackMode fallbackMode() {
  return static_cast<FallbackMode>(g_fallback_mode.load(std::memory_order_relaxed));
}

void setFallbackMode(FallbackMode mode) {
  g_fallback_mode = static_cast<int>(mode);
}

Fp64Mode fp64Mode() {
  return static_cast<Fp64Mode>(g_fp64_mode.load(std::memory_order_relaxed));
}

void setFp64Mode(Fp64Mode mode) {
  g_fp64_mode = static_cast<int>(mode);
}

} // namespace torch_neuronx
