// Adaptive Eager Execution's queue: see Concatenation.h.
#include "Concatenation.h"

#include "Allocator.h"
#include "CpuLoops.h"
#include "Eager.h"
#include "FloatMath.h"
#include "Gemv.h"
#include "Recorder.h"
#include "Runtime.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/TypeCast.h>
#include <c10/util/strides.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch_neuronx {

namespace detail {
std::atomic<bool> gQueued{false};
} // namespace detail

namespace {

// How a copy reads a strided operand's rows and writes them (Entry::rows):
// rows of `len` elements (the last dim, merged with the dims before it while
// both sides stay contiguous), at the offsets the other dims give, innermost
// first (sizes, and strides in elements on each side).
constexpr int kMaxRowDims = 8;
struct RowLayout {
  int64_t len = 1;
  int dims = 0;
  std::array<int64_t, kMaxRowDims> sizes{}, src{}, dst{};
};

// One queued call: out = a <op> (b or scalar), with alpha for add/sub; lerp's
// weight, addcmul/addcdiv's value and threshold_backward's threshold are
// `alpha` too, addcmul/addcdiv's third operand `c`. Unary ops read `a` only.
struct Entry {
  QueuedOp op;
  const DirectOp* source;  // the op called, for its name
  bool bf16 = false;       // the tensors' dtype: bfloat16, else float32
  void* out = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;  // null: `scalar` is the second operand (or the op has one)
  const void* c = nullptr;
  // A row op's second and third results (layer norm's mean and rstd: one per row).
  void* out2 = nullptr;
  void* out3 = nullptr;
  int64_t n = 0;  // out's elements
  float scalar = 0.0f;
  float alpha = 0.0f;
  // Broadcasting: 0 when a and b have out's shape; otherwise one of them (b,
  // or a where a_repeats) holds out's last `period` elements' worth, repeated
  // for each of out's rows (a bias over a batch, a 0-dim tensor: period 1).
  int64_t period = 0;
  bool a_repeats = false;
  // The repeated operand holds one value per row of `period` elements instead
  // (an [B, 1] column over [B, N]: RMSNorm's x * rsqrt(mean(x^2) + eps)).
  bool per_row = false;
  // The tensors whose memory the loops touch, alive until the entry is
  // dropped. The device thread reads only the fields above: the tensors'
  // reference counts, written by the caller, stay in its core's cache.
  // (Holding their storages instead was slower: a tensor's count then drops
  // to 1 between calls, and PyTorch hands its Python object over between C++
  // and Python, under the GIL, each time it rises to 2 again.)
  std::array<at::Tensor, 6> keep;
  // A strided operand: `a`'s rows are first copied into `out` as laid out
  // here, and the op (Copy: none) then runs in place on out.
  std::shared_ptr<const RowLayout> rows;
  // Another part of the call before it (cat's next input): not counted again.
  bool continues = false;
};

// A call being checked for the queue: its entry and its tensors (b, c: null
// where the call has none, or a scalar operand).
struct Call {
  Entry entry;
  const at::Tensor* a;
  const at::Tensor* b = nullptr;
  const at::Tensor* c = nullptr;
};

// PyTorch's grain size: its CPU kernels split longer loops across the
// intra-op threads, and so does the queue (run()); a batch holding such an
// entry runs on the calling thread, never the device thread, so that the two
// do not compete with the intra-op threads for the cores.
constexpr int64_t kGrainSize = 32768;
// Operands of at most 131,072 elements (512 KiB of float32, kMaxHeldBytes):
// an op on a larger tensor runs long enough that queueing saves nothing, and
// the bytes a queued op keeps alive stay bounded. (TorchNeuron queues ops of
// any size; at 65,536 its tests see "aten::add.Tensor|aten::mm" launches.)
constexpr int64_t kMaxElements = 131072;
// The queue also runs once the fresh results it holds (out-of-place ops') reach
// kMaxHeldBytes, so that dead intermediates do not pile up and stay in cache
// (about half of a core's L2), or once all its ops write kMaxWrittenBytes, so
// that a batch handed to the device thread carries enough work to overlap the
// caller's (in-place ops hold no new memory: counting them against the first
// limit handed a small ReLU MLP's optimizer step to the device thread just
// before the next forward pass waited for it, 1.23x CPU eager's step time
// against 1.06x without the thread).
constexpr int64_t kMaxHeldBytes = 512 * 1024;
// A one-row linear the intra-op threads would split is queued, and computed
// by the device thread alone, up to this much weight: about what a module's
// Python costs (a 1 MiB product takes 15-17 us on one core here), which it
// then overlaps (LayerNorm+GELU MLP at batch 1, 2 threads: 53-57 us queued
// against 82-87 us split at the call); a larger one is split at the call.
constexpr int64_t kMaxSplitProductBytes = 1024 * 1024;
constexpr int64_t kMaxWrittenBytes = 4 * 1024 * 1024;

struct Queue {
  std::mutex mutex;  // held while ops are queued and while the queue runs
  std::vector<Entry> entries;
  int64_t held_bytes = 0;     // bytes of the queued ops' fresh results (out of place)
  int64_t written_bytes = 0;  // bytes all the queued ops write
  bool parallel = false;      // some queued op splits across the intra-op threads (run())
  int64_t limit = 1024;
  ConcatenationStats stats;
  // get_executed_ops()'s counter of each sequence launched, by its ops' codes.
  std::unordered_map<std::string, std::atomic<int64_t>*> launched;
};

// Counts one launch of the queued sequence in get_executed_ops(), under its
// ops' names joined by "|", as TorchNeuron names a concatenated operation
// ("mul|pow|aten::mm"), `joined` last: the matmul-class op that ends the
// sequence (runQueuedEndingWith; null: none), keyed by its name's address (one
// per registered op); each op was counted under its own name when called.
void countLaunch(Queue& q, const c10::OperatorName* joined) {
  std::string key;  // the ops' addresses, in order
  key.reserve((q.entries.size() + 1) * sizeof(const void*));
  for (const Entry& e : q.entries) {
    if (!e.continues) {
      key.append(reinterpret_cast<const char*>(&e.source), sizeof(e.source));
    }
  }
  key.append(reinterpret_cast<const char*>(&joined), sizeof(joined));
  auto& counter = q.launched[key];
  if (counter == nullptr) {
    std::string name;
    for (const Entry& e : q.entries) {
      if (e.continues) {
        continue;
      }
      name += name.empty() ? "" : "|";
      name += c10::toString(e.source->handle().operator_name());
    }
    if (joined != nullptr) {
      name += "|" + c10::toString(*joined);
    }
    counter = executedCounter(name);
  }
  counter->fetch_add(1, std::memory_order_relaxed);
}

Queue& queue() {
  static auto* q = new Queue();  // leaked: outlives every tensor's destructor
  return *q;
}

std::atomic<bool> gEnabled{false};  // on, and launches not forced synchronous

// The value of a CPU scalar operand (a Python number or a 0-dim CPU tensor),
// as the float32 computation reads it; nullopt for a dtype not handled here.
std::optional<float> scalarValue(const at::Tensor& other) {
  const void* data = other.const_data_ptr();
  switch (other.scalar_type()) {
    case at::kDouble:
      return static_cast<float>(*static_cast<const double*>(data));
    case at::kFloat:
      return *static_cast<const float*>(data);
    case at::kLong:
      return static_cast<float>(*static_cast<const int64_t*>(data));
    case at::kInt:
      return static_cast<float>(*static_cast<const int32_t*>(data));
    default:
      return std::nullopt;
  }
}

// `value` rounded to bfloat16's bits (to nearest even, as c10::BFloat16 does;
// a NaN becomes 0x7FC0).
NEURON_INLINE uint16_t bf16Bits(float value) {
  const uint32_t bits = floatmath::bitsOf(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(floatmath::selectBits(value == value, rounded, 0x7FC0u));
}

// A number operand of a binary op as PyTorch's kernel reads it: bfloat16 add
// and sub round it to bfloat16 first (TensorIterator casts the wrapped number
// to the common dtype: `x + 0.1` adds 0.10009765625), while mul and div read it
// in float32 (their kernels' reduced-float path with a CPU scalar).
NEURON_INLINE float roundedToBf16(float value) {
  return floatmath::fromBits(static_cast<uint32_t>(bf16Bits(value)) << 16);
}

float numberAsRead(QueuedOp op, bool bf16, float value) {
  return bf16 && (op == QueuedOp::Add || op == QueuedOp::Sub) ? roundedToBf16(value) : value;
}

// A contiguous tensor of a dtype the queue computes, without conj/neg bits.
bool plainQueueable(const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  return (dtype == at::kFloat || dtype == at::kBFloat16) && t.is_contiguous() && !t.is_neg() && !t.is_conj();
}

// An op computed row by row (rows of `period` elements, all operands of the
// result's shape), not element by element.
bool rowWise(QueuedOp op) {
  return op == QueuedOp::Softmax || op == QueuedOp::SoftmaxBackward || op == QueuedOp::LogSoftmax ||
         op == QueuedOp::LogSoftmaxBackward || op == QueuedOp::LayerNorm || op == QueuedOp::RowSum ||
         op == QueuedOp::RowMean;
}

// A row op with one result per row (sum, mean over the last dim).
bool reducesRows(QueuedOp op) {
  return op == QueuedOp::RowSum || op == QueuedOp::RowMean;
}

// GELU and its gradient: float32 only (PyTorch's bfloat16 GELU is not checked
// against the queue's formulas here).
bool gelu(QueuedOp op) {
  return op == QueuedOp::Gelu || op == QueuedOp::GeluTanh || op == QueuedOp::GeluBackward ||
         op == QueuedOp::GeluTanhBackward;
}

// bfloat16: PyTorch's CPU kernels compute each of these ops in float32 and
// round the result once (RNE), as the queue does, except rsqrt and pow's
// exponents 3 and -2, which they compute in bfloat16 arithmetic, rounding
// after each step: those run unqueued.
// Softmax, log_softmax, layer norm, GELU, their gradients and linear: float32
// only (the row ops, rowWise; gelu).
bool computesInFloat(QueuedOp op) {
  return op != QueuedOp::Rsqrt && op != QueuedOp::Cube && op != QueuedOp::InverseSquare && !rowWise(op) &&
         !gelu(op) && op != QueuedOp::LinearRow;
}

// Whether `op` on this `self` may be queued at all right now: a float32 (or,
// for ops computed in float32, bfloat16) neuron tensor of 1 to kMaxElements
// elements.
bool queueable(QueuedOp op, const at::Tensor& self) {
  return gEnabled.load(std::memory_order_relaxed) && activeHooks() == 0 &&
         !at::globalContext().deterministicAlgorithms() && self.device().type() == kNeuron &&
         plainQueueable(self) && (self.scalar_type() == at::kFloat || computesInFloat(op)) && self.numel() > 0 &&
         self.numel() <= kMaxElements;
}

// queueable(), for a self of any strides (its layout checked by the caller).
bool queueableStrided(QueuedOp op, const at::Tensor& self) {
  const auto dtype = self.scalar_type();
  return gEnabled.load(std::memory_order_relaxed) && activeHooks() == 0 &&
         !at::globalContext().deterministicAlgorithms() && self.device().type() == kNeuron &&
         (dtype == at::kFloat || (dtype == at::kBFloat16 && computesInFloat(op))) && !self.is_neg() &&
         !self.is_conj() && self.numel() > 0 && self.numel() <= kMaxElements;
}

// The rows of a copy of `sizes` elements from `src` strides to `dst` strides
// (RowLayout); nullopt unless both have stride 1 in the last dim (or its size
// is 1), or for more than kMaxRowDims dims left once merged.
std::optional<RowLayout> rowLayout(c10::IntArrayRef sizes, c10::IntArrayRef src, c10::IntArrayRef dst) {
  RowLayout layout;
  if (sizes.empty()) {
    return layout;
  }
  const int64_t last = static_cast<int64_t>(sizes.size()) - 1;
  if (sizes[last] != 1 && (src[last] != 1 || dst[last] != 1)) {
    return std::nullopt;
  }
  layout.len = sizes[last];
  for (int64_t d = last - 1; d >= 0; --d) {
    if (sizes[d] == 1) {
      continue;
    }
    if (layout.dims == 0 && src[d] == layout.len && dst[d] == layout.len) {  // still contiguous on both sides
      layout.len *= sizes[d];
      continue;
    }
    if (layout.dims == kMaxRowDims) {
      return std::nullopt;
    }
    layout.sizes[layout.dims] = sizes[d];
    layout.src[layout.dims] = src[d];
    layout.dst[layout.dims] = dst[d];
    ++layout.dims;
  }
  return layout;
}

// The strides of PyTorch's result for an elementwise op or a clone of `self`
// (empty_like's, TensorIterator's for one operand): self's where it is dense,
// else dense in the order of self's strides.
std::vector<int64_t> preservedStrides(const at::Tensor& self) {
  return self.is_non_overlapping_and_dense() ? self.strides().vec()
                                             : at::infer_dense_strides(self.sizes(), self.strides());
}

// `other` is an operand of self's dtype the queue can read.
bool sameDtype(const at::Tensor& other, const at::Tensor& self) {
  return other.scalar_type() == self.scalar_type() && plainQueueable(other);
}

// How many elements `small` holds when broadcasting it to `full`'s shape
// repeats it whole for each of full's rows: its sizes, leading 1s dropped, are
// full's last sizes (and it has no more dims than full, or the result's shape
// would not be full's). nullopt for any other broadcast.
std::optional<int64_t> repeatPeriod(c10::IntArrayRef small, c10::IntArrayRef full) {
  if (small.size() > full.size()) {
    return std::nullopt;
  }
  size_t lead = 0;
  while (lead < small.size() && small[lead] == 1) {
    ++lead;
  }
  const auto tail = small.slice(lead);
  if (!tail.equals(full.slice(full.size() - tail.size()))) {
    return std::nullopt;
  }
  return c10::multiply_integers(tail);
}

// Whether broadcasting `small` to `full`'s shape repeats one value across each
// of full's rows (its last size): the same sizes but a last size of 1.
bool oneValuePerRow(c10::IntArrayRef small, c10::IntArrayRef full) {
  return !full.empty() && small.size() == full.size() && small.back() == 1 && full.back() > 1 &&
         small.slice(0, small.size() - 1).equals(full.slice(0, full.size() - 1));
}

// The call `self <op> other` (or `self <op>= other` when in_place), without
// its output; nullopt when it does not qualify: a float32 neuron tensor and
// either a CPU scalar or another float32 tensor on its core of its shape, or
// that broadcasts to it by repeating whole rows (out of place, self may be the
// one repeated); contiguous, no conj/neg bits.
// The call of a binary op on `self` with `alpha`, its other operand still to
// set; nullopt when self or alpha does not qualify.
std::optional<Call> binaryCall(QueuedOp op, const DirectOp& source, const at::Tensor& self, double alpha) {
  if (!queueable(op, self)) {
    return std::nullopt;
  }
  Call call{Entry{op, &source, self.scalar_type() == at::kBFloat16}, &self};
  // bfloat16 add/sub with an alpha other than 1: PyTorch's vector loop
  // computes a float32 fused multiply-add, rounded once, its scalar loop (a
  // tensor's last elements, all of a small one) bfloat16 steps, which differ
  // by more than a rounding where the terms cancel: run unqueued.
  if (call.entry.bf16 && alpha != 1.0) {
    return std::nullopt;
  }
  call.entry.alpha = static_cast<float>(alpha);
  return call;
}

std::optional<Call> operands(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor& other,
                             double alpha, bool in_place) {
  auto made = binaryCall(op, source, self, alpha);
  if (!made) {
    return std::nullopt;
  }
  Call& call = *made;
  if (other.device() == self.device()) {
    if (!sameDtype(other, self)) {
      return std::nullopt;
    }
    call.b = &other;
    if (other.sizes().equals(self.sizes())) {
      return made;
    }
    if (auto period = repeatPeriod(other.sizes(), self.sizes())) {
      call.entry.period = *period;
      return made;
    }
    if (oneValuePerRow(other.sizes(), self.sizes())) {
      call.entry.period = self.size(-1);
      call.entry.per_row = true;
      return made;
    }
    if (in_place || other.numel() > kMaxElements) {
      return std::nullopt;
    }
    if (oneValuePerRow(self.sizes(), other.sizes())) {
      call.entry.period = other.size(-1);
      call.entry.per_row = true;
    } else if (auto period = repeatPeriod(self.sizes(), other.sizes())) {
      call.entry.period = *period;
    } else {
      return std::nullopt;
    }
    call.entry.a_repeats = true;
  } else if (other.device().is_cpu() && other.dim() == 0 && !other.is_neg() && !other.is_conj()) {
    auto value = scalarValue(other);
    if (!value) {
      return std::nullopt;
    }
    call.entry.scalar = numberAsRead(op, call.entry.bf16, *value);
  } else {
    return std::nullopt;
  }
  return made;
}

// The loops below are inlined into two entry points (computeAnyCpu,
// computeAvx2Fma; CpuLoops.h): on the AVX2+FMA build std::fma (add/sub with
// alpha, lerp) is one vector instruction instead of a libm call per element.
// The results are the same on both: every formula is elementwise, std::fma is
// correctly rounded either way, and no other multiply-add is contracted into
// one (GCC would on the FMA build: addcmul, tanh_backward).

// PyTorch's float32 formulas: add/sub compute self + alpha * other as one
// fused multiply-add (exactly self +/- other for alpha 1), mul, div and sqrt
// one IEEE operation; lerp is PyTorch's vectorized form, one fused
// multiply-add from the nearer end (weight, or weight - 1 from `end`, when
// |weight| >= 0.5); pow's exponents 2, 3 and -2 are x * x, x * x * x and
// 1 / (x * x), as PyTorch's kernel computes them; addcmul / addcdiv are self + (value * t1) * t2 and
// self + (value * t1) / t2, left to right. The unary ops and the activation
// gradients are those of PyTorch's CPU kernels (relu keeps NaN and -0.0, as
// clamp_min does; rsqrt is 1 / sqrt; fill and zero write the value, its sign
// and NaN included; threshold_backward passes the gradient
// where the input is above the threshold, a NaN input included). exp, tanh,
// sigmoid, silu and silu_backward are FloatMath.h's: within about one ulp of
// PyTorch's (whose bits depend on the CPU), and the same bits on every CPU.
// `a` and `b` are functors of the element index (an array, or one value
// repeated).
template <class Out, class A, class B, class C>
NEURON_INLINE void compute(QueuedOp op, Out out, A a, B b, C c, float alpha, int64_t n) {
  switch (op) {
    case QueuedOp::Sqrt:
      for (int64_t i = 0; i < n; ++i) out(i, std::sqrt(a(i)));
      break;
    case QueuedOp::Lerp:
      if (std::abs(alpha) < 0.5f) {
        for (int64_t i = 0; i < n; ++i) out(i, std::fma(alpha, b(i) - a(i), a(i)));
      } else {
        const float coeff = alpha - 1.0f;
        for (int64_t i = 0; i < n; ++i) out(i, std::fma(coeff, b(i) - a(i), b(i)));
      }
      break;
    case QueuedOp::Addcmul:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) + alpha * b(i) * c(i));
      break;
    case QueuedOp::Addcdiv:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) + alpha * b(i) / c(i));
      break;
    case QueuedOp::Add:
    case QueuedOp::Sub: {
      const float scale = op == QueuedOp::Sub ? -alpha : alpha;
      if (scale == 1.0f) {
        for (int64_t i = 0; i < n; ++i) out(i, a(i) + b(i));
      } else if (scale == -1.0f) {
        for (int64_t i = 0; i < n; ++i) out(i, a(i) - b(i));
      } else {
        for (int64_t i = 0; i < n; ++i) out(i, std::fma(b(i), scale, a(i)));
      }
      break;
    }
    case QueuedOp::Mul:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) * b(i));
      break;
    case QueuedOp::Div:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) / b(i));
      break;
    case QueuedOp::Neg:
      for (int64_t i = 0; i < n; ++i) out(i, -a(i));
      break;
    case QueuedOp::Abs:
      for (int64_t i = 0; i < n; ++i) out(i, std::fabs(a(i)));
      break;
    case QueuedOp::Relu:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) < 0.0f ? 0.0f : a(i));
      break;
    case QueuedOp::Reciprocal:
      for (int64_t i = 0; i < n; ++i) out(i, 1.0f / a(i));
      break;
    case QueuedOp::Rsqrt:
      for (int64_t i = 0; i < n; ++i) out(i, 1.0f / std::sqrt(a(i)));
      break;
    case QueuedOp::Fill:
      for (int64_t i = 0; i < n; ++i) out(i, alpha);
      break;
    case QueuedOp::ThresholdBackward:
      for (int64_t i = 0; i < n; ++i) out(i, b(i) <= alpha ? 0.0f : a(i));
      break;
    case QueuedOp::SigmoidBackward:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) * (1.0f - b(i)) * b(i));
      break;
    case QueuedOp::TanhBackward:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) * (1.0f - b(i) * b(i)));
      break;
    case QueuedOp::Square:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) * a(i));
      break;
    case QueuedOp::Cube:
      for (int64_t i = 0; i < n; ++i) out(i, a(i) * a(i) * a(i));
      break;
    case QueuedOp::InverseSquare:
      for (int64_t i = 0; i < n; ++i) out(i, 1.0f / (a(i) * a(i)));
      break;
    case QueuedOp::Exp:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::exp(a(i)));
      break;
    case QueuedOp::Tanh:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::tanh(a(i)));
      break;
    case QueuedOp::Sigmoid:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::sigmoid(a(i)));
      break;
    case QueuedOp::Silu:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::silu(a(i)));
      break;
    case QueuedOp::SiluBackward:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::siluBackward(a(i), b(i)));
      break;
    case QueuedOp::Gelu:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::gelu(a(i)));
      break;
    case QueuedOp::GeluTanh:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::geluTanh(a(i)));
      break;
    case QueuedOp::GeluBackward:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::geluBackward(a(i), b(i)));
      break;
    case QueuedOp::GeluTanhBackward:
      for (int64_t i = 0; i < n; ++i) out(i, floatmath::geluTanhBackward(a(i), b(i)));
      break;
    case QueuedOp::Softmax:  // row by row: computeRows
    case QueuedOp::SoftmaxBackward:
    case QueuedOp::LogSoftmax:
    case QueuedOp::LogSoftmaxBackward:
    case QueuedOp::LayerNorm:
    case QueuedOp::RowSum:
    case QueuedOp::RowMean:
    case QueuedOp::LinearRow:  // Gemv.cpp's loop: run()
    case QueuedOp::Copy:       // copyRows: run()
      break;
  }
}

