"""NKI language and simulator: launch, views, numerics, engine/buffer/capacity rules.

References are NumPy (float32, or ml_dtypes for the low-precision casts). Every rule violation must
raise NKIError naming the instruction, the kernel line (file:line of this file) and the rule.
"""

from __future__ import annotations

import linecache
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(1234)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape, dtype=np.float32).astype(dtype)


def expect_error(fn, *args, instruction, rule, token=None):
    """Run a kernel that must fail; check the message names instruction, rule and the kernel line."""
    with pytest.raises(nki.NKIError) as info:
        fn(*args)
    err = info.value
    message = str(err)
    assert instruction in message and rule in message, message
    path, line = err.location.rsplit(":", 1)
    assert path == __file__, err.location
    source_line = linecache.getline(path, int(line))
    short = token or instruction.split(".")[-1]
    assert short in source_line, (err.location, source_line)
    return err


# ---------------------------------------------------------------------------- the package surface
def test_import_surface():
    assert nki.language is nl and nki.isa is nisa
    assert issubclass(nki.NKIError, ValueError)
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == (128, 512, 128, 512)
    for name in ("int8", "int16", "int32", "uint8", "uint16", "uint32", "float8_e4m3", "float8_e5m2",
                 "float16", "bfloat16", "tfloat32", "float32"):
        assert hasattr(nl, name), name
    assert nl.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    for buf in (nl.sbuf, nl.psum, nl.hbm, nl.shared_hbm):
        assert repr(buf).startswith("nl.")


