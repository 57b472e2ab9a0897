#include "Recorder.h"
#include "Allocator.h"
#include "Guard.h"
#include "Profiler.h"
#include "Runtime.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_neuronx {

namespace detail {
std::atomic<uint8_t> g_device_hooks{0};
}

struct SignatureEntry {
  int64_t id;
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> host_ns{0};
  std::atomic<bool> watched{false};  // every call is reported (set after the first call)
  std::atomic<FusionRole> role{FusionRole::Boundary};  // set after the first call
  // The totals when the audit last marked the end of a step: what the steps
  // did, without the work after the last one (evaluation, saving).
  int64_t calls_at_mark = 0;
  int64_t host_ns_at_mark = 0;
};

namespace {

struct Table {
  std::mutex mutex;
  std::unordered_map<std::string, std::unique_ptr<SignatureEntry>> entries;
  std::vector<SignatureEntry*> by_id;
  // Entries of earlier recordings: kept alive, a call that began then may still hold one.
  std::vector<std::unique_ptr<SignatureEntry>> retired;
  std::atomic<int64_t> calls{0};
  std::function<uint8_t(const SignatureInfo&)> on_signature;
  std::function<void(int64_t)> on_call;
};

Table& table() {
  static auto* t = new Table();  // leaked: calls may arrive during static destruction
  return *t;
}

// The audit's model of fusion (Recorder.h): the open sequence and, per
// distinct sequence, its launches and what ended them since the last take.
struct FusionModel {
  std::mutex mutex;
  int64_t limit = 1024;
  std::vector<int64_t> open;
  std::map<std::vector<int64_t>, int64_t> ids;
  std::vector<FusedSequenceTally> tallies;  // by id
  std::vector<int64_t> touched;             // ids launched since the last take

  void close(int64_t ended_by) {
    if (open.empty()) {
      return;
    }
    auto found = ids.find(open);
    if (found == ids.end()) {
      const auto id = static_cast<int64_t>(tallies.size());
      tallies.push_back({id, open, 0, {}});
      found = ids.emplace(open, id).first;
    }
    auto& tally = tallies[found->second];
    if (tally.launches == 0) {
      touched.push_back(tally.id);
    }
    ++tally.launches;
    auto cut = std::find_if(tally.ended_by.begin(), tally.ended_by.end(),
                            [&](const auto& item) { return item.first == ended_by; });
    if (cut == tally.ended_by.end()) {
      tally.ended_by.emplace_back(ended_by, 1);
    } else {
      ++cut->second;
    }
    open.clear();
  }

  void observe(const SignatureEntry& entry) {
    const FusionRole role = entry.role.load(std::memory_order_relaxed);
    if (role == FusionRole::Transparent) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (role == FusionRole::Boundary) {
      close(entry.id);  // the boundary itself runs alone
      return;
    }
    if (static_cast<int64_t>(open.size()) >= limit) {
      close(kCutByLimit);
    }
    open.push_back(entry.id);
    if (role == FusionRole::EndsSequence) {
      close(kEndedByItsMatmul);
    }
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex);
    open.clear();
    ids.clear();
    tallies.clear();
    touched.clear();
  }
};

FusionModel& fusion() {
  static auto* model = new FusionModel();  // leaked, as the table
  return *model;
}

thread_local bool t_in_callback = false;
thread_local int t_depth = 0;  // recorded calls in progress on this thread

// ------------------------------------------------------------- signature key
// A compact byte string: the op, then each argument's kind and what the device
// compiles for (dtype, device and shape of tensors; values of integers and
// booleans). Floating-point values are left out: a learning rate that changes
// every step does not make a new kernel.

template <class T>
void put(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void putTensor(std::string& key, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    key.push_back('u');
    return;
  }
  key.push_back('T');
  put(key, static_cast<int8_t>(tensor.scalar_type()));
  put(key, static_cast<int8_t>(tensor.device().type()));
  put(key, static_cast<int8_t>(tensor.dim()));
  for (auto size : tensor.sizes()) {
    put(key, size);
  }
}

void putValue(std::string& key, const c10::IValue& value) {
  if (value.isTensor()) {
    putTensor(key, value.toTensor());
  } else if (value.isNone()) {
    key.push_back('n');
  } else if (value.isInt()) {
    key.push_back('i');
    put(key, value.toInt());
  } else if (value.isBool()) {
    key.push_back(value.toBool() ? 'B' : 'b');
  } else if (value.isDouble()) {
    key.push_back('d');
  } else if (value.isIntList()) {
    key.push_back('I');
    for (auto item : value.toIntVector()) {
      put(key, item);
    }
    key.push_back(';');
  } else if (value.isList()) {
    key.push_back('L');
    for (const auto& item : value.toListRef()) {
      putValue(key, item);
    }
    key.push_back(';');
  } else if (value.isString()) {
    key.push_back('s');
    key.append(value.toStringRef());
    key.push_back(';');
  } else if (value.isDevice()) {
    key.push_back('D');
    put(key, static_cast<int8_t>(value.toDevice().type()));
  } else {
    key.push_back('o');
    put(key, static_cast<int8_t>(value.tagKind().size()));  // cheap and stable per type
    key.append(value.tagKind());
  }
}

