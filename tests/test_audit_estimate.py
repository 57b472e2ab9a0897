"""The audit's step-time model (torch_neuronx/audit/estimate.py) and cost table (prices.py).

FLOPs are checked against PyTorch's FlopCounterMode on real CPU tensors of the same shapes; the
step model against hand-computed rooflines from the chip rates of docs/hardware-figures.md#chip-figures.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from torch_neuronx.audit import estimate as est
from torch_neuronx.audit import prices
from torch_neuronx.neuron.profiles import PROFILES


def T(*shape, dtype="float32", device="neuron:0"):
    return {"dtype": dtype, "shape": list(shape), "device": device}


def cpu_flops(fn, *args, **kwargs) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def sig(op, args, calls=1.0, path="native", host_ns=1000.0):
    return {"op": op, "path": path, "args": args, "calls_per_step": calls, "host_ns_per_call": host_ns}


# --- op_work ---------------------------------------------------------------------------------

def test_mm_flops_are_2mnk_and_match_flop_counter_on_cpu():
    m, k, n = 12, 40, 24
    work = est.op_work("aten::mm", [T(m, k), T(k, n)])
    assert work["flops"] == 2 * m * n * k
    assert work["flops"] == cpu_flops(torch.mm, torch.randn(m, k), torch.randn(k, n))
    assert work["bytes"] == (m * k + k * n + m * n) * 4
    assert work["engine"] == "tensor"


def test_addmm_and_bmm_match_flop_counter_on_cpu():
    addmm = est.op_work("aten::addmm", [T(24), T(12, 40), T(40, 24), 1, 1])
    assert addmm["flops"] == cpu_flops(torch.addmm, torch.randn(24), torch.randn(12, 40), torch.randn(40, 24))
    assert addmm["flops"] > 0 and addmm["engine"] == "tensor"
    bmm = est.op_work("aten::bmm", [T(3, 8, 16, dtype="bfloat16"), T(3, 16, 32, dtype="bfloat16")])
    assert bmm["flops"] == 2 * 3 * 8 * 16 * 32
    assert bmm["flops"] == cpu_flops(torch.bmm, torch.randn(3, 8, 16), torch.randn(3, 16, 32))
    assert bmm["bytes"] == (3 * 8 * 16 + 3 * 16 * 32 + 3 * 8 * 32) * 2


def test_conv2d_matches_flop_counter_on_cpu():
    x, w, b = torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3), torch.randn(8)
    expected = cpu_flops(F.conv2d, x, w, b, stride=2, padding=1)
    args = [T(2, 3, 16, 16), T(8, 3, 3, 3), T(8), [2, 2], [1, 1], [1, 1], False, [0, 0], 1]
    work = est.op_work("aten::convolution", args)
    assert expected > 0 and work["flops"] == expected
    assert work["engine"] == "tensor"


def test_scaled_mm_fp8_runs_on_meta_despite_missing_strides():
    # _scaled_mm's meta kernel wants a column-major mat2; signatures carry no strides.
    args = [T(16, 32, dtype="float8_e4m3fn"), T(32, 64, dtype="float8_e4m3fn"), T(), T(),
            None, None, "bfloat16", False]
    work = est.op_work("aten::_scaled_mm", args)
    assert work["flops"] == 2 * 16 * 32 * 64 and work["engine"] == "tensor"


def test_elementwise_bytes_are_inputs_plus_output():
    work = est.op_work("aten::add.Tensor", [T(64, 32), T(64, 32), 1])
    assert work == {"flops": 0, "bytes": 3 * 64 * 32 * 4, "engine": "vector"}
    # Broadcast: the output has the large shape.
    work = est.op_work("aten::mul.Tensor", [T(64, 32, dtype="bfloat16"), T(32, dtype="bfloat16")])
    assert work["bytes"] == (64 * 32 + 32 + 64 * 32) * 2


def test_failing_meta_ops_give_zero_flops_without_raising():
    scalar = est.op_work("aten::_local_scalar_dense", [T(dtype="int64")])  # no meta kernel
    assert scalar == {"flops": 0, "bytes": 2 * 8, "engine": "data"}
    unknown = est.op_work("aten::no_such_op.Tensor", [T(4, 4), {"type": "Generator"}, "x"])
    assert unknown["flops"] == 0 and unknown["bytes"] == 2 * 16 * 4
    bad_dtype = est.op_work("aten::mm", [T(4, 4, dtype="float99"), T(4, 4)])
    assert bad_dtype["flops"] == 0
    odd = est.op_work("neuron::missing", [[T(2)], None, {"type": "ProcessGroup"}])
    assert odd["flops"] == 0
    malformed = est.op_work("aten::mm", [{"dtype": "float32", "shape": ["x"], "device": "neuron:0"}])
    assert malformed["flops"] == 0 and malformed["engine"] == "none"


def test_generator_and_kwarg_only_arguments_are_rebuilt():
    work = est.op_work("aten::bernoulli", [T(8, 8), {"type": "Generator"}])
    assert work["bytes"] == 2 * 8 * 8 * 4  # ran on meta: input + output
    cast = est.op_work("aten::_to_copy", [T(8, 8), "bfloat16", None, "neuron:0", None, False, None])
    assert cast["bytes"] == 8 * 8 * 4 + 8 * 8 * 2 and cast["engine"] == "data"


def test_engine_classes():
    assert est.op_work("aten::empty.memory_format", [[4, 4], "float32", None, "neuron:0", None, None])[
        "engine"] == "data"
    assert est.op_work("aten::view", [T(4, 4), [16]])["engine"] == "data"
    assert est.op_work("aten::copy_", [T(4, 4), T(4, 4), False])["engine"] == "data"
    assert est.op_work("aten::relu", [T(4, 4)])["engine"] == "vector"


def test_op_work_is_cached_and_callers_cannot_corrupt_the_cache():
    args = [T(5, 7), T(7, 3)]
    first = est.op_work("aten::mm", args)
    first["flops"] = -1
    assert est.op_work("aten::mm", args)["flops"] == 2 * 5 * 7 * 3
    assert ("aten::mm", repr(args)) in est._WORK_CACHE


# --- estimate_step ---------------------------------------------------------------------------

MIXED = [
    sig("aten::mm", [T(2048, 2048, dtype="bfloat16"), T(2048, 2048, dtype="bfloat16")], calls=3),
    sig("aten::add.Tensor", [T(1024, 1024), T(1024, 1024), 1], calls=10),
    sig("aten::view", [T(1024, 1024), [-1]], calls=4),
    sig("aten::_local_scalar_dense", [T()], calls=1),
    sig("aten::_to_copy", [T(256, 256), None, None, "cpu", None, False, None], calls=1),
    sig("aten::sort", [T(4096), -1, False], calls=2, path="fallback", host_ns=80_000),
    sig("aten::mm", [T(64, 64), T(64, 64)], calls=1, path="direct"),
]
GRAPHS = [{"name": "fwd", "runs_per_step": 1, "flops": 4e11, "bytes_accessed": 2e9, "host_ns_per_run": 5e6},
          {"name": "opaque", "runs_per_step": 2, "flops": 0, "bytes_accessed": 0, "host_ns_per_run": 1e5}]
COLLS = [{"op": "all_reduce", "bytes": 64 << 20, "calls_per_step": 1, "world_size": 8},
         {"op": "all_gather_into_tensor", "bytes": 8 << 20, "calls_per_step": 2, "world_size": 8}]
TARGETS = [name for name, p in PROFILES.items() if p.platform in est.TARGET_RATES]


def test_bf16_matmul_roofline_by_hand():
    m = n = k = 4096
    result = est.estimate_step([sig("aten::mm", [T(m, k, dtype="bfloat16"), T(k, n, dtype="bfloat16")])],
                               [], [], PROFILES["trn2.3xlarge"])
    per_core_bf16 = 667e12 / 8 * 2  # docs/hardware-figures.md#chip-figures, 8 physical cores, LNC=2
    compute = 2 * m * n * k / per_core_bf16
    assert compute > 3 * m * n * 2 / (2.9e12 / 8 * 2)  # compute bound
    assert result["by_class"]["matmul"] == pytest.approx([compute, compute / 0.5])
    assert result["by_class"]["launch"] == pytest.approx([5e-6, 15e-6])
    assert result["low_s"] == pytest.approx(compute + 5e-6)
    assert result["instance"] == "trn2.3xlarge" and result["label"] == "estimate"


def test_time_scales_linearly_with_calls_per_step():
    once = est.estimate_step([dict(s, calls_per_step=1) for s in MIXED], [], [], "trn2.48xlarge")
    thrice = est.estimate_step([dict(s, calls_per_step=3) for s in MIXED], [], [], "trn2.48xlarge")
    assert thrice["low_s"] == pytest.approx(3 * once["low_s"])
    assert thrice["high_s"] == pytest.approx(3 * once["high_s"])
    for cls, (low, high) in once["by_class"].items():
        assert thrice["by_class"][cls] == pytest.approx([3 * low, 3 * high])


def test_trn3_bf16_matmul_is_not_slower_than_trn2():
    mm = [sig("aten::mm", [T(8192, 8192, dtype="bfloat16"), T(8192, 8192, dtype="bfloat16")])]
    for size in ("3xlarge", "48xlarge"):
        trn2 = est.estimate_step(mm, [], [], f"trn2.{size}")
        trn3 = est.estimate_step(mm, [], [], f"trn3.{size}")
        assert trn3["by_class"]["matmul"][0] <= trn2["by_class"]["matmul"][0]
        assert trn3["by_class"]["matmul"][1] <= trn2["by_class"]["matmul"][1]


def test_fp8_matmul_on_trn2_gets_the_bf16_rate_and_says_so():
    shape = (8192, 8192)
    fp8 = [sig("aten::mm", [T(*shape, dtype="float8_e4m3fn"), T(*shape, dtype="float8_e4m3fn")])]
    bf16 = [sig("aten::mm", [T(*shape, dtype="bfloat16"), T(*shape, dtype="bfloat16")])]
    on_trn2 = est.estimate_step(fp8, [], [], "trn2.48xlarge")
    assert on_trn2["by_class"]["matmul"] == pytest.approx(
        est.estimate_step(bf16, [], [], "trn2.48xlarge")["by_class"]["matmul"])
    lines = [a for a in on_trn2["assumptions"] if "float8" in a]
    assert lines and "BF16 rate" in lines[0] and "trn2.48xlarge" in lines[0]
    # trn3 has FP8: faster than its own bf16, and no such assumption line.
    on_trn3 = est.estimate_step(fp8, [], [], "trn3.48xlarge")
    bf16_on_trn3 = est.estimate_step(bf16, [], [], "trn3.48xlarge")
    assert on_trn3["by_class"]["matmul"][0] < bf16_on_trn3["by_class"]["matmul"][0]
    assert not [a for a in on_trn3["assumptions"] if "float8" in a]


def test_fallback_time_is_at_least_the_measured_host_time():
    fallback = [sig("aten::sort", [T(1 << 16), -1, False], calls=5, path="fallback", host_ns=250_000)]
    result = est.estimate_step(fallback, [], [], "trn2.3xlarge")
    low, high = result["by_class"]["fallback"]
    assert low >= 5 * 250_000e-9 and high >= low
    assert result["by_class"]["launch"] == [0.0, 0.0]  # host ops launch nothing on the device
    # The tensor bytes go both ways over the host link: more bytes, more time.
    bigger = est.estimate_step([dict(fallback[0], args=[T(1 << 20), -1, False])], [], [], "trn2.3xlarge")
    assert bigger["by_class"]["fallback"][0] > low


@pytest.mark.parametrize("target", TARGETS)
def test_low_never_exceeds_high_and_assumptions_are_lines(target):
    result = est.estimate_step(MIXED, GRAPHS, COLLS, target)
    assert set(result["by_class"]) == set(est.CLASSES)
    for cls, (low, high) in result["by_class"].items():
        assert 0 <= low <= high, cls
    assert 0 < result["low_s"] <= result["high_s"]
    assert result["low_s"] == pytest.approx(sum(v[0] for v in result["by_class"].values()))
    assert all(isinstance(a, str) and a.strip() for a in result["assumptions"])
    assert len(set(result["assumptions"])) == len(result["assumptions"])
    first = result["assumptions"][0]
    assert target in first and f"LNC={PROFILES[target].lnc}" in first and "TFLOPS" in first
    assert any("'opaque'" in a for a in result["assumptions"])  # graph without cost analysis
    assert any("could not run on meta" in a for a in result["assumptions"])  # _local_scalar_dense


def test_syncs_views_and_host_copies():
    result = est.estimate_step([sig("aten::view", [T(1024, 1024), [-1]], calls=100)], [], [], "trn2.3xlarge")
    assert result["by_class"]["data"] == [0.0, 0.0]
    sync = est.estimate_step([sig("aten::_local_scalar_dense", [T()])], [], [], "trn2.3xlarge")
    assert sync["by_class"]["data"] == pytest.approx([est.LOW.sync_s, est.HIGH.sync_s])
    d2h = est.estimate_step([sig("aten::_to_copy", [T(1024, 1024), None, None, "cpu", None, False, None])],
                            [], [], "trn2.3xlarge")
    nbytes = 1024 * 1024 * 4
    assert d2h["by_class"]["data"] == pytest.approx(
        [nbytes / est.LOW.host_bps + est.LOW.sync_s, nbytes / est.HIGH.host_bps + est.HIGH.sync_s])


def test_graphs_and_collectives_by_hand():
    graph = {"name": "step", "runs_per_step": 2, "flops": 1e12, "bytes_accessed": 1e6,
             "host_ns_per_run": 1, "dtype": "bfloat16"}
    result = est.estimate_step([], [graph], [], "trn3.3xlarge", mode="compiled")
    per_run = 1e12 / (671e12 / 8 * 2)
    assert result["by_class"]["graphs"] == pytest.approx([2 * per_run, 2 * per_run / 0.5])
    assert result["by_class"]["launch"] == pytest.approx([2 * 5e-6, 2 * 15e-6])

    n, nbytes = 4, 1 << 30
    colls = [{"op": "all_reduce", "bytes": nbytes, "calls_per_step": 1, "world_size": n},
             {"op": "reduce_scatter", "bytes": nbytes, "calls_per_step": 1, "world_size": n},
             {"op": "all_reduce", "bytes": nbytes, "calls_per_step": 1, "world_size": 1}]
    result = est.estimate_step([], [], colls, "trn2.48xlarge")
    expected = (2 * (n - 1) / n + (n - 1) / n) * nbytes / 1.28e12
    assert result["by_class"]["collectives"] == pytest.approx([expected, expected / 0.5])
    assert any("1.28 TB/s per chip" in a for a in result["assumptions"])


def test_compiled_mode_has_no_per_op_launches_and_bad_inputs_are_errors():
    mm = [sig("aten::mm", [T(64, 64), T(64, 64)], calls=10)]
    assert est.estimate_step(mm, [], [], "trn2.3xlarge", mode="compiled")["by_class"]["launch"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="mode"):
        est.estimate_step(mm, [], [], "trn2.3xlarge", mode="lazy")
    with pytest.raises(ValueError, match="trn9.big"):
        est.estimate_step(mm, [], [], "trn9.big")
    with pytest.raises(ValueError, match="hardware-figures.md"):  # no published trn1 rates
        est.estimate_step(mm, [], [], PROFILES["trn1.32xlarge"])


def test_target_rates_are_the_reference_figures_per_logical_core():
    assert set(est.TARGET_RATES) == {"trn2", "trn3"}
    rates = est.core_rates(PROFILES["trn2.48xlarge"])
    assert rates.bf16 == pytest.approx(667e12 / 4) and rates.fp32 == pytest.approx(181e12 / 4)
    assert rates.hbm == pytest.approx(2.9e12 / 4) and rates.link == pytest.approx(1.28e12)
    rates = est.core_rates(PROFILES["trn3.3xlarge"])
    assert rates.fp8 == pytest.approx(2517e12 / 4) and rates.hbm == pytest.approx(4.9e12 / 4)
    # NEURON_LOGICAL_NC_CONFIG=1: a logical core is one of the chip's 8 physical cores.
    rates = est.core_rates(PROFILES["trn3.3xlarge"].with_lnc(1))
    assert rates.bf16 == pytest.approx(671e12 / 8) and rates.hbm == pytest.approx(4.9e12 / 8)


# --- prices ----------------------------------------------------------------------------------

def test_parse_price():
    assert prices.parse_price("trn2.48xlarge=40.5") == ("trn2.48xlarge", 40.5)
    assert prices.parse_price(" trn1.2xlarge = 1.5 ") == ("trn1.2xlarge", 1.5)


@pytest.mark.parametrize("text, message", [
    ("trn2.48xlarge", "no '='"),
    ("=3", "no instance"),
    ("trn2.48xlarge=", "no price"),
    ("trn2.48xlarge=abc", "not a number"),
    ("trn2.48xlarge=-1", "greater than 0"),
    ("trn2.48xlarge=0", "greater than 0"),
    ("trn2.48xlarge=nan", "greater than 0"),
    ("trn2.48xlarge=inf", "greater than 0"),
])
def test_parse_price_errors_say_what_and_show_the_form(text, message):
    with pytest.raises(ValueError, match=message) as info:
        prices.parse_price(text)
    assert "INSTANCE=USD_PER_HOUR" in str(info.value) and "for example" in str(info.value)


def test_parse_baseline():
    assert prices.parse_baseline("p4d.24xlarge:0.85:32.77") == {
        "name": "p4d.24xlarge", "seconds_per_step": 0.85, "usd_per_hour": 32.77}
    assert prices.parse_baseline("gpu:a100:1:2")["name"] == "gpu:a100"


@pytest.mark.parametrize("text, message", [
    ("p4d:1", "three parts"),
    ("p4d", "three parts"),
    (":1:2", "empty name"),
    ("p4d:fast:2", "not a number"),
    ("p4d:1:cheap", "not a number"),
    ("p4d:0:2", "greater than 0"),
    ("p4d:1:-2", "greater than 0"),
    ("p4d::2", "not a number"),
])
def test_parse_baseline_errors_say_what_and_show_the_form(text, message):
    with pytest.raises(ValueError, match=message) as info:
        prices.parse_baseline(text)
    assert "NAME:SECONDS_PER_STEP:USD_PER_HOUR" in str(info.value)


def test_cost_table_arithmetic_by_hand():
    estimate = {"instance": "trn2.3xlarge", "low_s": 2.0, "high_s": 4.0}
    (row,) = prices.cost_table([estimate], {"trn2.3xlarge": 10.0}, 1000, "tokens")
    assert row["name"] == "trn2.3xlarge" and row["kind"] == "target" and row["unit"] == "tokens"
    assert row["seconds_per_step"] == [2.0, 4.0]
    assert row["seconds_per_unit"] == pytest.approx([0.002, 0.004])
    assert row["units_per_dollar"] == pytest.approx([180_000, 90_000])
    assert row["usd_per_million_units"] == pytest.approx([5.5556, 11.1111], abs=1e-4)
    assert row["usd_per_hour"] == 10.0 and row["work_per_dollar_vs_baseline"] is None


def test_cost_table_baseline_first_and_ratio():
    estimate = {"instance": "trn2.3xlarge", "low_s": 2.0, "high_s": 4.0}
    baseline = prices.parse_baseline("gpu:1:5")
    rows = prices.cost_table({"trn2.3xlarge": estimate}, {"trn2.3xlarge": 10.0}, 1000, "tokens", baseline)
    base, target = rows
    assert base["kind"] == "baseline" and base["name"] == "gpu"
    assert base["seconds_per_step"] == 1.0 and base["units_per_dollar"] == pytest.approx(720_000)
    assert base["work_per_dollar_vs_baseline"] == 1.0
    assert target["work_per_dollar_vs_baseline"] == pytest.approx([0.25, 0.125])


def test_cost_table_without_price_and_with_default_entries():
    estimates = [{"instance": "trn3.3xlarge", "low_s": 1.0, "high_s": 2.0},
                 {"instance": "trn1.32xlarge", "low_s": 1.0, "high_s": 2.0}]
    rows = prices.cost_table(estimates, prices.DEFAULT_PRICES, 10, "images", prices.parse_baseline("b:1:1"))
    unpriced, priced = rows[1], rows[2]
    assert unpriced["usd_per_hour"] is None and unpriced["units_per_dollar"] is None
    assert unpriced["usd_per_million_units"] is None and unpriced["work_per_dollar_vs_baseline"] is None
    assert unpriced["seconds_per_unit"] == pytest.approx([0.1, 0.2])
    assert priced["usd_per_hour"] == prices.DEFAULT_PRICES["trn1.32xlarge"]["usd_per_hour"]
    assert "usage.ai" in priced["price_source"]
    with pytest.raises(ValueError, match="units_per_step"):
        prices.cost_table(estimates, {}, 0, "images")


def test_default_prices_are_sourced_dated_and_for_known_instances():
    assert prices.DEFAULT_PRICES, "at least the published trn1.32xlarge figure"
    for name, entry in prices.DEFAULT_PRICES.items():
        assert name in PROFILES
        assert entry["usd_per_hour"] > 0 and math.isfinite(entry["usd_per_hour"])
        assert "http" in entry["source"] and entry["read"].count("-") == 2


def test_cpu_flash_attention_counts_the_attention_flops():
    """The device runs SDPA as the CPU flash kernel, which PyTorch's FLOP counter
    has no formula for: its FLOPs are those of the attention (sdpa formulas)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = {"dtype": "bfloat16", "shape": [2, 4, 128, 64], "device": "neuron:0"}
    k = dict(q, shape=[2, 4, 256, 64])
    work = est.op_work("aten::_scaled_dot_product_flash_attention_for_cpu", [q, k, k, 0.0, False, None, None])
    assert work["flops"] == sdpa_flop_count([2, 4, 128, 64], [2, 4, 256, 64], [2, 4, 256, 64]) > 0
    assert work["engine"] == "tensor"
    back = est.op_work("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                            [q, q, k, k, q, {"dtype": "float32", "shape": [2, 4, 128], "device": "neuron:0"},
                             0.0, False, None, None])
    assert back["flops"] == sdpa_backward_flop_count([2, 4, 128, 64], [2, 4, 128, 64], [2, 4, 256, 64],
                                                     [2, 4, 256, 64]) > 0