// Operands as functors of the element index, read as float32 (a bfloat16 is
// a float32's upper half: exact), and results written through a functor
// (bfloat16: rounded to nearest even, a NaN to PyTorch's 0x7FC0).
// Always inlined: GCC leaves some out of line in a switch this large, and a
// loop that calls a function is not vectorized.
struct Elements {
  const float* data;
  NEURON_INLINE float operator()(int64_t i) const {
    return data[i];
  }
};
struct Bf16Elements {
  const uint16_t* data;
  NEURON_INLINE float operator()(int64_t i) const {
    return floatmath::fromBits(static_cast<uint32_t>(data[i]) << 16);
  }
};
struct Repeated {
  float value;
  NEURON_INLINE float operator()(int64_t) const {
    return value;
  }
};
struct Store {
  float* data;
  NEURON_INLINE void operator()(int64_t i, float value) const {
    data[i] = value;
  }
};
struct Bf16Store {
  uint16_t* data;
  NEURON_INLINE void operator()(int64_t i, float value) const {
    data[i] = bf16Bits(value);
  }
};
// The elements of an operand of the entry's dtype.
template <class T>
struct ElementsOf;
template <>
struct ElementsOf<float> {
  using type = Elements;
  using store = Store;
};
template <>
struct ElementsOf<uint16_t> {
  using type = Bf16Elements;
  using store = Bf16Store;
};

