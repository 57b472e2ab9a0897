"""Every conversion between torch and jax values, in one place: dtypes
(torch <-> jax/numpy), the fp64 rule's narrowing (float64 computed as float32,
complex128 as complex64, when the device's fp64 mode emulates them), and
tensors to jax arrays and back (DLPack, without copies). The C++ side narrows
eager tensors itself (csrc/Eager.cpp).

Importing this module does not import JAX (the bridge imports it on first use);
torch_neuronx imports it only when compiling.
"""

from __future__ import annotations

import functools

import torch

from torch_neuronx import config

# ------------------------------------------------------------------ dtypes
_NARROW = {torch.float64: torch.float32, torch.complex128: torch.complex64}


def narrow_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a torch dtype is computed in under the fp64 rule."""
    return _NARROW.get(dtype, dtype)


@functools.lru_cache(maxsize=1)
def _dtype_maps() -> tuple[dict, dict]:
    """(torch -> jax, numpy -> torch), built on first use (imports JAX)."""
    import jax.numpy as jnp
    import numpy as np

    to_jax = {
        torch.float32: jnp.float32, torch.float64: jnp.float64, torch.float16: jnp.float16,
        torch.bfloat16: jnp.bfloat16, torch.int64: jnp.int64, torch.int32: jnp.int32,
        torch.int16: jnp.int16, torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
        torch.complex64: jnp.complex64, torch.complex128: jnp.complex128,
        torch.uint16: jnp.uint16, torch.uint32: jnp.uint32, torch.uint64: jnp.uint64,
        torch.float8_e4m3fn: jnp.float8_e4m3fn, torch.float8_e5m2: jnp.float8_e5m2,
        torch.float8_e8m0fnu: jnp.float8_e8m0fnu,
    }
    to_numpy = {np.dtype(v): k for k, v in to_jax.items()}
    # Two float4 values per byte: jax has no packed float4, so the graph carries
    # the bytes as uint8 (uint8 still maps back to torch.uint8); the lowerings
    # that compute on them unpack the bits (lowering/scaled_mm.py).
    to_jax[torch.float4_e2m1fn_x2] = jnp.uint8
    return to_jax, to_numpy


def jax_dtype(dtype: torch.dtype, narrow: bool = False):
    """The jax dtype of a torch dtype (float64 -> float32 when `narrow`: the fp64 rule)."""
    if narrow:
        dtype = _NARROW.get(dtype, dtype)
    try:
        return _dtype_maps()[0][dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} has no jax equivalent") from None


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a jax / numpy dtype."""
    import numpy as np

    return _dtype_maps()[1][np.dtype(dtype)]


def narrow_array(array):
    """A jax array under the fp64 rule: float64 enters as float32, complex128 as
    complex64.

    None passes through: AOTAutograd's effect tokens (ops with side effects,
    such as linalg's error checks) arrive as None inputs."""
    import jax.numpy as jnp

    if array is None:
        return None
    if array.dtype == jnp.float64:
        return array.astype(jnp.float32)
    if array.dtype == jnp.complex128:
        return array.astype(jnp.complex64)
    return array


# ------------------------------------------------------- tensors (DLPack)
def host_input(tensor: torch.Tensor, index: int) -> torch.Tensor:
    from torch_neuronx import _C

    if tensor.device.type == "neuron":
        tensor = _C._host_alias(tensor)
    elif tensor.device.type == "cpu":
        if config.dynamo_disable_cpu_autocopy():
            raise RuntimeError(
                f"Input tensor at index {index} is on cpu device, but the compiled graph runs on "
                "neuron. Move it with .to('neuron'), or unset TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY "
                "to let torch_neuronx copy CPU inputs to the device."
            )
    else:
        raise RuntimeError(f"Input tensor at index {index} is on {tensor.device}; expected neuron")
    if tensor.requires_grad:
        tensor = tensor.detach()
    # XLA takes dense, 64-byte aligned buffers without a copy; anything else is
    # copied once here.
    if not tensor.is_contiguous() or tensor.data_ptr() % 64:
        tensor = tensor.contiguous() if tensor.data_ptr() % 64 == 0 else tensor.clone()
    return tensor


_KDL_CPU = 1  # DLPack's device type of host memory


