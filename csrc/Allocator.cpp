#include "Allocator.h"
#include "Concatenation.h"
#include "HostMemory.h"
#include "Runtime.h"

#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <unordered_set>

namespace torch_neuronx {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using Context = std::shared_ptr<c10::GatheredContext>;

constexpr size_t kAlignment = 64;
constexpr size_t kSmallLimit = 1 << 20;  // blocks below 1 MiB go to the small pool
constexpr size_t kSmallRound = 512;

// Every block is preceded by a 64-byte header holding its Block*, so a DataPtr's
// context is its data pointer (what c10::Allocator::raw_allocate and oneDNN's
// raw allocations require) and freeing needs no lookup.
constexpr size_t kHeader = kAlignment;

// Large blocks start on a page boundary (their header sits at the end of a
// leading page). Where a buffer starts within its page changes the speed of
// the host code that streams through it: gloo's all_reduce of 64 MiB between
// two ranks ran 20% slower on data at page offset 128 (where a 64-byte header
// after glibc's chunk header puts it) than at offset 0 or 64
// (benchmarks/bench_distributed.py).
constexpr size_t kPageSize = 4096;

struct Block {
  void* ptr;  // the data; its Block* is stored in the kHeader bytes before it
  void* base;  // the host allocation holding header and data
  size_t size;
  size_t requested;
  c10::DeviceIndex device;
  bool small;
  bool allocated;
  Context context;          // stack of the allocation that holds the block (history on)
  Context segment_context;  // stack of the allocation that created it (history on)
};

// ------------------------------------------------------------ history
// The stack level to gather (a RecordContext) and the function gathering it.
// Read before taking a core's lock, because stacks are gathered outside it as
// in CUDA's allocator: gathering Python frames takes the GIL, and a thread that
// holds the GIL may be waiting for that lock. History off, this load is the
// whole cost of the feature on an allocation or a free.
std::atomic<int> g_context_level{static_cast<int>(RecordContext::NEVER)};
std::atomic<c10::CachingDeviceAllocator::CreateContextFn> g_recorder{nullptr};

Context gatherContext(RecordContext level) {
  if (g_context_level.load(std::memory_order_relaxed) < static_cast<int>(level)) {
    return nullptr;
  }
  auto recorder = g_recorder.load(std::memory_order_acquire);
  return recorder != nullptr ? recorder() : nullptr;
}

// One core's trace: a ring of its newest actions, guarded by the core's lock.
struct History {
  bool enabled = false;
  RecordContext context = RecordContext::NEVER;
  size_t max_entries = 1;
  uint32_t skip_actions = 0;
  std::vector<TraceEntry> ring;
  size_t next = 0;  // once the ring is full: the oldest entry, overwritten next

  void record(TraceEntry::Action action, c10::DeviceIndex device, uint64_t addr, size_t size,
              const Context& stack) {
    if (!enabled || (skip_actions >> action & 1u) != 0) {
      return;
    }
    // As CUDA: a stack goes into the trace only from context="alloc" on.
    TraceEntry entry(action, device, addr, size, /*stream=*/nullptr, /*mempool=*/{0, 0},
                     /*time=*/0, context >= RecordContext::ALLOC ? stack : nullptr, "N/A");
    entry.time_.t_ = c10::getTime() / 1000;  // microseconds since the epoch, CUDA's time_us
    if (ring.size() < max_entries) {
      ring.push_back(std::move(entry));
    } else {
      ring[next] = std::move(entry);
      next = (next + 1) % max_entries;
    }
  }

  std::vector<TraceEntry> entries() const {
    std::vector<TraceEntry> result(ring.begin() + static_cast<std::ptrdiff_t>(next), ring.end());
    result.insert(result.end(), ring.begin(), ring.begin() + static_cast<std::ptrdiff_t>(next));
    return result;
  }

  void configure(const HistorySettings& settings) {
    std::vector<TraceEntry> kept;
    if (settings.enabled && !settings.clear) {
      kept = entries();
    }
    const size_t limit = std::max<size_t>(1, settings.max_entries);
    if (kept.size() > limit) {
      kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(limit));
    }
    ring = std::move(kept);
    next = 0;
    enabled = settings.enabled;
    context = settings.enabled ? settings.context : RecordContext::NEVER;
    max_entries = limit;
    skip_actions = settings.skip_actions;
  }
};