// term(0) ... term(len - 1) reduced with `combine` in kLanes lanes, so that
// the loop vectorizes (the lanes, then the tail from `init`, then the lanes
// into it: a fixed order).
constexpr int kLanes = 16;
template <class T, class Term, class Combine>
NEURON_INLINE T reduceInLanes(int64_t len, T init, Term term, Combine combine) {
  T lanes[kLanes];
  std::fill(lanes, lanes + kLanes, init);
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], term(i + l));
  }
  T result = init;
  for (; i < len; ++i) result = combine(result, term(i));
  for (int l = 0; l < kLanes; ++l) result = combine(result, lanes[l]);
  return result;
}

// A row's maximum (a NaN is ignored: the exp of every element then makes the
// row NaN) and a sum of terms over a row, in lanes: the row ops' reductions.
NEURON_INLINE float rowMax(const float* x, int64_t len) {
  return reduceInLanes(
      len, -std::numeric_limits<float>::infinity(), [x](int64_t i) { return x[i]; },
      [](float m, float v) { return v > m ? v : m; });
}

template <class Term>
NEURON_INLINE float sumInLanes(int64_t len, Term term) {
  return reduceInLanes(len, 0.0f, term, [](float s, float v) { return s + v; });
}

// Softmax of each row of `len` floats, computed as PyTorch's CPU kernel for the
// last dim computes it: the row's maximum, exp(x - max), their sum, times the
// sum's reciprocal (its exp and order of summation differ: a few ulps). A NaN
// (ignored by the maximum, then in every exp), or an infinity's inf - inf,
// makes the row NaN, as there.
NEURON_INLINE void softmaxRows(float* out, const float* in, int64_t n, int64_t len) {
  for (int64_t row = 0; row < n; row += len) {
    const float* x = in + row;
    float* y = out + row;
    const float max = rowMax(x, len);
    const float sum = sumInLanes(len, [x, y, max](int64_t i) { return y[i] = floatmath::exp(x[i] - max); });
    const float scale = 1.0f / sum;
    for (int64_t i = 0; i < len; ++i) y[i] *= scale;
  }
}

// The softmax gradient of each row of `len` floats, as PyTorch's CPU kernel for
// the last dim computes it: output * (grad - sum(grad * output)) (another
// order of summation: a few ulps).
NEURON_INLINE void softmaxBackwardRows(float* out, const float* grad, const float* output, int64_t n, int64_t len) {
  for (int64_t row = 0; row < n; row += len) {
    const float* g = grad + row;
    const float* y = output + row;
    float* o = out + row;
    const float sum = sumInLanes(len, [g, y](int64_t i) { return g[i] * y[i]; });
    for (int64_t i = 0; i < len; ++i) o[i] = y[i] * (g[i] - sum);
  }
}

