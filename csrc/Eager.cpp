#include "Eager.h"

#include "Allocator.h"
#include "Concatenation.h"
#include "DeviceLimits.h"
#include "Generator.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/native/CPUFallback.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_neuronx {
namespace {

using Counter = std::atomic<int64_t>;

// ---------------------------------------------------------------- op tracking

struct CounterTable {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<Counter>> counters;

  Counter* get(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = counters[name];
    if (!slot) {
      slot = std::make_unique<Counter>(0);
    }
    return slot.get();
  }

  std::map<std::string, int64_t> nonzero() {
    std::lock_guard<std::mutex> lock(mutex);
    std::map<std::string, int64_t> result;
    for (auto& [name, counter] : counters) {
      if (auto value = counter->load()) {
        result.emplace(name, value);
      }
    }
    return result;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [name, counter] : counters) {
      *counter = 0;
    }
  }
};

CounterTable& executedTable() {
  static auto* table = new CounterTable();
  return *table;
}

CounterTable& fallbackTable() {
  static auto* table = new CounterTable();
  return *table;
}

// ------------------------------------------------------- per-op schema facts

std::mutex g_flags_mutex;
std::unordered_map<std::string, int>& opFlags() {
  static auto* flags = new std::unordered_map<std::string, int>();
  return *flags;
}

c10::TypeKind elementKind(const c10::Argument& argument) {
  const auto& type = argument.real_type();
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->castRaw<c10::OptionalType>()->getElementType()->kind();
  }
  return type->kind();
}

enum class ArgKind : uint8_t { Other, Tensor, TensorList, OptionalTensorList };

ArgKind argKind(const c10::Argument& argument) {
  const auto& type = argument.real_type();
  auto kind = elementKind(argument);
  if (kind == c10::TypeKind::TensorType) {
    return ArgKind::Tensor;
  }
  if (type->kind() == c10::TypeKind::ListType) {
    const auto& element = type->castRaw<c10::ListType>()->getElementType();
    if (element->kind() == c10::TypeKind::TensorType) {
      return ArgKind::TensorList;
    }
    if (element->kind() == c10::TypeKind::OptionalType &&
        element->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType) {
      return ArgKind::OptionalTensorList;
    }
  }
  return ArgKind::Other;
}

// What the eager path needs to know about an op, computed once per op.
struct OpMeta {
  std::string name;
  int flags = 0;
  std::vector<ArgKind> arg_kinds;
  std::vector<bool> mutable_args;
  std::vector<int> generator_args;
  std::vector<int> device_args;
  std::vector<int> dtype_args;
  Counter* executed = nullptr;
  Counter* fallback = nullptr;
  std::atomic<bool> fallback_warned{false};
};

std::unique_ptr<OpMeta> buildMeta(const c10::OperatorHandle& op) {
  auto meta = std::make_unique<OpMeta>();
  const auto& schema = op.schema();
  meta->name = c10::toString(op.operator_name());
  {
    std::lock_guard<std::mutex> lock(g_flags_mutex);
    auto it = opFlags().find(meta->name);
    meta->flags = it == opFlags().end() ? 0 : it->second;
  }
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    // native_batch_norm updates its running statistics in place although its
    // schema does not say so (no alias annotation).
    const bool running_stat =
        arguments[i].name() == "running_mean" || arguments[i].name() == "running_var";
    meta->mutable_args.push_back((alias != nullptr && alias->isWrite()) || running_stat);
    meta->arg_kinds.push_back(argKind(arguments[i]));
    switch (elementKind(arguments[i])) {
      case c10::TypeKind::GeneratorType:
        meta->generator_args.push_back(static_cast<int>(i));
        break;
      case c10::TypeKind::DeviceObjType:
        meta->device_args.push_back(static_cast<int>(i));
        break;
      case c10::TypeKind::ScalarTypeType:
        meta->dtype_args.push_back(static_cast<int>(i));
        break;
      default:
        break;
    }
  }
  meta->executed = executedTable().get(meta->name);
  meta->fallback = fallbackTable().get(meta->name);
  return meta;
}