// Data pointers of every live device block: lets a raw deallocation that went
// through the CPU allocator tell device blocks from host memory. Touched only
// when a segment is created or released, never on the cached fast path.
std::mutex g_segments_mutex;
std::unordered_set<void*>& segmentPointers() {
  static auto* pointers = new std::unordered_set<void*>();
  return *pointers;
}

bool isSegment(void* data) {
  std::lock_guard<std::mutex> lock(g_segments_mutex);
  return segmentPointers().count(data) != 0;
}

// Rounds a request up to its size class.
size_t roundSize(size_t nbytes) {
  if (nbytes < kSmallLimit) {
    return std::max(kSmallRound, (nbytes + kSmallRound - 1) / kSmallRound * kSmallRound);
  }
  size_t power = size_t{1} << (63 - __builtin_clzll(nbytes));
  size_t step = power / 4;
  return (nbytes + step - 1) / step * step;
}

void updateStat(c10::CachingAllocator::StatArray& stat, bool small, int64_t amount) {
  const auto pool = static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL);
  for (size_t index : {static_cast<size_t>(StatType::AGGREGATE), pool}) {
    if (amount >= 0) {
      stat[index].increase(static_cast<size_t>(amount));
    } else {
      stat[index].decrease(static_cast<size_t>(-amount));
    }
  }
}

// Small-pool size classes: multiples of kSmallRound below kSmallLimit, rounded up.
constexpr size_t kSmallClasses = kSmallLimit / kSmallRound;

size_t smallClass(size_t size) {
  return size / kSmallRound - 1;
}

struct DeviceMemory {
  std::mutex mutex;
  // Cached small-pool blocks, one stack per size class (the newest freed on
  // top: its bytes are the likeliest to be in cache). Caching and taking a
  // block allocate nothing: a multimap node per free had been a host malloc
  // and free per eager op.
  std::vector<std::vector<Block*>> free_small{kSmallClasses};
  std::multimap<size_t, Block*> free_large;  // cached large-pool blocks, by size
  std::unordered_set<Block*> all_blocks;      // every segment we own
  DeviceStats stats;
  size_t reserved = 0;
  int64_t window_peak = 0;  // see NeuronAllocator::takeWindowPeak
  History history;

  // Takes a cached block that fits `size` without wasting more than a
  // quarter of it (small blocks must match their size class exactly).
  Block* takeCached(size_t size, bool small) {
    if (small) {
      auto& blocks = free_small[smallClass(size)];
      if (blocks.empty()) {
        return nullptr;
      }
      Block* block = blocks.back();
      blocks.pop_back();
      return block;
    }
    auto it = free_large.lower_bound(size);
    if (it == free_large.end() || it->second->size > size + size / 4) {
      return nullptr;
    }
    Block* block = it->second;
    free_large.erase(it);
    return block;
  }

  void cache(Block* block) {
    if (block->small) {
      free_small[smallClass(block->size)].push_back(block);
    } else {
      free_large.emplace(block->size, block);
    }
  }

  // `stack`: where the release was asked for (null: each segment's creation).
  // `held`: where the queued ops run first go, to be dropped by the caller
  // once it has released the lock (dropping them frees memory).
  void releaseCached(const Context& stack, HeldEntries& held) {
    // Queued ops write and read where their tensors' memory was when they
    // were queued; a tensor given new storage since (`t.data = ...`) may have
    // left its old block in this cache. They run before any block goes back
    // to the host. (Running them takes no allocator lock.)
    if (HeldEntries ran = runQueuedHolding()) {
      held = held == nullptr ? std::move(ran) : std::make_shared<std::pair<HeldEntries, HeldEntries>>(held, ran);
    }
    for (auto& blocks : free_small) {
      for (Block* block : blocks) {
        release(block, stack);
      }
      blocks.clear();
    }
    for (auto& [size, block] : free_large) {
      release(block, stack);
    }
    free_large.clear();
  }

  // Gives a cached segment back to the host.
  void release(Block* block, const Context& stack) {
    history.record(TraceEntry::SEGMENT_FREE, block->device, reinterpret_cast<uint64_t>(block->ptr), block->size,
                   stack != nullptr ? stack : block->segment_context);
    {
      std::lock_guard<std::mutex> lock(g_segments_mutex);
      segmentPointers().erase(block->ptr);
    }
    std::free(block->base);
    reserved -= block->size;
    updateStat(stats.reserved_bytes, block->small, -static_cast<int64_t>(block->size));
    updateStat(stats.segment, block->small, -1);
    stats.num_device_free++;
    all_blocks.erase(block);
    delete block;
  }
};