// Log-softmax of each row of `len` floats, as PyTorch's CPU kernel for the last
// dim computes it: (x - max) - log(sum of exp(x - max)) (its exp and order of
// summation differ: a few ulps; the log is the double one, rounded: the same
// bits on every CPU). A NaN, or an infinity's inf - inf, makes the row NaN, as there.
NEURON_INLINE void logSoftmaxRows(float* out, const float* in, int64_t n, int64_t len) {
  for (int64_t row = 0; row < n; row += len) {
    const float* x = in + row;
    float* y = out + row;
    const float max = rowMax(x, len);
    const float sum = sumInLanes(len, [x, max](int64_t i) { return floatmath::exp(x[i] - max); });
    const float log_sum = static_cast<float>(std::log(static_cast<double>(sum)));
    for (int64_t i = 0; i < len; ++i) y[i] = (x[i] - max) - log_sum;
  }
}

// The log-softmax gradient of each row, as PyTorch's CPU kernel computes it:
// grad - exp(output) * sum(grad) (another order of summation, the device's exp).
NEURON_INLINE void logSoftmaxBackwardRows(float* out, const float* grad, const float* output, int64_t n,
                                          int64_t len) {
  for (int64_t row = 0; row < n; row += len) {
    const float* g = grad + row;
    const float* y = output + row;
    float* o = out + row;
    const float sum = sumInLanes(len, [g](int64_t i) { return g[i]; });
    for (int64_t i = 0; i < len; ++i) o[i] = g[i] - floatmath::exp(y[i]) * sum;
  }
}

// Layer norm of each row of `len` floats, as PyTorch's CPU kernel computes it:
// the row's mean and biased variance, rstd = 1 / sqrt(variance + eps), then
// (x * rstd + (-rstd * mean)) * w + b, w and b read through functors (1 and 0
// where the call has none, as there). Its mean and variance are Welford's
// float32 moments in vector lanes, here two passes over the row summed in
// double (no overflow for finite rows, where Welford's mean has none either):
// a few ulps apart.
template <class W, class B>
NEURON_INLINE void layerNormRows(float* out, float* mean_out, float* rstd_out, const float* in, W w, B b, float eps,
                                 int64_t n, int64_t len) {
  for (int64_t row = 0; row < n; row += len) {
    const float* x = in + row;
    float* y = out + row;
    const auto add = [](double s, double v) { return s + v; };
    const double sum = reduceInLanes(len, 0.0, [x](int64_t i) { return static_cast<double>(x[i]); }, add);
    const double mean_exact = sum / static_cast<double>(len);
    const auto deviation = [x, mean_exact](int64_t i) {
      const double d = static_cast<double>(x[i]) - mean_exact;
      return d * d;
    };
    const double squares = reduceInLanes(len, 0.0, deviation, add);
    // An infinity makes Welford's mean NaN (inf - inf) in a row of more than one element.
    const float mean = len > 1 && std::isinf(sum) ? std::numeric_limits<float>::quiet_NaN()
                                                  : static_cast<float>(mean_exact);
    const float rstd = 1.0f / std::sqrt(static_cast<float>(squares / static_cast<double>(len)) + eps);
    const float shift = -rstd * mean;
    for (int64_t i = 0; i < len; ++i) y[i] = (x[i] * rstd + shift) * w(i) + b(i);
    mean_out[row / len] = mean;
    rstd_out[row / len] = rstd;
  }
}

// The sum or mean of each row of `len` floats, one result per row, summed in
// double lanes (PyTorch's CPU sum: a float32 cascade, another order) and rounded
// to float32; the mean is that float32 sum over len, as PyTorch divides it (so a
// sum beyond float32's range is infinite, as there).
NEURON_INLINE void sumRows(float* out, const float* in, int64_t n, int64_t len, bool mean) {
  for (int64_t row = 0; row < n; row += len) {
    const float* x = in + row;
    const double sum =
        reduceInLanes(len, 0.0, [x](int64_t i) { return static_cast<double>(x[i]); },
                      [](double s, double v) { return s + v; });
    const float total = static_cast<float>(sum);
    out[row / len] = mean ? total / static_cast<float>(len) : total;
  }
}

// A row op's loops (rowWise): `a` its input (or the incoming gradient), `b` the
// forward's output (layer norm: its weight, `c` its bias; either may be null).
NEURON_INLINE void computeRows(const Entry& e) {
  float* out = static_cast<float*>(e.out);
  const float *a = static_cast<const float*>(e.a), *b = static_cast<const float*>(e.b);
  const int64_t n = e.n, len = e.period;
  switch (e.op) {
    case QueuedOp::Softmax:
      softmaxRows(out, a, n, len);
      break;
    case QueuedOp::SoftmaxBackward:
      softmaxBackwardRows(out, a, b, n, len);
      break;
    case QueuedOp::LogSoftmax:
      logSoftmaxRows(out, a, n, len);
      break;
    case QueuedOp::LogSoftmaxBackward:
      logSoftmaxBackwardRows(out, a, b, n, len);
      break;
    case QueuedOp::RowSum:
    case QueuedOp::RowMean:
      sumRows(out, a, n, len, e.op == QueuedOp::RowMean);
      break;
    case QueuedOp::LayerNorm: {
      auto* mean = static_cast<float*>(e.out2);
      auto* rstd = static_cast<float*>(e.out3);
      const auto* c = static_cast<const float*>(e.c);
      if (b != nullptr && c != nullptr) {
        layerNormRows(out, mean, rstd, a, Elements{b}, Elements{c}, e.alpha, n, len);
      } else if (b != nullptr) {
        layerNormRows(out, mean, rstd, a, Elements{b}, Repeated{0.0f}, e.alpha, n, len);
      } else if (c != nullptr) {
        layerNormRows(out, mean, rstd, a, Repeated{1.0f}, Elements{c}, e.alpha, n, len);
      } else {
        layerNormRows(out, mean, rstd, a, Repeated{1.0f}, Repeated{0.0f}, e.alpha, n, len);
      }
      break;
    }
    default:
      break;
  }
}

// A repeated operand shorter than half of this is tiled to about this many
// elements before the loops run (computeEntry).
constexpr int64_t kTileElements = 512;

// One entry's loops, on its operands' memory (T: float, or uint16_t for bfloat16).
template <class T>
NEURON_INLINE void computeTyped(const Entry& e) {
  using In = typename ElementsOf<T>::type;
  using Out = typename ElementsOf<T>::store;
  T* out = static_cast<T*>(e.out);
  // a strided operand's rows were copied into out (run())
  const T *a = static_cast<const T*>(e.rows ? e.out : e.a), *b = static_cast<const T*>(e.b), *c = static_cast<const T*>(e.c);
  const int64_t n = e.n;
  if constexpr (std::is_same_v<T, float>) {
    if (rowWise(e.op)) {
      computeRows(e);
      return;
    }
  }
  if (b == nullptr) {
    compute(e.op, Out{out}, In{a}, Repeated{e.scalar}, In{c}, e.alpha, n);
  } else if (e.period == 0) {
    compute(e.op, Out{out}, In{a}, In{b}, In{c}, e.alpha, n);
  } else if (e.per_row) {  // each row's value read at its turn
    for (int64_t start = 0, row = 0; start < n; start += e.period, ++row) {
      if (e.a_repeats) {
        compute(e.op, Out{out + start}, Repeated{In{a}(row)}, In{b + start}, In{nullptr}, e.alpha, e.period);
      } else {
        compute(e.op, Out{out + start}, In{a + start}, Repeated{In{b}(row)}, In{nullptr}, e.alpha, e.period);
      }
    }
  } else if (e.period == 1) {  // one value, read now: queued ops before this one may have written it
    if (e.a_repeats) {
      compute(e.op, Out{out}, Repeated{In{a}(0)}, In{b}, In{c}, e.alpha, n);
    } else {
      compute(e.op, Out{out}, In{a}, Repeated{In{b}(0)}, In{c}, e.alpha, n);
    }
  } else {
    // Chunk by chunk, each chunk a whole number of rows and the repeated
    // operand as long as one chunk: a short row is first tiled (so that each
    // loop runs over hundreds of elements, not a handful per call).
    const T* repeated = e.a_repeats ? a : b;
    int64_t chunk = e.period;
    T tile[kTileElements];
    if (e.period <= kTileElements / 2) {
      chunk = kTileElements / e.period * e.period;
      for (int64_t i = 0; i < chunk; ++i) {
        tile[i] = repeated[i % e.period];
      }
      repeated = tile;
    }
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t m = std::min(chunk, n - start);  // rows are whole: n and chunk are multiples of period
      compute(e.op, Out{out + start}, In{e.a_repeats ? repeated : a + start}, In{e.a_repeats ? b + start : repeated},
              In{nullptr}, e.alpha, m);
    }
  }
}

