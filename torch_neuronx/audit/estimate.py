"""Step time of a recorded run on a target instance, as a range (a roofline per op).

Input: what one process executed per step (op signatures, compiled graphs, collectives).
Output, per target InstanceProfile: ``{"instance", "low_s", "high_s", "by_class", "assumptions",
"label": "estimate"}``. ``low_s`` uses peak rates and low overheads, ``high_s`` realistic
efficiencies and high overheads. Every constant behind the numbers is returned as one line of
``assumptions``: the result is an estimate from public figures, never a measurement.

The work of an op comes from PyTorch itself: the op runs on meta tensors (its shape function,
no data) under ``torch.utils.flop_counter.FlopCounterMode``. Chip rates, with their sources:
docs/hardware-figures.md#chip-figures.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from torch_neuronx.audit.recorder import is_tensor, tensors
from torch_neuronx.neuron.profiles import PROFILES, InstanceProfile
from torch_neuronx.ops import registry

TERA = 1e12
GIGA = 1e9
SEARCHED_ON = "2026-12-02"  # when the stored Neuron docs were searched for the figures below
# The page listing every hardware figure with its public source and read date; the assumption
# lines and errors cite it.
FIGURES = "docs/hardware-figures.md"
CHIP = FIGURES + "#chip-figures"
CALIBRATION = FIGURES + "#calibration-points-and-assumptions"


@dataclass(frozen=True)
class ChipRates:
    """Peak figures of one chip (dense, not sparse), as published."""

    bf16_tflops: float
    fp8_tflops: float
    fp32_tflops: float
    hbm_tbps: float
    neuronlink_tbps: float
    physical_cores: int


# Chip rates, as published by AWS (sources and dates: docs/hardware-figures.md#chip-figures). trn1
# is left out: the model uses no trn1 rates, so a trn1 profile has no estimate (estimate_step
# raises ValueError naming this).
TARGET_RATES: dict[str, ChipRates] = {
    "trn2": ChipRates(
        bf16_tflops=667,  # Trainium2: 667 BF16/FP16/TF32 TFLOPS
        fp8_tflops=1299,  # Trainium2: 1,299 FP8 TFLOPS (not usable by TorchNeuron on trn2: the page's FP8 compute)
        fp32_tflops=181,  # Trainium2: 181 FP32 TFLOPS
        hbm_tbps=2.9,  # Trainium2: 96 GiB, 2.9 TB/s
        neuronlink_tbps=1.28,  # Trainium2: NeuronLink-v3, 1.28 TB/s per chip
        physical_cores=8,  # Trainium2: 8 x NeuronCore-v3
    ),
    "trn3": ChipRates(
        bf16_tflops=671,  # Trainium3: 671 BF16/FP16/TF32 TFLOPS
        fp8_tflops=2517,  # Trainium3: 2,517 MXFP8/MXFP4 TFLOPS
        fp32_tflops=183,  # Trainium3: 183 FP32 TFLOPS
        hbm_tbps=4.9,  # Trainium3: 144 GiB, 4.9 TB/s
        neuronlink_tbps=2.56,  # Trainium3: NeuronLink-v4, 2.56 TB/s per chip
        physical_cores=8,  # Trainium3: 8 x NeuronCore-v4
    ),
}


@dataclass(frozen=True)
class Bound:
    """One end of the range: efficiencies (fraction of peak reached) and fixed overheads."""

    tensor_eff: float
    hbm_eff: float
    link_eff: float
    launch_s: float  # per eager op call and per compiled-graph run
    sync_s: float  # host round trip when the host waits for the device
    host_bps: float  # host <-> device bandwidth


# Low end: peak rates. High end: TensorE 0.5 lies between the naive (11%) and optimized (85%)
# matmul calibration points (docs/hardware-figures.md#calibration-points-and-assumptions); HBM
# 0.6 and NeuronLink 0.5 are assumptions.
# Launch, sync and host-link figures: assumptions, none is published (see ASSUMPTION lines).
LOW = Bound(tensor_eff=1.0, hbm_eff=1.0, link_eff=1.0, launch_s=5e-6, sync_s=10e-6, host_bps=25e9)
HIGH = Bound(tensor_eff=0.5, hbm_eff=0.6, link_eff=0.5, launch_s=15e-6, sync_s=50e-6, host_bps=10e9)
BOUNDS = (LOW, HIGH)

CLASSES = ("matmul", "vector", "data", "fallback", "launch", "graphs", "collectives")
MODES = ("eager", "compiled")

# --- op classes: the registry's (ops/registry.py), tested on base names ----------------
# FP8_COMPUTE: TensorE at the FP8 rate on Trainium3; elsewhere the device raises, so they cannot
# run there (estimate_step's "not_runnable").


def _in(name: str, cls: frozenset) -> bool:
    return registry.base_name(name) in cls


def _split_op(op: str) -> tuple[str, str, str]:
    """'aten::add.Tensor' -> ('aten', 'add', 'Tensor'); no overload -> 'default'."""
    namespace, _, rest = op.partition("::")
    if not rest:
        namespace, rest = "aten", namespace
    name, _, overload = rest.partition(".")
    return namespace, name, overload or "default"


def _moves_nothing(name: str) -> bool:
    """Allocation, views and metadata changes: no data moves."""
    return registry.is_allocation(name) or _in(name, registry.VIEWS) or _in(name, registry.METADATA)


def _is_data(name: str) -> bool:
    return _moves_nothing(name) or registry.is_copy(name) or _in(name, registry.HOST_SYNC)


def _engine(name: str, flops: int, nbytes: int) -> str:
    if flops > 0 and registry.is_tensor_engine(name):
        return "tensor"
    if _is_data(name):
        return "data"
    return "vector" if (flops or nbytes) else "none"


# --- tensors described as dicts -------------------------------------------------------------

def _torch_dtype(name: str):
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _tensor_bytes(arg) -> int:
    dtype = _torch_dtype(arg["dtype"])
    return math.prod(arg["shape"]) * dtype.itemsize if dtype is not None else 0


def _result_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_result_bytes(v) for v in value)
    return 0


# --- the meta run ------------------------------------------------------------------------------

def _meta_tensor(arg, column_major: bool):
    dtype = _torch_dtype(arg["dtype"])
    if dtype is None:
        raise TypeError(f"unknown dtype {arg['dtype']!r}")
    shape = list(arg["shape"])
    if column_major and len(shape) == 2:
        # Signatures carry no strides, and some meta kernels (_scaled_mm's mat2) need column-major.
        return torch.empty(shape[::-1], dtype=dtype, device="meta").t()
    return torch.empty(shape, dtype=dtype, device="meta")


def _meta_value(arg, schema_type: str, column_major: bool):
    if is_tensor(arg):
        return _meta_tensor(arg, column_major)
    if isinstance(arg, (list, tuple)):
        return [_meta_value(a, "", column_major) for a in arg]
    if isinstance(arg, dict):
        return None  # {"type": "Generator"}: an optional object that does not change shapes
    if isinstance(arg, str) and "Device" in schema_type:
        return torch.device("meta")  # the meta run stays on meta whatever device was asked
    if isinstance(arg, str) and ("ScalarType" in schema_type or "int" in schema_type):
        dtype = _torch_dtype(arg)  # dtype/layout/memory_format recorded by name
        return dtype if dtype is not None else getattr(torch, arg.removeprefix("torch."))
    return arg


def _run_meta(overload, args: list, column_major: bool) -> tuple[int, int]:
    """(FLOPs, output bytes) of one meta run; raises whatever the op raises."""
    positional, keywords = [], {}
    schema_args = overload._schema.arguments
    for i, arg in enumerate(args):
        schema = schema_args[i] if i < len(schema_args) else None
        # column_major applies to operands after the first (mat2 of _scaled_mm and the like).
        value = _meta_value(arg, str(schema.type) if schema else "", column_major and i > 0)
        if schema is not None and schema.kwarg_only:
            keywords[schema.name] = value
        else:
            positional.append(value)
    with warnings.catch_warnings(), FlopCounterMode(display=False) as counter:
        warnings.simplefilter("ignore")
        out = overload(*positional, **keywords)
    return int(counter.get_total_flops()), _result_bytes(out)


def _overload(op: str):
    namespace, name, overload = _split_op(op)
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


_WORK_CACHE: dict[tuple[str, str], dict] = {}


def op_work(op: str, args: list) -> dict:
    """FLOPs, bytes moved and engine of one call: ``{"flops", "bytes", "engine"}``; never raises.

    FLOPs are PyTorch's own formulas (FlopCounterMode) on a meta run of the overload; bytes are
    tensor inputs + outputs. When the meta run fails (no meta kernel, an object argument the op
    needs), flops is 0 and bytes is the inputs counted twice (read, and a result of that size).
    """
    work = _work(op, args)
    return {"flops": work["flops"], "bytes": work["bytes"], "engine": work["engine"]}


def _work(op: str, args: list) -> dict:
    """op_work's answer plus "meta": whether the meta run succeeded; cached per (op, args repr)."""
    key = (op, repr(args))
    if key not in _WORK_CACHE:
        try:
            _WORK_CACHE[key] = _compute_work(op, args)
        except Exception:  # noqa: BLE001 - a malformed signature: no work known, keep going
            _WORK_CACHE[key] = {"flops": 0, "bytes": 0, "engine": "none", "meta": False}
    return _WORK_CACHE[key]


