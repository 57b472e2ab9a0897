#include "Generator.h"
#include "Runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstring>
#include <mutex>

namespace torch_neuronx {

namespace {

constexpr size_t kSeedBytes = sizeof(uint64_t);
constexpr size_t kStateBytes = kSeedBytes + sizeof(int64_t);

// SplitMix64's finalizer: neighbouring (seed, offset) pairs give unrelated streams.
uint64_t mix(uint64_t value) {
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

} // namespace

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void NeuronGeneratorImpl::set_offset(uint64_t offset) {
  offset_ = offset;
}

uint64_t NeuronGeneratorImpl::get_offset() const {
  return offset_;
}

uint64_t NeuronGeneratorImpl::current_seed() const {
  return seed_;
}

uint64_t NeuronGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom();
  set_current_seed(random);
  return random;
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  const auto size = static_cast<size_t>(new_state.numel());
  TORCH_CHECK(
      size == kStateBytes || size == kSeedBytes,
      "RNG state is wrong size: a neuron generator's state is ", kStateBytes,
      " bytes (an 8-byte seed, then an 8-byte offset) or ", kSeedBytes,
      " (a seed alone), but got ", size, " bytes. Pass a state returned by "
      "torch.neuron.get_rng_state() or Generator.get_state() of a neuron generator.");
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  std::memcpy(&seed_, bytes, kSeedBytes);
  int64_t offset = 0;
  if (size == kStateBytes) {
    std::memcpy(&offset, bytes + kSeedBytes, sizeof(offset));
  }
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  auto state = at::detail::empty_cpu(
      {static_cast<int64_t>(kStateBytes)}, at::ScalarType::Byte, std::nullopt, std::nullopt,
      std::nullopt, std::nullopt);
  auto* bytes = static_cast<uint8_t*>(state.data_ptr());
  const auto offset = static_cast<int64_t>(offset_);
  std::memcpy(bytes, &seed_, kSeedBytes);
  std::memcpy(bytes + kSeedBytes, &offset, sizeof(offset));
  return state.getIntrusivePtr();
}

c10::DeviceType NeuronGeneratorImpl::device_type() {
  return kNeuron;
}

uint64_t NeuronGeneratorImpl::nextStream() {
  const uint64_t offset = offset_++;
  return offset == 0 ? seed_ : mix(seed_ ^ mix(offset));
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto* copy = new NeuronGeneratorImpl(device().index(), seed_);
  copy->offset_ = offset_;
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
    // As TorchNeuron's: a default generator nobody seeded starts from a
    // nondeterministic seed (torch.manual_seed seeds it).
    (*generators)[device] = at::make_generator<NeuronGeneratorImpl>(device);
    (*generators)[device].seed();
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

std::optional<at::Generator> cpuGeneratorFor(const std::optional<at::Generator>& generator) {
  if (!generator.has_value() || !generator->defined() || generator->device().is_cpu()) {
    return generator;
  }
  TORCH_CHECK(
      generator->device().type() == kNeuron,
      "Expected a 'neuron' or 'cpu' generator for an op on the neuron device, but got a '",
      generator->device().type(), "' generator.");
  auto* impl = static_cast<NeuronGeneratorImpl*>(generator->unsafeGetGeneratorImpl());
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return at::detail::createCPUGenerator(impl->nextStream());
}

uint64_t nextDefaultStream(c10::DeviceIndex device) {
  const at::Generator& generator = defaultGenerator(device);
  auto* impl = static_cast<NeuronGeneratorImpl*>(generator.unsafeGetGeneratorImpl());
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return impl->nextStream();
}

} // namespace torch_neuronx