NEURON_INLINE void computeEntry(const Entry& e) {
  if (e.bf16) {
    computeTyped<uint16_t>(e);
  } else {
    computeTyped<float>(e);
  }
}

NEURON_VECTORIZED void computeAnyCpu(const Entry& e) {
  computeEntry(e);
}

#ifdef NEURON_X86_FMA
NEURON_VECTORIZED NEURON_AVX2_FMA void computeAvx2Fma(const Entry& e) {
  computeEntry(e);
}
#endif
std::atomic<bool> gAsync{true};  // a full queue goes to the device thread

void runOnThisThread(const Entry& e) {
#ifdef NEURON_X86_FMA
  if (avx2FmaLoops()) {
    computeAvx2Fma(e);
    return;
  }
#endif
  computeAnyCpu(e);
}

// `e`'s elements [begin, end) (whole rows of a repeated operand, or of a row
// op's): its pointers moved to `begin`, except a repeated operand's.
Entry slice(const Entry& e, int64_t begin, int64_t end) {
  Entry part = e;
  const int64_t offset = begin * (e.bf16 ? 2 : 4);
  const auto move = [offset](const void* p) {
    return p == nullptr ? p : static_cast<const void*>(static_cast<const char*>(p) + offset);
  };
  const bool repeats = e.period != 0 && !rowWise(e.op);
  // A value per row (per_row's repeated operand, a sum's result): moved by whole rows.
  const auto moveRows = [&](const void* p) {
    return static_cast<const void*>(static_cast<const char*>(p) + offset / e.period);
  };
  const auto moveRepeated = [&](const void* p) { return e.per_row ? moveRows(p) : p; };
  part.out = reducesRows(e.op) ? const_cast<void*>(moveRows(e.out)) : static_cast<char*>(e.out) + offset;
  part.a = repeats && e.a_repeats ? moveRepeated(e.a) : move(e.a);
  part.b = repeats && !e.a_repeats ? moveRepeated(e.b) : move(e.b);
  part.c = move(e.c);
  part.n = end - begin;
  if (e.op == QueuedOp::LayerNorm) {  // the same weight and bias for every row; one mean and rstd per row
    part.b = e.b;
    part.c = e.c;
    part.out2 = static_cast<float*>(e.out2) + begin / e.period;
    part.out3 = static_cast<float*>(e.out3) + begin / e.period;
  }
  return part;
}

// A strided operand's rows copied into the entry's result (Entry::rows).
void copyRows(const Entry& e) {
  const RowLayout& r = *e.rows;
  const int64_t size = e.bf16 ? 2 : 4;
  const auto* in = static_cast<const char*>(e.a);
  auto* out = static_cast<char*>(e.out);
  std::array<int64_t, kMaxRowDims> index{};
  int64_t src = 0, dst = 0;
  for (int64_t row = 0, rows = e.n / r.len; row < rows; ++row) {
    std::memcpy(out + dst * size, in + src * size, r.len * size);
    for (int d = 0; d < r.dims; ++d) {  // the next row's offsets, innermost dim first
      src += r.src[d];
      dst += r.dst[d];
      if (++index[d] < r.sizes[d]) {
        break;
      }
      src -= r.src[d] * r.sizes[d];
      dst -= r.dst[d] * r.sizes[d];
      index[d] = 0;
    }
  }
}

// One entry's loops; above the grain size split across the intra-op threads
// by whole rows, as PyTorch's kernels split them (each element is computed
// by the same loop either way: the bits do not depend on the split).
void run(const Entry& e) {
  if (e.rows) {
    copyRows(e);
    if (e.op == QueuedOp::Copy) {
      return;
    }
  }
  if (e.op == QueuedOp::LinearRow) {  // queued only where Gemv.cpp would not split it (queueLinearRow)
    gemvOnThisThread(static_cast<const float*>(e.b), static_cast<const float*>(e.a), static_cast<const float*>(e.c),
                     static_cast<float*>(e.out), e.n, e.period);
    return;
  }
  if (e.n <= kGrainSize || at::get_num_threads() == 1 || at::in_parallel_region()) {
    runOnThisThread(e);
    return;
  }
  const int64_t row = std::max<int64_t>(e.period, 1);
  at::parallel_for(0, e.n / row, (kGrainSize + row - 1) / row, [&](int64_t begin, int64_t end) {
    runOnThisThread(slice(e, begin * row, end * row));
  });
}

// Asynchronous execution (issue #28 item 3): a queue that fills up while ops
// keep coming is handed, whole, to the device thread, and the calling thread
// goes on queueing; whatever needs device bytes (runQueued) waits for it
// first, so reads and writes stay in program order. The thread only computes:
// the entries it ran (their tensor references) are dropped by a thread that
// calls in, since dropping the last reference to a tensor may free its
// Python object.
class DeviceThread {
 public:
  using Batches = std::vector<std::vector<Entry>>;

  // Hands `entries` over, behind the batches still queued for the thread (at
  // most kMaxBatches: past that it waits); the batches done since the last
  // call, to drop.
  Batches submit(std::vector<Entry>&& entries) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return static_cast<int>(todo_.size()) + running_ < kMaxBatches; });
    todo_.push_back(std::move(entries));
    handed_.fetch_add(1, std::memory_order_release);
    if (owner_ != getpid()) {  // the first launch (a forked child starts its own: threads do not survive fork)
      owner_ = getpid();
      static std::once_flag fork_hook;
      std::call_once(fork_hook, [] { pthread_atfork(&DeviceThread::beforeFork, nullptr, nullptr); });
      std::thread([this] { loop(); }).detach();
    }
    work_.notify_one();
    return std::exchange(finished_, {});
  }

  // Waits until every batch handed over has run; they, to drop.
  Batches wait() {
    auto lock = idle();
    return std::exchange(finished_, {});
  }

  // Waits until every batch handed over has run, leaving them to be dropped later; the lock, held.
  std::unique_lock<std::mutex> idle() {
    spinUntil([this] { return ran_.load(std::memory_order_acquire) == handed_.load(std::memory_order_acquire); });
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return todo_.empty() && running_ == 0; });
    return lock;
  }

  int64_t launches() {
    std::lock_guard<std::mutex> lock(mutex_);
    return launches_;
  }

 private:
  // Batches queued for the thread at most: the memory their results hold
  // stays bounded (kMaxHeldBytes each), while the thread may start late (a
  // sleeping core can take tens of microseconds to wake, longer than a short
  // batch takes to fill) without holding up the caller.
  static constexpr int kMaxBatches = 4;

  // Spins up to kSpin for `ready` before the caller sleeps on a condition
  // variable: a thread woken from sleep on a core gone idle can take tens of
  // microseconds to run, as long as a short batch takes to compute.
  template <class Ready>
  static void spinUntil(Ready ready) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    while (!ready() && std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  static constexpr std::chrono::microseconds kSpin{50};

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (todo_.empty()) {  // the next batch is often a few microseconds away
        const int64_t seen = handed_.load(std::memory_order_acquire);
        lock.unlock();
        spinUntil([&] { return handed_.load(std::memory_order_acquire) != seen; });
        lock.lock();
      }
      work_.wait(lock, [this] { return !todo_.empty(); });
      std::vector<Entry> batch = std::move(todo_.front());
      todo_.pop_front();
      running_ = 1;
      lock.unlock();
      for (const Entry& e : batch) {
        run(e);
      }
      lock.lock();
      running_ = 0;
      launches_ += 1;
      finished_.push_back(std::move(batch));
      ran_.fetch_add(1, std::memory_order_release);
      done_.notify_all();
    }
  }

  // A child must not inherit a half-computed batch.
  static void beforeFork();

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<std::vector<Entry>> todo_;  // handed over, not started; the front runs next
  int running_ = 0;                      // a batch is running
  Batches finished_;                     // run, not yet dropped
  int64_t launches_ = 0;                 // batches run by the thread
  std::atomic<int64_t> handed_{0}, ran_{0};  // batches handed over and run, read while spinning
  pid_t owner_ = -1;                     // the process whose thread it is
};

DeviceThread& deviceThread() {
  static auto* thread = new DeviceThread();  // leaked, as the queue
  return *thread;
}

void DeviceThread::beforeFork() {
  deviceThread().idle();
}

// Counts the queue's ops as one launch and empties it (the caller runs or hands over
// what it moved out); `q.mutex` is held.
std::vector<Entry> takeLaunch(Queue& q, const c10::OperatorName* joined = nullptr) {
  countLaunch(q, joined);
  q.stats.launches += 1;
  q.stats.ops += std::count_if(q.entries.begin(), q.entries.end(),  // queued ops: a joined matmul was not queued
                               [](const Entry& e) { return !e.continues; });
  q.held_bytes = 0;
  q.written_bytes = 0;
  q.parallel = false;
  std::vector<Entry> launch = std::exchange(q.entries, {});
  q.entries.reserve(launch.size());  // one allocation rather than a doubling per power of two
  return launch;
}