def test_overrideable_attention_counts_the_attention_flops():
    """SDPA on neuron runs TorchNeuron's overrideable kernels (ops/attention.py), which PyTorch's
    FLOP counter has no formula for: the sdpa formulas, grouped-query attention included."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = {"dtype": "bfloat16", "shape": [2, 8, 128, 64], "device": "neuron:0"}
    k = dict(q, shape=[2, 2, 256, 64])  # 4 query heads per key/value head
    lse = {"dtype": "float32", "shape": [2, 8, 128], "device": "neuron:0"}
    work = est.op_work("aten::_scaled_dot_product_fused_attention_overrideable", [q, k, k, None, 0.0, True])
    assert work["flops"] == sdpa_flop_count([2, 8, 128, 64], [2, 2, 256, 64], [2, 2, 256, 64])
    assert work["flops"] == 2 * 2 * (2 * 8 * 128 * 64 * 256) and work["engine"] == "tensor"
    back = est.op_work("aten::_scaled_dot_product_fused_attention_overrideable_backward",
                       [q, q, k, k, None, [True, True, True, False], q, lse, None, None, 128, 256, 0.0, True,
                        None, None])
    assert back["flops"] == sdpa_backward_flop_count([2, 8, 128, 64], [2, 8, 128, 64], [2, 2, 256, 64],
                                                     [2, 2, 256, 64]) > work["flops"]


def test_scaled_mm_costs_fp8_rate_on_trn3_and_is_not_runnable_on_trn2():
    """torch._scaled_mm / _scaled_grouped_mm: TensorE at the FP8 rate of docs/hardware-figures.md#chip-figures on trn3
    (2517 TFLOPS per chip); on trn2 the device raises, so the estimate lists them as not runnable
    (costed at the BF16 rate, as if rewritten) and says why."""
    m = k = n = 8192
    scaled = [sig("aten::_scaled_mm", [T(m, k, dtype="float8_e4m3fn"), T(k, n, dtype="float8_e4m3fn"),
                                       T(), T(), None, None, "bfloat16", False])]
    grouped = [sig("aten::_scaled_grouped_mm", [T(4 * 512, 1024, dtype="float8_e4m3fn"),
                                                T(4, 1024, 2048, dtype="float8_e4m3fn"),
                                                T(4 * 512), T(4, 2048), T(4, dtype="int32"), None, None,
                                                "bfloat16", False])]
    flops = 2 * m * k * n
    trn3 = est.estimate_step(scaled + grouped, [], [], "trn3.3xlarge")
    rates = est.core_rates(PROFILES["trn3.3xlarge"])
    assert rates.fp8 == pytest.approx(2517e12 * 2 / 8)
    assert trn3["not_runnable"] == []
    assert trn3["by_class"]["matmul"][0] >= flops / rates.fp8  # the grouped call adds its own
    assert trn3["by_class"]["matmul"][0] < flops / rates.bf16
    trn2 = est.estimate_step(scaled + grouped, [], [], "trn2.3xlarge")
    assert trn2["not_runnable"] == ["aten::_scaled_grouped_mm", "aten::_scaled_mm"]
    lines = [a for a in trn2["assumptions"] if "cannot run there" in a]
    assert len(lines) == 2 and all("FP8 compute needs Trainium3" in line for line in lines)
    assert trn2["by_class"]["matmul"][0] >= flops / est.core_rates(PROFILES["trn2.3xlarge"]).bf16
