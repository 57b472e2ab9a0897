// Device guard, streams and events for the neuron device.
//
// The emulated core executes every op synchronously on the calling thread, so
// a stream never has pending work: query() is always true and synchronize()
// returns at once. Streams still have identities (default stream 0, new
// streams numbered per device), a per-thread current stream per device, and
// events record a timestamp so elapsed_time() measures real host time between
// two points of the program, which is what the work took.
#pragma once

#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace torch_neuronx {

c10::Stream currentStream(c10::DeviceIndex device);
c10::Stream defaultStream(c10::DeviceIndex device);
c10::Stream newStream(c10::DeviceIndex device);
void setCurrentStream(const c10::Stream& stream);

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override;
  c10::Device exchangeDevice(c10::Device device) const override;
  c10::Device getDevice() const override;
  void setDevice(c10::Device device) const override;
  void uncheckedSetDevice(c10::Device device) const noexcept override;
  c10::DeviceIndex deviceCount() const noexcept override;
  c10::DeviceCapability getDeviceCapability(c10::Device device) const override;

  c10::Stream getStream(c10::Device device) const override;
  c10::Stream getDefaultStream(c10::Device device) const override;
  c10::Stream getNewStream(c10::Device device, int priority = 0) const override;
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority = false)
      const override;
  c10::Stream exchangeStream(c10::Stream stream) const override;
  bool queryStream(const c10::Stream& stream) const override;
  void synchronizeStream(const c10::Stream& stream) const override;
  void synchronizeDevice(c10::DeviceIndex device) const override;
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream)
      const override;

  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device,
              c10::EventFlag flag) const override;
  void block(void* event, const c10::Stream& stream) const override;
  bool queryEvent(void* event) const override;
  void synchronizeEvent(void* event) const override;
  void destroyEvent(void* event, c10::DeviceIndex device) const noexcept override;
  double elapsedTime(void* start, void* end, c10::DeviceIndex device) const override;
};

} // namespace torch_neuronx