std::vector<std::unique_ptr<DeviceMemory>>& devices() {
  // One slot per possible core, created up front so the table never moves.
  // Leaked on purpose: threads that outlive static destruction at exit
  // (autograd workers, gloo, OpenMP) may still free device blocks.
  static auto* memories = [] {
    auto* result = new std::vector<std::unique_ptr<DeviceMemory>>();
    for (int i = 0; i < kMaxDevices; ++i) {
      result->push_back(std::make_unique<DeviceMemory>());
    }
    return result;
  }();
  return *memories;
}

DeviceMemory& memoryOf(c10::DeviceIndex device) {
  checkDeviceIndex(device);
  return *devices()[device];
}

Block* blockOf(void* data) {
  return *reinterpret_cast<Block**>(static_cast<char*>(data) - kHeader);
}

// torch.profiler(profile_memory=True)'s memory events and device memory
// columns, as CUDA's allocator reports them (a thread-local check when the
// profiler is off).
void reportToProfiler(const Block* block, int64_t delta, const DeviceMemory& memory) {
  const auto all = static_cast<size_t>(StatType::AGGREGATE);
  c10::reportMemoryUsageToProfiler(
      block->ptr, delta, memory.stats.allocated_bytes[all].current, memory.stats.reserved_bytes[all].current,
      c10::Device(kNeuron, block->device));
}

void freeBlock(void* data) {
  auto* block = blockOf(data);
  auto& memory = *devices()[block->device];
  const Context stack = gatherContext(RecordContext::ALL);
  std::lock_guard<std::mutex> lock(memory.mutex);
  if (C10_UNLIKELY(memory.history.enabled)) {
    // Freeing is immediate (execution is synchronous), so the free completes
    // as it is requested: CUDA's two actions, back to back.
    const Context& where = stack != nullptr ? stack : block->context;
    const auto addr = reinterpret_cast<uint64_t>(block->ptr);
    memory.history.record(TraceEntry::FREE_REQUESTED, block->device, addr, block->requested, where);
    memory.history.record(TraceEntry::FREE_COMPLETED, block->device, addr, block->requested, where);
  }
  if (C10_UNLIKELY(block->context != nullptr)) {
    block->context.reset();  // a cached block has no allocation stack
  }
  block->allocated = false;
  updateStat(memory.stats.allocated_bytes, block->small, -static_cast<int64_t>(block->size));
  updateStat(memory.stats.active_bytes, block->small, -static_cast<int64_t>(block->size));
  updateStat(memory.stats.requested_bytes, block->small, -static_cast<int64_t>(block->requested));
  updateStat(memory.stats.allocation, block->small, -1);
  updateStat(memory.stats.active, block->small, -1);
  memory.cache(block);
  reportToProfiler(block, -static_cast<int64_t>(block->size), memory);
}