OpMeta& metaFor(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* metas = new std::unordered_map<const void*, std::unique_ptr<OpMeta>>();
  thread_local std::unordered_map<const void*, OpMeta*> cache;
  const void* key = &op.schema();
  auto hit = cache.find(key);
  if (hit != cache.end()) {
    return *hit->second;
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*metas)[key];
  if (!slot) {
    slot = buildMeta(op);
  }
  cache.emplace(key, slot.get());
  return *slot;
}

// ----------------------------------------------------------- device memory

c10::Allocator* captureCpuAllocator() {
  static c10::Allocator* allocator = [] {
    installCaptureAllocator();
    return c10::GetAllocator(c10::DeviceType::CPU);
  }();
  return allocator;
}

// Moves the bytes of a CPU storage filled by a kernel into device memory:
// taken over as they are when the device allocator provided them (the usual
// case, thanks to CaptureScope), copied otherwise.
c10::DataPtr takeForDevice(c10::StorageImpl* cpu, c10::DeviceIndex device) {
  if (NeuronAllocator::owns(cpu->data_ptr())) {
    c10::DataPtr taken = cpu->set_data_ptr(c10::DataPtr(nullptr, cpu->device()));
    taken.unsafe_set_device(c10::Device(kNeuron, device));
    return taken;
  }
  c10::DataPtr fresh = neuronAllocator().allocateOn(device, cpu->nbytes());
  if (cpu->nbytes() > 0) {
    std::memcpy(fresh.get(), cpu->data(), cpu->nbytes());
  }
  return fresh;
}

c10::Storage deviceStorage(c10::DataPtr data, size_t nbytes) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), &neuronAllocator(),
      /*resizable=*/true));
}

// A tensor of backend `key` over `storage` with the geometry, dtype and
// conj/neg bits of `like`: the one way device tensors and their CPU aliases
// are made.
at::Tensor tensorLike(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key), like.dtype());
  auto* impl = tensor.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) {
    impl->_set_conj(true);
  }
  if (like.is_neg()) {
    impl->_set_neg(true);
  }
  return tensor;
}

