// Random number generators of the neuron device.
//
// Each core has a default generator, independent of the CPU's. A neuron
// generator owns a Philox-free CPU engine (mt19937, the one PyTorch's CPU
// kernels draw from); the eager path hands that engine to the CPU kernel that
// computes a random op, so the same seed gives the same numbers on every run
// and torch.manual_seed(s) makes neuron and CPU draws match.
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

  // The CPU engine that kernels draw from.
  const at::Generator& engine() const { return engine_; }

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  at::Generator engine_;
};

const at::Generator& defaultGenerator(c10::DeviceIndex device);
at::Generator newGenerator(c10::DeviceIndex device);

// Returns the CPU engine a CPU kernel should use for a neuron op: the given
// neuron generator's, or the device's default one when none is given.
at::Generator engineFor(const std::optional<at::Generator>& generator, c10::DeviceIndex device);

} // namespace torch_neuronx
