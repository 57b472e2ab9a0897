// Python bindings: torch_neuronx._C. The only file that includes
// torch/extension.h; everything it exposes is a thin wrapper over the core.
#include "Allocator.h"
#include "Concatenation.h"
#include "DeviceLimits.h"
#include "Dropout.h"
#include "Eager.h"
#include "Generator.h"
#include "Guard.h"
#include "Profiler.h"
#include "Recorder.h"
#include "Runtime.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/extension.h>

#include <optional>
#include <unordered_map>

namespace torch_neuronx {
void registerHooks();
}

namespace {

namespace tn = torch_neuronx;

// ------------------------------------------------------------ memory history
// Stacks are gathered the way CUDA's allocator gathers them
// (torch/csrc/cuda/memory_snapshot.cpp): Python and TorchScript frames, plus
// the C++ frames for stacks="all".
std::shared_ptr<c10::GatheredContext> gatherPythonStack() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/false);
}

std::shared_ptr<c10::GatheredContext> gatherFullStack() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/true);
}

// Arguments already validated by torch_neuronx/neuron/memory.py.
void recordMemoryHistory(bool enabled, int context, bool cpp_frames, size_t max_entries,
                         bool clear, uint32_t skip_actions) {
  tn::HistorySettings settings;
  settings.enabled = enabled;
  settings.context = static_cast<c10::CachingDeviceAllocator::RecordContext>(context);
  settings.recorder = cpp_frames ? &gatherFullStack : &gatherPythonStack;
  settings.max_entries = max_entries;
  settings.clear = clear;
  settings.skip_actions = skip_actions;
  if (enabled && cpp_frames) {
    torch::unwind::unwind();  // warm up C++ unwinding before the first allocation needs it
  }
  tn::neuronAllocator().recordHistory(settings);
}

// Fills the "frames" of every dict that has a stack: symbolized in one batch,
// as lists of {"filename", "line", "name"} (frames shared between stacks are
// built once).
class FrameFiller {
 public:
  void add(py::dict owner, const std::shared_ptr<c10::GatheredContext>& stack) {
    if (stack == nullptr) {
      owner["frames"] = py::list();
      return;
    }
    stacks_.push_back(torch::getCapturedTracebackFromContext(stack));
    owners_.push_back(std::move(owner));
  }

  void fill() {
    std::unordered_map<torch::CapturedTraceback*, size_t> index;
    std::vector<torch::CapturedTraceback*> unique;
    for (auto* stack : stacks_) {
      if (index.emplace(stack, unique.size()).second) {
        unique.push_back(stack);
      }
    }
    const auto symbolized = torch::symbolize(unique);
    std::vector<py::dict> frames;
    for (const auto& frame : symbolized.all_frames) {
      py::dict entry;
      entry["filename"] = frame.filename;
      entry["line"] = frame.lineno;
      entry["name"] = frame.funcname;
      frames.push_back(std::move(entry));
    }
    std::vector<py::list> lists;
    for (const auto& traceback : symbolized.tracebacks) {
      py::list list;
      for (uint64_t frame : traceback) {
        list.append(frames.at(frame));
      }
      lists.push_back(std::move(list));
    }
    for (size_t i = 0; i < owners_.size(); ++i) {
      owners_[i]["frames"] = lists.at(index.at(stacks_[i]));
    }
  }

 private:
  std::vector<torch::CapturedTraceback*> stacks_;
  std::vector<py::dict> owners_;
};

// CUDA's names of the allocator's actions (torch.cuda.memory._snapshot()).
using Action = c10::CachingDeviceAllocator::TraceEntry::Action;
constexpr std::pair<const char*, Action> kActionNames[] = {
    {"alloc", Action::ALLOC},
    {"free_requested", Action::FREE_REQUESTED},
    {"free_completed", Action::FREE_COMPLETED},
    {"segment_alloc", Action::SEGMENT_ALLOC},
    {"segment_free", Action::SEGMENT_FREE},
    {"segment_map", Action::SEGMENT_MAP},
    {"segment_unmap", Action::SEGMENT_UNMAP},
    {"snapshot", Action::SNAPSHOT},
    {"oom", Action::OOM},
};

const char* actionName(Action action) {
  for (const auto& [name, value] : kActionNames) {
    if (value == action) {
      return name;
    }
  }
  return "unknown";
}