std::atomic<WithGil> gWithGil{nullptr};

// Entries that ran, dropped by their holder once the queue's lock is released,
// all under one hold of the GIL: a dead intermediate result kept alive by an
// entry still has its Python object (PyTorch's PyObject preservation), and
// freeing each one would otherwise take and release the GIL.
struct Ran {
  DeviceThread::Batches batches;  // run by the device thread
  std::vector<Entry> entries;     // run by the caller

  Ran() = default;
  Ran(DeviceThread::Batches b, std::vector<Entry> e) : batches(std::move(b)), entries(std::move(e)) {}
  Ran(Ran&&) = default;
  Ran& operator=(Ran&&) = default;
  ~Ran() {
    size_t count = entries.size();
    for (const auto& batch : batches) {
      count += batch.size();
    }
    WithGil with_gil = gWithGil.load(std::memory_order_relaxed);
    if (count >= kDropUnderGil && with_gil != nullptr) {
      with_gil([](void* ran) { static_cast<Ran*>(ran)->clear(); }, this);
    }
  }

 private:
  static constexpr size_t kDropUnderGil = 4;  // fewer: each takes the GIL if it needs it

  void clear() {
    batches.clear();
    entries.clear();
  }
};

// Runs what is queued, after the device thread's batch; `q.mutex` is held.
// `joined`: the op that ends the sequence (countLaunch).
Ran runLocked(Queue& q, const c10::OperatorName* joined = nullptr) {
  Ran ran(deviceThread().wait(), {});
  if (!q.entries.empty()) {
    ran.entries = takeLaunch(q, joined);
    for (const Entry& e : ran.entries) {
      run(e);
    }
  }
  detail::gQueued.store(false, std::memory_order_release);
  return ran;
}

// `entries` queued, in order (one call's parts: cat's inputs): they write
// `bytes`, of which `fresh_bytes` are new results the queue holds, and split
// across the intra-op threads when `parallel`.
void enqueueAll(std::span<Entry> entries, int64_t bytes, int64_t fresh_bytes, bool parallel) {
  Queue& q = queue();
  Ran finished;  // declared before the lock: dropped after it is released
  std::lock_guard<std::mutex> lock(q.mutex);
  q.held_bytes += fresh_bytes;
  q.written_bytes += bytes;
  q.parallel = q.parallel || parallel;
  for (Entry& entry : entries) {
    q.entries.push_back(std::move(entry));
  }
  detail::gQueued.store(true, std::memory_order_release);
  if (static_cast<int64_t>(q.entries.size()) >= q.limit || q.held_bytes >= kMaxHeldBytes ||
      q.written_bytes >= kMaxWrittenBytes) {
    if (gAsync.load(std::memory_order_relaxed) && !q.parallel) {
      // Full while ops keep coming: to the device thread (gQueued stays set until runQueued waits for it).
      finished.batches = deviceThread().submit(takeLaunch(q));
    } else {
      finished = runLocked(q);
    }
  }
}

void enqueue(Entry&& entry, int64_t bytes, int64_t fresh_bytes, bool parallel) {
  enqueueAll(std::span<Entry>(&entry, 1), bytes, fresh_bytes, parallel);
}

// `call` queued, writing `out`.
void push(Call& call, const at::Tensor& out) {
  Entry& entry = call.entry;
  entry.out = out.mutable_data_ptr();
  entry.a = call.a->const_data_ptr();
  entry.b = call.b != nullptr ? call.b->const_data_ptr() : nullptr;
  entry.c = call.c != nullptr ? call.c->const_data_ptr() : nullptr;
  entry.n = out.numel();
  const bool fresh = &out != call.a;  // out of place: a result the queue holds (in place holds no new memory)
  entry.keep = {out, fresh ? *call.a : at::Tensor(), call.b != nullptr ? *call.b : at::Tensor(),
                call.c != nullptr ? *call.c : at::Tensor()};
  const auto bytes = static_cast<int64_t>(entry.n * out.element_size());
  const bool parallel = entry.n > kGrainSize;
  enqueue(std::move(entry), bytes, fresh ? bytes : 0, parallel);
}

// The call for an op whose operands are all tensors (sqrt, lerp, addcmul,
// addcdiv): float32 neuron tensors of self's shape on its core.
std::optional<Call> tensorOperands(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor* b,
                                   const at::Tensor* c, double value) {
  if (!queueable(op, self)) {
    return std::nullopt;
  }
  for (const at::Tensor* t : {b, c}) {
    if (t != nullptr && (t->device() != self.device() || !sameDtype(*t, self) || !t->sizes().equals(self.sizes()))) {
      return std::nullopt;
    }
  }
  Call call{Entry{op, &source, self.scalar_type() == at::kBFloat16}, &self, b, c};
  call.entry.alpha = static_cast<float>(value);
  if (rowWise(op)) {
    call.entry.period = self.size(-1);  // its rows (run() splits whole rows)
  }
  return call;
}

// A fresh contiguous result of `sizes`, of `like`'s dtype, on its core.
at::Tensor freshResult(c10::IntArrayRef sizes, const at::Tensor& like) {
  c10::DeviceGuard guard(like.device());
  return at::detail::empty_generic(sizes, &neuronAllocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   like.scalar_type(), c10::MemoryFormat::Contiguous);
}

// A fresh result of `sizes` and `strides` (dense), of `like`'s dtype, on its core.
at::Tensor freshStrided(c10::IntArrayRef sizes, c10::IntArrayRef strides, const at::Tensor& like) {
  c10::DeviceGuard guard(like.device());
  return at::detail::empty_strided_generic(sizes, strides, &neuronAllocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.scalar_type());
}

// A fresh result for `call` (the shape of its operand that is not repeated),
// then the call queued; the result.
at::Tensor queueOutOfPlace(Call& call) {
  at::Tensor out = freshResult((call.entry.a_repeats ? call.b : call.a)->sizes(), *call.a);
  push(call, out);
  return out;
}

// An optional operand the queue reads beside `self`: absent, or a tensor of
// self's dtype on its core, of `sizes`.
bool optionalOperand(const std::optional<at::Tensor>& t, const at::Tensor& self, c10::IntArrayRef sizes) {
  return !t.has_value() || !t->defined() ||
         (t->device() == self.device() && sameDtype(*t, self) && t->sizes().equals(sizes));
}

const void* dataOf(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->const_data_ptr() : nullptr;
}

at::Tensor tensorOf(const std::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// `call` queued writing its own first operand; false (run it now) when another
// operand shares only part of its memory (PyTorch refuses that, or reads it
// while writing it) or the overlap cannot be told.
bool writesItsOwnOperandSafely(const Call& call) {
  for (const at::Tensor* t : {call.b, call.c}) {
    if (t != nullptr) {
      const auto overlap = at::get_overlap_status(*call.a, *t);
      if (overlap == at::MemOverlapStatus::Partial || overlap == at::MemOverlapStatus::TooHard) {
        return false;
      }
    }
  }
  return true;
}

bool queueInPlace(Call& call) {
  if (!writesItsOwnOperandSafely(call)) {
    return false;
  }
  push(call, *call.a);
  return true;
}

// The binary ops: their second operand may be a tensor or a number (operands()).
bool binary(QueuedOp op) {
  return op == QueuedOp::Add || op == QueuedOp::Sub || op == QueuedOp::Mul || op == QueuedOp::Div;
}

// `self <op> value` for a number (the foreach ops' Scalar and ScalarList
// overloads), as operands() takes a Python number: float32 only. (On
// bfloat16, PyTorch's CPU foreach kernels do not read the number as its
// single-tensor op does: _foreach_mul_ rounds 0.9 to bfloat16 before the
// product, mul_ keeps its float32 value; _foreach_div_ keeps it. Unqueued.)
std::optional<Call> scalarOperand(QueuedOp op, const DirectOp& source, const at::Tensor& self, float value) {
  if (!queueable(op, self) || self.scalar_type() != at::kFloat) {
    return std::nullopt;
  }
  Call call{Entry{op, &source, self.scalar_type() == at::kBFloat16}, &self};
  call.entry.alpha = 1.0f;
  call.entry.scalar = value;
  return call;
}

// Every element's call of a foreach op, or nullopt when one does not qualify
// (or the lists' lengths disagree: PyTorch's kernel raises its error).
std::optional<std::vector<Call>> foreachCalls(QueuedOp op, const DirectOp& source, const ForeachOperands& args,
                                              bool in_place) {
  const size_t n = args.self.size();
  const auto fits = [n](size_t size) { return size == 0 || size == n; };
  if (n == 0 || !fits(args.b.size()) || !fits(args.c.size()) || !fits(args.scalars.size()) ||
      args.values.empty() || (args.values.size() != 1 && args.values.size() != n)) {
    return std::nullopt;
  }
  std::vector<Call> calls;
  calls.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const double value = args.values[args.values.size() == 1 ? 0 : i];
    const at::Tensor* b = args.b.empty() ? nullptr : &args.b[i];
    std::optional<Call> call;
    if (!binary(op)) {
      call = tensorOperands(op, source, args.self[i], b, args.c.empty() ? nullptr : &args.c[i], value);
    } else if (b != nullptr || args.other != nullptr) {
      call = operands(op, source, args.self[i], b != nullptr ? *b : *args.other, value, in_place);
    } else if (!args.scalars.empty()) {
      call = scalarOperand(op, source, args.self[i], args.scalars[i]);
    }
    if (!call || (in_place && !writesItsOwnOperandSafely(*call))) {
      return std::nullopt;
    }
    calls.push_back(std::move(*call));
  }
  return calls;
}

} // namespace