@functools.lru_cache(maxsize=1)
def _jaxlib_dlpack():
    """The jaxlib calls under jax.dlpack, bound to the CPU device: (import, export).

    jax.dlpack.from_dlpack spends ~250 us per array on Python checks around a
    ~15 us import, and torch.from_dlpack(jax_array) ~20 us around a ~2 us export:
    too much for graphs called every step with dozens of inputs and outputs.
    The direct calls move the same buffers without copies (import with
    copy=False: an unaligned buffer raises instead of being copied silently;
    host_input aligns first). None when this jaxlib lacks them; then the
    public jax.dlpack / torch.from_dlpack functions are used."""
    try:
        from jax._src import xla_bridge
        from jax._src.lib import _jax, jaxlib_extension_version
    except ImportError:
        return None
    if jaxlib_extension_version < 467 or not hasattr(_jax, "buffer_to_dlpack_managed_tensor"):
        return None
    device = xla_bridge.get_backend("cpu").device_from_local_hardware_id(0)
    to_dlpack, from_dlpack = torch.utils.dlpack.to_dlpack, torch._C._from_dlpack
    importer, exporter = _jax.dlpack_managed_tensor_to_buffer, _jax.buffer_to_dlpack_managed_tensor

    def import_array(tensor: torch.Tensor):
        return importer(to_dlpack(tensor), device, None, False, _KDL_CPU)

    def export_array(value) -> torch.Tensor:
        return from_dlpack(exporter(value, stream=None))

    return import_array, export_array


def as_jax(tensor: torch.Tensor):
    """A jax array over the tensor's bytes (zero-copy for 64-byte aligned dense tensors)."""
    if tensor.dtype == torch.float4_e2m1fn_x2:  # DLPack describes it as 2 lanes, which XLA rejects
        tensor = tensor.view(torch.uint8)
    bridge = _jaxlib_dlpack()
    if bridge is not None and tensor.dtype != torch.bool:
        return bridge[0](tensor)
    import jax.dlpack

    return jax.dlpack.from_dlpack(tensor)


# jax arrays over neuron memory, keyed by the bytes they address. Importing a
# buffer costs ~13 us; parameters and optimizer state come back at the same
# address every step. An entry holds no reference to the memory (host views do
# not own it), and it is only used while a live tensor has exactly that
# address, shape, strides and dtype, so it always reads that tensor's bytes.
_IMPORTED: dict[tuple, object] = {}
_IMPORTED_MAX = 4096


def jax_inputs(values: list) -> list:
    """The jax arrays a compiled graph reads for its inputs (values that are
    not tensors pass through). The ops queued on the device run first
    (Adaptive Eager Execution): a cached array reads the bytes without the
    host alias that would have run them."""
    from torch_neuronx import _C

    _C._run_queued()
    return [_jax_input(value, index) if isinstance(value, torch.Tensor) else value
            for index, value in enumerate(values)]


def _jax_input(tensor: torch.Tensor, index: int):
    if tensor.device.type == "neuron" and tensor.dtype != torch.bool and tensor.is_contiguous():
        address = tensor.data_ptr()
        if address % 64 == 0:
            key = (address, tensor.shape, tensor.dtype)  # contiguous: the shape gives the strides
            array = _IMPORTED.get(key)
            if array is None:
                if len(_IMPORTED) >= _IMPORTED_MAX:
                    _IMPORTED.clear()
                array = _IMPORTED[key] = as_jax(host_input(tensor, index))
            return array
    return as_jax(host_input(tensor, index))


def from_jax_all(values, device: torch.device, dtypes) -> list:
    """Neuron tensors that take over the jax arrays' buffers (no copy); None
    stays None. `dtypes`: the torch dtype of each result (None: the array's)."""
    from torch_neuronx import _C

    bridge = _jaxlib_dlpack()
    export = bridge[1] if bridge is not None else torch.from_dlpack
    index = device.index or 0
    tensors = []
    for value, dtype in zip(values, dtypes):
        tensor = None if value is None else _C._adopt_external(export(value), index)
        if tensor is not None and dtype is not None and tensor.dtype != dtype:
            # float4: the graph's uint8 bytes (as_jax); float64: computed in float32 (the fp64 rule)
            tensor = tensor.view(dtype) if dtype == torch.float4_e2m1fn_x2 else tensor.to(dtype)
        tensors.append(tensor)
    return tensors