def _compute_work(op: str, args: list) -> dict:
    name = _split_op(op)[1]
    in_bytes = sum(_tensor_bytes(t) for t in tensors(args))
    flops, nbytes, ran = 0, 2 * in_bytes, False
    # A second try with column-major 2-D operands, for the matmul kernels that require it.
    for column_major in (False, True) if registry.is_tensor_engine(name) else (False,):
        try:
            flops, out_bytes = _run_meta(_overload(op), list(args), column_major)
        except Exception:  # noqa: BLE001 - any failure of the meta run means "work unknown"
            continue
        nbytes, ran = in_bytes + out_bytes, True
        break
    if not flops and name in _FORMULAS:
        flops = _FORMULAS[name](args)
    return {"flops": flops, "bytes": nbytes, "engine": _engine(name, flops, nbytes), "meta": ran}


def _shape(arg) -> list[int]:
    return list(arg["shape"])


def _attention_flops(q, k, v) -> int:
    return int(flop_counter.sdpa_flop_count(_shape(q), _shape(k), _shape(v)))


def _attention_backward_flops(grad, q, k, v) -> int:
    return int(flop_counter.sdpa_backward_flop_count(_shape(grad), _shape(q), _shape(k), _shape(v)))


# The attention kernels the device runs scaled_dot_product_attention as (TorchNeuron's
# overrideable ones, csrc/Kernels.cpp sdpaChoice; the CPU flash kernel a compiled or direct
# call may hold) have no formula in PyTorch's FLOP counter; their FLOPs are those of the
# attention they compute, PyTorch's sdpa formulas (grouped-query attention included).
def _linear_backward_flops(a) -> int:
    """input's and weight's gradients, each a matmul of 2 * rows * in * out where
    the output mask asks for it (the bias gradient is a sum)."""
    rows = math.prod(_shape(a[0])[:-1])
    out_features, in_features = _shape(a[2])
    return 2 * rows * in_features * out_features * (bool(a[3][0]) + bool(a[3][1]))


