"""FP8 compute on the device: torch._scaled_mm and torch._scaled_grouped_mm.

Who may run them: TorchNeuron documents FP8 compute (aten::_scaled_mm, MXFP8)
for Trainium3 only (docs/hardware-figures.md#fp8-compute), so they run on profiles whose `fp8` is
true (trn3) and raise one error elsewhere, in eager here and at compile time
in compiler/float8.py. Float8 storage, copies, views and casts work on every
profile.

What they compute (the reference, docs/fp8.md): each operand is dequantized
to float32 (element value times its scale), the product is accumulated in
float32, the bias (as float32) is added, and the result is cast to out_dtype
(for a float8 out_dtype, divided by scale_result first). This is what CPU
PyTorch's _scaled_mm computes for the cases it implements (tensor-wise and
row-wise scales), bit for bit. The lowering (lowering/scaled_mm.py) computes
the same in StableHLO.

Scales, as PyTorch 2.13 defines them (torch/_meta_registrations.py):
  tensor-wise   float32 scale_a, scale_b with one element each
  row-wise      float32 scale_a (M, 1), scale_b (1, N)
  blockwise     float32 (M, ceil(K/128)) for 1x128 blocks of self, (ceil(K/128), ceil(N/128))
                for 128x128 blocks of mat2, (ceil(K/128), N) for 1x128 blocks of mat2,
                (ceil(M/128), ceil(K/128)) for 128x128 blocks of self
  MX            float8_e8m0fnu scales of 32-element blocks along K (MXFP8, MXFP4), or
                float8_e4m3fn scales of 16-element blocks with float4 elements (NVFP4), each
                operand's (rows, K/block) matrix in the blocked ("swizzled") layout of
                torch.testing._internal.common_quantized.to_blocked, flattened
float4_e2m1fn_x2 packs two values per byte along K: the low nibble is the
first (pack_uint4's order); self is (M, K/2), mat2 (K/2, N).
"""

from __future__ import annotations

import math

import torch

