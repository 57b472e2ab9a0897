// Hot kernel paths: the elementwise arithmetic that dominates eager training
// loops, called unboxed and straight into PyTorch's CPU kernels, or queued
// when concatenation is on (Concatenation.h). Saves the
// boxing and the second trip through the dispatcher that the generic alias
// path pays (about 1 us per call on a tiny tensor). Anything unusual (mixed
// devices, CPU scalars, float64 under the fp32 rule, a non-contiguous in-place
// output while DeviceLimits.h's limits are enforced) takes the generic path,
// so semantics are those of csrc/Eager.cpp.
#include "Allocator.h"
#include "Concatenation.h"
#include "DeviceLimits.h"
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/ops/add_cpu_dispatch.h>
#include <ATen/ops/div_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
#include <ATen/ops/sub_cpu_dispatch.h>
#include <torch/library.h>

#include <optional>

namespace torch_neuronx {
namespace {

// The core `self` lives on, or -1 when the call needs the generic path.
// `other` may be on the same core or a CPU scalar (a wrapped Python number).
c10::DeviceIndex sameCore(const at::Tensor& self, const at::Tensor& other) {
  if (self.device().type() != kNeuron || needsFp64Emulation(self)) {
    return -1;
  }
  if (other.device() == self.device()) {
    return needsFp64Emulation(other) ? -1 : self.device().index();
  }
  return other.device().is_cpu() && other.dim() == 0 ? self.device().index() : -1;
}

// One out-of-place and one in-place kernel per binary op, with their ops
// (NAME##Op, NAME##InplaceOp: counter and handle for the generic path).
// at::cpu::NAME / NAME##_ are PyTorch's CPU kernels. A call counts itself
// and records itself only on the fast path: the generic path counts and records
// the call under the same op.
#define NEURON_BINARY_KERNELS(NAME, OP, PARAMS, ARGS, ALPHA)                                \
  DirectOp NAME##Op(#NAME ".Tensor");                                                        \
  DirectOp NAME##InplaceOp(#NAME "_.Tensor");                                                \
  at::Tensor NAME##Tensor(const at::Tensor& self, const at::Tensor& other PARAMS) {          \
    const auto core = sameCore(self, other);                                                 \
    if (core < 0) {                                                                          \
      return NAME##Op.runGeneric(self, other ARGS);                                          \
    }                                                                                        \
    auto call = NAME##Op.enter(self, other ARGS);                                            \
    if (concatenationEnabled()) {                                                            \
      if (auto alpha_value = ALPHA) {                                                        \
        at::Tensor queued = queueBinary(QueuedOp::OP, NAME##Op, self, other, *alpha_value);  \
        if (queued.defined()) {                                                              \
          return queued;                                                                     \
        }                                                                                    \
      }                                                                                      \
    }                                                                                        \
    CaptureScope capture(core);                                                              \
    return adoptKernelResult(at::cpu::NAME(hostAlias(self), hostOperand(other) ARGS), core); \
  }                                                                                          \
  at::Tensor& NAME##Inplace(at::Tensor& self, const at::Tensor& other PARAMS) {              \
    if (sameCore(self, other) < 0 || (deviceLimitsEnforced() && !self.is_contiguous())) {    \
      NAME##InplaceOp.runGeneric(self, other ARGS);                                          \
      return self;                                                                           \
    }                                                                                        \
    auto call = NAME##InplaceOp.enter(self, other ARGS);                                     \
    if (concatenationEnabled()) {                                                            \
      auto alpha_value = ALPHA;                                                              \
      if (alpha_value && queueBinaryInplace(QueuedOp::OP, NAME##InplaceOp, self, other,      \
                                            *alpha_value)) {                                 \
        return self;                                                                         \
      }                                                                                      \
    }                                                                                        \
    at::Tensor alias = hostAlias(self);                                                      \
    at::cpu::NAME##_(alias, hostOperandWith(other, self, alias) ARGS);                       \
    return self;                                                                             \
  }

// add and sub take a trailing alpha; mul and div do not.
#define NEURON_ALPHA_PARAM , const at::Scalar& alpha
#define NEURON_ALPHA_ARG , alpha
#define NEURON_NOTHING

NEURON_BINARY_KERNELS(add, Add, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, queueableScalar(alpha))
NEURON_BINARY_KERNELS(sub, Sub, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, queueableScalar(alpha))
NEURON_BINARY_KERNELS(mul, Mul, NEURON_NOTHING, NEURON_NOTHING, std::optional<double>(1.0))
NEURON_BINARY_KERNELS(div, Div, NEURON_NOTHING, NEURON_NOTHING, std::optional<double>(1.0))

// Their .Scalar overloads (`mul.Scalar(x, 2.0)`: autograd's formulas, C++
// code): queued as the .Tensor overload with a Python number is, any other
// call served by the alias path as before (PyTorch's kernel wraps the number
// and calls the .Tensor overload).
#define NEURON_SCALAR_KERNELS(NAME, OP, PARAMS, ARGS, ALPHA)                                      \
  DirectOp NAME##ScalarOp(#NAME ".Scalar");                                                       \
  DirectOp NAME##ScalarInplaceOp(#NAME "_.Scalar");                                               \
  at::Tensor NAME##Scalar(const at::Tensor& self, const at::Scalar& other PARAMS) {               \
    if (concatenationEnabled()) {                                                                 \
      if (auto alpha_value = ALPHA) {                                                             \
        at::Tensor queued = queueNumber(QueuedOp::OP, NAME##ScalarOp, self, other, *alpha_value); \
        if (queued.defined()) {                                                                   \
          auto call = NAME##ScalarOp.enter(self, other ARGS);                                     \
          return queued;                                                                          \
        }                                                                                         \
      }                                                                                           \
    }                                                                                             \
    return NAME##ScalarOp.runGeneric(self, other ARGS);                                           \
  }                                                                                               \
  at::Tensor& NAME##ScalarInplace(at::Tensor& self, const at::Scalar& other PARAMS) {             \
    if (concatenationEnabled()) {                                                                 \
      auto alpha_value = ALPHA;                                                                   \
      if (alpha_value && queueNumberInplace(QueuedOp::OP, NAME##ScalarInplaceOp, self, other,     \
                                            *alpha_value)) {                                      \
        auto call = NAME##ScalarInplaceOp.enter(self, other ARGS);                                \
        return self;                                                                              \
      }                                                                                           \
    }                                                                                             \
    NAME##ScalarInplaceOp.runGeneric(self, other ARGS);                                           \
    return self;                                                                                  \
  }