_FORMULAS = {
    "linear_backward": _linear_backward_flops,  # its only kernels are MKL-DNN's: no meta run
    "_scaled_dot_product_fused_attention_overrideable": lambda a: _attention_flops(a[0], a[1], a[2]),
    "_scaled_dot_product_fused_attention_overrideable_backward":
        lambda a: _attention_backward_flops(a[0], a[1], a[2], a[3]),
    "_scaled_dot_product_flash_attention_for_cpu": lambda a: _attention_flops(a[0], a[1], a[2]),
    "_scaled_dot_product_flash_attention_for_cpu_backward":
        lambda a: _attention_backward_flops(a[0], a[1], a[2], a[3]),
    # Its meta run, on the meta device, applies CUDA's size rules (multiples of 16), which the
    # neuron device does not have: 2 M K N, K counting both float4 values of a byte.
    "_scaled_mm": lambda a: 2 * _shape(a[0])[0] * _shape(a[0])[1] * _shape(a[1])[1]
    * (2 if a[0]["dtype"] == "float4_e2m1fn_x2" else 1),
}
_FORMULAS["_scaled_mm_v2"] = _FORMULAS["_scaled_mm"]  # the same operands first (torch.nn.functional.scaled_mm)


# --- rates of one logical core -----------------------------------------------------------------