// ------------------------------------------------------ description (Python)

ArgDescription describe(const c10::IValue& value) {
  ArgDescription d;
  using Kind = ArgDescription::Kind;
  if (value.isTensor()) {
    const auto& tensor = value.toTensor();
    if (tensor.defined()) {
      d.kind = Kind::Tensor;
      d.text = c10::getDtypeNames(tensor.scalar_type()).first;  // "float32", as torch prints it
      d.sizes = tensor.sizes().vec();
      d.device = tensor.device().str();
    }
  } else if (value.isInt()) {
    d.kind = Kind::Int;
    d.integer = value.toInt();
  } else if (value.isBool()) {
    d.kind = Kind::Bool;
    d.integer = value.toBool();
  } else if (value.isDouble()) {
    d.kind = Kind::Double;
    d.real = value.toDouble();
  } else if (value.isList()) {
    d.kind = Kind::List;
    for (const auto& item : value.toListRef()) {
      d.items.push_back(describe(item));
    }
  } else if (value.isString()) {
    d.kind = Kind::String;
    d.text = value.toStringRef();
  } else if (value.isDevice()) {
    d.kind = Kind::String;
    d.text = value.toDevice().str();
  } else if (!value.isNone()) {
    d.kind = Kind::Other;
    d.text = value.tagKind();
  }
  return d;
}

c10::DeviceIndex callDevice(const c10::IValue* args, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (args[i].isTensor()) {
      const auto& tensor = args[i].toTensor();
      if (tensor.defined() && tensor.device().type() == kNeuron) {
        return tensor.device().index();
      }
    }
  }
  return currentDevice();
}

} // namespace

// -------------------------------------------------------------- RecordedCall

RecordedCall::RecordedCall(const c10::OperatorHandle& op, const c10::IValue* args, size_t count,
                           CallPath path) {
  const uint8_t hooks = activeHooks();
  if (hooks == 0 || t_in_callback || t_depth > 0) {
    return;
  }
  ++t_depth;
  outermost_ = true;
  if (hooks & detail::kProfilerHook) {
    beginProfiled(op, args, count, path);
  }
  if (!(hooks & detail::kAuditHook)) {
    return;
  }
  thread_local std::string key;  // reused: no allocation per call
  key.clear();
  put(key, static_cast<const void*>(&op.schema()));
  // A fast kernel and the generic path run the same kernel: one signature.
  key.push_back(path == CallPath::Fallback ? 'F' : 'N');
  for (size_t i = 0; i < count; ++i) {
    putValue(key, args[i]);
  }
  auto& t = table();
  std::unique_ptr<SignatureInfo> info;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    auto found = t.entries.find(key);
    if (found == t.entries.end()) {
      auto entry = std::make_unique<SignatureEntry>();
      entry->id = static_cast<int64_t>(t.by_id.size());
      t.by_id.push_back(entry.get());
      found = t.entries.emplace(key, std::move(entry)).first;
      first_ = true;
    }
    entry_ = found->second.get();
  }
  if (first_) {
    info_ = std::make_unique<SignatureInfo>();
    info_->id = entry_->id;
    info_->op = c10::toString(op.operator_name());
    info_->path = path;
    for (size_t i = 0; i < count; ++i) {
      info_->args.push_back(describe(args[i]));
    }
  }
  if (first_) {  // the memory a call allocates is reported for a signature's first call only
    device_ = callDevice(args, count);
    allocated_before_ = neuronAllocator().allocatedBytes(device_);
  }
  start_ = std::chrono::steady_clock::now();
}

