"""The op taxonomy of the neuron device: the native op set (the single list of
ATen ops the device implements itself; everything else runs through the CPU
fallback: copied to the host and back, warned about, recorded), which kernel
serves each native op, and every other class of ops the package tests a name
against (host syncs, copies, views, data-dependent ops, ...). No other module
lists ops: they import these sets (tests/test_registry.py checks it).

Naming: entries are base names, the ATen overload packet's name without the
``aten::`` namespace and without the in-place ``_``; each stands for every
overload of the op, its in-place variant (``name_``) and its ``out=`` forms.
base_name() maps any spelling ("aten::add_.Tensor") onto it. The one set that
names single overloads (FAST_PATH_OVERLOADS) spells them "name.overload", as
the dispatcher does without its namespace. The eager runtime runs a
native op's CPU kernel directly on device memory. Ops listed here must have a
CPU kernel of their own (not a CompositeImplicitAutograd decomposition): the
registry test checks it.

Invariant (issue #3): native <=> lowered and tested. Every op of NATIVE_OPS,
except DIRECT_KERNELS (allocation, views, copies: the compiler never sees
them as such) and DATA_DEPENDENT_SHAPE (below), compiles under
torch.compile(backend="neuron"): it has a lowering in torch_neuronx/lowering/
checked against PyTorch's CPU kernel (tests/test_lowering.py; random ops by
their distributions), or core_aten_decompositions() rewrites it into lowered
ops, checked by tests/test_registry_invariant.py. An op that cannot be lowered
leaves this set (each removal is recorded in the comment after DATA_DEPENDENT_SHAPE).
"""

from __future__ import annotations

from torch_neuronx.ops import evidence

# Pure data movement: float64 stays exact (no fp32 rounding) for these.
DATA_MOVEMENT = """
    alias as_strided_copy cat clone constant_pad_nd copy diagonal_copy embedding expand_copy
    fill flip gather index index_add index_copy index_fill index_put index_select
    _index_put_impl masked_fill masked_scatter masked_select narrow_copy nonzero permute_copy
    reflection_pad1d reflection_pad2d reflection_pad3d repeat repeat_interleave
    replication_pad1d replication_pad2d replication_pad3d roll scatter select_copy
    select_scatter slice_copy slice_scatter split_copy split_with_sizes_copy squeeze_copy
    stack t_copy take transpose_copy tril triu unbind_copy unfold_copy unsqueeze_copy
    view_copy where zero zeros_like ones_like full_like tril_indices triu_indices
    full zeros ones scalar_tensor slice_backward select_backward
    _unsafe_index _unsafe_index_put col2im im2col pixel_shuffle pixel_unshuffle
""".split()