from torch_neuronx.ops.registry import FP8_COMPUTE as COMPUTE_OPS

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
FP4 = torch.float4_e2m1fn_x2
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Scaling modes (check_scaled_mm's answer).
TENSORWISE, ROWWISE, BLOCKWISE, MX = "tensor-wise", "row-wise", "blockwise", "mx"


# ------------------------------------------------------------------ the profile gate
def runtime_profile():
    """The instance profile the runtime was sized for (read once, at import; profiles.active_profile()
    reads the environment as it is now)."""
    import torch_neuronx.neuron

    return torch_neuronx.neuron._PROFILE


def has_fp8_compute() -> bool:
    return runtime_profile().fp8


def fp8_compute_error(op: str) -> str:
    profile = runtime_profile()
    return (f"torch.{op}: FP8 compute needs Trainium3 (NeuronCore-v4), and this instance profile is "
            f"{profile.name} ({profile.platform}, {profile.core_generation}), which has none in "
            "TorchNeuron. Set TORCH_NEURONX_INSTANCE=trn3.3xlarge (or trn3.48xlarge) to emulate a "
            "Trainium3 instance, or compute in bfloat16 on this one (dequantize: a.to(torch.bfloat16) * "
            "scale_a). Float8 storage and casts work on every profile.")


def require_fp8_compute(op: str) -> None:
    if not has_fp8_compute():
        raise RuntimeError(fp8_compute_error(op))


# ------------------------------------------------------------------ argument checks
def _check(condition: bool, message) -> None:
    """torch._check's error (RuntimeError), as PyTorch's meta kernels raise it."""
    torch._check(condition, message)


def _is_low_precision(dtype) -> bool:
    return dtype in FLOAT8 or dtype == FP4


def _blocked_size(rows: int, k_blocks: int) -> int:
    return 128 * math.ceil(rows / 128) * 4 * math.ceil(k_blocks / 4)


def check_scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                    use_fast_accum=False) -> str:
    """The scaling mode of a _scaled_mm call, or PyTorch's error for a malformed one
    (the checks and wording of PyTorch 2.13's meta_scaled_mm for CPU tensors; the
    CPU kernel's for mismatched shapes)."""
    _check(self.dim() == 2 and mat2.dim() == 2,
           lambda: f"Inputs must be 2D but got self.dim()={self.dim()} and mat2.dim()={mat2.dim()}")
    _check(_is_low_precision(self.dtype) and _is_low_precision(mat2.dtype),
           lambda: f"Expected both inputs to be fp8 or fp4 types but got self.dtype={self.dtype} and "
                   f"mat2.dtype={mat2.dtype}")
    _check(self.size(1) == mat2.size(0),
           lambda: f"mat_a and mat_b shapes cannot be multiplied ({self.size(0)}x{self.size(1)} and "
                   f"{mat2.size(0)}x{mat2.size(1)})")
    m, k = self.shape
    n = mat2.size(1)
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        _check(scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32,
               lambda: "For tensorwise scaling, both scale_a and scale_b must be float (fp32) tensors.")
        return TENSORWISE
    if scale_a.dtype == scale_b.dtype and scale_a.dtype in (torch.float8_e8m0fnu, torch.float8_e4m3fn):
        return _check_mx(self, scale_a, scale_b, m, k, n)
    _check(scale_a.dtype == torch.float32 and scale_b.dtype == torch.float32,
           lambda: "For rowwise scaling, both scale_a and scale_b must be float (fp32) tensors.")
    _check(scale_a.dim() == 2 and scale_b.dim() == 2,
           lambda: f"For non-tensorwise scaling, scale tensors must be 2D, but got scale_a.dim()={scale_a.dim()} "
                   f"and scale_b.dim()={scale_b.dim()}")
    (a0, a1), (b0, b1) = scale_a.shape, scale_b.shape
    if (a0, a1, b0, b1) == (m, 1, 1, n):
        _check(scale_a.is_contiguous() and scale_b.is_contiguous(),
               lambda: "Both scale_a and scale_b must be contiguous for rowwise scaling.")
        return ROWWISE
    kb, mb, nb = math.ceil(k / 128), math.ceil(m / 128), math.ceil(n / 128)
    if (a1, b0) == (kb, kb) and (a0, b1) in ((m, nb), (m, n), (mb, n)):
        return BLOCKWISE
    _check(False, lambda: (
        "Invalid scaling configuration. For tensorwise scaling, both scales should be scalar. "
        f"For rowwise scaling, scale_a should be ({m}, 1), scale_b should be (1, {n}). "
        f"For (BlockWise1x128, BlockWise128x128), scale_a should be ({m}, {kb}), scale_b should be ({kb}, {nb}). "
        f"For (BlockWise1x128, BlockWise1x128), scale_a should be ({m}, {kb}), scale_b should be ({kb}, {n}). "
        f"For (BlockWise128x128, BlockWise1x128), scale_a should be ({mb}, {kb}), scale_b should be ({kb}, {n}). "
        f"Got scale_a.size()=({a0}, {a1}) and scale_b.size()=({b0}, {b1})"))
    return BLOCKWISE  # unreachable


def mx_block(self_dtype, scale_dtype) -> tuple[int, int]:
    """(elements of K per scale, unpacked K per stored K) of an MX/NVFP4 call."""
    if scale_dtype == torch.float8_e4m3fn:
        return 16, 2  # NVFP4: PyTorch sizes it for float4 elements
    return 32, 2 if self_dtype == FP4 else 1


def _check_mx(self, scale_a, scale_b, m, k, n) -> str:
    block, unpack = mx_block(self.dtype, scale_a.dtype)
    k_blocks = math.ceil(k * unpack / block)
    want_a, want_b = _blocked_size(m, k_blocks), _blocked_size(n, k_blocks)
    _check(scale_a.numel() == want_a and scale_b.numel() == want_b, lambda: (
        "Invalid blockwise scaling configuration. "
        f"For blockwise scaling, scale_a should have {want_a} elements, got {scale_a.numel()}, "
        f"scale_b should have {want_b} elements, got {scale_b.numel()}."))
    _check(scale_a.is_contiguous(), lambda: "scale_a must be contiguous")
    _check(scale_b.is_contiguous(), lambda: "scale_b must be contiguous")
    if scale_a.dtype == torch.float8_e4m3fn and self.dtype != FP4:
        raise NotImplementedError("torch._scaled_mm: float8_e4m3fn block scales (NVFP4) need "
                                  "float4_e2m1fn_x2 inputs; use float8_e8m0fnu scales (MXFP8) for float8 inputs")
    return MX


