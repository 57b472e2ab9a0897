// The emulated NeuronCore runtime: how many logical cores exist, how much HBM
// each has, which one the calling thread uses, and the process-wide policies
// (fallback, fp64) that the dispatch path consults on every op.
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_neuronx {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;
// c10::DeviceIndex is int8_t: a device count of 128 would not fit (it reads as -128).
// torch_neuronx/neuron/profiles.py (MAX_CORES_PER_PROCESS) refuses more at import.
constexpr int kMaxDevices = 127;

// What to do with an op that is outside the native op set (exported to
// Python by name as _C._fallback_modes).
enum class FallbackMode : int { Warn = 0, Silent = 1, Error = 2 };

// How float64 arithmetic is done: as on Trainium (in fp32) or natively
// (exported as _C._fp64_modes).
enum class Fp64Mode : int { Emulate = 0, Native = 1 };

// Set once from Python (the instance profile) before the first device use.
void configure(int64_t num_devices, std::vector<int64_t> capacity_bytes);
c10::DeviceIndex deviceCount() noexcept;
int64_t deviceCapacity(c10::DeviceIndex index);

c10::DeviceIndex currentDevice();
void setCurrentDevice(c10::DeviceIndex index);
c10::DeviceIndex exchangeDevice(c10::DeviceIndex index);
void checkDeviceIndex(c10::DeviceIndex index);

// Lazy initialization: the runtime "starts" on first use (first allocation or
// an explicit torch.neuron.init()). After a fork, a child of an initialized
// parent cannot use the device (as with CUDA).
void lazyInit();
bool isInitialized();
bool isInBadFork();

// Lets autograd's neuron worker threads finish before Python shuts down (Shutdown.cpp).
void drainAutogradWorkers();

FallbackMode fallbackMode();
void setFallbackMode(FallbackMode mode);
Fp64Mode fp64Mode();
void setFp64Mode(Fp64Mode mode);

} // namespace torch_neuronx