at::Tensor deviceTensorLike(c10::Storage storage, const at::Tensor& like) {
  return tensorLike(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

bool sameStorage(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// `tensor`'s host alias over the storage of `alias`, the host alias of a
// tensor that shares tensor's device storage.
at::Tensor aliasOver(const at::Tensor& alias, const at::Tensor& tensor) {
  return tensorLike(alias.storage(), c10::DispatchKey::CPU, tensor);
}

// CUDA's sentence, then TorchNeuron's ("... is on cpu device, expected
// neuron") for a tensor that is not on the device, then what to do.
[[noreturn]] void throwDeviceMismatch(
    const OpMeta& meta, const std::string& first, const std::string& second,
    const std::string& argument) {
  const bool off_device = second.rfind("neuron", 0) != 0;
  TORCH_CHECK(
      false, "Expected all tensors to be on the same device, but found at least two devices, ",
      first, " and ", second, "! ",
      off_device ? "Non-scalar tensor argument '" + argument + "' of " + meta.name + " is on " +
                       second + " device, expected neuron"
                 : "(argument '" + argument + "' of " + meta.name + ")",
      "; move it with .to('neuron') or .cpu()");
}

// ------------------------------------------------------------- one op call
//
// nativeKernel runs one call of a native op in four steps, each with its own
// state:
//   1. HostArguments: device tensor arguments become host aliases and the
//      call's core is settled (device mismatches are reported here);
//   2. Fp64Emulation: under the fp32 rule, float64 operands become float32
//      stand-ins (and results are widened back in step 4);
//   3. PyTorch's CPU kernel runs, its allocations served by the device
//      allocator (CaptureScope);
//   4. ResultAdoption: mutated arguments take over what the kernel did to
//      their aliases, returned CPU tensors are adopted as device tensors.
// Their state lives on nativeKernel's stack, in inline vectors sized for the
// common call: the split costs no allocation or lookup per call.

// A neuron tensor argument and the host alias the kernel was given for it.
struct AliasedArgument {
  at::Tensor alias_tensor;          // keeps the alias alive after the stack drops it
  c10::TensorImpl* alias;
  c10::StorageImpl* alias_storage;  // the storage as given (the kernel may replace it)
  at::Tensor original;              // the neuron tensor
  bool is_mutable;                  // in-place or out= argument
};

// Step 1: the tensor arguments of one call as the CPU kernel sees them, and
// the core the call runs on.
struct HostArguments {
  const OpMeta& meta;
  c10::DeviceIndex device = -1;               // -1 until a tensor or device argument names it
  bool cpu_target = false;                    // a factory op asked for a CPU result
  const std::string* cpu_argument = nullptr;  // first non-scalar CPU tensor argument's name
  c10::SmallVector<AliasedArgument, 6> aliases;
  c10::SmallVector<const c10::TensorImpl*, 4> cpu_inputs;  // CPU tensors passed as they are

  explicit HostArguments(const OpMeta& m) : meta(m) {}

  // Rewrites the arguments in place and settles `device`.
  void unwrap(c10::IValue* args, const std::vector<c10::Argument>& arguments) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      unwrapArgument(args[i], meta.arg_kinds[i], arguments[i], meta.mutable_args[i]);
    }
    for (int index : meta.device_args) {
      unwrapDeviceArgument(args[index]);
    }
    if (device < 0) {
      device = currentDevice();
    }
    // A CPU tensor among neuron ones is a mistake unless the op reads host
    // tensors (kCrossDevice) or it is a scalar (a wrapped Python number).
    if (cpu_argument != nullptr && !aliases.empty()) {
      throwDeviceMismatch(meta, c10::Device(kNeuron, device).str(), "cpu", *cpu_argument);
    }
  }

  // The fp32 rule applies when a device tensor is float64/complex128 (CPU
  // scalars such as Python numbers wrapped as float64 do not count: they do
  // not decide the result dtype).
  bool hasDeviceFp64() const {
    for (const auto& aliased : aliases) {
      if (needsFp64Emulation(aliased.original)) {
        return true;
      }
    }
    return false;
  }

 private:
  void unwrapArgument(c10::IValue& value, ArgKind kind, const c10::Argument& argument, bool is_mutable) {
    switch (kind) {
      case ArgKind::Tensor:
        if (value.isTensor()) {
          value = unwrapTensor(value.toTensor(), argument, is_mutable);
        }
        break;
      case ArgKind::TensorList: {
        c10::List<at::Tensor> mapped;
        for (const at::Tensor& tensor : value.toTensorList()) {
          mapped.push_back(unwrapTensor(tensor, argument, is_mutable));
        }
        value = std::move(mapped);
        break;
      }
      case ArgKind::OptionalTensorList: {
        c10::List<std::optional<at::Tensor>> mapped;
        for (const c10::IValue& element : value.toListRef()) {
          mapped.push_back(
              element.isTensor()
                  ? std::optional<at::Tensor>(unwrapTensor(element.toTensor(), argument, is_mutable))
                  : std::nullopt);
        }
        value = std::move(mapped);
        break;
      }
      case ArgKind::Other:
        break;
    }
  }

  // The host alias of a neuron argument. Arguments over one device storage get
  // one alias storage, so the kernel sees their overlap as on CPU tensors
  // (PyTorch refuses an output that partly overlaps an input).
  at::Tensor aliasFor(const at::Tensor& tensor) {
    for (const auto& aliased : aliases) {
      if (sameStorage(tensor, aliased.original)) {
        return aliasOver(aliased.alias_tensor, tensor);
      }
    }
    return hostAlias(tensor);
  }

  at::Tensor unwrapTensor(const at::Tensor& tensor, const c10::Argument& argument, bool is_mutable) {
    if (!tensor.defined()) {
      return tensor;
    }
    const auto tensor_device = tensor.device();
    if (tensor_device.type() == kNeuron) {
      if (device < 0) {
        device = tensor_device.index();
      } else if (device != tensor_device.index()) {
        if (!(meta.flags & kCrossDevice)) {
          throwDeviceMismatch(
              meta, c10::Device(kNeuron, device).str(), tensor_device.str(), argument.name());
        }
        checkSameCore(meta.name, c10::Device(kNeuron, device), tensor_device, argument.name());
      }
      // Data movement (copies, fills, scatters) writes views of any strides on
      // Trainium too; compute kernels write contiguous outputs only.
      if (is_mutable && !(meta.flags & kExactFp64)) {
        checkContiguousOutput(meta.name, tensor, argument.name());
      }
      at::Tensor alias = aliasFor(tensor);
      aliases.push_back(AliasedArgument{
          alias, alias.unsafeGetTensorImpl(), alias.storage().unsafeGetStorageImpl(), tensor,
          is_mutable});
      return alias;
    }
    if (tensor_device.type() != c10::DeviceType::CPU) {
      throwDeviceMismatch(meta, "neuron", tensor_device.str(), argument.name());
    }
    if (tensor.dim() > 0 && cpu_argument == nullptr && !(meta.flags & kCrossDevice)) {
      cpu_argument = &argument.name();
    }
    cpu_inputs.push_back(tensor.unsafeGetTensorImpl());
    return tensor;
  }

  // Factory ops carry the target device as an argument: the CPU kernel gets
  // "cpu", the result goes to the neuron core named there.
  void unwrapDeviceArgument(c10::IValue& value) {
    if (!value.isDevice()) {
      return;
    }
    const auto target = value.toDevice();
    if (target.type() == kNeuron) {
      if (device < 0) {
        device = target.has_index() ? target.index() : currentDevice();
      }
      value = c10::Device(c10::DeviceType::CPU);
    } else {
      cpu_target = true;
    }
  }
};

// Random ops run PyTorch's CPU kernel with the CPU's default generator, as
// TorchNeuron's do, so seeded code draws the CPU's numbers on the device; an
// explicit neuron generator becomes a CPU generator seeded from its stream
// (csrc/Generator.h).
void useCpuGenerators(const OpMeta& meta, c10::IValue* args) {
  for (int index : meta.generator_args) {
    auto& value = args[index];
    if (value.isGenerator()) {
      const auto cpu = cpuGeneratorFor(value.toGenerator());
      value = cpu.has_value() ? c10::IValue(*cpu) : c10::IValue();
    }
  }
}

void warnFp64Once(const OpMeta& meta) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    TORCH_WARN(
        "torch_neuronx: float64 arithmetic on the neuron device is computed in float32, as on "
        "Trainium (first seen in ", meta.name, "); tensors keep dtype float64. Set "
        "TORCH_NEURONX_FP64=native to compute in float64 while debugging.");
  }
}

