// The foreach ops that optimizers call by default on the device (torch.optim
// picks foreach=True for a PrivateUse1 device, as for CUDA): served here so
// that concatenation can queue them (Concatenation.h), one queued op per
// element of the list, in order, all of the call or none of it.
//
// PyTorch's CPU kernels for these ops are its "slow path": the single-tensor
// op on each element in turn (self[i].mul_(scalar), self[i].addcdiv_(t1[i],
// t2[i], scalars[i]), ...). Each element is queued as that single-tensor op
// would be (the same checks and float32 formulas: Concatenation.h), so the
// results are those of the unqueued call. Any call with an element that does
// not qualify (another dtype or device, a strided or large tensor, a complex
// or out-of-range number, lists of unequal lengths) runs whole through the
// generic alias path, which counts and records it and raises PyTorch's errors.
#include "Concatenation.h"
#include "Eager.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace torch_neuronx {
namespace {

using Scalars = at::ArrayRef<at::Scalar>;

// Runs a foreach call: queued where concatenation is on and the operands
// `make()` builds (nullopt: a number the queue cannot read) qualify, else
// through the generic path. `args` are the call's arguments as declared.
template <class Make, class... Args>
void runInPlace(const DirectOp& op, QueuedOp queued, Make make, const Args&... args) {
  if (concatenationEnabled()) {
    std::optional<ForeachOperands> operands = make();
    if (operands && queueForeachInplace(queued, op, *operands)) {
      auto call = op.enter(args...);
      return;
    }
  }
  op.runGenericStack(args...);
}

template <class Make, class... Args>
std::vector<at::Tensor> runOutOfPlace(const DirectOp& op, QueuedOp queued, Make make, const Args&... args) {
  if (concatenationEnabled()) {
    std::optional<ForeachOperands> operands = make();
    if (operands) {
      std::vector<at::Tensor> results = queueForeach(queued, op, *operands);
      if (!results.empty()) {
        auto call = op.enter(args...);
        return results;
      }
    }
  }
  return op.runGenericStack(args...).back().toTensorVector();
}

// `scalars` read by `read` (queueableNumber, queueableScalar) into `out`;
// false where one cannot be read.
template <class T, class Read>
bool readEach(Scalars scalars, Read read, std::vector<T>& out) {
  out.clear();
  out.reserve(scalars.size());
  for (const at::Scalar& s : scalars) {
    const auto value = read(s);
    if (!value) {
      return false;
    }
    out.push_back(*value);
  }
  return true;
}

// self[i] with the number scalars[i] (or `scalar` for every element).
std::optional<ForeachOperands> withNumbers(at::TensorList self, Scalars scalars) {
  ForeachOperands operands;
  operands.self = self;
  if (!readEach(scalars, queueableNumber, operands.scalars)) {
    return std::nullopt;
  }
  return operands;
}

std::optional<ForeachOperands> withNumber(at::TensorList self, const at::Scalar& scalar) {
  auto operands = withNumbers(self, Scalars(scalar));
  if (operands) {
    operands->scalars.resize(self.size(), operands->scalars.front());
  }
  return operands;
}

// self[i] with b[i] and c[i] (empty lists where the op has none), and the
// op's alpha, weight or value: values[i], or values[0] for every element.
std::optional<ForeachOperands> withTensors(at::TensorList self, at::TensorList b, at::TensorList c, Scalars values) {
  ForeachOperands operands;
  operands.self = self;
  operands.b = b;
  operands.c = c;
  if (!readEach(values, queueableScalar, operands.values)) {
    return std::nullopt;
  }
  return operands;
}

// self[i] with the one tensor `other` (the .Tensor overloads).
std::optional<ForeachOperands> withTensor(at::TensorList self, const at::Tensor& other, const at::Scalar& alpha) {
  auto operands = withTensors(self, {}, {}, Scalars(alpha));
  if (operands) {
    operands->other = &other;
  }
  return operands;
}

// TorchNeuron's add, sub, mul and div foreach kernels check their lists before
// anything else, and raise ValueError where PyTorch's raise RuntimeError: an
// empty list, and a list of numbers of another length (its tests look for
// these; lists of tensors of unequal lengths keep PyTorch's RuntimeError).
void checkTensorList(at::TensorList self) {
  TORCH_CHECK_VALUE(!self.empty(), "Tensor list must have at least one tensor");
}

void checkScalarList(at::TensorList self, Scalars scalars) {
  checkTensorList(self);
  TORCH_CHECK_VALUE(self.size() == scalars.size(), "Tensor list must have same number of elements as scalar list");
}

const at::Scalar kOne(1.0);
const at::Scalar kZero(0.0);  // the unary ops' unused value; the fill value of zero_

// add, sub, mul and div: the Scalar, ScalarList and List overloads, in place
// and out of place; NAME##_Tensor / NAME##Tensor below where PyTorch has them.
// ALPHA_PARAM / ALPHA: the List overload's alpha (add, sub) or none (1).
#define NEURON_FOREACH_BINARY(NAME, OP, ALPHA_PARAM, ALPHA_ARG, ALPHA)                                         \
  DirectOp NAME##ScalarOp("_foreach_" #NAME ".Scalar");                                                        \
  DirectOp NAME##ScalarInplaceOp("_foreach_" #NAME "_.Scalar");                                                \
  DirectOp NAME##ScalarListOp("_foreach_" #NAME ".ScalarList");                                                \
  DirectOp NAME##ScalarListInplaceOp("_foreach_" #NAME "_.ScalarList");                                        \
  DirectOp NAME##ListOp("_foreach_" #NAME ".List");                                                            \
  DirectOp NAME##ListInplaceOp("_foreach_" #NAME "_.List");                                                    \
  std::vector<at::Tensor> NAME##Scalar(at::TensorList self, const at::Scalar& scalar) {                        \
    checkTensorList(self);                                                                                   \
    return runOutOfPlace(NAME##ScalarOp, QueuedOp::OP, [&] { return withNumber(self, scalar); }, self, scalar); \
  }                                                                                                            \
  void NAME##ScalarInplace(at::TensorList self, const at::Scalar& scalar) {                                    \
    checkTensorList(self);                                                                                   \
    runInPlace(NAME##ScalarInplaceOp, QueuedOp::OP, [&] { return withNumber(self, scalar); }, self, scalar);   \
  }                                                                                                            \
  std::vector<at::Tensor> NAME##ScalarList(at::TensorList self, Scalars scalars) {                             \
    checkScalarList(self, scalars);                                                                          \
    return runOutOfPlace(NAME##ScalarListOp, QueuedOp::OP, [&] { return withNumbers(self, scalars); }, self,   \
                         scalars);                                                                             \
  }                                                                                                            \
  void NAME##ScalarListInplace(at::TensorList self, Scalars scalars) {                                         \
    checkScalarList(self, scalars);                                                                          \
    runInPlace(NAME##ScalarListInplaceOp, QueuedOp::OP, [&] { return withNumbers(self, scalars); }, self,      \
               scalars);                                                                                       \
  }                                                                                                            \
  std::vector<at::Tensor> NAME##List(at::TensorList self, at::TensorList other ALPHA_PARAM) {                  \
    checkTensorList(self);                                                                                   \
    checkTensorList(other);                                                                                  \
    return runOutOfPlace(NAME##ListOp, QueuedOp::OP,                                                           \
                         [&] { return withTensors(self, other, {}, Scalars(ALPHA)); }, self, other ALPHA_ARG);  \
  }                                                                                                            \
  void NAME##ListInplace(at::TensorList self, at::TensorList other ALPHA_PARAM) {                              \
    checkTensorList(self);                                                                                   \
    checkTensorList(other);                                                                                  \
    runInPlace(NAME##ListInplaceOp, QueuedOp::OP, [&] { return withTensors(self, other, {}, Scalars(ALPHA)); }, \
               self, other ALPHA_ARG);                                                                         \
  }