NEURON_SCALAR_KERNELS(add, Add, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, queueableScalar(alpha))
NEURON_SCALAR_KERNELS(sub, Sub, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, queueableScalar(alpha))
NEURON_SCALAR_KERNELS(mul, Mul, NEURON_NOTHING, NEURON_NOTHING, std::optional<double>(1.0))
NEURON_SCALAR_KERNELS(div, Div, NEURON_NOTHING, NEURON_NOTHING, std::optional<double>(1.0))

// Ops served here only so that concatenation can queue them (Concatenation.h):
// a call the queue takes is counted here; any other call takes the alias path
// as before, which counts and records it. NEURON_QUEUED_KERNEL makes an op's
// out-of-place kernel, NEURON_QUEUED_KERNELS its in-place kernel too; KIND
// names the parameters after self (NEURON_<KIND>_PARAMS, _ARGS). B and C
// are the tensors beside self (nullptr where the op has none), VALUE the
// Scalar (lerp's weight, addcmul/addcdiv's value, threshold_backward's
// threshold).
#define NEURON_QUEUED_KERNEL(NAME, OVERLOAD, OP, KIND, B, C, VALUE)                            \
  DirectOp NAME##Op(#NAME OVERLOAD);                                                           \
  at::Tensor NAME##Queued(const at::Tensor& self NEURON_##KIND##_PARAMS) {                     \
    if (concatenationEnabled()) {                                                              \
      if (auto scalar = VALUE) {                                                               \
        at::Tensor queued = queueTensors(QueuedOp::OP, NAME##Op, self, B, C, *scalar);         \
        if (queued.defined()) {                                                                \
          auto call = NAME##Op.enter(self NEURON_##KIND##_ARGS);                               \
          return queued;                                                                       \
        }                                                                                      \
      }                                                                                        \
    }                                                                                          \
    return NAME##Op.runGeneric(self NEURON_##KIND##_ARGS);                                     \
  }
#define NEURON_QUEUED_KERNELS(NAME, OVERLOAD, OP, KIND, B, C, VALUE)                           \
  NEURON_QUEUED_KERNEL(NAME, OVERLOAD, OP, KIND, B, C, VALUE)                                  \
  DirectOp NAME##InplaceOp(#NAME "_" OVERLOAD);                                                \
  at::Tensor& NAME##InplaceQueued(at::Tensor& self NEURON_##KIND##_PARAMS) {                   \
    if (concatenationEnabled()) {                                                              \
      auto scalar = VALUE;                                                                     \
      if (scalar && queueTensorsInplace(QueuedOp::OP, NAME##InplaceOp, self, B, C, *scalar)) { \
        auto call = NAME##InplaceOp.enter(self NEURON_##KIND##_ARGS);                          \
        return self;                                                                           \
      }                                                                                        \
    }                                                                                          \
    NAME##InplaceOp.runGeneric(self NEURON_##KIND##_ARGS);                                     \
    return self;                                                                               \
  }