@dataclass(frozen=True)
class CoreRates:
    bf16: float  # FLOP/s
    fp8: float
    fp32: float
    hbm: float  # B/s
    link: float  # B/s, the chip's NeuronLink (shared by its cores)


def core_rates(profile: InstanceProfile) -> CoreRates:
    """Per logical core = chip rate / physical cores per chip * LNC."""
    chip = TARGET_RATES.get(profile.platform)
    if chip is None:
        raise ValueError(
            f"No chip rates for {profile.name} ({profile.platform}): the estimate uses published chip "
            f"figures ({CHIP}) for {', '.join(sorted(TARGET_RATES))} only, so there is no estimate for it.")
    share = profile.lnc / chip.physical_cores
    return CoreRates(chip.bf16_tflops * TERA * share, chip.fp8_tflops * TERA * share,
                     chip.fp32_tflops * TERA * share, chip.hbm_tbps * TERA * share,
                     chip.neuronlink_tbps * TERA)


class _Notes(list):
    """Assumption lines, each once, in order of first use."""

    def add(self, line: str) -> None:
        if line not in self:
            self.append(line)


def _peak(dtype: str, rates: CoreRates, profile: InstanceProfile, notes: _Notes) -> float:
    """TensorE peak FLOP/s for an operand dtype on this target."""
    if dtype in ("bfloat16", "float16"):
        return rates.bf16
    if dtype.startswith("float8"):
        if profile.fp8:
            return rates.fp8
        notes.add(f"{profile.name}: float8 matmuls are costed at the BF16 rate: TorchNeuron documents "
                  f"FP8 compute (_scaled_mm, MXFP8) for Trainium3 only ({FIGURES}#fp8-compute), "
                  f"although the {profile.platform} chip lists an FP8 figure ({CHIP}).")
        return rates.bf16
    if dtype == "float64":
        notes.add("float64 matmuls are costed at the FP32 rate: Trainium has no fp64 and the "
                  "backend computes float64 as float32.")
    elif dtype == "float32":
        notes.add("float32 matmuls are costed at the FP32 rate (no automatic cast to bf16 assumed).")
    else:
        notes.add(f"{dtype} matmuls are costed at the FP32 rate (no rate is published for {dtype}).")
    return rates.fp32


def _op_dtype(args: list) -> str:
    """The operand dtype that sets the matmul rate: the first floating tensor's."""
    described = list(tensors(args))
    for t in described:
        dtype = _torch_dtype(t["dtype"])
        if dtype is not None and dtype.is_floating_point:
            return str(dtype).removeprefix("torch.")
    return str(described[0]["dtype"]).removeprefix("torch.") if described else "float32"


def _device_is_host(arg) -> bool:
    return isinstance(arg, dict) and str(arg.get("device", "")).startswith("cpu")


def _transfer(name: str, args: list) -> tuple[str, int] | None:
    """('d2h' | 'h2d', bytes) when a copy crosses the host link, else None."""
    if name == "copy_" and len(args) >= 2 and is_tensor(args[0]) and is_tensor(args[1]):
        src, dst_host = args[1], _device_is_host(args[0])
    elif name.startswith("_copy_from") and len(args) >= 2 and is_tensor(args[0]) and is_tensor(args[1]):
        src, dst_host = args[0], _device_is_host(args[1])
    elif name == "_to_copy" and len(args) >= 4 and isinstance(args[3], str) and is_tensor(args[0]):
        src, dst_host = args[0], args[3].startswith("cpu")
    else:
        return None
    if dst_host == _device_is_host(src):
        return None
    return ("d2h" if dst_host else "h2d"), _tensor_bytes(src)