namespace detail {
void runQueuedSlow(const c10::OperatorName* joined) {
  Queue& q = queue();
  Ran ran;  // declared before the lock: dropped after it is released
  std::lock_guard<std::mutex> lock(q.mutex);
  ran = runLocked(q, joined);
}
} // namespace detail

HeldEntries runQueuedHolding() {
  if (!detail::gQueued.load(std::memory_order_acquire)) {
    return nullptr;
  }
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mutex);
  return std::make_shared<Ran>(runLocked(q));
}

void setConcatenation(bool enabled, bool launch_blocking, int64_t buffer_limit) {
  TORCH_CHECK(buffer_limit >= 1, "the concatenation buffer size limit must be at least 1, got ", buffer_limit);
  runQueued();
  {
    std::lock_guard<std::mutex> lock(queue().mutex);
    queue().limit = buffer_limit;
  }
  gEnabled.store(enabled && !launch_blocking, std::memory_order_relaxed);
}

void setWithGil(WithGil with_gil) {
  gWithGil.store(with_gil, std::memory_order_relaxed);
}

void useAnyCpuLoops(bool any_cpu) {
  runQueued();
  gAnyCpuLoops.store(any_cpu, std::memory_order_relaxed);
}

void setConcatenationAsync(bool async) {
  runQueued();
  gAsync.store(async, std::memory_order_relaxed);
}

bool concatenationEnabled() {
  return gEnabled.load(std::memory_order_relaxed);
}

std::optional<double> queueableScalar(const at::Scalar& value) {
  if (value.isComplex()) {
    return std::nullopt;
  }
  const double v = value.toDouble();
  if (c10::overflows<float, double>(v)) {
    return std::nullopt;
  }
  return v;
}

std::optional<float> queueableNumber(const at::Scalar& value) {
  if (value.isComplex() || value.isBoolean()) {
    return std::nullopt;
  }
  return value.isIntegral(/*includeBool=*/false) ? static_cast<float>(value.toLong())
                                                 : static_cast<float>(value.toDouble());
}

at::Tensor queueBinary(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor& other,
                       double alpha) {
  auto call = operands(op, source, self, other, alpha, /*in_place=*/false);
  return call ? queueOutOfPlace(*call) : at::Tensor();
}

bool queueBinaryInplace(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor& other,
                        double alpha) {
  auto call = operands(op, source, self, other, alpha, /*in_place=*/true);
  return call && queueInPlace(*call);
}

// The call `self <op> other` for a number, as operands() takes a wrapped one
// (bfloat16 included, under the same rule for alpha).
std::optional<Call> numberOperands(QueuedOp op, const DirectOp& source, const at::Tensor& self,
                                   const at::Scalar& other, double alpha) {
  const auto value = queueableNumber(other);
  auto call = value ? binaryCall(op, source, self, alpha) : std::nullopt;
  if (call) {
    call->entry.scalar = numberAsRead(op, call->entry.bf16, *value);
  }
  return call;
}

at::Tensor queueNumber(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Scalar& other,
                       double alpha) {
  auto call = numberOperands(op, source, self, other, alpha);
  return call ? queueOutOfPlace(*call) : at::Tensor();
}

bool queueNumberInplace(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Scalar& other,
                        double alpha) {
  auto call = numberOperands(op, source, self, other, alpha);
  if (call && call->entry.bf16 && op == QueuedOp::Mul) {
    // PyTorch's mul_.Scalar passes the wrapped number as the first operand (mul_out(self, number,
    // self)), so its kernel's reduced-float path does not see it and it is cast to bfloat16 first.
    call->entry.scalar = roundedToBf16(call->entry.scalar);
  }
  return call && queueInPlace(*call);
}

// `self` (any strides) copied into a fresh result of `strides` (queueClone),
// then `op` applied in place on it (Copy: none); undefined when the copy's
// rows do not qualify (rowLayout). A dense self of the result's strides is
// read as it is, element by element in memory order.
at::Tensor queueStrided(QueuedOp op, const DirectOp& source, const at::Tensor& self, c10::IntArrayRef strides) {
  Entry entry{op, &source, self.scalar_type() == at::kBFloat16};
  if (!(self.is_non_overlapping_and_dense() && self.strides().equals(strides))) {
    auto layout = rowLayout(self.sizes(), self.strides(), strides);
    if (!layout) {
      return at::Tensor();
    }
    entry.rows = std::make_shared<const RowLayout>(*layout);
  } else if (op == QueuedOp::Copy) {
    entry.rows = std::make_shared<const RowLayout>(RowLayout{self.numel()});  // one row: the whole
  }
  at::Tensor out = freshStrided(self.sizes(), strides, self);
  entry.out = out.mutable_data_ptr();
  entry.a = self.const_data_ptr();
  entry.n = out.numel();
  entry.keep = {out, self};
  const auto bytes = static_cast<int64_t>(entry.n * out.element_size());
  const bool parallel = op != QueuedOp::Copy && entry.n > kGrainSize;  // the op after the copy may split
  enqueue(std::move(entry), bytes, bytes, parallel);
  return out;
}

at::Tensor queueTensors(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor* b,
                        const at::Tensor* c, double value) {
  auto call = tensorOperands(op, source, self, b, c, value);
  if (call) {
    return queueOutOfPlace(*call);
  }
  // A unary op of a strided self: its rows copied into the result, the op in place there.
  if (b == nullptr && c == nullptr && !rowWise(op) && !self.is_contiguous() && queueableStrided(op, self)) {
    return queueStrided(op, source, self, preservedStrides(self));
  }
  return at::Tensor();
}

at::Tensor queueClone(const DirectOp& source, const at::Tensor& self, std::optional<c10::MemoryFormat> format) {
  const auto memory_format = format.value_or(c10::MemoryFormat::Preserve);
  if ((memory_format != c10::MemoryFormat::Preserve && memory_format != c10::MemoryFormat::Contiguous) ||
      !queueableStrided(QueuedOp::Copy, self)) {
    return at::Tensor();
  }
  if (memory_format == c10::MemoryFormat::Contiguous) {
    return queueStrided(QueuedOp::Copy, source, self, c10::contiguous_strides(self.sizes()));
  }
  return queueStrided(QueuedOp::Copy, source, self, preservedStrides(self));
}

// Whether no two elements of `t` share memory (at::has_internal_overlap says
// "too hard" for any view that is not dense, a slice included): its dims in
// the order of their strides, each stride beyond the elements the smaller
// ones reach.
bool elementsApart(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of more than one element
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) {
      dims.emplace_back(t.stride(d), t.size(d));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest offset the dims so far reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) {
      return false;
    }
    reach += stride * (size - 1);
  }
  return true;
}

// Whether `a` and `b` cannot share memory: other storages, or apart within
// one (at::get_overlap_status says "too hard" for any view that is not dense).
bool memoryApart(const at::Tensor& a, const at::Tensor& b) {
  if (!a.storage().is_alias_of(b.storage())) {
    return true;
  }
  const auto span = [](const at::Tensor& t) {  // the first and last element's offsets
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      last += t.stride(d) * (t.size(d) - 1);
    }
    return std::pair<int64_t, int64_t>(t.storage_offset(), last);
  };
  const auto [a_first, a_last] = span(a);
  const auto [b_first, b_last] = span(b);
  return a_last < b_first || b_last < a_first;
}

bool queueCopy(const DirectOp& source, const at::Tensor& src, const at::Tensor& dst) {
  if (!queueableStrided(QueuedOp::Copy, dst) || src.device() != dst.device() ||
      src.scalar_type() != dst.scalar_type() || src.is_neg() || src.is_conj() || !src.sizes().equals(dst.sizes()) ||
      !elementsApart(dst) || !memoryApart(dst, src)) {
    return false;
  }
  auto layout = rowLayout(dst.sizes(), src.strides(), dst.strides());
  if (!layout) {
    return false;
  }
  Entry entry{QueuedOp::Copy, &source, dst.scalar_type() == at::kBFloat16};
  entry.rows = std::make_shared<const RowLayout>(*layout);
  entry.a = src.const_data_ptr();
  entry.out = dst.mutable_data_ptr();
  entry.n = dst.numel();
  entry.keep = {dst, src};
  enqueue(std::move(entry), static_cast<int64_t>(dst.numel() * dst.element_size()), 0, false);
  return true;
}