// Step 2: float64 on Trainium is computed in float32. The kernel gets float32
// stand-ins; mutated float64 arguments get the stand-ins' values back and
// results are widened to float64, unless the op was asked for another dtype.
struct Fp64Emulation {
  struct Standin {
    at::Tensor narrow;  // the float32 stand-in the kernel wrote
    at::Tensor wide;    // the float64 argument it stands for
  };

  bool active = false;
  bool explicit_dtype_arg = false;  // the op was given a dtype argument...
  bool demoted_dtype_arg = false;   // ... and it was float64/complex128
  c10::SmallVector<Standin, 2> mutated_standins;
  // Widened results stay alive until the call ends: adopted storages are
  // matched by address, which a freed temporary could hand to the next one.
  c10::SmallVector<at::Tensor, 3> widened;
  // The foreach ops compute each element of their lists apart: element i of a
  // list result is float64 only where an element i of a list argument was
  // (a float32 element stays float32, as on the CPU), unless a float64 tensor
  // outside the lists takes part in every element.
  c10::SmallVector<bool, 8> list_element_fp64;
  bool tensor_fp64 = false;

  void demoteArguments(const OpMeta& meta, c10::IValue* args, size_t count) {
    active = true;
    for (size_t i = 0; i < count; ++i) {
      auto& value = args[i];
      if (value.isTensor()) {
        tensor_fp64 = tensor_fp64 || isFp64(value.toTensor());
        value = demote(value.toTensor(), meta.mutable_args[i]);
      } else if (value.isTensorList()) {
        auto list = value.toTensorList();
        c10::List<at::Tensor> mapped;
        list_element_fp64.resize(std::max(list_element_fp64.size(), list.size()), false);
        for (size_t j = 0; j < list.size(); ++j) {
          const at::Tensor tensor = list[j];
          list_element_fp64[j] = list_element_fp64[j] || isFp64(tensor);
          mapped.push_back(demote(tensor, meta.mutable_args[i]));
        }
        value = std::move(mapped);
      }
    }
    for (int index : meta.dtype_args) {
      demoteDtypeArgument(args[index]);
    }
  }