# Arithmetic, reductions, activations, losses, norms, linear algebra, RNG.
COMPUTE = """
    abs acos acosh adaptive_avg_pool1d _adaptive_avg_pool2d _adaptive_avg_pool2d_backward
    _adaptive_avg_pool3d _adaptive_avg_pool3d_backward adaptive_max_pool2d
    adaptive_max_pool2d_backward add addbmm addcdiv addcmul addmm addmv addr all amax amin
    aminmax any arange argmax argmin asin asinh atan atan2 atanh avg_pool2d
    avg_pool2d_backward avg_pool3d avg_pool3d_backward baddbmm bernoulli binary_cross_entropy
    binary_cross_entropy_backward bitwise_and bitwise_left_shift bitwise_not bitwise_or
    bitwise_right_shift bitwise_xor bmm bucketize cauchy ceil clamp clamp_max clamp_min
    complex conj_physical copysign cos cosh count_nonzero cummax cummin cumprod cumsum
    deg2rad digamma div dot elu elu_backward embedding_dense_backward eq erf erfc erfinv exp
    exp2 expm1 exponential eye floor floor_divide fmax fmin fmod frac gcd ge gelu gelu_backward
    geometric glu glu_backward grid_sampler_2d _grouped_mm grid_sampler_2d_backward gt hardshrink
    hardshrink_backward hardsigmoid hardsigmoid_backward hardswish hardswish_backward hardtanh
    hardtanh_backward heaviside huber_loss huber_loss_backward hypot i0 igamma igammac
    isin isinf isnan isneginf isposinf kthvalue lcm le leaky_relu leaky_relu_backward lerp
    lgamma linspace log log10 log1p log2 _log_softmax _log_softmax_backward_data logaddexp
    logaddexp2 logcumsumexp logical_and logical_not logical_or logical_xor logit
    logit_backward logspace logsumexp lt max max_pool2d_with_indices
    max_pool2d_with_indices_backward max_pool3d_with_indices max_pool3d_with_indices_backward
    maximum mean median min minimum mish mm mse_loss mse_loss_backward
    multilabel_margin_loss_forward multinomial mul mv mvlgamma nan_to_num nanmedian nansum
    native_batch_norm native_batch_norm_backward _native_batch_norm_legit
    _native_batch_norm_legit_no_training native_dropout_backward native_group_norm
    native_group_norm_backward native_layer_norm native_layer_norm_backward ne neg nextafter
    nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward normal polar
    pow prod rad2deg random randperm reciprocal relu remainder renorm round rrelu_with_noise
    rsqrt rsub scatter_add scatter_reduce searchsorted sgn sigmoid sigmoid_backward sign
    signbit silu silu_backward sin sinc sinh smooth_l1_loss smooth_l1_loss_backward
    soft_margin_loss soft_margin_loss_backward _softmax _softmax_backward_data softplus
    softplus_backward softshrink softshrink_backward sort sqrt std std_mean sub sum tan tanh
    tanh_backward threshold threshold_backward trace trunc uniform
    upsample_bilinear2d upsample_bilinear2d_backward upsample_nearest1d
    upsample_nearest1d_backward upsample_nearest2d upsample_nearest2d_backward
    upsample_nearest3d upsample_bicubic2d var var_mean xlogy _cdist_forward _cdist_backward
    _pdist_forward _embedding_bag _embedding_bag_backward _embedding_bag_dense_backward
    _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_flash_attention_for_cpu_backward _foreach_add _foreach_addcdiv
    _foreach_addcmul _foreach_div _foreach_lerp _foreach_mul _foreach_neg _foreach_norm
    _foreach_sqrt _foreach_sub _foreach_zero _foreach_copy _foreach_maximum _foreach_pow
    _foreach_sign _foreach_abs _foreach_exp _fused_adam _fused_adamw _fused_sgd
    _amp_foreach_non_finite_check_and_unscale _amp_update_scale linalg_vector_norm
    linalg_lu linalg_solve_triangular _linalg_solve_ex
    linalg_householder_product cholesky_solve ormqr
    _weight_norm_interface _weight_norm_interface_backward nonzero_static
    bincount unique_dim _unique2 unique_consecutive log_sigmoid_forward log_sigmoid_backward
    equal unfold_backward mode _prelu_kernel _prelu_kernel_backward angle norm _pdist_backward
    linalg_lu_solve linalg_lstsq linalg_matrix_exp _fft_r2c _fft_c2c _fft_c2r
    poisson
    upsample_linear1d upsample_linear1d_backward upsample_trilinear3d upsample_trilinear3d_backward
    upsample_nearest3d_backward _upsample_nearest_exact1d _upsample_nearest_exact1d_backward
    _upsample_nearest_exact2d _upsample_nearest_exact2d_backward _upsample_nearest_exact3d
    _upsample_nearest_exact3d_backward adaptive_max_pool3d adaptive_max_pool3d_backward
    reflection_pad1d_backward reflection_pad2d_backward reflection_pad3d_backward
    replication_pad1d_backward replication_pad2d_backward replication_pad3d_backward
    vdot log_normal _foreach_acos _foreach_asin _foreach_atan _foreach_ceil _foreach_cos
    _foreach_cosh _foreach_erf _foreach_erfc _foreach_expm1 _foreach_floor _foreach_frac
    _foreach_lgamma _foreach_log _foreach_log10 _foreach_log1p _foreach_log2 _foreach_reciprocal
    _foreach_round _foreach_rsqrt _foreach_sigmoid _foreach_sin _foreach_sinh _foreach_tan
    _foreach_tanh _foreach_trunc _foreach_clamp_max _foreach_clamp_min _foreach_minimum
    _foreach_max _ctc_loss _ctc_loss_backward
""".split()

# Ops whose call makes the host read device values before it can go on: the output's
# shape depends on them, or the result is a Python value. The audit flags each call
# ("data-dependent shape"; repeat_interleave only without output_size, recorder.py).
DATA_DEPENDENT = frozenset({
    # the output's shape depends on the values
    "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "bincount",
    "repeat_interleave",  # with a tensor of repeats; repeat_interleave(x, int) decomposes and compiles
    "linalg_lstsq",  # residuals are empty unless every matrix has full rank
    "_ctc_loss",  # log_alpha is [batch, time, 2 * max(target_lengths) + 1] (tagged dynamic_output_shape)
    # the result is a Python value that steers Python control flow
    "equal",  # bool
})

