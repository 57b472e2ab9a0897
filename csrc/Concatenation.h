// Adaptive Eager Execution (TorchNeuron's "concatenation", issue #28): eager
// ops queued and run together as one launch.
//
// Float32 and bfloat16 elementwise ops (csrc/FastOps.cpp serves them, and
// csrc/Foreach.cpp the foreach ops, one queued op per element; the
// out-of-place and in-place forms): add, sub, mul and div (Tensor and Scalar overloads),
// sqrt, neg, abs, relu, reciprocal, rsqrt, pow (exponents 2, 3, -2, 0.5,
// -0.5, -1: PyTorch's CPU kernel computes these with IEEE operations, not
// std::pow), lerp (Scalar weight), addcmul and addcdiv, exp, tanh, sigmoid
// and silu (csrc/FloatMath.h: the same bits on every CPU), softmax and its
// gradient and log_softmax and its gradient over the last dim, layer norm over
// the last dims, GELU and its gradient (float32: as PyTorch's kernels compute
// them, to a few ulps), linear with one float32 row (which ends the sequence,
// queueLinearRow), and the activation
// gradients threshold_backward (relu's), sigmoid_backward, tanh_backward and
// silu_backward (bfloat16: computed in float32 and rounded once, as PyTorch's
// CPU kernels do; rsqrt and pow 3 / -2, which they compute in bfloat16 steps,
// and add/sub with alpha != 1 (in bfloat16 steps in their scalar loop)
// are not queued), sum and mean over the last dim (float32), on contiguous
// tensors of one shape (add, sub, mul, div: or a scalar operand, or one that
// broadcasts by repeating whole rows or one value per row), of at most
// 131,072 elements (above PyTorch's grain size, 32,768, split across the
// intra-op threads as its CPU kernels split them); and clone, cat, copy_ and
// the unary ops of strided views whose last dim has stride 1 (queueClone,
// queueCat, queueCopy: the queue copies their rows), are
// queued instead of run when TORCH_NEURONX_ENABLE_CONCATENATION is on. The
// queue runs as one launch, in program order, when anything may read device
// memory: every path to device bytes goes through a host alias (hostAlias,
// owningHostAlias, Eager.h), and making one runs the queue first; so do
// synchronize, events and a full queue (TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT
// ops, 512 KiB of fresh results held, or 4 MiB written), and a matmul-class
// op, which ends the sequence and joins its launch (runQueuedEndingWith). A full
// queue is handed to the device thread (asynchronous execution: it computes
// while the caller goes on queueing, up to 4 batches ahead; not a queue with an
// op split across the intra-op threads); whatever runs the queue waits for it
// first, so device memory is read and written in program order. A queued call
// checks everything that could fail when it is queued (device, dtype, shape,
// overlap), so an error is raised by the call that caused it, as unqueued.
//
// Not queued (run at once, as without concatenation): any other call, and
// every call while torch.use_deterministic_algorithms(True) is in force,
// NEURON_LAUNCH_BLOCKING=1 asks for synchronous launches, or the audit or
// torch.profiler is listening (they see each op as its own launch).
#pragma once

#include <ATen/core/Tensor.h>

#include "Eager.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace torch_neuronx {

enum class QueuedOp : uint8_t {
  Add, Sub, Mul, Div, Sqrt, Lerp, Addcmul, Addcdiv,
  Neg, Abs, Relu, Reciprocal, Rsqrt, Fill,
  ThresholdBackward, SigmoidBackward, TanhBackward,
  Exp, Tanh, Sigmoid, Silu, SiluBackward,
  Square, Cube, InverseSquare,  // pow with exponent 2, 3, -2
  // Row by row (rows of self's last size, float32): _softmax, _log_softmax and
  // their gradients (_softmax_backward_data, _log_softmax_backward_data: self
  // the gradient, b the forward's output) over the last dim.
  Softmax, SoftmaxBackward, LogSoftmax, LogSoftmaxBackward,
  // native_layer_norm over the last dims (float32; its mean and rstd too):
  // queueLayerNorm.
  LayerNorm,
  // gelu (exact, tanh) and gelu_backward (self the gradient, b the input), float32.
  Gelu, GeluTanh, GeluBackward, GeluTanhBackward,
  // linear with one row of float32 (csrc/Gemv.cpp), which ends the sequence: queueLinearRow.
  LinearRow,
  // sum and mean over the last dim (float32, one result per row): queueRowReduction.
  RowSum, RowMean,
  // A copy of a strided operand's rows (clone, cat: queueClone, queueCat).
  Copy,
};