  // Copies what the kernel wrote into the stand-ins of mutated arguments
  // back to the float64 tensors (resized as the stand-ins were).
  void writeBack() {
    for (auto& standin : mutated_standins) {
      if (!standin.wide.sizes().equals(standin.narrow.sizes())) {
        standin.wide.resize_(standin.narrow.sizes());
      }
      standin.wide.copy_(standin.narrow);
    }
  }

  // The float64 result standing for the kernel's result `out`; the reference
  // holds until the next widen().
  const at::Tensor& widen(const at::Tensor& out) {
    widened.push_back(widenedValue(out));
    return widened.back();
  }

  // Element `index` of a list result.
  const at::Tensor& widenElement(const at::Tensor& out, size_t index) {
    const bool float32_element = !tensor_fp64 && index < list_element_fp64.size() && !list_element_fp64[index];
    widened.push_back(float32_element ? out : widenedValue(out));
    return widened.back();
  }

 private:
  static bool isFp64(const at::Tensor& tensor) {
    return tensor.defined() && (tensor.scalar_type() == at::kDouble || tensor.scalar_type() == at::kComplexDouble);
  }

  at::Tensor demote(const at::Tensor& tensor, bool is_mutable) {
    if (!isFp64(tensor)) {
      return tensor;
    }
    at::Tensor narrow = tensor.to(tensor.scalar_type() == at::kDouble ? at::kFloat : at::kComplexFloat);
    if (is_mutable) {
      mutated_standins.push_back(Standin{narrow, tensor});
    }
    return narrow;
  }

  void demoteDtypeArgument(c10::IValue& value) {
    if (value.isNone()) {
      return;
    }
    explicit_dtype_arg = true;
    const auto dtype = static_cast<c10::ScalarType>(value.toInt());
    if (dtype == at::kDouble || dtype == at::kComplexDouble) {
      value = static_cast<int64_t>(dtype == at::kDouble ? at::kFloat : at::kComplexFloat);
      demoted_dtype_arg = true;
    }
  }

  at::Tensor widenedValue(const at::Tensor& out) {
    for (auto& standin : mutated_standins) {
      if (standin.narrow.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) {
        return standin.wide;
      }
    }
    if (explicit_dtype_arg && !demoted_dtype_arg) {
      return out;
    }
    if (out.scalar_type() == at::kFloat) {
      return out.to(at::kDouble);
    }
    if (out.scalar_type() == at::kComplexFloat) {
      return out.to(at::kComplexDouble);
    }
    return out;
  }
};

// Step 4: the kernel's effects handed back to the device.
struct ResultAdoption {
  const HostArguments& inputs;
  // CPU storages adopted in this call, so that results sharing one (views of
  // each other) share one device storage too.
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 2> adopted;

  explicit ResultAdoption(const HostArguments& in) : inputs(in) {}

  // In-place and out= arguments: the kernel may have resized the host alias
  // (new memory) or changed its geometry; carry that over to the neuron tensor.
  void syncMutatedArguments() {
    for (const auto& aliased : inputs.aliases) {
      if (aliased.is_mutable) {
        syncMemory(aliased);
        syncGeometry(aliased);
      }
    }
  }