def test_import_torch_does_not_load_nki_and_nki_does_not_import_jax():
    code = ("import sys, torch; assert 'torch_neuronx.nki' not in sys.modules, 'import torch loaded nki'; "
            "import torch_neuronx.nki; assert 'jax' not in sys.modules, 'jax imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _copy_kernel(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(a))
    return out


@pytest.mark.parametrize("make", [lambda f: nki.jit(f), lambda f: nki.jit()(f), lambda f: nki.jit(f, mode="simulation")])
def test_jit_forms(make):
    kernel = make(_copy_kernel)
    assert kernel.func is _copy_kernel and kernel.__name__ == "_copy_kernel"
    a = randn(64, 32)
    np.testing.assert_array_equal(kernel(a), a)
    np.testing.assert_array_equal(nki.simulate(kernel)(a), a)
    np.testing.assert_array_equal(nki.simulate(_copy_kernel)(a), a)


def test_language_outside_kernel_raises():
    with pytest.raises(nki.NKIError, match="only valid inside a running kernel"):
        nl.ndarray((128, 4), nl.float32)


# ---------------------------------------------------------------------------- launch grid
@nki.jit
def _grid_kernel(a):
    out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    rows = a.shape[0] // nl.num_programs(0)
    cols = a.shape[1] // nl.num_programs(1)
    tile = nl.load(a[nl.ds(i * rows, rows), nl.ds(j * cols, cols)])
    y = nl.add(tile, float(10 * i + j))
    nl.store(out[nl.ds(i * rows, rows), nl.ds(j * cols, cols)], y)
    return out


def test_grid_launch_programs_share_output():
    a = randn(256, 64)
    out = _grid_kernel[2, 4](a)
    expected = a + np.add.outer(10 * np.repeat(np.arange(2), 128), np.repeat(np.arange(4), 16)).astype(np.float32)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    assert len(_grid_kernel.last_trace) == 8 * 3  # load, tensor_scalar, store per program


def test_bad_grid():
    with pytest.raises(nki.NKIError, match="grid"):
        _grid_kernel[0]


# ---------------------------------------------------------------------------- numerics
@nki.jit
def _uninitialized_kernel(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    tile = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nl.store(out, tile)
    return out


def test_fresh_buffers_are_nan():
    out = _uninitialized_kernel(np.zeros((128, 8), np.float32))
    assert np.isnan(out).all()
    # A kernel output never written is NaN too, not zeros.
    @nki.jit
    def forgets(a):
        return nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    assert np.isnan(forgets(np.zeros((4, 4), np.float32))).all()


@nki.jit
def _bf16_kernel(a, b):
    out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    prod = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_tensor(prod, x, y, nl.multiply)
    total = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
    nisa.tensor_scalar(total, prod, nl.add, 1.0, op1=nl.multiply, operand1=3.0)
    nl.store(out, total)
    return out


def test_fp32_arithmetic_cast_on_output():
    a, b = randn(128, 64, dtype=ml_dtypes.bfloat16), randn(128, 64, dtype=ml_dtypes.bfloat16)
    out = _bf16_kernel(a, b)
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    f32 = np.float32
    prod = (a.astype(f32) * b.astype(f32)).astype(ml_dtypes.bfloat16)  # rounded once per instruction
    expected = ((prod.astype(f32) + 1) * 3).astype(ml_dtypes.bfloat16)  # both ops in fp32, one rounding
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_integer_output_saturates():
    @nki.jit
    def to_int8(a):
        out = nl.ndarray(a.shape, nl.int8, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.load(a), dtype=nl.int8))
        return out
    a = np.array([[-1000.0, -1.6, 0.4, 2.5, 127.4, 900.0]], dtype=np.float32)
    np.testing.assert_array_equal(to_int8(a), np.array([[-128, -2, 0, 2, 127, 127]], dtype=np.int8))


UNARY = {
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0), "silu": lambda x: x / (1 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
    "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x,
    "abs": np.abs, "negative": np.negative, "square": np.square,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_helpers(name):
    positive = name in ("log", "sqrt", "rsqrt")

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, getattr(nl, name)(nl.load(a)))
        return out

    a = randn(128, 96)
    if positive:
        a = np.abs(a) + 0.1
    np.testing.assert_allclose(kernel(a), UNARY[name](a.astype(np.float64)), rtol=2e-6, atol=2e-6)


BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "maximum": np.maximum, "minimum": np.minimum}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_helpers_tile_scalar_and_column(name):
    @nki.jit
    def kernel(a, b, col):
        out = nl.ndarray((3,) + a.shape, a.dtype, buffer=nl.shared_hbm)
        x, y, c = nl.load(a), nl.load(b), nl.load(col)
        op = getattr(nl, name)
        nl.store(out[0], op(x, y))
        nl.store(out[1], op(x, 2.5))
        nl.store(out[2], op(x, c))  # [P, 1] operand broadcast along the free axis
        return out

    a, b, col = randn(128, 40), randn(128, 40) + 3, randn(128, 1) + 3
    out = kernel(a, b, col)
    ref = BINARY[name]
    np.testing.assert_allclose(out[0], ref(a, b), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[1], ref(a, np.float32(2.5)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[2], ref(a, col), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean)])
