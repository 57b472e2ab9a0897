// Random number generators of the neuron device, as TorchNeuron has them.
//
// Each core has a default generator whose state is 16 bytes: a seed and an
// offset (CUDA's Philox layout, and TorchNeuron's). Eager random ops do not
// read it: they run PyTorch's CPU kernel with the CPU's default generator, so
// torch.manual_seed(s) followed by the same random calls gives the CPU's
// numbers on the device (TorchNeuron's random ops take its CPU path). The
// device generator keys what is drawn on the device: random ops computed
// inside a compiled graph, and ops given an explicit neuron generator; each
// such draw takes the stream (seed, offset) and advances the offset by one.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace torch_neuronx {

struct NeuronGeneratorImpl final : public c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type();

  // The seed of the next stream, (seed, offset) mixed, and the offset advanced.
  // The caller holds mutex_. Offset 0 gives the seed itself, so the first draw
  // after manual_seed(s) is what a CPU generator seeded s would draw.
  uint64_t nextStream();

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& defaultGenerator(c10::DeviceIndex device);
at::Generator newGenerator(c10::DeviceIndex device);

// The generator a CPU kernel computing a neuron op draws from: none (the CPU's
// default one) when the call gave none, a CPU generator as given, and for a
// neuron generator a CPU generator seeded with its next stream.
std::optional<at::Generator> cpuGeneratorFor(const std::optional<at::Generator>& generator);

// The next stream of a core's default generator (compiled graphs' random keys).
uint64_t nextDefaultStream(c10::DeviceIndex device);

} // namespace torch_neuronx