  // Replaces each tensor in the kernel's returns by its device counterpart.
  void adoptReturns(torch::jit::Stack* stack, size_t num_returns, Fp64Emulation& fp64) {
    for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
      c10::IValue& value = *it;
      if (value.isTensor()) {
        value = adoptReturn(value.toTensor(), fp64);
      } else if (value.isTensorList()) {
        auto list = value.toTensorList();
        c10::List<at::Tensor> mapped;
        mapped.reserve(list.size());
        for (size_t i = 0; i < list.size(); ++i) {
          const at::Tensor tensor = list[i];
          mapped.push_back(adopt(fp64.active ? fp64.widenElement(tensor, i) : tensor));
        }
        value = std::move(mapped);
      }
    }
  }

 private:
  void syncMemory(const AliasedArgument& aliased) {
    c10::TensorImpl* original = aliased.original.unsafeGetTensorImpl();
    c10::StorageImpl* now = aliased.alias->storage().unsafeGetStorageImpl();
    if (now != aliased.alias_storage) {
      // The kernel gave the alias another storage (set_, or a result's).
      original->set_storage_keep_dtype(deviceStorageFor(now));
    } else if (now->data() != original->storage().data() ||
               now->nbytes() != original->storage().nbytes()) {
      // Same storage, new memory: the kernel resized it.
      c10::StorageImpl* target = original->storage().unsafeGetStorageImpl();
      const size_t nbytes = now->nbytes();
      target->set_data_ptr_noswap(takeForDevice(now, inputs.device));
      target->set_nbytes(nbytes);
    }
  }

  static void syncGeometry(const AliasedArgument& aliased) {
    c10::TensorImpl* original = aliased.original.unsafeGetTensorImpl();
    if (!original->sizes().equals(aliased.alias->sizes()) ||
        !original->strides().equals(aliased.alias->strides()) ||
        original->storage_offset() != aliased.alias->storage_offset()) {
      original->set_sizes_and_strides(
          aliased.alias->sizes(), aliased.alias->strides(), aliased.alias->storage_offset());
    }
  }

  // The device storage for a CPU storage the kernel returned: a neuron
  // argument's own when it is that argument's alias storage, else adopted
  // (once per call).
  c10::Storage deviceStorageFor(c10::StorageImpl* cpu) {
    for (const auto& aliased : inputs.aliases) {
      if (aliased.alias_storage == cpu) {
        return aliased.original.storage();
      }
    }
    for (auto& [source, storage] : adopted) {
      if (source == cpu) {
        return storage;
      }
    }
    const size_t nbytes = cpu->nbytes();
    c10::Storage storage = deviceStorage(takeForDevice(cpu, inputs.device), nbytes);
    adopted.emplace_back(cpu, storage);
    return storage;
  }

  at::Tensor adoptReturn(const at::Tensor& out, Fp64Emulation& fp64) {
    return adopt(fp64.active ? fp64.widen(out) : out);
  }

  // A returned alias is its neuron tensor; a returned CPU input stays itself;
  // a new CPU tensor becomes a neuron tensor (unless the op asked for CPU).
  at::Tensor adopt(const at::Tensor& out) {
    if (!out.defined() || inputs.cpu_target || out.device().type() != c10::DeviceType::CPU) {
      return out;
    }
    const c10::TensorImpl* impl = out.unsafeGetTensorImpl();
    for (const auto& aliased : inputs.aliases) {
      if (aliased.alias == impl) {
        return aliased.original;
      }
    }
    for (const auto* input : inputs.cpu_inputs) {
      if (input == impl) {
        return out;
      }
    }
    return deviceTensorLike(deviceStorageFor(out.storage().unsafeGetStorageImpl()), out);
  }
};

// The arguments of an op: the last `count` values on the stack.
c10::IValue* stackArguments(torch::jit::Stack* stack, size_t count) {
  return &*(stack->end() - static_cast<std::ptrdiff_t>(count));
}

