#include "Guard.h"
#include "Allocator.h"
#include "Concatenation.h"
#include "Recorder.h"
#include "Runtime.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>

namespace torch_neuronx {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  c10::DeviceIndex device;
  bool timing;
  Clock::time_point time;
};

std::array<std::atomic<c10::StreamId>, kMaxDevices> g_next_stream_id{};
thread_local std::array<c10::StreamId, kMaxDevices> t_current_stream{};

// -1 (a device given without an index) means the current core.
c10::DeviceIndex resolve(c10::DeviceIndex device) {
  return device < 0 ? currentDevice() : device;
}

c10::Stream makeStream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, device), id);
}

} // namespace

c10::Stream currentStream(c10::DeviceIndex device) {
  device = resolve(device);
  checkDeviceIndex(device);
  return makeStream(device, t_current_stream[device]);
}

c10::Stream defaultStream(c10::DeviceIndex device) {
  device = resolve(device);
  checkDeviceIndex(device);
  return makeStream(device, 0);
}

c10::Stream newStream(c10::DeviceIndex device) {
  device = resolve(device);
  checkDeviceIndex(device);
  return makeStream(device, ++g_next_stream_id[device]);
}

void setCurrentStream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "Expected a neuron stream, got ", stream);
  checkDeviceIndex(stream.device_index());
  t_current_stream[stream.device_index()] = stream.id();
}

c10::DeviceType NeuronGuardImpl::type() const {
  return kNeuron;
}

c10::Device NeuronGuardImpl::exchangeDevice(c10::Device device) const {
  TORCH_CHECK(device.type() == kNeuron, "Expected a neuron device, got ", device);
  return c10::Device(kNeuron, torch_neuronx::exchangeDevice(device.index()));
}

c10::Device NeuronGuardImpl::getDevice() const {
  return c10::Device(kNeuron, currentDevice());
}

void NeuronGuardImpl::setDevice(c10::Device device) const {
  TORCH_CHECK(device.type() == kNeuron, "Expected a neuron device, got ", device);
  setCurrentDevice(device.index());
}

void NeuronGuardImpl::uncheckedSetDevice(c10::Device device) const noexcept {
  if (device.index() >= 0 && device.index() < torch_neuronx::deviceCount()) {
    setCurrentDevice(device.index());
  }
}

c10::DeviceCapability NeuronGuardImpl::getDeviceCapability(c10::Device) const {
  return c10::DeviceCapability();  // every dtype PyTorch has (fp64 via the fp32 rule)
}

c10::DeviceIndex NeuronGuardImpl::deviceCount() const noexcept {
  return torch_neuronx::deviceCount();
}

c10::Stream NeuronGuardImpl::getStream(c10::Device device) const {
  return currentStream(device.index());
}

c10::Stream NeuronGuardImpl::getDefaultStream(c10::Device device) const {
  return defaultStream(device.index());
}

c10::Stream NeuronGuardImpl::getNewStream(c10::Device device, int /*priority*/) const {
  return newStream(device.index());
}

c10::Stream NeuronGuardImpl::getStreamFromGlobalPool(c10::Device device, bool) const {
  return newStream(device.index());
}

c10::Stream NeuronGuardImpl::exchangeStream(c10::Stream stream) const {
  auto previous = currentStream(stream.device_index());
  setCurrentStream(stream);
  return previous;
}

bool NeuronGuardImpl::queryStream(const c10::Stream& /*stream*/) const {
  return true;  // synchronous execution: nothing is ever pending
}

// Synchronizing runs the ops concatenation has queued (Concatenation.h).
// Both end a fused sequence for the audit's model of fusion (Recorder.h).
void NeuronGuardImpl::synchronizeStream(const c10::Stream& /*stream*/) const {
  runQueued();
  fusionCut(kCutBySynchronize);
}

void NeuronGuardImpl::synchronizeDevice(c10::DeviceIndex /*device*/) const {
  runQueued();
  fusionCut(kCutBySynchronize);
}

void NeuronGuardImpl::recordDataPtrOnStream(
    const c10::DataPtr& data_ptr, const c10::Stream& stream) const {
  neuronAllocator().recordStream(data_ptr, stream);
}

void NeuronGuardImpl::record(
    void** event, const c10::Stream& stream, c10::DeviceIndex device,
    c10::EventFlag flag) const {
  TORCH_CHECK(
      device == -1 || device == stream.device_index(),
      "Event device index ", static_cast<int>(device),
      " does not match recording stream's device index ",
      static_cast<int>(stream.device_index()), ".");
  auto* e = static_cast<Event*>(*event);
  if (e == nullptr) {
    e = new Event{stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT, {}};
    *event = e;
  }
  runQueued();  // the event marks the end of the work queued before it
  fusionCut(kCutBySynchronize);
  e->time = Clock::now();
}

void NeuronGuardImpl::block(void* /*event*/, const c10::Stream& /*stream*/) const {
  // The recorded work is already complete (synchronous execution).
}

bool NeuronGuardImpl::queryEvent(void* /*event*/) const {
  return true;
}

void NeuronGuardImpl::synchronizeEvent(void* /*event*/) const {}

void NeuronGuardImpl::destroyEvent(void* event, c10::DeviceIndex) const noexcept {
  delete static_cast<Event*>(event);
}

double NeuronGuardImpl::elapsedTime(void* start, void* end, c10::DeviceIndex) const {
  TORCH_CHECK(
      start != nullptr && end != nullptr,
      "Both events must be recorded before calculating elapsed time.");
  auto* first = static_cast<Event*>(start);
  auto* second = static_cast<Event*>(end);
  TORCH_CHECK(
      first->timing && second->timing,
      "Both events must be created with argument 'enable_timing=True'.");
  return std::chrono::duration<double, std::milli>(second->time - first->time).count();
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

} // namespace torch_neuronx
