// Boolean-mask indexing (x[mask]) as Trainium runs it: nonzero(mask) on the
// device first, whose result size the host must read before anything else can
// be allocated (a host sync: the audit reports it, as for any nonzero call),
// then index with the integer indices it gives. PyTorch's CPU kernel does both
// inside one index call, so the alias kernel alone would hide the host read and
// count one kernel where the device runs two. Calls without a boolean (or
// uint8) index take the alias kernel unchanged. A mask that selects nothing
// leaves nothing to gather: as on Trainium, only nonzero runs, and the empty
// result is an allocation of the shape PyTorch's own shape rules give (a meta
// run; indices it cannot take go on to the gather, which raises PyTorch's own
// error). The registry states which
// overload this file serves (registry.MASK_INDEX_OVERLOADS); registering the
// native set keeps this kernel and records the op's flags for the alias kernel.
#include "Eager.h"

#include <ATen/ATen.h>
#include <ATen/native/IndexingUtils.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

bool hasMask(const c10::List<std::optional<at::Tensor>>& indices) {
  for (const std::optional<at::Tensor> index : indices) {
    if (index.has_value() && index->defined() &&
        (index->scalar_type() == at::kBool || index->scalar_type() == at::kByte)) {
      return true;
    }
  }
  return false;
}

bool selectsNothing(const c10::List<std::optional<at::Tensor>>& indices) {
  for (const std::optional<at::Tensor> index : indices) {
    if (index.has_value() && index->numel() == 0) {
      return true;
    }
  }
  return false;
}

at::Tensor onMeta(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// The result of an index call whose integer indices select no element.
at::Tensor emptyResult(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  c10::List<std::optional<at::Tensor>> meta;
  for (const std::optional<at::Tensor> index : indices) {
    meta.push_back(index.has_value() ? std::optional<at::Tensor>(onMeta(*index)) : std::nullopt);
  }
  const at::Tensor shape = at::index(onMeta(self), meta);
  return at::empty(shape.sizes(), self.options());
}

// aten::index.Tensor(Tensor self, Tensor?[] indices): the masks become the
// integer indices of their nonzero entries (PyTorch's own expansion, with its
// shape checks and messages; index.nonzero() dispatches to the mask's device),
// then the alias kernel runs the gather.
void indexTensor(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  c10::IValue& indices_value = stack->back();
  const auto indices = indices_value.toOptionalTensorList();
  if (hasMask(indices)) {
    const at::Tensor& self = (*stack)[stack->size() - 2].toTensor();
    c10::List<std::optional<at::Tensor>> integer;
    for (at::Tensor& index : at::native::expandTensors(self, indices)) {
      integer.push_back(index.defined() ? std::optional<at::Tensor>(std::move(index)) : std::nullopt);
    }
    if (selectsNothing(integer)) {
      std::optional<at::Tensor> empty;
      try {
        empty = emptyResult(self, integer);
      } catch (const std::exception&) {  // c10::Error, or a Python meta kernel's error
        // Indices that cannot be indexed with: the gather below raises PyTorch's own error.
      }
      if (empty.has_value()) {
        torch::jit::drop(*stack, 2);
        torch::jit::push(*stack, std::move(*empty));
        return;
      }
    }
    indices_value = c10::IValue(std::move(integer));
  }
  runNative(op, stack);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&indexTensor>());
}

} // namespace torch_neuronx