// The boxed kernel of every native op.
void nativeKernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpMeta& meta = metaFor(op);
  meta.executed->fetch_add(1, std::memory_order_relaxed);
  const auto& schema = op.schema();
  const size_t num_arguments = schema.arguments().size();
  c10::IValue* args = stackArguments(stack, num_arguments);
  RecordedCall record(op, args, num_arguments, CallPath::Native);

  if (meta.flags & kEndsFusedSequence) {
    runQueuedEndingWith(op);
  }
  HostArguments inputs(meta);
  inputs.unwrap(args, schema.arguments());
  lazyInit();
  useCpuGenerators(meta, args);
  Fp64Emulation fp64;
  if (!(meta.flags & kExactFp64) && inputs.hasDeviceFp64()) {
    warnFp64Once(meta);
    fp64.demoteArguments(meta, args, num_arguments);
  }
  ResultAdoption results(inputs);

  c10::DeviceGuard guard(c10::Device(kNeuron, inputs.device));
  // Widening and adoption run inside the scope too: their copies land in
  // device memory.
  CaptureScope capture(inputs.cpu_target ? -1 : inputs.device);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  fp64.writeBack();
  results.syncMutatedArguments();
  results.adoptReturns(stack, schema.returns().size(), fp64);
}

// ------------------------------------------------------------ fallback path

// Applies TORCH_NEURONX_FALLBACK to an op about to fall back: an error, a
// once-per-op warning or nothing.
void enforceFallbackPolicy(OpMeta& meta) {
  const auto mode = fallbackMode();
  TORCH_CHECK_NOT_IMPLEMENTED(
      mode != FallbackMode::Error,
      meta.name, " is not in the neuron device's native op set, so it would run on the CPU "
      "(inputs copied to the host and results copied back), and TORCH_NEURONX_FALLBACK=error "
      "forbids that. Set TORCH_NEURONX_FALLBACK=warn (the default) or silent to allow the CPU "
      "fallback, or avoid the op; torch_neuronx.get_fallback_ops() lists the ops that fell back.");
  if (mode == FallbackMode::Warn && !meta.fallback_warned.exchange(true)) {
    TORCH_WARN(
        "torch_neuronx: ", meta.name, " is not in the neuron device's native op set and runs on "
        "the CPU (inputs copied to the host and back), which is slow. Shown once per op; "
        "torch_neuronx.get_fallback_ops() lists them. Set TORCH_NEURONX_FALLBACK=silent to hide "
        "this warning or TORCH_NEURONX_FALLBACK=error to make it an error.");
  }
}

// The boxed kernel of every other op: run on CPU copies.
void fallbackKernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpMeta& meta = metaFor(op);
  meta.executed->fetch_add(1, std::memory_order_relaxed);
  meta.fallback->fetch_add(1, std::memory_order_relaxed);
  const size_t num_arguments = op.schema().arguments().size();
  RecordedCall record(op, stackArguments(stack, num_arguments), num_arguments, CallPath::Fallback);
  enforceFallbackPolicy(meta);
  lazyInit();
  at::native::cpu_fallback(op, stack, /*error_on_views=*/false);
}

} // namespace

// ------------------------------------------------------ host aliases, adoption

at::Tensor hostAlias(const at::Tensor& tensor) {
  runQueued();  // the host is about to read or write device bytes (Concatenation.h)
  const c10::Storage& storage = tensor.storage();
  auto cpu_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
      c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::DeviceType::CPU)),
      captureCpuAllocator(), /*resizable=*/true);
  return tensorLike(c10::Storage(std::move(cpu_storage)), c10::DispatchKey::CPU, tensor);
}

at::Tensor hostOperand(const at::Tensor& tensor) {
  return tensor.device().type() == kNeuron ? hostAlias(tensor) : tensor;
}

at::Tensor hostOperandWith(const at::Tensor& tensor, const at::Tensor& aliased, const at::Tensor& alias) {
  return tensor.device().type() == kNeuron && sameStorage(tensor, aliased) ? aliasOver(alias, tensor)
                                                                             : hostOperand(tensor);
}

