// The registry header is compiled only with USE_KINETO, as PyTorch itself was
// (the CPU wheel ships Kineto: torch.autograd.kineto_available()).
#define USE_KINETO 1
// Kineto's activity formats its metadata with fmt, which libtorch does not
// export: compile the part this file uses into the extension.
#define FMT_HEADER_ONLY 1

#include "Profiler.h"
#include "Recorder.h"

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

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

// GenericTraceActivity's out-of-line virtual (its key function) lives in
// libtorch_cpu but is not exported, so its vtable is not either: an extension
// that creates the activity PyTorch's own logger copies defines it, doing what
// the interface says (hand the activity to the logger's generic handler).
void libkineto::GenericTraceActivity::log(libkineto::ActivityLogger& logger) const {
  logger.handleGenericActivity(*this);
}

namespace torch_neuronx::profiler {
namespace {

// The events of the session being recorded. Leaked: kernels may finish during
// static destruction.
struct Buffer {
  std::mutex mutex;
  std::vector<KernelEvent> events;
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
    activity.id = static_cast<int32_t>(correlation);
    activity.linked = annotation;
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
  void start() override {
    {
      std::lock_guard<std::mutex> lock(buffer().mutex);
      buffer().events.clear();
    }
    detail::g_device_hooks.fetch_or(detail::kProfilerHook);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    detail::g_device_hooks.fetch_and(static_cast<uint8_t>(~detail::kProfilerHook));
    std::lock_guard<std::mutex> lock(buffer().mutex);
    events_ = std::move(buffer().events);
    buffer().events.clear();
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

 private:
  c10::DeviceIndex firstCore() const {
    c10::DeviceIndex first = events_.empty() ? 0 : events_.front().device;
    for (const auto& event : events_) {
      first = std::min(first, event.device);
    }
    return first;
  }

  std::vector<KernelEvent> events_;
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
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    // Asked for only when the profile includes the device (PrivateUse1).
    if (types.count(libkineto::ActivityType::CONCURRENT_KERNEL) == 0) {
      return nullptr;
    }
    return std::make_unique<Session>();
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
  b.events.push_back(std::move(event));
}

void registerProfiler() {
  static const bool registered = [] {
    torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
        [] { return std::make_unique<NeuronActivityProfiler>(); });
    return true;
  }();
  (void)registered;
}

} // namespace torch_neuronx::profiler
