#include "Generator.h"
#include "Runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <array>
#include <mutex>

namespace torch_neuronx {

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      engine_(at::detail::createCPUGenerator(seed)) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  engine_.set_current_seed(seed);
}

void NeuronGeneratorImpl::set_offset(uint64_t offset) {
  engine_.set_offset(offset);
}

uint64_t NeuronGeneratorImpl::get_offset() const {
  return engine_.get_offset();
}

uint64_t NeuronGeneratorImpl::current_seed() const {
  return engine_.current_seed();
}

uint64_t NeuronGeneratorImpl::seed() {
  return engine_.seed();
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  engine_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  return engine_.unsafeGetGeneratorImpl()->get_state();
}

c10::DeviceType NeuronGeneratorImpl::device_type() {
  return kNeuron;
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto* copy = new NeuronGeneratorImpl(device().index());
  copy->engine_ = engine_.clone();
  return copy;
}

const at::Generator& defaultGenerator(c10::DeviceIndex device) {
  // Leaked: random ops on threads still running at exit use them after
  // static destruction.
  static auto* generators = new std::array<at::Generator, kMaxDevices>();
  static std::array<std::once_flag, kMaxDevices> created;
  if (device < 0) {
    device = currentDevice();
  }
  checkDeviceIndex(device);
  std::call_once(created[device], [device] {
    (*generators)[device] = at::make_generator<NeuronGeneratorImpl>(device);
  });
  return (*generators)[device];
}

at::Generator newGenerator(c10::DeviceIndex device) {
  if (device < 0) {
    device = currentDevice();
  }
  checkDeviceIndex(device);
  return at::make_generator<NeuronGeneratorImpl>(device);
}

at::Generator engineFor(const std::optional<at::Generator>& generator, c10::DeviceIndex device) {
  const at::Generator& source =
      generator.has_value() && generator->defined() ? *generator : defaultGenerator(device);
  TORCH_CHECK(
      source.device().type() == kNeuron,
      "Expected a 'neuron' generator for an op on the neuron device, but got a '",
      source.device().type(), "' generator. Create it with torch.Generator(device='neuron').");
  return static_cast<NeuronGeneratorImpl*>(source.unsafeGetGeneratorImpl())->engine();
}

} // namespace torch_neuronx