at::Tensor owningHostAlias(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().type() == kNeuron, "owningHostAlias expects a neuron tensor, got ",
              tensor.device());
  runQueued();
  const c10::Storage& storage = tensor.storage();
  auto* owner = new c10::Storage(storage);
  c10::DataPtr data(
      const_cast<void*>(storage.data()), owner,
      [](void* ctx) { delete static_cast<c10::Storage*>(ctx); }, c10::Device(c10::DeviceType::CPU));
  auto cpu_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(data), nullptr,
      /*resizable=*/false);
  return tensorLike(c10::Storage(std::move(cpu_storage)), c10::DispatchKey::CPU, tensor);
}

at::Tensor adoptKernelResult(const at::Tensor& cpu, c10::DeviceIndex device) {
  c10::StorageImpl* storage = cpu.storage().unsafeGetStorageImpl();
  const size_t nbytes = storage->nbytes();
  return deviceTensorLike(deviceStorage(takeForDevice(storage, device), nbytes), cpu);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> adoptKernelResults(
    const std::tuple<at::Tensor, at::Tensor, at::Tensor>& cpu, c10::DeviceIndex device) {
  const auto adopt = [device](const at::Tensor& t) { return t.defined() ? adoptKernelResult(t, device) : t; };
  return {adopt(std::get<0>(cpu)), adopt(std::get<1>(cpu)), adopt(std::get<2>(cpu))};
}

at::Tensor adoptExternal(const at::Tensor& cpu, c10::DeviceIndex device) {
  TORCH_CHECK(cpu.device().is_cpu(), "adoptExternal expects a CPU tensor, got ", cpu.device());
  c10::StorageImpl* storage = cpu.storage().unsafeGetStorageImpl();
  if (NeuronAllocator::owns(storage->data_ptr()) || !cpu.storage().unique()) {
    return adoptKernelResult(cpu, device);
  }
  const size_t nbytes = storage->nbytes();
  c10::DataPtr taken = storage->set_data_ptr(c10::DataPtr(nullptr, storage->device()));
  taken.unsafe_set_device(c10::Device(kNeuron, device));
  return deviceTensorLike(deviceStorage(std::move(taken), nbytes), cpu);
}

// ------------------------------------------------------------ registration

void recordOpFlags(const std::vector<std::pair<std::string, int>>& ops) {
  std::lock_guard<std::mutex> lock(g_flags_mutex);
  for (const auto& [name, flags] : ops) {
    opFlags()["aten::" + name] = flags;
  }
}

void registerNativeOps(const std::vector<std::pair<std::string, int>>& ops) {
  recordOpFlags(ops);
  // Leaked: destroying a torch::Library at interpreter exit aborts.
  auto* library = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& [name, flags] : ops) {
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&nativeKernel>());
  }
}

void registerFallbackOps(const std::vector<std::string>& names) {
  auto* library = new torch::Library(  // leaked, as registerNativeOps' library
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const auto& name : names) {
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallbackKernel>());
  }
}

void DirectOp::bind() {
  const char* dot = std::strchr(schema_, '.');
  const std::string name = "aten::" + (dot ? std::string(schema_, dot) : std::string(schema_));
  // Throws "Could not find schema for aten::..." for an op that does not exist.
  handle_ = new c10::OperatorHandle(
      c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), dot ? dot + 1 : ""));
  // The counter the generic path uses for the same op (OpMeta::executed).
  counter_ = executedTable().get(c10::toString(handle_->operator_name()));
}

void runNative(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  nativeKernel(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
}

bool needsFp64Emulation(const at::Tensor& tensor) {
  const auto dtype = tensor.scalar_type();
  return (dtype == at::kDouble || dtype == at::kComplexDouble) && fp64Mode() == Fp64Mode::Emulate;
}

std::map<std::string, int64_t> executedOps() {
  return executedTable().nonzero();
}

std::atomic<int64_t>* executedCounter(const std::string& name) {
  return executedTable().get(name);
}

std::map<std::string, int64_t> fallbackOps() {
  return fallbackTable().nonzero();
}

void clearOpTracking() {
  executedTable().clear();
  fallbackTable().clear();
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallbackKernel>());
}

} // namespace torch_neuronx