def _data_seconds(name: str, args: list, work: dict, rates: CoreRates, b: Bound) -> float:
    if _in(name, registry.HOST_SYNC):
        return b.sync_s
    if _moves_nothing(name):
        return 0.0
    transfer = _transfer(name, args)
    if transfer is not None:
        direction, nbytes = transfer
        return nbytes / b.host_bps + (b.sync_s if direction == "d2h" else 0.0)
    return work["bytes"] / (rates.hbm * b.hbm_eff)


def _device_op(sig: dict, work: dict, rates, profile, notes) -> tuple[str, list[float]]:
    """(class, [low, high] seconds) of one call of a native/direct op."""
    name = _split_op(sig["op"])[1]
    args = sig.get("args", [])
    if _in(name, registry.FP8_COMPUTE) and not profile.fp8:
        notes.add(f"{profile.name}: torch.{name} cannot run there (FP8 compute needs Trainium3; the "
                  "device raises \"FP8 compute needs Trainium3\", docs/fp8.md): its calls are costed at "
                  "the BF16 rate, as if rewritten in bfloat16.")
    if work["engine"] == "tensor":
        peak = _peak(_op_dtype(args), rates, profile, notes)
        return "matmul", [max(work["flops"] / (peak * b.tensor_eff), work["bytes"] / (rates.hbm * b.hbm_eff))
                          for b in BOUNDS]
    if work["engine"] == "data":
        return "data", [_data_seconds(name, args, work, rates, b) for b in BOUNDS]
    return "vector", [work["bytes"] / (rates.hbm * b.hbm_eff) for b in BOUNDS]


def _fallback_op(sig: dict, work: dict) -> list[float]:
    """Host time as measured + operands both ways over the host link + one sync, per call."""
    host_s = float(sig.get("host_ns_per_call", 0.0)) * 1e-9
    return [host_s + trip for trip in _round_trip(work)]


def _round_trip(work: dict) -> list[float]:
    return [work["bytes"] / b.host_bps + b.sync_s for b in BOUNDS]


def fallback_round_trip_s(sig: dict) -> float:
    """What one call of a CPU-fallback signature adds on Trainium to its host time (low figure:
    its operands over the host link and one sync); the audit's fallback actions add it."""
    return _round_trip(_work(sig["op"], sig.get("args", [])))[0]


def _graph(graph: dict, rates: CoreRates, profile: InstanceProfile, notes: _Notes) -> list[float]:
    """One run of a compiled graph: roofline of XLA's cost analysis (launch counted apart)."""
    flops, nbytes = float(graph.get("flops", 0)), float(graph.get("bytes_accessed", 0))
    if flops <= 0 and nbytes <= 0:
        notes.add(f"Compiled graph {graph.get('name', '?')!r} has no cost analysis (flops and bytes 0): "
                  "only its launches are counted, a lower bound.")
    if graph.get("dtype"):
        peaks = (_peak(str(graph["dtype"]), rates, profile, notes),) * 2
    else:
        notes.add("Compiled graphs without a recorded dtype: cost-analysis FLOPs at the BF16 rate (low "
                  "end) and at the FP32 rate (high end).")
        peaks = (rates.bf16, rates.fp32)
    return [max(flops / (peak * b.tensor_eff), nbytes / (rates.hbm * b.hbm_eff))
            for peak, b in zip(peaks, BOUNDS)]


# Fraction of the buffer each rank sends, ring algorithms; bytes = the full buffer.
def _collective_factor(op: str, n: int, notes: _Notes) -> float:
    name = op.split("::")[-1].rstrip("_").removesuffix("_into_tensor").removesuffix("_tensor")
    name = name.removeprefix("_").removesuffix("_base")
    if n <= 1 or name == "barrier":
        return 0.0
    if name in ("all_reduce", "allreduce"):
        return 2 * (n - 1) / n
    if name in ("all_gather", "allgather", "reduce_scatter", "all_to_all", "all_to_all_single", "alltoall"):
        return (n - 1) / n
    if name in ("broadcast", "send", "recv", "reduce", "scatter", "gather"):
        return 1.0
    notes.add(f"Collective {op!r} is not modelled: costed as a ring all-reduce of its bytes.")
    return 2 * (n - 1) / n


