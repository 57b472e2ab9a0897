// The registry header is compiled only with USE_KINETO, as PyTorch itself was
// (the CPU wheel ships Kineto: torch.autograd.kineto_available()).
#define USE_KINETO 1
// Kineto's activity formats its metadata with fmt, which libtorch does not
// export: compile the part this file uses into the extension.
#define FMT_HEADER_ONLY 1

#include "Profiler.h"
#include "Recorder.h"

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/util/ApproximateClock.h>

#include <ActivityType.h>
#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

// GenericTraceActivity's out-of-line virtual (its key function) lives in
// libtorch_cpu but is not exported, so its vtable is not either: an extension
// that creates the activity PyTorch's own logger copies defines it, doing what
// the interface says (hand the activity to the logger's generic handler).
void libkineto::GenericTraceActivity::log(libkineto::ActivityLogger& logger) const {
  logger.handleGenericActivity(*this);
}

namespace torch_neuronx::profiler {
namespace {

// What a profile records, from the custom_profiler_config string that
// torch_neuronx.profiling.NeuronConfig builds ("key:value;...": AWS's
// max_events_per_nc and capture_enabled_for_nc, the cores listed one by one).
struct Capture {
  bool device_events = true;         // neither RUNTIME nor DEVICE mode: none
  int64_t max_events_per_core = -1;  // -1: no limit
  std::set<c10::DeviceIndex> cores;  // empty: every core