def check_scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                            out_dtype=None, use_fast_accum=False) -> None:
    """PyTorch 2.13's checks of _scaled_grouped_mm (meta_scaled_grouped_mm), by
    running its meta kernel on meta stand-ins, plus what the emulator implements:
    float32 (row-wise) scales."""
    from torch._meta_registrations import meta_scaled_grouped_mm

    def stand_in(t):
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    meta_scaled_grouped_mm(*(stand_in(t) for t in (mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result)),
                           out_dtype, use_fast_accum)
    if scale_a.dtype != torch.float32:
        raise NotImplementedError("torch._scaled_grouped_mm: MXFP8 (float8_e8m0fnu) scales are not implemented "
                                  "by the neuron emulator; use float32 row-wise scales")


CHECKS = {"_scaled_mm": check_scaled_mm, "_scaled_grouped_mm": check_scaled_grouped_mm}


# ------------------------------------------------------------------ the reference
def _values(x: torch.Tensor, packed_dim: int) -> torch.Tensor:
    """float32 values of a float8 or float4 (packed along packed_dim) tensor."""
    if x.dtype != FP4:
        return x.float()
    bits = x.view(torch.uint8).long()
    table = torch.tensor(_FP4_VALUES, dtype=torch.float32, device=x.device)
    pair = torch.stack([table[bits & 0xF], table[bits >> 4]], dim=packed_dim + 1)  # low nibble first
    shape = list(x.shape)
    shape[packed_dim] *= 2
    return pair.reshape(shape)


def unblock(scale: torch.Tensor, rows: int, k_blocks: int) -> torch.Tensor:
    """The (rows, k_blocks) scale matrix of a flattened blocked ("swizzled") layout:
    the inverse of common_quantized.to_blocked (128x4 tiles, each stored as 32x16)."""
    rb, cb = math.ceil(rows / 128), math.ceil(k_blocks / 4)
    tiles = scale.reshape(rb, cb, 32, 4, 4)  # [row tile, col tile, row % 32, row // 32, col]
    return tiles.permute(0, 3, 2, 1, 4).reshape(rb * 128, cb * 4)[:rows, :k_blocks]


def _expand(scale: torch.Tensor, block_rows: int, block_cols: int, shape) -> torch.Tensor:
    """A per-block scale matrix repeated over its blocks, cut to the operand's shape."""
    full = scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return full[: shape[0], : shape[1]]


def dequantize(x, scale, mode: str, operand: str) -> torch.Tensor:
    """The float32 values an operand of _scaled_mm stands for: self (operand 'a', (M, K))
    or mat2 ('b', (K, N))."""
    values = _values(x, 1 if operand == "a" else 0)
    if mode == TENSORWISE:
        return values * scale.float().reshape(())
    if mode == ROWWISE:
        return values * scale.float()
    rows, cols = values.shape
    if mode == MX:  # one scale per `block` elements of K, for each row of self / column of mat2
        block = mx_block(x.dtype, scale.dtype)[0]
        k = cols if operand == "a" else rows
        per_block = unblock(scale, rows if operand == "a" else cols, math.ceil(k / block)).float()
        if operand == "a":
            return values * _expand(per_block, 1, block, values.shape)
        return values * _expand(per_block.t(), block, 1, values.shape)
    # blockwise: self in 1x128 (one row, 128 of K) or 128x128 blocks; mat2 in 128x1 or 128x128
    if operand == "a":
        return values * _expand(scale.float(), 1 if scale.shape[0] == rows else 128, 128, values.shape)
    return values * _expand(scale.float(), 128, 1 if scale.shape[1] == cols else 128, values.shape)


def _finish(out: torch.Tensor, bias, scale_result, out_dtype) -> torch.Tensor:
    if bias is not None:
        out = out + bias.float()
    if scale_result is not None and out_dtype in FLOAT8:
        out = out / scale_result.float()
    return out.to(out_dtype)


def scaled_mm_reference(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                        use_fast_accum=False) -> torch.Tensor:
    """torch._scaled_mm as defined above, on any device's tensors (use_fast_accum
    changes nothing: accumulation is float32)."""
    mode = check_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype)
    out = dequantize(self, scale_a, mode, "a") @ dequantize(mat2, scale_b, mode, "b")
    return _finish(out, bias, scale_result, out_dtype or self.dtype)


def _bounds(offs, total: int) -> list[tuple[int, int]]:
    ends = [int(e) for e in offs.tolist()]
    starts = [0] + ends[:-1]
    return [(s, min(e, total)) for s, e in zip(starts, ends)]