def _collective(coll: dict, rates: CoreRates, notes: _Notes) -> list[float]:
    factor = _collective_factor(str(coll.get("op", "")), int(coll.get("world_size", 1)), notes)
    return [factor * float(coll.get("bytes", 0)) / (rates.link * b.link_eff) for b in BOUNDS]


def _profile(profile) -> InstanceProfile:
    if isinstance(profile, InstanceProfile):
        return profile
    if profile in PROFILES:
        return PROFILES[profile]
    raise ValueError(f"Unknown instance {profile!r}: use one of {', '.join(sorted(PROFILES))}.")


def _base_assumptions(profile: InstanceProfile, rates: CoreRates, mode: str) -> list[str]:
    chip = TARGET_RATES[profile.platform]
    fp8 = f"FP8 {rates.fp8 / TERA:.2f} TFLOPS" if profile.fp8 else "FP8 not used (BF16 rate instead)"
    launch_scope = "each native/direct op call and each compiled-graph run" if mode == "eager" \
        else "each compiled-graph run (compiled mode: no per-op launches)"
    return [
        f"{profile.name} ({profile.platform}, {profile.core_generation}): LNC={profile.lnc}, so one logical "
        f"core = {profile.lnc} of the chip's {chip.physical_cores} physical cores; per-logical-core rates "
        f"used: dense BF16 {rates.bf16 / TERA:.2f} TFLOPS, {fp8}, FP32 {rates.fp32 / TERA:.2f} TFLOPS, "
        f"HBM {rates.hbm / TERA:.4f} TB/s (chip rates of {CHIP} / {chip.physical_cores} x LNC).",
        "The step time is that of one process on one logical core (one process per core, ranks in "
        "parallel); ops run back to back, with no overlap of compute, memory and communication.",
        "Per op: TensorE ops (matmul/conv/attention) take max(FLOPs / peak, bytes / HBM bandwidth); other "
        "ops are memory bound, bytes / HBM bandwidth. FLOPs are PyTorch's flop_counter formulas and bytes "
        "the tensor inputs + outputs, both from a meta-tensor run of the op.",
        f"Range: low end at peak rates (efficiency 1.0); high end at TensorE efficiency {HIGH.tensor_eff}, "
        f"HBM efficiency {HIGH.hbm_eff}, NeuronLink efficiency {HIGH.link_eff} (assumptions; TensorE "
        f"0.5 lies between the naive 11% and optimized 85% matmul calibration points of {CALIBRATION}).",
        f"Launch overhead: {LOW.launch_s * 1e6:g} us (low) to {HIGH.launch_s * 1e6:g} us (high) for "
        f"{launch_scope}; an assumption: no published per-op launch figure for TorchNeuron eager mode "
        f"was found in the stored Neuron documentation (searched {SEARCHED_ON}).",
        f"Host <-> device link: {LOW.host_bps / GIGA:g} GB/s (low) to {HIGH.host_bps / GIGA:g} GB/s "
        "(high) for CPU-fallback operands and host/device copies; an assumption (PCIe class; "
        f"{CHIP} has no host-link figure).",
        f"Host round trip per sync (_local_scalar_dense/.item(), device-to-host copy, each CPU-fallback "
        f"call waiting for the device): {LOW.sync_s * 1e6:g} us (low) to {HIGH.sync_s * 1e6:g} us "
        "(high); an assumption.",
        "CPU-fallback ops: the host time per call measured on the emulator, as measured (the "
        "instance's host CPU may be faster or slower), plus their tensor bytes both ways over the "
        "host link and one sync.",
        "Views, allocations (empty*) and set_/resize_ take no device time (metadata only).",
    ]