at::Tensor queueCat(const DirectOp& source, const at::ITensorListRef& tensors, int64_t dim) {
  const auto inputs = tensors.materialize();
  if (inputs.empty() || inputs.size() > 64) {
    return at::Tensor();
  }
  const at::Tensor& first = inputs.front();
  const int64_t ndim = first.dim();
  if (ndim == 0 || dim < -ndim || dim >= ndim) {
    return at::Tensor();  // PyTorch's errors, or a legacy empty input to skip: unqueued
  }
  dim = dim < 0 ? dim + ndim : dim;
  std::vector<int64_t> sizes = first.sizes().vec();
  sizes[dim] = 0;
  for (const at::Tensor& t : inputs) {
    // every input of first's device, dtype and sizes but in `dim`, suggesting
    // the contiguous format (so the result is contiguous, as PyTorch makes it)
    if (t.dim() != ndim || t.device() != first.device() || t.scalar_type() != first.scalar_type() || t.is_neg() ||
        t.is_conj() || t.suggest_memory_format() != c10::MemoryFormat::Contiguous) {
      return at::Tensor();
    }
    for (int64_t d = 0; d < ndim; ++d) {
      if (d != dim && t.size(d) != sizes[d]) {
        return at::Tensor();
      }
    }
    sizes[dim] += t.size(dim);
  }
  const int64_t numel = c10::multiply_integers(sizes);
  const auto nonempty = std::find_if(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.numel() > 0; });
  if (numel == 0 || numel > kMaxElements || !queueableStrided(QueuedOp::Copy, *nonempty)) {
    return at::Tensor();
  }
  const auto out_strides = c10::contiguous_strides(sizes);
  std::vector<std::optional<RowLayout>> layouts;  // each input's rows in out (none: an empty input)
  for (const at::Tensor& t : inputs) {
    layouts.push_back(t.numel() > 0 ? rowLayout(t.sizes(), t.strides(), out_strides) : RowLayout{0});
    if (!layouts.back()) {
      return at::Tensor();
    }
  }
  at::Tensor out = freshResult(sizes, first);
  std::vector<Entry> entries;
  int64_t offset = 0;  // elements of out before the next input's part
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (t.numel() > 0) {
      Entry entry{QueuedOp::Copy, &source, first.scalar_type() == at::kBFloat16};
      entry.rows = std::make_shared<const RowLayout>(*layouts[i]);
      entry.a = t.const_data_ptr();
      entry.out = static_cast<char*>(out.mutable_data_ptr()) + offset * out_strides[dim] * out.element_size();
      entry.n = t.numel();
      entry.continues = !entries.empty();
      entry.keep = {out, t};
      entries.push_back(std::move(entry));
    }
    offset += t.size(dim);
  }
  const auto bytes = static_cast<int64_t>(numel * out.element_size());
  enqueueAll(entries, bytes, bytes, false);
  return out;
}

bool queueTensorsInplace(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor* b,
                         const at::Tensor* c, double value) {
  auto call = tensorOperands(op, source, self, b, c, value);
  return call && queueInPlace(*call);
}

std::vector<at::Tensor> queueForeach(QueuedOp op, const DirectOp& source, const ForeachOperands& operands) {
  auto calls = foreachCalls(op, source, operands, /*in_place=*/false);
  std::vector<at::Tensor> results;
  if (calls) {
    results.reserve(calls->size());
    for (Call& call : *calls) {
      results.push_back(queueOutOfPlace(call));
    }
  }
  return results;
}

bool queueForeachInplace(QueuedOp op, const DirectOp& source, const ForeachOperands& operands) {
  auto calls = foreachCalls(op, source, operands, /*in_place=*/true);
  if (!calls) {
    return false;
  }
  for (Call& call : *calls) {
    push(call, *call.a);
  }
  return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> queueLayerNorm(const DirectOp& source, const at::Tensor& input,
                                                              c10::IntArrayRef normalized_shape,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& bias, double eps) {
  const auto dims = static_cast<int64_t>(normalized_shape.size());
  // Shapes PyTorch's kernel would refuse, with its error, run unqueued.
  if (!queueable(QueuedOp::LayerNorm, input) || dims == 0 || dims > input.dim() ||
      !input.sizes().slice(input.dim() - dims).equals(normalized_shape) ||
      !optionalOperand(weight, input, normalized_shape) || !optionalOperand(bias, input, normalized_shape)) {
    return {};
  }
  const int64_t axis = input.dim() - dims;
  std::vector<int64_t> stat_sizes(input.sizes().begin(), input.sizes().begin() + axis);
  stat_sizes.resize(input.dim(), 1);  // PyTorch's: the leading sizes, then a 1 for each normalized dim
  at::Tensor out = freshResult(input.sizes(), input);
  at::Tensor mean = freshResult(stat_sizes, input);
  at::Tensor rstd = freshResult(stat_sizes, input);
  Entry entry{QueuedOp::LayerNorm, &source};
  entry.out = out.mutable_data_ptr();
  entry.out2 = mean.mutable_data_ptr();
  entry.out3 = rstd.mutable_data_ptr();
  entry.a = input.const_data_ptr();
  entry.b = dataOf(weight);
  entry.c = dataOf(bias);
  entry.n = input.numel();
  entry.period = c10::multiply_integers(normalized_shape);
  entry.alpha = static_cast<float>(eps);  // PyTorch's float kernel reads eps as a float
  entry.keep = {out, input, tensorOf(weight), tensorOf(bias), mean, rstd};
  const auto bytes = static_cast<int64_t>((out.numel() + 2 * mean.numel()) * sizeof(float));
  enqueue(std::move(entry), bytes, bytes, input.numel() > kGrainSize);
  return {out, mean, rstd};
}

at::Tensor queueRowReduction(QueuedOp op, const DirectOp& source, const at::Tensor& self,
                             at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype) {
  if (!queueable(op, self) || self.dim() == 0 || !dim.has_value() || dim->size() != 1 ||
      ((*dim)[0] != -1 && (*dim)[0] != self.dim() - 1) || (dtype.has_value() && *dtype != at::kFloat)) {
    return at::Tensor();
  }
  std::vector<int64_t> sizes = self.sizes().vec();
  if (keepdim) {
    sizes.back() = 1;
  } else {
    sizes.pop_back();
  }
  at::Tensor out = freshResult(sizes, self);
  Entry entry{op, &source};
  entry.out = out.mutable_data_ptr();
  entry.a = self.const_data_ptr();
  entry.n = self.numel();
  entry.period = self.size(-1);
  entry.keep = {out, self};
  const auto bytes = static_cast<int64_t>(out.numel() * sizeof(float));
  enqueue(std::move(entry), bytes, bytes, self.numel() > kGrainSize);
  return out;
}

at::Tensor queueLinearRow(const DirectOp& source, const at::Tensor& input, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias) {
  const int64_t n = weight.size(0), k = weight.size(1);
  if (!queueable(QueuedOp::LinearRow, input) || (gemvSplits(n, k) && n * k * 4 > kMaxSplitProductBytes)) {
    return at::Tensor();
  }
  auto sizes = input.sizes().vec();
  sizes.back() = n;
  at::Tensor out = freshResult(sizes, input);
  Entry entry{QueuedOp::LinearRow, &source};
  entry.out = out.mutable_data_ptr();
  entry.a = input.const_data_ptr();
  entry.b = weight.const_data_ptr();
  entry.c = dataOf(bias);
  entry.n = n;
  entry.period = k;
  entry.keep = {out, input, weight, tensorOf(bias)};
  Queue& q = queue();
  Ran finished;  // declared before the lock: dropped after it is released
  std::lock_guard<std::mutex> lock(q.mutex);
  const bool parallel = q.parallel;
  // The ops queued before it and the product: one launch, counted under their
  // names with linear's last (runQueuedEndingWith's name); linear alone is
  // counted under its own name when called, as unqueued.
  std::vector<Entry> launch = q.entries.empty() ? std::vector<Entry>() : takeLaunch(q, &source.handle().operator_name());
  launch.push_back(std::move(entry));
  if (gAsync.load(std::memory_order_relaxed) && !parallel) {
    finished.batches = deviceThread().submit(std::move(launch));
    detail::gQueued.store(true, std::memory_order_release);  // until runQueued waits for the device thread
  } else {
    finished = Ran(deviceThread().wait(), std::move(launch));
    for (const Entry& e : finished.entries) {
      run(e);
    }
    detail::gQueued.store(false, std::memory_order_release);
  }
  return out;
}

ConcatenationStats concatenationStats() {
  Queue& q = queue();
  std::lock_guard<std::mutex> lock(q.mutex);
  ConcatenationStats stats = q.stats;
  stats.sequences = static_cast<int64_t>(q.launched.size());
  stats.device_thread_launches = deviceThread().launches();
  return stats;
}

} // namespace torch_neuronx