#define NEURON_ALPHA_PARAM , const at::Scalar& alpha
#define NEURON_ALPHA_ARG , alpha
#define NEURON_NOTHING

NEURON_FOREACH_BINARY(add, Add, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, alpha)
NEURON_FOREACH_BINARY(sub, Sub, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, alpha)
NEURON_FOREACH_BINARY(mul, Mul, NEURON_NOTHING, NEURON_NOTHING, kOne)
NEURON_FOREACH_BINARY(div, Div, NEURON_NOTHING, NEURON_NOTHING, kOne)

// One tensor for every element (add with alpha; mul, div): clip_grad_norm_'s
// `_foreach_mul_(grads, clip_coef)` with a 0-dim device tensor.
#define NEURON_FOREACH_BINARY_TENSOR(NAME, OP, ALPHA_PARAM, ALPHA_ARG, ALPHA)                                    \
  DirectOp NAME##TensorOp("_foreach_" #NAME ".Tensor");                                                         \
  DirectOp NAME##TensorInplaceOp("_foreach_" #NAME "_.Tensor");                                                 \
  std::vector<at::Tensor> NAME##Tensor(at::TensorList self, const at::Tensor& other ALPHA_PARAM) {              \
    checkTensorList(self);                                                                                    \
    return runOutOfPlace(NAME##TensorOp, QueuedOp::OP, [&] { return withTensor(self, other, ALPHA); }, self,     \
                         other ALPHA_ARG);                                                                      \
  }                                                                                                             \
  void NAME##TensorInplace(at::TensorList self, const at::Tensor& other ALPHA_PARAM) {                          \
    checkTensorList(self);                                                                                    \
    runInPlace(NAME##TensorInplaceOp, QueuedOp::OP, [&] { return withTensor(self, other, ALPHA); }, self,        \
               other ALPHA_ARG);                                                                                \
  }