  static Capture parse(const std::string& text) {
    Capture capture;
    std::stringstream items(text);
    std::string item;
    while (std::getline(items, item, ';')) {
      const auto eq = item.find(':');
      if (eq == std::string::npos) {
        continue;  // not ours (another backend's options): ignored
      }
      const auto key = item.substr(0, eq);
      std::stringstream values(item.substr(eq + 1));
      std::string value;
      if (key == "neuron_device_events") {
        capture.device_events = values.str() != "0";
      } else if (key == "neuron_max_events_per_nc") {
        capture.max_events_per_core = std::stoll(values.str());
      } else if (key == "neuron_capture_enabled_for_nc") {
        while (std::getline(values, value, ',')) {
          capture.cores.insert(static_cast<c10::DeviceIndex>(std::stoi(value)));
        }
      }
    }
    return capture;
  }
};

// The events of the session being recorded. Leaked: kernels may finish during
// static destruction.
struct Buffer {
  std::mutex mutex;
  std::vector<KernelEvent> events;
  Capture capture;
  std::map<c10::DeviceIndex, int64_t> per_core;
  int64_t dropped = 0;  // over max_events_per_nc
};

Buffer& buffer() {
  static auto* b = new Buffer();
  return *b;
}

// Correlation ids PyTorch pushes around each CPU op (and record_function
// range) while a session exists; the innermost is the launching op.
thread_local std::vector<uint64_t> t_correlation;
thread_local std::vector<uint64_t> t_user_correlation;
// watchLaunch(): the depth of the kernel's direct callees, the first of them.
thread_local size_t t_watch_depth = 0;
thread_local uint64_t t_first_child = 0;

// Kineto's activity spans must outlive every trace that refers to them (a
// profile's result is exported after the next one started): one per process.
const libkineto::TraceSpan& traceSpan() {
  static auto* span = new libkineto::TraceSpan(0, 0, "neuron");
  return *span;
}

// The device tracks: one "process" per NeuronCore, one "thread" per stream,
// as CUDA's GPU tracks are laid out (pid = device, tid = stream).
libkineto::DeviceInfo coreInfo(c10::DeviceIndex device) {
  return libkineto::DeviceInfo{device, device + 1000000, "neuron:" + std::to_string(device),
                               "NeuronCore " + std::to_string(device) + " (emulated)"};
}

std::map<c10::DeviceIndex, std::set<int64_t>> tracks(const std::vector<KernelEvent>& events) {
  std::map<c10::DeviceIndex, std::set<int64_t>> streams;
  for (const auto& event : events) {
    streams[event.device].insert(event.stream);
  }
  return streams;
}

// The events a user annotation (record_function) spans on each core and
// stream, as Kineto shows them for CUDA (gpu_user_annotation).
void logUserAnnotations(libkineto::ActivityLogger& logger,
                        const libkineto::getLinkedActivityCallback& linked,
                        const std::vector<KernelEvent>& events) {
  std::map<std::tuple<c10::DeviceIndex, int64_t, uint64_t>, std::pair<int64_t, int64_t>> spans;
  for (const auto& event : events) {
    if (event.user_correlation == 0) {
      continue;
    }
    auto [it, inserted] = spans.try_emplace({event.device, event.stream, event.user_correlation},
                                            event.start_ns, event.end_ns);
    if (!inserted) {
      it->second.first = std::min(it->second.first, event.start_ns);
      it->second.second = std::max(it->second.second, event.end_ns);
    }
  }
  for (const auto& [key, span] : spans) {
    const auto& [device, stream, correlation] = key;
    const auto* annotation = linked(static_cast<int32_t>(correlation));
    if (annotation == nullptr) {
      continue;
    }
    libkineto::GenericTraceActivity activity(
        traceSpan(), libkineto::ActivityType::GPU_USER_ANNOTATION, annotation->name());
    activity.startTime = span.first;
    activity.endTime = span.second;
    activity.device = device;
    activity.resource = static_cast<int32_t>(stream);
    // Not linked to the CPU range, as Kineto leaves CUDA's: linked, PyTorch
    // would add the span to the range's device time on top of its kernels.
    activity.id = static_cast<int32_t>(correlation);
    logger.handleGenericActivity(activity);
  }
}

// The CPU op a kernel is linked to: its launching op, or the same-named op
// that one called first (see watchLaunch).
const libkineto::ITraceActivity* launcher(const libkineto::getLinkedActivityCallback& linked,
                                          const KernelEvent& event) {
  const auto* outer = linked(static_cast<int32_t>(event.correlation));
  if (outer != nullptr && event.first_child != 0) {
    const auto* inner = linked(static_cast<int32_t>(event.first_child));
    if (inner != nullptr && inner->name() == outer->name()) {
      return inner;
    }
  }
  return outer;
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  explicit Session(Capture capture) : capture_(std::move(capture)) {}

  void start() override {
    {
      auto& b = buffer();
      std::lock_guard<std::mutex> lock(b.mutex);
      b.events.clear();
      b.capture = capture_;
      b.per_core.clear();
      b.dropped = 0;
    }
    detail::g_device_hooks.fetch_or(detail::kProfilerHook);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    detail::g_device_hooks.fetch_and(static_cast<uint8_t>(~detail::kProfilerHook));
    std::lock_guard<std::mutex> lock(buffer().mutex);
    events_ = std::move(buffer().events);
    buffer().events.clear();
    dropped_ = buffer().dropped;
    status_ = libkineto::TraceStatus::READY;
  }

  std::vector<std::string> errors() override {
    return {};
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t startTime,
                    int64_t /*endTime*/) override {
    // The first core is described by getDeviceInfo() (which keeps Kineto from
    // labelling pids 0-15 as GPUs), the others here.
    const auto streams = tracks(events_);
    for (const auto& [device, ids] : streams) {
      if (device != firstCore()) {
        logger.handleDeviceInfo(coreInfo(device), startTime);
      }
      for (auto id : ids) {
        logger.handleResourceInfo(
            libkineto::ResourceInfo{id, id, device, "stream " + std::to_string(id)}, startTime);
      }
    }
    for (const auto& event : events_) {
      libkineto::GenericTraceActivity activity(
          traceSpan(), libkineto::ActivityType::CONCURRENT_KERNEL, event.name);
      activity.startTime = event.start_ns;
      activity.endTime = event.end_ns;
      activity.device = event.device;
      activity.resource = static_cast<int32_t>(event.stream);
      activity.id = static_cast<int32_t>(event.correlation);
      if (event.correlation != 0) {
        activity.linked = launcher(linked, event);
        activity.id = static_cast<int32_t>(activity.linked ? activity.linked->correlationId()
                                                           : event.correlation);
      }
      activity.addMetadataQuoted("device", "neuron:" + std::to_string(event.device));
      activity.addMetadata("stream", event.stream);
      for (const auto& [key, value] : event.args) {
        activity.addMetadata(key, value);
      }
      logger.handleGenericActivity(activity);
    }
    logUserAnnotations(logger, linked, events_);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(coreInfo(firstCore()));
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {};
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return nullptr;
  }

  void pushCorrelationId(uint64_t id) override {
    t_correlation.push_back(id);
    if (t_correlation.size() == t_watch_depth && t_first_child == 0) {
      t_first_child = id;
    }
  }
  void popCorrelationId() override {
    if (!t_correlation.empty()) {
      t_correlation.pop_back();
    }
  }
  void pushUserCorrelationId(uint64_t id) override {
    t_user_correlation.push_back(id);
  }
  void popUserCorrelationId() override {
    if (!t_user_correlation.empty()) {
      t_user_correlation.pop_back();
    }
  }

  std::string getDeviceProperties() override {
    return "";
  }

  std::unordered_map<std::string, std::string> getMetadata() override {
    if (dropped_ == 0) {
      return {};
    }
    return {{"neuron_dropped_events", std::to_string(dropped_)}};
  }

 private:
  c10::DeviceIndex firstCore() const {
    c10::DeviceIndex first = events_.empty() ? 0 : events_.front().device;
    for (const auto& event : events_) {
      first = std::min(first, event.device);
    }
    return first;
  }

  Capture capture_;
  std::vector<KernelEvent> events_;
  int64_t dropped_ = 0;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<libkineto::ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config& config) override {
    // Asked for only when the profile includes the device (PrivateUse1).
    if (types.count(libkineto::ActivityType::CONCURRENT_KERNEL) == 0) {
      return nullptr;
    }
    return std::make_unique<Session>(Capture::parse(config.getCustomConfig()));
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                libkineto::ActivityType::GPU_USER_ANNOTATION};
};

// The legacy PrivateUse1 stubs: what torch.autograd.profiler.profile(
// use_device="neuron") uses when Kineto is not (use_kineto=False, its
// default). An "event" is a timestamp: the emulator runs an op's kernels
// before the op returns, so the time between an op's two records is its
// device time.
struct LegacyStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device != nullptr) {
      *device = 0;
    }
    *event = std::make_shared<int64_t>(nowNs());
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const auto from = *static_cast<const int64_t*>(start->get());
    const auto to = *static_cast<const int64_t*>(end->get());
    return static_cast<float>(to - from) / 1000.0f;  // microseconds, as CUDA's stubs return
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override {
    return true;
  }
  void onEachDevice(std::function<void(int)> op) const override {
    op(0);  // one timeline: every core runs on the host's clock
  }
  void synchronize() const override {}  // nothing is ever pending
};

} // namespace

