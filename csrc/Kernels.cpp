// Kernels the device implements directly instead of through the eager alias
// path: allocation, copies between host and device, views and storage
// plumbing. These are the ops every other op stands on, and the hottest.
#include "Allocator.h"
#include "Concatenation.h"
#include "DeviceLimits.h"
#include "Eager.h"
#include "Runtime.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

constexpr auto kNeuronKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

// The direct kernels that count their calls in get_executed_ops() (views and
// other metadata-only kernels do not): each op's schema name, once.
DirectOp kEmpty("empty.memory_format");
DirectOp kEmptyStrided("empty_strided");
DirectOp kCopyFrom("_copy_from");
DirectOp kCopyFromAndResize("_copy_from_and_resize");
DirectOp kResize("resize_");
DirectOp kLocalScalarDense("_local_scalar_dense");
DirectOp kSetStorage("set_.source_Storage_storage_offset");
DirectOp kSetStorageWhole("set_.source_Storage");
DirectOp kSetTensor("set_.source_Tensor");
DirectOp kSetEmpty("set_");
DirectOp kConvolution("convolution_overrideable");
DirectOp kConvolutionBackward("convolution_backward_overrideable");
DirectOp kNewEmpty("new_empty");
DirectOp kHasCompatibleShallowCopyType("_has_compatible_shallow_copy_type");

c10::DeviceIndex targetIndex(std::optional<c10::Device> device) {
  if (device.has_value() && device->type() == kNeuron && device->has_index()) {
    return device->index();
  }
  return currentDevice();
}

// A dense tensor of the device allocator's memory on neuron:`index`.
at::Tensor allocate(
    c10::DeviceIndex index, c10::IntArrayRef size, c10::ScalarType dtype,
    std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(c10::Device(kNeuron, index));
  return at::detail::empty_generic(size, &neuronAllocator(), kNeuronKeys, dtype, memory_format);
}

at::Tensor empty(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  auto call = kEmpty.enter(size, dtype, layout, device, pin_memory, memory_format);
  TORCH_CHECK(
      !layout.has_value() || *layout == c10::Layout::Strided,
      "The neuron device supports only strided (dense) tensors, got layout ", *layout);
  return allocate(targetIndex(device), size, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor emptyStrided(
    c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  auto call = kEmptyStrided.enter(size, stride, dtype, layout, device, pin_memory);
  TORCH_CHECK(
      !layout.has_value() || *layout == c10::Layout::Strided,
      "The neuron device supports only strided (dense) tensors, got layout ", *layout);
  c10::DeviceGuard guard(c10::Device(kNeuron, targetIndex(device)));
  return at::detail::empty_strided_generic(
      size, stride, &neuronAllocator(), kNeuronKeys, c10::dtype_or_default(dtype));
}

// One allocation with self's options, as TorchNeuron registers it (PyTorch's
// composite would reach empty the same way, as a call of its own). A device
// other than neuron, or a sparse layout, in the arguments goes to at::empty.
at::Tensor newEmpty(
    const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  auto call = kNewEmpty.enter(self, size, dtype, layout, device, pin_memory);
  auto options = self.options().merge_in(
      c10::TensorOptions().dtype(dtype).layout(layout).device(device).pinned_memory(pin_memory));
  if (options.device().type() != kNeuron || options.layout() != c10::Layout::Strided) {
    return at::empty(size, options);  // another device, or a sparse layout (its own key)
  }
  return allocate(targetIndex(options.device()), size, options.dtype().toScalarType(), std::nullopt);
}

// Host <-> device and device <-> device copies: both sides are host memory,
// so a copy is PyTorch's CPU copy kernel over the two aliases.
at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  auto call = kCopyFrom.enter(self, dst, non_blocking);
  lazyInit();
  hostOperand(dst).copy_(hostOperand(self));
  return dst;
}

// PyTorch's CPU fallback writes its results back through this op. As on
// Trainium (and in OpenReg): from the host only, into a tensor of the same
// size or an empty one.
at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  auto call = kCopyFromAndResize.enter(self, dst);
  TORCH_CHECK(
      self.is_cpu() && dst.device().type() == kNeuron,
      "_copy_from_and_resize now only support copy from cpu tensor to neuron tensor, but got src "
      "tensor device is ", self.device(), " and dst device is ", dst.device(),
      " (use dst.copy_(src) to copy between other devices)");
  if (dst.numel() == 0) {
    dst.resize_(self.sizes());
  }
  TORCH_CHECK(
      dst.sizes().equals(self.sizes()),
      "_copy_from_and_resize now only support copy with same size, or dst.numel() == 0! Got src ",
      self.sizes(), " and dst ", dst.sizes(), " (pass an out= tensor of the result's shape, or an "
      "empty one)");
  return copyFrom(self, dst, false);
}