def test_reductions_over_free_axes(name, ref):
    @nki.jit
    def kernel(a):
        out = nl.ndarray((a.shape[0], 1), a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray((a.shape[0], a.shape[1]), a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        nl.store(out, getattr(nl, name)(x, axis=(1, 2), keepdims=True).reshape((a.shape[0], 1)))
        nl.store(out2, getattr(nl, name)(x, axis=2))
        return out, out2

    a = randn(100, 6, 50)
    full, partial = kernel(a)
    np.testing.assert_allclose(full[:, 0], ref(a, axis=(1, 2)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(partial, ref(a, axis=2), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- views
@nki.jit
def _views_kernel(a, w):
    rows, cols = a.shape
    out = nl.ndarray((cols // 2, rows, 2), a.dtype, buffer=nl.shared_hbm)
    # HBM permute view: out[c, r, t] = a[r, 2c + t] + w[2c + t], loaded through a reshaped view.
    wb = nl.load(w.reshape((1, cols)).broadcast_to((rows, cols)))
    x = nl.load(a[nl.ds(0, rows), :])
    y = nl.add(x, wb)
    nl.store(out.permute(1, 0, 2), y.reshape((rows, cols // 2, 2)))
    return out


def test_views_ds_reshape_permute_broadcast():
    a, w = randn(64, 10), randn(10)
    out = _views_kernel(a, w)
    expected = (a + w).reshape(64, 5, 2).transpose(1, 0, 2)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)


def test_view_errors():
    @nki.jit
    def out_of_bounds(a):
        return nl.load(a[nl.ds(100, 64), :])
    expect_error(out_of_bounds, randn(128, 4), instruction="tensor indexing", rule="out of bounds",
                 token="nl.ds(100, 64)")

    @nki.jit
    def move_partition_axis(a):
        return nl.load(a).permute(1, 0)
    expect_error(move_partition_axis, randn(128, 4), instruction="permute", rule="partition axis")

    @nki.jit
    def write_broadcast(a):
        x = nl.load(a)
        nisa.tensor_copy(x[:, 0:1].broadcast_to((128, 4)), x)
    expect_error(write_broadcast, randn(128, 4), instruction="nisa.tensor_copy", rule="broadcast view")


# ---------------------------------------------------------------------------- GpSimd and statistics
def test_iota_and_affine_select():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((2,) + a.shape, nl.float32, buffer=nl.shared_hbm)
        idx = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.iota(idx, pattern=[[3, a.shape[1]]], offset=5, channel_multiplier=100)
        nl.store(out[0], idx)
        x = nl.load(a)
        masked = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.affine_select(masked, pattern=[[-1, a.shape[1]]], offset=2, channel_multiplier=1,
                           on_true_tile=x, on_false_value=-7.0)
        nl.store(out[1], masked)
        return out

    a = randn(16, 20)
    out = kernel(a)
    p, f = np.arange(16)[:, None], np.arange(20)[None, :]
    np.testing.assert_array_equal(out[0], 5 + 100 * p + 3 * f)
    np.testing.assert_array_equal(out[1], np.where(p - f + 2 >= 0, a, -7.0))


def test_matmul_accumulation_groups():
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((3, 32, 64), nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        acc = nl.ndarray((32, 64), nl.float32, buffer=nl.psum)  # NaN-filled: first write must overwrite
        nisa.nc_matmul(acc, x, y)
        nisa.nc_matmul(acc, x, y)
        nl.store(out[0], nl.copy(acc))
        nisa.nc_matmul(acc, x, y, accumulate=False)
        nl.store(out[1], nl.copy(acc))
        nisa.memset(acc, 1.0)  # a write by another instruction ends the group: the next overwrites
        nisa.nc_matmul(acc, x, y)
        nisa.nc_matmul(acc, x, y, accumulate=True)
        nl.store(out[2], nl.copy(acc))
        return out

    a, b = randn(128, 32), randn(128, 64)
    ref = a.T.astype(np.float64) @ b
    out = kernel(a, b)
    np.testing.assert_allclose(out[0], 2 * ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[2], 2 * ref, rtol=1e-4, atol=1e-4)


def test_trace_records():
    a = randn(128, 64)
    _copy = nki.jit(_copy_kernel)
    _copy(a)
    load, store = _copy.last_trace
    assert load.op == "nisa.dma_copy" and load.engine == "dma"
    assert load.buffers == ("sbuf", "shared_hbm") and store.buffers == ("shared_hbm", "sbuf")
    assert load.shapes == ((128, 64), (128, 64)) and load.dtypes == ("float32", "float32")
    assert load.nbytes == a.nbytes
    assert load.location.startswith(__file__ + ":")
    assert set(load.as_dict()) >= {"op", "engine", "shapes", "dtypes", "buffers", "bytes", "location"}


# ---------------------------------------------------------------------------- rules
def test_partition_limit():
    @nki.jit
    def kernel(a):
        nl.ndarray((129, 4), nl.float32, buffer=nl.sbuf)
    err = expect_error(kernel, randn(4, 4), instruction="nl.ndarray", rule="exceeds nl.tile_size.pmax (128)",
                       token="nl.ndarray")
    assert err.instruction == "nl.ndarray" and "pmax" in err.rule


def _mm_kernel(m, n, k2=None, dst_buf=None, moving_in_psum=False):
    @nki.jit
    def kernel(a):
        st = nl.ndarray((128, m), nl.bfloat16, buffer=nl.sbuf)
        mv = nl.ndarray((k2 or 128, n), nl.bfloat16, buffer=nl.psum if moving_in_psum else nl.sbuf)
        dst = nl.ndarray((min(m, 128), n), nl.float32, buffer=dst_buf or nl.psum)
        nisa.nc_matmul(dst, st, mv)
    return kernel


@pytest.mark.parametrize("args, rule", [
    ((256, 512), "stationary free size 256 exceeds nl.tile_size.gemm_stationary_fmax (128)"),
    ((128, 1024), "moving free size 1024 exceeds nl.tile_size.gemm_moving_fmax (512)"),
    ((128, 512, 64), "contracts over the partition dimension"),
    ((128, 512, None, "sbuf"), "Tensor Engine cannot write nl.sbuf"),
    ((128, 512, None, None, True), "Tensor Engine cannot read nl.psum"),
])
def test_matmul_rules(args, rule):
    m, n, *rest = args
    k2 = rest[0] if rest else None
    dst_buf = {"sbuf": nl.sbuf}.get(rest[1]) if len(rest) > 1 else None
    in_psum = rest[2] if len(rest) > 2 else False
    if in_psum:
        n = 256  # keep the moving tile inside one PSUM bank so that the engine rule is what fails
    expect_error(_mm_kernel(m, n, k2, dst_buf, in_psum), randn(1, 1), instruction="nisa.nc_matmul", rule=rule)


def test_psum_bank_boundary():
    @nki.jit
    def kernel(a):
        st = nl.zeros((128, 128), nl.bfloat16)
        mv = nl.zeros((128, 512), nl.bfloat16)
        two_banks = nl.ndarray((128, 1024), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(two_banks[:, 256:768], st, mv)
    expect_error(kernel, randn(1, 1), instruction="nisa.nc_matmul", rule="PSUM bank boundary")


def test_engine_buffer_rules():
    @nki.jit
    def gpsimd_psum(a):
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        nisa.iota(t, pattern=[[1, 8]])
    expect_error(gpsimd_psum, randn(1, 1), instruction="nisa.iota", rule="GpSimd Engine cannot write nl.psum")

    @nki.jit
    def dma_psum(a):
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        nisa.dma_copy(t, a)
    expect_error(dma_psum, randn(128, 8), instruction="nisa.dma_copy", rule="DMA cannot write nl.psum")

    @nki.jit
    def store_psum(a):  # nl.store copies a PSUM tile to SBUF first (AWS documents the extra copy)
        t = nl.zeros((128, 8), nl.float32, buffer=nl.psum)
        nisa.dma_copy(a, t)
    expect_error(store_psum, randn(128, 8), instruction="nisa.dma_copy", rule="DMA cannot read nl.psum")

    @nki.jit
    def vector_hbm(a):
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(t, a, a, nl.add)
    err = expect_error(vector_hbm, randn(128, 8), instruction="nisa.tensor_tensor",
                       rule="Vector Engine cannot read nl.shared_hbm")
    assert "nl.load" in str(err)  # says what to do

    @nki.jit
    def both_psum(a):
        x = nl.zeros((128, 8), nl.float32, buffer=nl.psum)
        y = nl.zeros((128, 8), nl.float32, buffer=nl.psum)
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(t, x, y, nl.add)
    expect_error(both_psum, randn(1, 1), instruction="nisa.tensor_tensor", rule="both in nl.psum")

    @nki.jit
    def reduce_partitions(a):
        x = nl.load(a)
        nl.sum(x, axis=0)
    expect_error(reduce_partitions, randn(128, 8), instruction="nl.sum", rule="free axes only", token="nl.sum")


@nki.jit
def _big_sbuf(a):
    tiles = [nl.ndarray((128, 60 * 1024), nl.uint8, buffer=nl.sbuf) for _ in range(4)]  # 240 KiB
    return None


def test_sbuf_capacity_per_target(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    err = expect_error(_big_sbuf, randn(1, 1), instruction="nl.ndarray", rule="SBUF capacity exceeded")
    assert "trn2" in str(err) and str(224 * 1024) in str(err)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # 256 KiB per partition
    _big_sbuf(randn(1, 1))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(nki.NKIError, match="NEURON_PLATFORM_TARGET_OVERRIDE"):
        _big_sbuf(randn(1, 1))


def test_sbuf_is_released_when_tiles_are_dropped():
    @nki.jit
    def kernel(a):
        for _ in nl.affine_range(20):  # 20 x 100 KiB, but at most two alive at once
            t = nl.ndarray((128, 100 * 1024), nl.uint8, buffer=nl.sbuf)
    kernel(randn(1, 1))
    assert kernel.last_run.peak_sbuf <= 2 * 100 * 1024


def test_psum_capacity():
    @nki.jit
    def kernel(a):
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
    expect_error(kernel, randn(1, 1), instruction="nl.ndarray", rule="PSUM capacity exceeded")


def test_psum_tiles_live_from_first_to_last_use_not_while_python_holds_them():
    """AWS's allocator gives a tile memory from its first instruction to its last: a kernel may keep
    a name bound to a dead PSUM tile (nki-library's MoE CTE) and still fill all 8 banks; if the old
    tile is used again after the others are written, the ninth bank is the error, named at the
    allocation that exceeds PSUM, with the live tiles' lines."""
    def body(use_again):
        @nki.jit
        def kernel(a):
            x = nl.load(a)
            old = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            nisa.memset(old, 1.0)
            acc = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
            for t in acc:
                nisa.tensor_copy(t, x)
            if use_again:
                nisa.memset(old, 0.0)
            total = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
            nisa.memset(total, 0.0)
            for t in acc:
                nisa.tensor_tensor(total, total, t, op=nl.add)
            out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
            nl.store(out, total)
            return out
        return kernel

    x = randn(128, 512)
    np.testing.assert_allclose(body(False)(x), 8 * x, rtol=1e-6)
    err = expect_error(body(True), x, instruction="nl.ndarray", rule="PSUM capacity exceeded", token="acc = [")
    assert "8 of 8 banks" in str(err) and "7 x 1 at " in str(err)  # the live tiles, by allocation line


def test_sbuf_tile_rebound_after_the_next_load_fits_when_its_last_use_is_over():
    """nki-samples' select_and_scatter rebinds a tile only after allocating its successor: under
    Python's lifetimes two would be alive at once; under AWS's, the first is dead after its last use."""
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        cur = nl.load(a)
        for _ in range(3):  # 3 x 120 KiB tiles, each one last used before the next is allocated
            big = nl.ndarray((128, 30 * 1024), nl.float32, buffer=nl.sbuf)
            nisa.memset(big, 0.0)
            nl.store(out, cur)
            cur = nl.load(a)
        return out

    x = randn(128, 4)
    np.testing.assert_array_equal(kernel(x), x)
    assert kernel.last_run.peak_sbuf < 2 * 120 * 1024


def test_unsupported_argument_dtype():
    with pytest.raises(nki.NKIError, match="float64"):
        _copy = nki.jit(_copy_kernel)
        _copy(np.zeros((4, 4)))


def test_returning_an_sbuf_tile_is_an_error():
    @nki.jit
    def kernel(a):
        return nl.load(a)
    with pytest.raises(nki.NKIError, match="return HBM tensors"):
        kernel(randn(4, 4))


# ---------------------------------------------------------------------------- more helpers
def test_nl_matmul_and_transpose_helpers():
    @nki.jit
    def kernel(a, b, c):
        out = nl.ndarray((3, 64, 256), nl.float32, buffer=nl.shared_hbm)
        x, y, xt = nl.load(a), nl.load(b), nl.load(c)  # a: [M=64, K=96], c: [K=96, M=64], b: [K, N]
        nl.store(out[0], nl.copy(nl.matmul(x, y)))
        nl.store(out[1], nl.copy(nl.matmul(xt, y, transpose_x=True)))
        t = nl.copy(nl.transpose(xt))  # [64, 96]
        nl.store(out[2, :, 0:96], t)
        nl.store(out[2, :, 96:256], nl.zeros((64, 160), nl.float32))
        return out

    a, b = randn(64, 96), randn(96, 256)
    out = kernel(a, b, np.ascontiguousarray(a.T))
    np.testing.assert_allclose(out[0], a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[2][:, :96], a)
    np.testing.assert_array_equal(out[2][:, 96:], 0)
    ops = [ins.op for ins in kernel.last_trace]
    assert ops.count("nisa.nc_matmul") == 2 and ops.count("nisa.nc_transpose") == 2


def test_operators_and_ranges():
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        acc = nl.zeros(a.shape, nl.float32)
        for i in nl.sequential_range(3):
            acc = acc + x * y - 1.0
        for _ in nl.static_range(1, 3):
            acc = 2.0 * acc / y
        nl.store(out, -acc)
        return out

    a, b = randn(32, 16), randn(32, 16) + 4
    expected = -(2.0 * (2.0 * (3 * (a * b - 1.0)) / b) / b)
    np.testing.assert_allclose(kernel(a, b), expected, rtol=1e-5, atol=1e-5)


def test_activation_scale_bias_reduce_and_dma_accumulate():
    @nki.jit
    def kernel(a, col, out):
        x, c = nl.load(a), nl.load(col)
        y = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(y, nl.tanh, x, bias=c, scale=0.5, reduce_op=nl.maximum, reduce_res=total,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.dma_copy(out[:, 0:16], y, dst_rmw_op=nl.add)  # out += y
        nisa.dma_copy(out[:, 16:17], total)
        neg = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(neg, nl.add, x, axis=1, negate=True)
        nisa.dma_copy(out[:, 17:18], neg)

    a, col = randn(64, 16), randn(64, 1)
    out = np.ones((64, 18), np.float32)
    kernel(a, col, out)
    y = np.tanh(a * 0.5 + col)
    np.testing.assert_allclose(out[:, :16], 1 + y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[:, 16], y.max(axis=1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[:, 17], -a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_vector_engine_transpose_limit():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        t = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.sbuf)
        nisa.nc_transpose(t, x, engine=nisa.engine.vector)
        nl.store(out, t)
        return out

    a = randn(32, 20)
    np.testing.assert_array_equal(kernel(a), a.T)
    expect_error(kernel, randn(64, 20), instruction="nisa.nc_transpose", rule="exceeds [32, 32]")


def test_nested_kernel_is_inlined_and_buffer_checked():
    @nki.jit
    def inner(x):
        return nl.exp(x)

    @nki.jit
    def outer(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, inner(nl.load(a)))
        return out

    a = randn(16, 8)
    np.testing.assert_allclose(outer(a), np.exp(a), rtol=1e-6)
    assert [i.op for i in outer.last_trace] == ["nisa.dma_copy", "nisa.activation", "nisa.dma_copy"]

    @nki.jit
    def bad_buffer(a):
        nl.ndarray((4, 4), nl.float32, buffer="sbuf")
    expect_error(bad_buffer, a, instruction="nl.ndarray", rule="buffer must be", token="nl.ndarray")


def test_threads_simulate_independently():
    import threading

    results = {}

    def worker(i):
        a = np.full((128, 64), float(i), np.float32)
        results[i] = _grid_kernel[2, 1](a)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        expected = np.full((128, 64), float(i), np.float32) + 10 * np.repeat(np.arange(2), 64)[:, None]
        np.testing.assert_array_equal(results[i], expected)