// The dict torch.cuda.memory._snapshot() returns, with the same keys.
py::dict memorySnapshot() {
  tn::MemorySnapshot snapshot;
  {
    py::gil_scoped_release no_gil;  // the allocator's locks are never held while waiting for the GIL
    snapshot = tn::neuronAllocator().snapshot();
  }
  FrameFiller frames;
  py::list segments;
  for (const auto& segment : snapshot.segments) {
    py::dict entry;
    entry["device"] = static_cast<int>(segment.device);
    entry["address"] = segment.address;
    entry["total_size"] = segment.total_size;
    entry["allocated_size"] = segment.allocated_size;
    entry["active_size"] = segment.active_size;
    entry["requested_size"] = segment.requested_size;
    entry["stream"] = 0;
    entry["segment_type"] = segment.is_large ? "large" : "small";
    entry["segment_pool_id"] = py::make_tuple(0, 0);
    entry["is_expandable"] = false;
    frames.add(entry, segment.context_when_allocated);
    py::list blocks;
    size_t address = segment.address;
    for (const auto& block : segment.blocks) {
      py::dict info;
      info["address"] = address;
      info["size"] = block.size;
      info["requested_size"] = block.requested_size;
      info["state"] = block.allocated ? "active_allocated" : "inactive";
      frames.add(info, block.context_when_allocated);
      blocks.append(info);
      address += block.size;
    }
    entry["blocks"] = blocks;
    segments.append(entry);
  }
  py::list traces;
  for (const auto& device_trace : snapshot.device_traces) {
    py::list trace;
    for (const auto& te : device_trace) {
      py::dict entry;
      entry["action"] = actionName(te.action_);
      entry[te.action_ == c10::CachingDeviceAllocator::TraceEntry::OOM ? "device_free" : "addr"] = te.addr_;
      entry["size"] = te.size_;
      entry["stream"] = 0;
      entry["time_us"] = static_cast<int64_t>(te.time_.t_);
      entry["compile_context"] = te.compile_context_;
      entry["user_metadata"] = te.user_metadata_;
      if (te.context_ != nullptr) {  // as CUDA: no "frames" key without a stack
        frames.add(entry, te.context_);
      }
      trace.append(entry);
    }
    traces.append(trace);
  }
  frames.fill();
  py::dict settings;
  settings["expandable_segments"] = false;
  py::dict result;
  result["segments"] = segments;
  result["device_traces"] = traces;
  result["external_annotations"] = py::list();
  result["allocator_settings"] = settings;
  return result;
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
// `with _C._CaptureScope(device):` CPU allocations made on this thread come
// from the device allocator (csrc/Allocator.h), so that results a Python kernel
// computes on host aliases (ops/composites.py on_host_aliases) are device
// memory, counted in its statistics and under its capacity, adopted without a copy.
class PythonCaptureScope {
 public:
  explicit PythonCaptureScope(int device) : device_(static_cast<c10::DeviceIndex>(device)) {}
  void enter() {
    tn::installCaptureAllocator();
    scope_.emplace(device_);
  }
  void exit() { scope_.reset(); }

 private:
  c10::DeviceIndex device_;
  std::optional<tn::CaptureScope> scope_;
};

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

// on_signature(id, op, path, args, allocated) -> flags (Recorder.h); on_call(id). A Python
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
              .cast<uint8_t>();
        } catch (py::error_already_set& error) {
          error.discard_as_unraisable("torch_neuronx audit: on_signature");
          return uint8_t{0};
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

// Concatenation.h's WithGil: not at exit (the interpreter may be gone) nor on
// threads Python has never run on (autograd workers, gloo's), where the
// objects freed, if any, take the GIL themselves as before.
void withGil(void (*fn)(void*), void* arg) {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (!Py_IsInitialized() || finalizing || PyGILState_GetThisThreadState() == nullptr || PyGILState_Check()) {
    fn(arg);
    return;
  }
  py::gil_scoped_acquire gil;
  fn(arg);
}

} // namespace