NEURON_FOREACH_BINARY_TENSOR(add, Add, NEURON_ALPHA_PARAM, NEURON_ALPHA_ARG, alpha)
NEURON_FOREACH_BINARY_TENSOR(mul, Mul, NEURON_NOTHING, NEURON_NOTHING, kOne)
NEURON_FOREACH_BINARY_TENSOR(div, Div, NEURON_NOTHING, NEURON_NOTHING, kOne)

// Unary ops, in place and out of place.
#define NEURON_FOREACH_UNARY(NAME, OP)                                                                          \
  DirectOp NAME##Op("_foreach_" #NAME);                                                                        \
  DirectOp NAME##InplaceOp("_foreach_" #NAME "_");                                                             \
  std::vector<at::Tensor> NAME##Unary(at::TensorList self) {                                                   \
    return runOutOfPlace(NAME##Op, QueuedOp::OP, [&] { return withTensors(self, {}, {}, Scalars(kZero)); }, self); \
  }                                                                                                            \
  void NAME##UnaryInplace(at::TensorList self) {                                                               \
    runInPlace(NAME##InplaceOp, QueuedOp::OP, [&] { return withTensors(self, {}, {}, Scalars(kZero)); }, self);  \
  }

NEURON_FOREACH_UNARY(sqrt, Sqrt)
NEURON_FOREACH_UNARY(neg, Neg)
NEURON_FOREACH_UNARY(abs, Abs)
NEURON_FOREACH_UNARY(reciprocal, Reciprocal)
NEURON_FOREACH_UNARY(exp, Exp)
NEURON_FOREACH_UNARY(sigmoid, Sigmoid)
NEURON_FOREACH_UNARY(tanh, Tanh)

// zero_grad(set_to_none=False) with foreach: the fill of 0.
DirectOp zeroInplaceOp("_foreach_zero_");
void zeroInplace(at::TensorList self) {
  runInPlace(zeroInplaceOp, QueuedOp::Fill, [&] { return withTensors(self, {}, {}, Scalars(kZero)); }, self);
}

// lerp with a number as weight (Adam's and AdamW's first moment).
DirectOp lerpScalarOp("_foreach_lerp.Scalar");
DirectOp lerpScalarInplaceOp("_foreach_lerp_.Scalar");
std::vector<at::Tensor> lerpScalar(at::TensorList self, at::TensorList end, const at::Scalar& weight) {
  return runOutOfPlace(lerpScalarOp, QueuedOp::Lerp, [&] { return withTensors(self, end, {}, Scalars(weight)); },
                       self, end, weight);
}
void lerpScalarInplace(at::TensorList self, at::TensorList end, const at::Scalar& weight) {
  runInPlace(lerpScalarInplaceOp, QueuedOp::Lerp, [&] { return withTensors(self, end, {}, Scalars(weight)); },
             self, end, weight);
}