def scaled_grouped_mm_reference(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None,
                                out_dtype=None, use_fast_accum=False) -> torch.Tensor:
    """torch._scaled_grouped_mm with float32 row-wise scales: per group, the row-wise
    _scaled_mm reference of the group's rows/columns (scale_a per row of mat_a,
    scale_b per column of mat_b, per group where an operand is 3D or both are 2D);
    rows or columns after the last offset are 0, as in _grouped_mm."""
    check_scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_dtype)
    out_dtype = out_dtype or torch.bfloat16
    a, b = mat_a.float(), mat_b.float()
    sa, sb = scale_a.float(), scale_b.float()
    if mat_a.dim() == 3 and mat_b.dim() == 3:
        out = (a * sa[:, :, None]) @ (b * sb[:, None, :])
    elif mat_a.dim() == 2 and mat_b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], device=a.device)
        for g, (s, e) in enumerate(_bounds(offs, a.shape[0])):
            out[s:e] = (a[s:e] * sa[s:e, None]) @ (b[g] * sb[g][None, :])
    elif mat_a.dim() == 3:
        out = torch.zeros(a.shape[1], b.shape[1], device=a.device)
        for g, (s, e) in enumerate(_bounds(offs, b.shape[1])):
            out[:, s:e] = (a[g] * sa[g][:, None]) @ (b[:, s:e] * sb[None, s:e])
    else:
        m, n, groups = a.shape[0], b.shape[1], offs.shape[0]
        out = torch.zeros(groups, m, n, device=a.device)
        for g, (s, e) in enumerate(_bounds(offs, a.shape[1])):
            out[g] = (a[:, s:e] * sa[g * m:(g + 1) * m, None]) @ (b[s:e] * sb[None, g * n:(g + 1) * n])
    return out.to(out_dtype)


# ------------------------------------------------------------------ eager kernels (PrivateUse1)
def _host(t):
    from torch_neuronx import _C

    if isinstance(t, torch.Tensor) and t.device.type == "neuron":
        return _C._host_alias(t)
    return t


