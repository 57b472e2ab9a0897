"""Names AWS's nki-library kernels use: the sigmoid-GELU activations and derivatives, `nl.NKIObject`,
`nl.static_cast`, `NkiTensor.ap` access patterns (static and with a runtime `scalar_offset`), and
the options the simulator accepts without acting on (`matmul_perf_mode`, `dma_engine`,
`nki.compiler.skip_middle_end_transformations`, `nt.scalar`, `nki.dtype`).

References are NumPy: activations to rtol 1e-5 (float32 math), derivatives against a central
finite difference of the function in float64 (atol 1e-4), access patterns exactly (copies).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
import torch_neuronx.nki.typing as nt

RNG = np.random.default_rng(11)
X = RNG.uniform(-6, 6, (128, 64)).astype(np.float32)


@nki.jit
def _activate(x, op):
    t = nl.load(x)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, op(t))
    return out


def _sig(v):
    return 1.0 / (1.0 + np.exp(-v))


def _finite_difference(fn, x, h=1e-4):
    x = x.astype(np.float64)
    return (fn(x + h) - fn(x - h)) / (2 * h)


def test_gelu_apprx_sigmoid_is_x_times_sigmoid_1702x():
    got = _activate(X, nl.gelu_apprx_sigmoid)
    np.testing.assert_allclose(got, X * _sig(1.702 * X.astype(np.float64)), rtol=1e-5, atol=1e-6)
    # It is not the erf GELU: the two differ by up to ~0.02 on [-6, 6].
    assert np.abs(got - _activate(X, nl.gelu)).max() > 1e-2


@pytest.mark.parametrize("op, fn", [
    (nl.gelu_apprx_sigmoid_dx, lambda v: v * _sig(1.702 * v)),
    (nl.silu_dx, lambda v: v * _sig(v)),
])
def test_activation_derivatives_match_finite_differences(op, fn):
    got = _activate(X, op)
    np.testing.assert_allclose(got, _finite_difference(fn, X), atol=1e-4)


def test_activation_tokens_work_as_op_of_nisa_activation():
    @nki.jit
    def k(x):
        t = nl.load(x)
        r = nl.ndarray(t.shape, t.dtype)
        nisa.activation(r, op=nl.gelu_apprx_sigmoid, data=t, scale=2.0)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, r)
        return out

    v = 2.0 * X.astype(np.float64)
    np.testing.assert_allclose(k(X), v * _sig(1.702 * v), rtol=1e-5, atol=1e-6)


@dataclass(frozen=True)
class _Tiling(nl.NKIObject):
    rows: int
    cols: int

    @property
    def count(self):
        return self.rows * self.cols


class _Plan(nl.NKIObject):
    def __init__(self, tiling):
        self.tiling = tiling
        self.scale = 3.0


def test_nkiobject_subclasses_are_ordinary_classes_inside_kernels():
    @nki.jit
    def k(x, plan):
        t = nl.load(x[0:plan.tiling.rows, 0:plan.tiling.cols])
        out = nl.ndarray((plan.tiling.rows, plan.tiling.cols), x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(t, plan.scale))
        return out

    tiling = _Tiling(64, 32)
    assert tiling == _Tiling(64, 32) and hash(tiling) == hash(_Tiling(64, 32)) and tiling.count == 2048
    with pytest.raises(AttributeError):
        tiling.rows = 1  # frozen dataclass semantics are the subclass's own
    np.testing.assert_array_equal(k(X, _Plan(tiling)), X[:64, :32] * np.float32(3))


def test_static_cast_converts_host_arrays_like_an_output_cast():
    x = np.array([0.1, 1.00390625, -2.5, 1e6], np.float64)
    assert nl.static_cast(x, nl.bfloat16).dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(nl.static_cast(x, nl.bfloat16), x.astype(ml_dtypes.bfloat16))
    # Integers round to nearest (ties to even) and saturate, as instruction outputs do.
    np.testing.assert_array_equal(nl.static_cast(np.array([2.5, -3.6, 1e12]), nl.int32),
                                  np.array([2, -4, np.iinfo(np.int32).max], np.int32))


def test_static_cast_refuses_kernel_tiles():
    @nki.jit
    def k(x):
        nl.static_cast(nl.load(x), nl.bfloat16)

    with pytest.raises(nki.NKIError, match="host NumPy array"):
        k(X)


def test_ap_on_hbm_reads_a_strided_window_of_flat_memory():
    a = np.arange(8 * 48, dtype=np.float32).reshape(8, 48)

    @nki.jit
    def k(a):
        t = nl.ndarray((4, 3, 8), a.dtype)
        # rows 2..5, three column groups 16 apart, 8 columns each, starting at column 5
        nisa.dma_copy(t, a.ap(pattern=[[48, 4], [16, 3], [1, 8]], offset=2 * 48 + 5))
        out = nl.ndarray((4, 3, 8), a.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    flat = a.reshape(-1)
    want = np.array([[[flat[96 + 5 + 48 * p + 16 * g + c] for c in range(8)] for g in range(3)]
                     for p in range(4)], np.float32)
    np.testing.assert_array_equal(k(a), want)


def test_ap_on_chip_steps_partitions_in_units_of_the_free_size():
    @nki.jit
    def k(x):
        t = nl.load(x)                                      # [128, 64]
        sub = nl.ndarray((32, 16), x.dtype)
        # every 4th partition from partition 1, columns 8, 10, ..., 38
        nisa.tensor_copy(sub, t.ap(pattern=[[4 * 64, 32], [2, 16]], offset=64 + 8))
        out = nl.ndarray((32, 16), x.dtype, buffer=nl.shared_hbm)
        nl.store(out, sub)
        return out

    np.testing.assert_array_equal(k(X), X[1::4, 8:40:2])


def test_ap_views_are_writable_destinations():
    @nki.jit
    def k(x):
        out = nl.ndarray((4, 16), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(out, x[0:4, 0:16])
        t = nl.load(x[0:4, 0:8])
        nisa.dma_copy(out.ap(pattern=[[16, 4], [2, 8]], offset=1), t)  # odd columns
        return out

    want = X[0:4, 0:16].copy()
    want[:, 1::2] = X[0:4, 0:8]
    np.testing.assert_array_equal(k(X), want)


def test_ap_scalar_offset_selects_at_run_time_along_indirect_dim():
    logits = RNG.standard_normal((4, 50), dtype=np.float32)
    targets = np.array([[7, 0, 49, 23]], np.int32)

    @nki.jit
    def k(logits, targets):
        tg = nl.load(targets)                              # [1, 4] int32
        picked = nl.ndarray((4, 1), logits.dtype)
        for i in range(4):
            nisa.dma_copy(picked[i:i + 1, :],
                          logits.ap(pattern=[[50, 1], [1, 1]], offset=i * 50,
                                    scalar_offset=tg.ap(pattern=[[4, 1], [1, 1]], offset=i), indirect_dim=1))
        out = nl.ndarray((4, 1), logits.dtype, buffer=nl.shared_hbm)
        nl.store(out, picked)
        return out

    np.testing.assert_array_equal(k(logits, targets)[:, 0], logits[np.arange(4), targets[0]])


@pytest.mark.parametrize("row, skip", [(1, True), (3, True), (-1000000, True), (3, False), (-1000000, False)])
def test_ap_scalar_offset_outside_the_tensor_is_skipped_only_with_oob_mode_skip(row, skip):
    """nki-library's indexed_flatten scatters rows to run-time offsets and marks unused ones with an
    invalid offset, relying on oob_mode=skip; a pattern that leaves the tensor partly writes its
    in-bounds rows only. Without skip it is an error, as before."""
    src = RNG.standard_normal((2, 8), dtype=np.float32)

    @nki.jit
    def k(src, offs):
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, nl.zeros((4, 8), nl.float32, buffer=nl.sbuf))
        off = nl.load(offs)
        nisa.dma_copy(dst=out.ap(pattern=[[8, 2], [1, 8]], offset=0, scalar_offset=off, indirect_dim=0),
                      src=nl.load(src), oob_mode=nisa.oob_mode.skip if skip else None)
        return out

    offs = np.array([[row]], np.int32)
    if not skip and not 0 <= row <= 2:
        with pytest.raises(nki.NKIError, match="outside"):
            k(src, offs)
        return
    want = np.zeros((4, 8), np.float32)
    for i in range(2):
        if 0 <= row + i < 4:
            want[row + i] = src[i]
    np.testing.assert_array_equal(k(src, offs), want)


@pytest.mark.parametrize("pattern, offset, match", [
    ([[64, 2], [1, 64]], 127 * 64, "leave the tensor's 128 partitions"),
    ([[64, 2], [1, 65]], 0, "leaves a partition's 64 elements"),
    ([[63, 2], [1, 8]], 0, "not a multiple"),
])
def test_ap_out_of_bounds_is_an_error(pattern, offset, match):
    @nki.jit
    def k(x):
        view = nl.load(x).ap(pattern=pattern, offset=offset)
        nisa.memset(view, 0.0)  # a view that leaves its tensor is reported when an instruction uses it

    with pytest.raises(nki.NKIError, match=match):
        k(X)


def test_ap_out_of_bounds_in_hbm_is_an_error():
    @nki.jit
    def k(x):
        view = x.ap(pattern=[[64, 128], [1, 64]], offset=1)
        nisa.dma_copy(nl.ndarray((128, 64), x.dtype, buffer=nl.sbuf), view)

    with pytest.raises(nki.NKIError, match="outside the tensor's memory"):
        k(X)


def test_accepted_options_do_not_change_results():
    a = RNG.standard_normal((128, 32), dtype=np.float32)
    b = RNG.standard_normal((128, 64), dtype=np.float32)

    @nki.compiler.skip_middle_end_transformations
    @nki.jit
    def k(a, b, scale: nt.scalar, dtype: nki.dtype = nl.float32):
        ta = nl.ndarray(a.shape, dtype)
        nisa.dma_copy(ta, a, dma_engine=nisa.dma_engine.gpsimd_dma)
        tb = nl.load(b)
        ps = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps, ta, tb, perf_mode=nisa.matmul_perf_mode.double_row)
        res = nl.ndarray((32, 64), nl.float32)
        nisa.tensor_scalar(res, ps, nl.multiply, scale)
        out = nl.ndarray((32, 64), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    np.testing.assert_allclose(k(a, b, 0.5), 0.5 * (a.T @ b), rtol=1e-4, atol=1e-4)
    assert nisa.constants.matmul_perf_mode is nisa.matmul_perf_mode
    assert isinstance(nl.bfloat16, nki.dtype) and nl.dtype is nki.dtype


def test_nkiobject_classes_get_aws_default_initializer():
    """AWS's language guide: with or without @dataclass, a class that writes no __init__ gets one
    taking every field as an optional argument (None without a default), then __post_init__ runs.
    nki-library's MoE configs are plain annotated classes built with keywords; moe_tkg leaves out a
    field of an @dataclass."""
    from dataclasses import dataclass, field

    class Sizes(nl.NKIObject):
        T: int
        H: int = 0
        scale = 1.5

        def __post_init__(self):
            self.TH = None if self.T is None else self.T * self.H

    s = Sizes(T=4, H=8)
    assert (s.T, s.H, s.scale, s.TH) == (4, 8, 1.5, 32)
    assert (Sizes().T, Sizes().H, Sizes(2).H) == (None, 0, 0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'X'"):
        Sizes(X=1)
    with pytest.raises(TypeError, match="multiple values for argument 'T'"):
        Sizes(1, T=2)
    with pytest.raises(TypeError, match="at most 3 positional"):
        Sizes(1, 2, 3, 4)

    class Bigger(Sizes):  # inherits the fields, adds one
        E: int = 2

    b = Bigger(1, 2, E=5)
    assert (b.T, b.H, b.E, b.TH) == (1, 2, 5, 2)

    @dataclass(frozen=True)
    class Frozen(nl.NKIObject):
        a: int
        b: list = field(default_factory=list)
        c: int = 7

    f = Frozen(c=3)
    assert (f.a, f.b, f.c) == (None, [], 3) and Frozen(1) == Frozen(1) and Frozen(1).b is not Frozen(1).b
    with pytest.raises(AttributeError):
        f.a = 2

    class Own(nl.NKIObject):  # a class's own __init__ is kept, as AWS's compiler keeps it
        x: int = 1

        def __init__(self, y):
            self.x = 2 * y

    class OwnChild(Own):
        z: int = 0

    assert Own(3).x == 6 and OwnChild(4).x == 8