// From TORCH_NEURONX_ENABLE_CONCATENATION, NEURON_LAUNCH_BLOCKING and
// TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT (torch_neuronx/ops/__init__.py).
void setConcatenation(bool enabled, bool launch_blocking, int64_t buffer_limit);
bool concatenationEnabled();
// A full queue runs on the device thread (the default) or at once on the caller's.
void setConcatenationAsync(bool async);
// Tests: run the device's loops (CpuLoops.h: the queue's, linear's one-row product)
// built for any CPU of the architecture even where the AVX2+FMA ones could run
// (both must give the same bits); the queue is run first.
void useAnyCpuLoops(bool any_cpu);

// A Scalar argument (add/sub's alpha, lerp's weight, addcmul/addcdiv's value,
// threshold_backward's threshold) as the queue's float32 loops read it;
// nullopt where PyTorch's kernel converts it with a check that fails (a
// complex number, or a finite value beyond float32's range: "value cannot be
// converted to type float without overflow"), so that the call runs unqueued
// and raises PyTorch's error.
std::optional<double> queueableScalar(const at::Scalar& value);
// A number as the other operand of add/sub/mul/div (the foreach ops' Scalar
// and ScalarList overloads), as PyTorch reads the tensor it wraps it in: an
// integer or a double rounded to float32; nullopt for a boolean or complex
// number (run unqueued), as for such a wrapped tensor (operands()).
std::optional<float> queueableNumber(const at::Scalar& value);

// `source` is the call's op (its name is the launch's name in get_executed_ops()).
// `self <op> other` (times alpha for add/sub) queued: its result, or an
// undefined tensor when the call does not qualify (the caller runs it now).
// `other` may broadcast to self's shape, or self to other's, by repeating
// whole rows (a [N] bias over [B, N], a 0-dim tensor).
at::Tensor queueBinary(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor& other,
                       double alpha);
// `self <op>= other` queued: false when the call does not qualify.
bool queueBinaryInplace(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor& other,
                        double alpha);
// add/sub/mul/div's .Scalar overloads (`x * 0.5` written in C++, as autograd's
// formulas write it): PyTorch's kernel wraps the number in a CPU tensor and
// calls the .Tensor overload, so the call is queued as queueBinary queues
// `self <op> number`: the number read as queueableNumber reads it.
at::Tensor queueNumber(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Scalar& other,
                       double alpha);
bool queueNumberInplace(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Scalar& other,
                        double alpha);
// A unary op of self, lerp(self, b, value), addcmul / addcdiv(self, b, c, value=value),
// threshold_backward(self, b, value), sigmoid_backward / tanh_backward(self, b),
// silu_backward(self, b) (self: the gradient, b: the input) queued, every
// tensor a neuron tensor of self's shape and dtype (b, c: nullptr where the op has none).
at::Tensor queueTensors(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor* b,
                        const at::Tensor* c, double value);
bool queueTensorsInplace(QueuedOp op, const DirectOp& source, const at::Tensor& self, const at::Tensor* b,
                         const at::Tensor* c, double value);

// Strided operands (views: a slice, a transpose, an expand), float32 or
// bfloat16, whose last dim has stride 1 (or size 1): their rows are copied by
// the queue (Entry::rows). clone(self, memory_format) with the result's
// strides PyTorch's clone gives (the same where self is dense, else dense in
// self's order of dims; or contiguous), and cat(tensors, dim) where every
// input suggests the contiguous format (its result is contiguous); each
// returns an undefined tensor when the call does not qualify. queueTensors
// takes a unary op of such a self (neg of a slice: rotary embeddings'
// rotate_half) as a copy of its rows into the result, then the op in place.
at::Tensor queueClone(const DirectOp& source, const at::Tensor& self, std::optional<c10::MemoryFormat> format);
at::Tensor queueCat(const DirectOp& source, const at::ITensorListRef& tensors, int64_t dim);
// dst.copy_(src) between two such views of one shape on one core, of one dtype,
// that share no memory (slice_backward's copy into a slice of zeros, `x[:, :k] = y`):
// false when the call does not qualify.
bool queueCopy(const DirectOp& source, const at::Tensor& src, const at::Tensor& dst);

// native_layer_norm(input, normalized_shape, weight, bias, eps) queued: its
// (output, mean, rstd), or undefined tensors when the call does not qualify (a
// float32 neuron input whose last sizes are normalized_shape, weight and bias
// absent or float32 tensors of that shape on its core).
std::tuple<at::Tensor, at::Tensor, at::Tensor> queueLayerNorm(const DirectOp& source, const at::Tensor& input,
                                                              c10::IntArrayRef normalized_shape,
                                                              const std::optional<at::Tensor>& weight,
                                                              const std::optional<at::Tensor>& bias, double eps);