# Native in eager, never handed to the compiler: Dynamo stops the graph before them
# (a graph break; capture_dynamic_output_shape_ops is off) and runs them eagerly on
# the device between compiled graphs. The name is historical: it held one op decided
# while tracing too (_fused_sdp_choice, now a C++ kernel: csrc/Kernels.cpp).
DATA_DEPENDENT_SHAPE = DATA_DEPENDENT

# Left the native set under the invariant (they now take the CPU fallback in eager):
#   _linalg_det, _linalg_slogdet: the LU factors they return (read by their backward formulas) are
#       those of A or of A^T depending on A's strides at trace time; a lowering sees values only,
#       so compiled gradients could be silently wrong. Eager det/slogdet work through the fallback.
#   _make_per_tensor_quantized_tensor: quantized tensors cannot live on the device (empty_strided
#       has no quantized support); it failed as a native op too, and fails the same way now.

# Ops the release this emulator models runs on the host CPU (ops/evidence.py: AWS's own
# fallback list and tests): never native here either, so eager calls take the CPU
# fallback, warned about and counted, as a user meets them on Trainium. They keep their
# lowerings (compiled graphs still hold them; op_support says what is known of the
# release's compile). _linalg_svd, _linalg_eigh, linalg_cholesky_ex, linalg_inv_ex,
# linalg_lu_factor_ex, linalg_qr and triangular_solve left COMPUTE for this.
HOST_FALLBACK = evidence.ops_routed(evidence.HOST)

# The overload csrc/MaskIndex.cpp serves in front of the alias kernel: boolean-mask
# indexing runs nonzero on the device (a host read) before the gather, as the release
# does (ops/evidence.py). ops.native_overloads() leaves it out of the alias kernel's
# registration and hands it the op's flags.
MASK_INDEX_OVERLOADS = frozenset({"index.Tensor"})

# Overloads the release leaves to PyTorch's CompositeExplicitAutograd kernel, which
# allocates on the device and calls the op's out= overload, the one device kernel
# (ops/evidence.py): arange(start, end) and arange(start, end, step) run as empty +
# arange.start_out (arange(end) is a kernel of its own). ops.native_overloads() leaves
# them out of the alias kernel's registration.
COMPOSITE_OVERLOADS = frozenset({"arange.start", "arange.start_step"})

# Ops that legitimately take non-scalar CPU tensors next to device tensors
# (copies and advanced indexing with host index tensors), as on CUDA.
ACCEPTS_HOST_TENSORS = frozenset({"copy", "index", "index_put", "_index_put_impl", "_unsafe_index",
                                  "_unsafe_index_put"})

# The direct kernels: native ops with a kernel of the package's own instead of the
# alias kernel (PyTorch's CPU kernel on device memory). Two sets, by language; the
# registry tests check each against its source.
# C++: csrc/Kernels.cpp (allocation, views, copies, storage, convolution), csrc/Dropout.cpp (native_dropout).
CPP_KERNELS = frozenset({
    "empty", "empty_strided", "_copy_from", "_copy_from_and_resize", "resize", "set",
    "_local_scalar_dense", "record_stream", "view", "as_strided", "_reshape_alias", "unfold",
    "view_as_real", "view_as_complex", "convolution_overrideable",
    "convolution_backward_overrideable", "native_dropout", "_has_compatible_shallow_copy_type",
    "new_empty",
    "_fused_sdp_choice",  # TorchNeuron's SDPA backend choice, the dispatch stub's answer (metadata only)
    "linear_backward",  # csrc/Linear.cpp: its formula on host aliases (no CPU kernel to alias)
})
# Python: the KERNELS of torch_neuronx/ops/rnn.py, histogram.py, topk.py, float8.py,
# sync_batch_norm.py, composites.py and attention.py. Those of the last three have no CPU
# kernel for the alias path (CUDA-only, autograd-only or backend-only ops); the first two of them
# compile through their decompositions (compiler/aot.py), attention's ops through their lowerings
# (with dropout, their decompositions).
PYTHON_KERNELS = frozenset({
    "histc", "topk", "_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl",
    "_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward", "_scaled_mm", "_scaled_grouped_mm",
    "_scaled_mm_v2", "_scaled_grouped_mm_v2",
    "batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt",
    "batch_norm_gather_stats_with_counts", "_fused_rms_norm_backward",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
})
DIRECT_KERNELS = CPP_KERNELS | PYTHON_KERNELS