[[noreturn]] void throwOutOfMemory(
    c10::DeviceIndex device, size_t request, DeviceMemory& memory, const Context& stack) {
  memory.stats.num_ooms++;
  const size_t capacity = static_cast<size_t>(deviceCapacity(device));
  const auto allocated = static_cast<size_t>(
      memory.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
  const size_t free_bytes = capacity > memory.reserved ? capacity - memory.reserved : 0;
  // CUDA's "oom" action: the address field holds the free bytes (device_free).
  memory.history.record(TraceEntry::OOM, device, free_bytes, request, stack);
  TORCH_CHECK_WITH(
      OutOfMemoryError,
      false,
      "NEURON out of memory. Tried to allocate ", formatBytes(request),
      ". NeuronCore ", static_cast<int>(device), " has a total capacity of ",
      formatBytes(capacity), " of which ", formatBytes(free_bytes),
      " is free. Of the allocated memory ", formatBytes(allocated),
      " is allocated by PyTorch, and ", formatBytes(memory.reserved - allocated),
      " is reserved by PyTorch but unallocated. Free tensors you no longer need, "
      "reduce the batch or model size, or choose an instance profile with more HBM per "
      "core (TORCH_NEURONX_INSTANCE; at NEURON_LOGICAL_NC_CONFIG=1 a core has half the HBM "
      "it has at 2). See torch.neuron.memory_summary() for details.");
}

// New segments are checked against the host's memory first: the emulated HBM
// is host memory, and a host smaller than the instance it emulates would
// otherwise be found out by the kernel's OOM killer, with no word from us.
constexpr size_t kHostCheckMin = 64ull << 20;
// Left to the rest of the process and the machine when a segment is checked.
constexpr int64_t kHostHeadroom = 512ll << 20;

[[noreturn]] void throwHostOutOfMemory(
    c10::DeviceIndex device, size_t request, DeviceMemory& memory, const HostMemoryLimit& host,
    const Context& stack) {
  memory.stats.num_ooms++;
  memory.history.record(TraceEntry::OOM, device, 0, request, stack);
  const std::string room = host.available >= 0
      ? formatBytes(static_cast<size_t>(host.available)) + " more (" + host.source + ")"
      : std::string("no more");
  TORCH_CHECK_WITH(
      OutOfMemoryError,
      false,
      "NEURON out of host memory. Tried to allocate ", formatBytes(request), " on NeuronCore ",
      static_cast<int>(device), ": the emulated device keeps its HBM in this machine's memory, and the "
      "machine can give only ", room, ". The emulated core holds ", formatBytes(memory.reserved),
      " and has a capacity of ", formatBytes(static_cast<size_t>(deviceCapacity(device))),
      ": the emulated instance is larger than this host, which ran out first (a real instance "
      "would not). Use a smaller model or batch, a smaller instance profile (TORCH_NEURONX_INSTANCE), "
      "or a machine with more memory.");
}

// Allocates a new segment, flushing the cache once if the core is full.
// `stack`: the allocation's (history on).
Block* newBlock(c10::DeviceIndex device, size_t size, bool small, DeviceMemory& memory,
                const Context& stack, HeldEntries& held) {
  const size_t capacity = static_cast<size_t>(deviceCapacity(device));
  if (memory.reserved + size > capacity) {
    memory.stats.num_alloc_retries++;
    memory.releaseCached(stack, held);
    if (memory.reserved + size > capacity) {
      throwOutOfMemory(device, size, memory, stack);
    }
  }
  const size_t alignment = small ? kAlignment : kPageSize;
  const size_t offset = small ? kHeader : kPageSize;
  const size_t total = (offset + size + alignment - 1) / alignment * alignment;
  // Checked for a large segment, and after every kHostCheckMin of smaller ones in all.
  static std::atomic<size_t> unchecked{0};
  if (total >= kHostCheckMin || unchecked.fetch_add(total) + total >= kHostCheckMin) {
    unchecked = 0;
    auto host = hostMemoryLimit();
    if (host.available >= 0 && static_cast<int64_t>(total) + kHostHeadroom > host.available) {
      memory.releaseCached(stack, held);  // cached segments are host memory too
      host = hostMemoryLimit();
      if (host.available >= 0 && static_cast<int64_t>(total) + kHostHeadroom > host.available) {
        throwHostOutOfMemory(device, size, memory, host, stack);
      }
    }
  }
  void* base = std::aligned_alloc(alignment, total);
  if (base == nullptr) {
    memory.releaseCached(stack, held);
    base = std::aligned_alloc(alignment, total);
    if (base == nullptr) {  // within the emulated capacity: the host is what ran out
      throwHostOutOfMemory(device, size, memory, hostMemoryLimit(), stack);
    }
  }
  char* data = static_cast<char*>(base) + offset;
  auto* block = new Block{data, base, size, 0, device, small, false, nullptr, stack};
  *reinterpret_cast<Block**>(data - kHeader) = block;
  memory.history.record(TraceEntry::SEGMENT_ALLOC, device, reinterpret_cast<uint64_t>(data), size, stack);
  {
    std::lock_guard<std::mutex> lock(g_segments_mutex);
    segmentPointers().insert(block->ptr);
  }
  memory.all_blocks.insert(block);
  memory.reserved += size;
  updateStat(memory.stats.reserved_bytes, block->small, static_cast<int64_t>(size));
  updateStat(memory.stats.segment, block->small, 1);
  memory.stats.num_device_alloc++;
  return block;
}

thread_local c10::DeviceIndex t_capture_device = -1;
c10::DeleterFnPtr g_host_raw_deleter = nullptr;

// raw_deallocate() through the CPU allocator: the memory may have come from
// either side, whatever the capture state is now.
void freeHostOrDevice(void* data) {
  if (data != nullptr && isSegment(data)) {
    freeBlock(data);
  } else if (g_host_raw_deleter != nullptr) {
    g_host_raw_deleter(data);
  }
}

// The CPU allocator, wrapped: inside a CaptureScope allocations go to the
// device; everywhere else this is PyTorch's own CPU allocator untouched.
class CaptureCpuAllocator final : public c10::Allocator {
 public:
  explicit CaptureCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (t_capture_device < 0) {
      return base_->allocate(nbytes);
    }
    auto ptr = neuronAllocator().allocateOn(t_capture_device, nbytes);
    ptr.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
    return ptr;
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return g_host_raw_deleter == nullptr ? nullptr : &freeHostOrDevice;
  }

  void copy_data(void* dst, const void* src, size_t count) const override {
    std::memcpy(dst, src, count);
  }

 private:
  c10::Allocator* base_;
};

} // namespace