RecordedCall::~RecordedCall() {
  if (!outermost_) {
    return;
  }
  --t_depth;
  if (profiled_op_ != nullptr) {
    endProfiled();
  }
  if (entry_ == nullptr) {
    return;
  }
  const auto elapsed = std::chrono::steady_clock::now() - start_;
  entry_->host_ns.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count(), std::memory_order_relaxed);
  entry_->calls.fetch_add(1, std::memory_order_relaxed);
  auto& t = table();
  t.calls.fetch_add(1, std::memory_order_relaxed);
  if (!recording()) {
    return;  // stopped while the call ran: its callbacks may be gone
  }
  t_in_callback = true;
  try {
    if (info_) {
      info_->allocated = neuronAllocator().allocatedBytes(device_) - allocated_before_;
      const uint8_t flags = t.on_signature(*info_);
      entry_->role = static_cast<FusionRole>((flags >> 1) & 3);
      entry_->watched = (flags & 1) != 0;
    } else if (entry_->watched) {
      t.on_call(entry_->id);
    }
  } catch (...) {
    // The audit must never break the user's program: a failing callback costs
    // its record, nothing else. (The Python side reports its own errors.)
  }
  t_in_callback = false;
  fusion().observe(*entry_);
}

// -------------------------------------------------- device events (profiler)

void RecordedCall::beginProfiled(const c10::OperatorHandle& op, const c10::IValue* args,
                                 size_t count, CallPath path) {
  profiled_op_ = &op;
  profiled_path_ = path;
  profiled_device_ = callDevice(args, count);
  // The launching op is the innermost one when the kernel starts (the ops a
  // kernel calls itself push and pop their own ids).
  std::tie(profiled_correlation_, profiled_user_correlation_) = profiler::currentCorrelation();
  profiler::watchLaunch();
  profiled_start_ns_ = profiler::nowNs();
}

void RecordedCall::endProfiled() {
  static const char* const kPaths[] = {"\"native\"", "\"cpu_fallback\"", "\"direct\""};
  profiler::KernelEvent event;
  event.end_ns = profiler::nowNs();
  event.first_child = profiler::firstChildOfLaunch();
  event.start_ns = profiled_start_ns_;
  // "aten::mm.default": the overload always named, so the kernel's row in
  // key_averages() differs from its CPU op's ("aten::mm").
  const auto& name = profiled_op_->operator_name();
  event.name = name.name + "." + (name.overload_name.empty() ? "default" : name.overload_name);
  event.device = profiled_device_;
  event.stream = currentStream(profiled_device_).id();
  event.correlation = profiled_correlation_;
  event.user_correlation = profiled_user_correlation_;
  event.args.emplace_back("path", kPaths[static_cast<int>(profiled_path_)]);
  profiler::record(std::move(event));
}

void startRecording(std::function<uint8_t(const SignatureInfo&)> onSignature,
                    std::function<void(int64_t)> onCall) {
  auto& t = table();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    // Each recording starts empty: its Python side knows only the signatures it was told of.
    for (auto& [key, entry] : t.entries) {
      t.retired.push_back(std::move(entry));
    }
    t.entries.clear();
    t.by_id.clear();
    t.calls = 0;
    t.on_signature = std::move(onSignature);
    t.on_call = std::move(onCall);
  }
  fusion().reset();
  detail::g_device_hooks.fetch_or(detail::kAuditHook);
}

void stopRecording() {
  detail::g_device_hooks.fetch_and(static_cast<uint8_t>(~detail::kAuditHook));
}

std::vector<SignatureTotals> recordedSignatures(bool at_mark) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<SignatureTotals> result;
  result.reserve(t.by_id.size());
  for (const auto* entry : t.by_id) {
    result.push_back(at_mark ? SignatureTotals{entry->id, entry->calls_at_mark, entry->host_ns_at_mark}
                             : SignatureTotals{entry->id, entry->calls.load(), entry->host_ns.load()});
  }
  return result;
}

bool setIgnoringCalls(bool ignoring) {
  const bool before = t_in_callback;
  t_in_callback = ignoring;
  return before;
}

void markStepTotals() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (auto* entry : t.by_id) {
    entry->calls_at_mark = entry->calls.load();
    entry->host_ns_at_mark = entry->host_ns.load();
  }
}

int64_t recordedCalls() {
  return table().calls.load();
}

void fusionCut(int64_t reason) {
  if (!recording()) {
    return;
  }
  auto& model = fusion();
  std::lock_guard<std::mutex> lock(model.mutex);
  model.close(reason);
}

void setFusionLimit(int64_t limit) {
  auto& model = fusion();
  std::lock_guard<std::mutex> lock(model.mutex);
  model.limit = std::max<int64_t>(1, limit);
}

std::vector<FusedSequenceTally> takeFusedSequences() {
  auto& model = fusion();
  std::lock_guard<std::mutex> lock(model.mutex);
  model.close(kCutByStepEnd);
  std::vector<FusedSequenceTally> taken;
  taken.reserve(model.touched.size());
  for (const int64_t id : model.touched) {
    auto& tally = model.tallies[id];
    taken.push_back(tally);
    tally.launches = 0;
    tally.ended_by.clear();
  }
  model.touched.clear();
  return taken;
}

} // namespace torch_neuronx