# Overloads of native ops that have two implementations: csrc/FastOps.cpp's unboxed
# kernel (csrc/Dropout.cpp's for native_dropout_backward, csrc/Linear.cpp's for linear,
# csrc/Gelu.cpp's for gelu and gelu_backward)
# serves these (it hands unusual calls to the alias kernel's code itself); the alias
# kernel serves every other overload of the op. This is the one statement of which
# serves what: ops.native_overloads() leaves these out of the alias kernel's
# registration (registering both would replace FastOps.cpp's kernel).
FAST_PATH_OVERLOADS = frozenset({
    "add.Tensor", "add_.Tensor", "sub.Tensor", "sub_.Tensor",
    "mul.Tensor", "mul_.Tensor", "div.Tensor", "div_.Tensor",
    "add.Scalar", "add_.Scalar", "sub.Scalar", "sub_.Scalar",
    "mul.Scalar", "mul_.Scalar", "div.Scalar", "div_.Scalar",
    # served there so that concatenation can queue them (csrc/Concatenation.h)
    "sqrt", "sqrt_", "lerp.Scalar", "lerp_.Scalar", "addcmul", "addcmul_", "addcdiv", "addcdiv_",
    "neg", "neg_", "abs", "abs_", "relu", "relu_", "reciprocal", "reciprocal_", "rsqrt", "rsqrt_",
    "fill.Scalar", "fill_.Scalar", "zero", "zero_",
    "exp", "exp_", "tanh", "tanh_", "sigmoid", "sigmoid_", "silu", "silu_", "pow.Tensor_Scalar", "pow_.Scalar",
    "threshold_backward", "sigmoid_backward", "tanh_backward", "silu_backward", "_softmax",
    "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data", "sum.dim_IntList", "mean.dim",
    "clone", "cat", "copy_",
    # csrc/Dropout.cpp: float32 with a boolean mask without converting the mask first
    "native_dropout_backward",
    # csrc/Linear.cpp: one float32 row (batch 1) through csrc/Gemv.cpp's loop
    "linear",
    # csrc/Gelu.cpp: float32 through ATen's GELU loops, not oneDNN's eltwise primitive
    "gelu", "gelu_backward",
    # csrc/LayerNorm.cpp: PyTorch's CPU kernels called directly, without the alias path's boxing
    "native_layer_norm", "native_layer_norm_backward",
    # csrc/Foreach.cpp: the foreach ops of torch.optim's default (foreach) path, queued when
    # concatenation is on (one queued op per element)
    *(f"_foreach_{op}{inplace}.{overload}" for op in ("add", "sub", "mul", "div") for inplace in ("", "_")
      for overload in ("Scalar", "ScalarList", "List")),
    *(f"_foreach_{op}{inplace}.Tensor" for op in ("add", "mul", "div") for inplace in ("", "_")),
    *(f"_foreach_{op}{inplace}" for op in ("sqrt", "neg", "abs", "reciprocal", "exp", "sigmoid", "tanh")
      for inplace in ("", "_")),
    "_foreach_zero_", "_foreach_lerp.Scalar", "_foreach_lerp_.Scalar",
    *(f"_foreach_{op}{inplace}.{overload}" for op in ("addcmul", "addcdiv") for inplace in ("", "_")
      for overload in ("Scalar", "ScalarList")),
})

# FP8 compute: native (eager and lowered) on instance profiles with FP8 (Trainium3),
# one clear error elsewhere (ops/float8.py; at compile time compiler/float8.py).
FP8_COMPUTE = frozenset({"_scaled_mm", "_scaled_grouped_mm", "_scaled_mm_v2", "_scaled_grouped_mm_v2"})