std::string formatBytes(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof(buffer), "%zu bytes", bytes);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f %s", value, units[unit]);
  }
  return buffer;
}

c10::DataPtr NeuronAllocator::allocate(size_t nbytes) {
  return allocateOn(currentDevice(), nbytes);
}

c10::DataPtr NeuronAllocator::allocateOn(c10::DeviceIndex device, size_t nbytes) {
  lazyInit();
  const c10::Device where(kNeuron, device);
  if (nbytes == 0) {
    return c10::DataPtr(nullptr, where);
  }
  auto& memory = memoryOf(device);
  const size_t size = roundSize(nbytes);
  const bool small = nbytes < kSmallLimit;  // the pool follows the request, as in CUDA
  Context stack = gatherContext(RecordContext::STATE);
  HeldEntries held;  // declared before the lock: dropped after it is released
  std::lock_guard<std::mutex> lock(memory.mutex);
  Block* block = memory.takeCached(size, small);
  if (block == nullptr) {
    block = newBlock(device, size, small, memory, stack, held);
  }
  block->allocated = true;
  block->requested = nbytes;
  if (C10_UNLIKELY(memory.history.enabled)) {
    // As CUDA, the "alloc" action carries the size asked for.
    memory.history.record(TraceEntry::ALLOC, device, reinterpret_cast<uint64_t>(block->ptr), nbytes, stack);
  }
  if (C10_UNLIKELY(stack != nullptr)) {
    block->context = std::move(stack);  // freeing resets it: a cached block has none
  }
  updateStat(memory.stats.allocated_bytes, block->small, static_cast<int64_t>(block->size));
  updateStat(memory.stats.active_bytes, block->small, static_cast<int64_t>(block->size));
  updateStat(memory.stats.requested_bytes, block->small, static_cast<int64_t>(nbytes));
  updateStat(memory.stats.allocation, block->small, 1);
  updateStat(memory.stats.active, block->small, 1);
  memory.window_peak = std::max(
      memory.window_peak, memory.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
  reportToProfiler(block, static_cast<int64_t>(block->size), memory);
  return c10::DataPtr(block->ptr, block->ptr, &freeBlock, where);
}

c10::DeleterFnPtr NeuronAllocator::raw_deleter() const {
  return &freeBlock;
}

void NeuronAllocator::copy_data(void* dst, const void* src, size_t count) const {
  runQueued();  // device bytes read directly (storage copies): queued ops first
  std::memcpy(dst, src, count);
}

bool NeuronAllocator::initialized() {
  return isInitialized();
}

void NeuronAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  const Context stack = gatherContext(RecordContext::ALL);
  for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
    auto& memory = memoryOf(i);
    HeldEntries held;  // declared before the lock: dropped after it is released
    std::lock_guard<std::mutex> lock(memory.mutex);
    memory.releaseCached(stack, held);
  }
}

void NeuronAllocator::recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) {
  // Execution is synchronous: by the time a block is freed, every stream that
  // used it has finished, so there is nothing to wait for.
}

int64_t NeuronAllocator::allocatedBytes(c10::DeviceIndex device) {
  auto& memory = memoryOf(device);
  std::lock_guard<std::mutex> lock(memory.mutex);
  return memory.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
}

int64_t NeuronAllocator::takeWindowPeak(c10::DeviceIndex device) {
  auto& memory = memoryOf(device);
  std::lock_guard<std::mutex> lock(memory.mutex);
  const int64_t peak = memory.window_peak;
  memory.window_peak = memory.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
  return peak;
}

c10::CachingDeviceAllocator::DeviceStats NeuronAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  auto& memory = memoryOf(device);
  std::lock_guard<std::mutex> lock(memory.mutex);
  return memory.stats;
}