def estimate_step(signatures, graphs, collectives, profile, mode: str = "eager",
                  fused_launches: float | None = None) -> dict:
    """Step-time range of the recorded per-step work on one target instance profile.

    ``by_class`` maps matmul, vector, data, fallback, launch, graphs, collectives to [low, high]
    seconds per step; ``low_s``/``high_s`` are their sums. "launch" holds the launches of eager
    op calls (mode "eager" only) and of compiled-graph runs (any mode). A graph may carry an
    optional "dtype" (its matmul dtype); without it the range spans the BF16 and FP32 rates.
    ``not_runnable`` lists the recorded ops the instance cannot run (FP8 compute off Trainium3);
    they are costed at the BF16 rate, as if rewritten. ``fused_launches`` (eager mode): the
    launches per step after Adaptive Eager Execution's fusion (audit/fusion.py), which then
    replace one launch per op call.
    Raises ValueError for an unknown mode or instance, or a platform without published rates (trn1).
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(MODES)}.")
    profile = _profile(profile)
    rates = core_rates(profile)
    notes = _Notes(_base_assumptions(profile, rates, mode))
    by_class = {c: [0.0, 0.0] for c in CLASSES}

    def add(cls: str, per_call: list[float], times: float) -> None:
        for i, seconds in enumerate(per_call):
            by_class[cls][i] += seconds * times

    no_flops = 0
    not_runnable = set()
    for sig in signatures or ():
        calls = float(sig.get("calls_per_step", 0.0))
        if _in(sig["op"], registry.FP8_COMPUTE) and not profile.fp8:
            not_runnable.add(sig["op"])
        work = _work(sig["op"], sig.get("args", []))
        no_flops += not work["meta"]
        if sig.get("path") == "fallback":
            add("fallback", _fallback_op(sig, work), calls)
            continue
        cls, seconds = _device_op(sig, work, rates, profile, notes)
        add(cls, seconds, calls)
        if mode == "eager" and fused_launches is None:
            add("launch", [LOW.launch_s, HIGH.launch_s], calls)
    if mode == "eager" and fused_launches is not None:
        add("launch", [LOW.launch_s, HIGH.launch_s], fused_launches)
        notes.add(f"Eager launches: {fused_launches:.4g} per step, as Adaptive Eager Execution "
                  "(TORCH_NEURONX_ENABLE_CONCATENATION=1, on in this run) would fuse the op calls "
                  "(the audit's model of it: the report's fusion section); the ops' compute is costed "
                  "one by one as without fusion.")
    if no_flops:
        notes.add(f"{no_flops} op signature(s) could not run on meta tensors (no meta kernel or an "
                  "argument that cannot be rebuilt): their FLOPs count as 0 and their bytes as the "
                  "inputs twice.")

    for graph in graphs or ():
        runs = float(graph.get("runs_per_step", 0.0))
        add("graphs", _graph(graph, rates, profile, notes), runs)
        add("launch", [LOW.launch_s, HIGH.launch_s], runs)
    if graphs:
        notes.add("Compiled graphs: per run, the larger of XLA's cost-analysis FLOPs / TensorE peak "
                  "and bytes_accessed / HBM bandwidth, plus one launch.")

    for coll in collectives or ():
        add("collectives", _collective(coll, rates, notes), float(coll.get("calls_per_step", 0.0)))
    if collectives:
        chip = TARGET_RATES[profile.platform]
        notes.add(f"Collectives: ring all-reduce moves 2(n-1)/n x bytes, all_gather/reduce_scatter "
                  f"(n-1)/n x bytes, over NeuronLink at {chip.neuronlink_tbps} TB/s per chip "
                  f"({CHIP}, {profile.platform}); the chip's cores share it, so this is "
                  "optimistic when several ranks on one chip communicate at once; bandwidth term "
                  "only, no latency term.")

    return {
        "instance": profile.name,
        "low_s": sum(v[0] for v in by_class.values()),
        "high_s": sum(v[1] for v in by_class.values()),
        "by_class": by_class,
        "assumptions": list(notes),
        "not_runnable": sorted(not_runnable),
        "label": "estimate",
    }