# Ops PyTorch implements as a CompositeImplicitAutograd composite that the release
# registers as one device kernel (ops/evidence.py). The alias kernel serves them as it
# serves every native op: redispatched to the CPU key on host aliases, the composite
# runs there, so its parts are no device calls of their own and the audit and
# get_executed_ops() see the op itself. Autograd: _fused_rms_norm, silu_backward
# have PyTorch's own formulas for a backend that serves them (derivatives.yaml;
# _fused_rms_norm's calls _fused_rms_norm_backward, a direct kernel; silu_backward has
# none, as on the CPU); isfinite and one_hot return no
# floating tensor; index_select_backward and value_selecting_reduction_backward keep
# their composites when a gradient flows through them (ops/composites.py); linear's
# autograd kernel (csrc/Linear.cpp) makes its gradient one linear_backward kernel.
# torch.compile decomposes each while tracing, as before.
ONE_KERNEL_COMPOSITES = frozenset({
    "linear", "isfinite", "one_hot", "_fused_rms_norm", "silu_backward", "index_select_backward",
    "value_selecting_reduction_backward",
})

NATIVE_OPS: frozenset[str] = frozenset(DATA_MOVEMENT) | frozenset(COMPUTE) | DIRECT_KERNELS | ONE_KERNEL_COMPOSITES


# ------------------------------------------------------------------ what a device call does
# The audit's op classes (audit/recorder.py, report.py, estimate.py test a recorded name
# such as "aten::add_.Tensor" with base_name(), or with the rules below).

# The host reads a device value and waits for the device (.item(); item is the composite).
HOST_SYNC = frozenset({"_local_scalar_dense", "item"})

# Copies: move data and compute nothing (float64 stays exact), plus every "*_copy" op
# (is_copy). copy, _copy_from and _copy_from_and_resize may cross the host link: the
# audit reads the direction from their arguments.
COPIES = frozenset({"copy", "_copy_from", "_copy_from_and_resize", "_to_copy", "clone", "contiguous"})

# Views: a new tensor over the same storage; no data moves.
VIEWS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "expand_as", "as_strided",
    "permute", "transpose", "t", "squeeze", "unsqueeze", "slice", "select", "detach", "alias",
    "unfold", "narrow", "split", "split_with_sizes", "chunk", "unbind", "view_as", "view_as_real",
    "view_as_complex", "diagonal", "flatten", "unflatten", "movedim", "lift_fresh",
})

# Change a tensor's metadata or storage; move no data.
METADATA = frozenset({"set", "resize", "resize_as"})

# Device calls that are not kernels the device compiles: allocation, storage metadata,
# copies (DMA) and reading a scalar. The audit counts every other first call as a kernel
# compilation. All are C++ kernels (the registry test checks it).
NO_KERNEL = frozenset({
    "empty", "empty_strided", "new_empty", "_copy_from", "_copy_from_and_resize", "resize", "set",
    "_local_scalar_dense", "_has_compatible_shallow_copy_type",
})

# TensorE work (the estimate's "matmul" class), plus, by rule, convolutions and attention
# (is_tensor_engine).
TENSOR_ENGINE = frozenset({
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "linear_backward", "addmv", "mv",
    "_scaled_mm", "_grouped_mm", "_scaled_grouped_mm", "_int_mm", "_scaled_mm_v2", "_scaled_grouped_mm_v2",
})

# Adaptive Eager Execution (the audit's model, audit/fusion.py): the ops that end a fused
# sequence, themselves included. AWS's list (its MatMulToMatMul concatenation strategy),
# plus convolution_overrideable: conv2d and convolution are composites that reach this
# device as that op. The queue follows it (csrc/Concatenation.h runQueuedEndingWith: the
# alias kernel by the ops' flags, csrc/Linear.cpp's and csrc/Kernels.cpp's kernels by call).
ENDS_FUSED_SEQUENCE = frozenset({
    "linear", "linear_backward", "matmul", "matmul_backward", "mm", "bmm", "addmm", "baddbmm", "addbmm",
    "conv2d", "convolution", "convolution_overrideable",
})


def base_name(op: str) -> str:
    """The registry's spelling of any op name: "aten::add_.Tensor", "add_", "add.out",
    "add" -> "add". A dunder ("__and__") keeps its underscores."""
    packet = op.rpartition("::")[2].partition(".")[0]
    return packet[:-1] if packet.endswith("_") and not packet.endswith("__") else packet


def is_allocation(op: str) -> bool:
    """empty, empty_strided, empty_like, new_empty, ...: allocate, move no data."""
    return base_name(op).startswith(("empty", "new_empty"))


def is_copy(op: str) -> bool:
    base = base_name(op)
    return base in COPIES or base.endswith("_copy")


def is_tensor_engine(op: str) -> bool:
    base = base_name(op)
    return base in TENSOR_ENGINE or "conv" in base or "attention" in base or "scaled_dot_product" in base