// Applies `reset` to every Stat of the per-pool counters.
template <class Reset>
void forEachStat(c10::CachingDeviceAllocator::DeviceStats& s, Reset reset) {
  for (auto* array : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                      &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                      &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *array) {
      reset(stat);
    }
  }
}

void NeuronAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  auto& memory = memoryOf(device);
  std::lock_guard<std::mutex> lock(memory.mutex);
  auto& s = memory.stats;
  forEachStat(s, [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
  s.num_alloc_retries = 0;
  s.num_ooms = 0;
  s.num_device_alloc = 0;
  s.num_device_free = 0;
}

void NeuronAllocator::resetPeakStats(c10::DeviceIndex device) {
  auto& memory = memoryOf(device);
  std::lock_guard<std::mutex> lock(memory.mutex);
  forEachStat(memory.stats, [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
}

std::pair<size_t, size_t> NeuronAllocator::getMemoryInfo(c10::DeviceIndex device) {
  auto& memory = memoryOf(device);
  std::lock_guard<std::mutex> lock(memory.mutex);
  const auto total = static_cast<size_t>(deviceCapacity(device));
  return {total > memory.reserved ? total - memory.reserved : 0, total};
}

bool NeuronAllocator::owns(const c10::DataPtr& ptr) {
  return ptr.get_deleter() == &freeBlock;
}

void NeuronAllocator::recordHistory(const HistorySettings& settings) {
  // Stop gathering first and publish the new recorder before its level, so
  // that an allocation never sees a level without a recorder.
  g_context_level.store(static_cast<int>(RecordContext::NEVER), std::memory_order_relaxed);
  g_recorder.store(settings.enabled ? settings.recorder : nullptr, std::memory_order_release);
  for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
    auto& memory = memoryOf(i);
    std::lock_guard<std::mutex> lock(memory.mutex);
    memory.history.configure(settings);
  }
  const bool gather = settings.enabled && settings.recorder != nullptr;
  g_context_level.store(
      static_cast<int>(gather ? settings.context : RecordContext::NEVER), std::memory_order_relaxed);
}

MemorySnapshot NeuronAllocator::snapshot() {
  MemorySnapshot result;
  for (c10::DeviceIndex i = 0; i < deviceCount(); ++i) {
    auto& memory = memoryOf(i);
    std::lock_guard<std::mutex> lock(memory.mutex);
    size_t active = 0;
    for (Block* block : memory.all_blocks) {
      c10::CachingDeviceAllocator::SegmentInfo segment;
      segment.device = i;
      segment.address = reinterpret_cast<size_t>(block->ptr);
      segment.total_size = block->size;
      segment.requested_size = block->allocated ? block->requested : 0;
      segment.allocated_size = block->allocated ? block->size : 0;
      segment.active_size = segment.allocated_size;
      segment.is_large = !block->small;
      segment.context_when_allocated = block->segment_context;
      c10::CachingDeviceAllocator::BlockInfo info;
      info.size = block->size;
      info.requested_size = block->requested;
      info.allocated = block->allocated;
      info.active = block->allocated;
      info.context_when_allocated = block->allocated ? block->context : nullptr;
      segment.blocks.push_back(std::move(info));
      active += segment.active_size;
      result.segments.push_back(std::move(segment));
    }
    memory.history.record(TraceEntry::SNAPSHOT, i, 0, active, nullptr);
    result.device_traces.push_back(memory.history.entries());
  }
  std::sort(result.segments.begin(), result.segments.end(), [](const auto& a, const auto& b) {
    return std::tie(a.device, a.address) < std::tie(b.device, b.address);
  });
  return result;
}

NeuronAllocator& neuronAllocator() {
  // Leaked: PyTorch's allocator registry points at it until the process ends.
  static auto* allocator = new NeuronAllocator();
  return *allocator;
}

CaptureScope::CaptureScope(c10::DeviceIndex device) : previous_(t_capture_device) {
  t_capture_device = device;
}

CaptureScope::~CaptureScope() {
  t_capture_device = previous_;
}

void installCaptureAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: CPU storages may outlive any static destructor.
    c10::Allocator* host = c10::GetAllocator(c10::DeviceType::CPU);
    g_host_raw_deleter = host->raw_deleter();
    auto* capture = new CaptureCpuAllocator(host);
    c10::SetAllocator(c10::DeviceType::CPU, capture, /*priority=*/1);
  });
}

// Registered at load time so torch.accelerator.memory_* find a DeviceAllocator.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &neuronAllocator());

} // namespace torch_neuronx