def scaled_mm(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    require_fp8_compute("_scaled_mm")
    args = [_host(t) for t in (self, mat2, scale_a, scale_b, bias, scale_result)]
    return scaled_mm_reference(*args, out_dtype, use_fast_accum).to(self.device)


def scaled_mm_out(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                  use_fast_accum=False, *, out):
    result = scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    out.resize_(result.shape)
    return out.copy_(result)


def scaled_grouped_mm(mat_a, mat_b, scale_a, scale_b, offs=None, bias=None, scale_result=None, out_dtype=None,
                      use_fast_accum=False):
    require_fp8_compute("_scaled_grouped_mm")
    args = [_host(t) for t in (mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result)]
    return scaled_grouped_mm_reference(*args, out_dtype, use_fast_accum).to(mat_a.device)


# ------------------------------------------------------------------ the v2 API
# torch.nn.functional.scaled_mm / scaled_grouped_mm call _scaled_mm_v2 /
# _scaled_grouped_mm_v2 with a list of scales per operand, each with its recipe
# (ScalingType) and swizzle (SwizzleType). One scale per operand is the v1 op:
# it runs as _scaled_mm / _scaled_grouped_mm (the same gate, checks and
# reference); the compiler decomposes v2 into v1 the same way (compiler/aot.py).
_RECIPE_MODES = {0: TENSORWISE, 1: ROWWISE, 2: MX, 3: MX, 4: BLOCKWISE, 5: BLOCKWISE}
_RECIPE_NAMES = {0: "TensorWise", 1: "RowWise", 2: "BlockWise1x16", 3: "BlockWise1x32",
                 4: "BlockWise1x128", 5: "BlockWise128x128"}
_SWIZZLE_32_4_4 = 1


def _v2_scale(op: str, operand: str, scales, recipes, swizzles):
    """The one scale of an operand, or NotImplementedError naming what v2 asked for."""
    if len(scales) != 1 or len(recipes) != 1:
        raise NotImplementedError(
            f"torch.{op} on neuron: {operand} has {len(scales)} scales; one scale per operand is "
            "supported (the recipes of torch._scaled_mm), not two-level scaling such as NVFP4's "
            "global scale. Fold the global scale into the block scales or into the output.")
    if _RECIPE_MODES.get(recipes[0]) == MX and (list(swizzles) or [0])[0] != _SWIZZLE_32_4_4:
        raise NotImplementedError(
            f"torch.{op} on neuron: {operand}'s {_RECIPE_NAMES[recipes[0]]} scales must be swizzled "
            "(SwizzleType.SWIZZLE_32_4_4, torch.testing._internal.common_quantized.to_blocked's layout).")
    return scales[0]


def _v2_check(op: str, mode: str, recipe_a, recipe_b) -> None:
    wanted = {_RECIPE_MODES.get(recipe_a[0]), _RECIPE_MODES.get(recipe_b[0])}
    if wanted != {mode}:
        names = [_RECIPE_NAMES.get(r[0], str(r[0])) for r in (recipe_a, recipe_b)]
        raise ValueError(f"torch.{op}: the scales' shapes and dtypes are {mode} scaling, but the "
                         f"recipes say {names[0]} and {names[1]}.")


def scaled_mm_v2_as_v1(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias=None,
                       out_dtype=None, contraction_dim=(), use_fast_accum=False) -> tuple:
    """The _scaled_mm arguments of a _scaled_mm_v2 call (checked against its recipes)."""
    op = "_scaled_mm_v2"
    if list(contraction_dim) not in ([], [1, 0]):
        raise NotImplementedError(f"torch.{op} on neuron: contraction_dim={list(contraction_dim)}; "
                                  "only the default (self's dim 1 with mat2's dim 0) is supported.")
    one_a = _v2_scale(op, "scale_a", scale_a, recipe_a, swizzle_a)
    one_b = _v2_scale(op, "scale_b", scale_b, recipe_b, swizzle_b)
    args = (self, mat2, one_a, one_b, bias, None, out_dtype, use_fast_accum)
    _v2_check(op, check_scaled_mm(*args), recipe_a, recipe_b)
    return args


def scaled_grouped_mm_v2_as_v1(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b,
                               offs=None, bias=None, out_dtype=None, contraction_dim=(),
                               use_fast_accum=False) -> tuple:
    """The _scaled_grouped_mm arguments of a _scaled_grouped_mm_v2 call (row-wise scales)."""
    op = "_scaled_grouped_mm_v2"
    if list(contraction_dim):
        raise NotImplementedError(f"torch.{op} on neuron: contraction_dim={list(contraction_dim)}; "
                                  "only the default is supported.")
    one_a = _v2_scale(op, "scale_a", scale_a, recipe_a, swizzle_a)
    one_b = _v2_scale(op, "scale_b", scale_b, recipe_b, swizzle_b)
    _v2_check(op, ROWWISE, recipe_a, recipe_b)
    return (self, mat2, one_a, one_b, offs, bias, None, out_dtype, use_fast_accum)


CHECKS.update({"_scaled_mm_v2": scaled_mm_v2_as_v1, "_scaled_grouped_mm_v2": scaled_grouped_mm_v2_as_v1})


def scaled_mm_v2(*args, **kwargs):
    require_fp8_compute("_scaled_mm_v2")
    return scaled_mm(*scaled_mm_v2_as_v1(*args, **kwargs))


def scaled_grouped_mm_v2(*args, **kwargs):
    require_fp8_compute("_scaled_grouped_mm_v2")
    return scaled_grouped_mm(*scaled_grouped_mm_v2_as_v1(*args, **kwargs))


def decompose_scaled_mm_v2(*args, **kwargs):
    return torch.ops.aten._scaled_mm.default(*scaled_mm_v2_as_v1(*args, **kwargs))


def decompose_scaled_grouped_mm_v2(*args, **kwargs):
    return torch.ops.aten._scaled_grouped_mm.default(*scaled_grouped_mm_v2_as_v1(*args, **kwargs))


KERNELS = {"_scaled_mm": scaled_mm, "_scaled_mm.out": scaled_mm_out, "_scaled_grouped_mm": scaled_grouped_mm,
           "_scaled_mm_v2": scaled_mm_v2, "_scaled_grouped_mm_v2": scaled_grouped_mm_v2}
DECOMPOSITIONS = {torch.ops.aten._scaled_mm_v2.default: decompose_scaled_mm_v2,
                  torch.ops.aten._scaled_grouped_mm_v2.default: decompose_scaled_grouped_mm_v2}