#define NEURON_UNARY_PARAMS
#define NEURON_UNARY_ARGS
#define NEURON_LERP_PARAMS , const at::Tensor& end, const at::Scalar& weight
#define NEURON_LERP_ARGS , end, weight
#define NEURON_POINTWISE_PARAMS , const at::Tensor& tensor1, const at::Tensor& tensor2, const at::Scalar& value
#define NEURON_POINTWISE_ARGS , tensor1, tensor2, value
// The activation gradients: `self` is the incoming gradient.
#define NEURON_THRESHOLD_PARAMS , const at::Tensor& input, const at::Scalar& threshold
#define NEURON_THRESHOLD_ARGS , input, threshold
#define NEURON_FILL_PARAMS , const at::Scalar& value
#define NEURON_FILL_ARGS , value
#define NEURON_OUTPUT_PARAMS , const at::Tensor& output
#define NEURON_OUTPUT_ARGS , output
#define NEURON_INPUT_PARAMS , const at::Tensor& input
#define NEURON_INPUT_ARGS , input

#define NEURON_NO_SCALAR std::optional<double>(0.0)
NEURON_QUEUED_KERNELS(sqrt, "", Sqrt, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(neg, "", Neg, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(abs, "", Abs, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(relu, "", Relu, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(reciprocal, "", Reciprocal, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(rsqrt, "", Rsqrt, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(exp, "", Exp, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(tanh, "", Tanh, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(sigmoid, "", Sigmoid, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(silu, "", Silu, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
// fill and zero are data movement (float64 is written exactly): the queue takes float32 only.
NEURON_QUEUED_KERNELS(fill, ".Scalar", Fill, FILL, nullptr, nullptr, queueableScalar(value))
NEURON_QUEUED_KERNELS(zero, "", Fill, UNARY, nullptr, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNELS(lerp, ".Scalar", Lerp, LERP, &end, nullptr, queueableScalar(weight))
NEURON_QUEUED_KERNELS(addcmul, "", Addcmul, POINTWISE, &tensor1, &tensor2, queueableScalar(value))
NEURON_QUEUED_KERNELS(addcdiv, "", Addcdiv, POINTWISE, &tensor1, &tensor2, queueableScalar(value))
NEURON_QUEUED_KERNEL(threshold_backward, "", ThresholdBackward, THRESHOLD, &input, nullptr, queueableScalar(threshold))
NEURON_QUEUED_KERNEL(sigmoid_backward, "", SigmoidBackward, OUTPUT, &output, nullptr, NEURON_NO_SCALAR)
NEURON_QUEUED_KERNEL(tanh_backward, "", TanhBackward, OUTPUT, &output, nullptr, NEURON_NO_SCALAR)
// pow with a number as exponent: queued where PyTorch's CPU kernel computes a
// fixed formula of IEEE operations (2: x * x, 3: x * x * x, -2: 1 / (x * x),
// 0.5: sqrt, -0.5: 1 / sqrt, -1: 1 / x; the same bits), any other exponent
// runs unqueued (std::pow).
std::optional<QueuedOp> powFormula(const at::Scalar& exponent) {
  if (exponent.isComplex() || exponent.isBoolean()) {
    return std::nullopt;
  }
  const double e = exponent.toDouble();
  if (e == 2.0) return QueuedOp::Square;
  if (e == 3.0) return QueuedOp::Cube;
  if (e == -2.0) return QueuedOp::InverseSquare;
  if (e == 0.5) return QueuedOp::Sqrt;
  if (e == -0.5) return QueuedOp::Rsqrt;
  if (e == -1.0) return QueuedOp::Reciprocal;
  return std::nullopt;
}

DirectOp powOp("pow.Tensor_Scalar");
DirectOp powInplaceOp("pow_.Scalar");

at::Tensor powQueued(const at::Tensor& self, const at::Scalar& exponent) {
  const auto op = concatenationEnabled() ? powFormula(exponent) : std::nullopt;
  if (op) {
    at::Tensor queued = queueTensors(*op, powOp, self, nullptr, nullptr, 0.0);
    if (queued.defined()) {
      auto call = powOp.enter(self, exponent);
      return queued;
    }
  }
  return powOp.runGeneric(self, exponent);
}

at::Tensor& powInplaceQueued(at::Tensor& self, const at::Scalar& exponent) {
  const auto op = concatenationEnabled() ? powFormula(exponent) : std::nullopt;
  if (op && queueTensorsInplace(*op, powInplaceOp, self, nullptr, nullptr, 0.0)) {
    auto call = powInplaceOp.enter(self, exponent);
    return self;
  }
  powInplaceOp.runGeneric(self, exponent);
  return self;
}

// _softmax over the last dim, float32 (queueTensors takes no other dtype),
// without a dtype conversion (`converts`: half_to_float, which is an error for
// float32, or a gradient whose input_dtype is another: the alias path serves them).
#define NEURON_SOFTMAX_PARAMS , int64_t dim, bool half_to_float
#define NEURON_SOFTMAX_ARGS , dim, half_to_float
std::optional<double> lastDimSoftmax(const at::Tensor& self, int64_t dim, bool converts) {
  const bool last = self.dim() > 0 && (dim == -1 || dim == self.dim() - 1);
  return last && !converts ? std::optional<double>(0.0) : std::nullopt;
}
NEURON_QUEUED_KERNEL(_softmax, "", Softmax, SOFTMAX, nullptr, nullptr, lastDimSoftmax(self, dim, half_to_float))
// Its gradient (self: the incoming gradient), for a float32 softmax (input_dtype float32).
#define NEURON_SOFTMAX_BACKWARD_PARAMS , const at::Tensor& output, int64_t dim, at::ScalarType input_dtype
#define NEURON_SOFTMAX_BACKWARD_ARGS , output, dim, input_dtype
NEURON_QUEUED_KERNEL(_softmax_backward_data, "", SoftmaxBackward, SOFTMAX_BACKWARD, &output, nullptr,
                     lastDimSoftmax(self, dim, input_dtype != self.scalar_type()))
// log_softmax (a language model's cross_entropy) and its gradient: the same conditions.
NEURON_QUEUED_KERNEL(_log_softmax, "", LogSoftmax, SOFTMAX, nullptr, nullptr, lastDimSoftmax(self, dim, half_to_float))
NEURON_QUEUED_KERNEL(_log_softmax_backward_data, "", LogSoftmaxBackward, SOFTMAX_BACKWARD, &output, nullptr,
                     lastDimSoftmax(self, dim, input_dtype != self.scalar_type()))

// silu_backward(grad_output, self): the macro's `self` is the gradient, `input` the op's self.
NEURON_QUEUED_KERNEL(silu_backward, "", SiluBackward, INPUT, &input, nullptr, NEURON_NO_SCALAR)

// sum and mean over the last dim (float32; RMSNorm's mean(x^2, -1, keepdim=True)).
#define NEURON_REDUCTION_KERNEL(NAME, OVERLOAD, OP)                                                         \
  DirectOp NAME##DimOp(#NAME "." OVERLOAD);                                                                 \
  at::Tensor NAME##Dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,                   \
                       std::optional<at::ScalarType> dtype) {                                               \
    if (concatenationEnabled()) {                                                                           \
      if (at::Tensor queued = queueRowReduction(QueuedOp::OP, NAME##DimOp, self, dim, keepdim, dtype);      \
          queued.defined()) {                                                                               \
        auto call = NAME##DimOp.enter(self, dim, keepdim, dtype);                                           \
        return queued;                                                                                      \
      }                                                                                                     \
    }                                                                                                       \
    return NAME##DimOp.runGeneric(self, dim, keepdim, dtype);                                               \
  }
NEURON_REDUCTION_KERNEL(sum, "dim_IntList", RowSum)
NEURON_REDUCTION_KERNEL(mean, "dim", RowMean)

// clone and cat of strided float32 / bfloat16 views (Concatenation.h: queueClone, queueCat).
DirectOp cloneOp("clone");
at::Tensor cloneQueued(const at::Tensor& self, std::optional<at::MemoryFormat> memory_format) {
  if (concatenationEnabled()) {
    if (at::Tensor queued = queueClone(cloneOp, self, memory_format); queued.defined()) {
      auto call = cloneOp.enter(self, memory_format);
      return queued;
    }
  }
  return cloneOp.runGeneric(self, memory_format);
}

// dst.copy_(src) between views on one core (Concatenation.h: queueCopy).
DirectOp copyOp("copy_");
at::Tensor& copyQueued(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (concatenationEnabled() && queueCopy(copyOp, src, self)) {
    auto call = copyOp.enter(self, src, non_blocking);
    return self;
  }
  copyOp.runGeneric(self, src, non_blocking);
  return self;
}

DirectOp catOp("cat");
at::Tensor catQueued(const at::ITensorListRef& tensors, int64_t dim) {
  if (concatenationEnabled()) {
    if (at::Tensor queued = queueCat(catOp, tensors, dim); queued.defined()) {
      auto call = catOp.enter(std::vector<at::Tensor>(tensors.begin(), tensors.end()), dim);
      return queued;
    }
  }
  return catOp.runGeneric(std::vector<at::Tensor>(tensors.begin(), tensors.end()), dim);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  addOp.registerKernel(m, addTensor);
  addInplaceOp.registerKernel(m, addInplace);
  subOp.registerKernel(m, subTensor);
  subInplaceOp.registerKernel(m, subInplace);
  mulOp.registerKernel(m, mulTensor);
  mulInplaceOp.registerKernel(m, mulInplace);
  divOp.registerKernel(m, divTensor);
  divInplaceOp.registerKernel(m, divInplace);
  addScalarOp.registerKernel(m, addScalar);
  addScalarInplaceOp.registerKernel(m, addScalarInplace);
  subScalarOp.registerKernel(m, subScalar);
  subScalarInplaceOp.registerKernel(m, subScalarInplace);
  mulScalarOp.registerKernel(m, mulScalar);
  mulScalarInplaceOp.registerKernel(m, mulScalarInplace);
  divScalarOp.registerKernel(m, divScalar);
  divScalarInplaceOp.registerKernel(m, divScalarInplace);
  sqrtOp.registerKernel(m, sqrtQueued);
  cloneOp.registerKernel(m, cloneQueued);
  catOp.registerKernel(m, catQueued);
  copyOp.registerKernel(m, copyQueued);
  sqrtInplaceOp.registerKernel(m, sqrtInplaceQueued);
  negOp.registerKernel(m, negQueued);
  negInplaceOp.registerKernel(m, negInplaceQueued);
  absOp.registerKernel(m, absQueued);
  absInplaceOp.registerKernel(m, absInplaceQueued);
  reluOp.registerKernel(m, reluQueued);
  reluInplaceOp.registerKernel(m, reluInplaceQueued);
  reciprocalOp.registerKernel(m, reciprocalQueued);
  reciprocalInplaceOp.registerKernel(m, reciprocalInplaceQueued);
  rsqrtOp.registerKernel(m, rsqrtQueued);
  rsqrtInplaceOp.registerKernel(m, rsqrtInplaceQueued);
  expOp.registerKernel(m, expQueued);
  expInplaceOp.registerKernel(m, expInplaceQueued);
  tanhOp.registerKernel(m, tanhQueued);
  tanhInplaceOp.registerKernel(m, tanhInplaceQueued);
  sigmoidOp.registerKernel(m, sigmoidQueued);
  sigmoidInplaceOp.registerKernel(m, sigmoidInplaceQueued);
  siluOp.registerKernel(m, siluQueued);
  siluInplaceOp.registerKernel(m, siluInplaceQueued);
  powOp.registerKernel(m, powQueued);
  powInplaceOp.registerKernel(m, powInplaceQueued);
  fillOp.registerKernel(m, fillQueued);
  fillInplaceOp.registerKernel(m, fillInplaceQueued);
  zeroOp.registerKernel(m, zeroQueued);
  zeroInplaceOp.registerKernel(m, zeroInplaceQueued);
  lerpOp.registerKernel(m, lerpQueued);
  lerpInplaceOp.registerKernel(m, lerpInplaceQueued);
  addcmulOp.registerKernel(m, addcmulQueued);
  addcmulInplaceOp.registerKernel(m, addcmulInplaceQueued);
  addcdivOp.registerKernel(m, addcdivQueued);
  addcdivInplaceOp.registerKernel(m, addcdivInplaceQueued);
  threshold_backwardOp.registerKernel(m, threshold_backwardQueued);
  sigmoid_backwardOp.registerKernel(m, sigmoid_backwardQueued);
  _softmaxOp.registerKernel(m, _softmaxQueued);
  _softmax_backward_dataOp.registerKernel(m, _softmax_backward_dataQueued);
  _log_softmaxOp.registerKernel(m, _log_softmaxQueued);
  _log_softmax_backward_dataOp.registerKernel(m, _log_softmax_backward_dataQueued);
  tanh_backwardOp.registerKernel(m, tanh_backwardQueued);
  silu_backwardOp.registerKernel(m, silu_backwardQueued);
  sumDimOp.registerKernel(m, sumDim);
  meanDimOp.registerKernel(m, meanDim);
}

} // namespace torch_neuronx
