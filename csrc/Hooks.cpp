// PrivateUse1 hooks: what generic PyTorch code (torch.accelerator, pinned
// memory, generators, storage resizing) asks of the neuron backend.
#include "Allocator.h"
#include "Concatenation.h"
#include "Generator.h"
#include "Runtime.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace torch_neuronx {
namespace {

// Page-locked host memory is what makes host-to-device copies asynchronous on
// real hardware; here it is ordinary aligned host memory that remembers it was
// "pinned", so tensor.is_pinned() and pin_memory() behave as users expect.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) {
      return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    }
    void* ptr = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
    TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "Pinned host allocation of ",
                     formatBytes(nbytes), " failed.");
    {
      std::lock_guard<std::mutex> lock(mutex());
      ranges()[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    }
    return c10::DataPtr(ptr, ptr, &release, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

  void copy_data(void* dst, const void* src, size_t count) const override {
    std::memcpy(dst, src, count);
  }

  static bool contains(const void* data) {
    const auto address = reinterpret_cast<uintptr_t>(data);
    std::lock_guard<std::mutex> lock(mutex());
    auto it = ranges().upper_bound(address);
    if (it == ranges().begin()) {
      return false;
    }
    --it;
    return address < it->first + it->second;
  }

 private:
  static void release(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      ranges().erase(reinterpret_cast<uintptr_t>(ptr));
    }
    std::free(ptr);
  }

  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }

  static std::map<uintptr_t, size_t>& ranges() {
    static auto* r = new std::map<uintptr_t, size_t>();
    return *r;
  }
};

PinnedAllocator& pinnedAllocator() {
  static auto* allocator = new PinnedAllocator();  // leaked: pinned storages may outlive statics
  return *allocator;
}

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return torch_neuronx::deviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return isInitialized(); }
  void init() const override { lazyInit(); }
  c10::DeviceIndex deviceCount() const override { return torch_neuronx::deviceCount(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { torch_neuronx::setCurrentDevice(device); }
  c10::DeviceIndex getCurrentDevice() const override { return currentDevice(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return torch_neuronx::exchangeDevice(device);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return torch_neuronx::exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::contains(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinnedAllocator(); }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(kNeuron, currentDevice()); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return defaultGenerator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return newGenerator(device);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    c10::DeviceGuard guard(storage.device());
    auto fresh = neuronAllocator().allocate(nbytes);
    const size_t keep = std::min(nbytes, storage.nbytes());
    if (keep > 0) {
      runQueued();  // queued ops may still write the old bytes
      std::memcpy(fresh.get(), storage.data(), keep);
    }
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(nbytes);
  }
};

} // namespace

void registerHooks() {
  static auto* hooks = new NeuronHooks();  // leaked: PyTorch keeps the pointer to the end
  at::RegisterPrivateUse1HooksInterface(hooks);
}

} // namespace torch_neuronx