PYBIND11_MODULE(_C, m) {
  tn::registerHooks();
  tn::profiler::registerProfiler();
  tn::setWithGil(&withGil);
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
      {"ends_fused_sequence", tn::kEndsFusedSequence},
  });
  m.def("_set_fallback_mode", [](int mode) { tn::setFallbackMode(static_cast<tn::FallbackMode>(mode)); });
  m.def("_set_concatenation", &tn::setConcatenation, py::arg("enabled"), py::arg("launch_blocking"),
        py::arg("buffer_limit"),
        "Adaptive Eager Execution's queue on or off (Concatenation.h); runs what is queued first.");
  m.def("_concatenation_enabled", &tn::concatenationEnabled);
  m.def("_concatenation_async", &tn::setConcatenationAsync, py::arg("async_"),
        "A full queue runs on the device thread (True) or at once on the calling thread (False).");
  m.def("_any_cpu_loops", &tn::useAnyCpuLoops, py::arg("any_cpu"),
        "Tests: the device's own loops (the queue's, linear's one-row product) built for any CPU, "
        "even where AVX2+FMA ones could run.");
  m.def("_concatenation_stats", [] {
    const auto stats = tn::concatenationStats();
    return std::make_tuple(stats.launches, stats.ops, stats.sequences, stats.device_thread_launches);
  }, "(launches, ops, sequences, device-thread launches): the queue's launches since start, the ops "
     "they ran, how many distinct op sequences they were, and how many of the launches the device "
     "thread ran (asynchronously).");
  m.def("_run_queued", &tn::runQueued, "Runs the ops concatenation has queued.");
  m.def("_get_fallback_mode", [] { return static_cast<int>(tn::fallbackMode()); });
  m.def("_set_device_limits_enforced", &tn::setDeviceLimitsEnforced);
  m.def("_device_limits_enforced", &tn::deviceLimitsEnforced);
  m.def("_set_fp64_mode", [](int mode) { tn::setFp64Mode(static_cast<tn::Fp64Mode>(mode)); });
  m.def("_get_fp64_mode", [] { return static_cast<int>(tn::fp64Mode()); });

  m.def("_register_native_ops", &tn::registerNativeOps);
  m.def("_record_op_flags", &tn::recordOpFlags);
  m.def("_register_fallback_ops", &tn::registerFallbackOps);
  m.def("_executed_ops", &tn::executedOps);
  m.def("_fallback_ops", &tn::fallbackOps);
  m.def("_clear_op_tracking", &tn::clearOpTracking);

  // The audit's recorder (csrc/Recorder.h, torch_neuronx/audit/recorder.py).
  m.def("_audit_start", &startAudit, py::arg("on_signature"), py::arg("on_call"));
  m.def("_audit_stop", &tn::stopRecording);
  m.def("_audit_signatures", [](bool at_mark) {
    std::vector<std::tuple<int64_t, int64_t, int64_t>> rows;
    for (const auto& totals : tn::recordedSignatures(at_mark)) {
      rows.emplace_back(totals.id, totals.calls, totals.host_ns);
    }
    return rows;
  }, py::arg("at_mark") = false,
     "(id, calls, host nanoseconds) of every signature recorded so far, or at_mark=True: as they were "
     "at the last _audit_mark_step().");
  m.def("_audit_ignore_calls", &tn::setIgnoringCalls, py::arg("ignoring"),
        "While True, this thread's device calls are not recorded (the audit's own work); returns the "
        "previous value.");
  m.def("_audit_mark_step", &tn::markStepTotals,
        "Keeps every signature's totals as they are now (the end of a step).");
  m.def("_audit_calls", &tn::recordedCalls);
  // The audit's model of fusion (Recorder.h, torch_neuronx/audit/fusion.py).
  m.def("_audit_fusion_cut", &tn::fusionCut, py::arg("reason"),
        "Ends the open fused sequence: a cut that is not an op call (FusionCut codes).");
  m.def("_audit_fusion_limit", &tn::setFusionLimit, py::arg("limit"));
  m.def("_audit_take_fused_sequences", []() {
    std::vector<std::tuple<int64_t, std::vector<int64_t>, int64_t, std::vector<std::pair<int64_t, int64_t>>>> rows;
    for (auto& tally : tn::takeFusedSequences()) {
      rows.emplace_back(tally.id, std::move(tally.ops), tally.launches, std::move(tally.ended_by));
    }
    return rows;
  }, "Closes the open sequence; (id, signature ids, launches, [(ended by, count)]) of every sequence "
     "launched since the last take.");
  py::class_<PythonKernelCall>(m, "_AuditKernelCall",
                               "with _AuditKernelCall('aten::op', 'overload', args): the recorded call "
                               "of a Python kernel (ops/__init__.py _tracked): the audit's signature and the profiler's device event")
      .def(py::init<const std::string&, const std::string&, py::tuple>())
      .def("__enter__", [](PythonKernelCall& self) { self.enter(); })
      .def("__exit__", [](PythonKernelCall& self, py::args) { self.exit(); });
  py::class_<PythonCaptureScope>(m, "_CaptureScope",
                                 "with _CaptureScope(device): CPU allocations on this thread come from the "
                                 "device allocator (results computed on host aliases are device memory)")
      .def(py::init<int>())
      .def("__enter__", [](PythonCaptureScope& self) { self.enter(); })
      .def("__exit__", [](PythonCaptureScope& self, py::args) { self.exit(); });
  m.def("_audit_allocated", [](int device) {
    return tn::neuronAllocator().allocatedBytes(static_cast<c10::DeviceIndex>(device));
  }, "Bytes allocated on a core now (memory_allocated without building the whole stats dict).");
  m.def("_audit_take_window_peak", [](int device) {
    return tn::neuronAllocator().takeWindowPeak(static_cast<c10::DeviceIndex>(device));
  });

  // torch.profiler's device activity (csrc/Profiler.h, torch_neuronx/profiling.py).
  m.def("_profiler_collecting", &tn::profiler::collecting);
  m.def("_profiler_now_ns", &tn::profiler::nowNs);
  m.def("_profiler_record", [](std::string name, int device, int64_t start_ns, int64_t end_ns,
                               std::vector<std::pair<std::string, std::string>> args) {
    tn::profiler::KernelEvent event;
    event.name = std::move(name);
    event.device = static_cast<c10::DeviceIndex>(device);
    event.stream = tn::currentStream(event.device).id();
    event.start_ns = start_ns;
    event.end_ns = end_ns;
    std::tie(event.correlation, event.user_correlation) = tn::profiler::currentCorrelation();
    event.args = std::move(args);
    tn::profiler::record(std::move(event));
  }, py::arg("name"), py::arg("device"), py::arg("start_ns"), py::arg("end_ns"), py::arg("args"),
     "Records a kernel that ran on a core from start_ns to end_ns (profiler clock) on its current "
     "stream, linked to the calling thread's current CPU op; args: (key, JSON value) pairs.");

  m.def("_memory_snapshot", &memorySnapshot);
  // The history's vocabulary (torch_neuronx/neuron/memory.py): RecordContext
  // levels by the names of _record_memory_history's `context`, actions by name.
  using c10::CachingDeviceAllocator::RecordContext;
  m.attr("_record_contexts") = enumValues<RecordContext>({
      {"never", RecordContext::NEVER},
      {"state", RecordContext::STATE},
      {"alloc", RecordContext::ALLOC},
      {"all", RecordContext::ALL},
  });
  py::dict actions;
  for (const auto& [name, value] : kActionNames) {
    actions[name] = static_cast<int>(value);
  }
  m.attr("_trace_actions") = actions;
  m.def("_record_memory_history", &recordMemoryHistory, py::arg("enabled"), py::arg("context"),
        py::arg("cpp_frames"), py::arg("max_entries"), py::arg("clear"), py::arg("skip_actions"));
  // Host memory, in the vocabulary of csrc/Eager.h.
  m.def("_host_alias", &tn::hostAlias,
        "The host alias of a neuron tensor: a CPU tensor over the same memory (no copy).");
  m.def("_owning_host_alias", &tn::owningHostAlias,
        "A host alias that keeps the neuron tensor's memory alive as long as it lives.");
  m.def("_adopt_external", [](const at::Tensor& cpu, int device) {
    return tn::adoptExternal(cpu, static_cast<c10::DeviceIndex>(device));
  }, "A neuron tensor taking over the memory of a CPU tensor produced outside PyTorch "
     "(an XLA result received by DLPack); not counted in the allocator's statistics.");

  m.def("_dropout_mask_scale", &tn::dropoutMaskScale, py::arg("x"), py::arg("mask"), py::arg("scale"),
        "x * mask * scale on host tensors (a boolean mask), as PyTorch computes it, without "
        "converting the mask first (attention's dropout).");

  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(tn::defaultGenerator(static_cast<c10::DeviceIndex>(index))));
  });
  m.def("_next_default_stream", [](int index) {
    return tn::nextDefaultStream(static_cast<c10::DeviceIndex>(index));
  }, "The seed of the next stream of a core's default generator; advances its offset by one.");
}