// addcmul and addcdiv with one value or a value per element (Adam's second
// moment and its update).
#define NEURON_FOREACH_POINTWISE(NAME, OP)                                                                       \
  DirectOp NAME##ScalarOp("_foreach_" #NAME ".Scalar");                                                         \
  DirectOp NAME##ScalarInplaceOp("_foreach_" #NAME "_.Scalar");                                                 \
  DirectOp NAME##ScalarListOp("_foreach_" #NAME ".ScalarList");                                                 \
  DirectOp NAME##ScalarListInplaceOp("_foreach_" #NAME "_.ScalarList");                                         \
  std::vector<at::Tensor> NAME##Scalar(at::TensorList self, at::TensorList t1, at::TensorList t2,               \
                                       const at::Scalar& value) {                                               \
    return runOutOfPlace(NAME##ScalarOp, QueuedOp::OP, [&] { return withTensors(self, t1, t2, Scalars(value)); }, \
                         self, t1, t2, value);                                                                  \
  }                                                                                                             \
  void NAME##ScalarInplace(at::TensorList self, at::TensorList t1, at::TensorList t2, const at::Scalar& value) { \
    runInPlace(NAME##ScalarInplaceOp, QueuedOp::OP, [&] { return withTensors(self, t1, t2, Scalars(value)); },   \
               self, t1, t2, value);                                                                            \
  }                                                                                                             \
  std::vector<at::Tensor> NAME##ScalarList(at::TensorList self, at::TensorList t1, at::TensorList t2,           \
                                           Scalars values) {                                                    \
    return runOutOfPlace(NAME##ScalarListOp, QueuedOp::OP, [&] { return withTensors(self, t1, t2, values); },    \
                         self, t1, t2, values);                                                                 \
  }                                                                                                             \
  void NAME##ScalarListInplace(at::TensorList self, at::TensorList t1, at::TensorList t2, Scalars values) {     \
    runInPlace(NAME##ScalarListInplaceOp, QueuedOp::OP, [&] { return withTensors(self, t1, t2, values); }, self, \
               t1, t2, values);                                                                                 \
  }

NEURON_FOREACH_POINTWISE(addcmul, Addcmul)
NEURON_FOREACH_POINTWISE(addcdiv, Addcdiv)

} // namespace

#define NEURON_REGISTER_FOREACH_BINARY(NAME)                           \
  NAME##ScalarOp.registerKernel(m, NAME##Scalar);                      \
  NAME##ScalarInplaceOp.registerKernel(m, NAME##ScalarInplace);        \
  NAME##ScalarListOp.registerKernel(m, NAME##ScalarList);              \
  NAME##ScalarListInplaceOp.registerKernel(m, NAME##ScalarListInplace); \
  NAME##ListOp.registerKernel(m, NAME##List);                          \
  NAME##ListInplaceOp.registerKernel(m, NAME##ListInplace);
#define NEURON_REGISTER_FOREACH_TENSOR(NAME)        \
  NAME##TensorOp.registerKernel(m, NAME##Tensor); \
  NAME##TensorInplaceOp.registerKernel(m, NAME##TensorInplace);
#define NEURON_REGISTER_FOREACH_UNARY(NAME)     \
  NAME##Op.registerKernel(m, NAME##Unary); \
  NAME##InplaceOp.registerKernel(m, NAME##UnaryInplace);
#define NEURON_REGISTER_FOREACH_POINTWISE(NAME)                        \
  NAME##ScalarOp.registerKernel(m, NAME##Scalar);                      \
  NAME##ScalarInplaceOp.registerKernel(m, NAME##ScalarInplace);        \
  NAME##ScalarListOp.registerKernel(m, NAME##ScalarList);              \
  NAME##ScalarListInplaceOp.registerKernel(m, NAME##ScalarListInplace);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  NEURON_REGISTER_FOREACH_BINARY(add)
  NEURON_REGISTER_FOREACH_BINARY(sub)
  NEURON_REGISTER_FOREACH_BINARY(mul)
  NEURON_REGISTER_FOREACH_BINARY(div)
  NEURON_REGISTER_FOREACH_TENSOR(add)
  NEURON_REGISTER_FOREACH_TENSOR(mul)
  NEURON_REGISTER_FOREACH_TENSOR(div)
  NEURON_REGISTER_FOREACH_UNARY(sqrt)
  NEURON_REGISTER_FOREACH_UNARY(neg)
  NEURON_REGISTER_FOREACH_UNARY(abs)
  NEURON_REGISTER_FOREACH_UNARY(reciprocal)
  NEURON_REGISTER_FOREACH_UNARY(exp)
  NEURON_REGISTER_FOREACH_UNARY(sigmoid)
  NEURON_REGISTER_FOREACH_UNARY(tanh)
  zeroInplaceOp.registerKernel(m, zeroInplace);
  lerpScalarOp.registerKernel(m, lerpScalar);
  lerpScalarInplaceOp.registerKernel(m, lerpScalarInplace);
  NEURON_REGISTER_FOREACH_POINTWISE(addcmul)
  NEURON_REGISTER_FOREACH_POINTWISE(addcdiv)
}

} // namespace torch_neuronx