bool collecting() {
  return (activeHooks() & detail::kProfilerHook) != 0;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::pair<uint64_t, uint64_t> currentCorrelation() {
  return {t_correlation.empty() ? 0 : t_correlation.back(),
          t_user_correlation.empty() ? 0 : t_user_correlation.back()};
}

void watchLaunch() {
  t_watch_depth = t_correlation.size() + 1;
  t_first_child = 0;
}

uint64_t firstChildOfLaunch() {
  t_watch_depth = 0;
  return t_first_child;
}

void record(KernelEvent event) {
  if (!collecting()) {
    return;
  }
  auto& b = buffer();
  std::lock_guard<std::mutex> lock(b.mutex);
  if (!b.capture.device_events ||
      (!b.capture.cores.empty() && b.capture.cores.count(event.device) == 0)) {
    return;  // capture_enabled_for_nc leaves this core out
  }
  auto& count = b.per_core[event.device];
  if (b.capture.max_events_per_core >= 0 && count >= b.capture.max_events_per_core) {
    ++b.dropped;
    return;
  }
  ++count;
  b.events.push_back(std::move(event));
}

void registerProfiler() {
  static const bool registered = [] {
    torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
        [] { return std::make_unique<NeuronActivityProfiler>(); });
    static LegacyStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
    return true;
  }();
  (void)registered;
}

} // namespace torch_neuronx::profiler
