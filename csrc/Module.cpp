// Python bindings: torch_neuronx._C. The only file that includes
// torch/extension.h; everything it exposes is a thin wrapper over the core.
#include "Allocator.h"
#include "Eager.h"
#include "Generator.h"
#include "Recorder.h"
#include "Runtime.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

namespace torch_neuronx {
void registerHooks();
}

namespace {

namespace tn = torch_neuronx;

py::list memorySnapshot() {
  py::list blocks;
  for (const auto& block : tn::neuronAllocator().snapshot()) {
    py::dict entry;
    entry["device"] = static_cast<int>(block.device);
    entry["address"] = block.address;
    entry["size"] = block.size;
    entry["requested_size"] = block.requested;
    entry["allocated"] = block.allocated;
    entry["pool"] = block.small_pool ? "small" : "large";
    blocks.append(entry);
  }
  return blocks;
}

// A dict name -> integer value of a C++ enum.
template <class Enum>
py::dict enumValues(std::initializer_list<std::pair<const char*, Enum>> entries) {
  py::dict values;
  for (const auto& [name, value] : entries) {
    values[name] = static_cast<int>(value);
  }
  return values;
}

// ------------------------------------------------------------ the audit's recorder

py::object toPython(const tn::ArgDescription& arg) {
  using Kind = tn::ArgDescription::Kind;
  switch (arg.kind) {
    case Kind::Tensor: {
      py::dict tensor;
      tensor["dtype"] = arg.text;
      tensor["shape"] = arg.sizes;
      tensor["device"] = arg.device;
      return std::move(tensor);
    }
    case Kind::List: {
      py::list items;
      for (const auto& item : arg.items) {
        items.append(toPython(item));
      }
      return std::move(items);
    }
    case Kind::Int:
      return py::int_(arg.integer);
    case Kind::Bool:
      return py::bool_(arg.integer != 0);
    case Kind::Double:
      return py::float_(arg.real);
    case Kind::String:
      return py::str(arg.text);
    case Kind::Other: {
      py::dict other;
      other["type"] = arg.text;
      return std::move(other);
    }
    case Kind::None:
      break;
  }
  return py::none();
}

const char* pathName(tn::CallPath path) {
  switch (path) {
    case tn::CallPath::Native:
      return "native";
    case tn::CallPath::Fallback:
      return "fallback";
    case tn::CallPath::Direct:
      return "direct";
  }
  return "native";
}

// One call of a native op whose kernel is Python (torch_neuronx/ops/float8.py),
// recorded as the alias kernel records its ops, path "direct": a context
// manager around the kernel's body (the device calls the body makes are
// nested, so not recorded). Arguments are matched to the op's schema.
class PythonKernelCall {
 public:
  PythonKernelCall(const std::string& op, const std::string& overload, py::tuple args)
      : handle_(c10::Dispatcher::singleton().findSchemaOrThrow(op.c_str(), overload.c_str())),
        args_(std::move(args)) {}

  void enter() {
    const auto& arguments = handle_.schema().arguments();
    std::vector<c10::IValue> values;
    values.reserve(arguments.size());
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (i < args_.size()) {
        values.push_back(torch::jit::toIValue(args_[i], arguments[i].type()));
      } else if (arguments[i].default_value()) {
        values.push_back(*arguments[i].default_value());
      } else {
        values.emplace_back();
      }
    }
    call_ = std::make_unique<tn::RecordedCall>(handle_, values.data(), values.size(), tn::CallPath::Direct);
  }

  void exit() { call_.reset(); }

 private:
  c10::OperatorHandle handle_;
  py::tuple args_;
  std::unique_ptr<tn::RecordedCall> call_;
};

// on_signature(id, op, path, args, allocated) -> bool; on_call(id). A Python
// error in either is reported as unraisable and ignored: the audit must not
// break the program it watches.
void startAudit(py::function on_signature, py::function on_call) {
  auto signature = std::make_shared<py::function>(std::move(on_signature));
  auto call = std::make_shared<py::function>(std::move(on_call));
  tn::startRecording(
      [signature](const tn::SignatureInfo& info) {
        py::gil_scoped_acquire gil;
        try {
          py::list args;
          for (const auto& arg : info.args) {
            args.append(toPython(arg));
          }
          return (*signature)(info.id, info.op, pathName(info.path), args, info.allocated)
              .cast<bool>();
        } catch (py::error_already_set& error) {
          error.discard_as_unraisable("torch_neuronx audit: on_signature");
          return false;
        }
      },
      [call](int64_t id) {
        py::gil_scoped_acquire gil;
        try {
          (*call)(id);
        } catch (py::error_already_set& error) {
          error.discard_as_unraisable("torch_neuronx audit: on_call");
        }
      });
}

} // namespace

