"""Calibration of the audit's step-time estimate against a published Trainium2 figure
(benchmarks/calibrate_audit.py; the full table is in benchmarks/RESULTS.md).

One figure runs here, the smallest: Llama-3.3-70B token generation on a trn2.48xlarge
(TP=64, bf16, batch 1, KV bucket 12800), published TPOT P50 19.6 ms in the AWS Neuron
documentation. Tolerance band: the estimate is an order-of-magnitude tool, so the
published throughput must lie within [estimate_low / 3, estimate_high * 3]. No device is
needed: the workload is rebuilt on meta tensors.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "calibrate_audit.py"


@pytest.fixture(scope="module")
def calibration():
    spec = importlib.util.spec_from_file_location("calibrate_audit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(calibration):
    return calibration.calibrate(calibration.FIGURES[calibration.SMALL_FIGURE])


def test_published_figure_is_the_cited_one(calibration):
    figure = calibration.FIGURES[calibration.SMALL_FIGURE]
    assert figure.published_ms == 19.6 and figure.phase == "decode"
    assert figure.instance == "trn2.48xlarge" and figure.tp == 64
    assert figure.source.url.startswith("https://awsdocs-neuron.readthedocs-hosted.com/")
    assert math.isclose(figure.published_tokens_per_s, 1000 / 19.6)


def test_rebuilt_workload_streams_one_rank_of_the_weights(calibration):
    """The recorded per-rank step is the published layout: every weight matrix of one
    tensor-parallel rank read once (mm operands), one attention and one in-place KV update
    of K and V per layer, two all-reduces per layer."""
    figure = calibration.FIGURES[calibration.SMALL_FIGURE]
    m, tp = figure.model, figure.tp
    signatures, collectives = calibration.record_step(figure)

    def calls(op):
        return sum(s["calls_per_step"] for s in signatures if s["op"] == op)

    weight_elems = sum(math.prod(s["args"][1]["shape"]) * s["calls_per_step"]
                       for s in signatures if s["op"] == "aten::mm")
    q = m.heads // tp * m.head_dim
    kv = max(1, m.kv_heads // tp) * m.head_dim
    per_layer = m.hidden * (q + 2 * kv) + q * m.hidden + 3 * m.hidden * (m.intermediate // tp)
    expected = m.layers * per_layer + m.hidden * m.vocab // tp  # + the lm_head shard
    assert weight_elems == expected
    assert calls(calibration.FLASH_FOR_CPU) == m.layers
    assert calls("aten::index_copy_") == 2 * m.layers
    all_reduces = sum(c["calls_per_step"] for c in collectives if c["op"] == "all_reduce")
    assert all_reduces == 2 * m.layers + 1  # + the vocab-parallel embedding
    assert all(c["world_size"] == tp for c in collectives)
    for sig in signatures:
        for arg in sig["args"]:
            if isinstance(arg, dict) and "shape" in arg:
                assert arg["device"] == "neuron:0"


def test_published_throughput_within_tolerance_band(calibration, result):
    low, high = result["estimate_tokens_per_s"]
    published = result["published_tokens_per_s"]
    assert 0 < low <= high
    band = calibration.BAND
    assert band == 3.0
    assert low / band <= published <= high * band, (
        f"published {published:.1f} tok/s outside [{low / band:.1f}, {high * band:.1f}] "
        f"(estimate {low:.1f}-{high:.1f} tok/s)")
    assert result["within_band"]
    lo_ratio, hi_ratio = result["ratio"]
    assert math.isclose(lo_ratio, published / high) and math.isclose(hi_ratio, published / low)


def test_estimate_is_hbm_bound_with_no_launches_in_compiled_mode(result):
    """Token generation at batch 1 streams weights: matmul time is HBM time, the compiled
    estimate has no per-op launches, and the eager estimate adds them (slower)."""
    by_class = result["by_class_ms"]
    assert by_class["launch"] == [0.0, 0.0]
    assert by_class["matmul"][0] > by_class["collectives"][0]
    assert result["eager_ms"][0] > result["estimate_ms"][0]
    assert result["eager_ms"][1] > result["estimate_ms"][1]