const at::Tensor& resize(
    const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> memory_format) {
  auto call = kResize.enter(self, size, memory_format);
  c10::DeviceGuard guard(self.device());
  auto* impl = self.unsafeGetTensorImpl();
  at::native::resize_impl_cpu_(impl, size, std::nullopt);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Scalar localScalarDense(const at::Tensor& self) {
  auto call = kLocalScalarDense.enter(self);
  return at::_local_scalar_dense(hostAlias(self));
}

// set_ keeps a tensor on its device: its new memory must be neuron memory too.
void checkNeuronSource(const char* what, c10::Device device) {
  TORCH_CHECK(
      device.type() == kNeuron, "set_: expected neuron ", what, ", but got ", what,
      " on device ", device, " (move it with .to('neuron') first)");
}

at::Tensor& setStorage(
    at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
    c10::IntArrayRef stride) {
  auto call = kSetStorage.enter(self, source, offset, size, stride);
  checkNeuronSource("storage", source.device());
  return at::native::set_storage_cpu_(self, source, offset, size, stride);
}

at::Tensor& setStorageWhole(at::Tensor& self, c10::Storage source) {
  auto call = kSetStorageWhole.enter(self, source);
  checkNeuronSource("storage", source.device());
  const auto itemsize = self.dtype().itemsize();
  const int64_t numel = static_cast<int64_t>(source.nbytes() / itemsize);
  return at::native::set_storage_cpu_(self, std::move(source), 0, {numel}, {});
}

at::Tensor& setTensor(at::Tensor& self, const at::Tensor& source) {
  auto call = kSetTensor.enter(self, source);
  checkNeuronSource("source tensor", source.device());
  return at::native::set_tensor_(self, source);
}

at::Tensor& setEmpty(at::Tensor& self) {
  auto call = kSetEmpty.enter(self);
  c10::Storage storage(
      c10::Storage::use_byte_size_t(), 0, &neuronAllocator(), /*resizable=*/true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

void recordStream(at::Tensor& self, c10::Stream stream) {
  neuronAllocator().recordStream(self.storage().data_ptr(), stream);
}

// Convolution reaches backends through these two "overrideable" entry points.
at::Tensor convolution(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups) {
  auto call = kConvolution.enter(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
  runQueuedEndingWith(kConvolution.handle());
  const auto device = input.device().index();
  CaptureScope capture(device);
  std::optional<at::Tensor> host_bias;
  if (bias.has_value() && bias->defined()) {
    host_bias = hostOperand(*bias);
  }
  auto out = at::convolution(
      hostOperand(input), hostOperand(weight), host_bias, stride, padding, dilation, transposed,
      output_padding, groups);
  return adoptKernelResult(out, device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolutionBackward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  auto call = kConvolutionBackward.enter(grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask);
  const auto device = input.device().index();
  CaptureScope capture(device);
  const int64_t bias_size = transposed ? weight.size(1) * groups : weight.size(0);
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward(
      hostOperand(grad_output), hostOperand(input), hostOperand(weight),
      std::vector<int64_t>{bias_size}, stride, padding, dilation, transposed, output_padding,
      groups, output_mask);
  // A gradient output_mask leaves out is undefined, as on CUDA and TorchNeuron
  // (some CPU paths compute it anyway).
  auto adopt = [device, &output_mask](const at::Tensor& t, size_t i) {
    return t.defined() && output_mask[i] ? adoptKernelResult(t, device) : at::Tensor();
  };
  return {adopt(grad_input, 0), adopt(grad_weight, 1), adopt(grad_bias, 2)};
}

// scaled_dot_product_attention asks each device which fused kernel to use
// (the dispatch stub, also what Dynamo's fake tensors ask while tracing, and
// the aten::_fused_sdp_choice op). TorchNeuron's answer: its overrideable
// kernel, _scaled_dot_product_fused_attention_overrideable (and its backward),
// whenever query, key and value are 4-D neuron tensors, the math composite
// otherwise. Like TorchNeuron it does not read which backends sdpa_kernel()
// enabled: sdpa_kernel(SDPBackend.OVERRIDEABLE) works, and so does MATH.
// Metadata only, so cheap on every SDPA call. The kernels themselves:
// torch_neuronx/ops/attention.py.
constexpr int64_t kSdpMath = static_cast<int64_t>(at::SDPBackend::math);
constexpr int64_t kSdpOverrideable = static_cast<int64_t>(at::SDPBackend::overrideable);

int64_t sdpaChoice(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& /*attn_mask*/, double /*dropout_p*/, bool /*is_causal*/,
    std::optional<double> /*scale*/, bool /*enable_gqa*/) {
  if (query.device().type() != kNeuron) {
    return kSdpMath;
  }
  const bool four_d = query.dim() == 4 && key.dim() == 4 && value.dim() == 4;
  return four_d ? kSdpOverrideable : kSdpMath;
}

// `module.to("neuron")` replaces each parameter's data in place (param.data =
// moved) only when this says the two tensors' implementations are
// interchangeable, as CPU and CUDA ones are. Without it the Parameter objects
// are replaced, and an optimizer built before .to() keeps the old ones.
bool hasCompatibleShallowCopyType(const at::Tensor& self, const at::Tensor& from) {
  auto call = kHasCompatibleShallowCopyType.enter(self, from);
  auto plain = [](const at::Tensor& t) {
    return t.layout() == c10::Layout::Strided &&
           (t.device().is_cpu() || t.device().type() == kNeuron);
  };
  return plain(self) && plain(from);
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Counted in get_executed_ops().
  kEmpty.registerKernel(m, empty);
  kEmptyStrided.registerKernel(m, emptyStrided);
  kCopyFrom.registerKernel(m, copyFrom);
  kCopyFromAndResize.registerKernel(m, copyFromAndResize);
  kResize.registerKernel(m, resize);
  kLocalScalarDense.registerKernel(m, localScalarDense);
  kSetStorage.registerKernel(m, setStorage);
  kSetStorageWhole.registerKernel(m, setStorageWhole);
  kSetTensor.registerKernel(m, setTensor);
  kSetEmpty.registerKernel(m, setEmpty);
  kConvolution.registerKernel(m, convolution);
  kConvolutionBackward.registerKernel(m, convolutionBackward);
  kNewEmpty.registerKernel(m, newEmpty);
  // A query, counted because TorchNeuron runs it on the device (module.to()).
  kHasCompatibleShallowCopyType.registerKernel(m, hasCompatibleShallowCopyType);
  // Not counted: metadata-only kernels.
  m.impl("record_stream", recordStream);
  m.impl("view", at::native::view);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("_fused_sdp_choice", sdpaChoice);  // the same answer as the stub below
}

// Conjugate and negative views are materialized by the copy itself.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}

} // namespace torch_neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuronx::sdpaChoice)
} // namespace at::native
