// Recording of device calls for `torch-neuronx audit` (torch_neuronx/audit/).
//
// Off unless the audit switches it on: then every op call that reaches the
// device (native, CPU fallback or direct kernel) is timed and counted under
// its signature (op, tensor dtypes and shapes, integer and boolean arguments:
// what the real device compiles a kernel for). The first call of each
// signature is reported to a Python callback, which decides whether every
// later call of it is reported too (fallbacks, host syncs, float64: the calls
// whose source line the audit shows). When off, the cost on the eager path is
// one relaxed atomic load per call.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch_neuronx {

namespace detail {
// The hooks on the eager path, one bit each, in one word: with all of them
// off, a call pays one relaxed load. The audit's recording and the device
// activity of torch.profiler (csrc/Profiler.h).
enum : uint8_t { kAuditHook = 1, kProfilerHook = 2 };
extern std::atomic<uint8_t> g_device_hooks;
}

inline uint8_t activeHooks() {
  return detail::g_device_hooks.load(std::memory_order_relaxed);
}

inline bool recording() {
  return (activeHooks() & detail::kAuditHook) != 0;
}

// How a call ran: the generic alias path, the CPU fallback (copies to the host
// and back), or a direct kernel (csrc/Kernels.cpp, csrc/FastOps.cpp).
enum class CallPath : uint8_t { Native = 0, Fallback = 1, Direct = 2 };

struct SignatureEntry;

// An argument as the Python callback sees it (built for a signature's first
// call only).
struct ArgDescription {
  enum class Kind : uint8_t { None, Tensor, List, Int, Double, Bool, String, Other } kind = Kind::None;
  std::string text;             // Tensor: dtype; String: the string; Other: the IValue's type
  std::vector<int64_t> sizes;   // Tensor: shape
  std::string device;           // Tensor: "neuron:0", "cpu", ...
  int64_t integer = 0;          // Int, Bool
  double real = 0.0;            // Double
  std::vector<ArgDescription> items;  // List
};

// What the callbacks are told about a signature's first call.
struct SignatureInfo {
  int64_t id;
  std::string op;       // "aten::add.Tensor"
  CallPath path;
  std::vector<ArgDescription> args;
  int64_t allocated;    // bytes the call added to the device's allocated memory (net)
};

// Switches recording on, with an empty table of signatures, and two callbacks: `onSignature` for each new
// signature (returns its flags: bit 0 to have every later call of it reported,
// bits 1-2 its FusionRole) and `onCall(id)` for each later call of a signature it
// asked for. Both run on the calling thread; calls made from inside them are not
// recorded.
void startRecording(std::function<uint8_t(const SignatureInfo&)> onSignature,
                    std::function<void(int64_t)> onCall);
void stopRecording();

struct SignatureTotals {
  int64_t id;
  int64_t calls;
  int64_t host_ns;
};
// Every signature's totals now, or (at_mark) as they were at the last markStepTotals().
std::vector<SignatureTotals> recordedSignatures(bool at_mark = false);
// While true, this thread's device calls are not recorded (as inside the
// callbacks): the audit's own work, such as counting a batch's tokens, is not
// the audited program's. Returns the previous value, to restore it.
bool setIgnoringCalls(bool ignoring);
// The end of a step: keeps every signature's totals as they are now (a copy of
// two counters each, cheap enough for every step), read back by
// recordedSignatures(true). Signatures first seen after the mark read 0.
void markStepTotals();
int64_t recordedCalls();

// ------------------------------------------- the audit's model of fusion
// How TorchNeuron's Adaptive Eager Execution ("concatenation") would group the
// recorded calls into launches, as AWS's source groups them: a run of lowered
// ops that are not in place is one launch, ended by a matmul-class op (which
// it includes) or by a boundary (which runs alone and cuts it). The audit
// decides each signature's role at its first call (torch_neuronx/audit/
// fusion.py); the C++ side keeps the open sequence and counts, per distinct
// sequence, its launches and what ended it. Only while recording.
enum class FusionRole : uint8_t { Boundary = 0, Fusible = 1, EndsSequence = 2, Transparent = 3 };

// What ended a sequence when it was not an op call (an op that cuts is named
// by its signature id, >= 0).
enum FusionCut : int64_t {
  kEndedByItsMatmul = -1,  // its last op is a matmul-class op: a natural end, no cut
  kCutByLimit = -2,        // TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT ops
  kCutBySynchronize = -3,  // synchronize, stream synchronize, event record
  kCutByGraph = -4,        // a compiled graph ran
  kCutByNki = -5,          // an NKI kernel launched
  kCutByCollective = -6,   // a collective ran
  kCutByStepEnd = -7,      // the audit closed it at a step's (or phase's) end
};

// A cut that is not an op call (the compiled graph, NKI and collective paths
// report theirs through torch_neuronx/observe.py).
void fusionCut(int64_t reason);
void setFusionLimit(int64_t limit);

struct FusedSequenceTally {
  int64_t id;
  std::vector<int64_t> ops;                          // signature ids, in order
  int64_t launches;                                  // since the last take
  std::vector<std::pair<int64_t, int64_t>> ended_by; // (cut, count) since the last take
};
// Closes the open sequence (kCutByStepEnd) and returns the sequences launched
// since the last take, with their counts; the counts start again from zero.
std::vector<FusedSequenceTally> takeFusedSequences();

// One recorded call. Constructed before the kernel runs (the arguments are
// read then: kernels consume the stack), finished when it returns: counted for
// the audit, and a device event for torch.profiler. Does nothing when both
// are off.
//
// Only the outermost device call of a thread is recorded: the calls a kernel
// makes itself (the CPU fallback's copies, dropout's mask) are part of its
// cost, as the real device runs them as one kernel.
class RecordedCall {
 public:
  RecordedCall() = default;  // records nothing
  RecordedCall(const c10::OperatorHandle& op, const c10::IValue* args, size_t count, CallPath path);
  ~RecordedCall();
  RecordedCall(const RecordedCall&) = delete;
  RecordedCall& operator=(const RecordedCall&) = delete;

 private:
  void beginProfiled(const c10::OperatorHandle& op, const c10::IValue* args, size_t count,
                     CallPath path);
  void endProfiled();

  bool outermost_ = false;  // this call holds the thread's recording depth
  SignatureEntry* entry_ = nullptr;
  bool first_ = false;
  std::unique_ptr<SignatureInfo> info_;  // the first call's description
  c10::DeviceIndex device_ = -1;
  int64_t allocated_before_ = 0;
  std::chrono::steady_clock::time_point start_;
  // torch.profiler: the op, and where and when its kernel started.
  const c10::OperatorHandle* profiled_op_ = nullptr;
  CallPath profiled_path_ = CallPath::Native;
  c10::DeviceIndex profiled_device_ = 0;
  int64_t profiled_start_ns_ = 0;
  uint64_t profiled_correlation_ = 0;
  uint64_t profiled_user_correlation_ = 0;
};

} // namespace torch_neuronx