PYBIND11_MODULE(_C, m) {
  tn::registerHooks();
  m.doc() = "torch_neuronx native core: the emulated NeuronCore runtime";

  m.def("_configure", &tn::configure, py::arg("num_devices"), py::arg("capacity_bytes"));
  m.def("_device_count", [] { return static_cast<int>(tn::deviceCount()); });
  m.def("_device_capacity", [](int index) { return tn::deviceCapacity(static_cast<c10::DeviceIndex>(index)); });
  m.def("_current_device", [] { return static_cast<int>(tn::currentDevice()); });
  m.def("_set_device", [](int index) { tn::setCurrentDevice(static_cast<c10::DeviceIndex>(index)); });
  m.def("_exchange_device", [](int index) {
    return static_cast<int>(tn::exchangeDevice(static_cast<c10::DeviceIndex>(index)));
  });
  m.def("_init", &tn::lazyInit);
  m.def("_is_initialized", &tn::isInitialized);
  m.def("_is_in_bad_fork", &tn::isInBadFork);
  // The GIL is released: the workers being drained may need it.
  m.def("_drain_autograd_workers", &tn::drainAutogradWorkers,
        py::call_guard<py::gil_scoped_release>());

  // The C++ enums, by name, for torch_neuronx/ops (which keeps the Python API
  // in words): the values the setters take and the getters return.
  m.attr("_fallback_modes") = enumValues<tn::FallbackMode>({
      {"warn", tn::FallbackMode::Warn},
      {"silent", tn::FallbackMode::Silent},
      {"error", tn::FallbackMode::Error},
  });
  m.attr("_fp64_modes") = enumValues<tn::Fp64Mode>({
      {"emulate", tn::Fp64Mode::Emulate},
      {"native", tn::Fp64Mode::Native},
  });
  m.attr("_op_flags") = enumValues<tn::OpFlags>({
      {"cross_device", tn::kCrossDevice},
      {"exact_fp64", tn::kExactFp64},
  });
  m.def("_set_fallback_mode", [](int mode) { tn::setFallbackMode(static_cast<tn::FallbackMode>(mode)); });
  m.def("_get_fallback_mode", [] { return static_cast<int>(tn::fallbackMode()); });
  m.def("_set_fp64_mode", [](int mode) { tn::setFp64Mode(static_cast<tn::Fp64Mode>(mode)); });
  m.def("_get_fp64_mode", [] { return static_cast<int>(tn::fp64Mode()); });

  m.def("_register_native_ops", &tn::registerNativeOps);
  m.def("_executed_ops", &tn::executedOps);
  m.def("_fallback_ops", &tn::fallbackOps);
  m.def("_clear_op_tracking", &tn::clearOpTracking);

  // The audit's recorder (csrc/Recorder.h, torch_neuronx/audit/recorder.py).
  m.def("_audit_start", &startAudit, py::arg("on_signature"), py::arg("on_call"));
  m.def("_audit_stop", &tn::stopRecording);
  m.def("_audit_signatures", [] {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> rows;
    for (const auto& totals : tn::recordedSignatures()) {
      rows.emplace_back(totals.id, totals.calls, totals.host_ns);
    }
    return rows;
  }, "(id, calls, host nanoseconds) of every signature recorded so far.");
  m.def("_audit_calls", &tn::recordedCalls);
  py::class_<PythonKernelCall>(m, "_AuditKernelCall",
                               "with _AuditKernelCall('aten::op', 'overload', args): the recorded call "
                               "of a Python kernel (ops/float8.py)")
      .def(py::init<const std::string&, const std::string&, py::tuple>())
      .def("__enter__", [](PythonKernelCall& self) { self.enter(); })
      .def("__exit__", [](PythonKernelCall& self, py::args) { self.exit(); });
  m.def("_audit_allocated", [](int device) {
    return tn::neuronAllocator().allocatedBytes(static_cast<c10::DeviceIndex>(device));
  }, "Bytes allocated on a core now (memory_allocated without building the whole stats dict).");
  m.def("_audit_take_window_peak", [](int device) {
    return tn::neuronAllocator().takeWindowPeak(static_cast<c10::DeviceIndex>(device));
  });

  m.def("_memory_snapshot", &memorySnapshot);
  // Host memory, in the vocabulary of csrc/Eager.h.
  m.def("_host_alias", &tn::hostAlias,
        "The host alias of a neuron tensor: a CPU tensor over the same memory (no copy).");
  m.def("_owning_host_alias", &tn::owningHostAlias,
        "A host alias that keeps the neuron tensor's memory alive as long as it lives.");
  m.def("_adopt_external", [](const at::Tensor& cpu, int device) {
    return tn::adoptExternal(cpu, static_cast<c10::DeviceIndex>(device));
  }, "A neuron tensor taking over the memory of a CPU tensor produced outside PyTorch "
     "(an XLA result received by DLPack); not counted in the allocator's statistics.");

  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(tn::defaultGenerator(static_cast<c10::DeviceIndex>(index))));
  });
}