// sum.dim_IntList or mean.dim (op RowSum, RowMean) over self's last dim queued:
// its result, or an undefined tensor when the call does not qualify (a float32
// neuron tensor of at least one dim, dim the last one alone, no other dtype).
at::Tensor queueRowReduction(QueuedOp op, const DirectOp& source, const at::Tensor& self,
                             at::OptionalIntArrayRef dim, bool keepdim, std::optional<at::ScalarType> dtype);
// linear with one row of float32 (y = W x + b, csrc/Gemv.cpp) queued as the
// end of the sequence, as runQueuedEndingWith ends it (a matmul-class op joins
// the launch of the ops queued before it: "aten::gelu|aten::linear"), and the
// launch handed to the device thread: the caller goes on while the product is
// computed (by the device thread alone, even where the intra-op threads would
// split it, up to 1 MiB of weight). Its result, or an undefined tensor when the
// queue does not take the call (the caller runs it now). The operands are those
// linear's one-row kernel takes (csrc/Linear.cpp's isOneRow).
at::Tensor queueLinearRow(const DirectOp& source, const at::Tensor& input, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias);

// A foreach op (csrc/Foreach.cpp) queued as one op per element of its list, in
// order, all or none: every element's call is checked first, and nothing is
// queued unless each qualifies as the single-tensor op would (the caller runs
// the whole call now). Element i is self[i] with b[i] and c[i] (lists empty
// where the op has none); a binary op's other operand is b[i], `other` (one
// tensor for every element: the .Tensor overloads) or scalars[i] (a number);
// its alpha, or the op's weight or value, is values[i] (values[0] for every
// element when it holds one).
struct ForeachOperands {
  at::TensorList self;
  at::TensorList b, c;
  const at::Tensor* other = nullptr;
  std::vector<float> scalars;
  std::vector<double> values{1.0};
};
// The results (empty: not queued).
std::vector<at::Tensor> queueForeach(QueuedOp op, const DirectOp& source, const ForeachOperands& operands);
bool queueForeachInplace(QueuedOp op, const DirectOp& source, const ForeachOperands& operands);

// A matmul-class call (mm, bmm, addmm, baddbmm, addbmm, linear, its backward,
// convolution: OpFlags kEndsFusedSequence) about to run. TorchNeuron's engine
// ends the buffered sequence with such an op, itself included (its
// MatMulToMatMul rule): the queued ops run now, before the call reads its
// inputs, and the launch is counted in get_executed_ops() with the call as its
// last op ("aten::add.Tensor|aten::mm"). Nothing queued: one load, as runQueued.
namespace detail {
extern std::atomic<bool> gQueued;  // some op is queued
void runQueuedSlow(const c10::OperatorName* joined = nullptr);
} // namespace detail

inline void runQueuedEndingWith(const c10::OperatorHandle& op) {
  if (detail::gQueued.load(std::memory_order_acquire)) {
    detail::runQueuedSlow(&op.operator_name());
  }
}

// Runs every queued op. One relaxed load when nothing is queued: called
// before every read of device memory.
inline void runQueued() {
  if (detail::gQueued.load(std::memory_order_acquire)) {
    detail::runQueuedSlow();
  }
}

// Runs fn(arg) holding Python's GIL where the calling thread is a Python
// thread that does not hold it (else as it is); set by the Python module
// (Module.cpp). Queued ops that ran are dropped through it: the tensors they
// kept alive may hold the last references to Python objects.
using WithGil = void (*)(void (*fn)(void*), void* arg);
void setWithGil(WithGil with_gil);
// Queued ops that ran, and the tensors they hold (type-erased).
using HeldEntries = std::shared_ptr<void>;
// Runs every queued op for a caller holding an allocator lock: what ran is
// returned (null when nothing was queued), for the caller to drop once the
// lock is released (dropping the tensors it holds frees device memory).
HeldEntries runQueuedHolding();
// Launches run, ops they held, and distinct op sequences among them, since
// start (for tests and benchmarks).
struct ConcatenationStats {
  int64_t launches = 0;
  int64_t ops = 0;
  int64_t sequences = 0;
  int64_t device_thread_launches = 0;  // of the launches, those the device thread ran
};
ConcatenationStats concatenationStats();

} // namespace torch_neuronx
