"""The small NKI names AWS's nki-library kernels stopped on (issue #27 item 3): `nisa.get_nc_version`
/ `nisa.nc_version`, `nl.range`, the per-target `nl.tile_size` fields, `nl.shared_identity_matrix`,
`nisa.dma_transpose`, `nisa.max8` and `nisa.nc_find_index8`.

Small kernels written here; references are NumPy and compared exactly (the instructions move or
select values without arithmetic), except where a cast is stated. Each hardware rule AWS documents
for these names is checked to raise an NKIError that names it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki import NKIError

RNG = np.random.default_rng(27)


# ---------------------------------------------------------------------------- get_nc_version
@nki.jit
def _nc_version_kernel(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    # A kernel that branches on the generation, as nki-library's do.
    scale = 4.0 if nisa.get_nc_version() >= nisa.nc_version.gen4 else 3.0
    nl.store(out, nl.multiply(t, scale))
    return out


@pytest.mark.parametrize("target, gen, scale", [("trn1", nisa.nc_version.gen2, 3.0),
                                                ("trn2", nisa.nc_version.gen3, 3.0),
                                                ("trn3", nisa.nc_version.gen4, 4.0)])
def test_get_nc_version_is_the_simulated_targets_generation(monkeypatch, target, gen, scale):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    assert nisa.get_nc_version() is gen
    x = RNG.standard_normal((128, 16)).astype(np.float32)
    np.testing.assert_array_equal(_nc_version_kernel(x), x * np.float32(scale))


def test_get_nc_version_follows_an_explicit_launch_target(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    seen = []

    @nki.jit
    def probe(x):
        seen.append(nisa.get_nc_version())
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out

    x = np.ones((4, 4), np.float32)
    nki.benchmark(probe, target="trn3")(x)
    probe(x)
    assert seen == [nisa.nc_version.gen4, nisa.nc_version.gen3]


def test_nc_version_is_ordered_like_the_generations():
    v = nisa.nc_version
    assert v.gen2 < v.gen3 < v.gen4
    assert not (v.gen3 >= v.gen4) and v.gen3 == v.gen3
    assert [m.name for m in v] == ["gen2", "gen3", "gen4"]
    import nki.isa  # the alias AWS's kernels import
    assert nki.isa.nc_version is v and nki.isa.get_nc_version is nisa.get_nc_version


# ---------------------------------------------------------------------------- nl.range
@pytest.mark.parametrize("args", [(5,), (2, 7), (1, 10, 3), (8, 0, -2)])
def test_nl_range_is_pythons_range(args):
    assert list(nl.range(*args)) == list(range(*args))
    assert list(nl.range(*args)) == list(nl.sequential_range(*args))


def test_nl_range_drives_a_tiled_kernel():
    @nki.jit
    def tiled_double(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        for i in nl.range(x.shape[1] // 32):
            t = nl.load(x[:, nl.ds(i * 32, 32)])
            nl.store(out[:, nl.ds(i * 32, 32)], nl.add(t, t))
        return out

    x = RNG.standard_normal((64, 96)).astype(np.float32)
    np.testing.assert_array_equal(tiled_double(x), 2 * x)


# ---------------------------------------------------------------------------- nl.tile_size
@pytest.mark.parametrize("target, sbuf", [("trn1", 192 * 1024), ("trn2", 224 * 1024), ("trn3", 256 * 1024)])
def test_tile_size_sbuf_fields_follow_the_target(monkeypatch, target, sbuf):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    ts = nl.tile_size
    assert ts.total_available_sbuf_size == sbuf
    assert ts.sbuf_fmax_bytes == sbuf and ts.sbuf_fmax == sbuf // 4
    assert ts.sbuf_size_bytes == 128 * sbuf
    assert (ts.pmax, ts.psum_fmax, ts.psum_bank_fmax, ts.psum_num_banks) == (128, 512, 512, 8)
    assert ts.psum_fmax_bytes == ts.psum_bank_fmax_bytes == ts.psum_bank_bytes == 2048
    assert (ts.gemm_stationary_fmax, ts.gemm_moving_fmax, ts.bn_stats_fmax) == (128, 512, 512)


def test_total_available_sbuf_size_is_what_the_allocator_allows(monkeypatch):
    """A kernel that sizes its buffers from total_available_sbuf_size (as nki-library's conv1d and
    buffer managers do) fits exactly; one byte per partition more is the capacity error."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    @nki.jit
    def fill(x, extra):
        n = nl.tile_size.total_available_sbuf_size // 4 + extra
        big = nl.ndarray((128, n), nl.float32, buffer=nl.sbuf)
        nisa.memset(big, 1.0)
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, big[:, 0:1])
        return out

    x = np.zeros((1, 1), np.float32)
    assert (fill(x, 0) == 1.0).all()
    with pytest.raises(NKIError, match="SBUF capacity exceeded"):
        fill(x, 1)


# ---------------------------------------------------------------------------- shared_identity_matrix
@nki.jit
def _identity_times(x, dtype):
    """x.T @ I through the Tensor Engine with the shared identity as the moving operand."""
    n = x.shape[0]
    ident = nl.shared_identity_matrix(n, dtype=dtype)
    t = nl.load(x, dtype=dtype)
    acc = nl.ndarray((x.shape[1], n), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, t, ident)
    out = nl.ndarray((x.shape[1], n), nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray(acc.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(res, acc)
    nl.store(out, res)
    return out


@pytest.mark.parametrize("n, dtype", [(128, nl.float32), (64, nl.bfloat16), (16, nl.float16)])
def test_shared_identity_matrix_transposes_through_a_matmul(n, dtype):
    x = RNG.integers(-8, 8, (n, 32)).astype(np.float32)  # exact in bfloat16
    np.testing.assert_array_equal(_identity_times(x, dtype), x.T)


def test_shared_identity_matrix_is_an_sbuf_identity_of_its_dtype():
    got = {}

    @nki.jit
    def probe(x):
        a = nl.shared_identity_matrix(32)
        b = nl.ndarray((8, 8), nl.bfloat16, buffer=nl.sbuf)
        c = nl.shared_identity_matrix(8, dtype=nl.bfloat16, dst=b)
        got.update(a=(a.buffer.kind, a.dtype, a.data.copy()), same=c is b, c=c.data.astype(np.float32))
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out

    probe(np.zeros((1, 1), np.float32))
    kind, dtype, data = got["a"]
    assert kind == "sbuf" and dtype == np.uint8
    np.testing.assert_array_equal(data, np.eye(32, dtype=np.uint8))
    assert got["same"]
    np.testing.assert_array_equal(got["c"], np.eye(8))


@pytest.mark.parametrize("n", [0, 129, 2.0])
def test_shared_identity_matrix_size_limits(n):
    @nki.jit
    def make(x):
        nl.shared_identity_matrix(n)
        return None

    with pytest.raises(NKIError, match="must be an int from 1 to 128"):
        make(np.zeros((1, 1), np.float32))


def test_shared_identity_matrix_dst_must_be_sbuf_n_by_n():
    @nki.jit
    def make(x):
        nl.shared_identity_matrix(16, dst=nl.ndarray((16, 8), nl.float32, buffer=nl.sbuf))

    with pytest.raises(NKIError, match=r"dst must be an SBUF \[16, 16\] tile"):
        make(np.zeros((1, 1), np.float32))


# ---------------------------------------------------------------------------- dma_transpose
def _permute(x):
    return np.transpose(x, {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[x.ndim])


@nki.jit
def _dma_transpose_from_hbm(x, dge):
    shape = _permute(np.empty(x.shape, np.int8)).shape
    out = nl.ndarray(shape, x.dtype, buffer=nl.shared_hbm)
    if shape[0] > nl.tile_size.pmax:  # more rows than partitions: HBM -> HBM
        nisa.dma_transpose(out, x, dge_mode=dge)
        return out
    t = nl.ndarray(shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(t, x, dge_mode=dge)
    nisa.dma_copy(out, t)
    return out


@pytest.mark.parametrize("shape, dtype", [((64, 96), np.float32), ((16, 256), ml_dtypes.bfloat16),
                                          ((5, 3, 32), np.float32), ((4, 2, 3, 16), ml_dtypes.bfloat16),
                                          ((16, 1, 1, 128), np.float16)])
def test_dma_transpose_permutes_as_documented(shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    np.testing.assert_array_equal(_dma_transpose_from_hbm(x, None), _permute(x))


@pytest.mark.parametrize("shape", [(16, 256), (16, 2, 128)])
def test_dma_transpose_hwdge_takes_its_documented_shape(shape):
    x = RNG.standard_normal(shape).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(_dma_transpose_from_hbm(x, nisa.dge_mode.hwdge), _permute(x))


@pytest.mark.parametrize("shape, dtype", [((32, 256), ml_dtypes.bfloat16), ((16, 200), ml_dtypes.bfloat16),
                                          ((16, 256), np.float32)])
def test_dma_transpose_hwdge_limits(shape, dtype):
    x = np.zeros(shape, dtype)
    with pytest.raises(NKIError, match="hardware-DGE transpose needs src.shape"):
        _dma_transpose_from_hbm(x, nisa.dge_mode.hwdge)


def test_dma_transpose_refuses_swdge_for_a_direct_transpose():
    with pytest.raises(NKIError, match="takes only dge_mode.unknown, dge_mode.hwdge or dge_mode.none"):
        _dma_transpose_from_hbm(np.zeros((16, 128), np.float32), nisa.dge_mode.swdge)


def test_dma_transpose_takes_dge_mode_none_without_hwdge_limits():
    """nki-library's mlp_tkg transposes a float32 [3, 128] bias with dge_mode.none (AWS's reference
    lists unknown and hwdge only; the production kernel is the evidence)."""
    x = RNG.standard_normal((3, 128)).astype(np.float32)
    np.testing.assert_array_equal(_dma_transpose_from_hbm(x, nisa.dge_mode.none), _permute(x))
    np.testing.assert_array_equal(_dma_transpose_from_hbm(x, 3), _permute(x))  # the enum's value, as mlp_tkg passes it


def test_dma_transpose_sbuf_to_sbuf_and_cast():
    @nki.jit
    def k(x):
        t = nl.load(x)
        u = nl.ndarray((x.shape[1], x.shape[0]), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=u, src=t, axes=(1, 0))
        out = nl.ndarray(u.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, u)
        return out

    x = RNG.standard_normal((32, 48)).astype(np.float32)
    want = x.T.astype(ml_dtypes.bfloat16).astype(np.float32)  # the DMA casts to dst's dtype (RNE)
    np.testing.assert_array_equal(k(x), want)


@pytest.mark.parametrize("src_shape, dst_shape, axes, match", [
    ((8, 4), (8, 4), None, r"dst shape \(8, 4\) must be \(4, 8\)"),
    ((2, 3, 4), (3, 2, 4), (1, 0, 2), r"axes=\(1, 0, 2\) is not supported"),
    ((8,), (8,), None, "2-, 3- or 4-dimensional"),
    ((2, 2, 2, 2, 2), (2, 2, 2, 2, 2), None, "2-, 3- or 4-dimensional"),
])
def test_dma_transpose_shape_and_axes_rules(src_shape, dst_shape, axes, match):
    @nki.jit
    def k(x):
        t = nl.ndarray(dst_shape, nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(t, x, axes=axes)

    with pytest.raises(NKIError, match=match):
        k(np.zeros(src_shape, np.float32))


def test_dma_transpose_cannot_touch_psum():
    @nki.jit
    def k(x):
        t = nl.ndarray((x.shape[1], x.shape[0]), nl.float32, buffer=nl.psum)
        nisa.dma_transpose(t, x)

    with pytest.raises(NKIError, match="cannot write"):
        k(np.zeros((8, 4), np.float32))


# ---------------------------------------------------------------------------- max8 / nc_find_index8
@nki.jit
def _top8(x, idx_dtype):
    p = x.shape[0]
    t = nl.load(x)
    vals = nl.ndarray((p, 8), x.dtype, buffer=nl.sbuf)
    idx = nl.ndarray((p, 8), idx_dtype, buffer=nl.sbuf)
    nisa.max8(dst=vals, src=t)
    nisa.nc_find_index8(dst=idx, data=t, vals=vals)
    ov = nl.ndarray((p, 8), x.dtype, buffer=nl.shared_hbm)
    oi = nl.ndarray((p, 8), idx_dtype, buffer=nl.shared_hbm)
    nl.store(ov, vals)
    nl.store(oi, idx)
    return ov, oi


@pytest.mark.parametrize("shape, dtype, idx_dtype", [((128, 100), np.float32, nl.uint32),
                                                     ((32, 8), np.float32, nl.uint16),
                                                     ((16, 4, 50), ml_dtypes.bfloat16, nl.uint32),
                                                     ((8, 16384), np.float32, nl.uint32)])
def test_max8_and_find_index8_give_the_top8_and_their_indices(shape, dtype, idx_dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    flat = x.reshape(shape[0], -1).astype(np.float32)
    vals, idx = _top8(x, idx_dtype)
    assert idx.dtype == np.dtype(idx_dtype)
    want = -np.sort(-flat, axis=1)[:, :8]
    np.testing.assert_array_equal(vals.astype(np.float32), want)
    # Indices point at those values; a value repeated in the top 8 (bfloat16 ties) takes its
    # successive occurrences in slot order (AWS: "ascending order across dst_idx columns").
    np.testing.assert_array_equal(np.take_along_axis(flat, idx.astype(np.int64), axis=1), want)
    expect = np.array([[np.flatnonzero(row == v)[list(wrow[:j]).count(v)] for j, v in enumerate(wrow)]
                       for row, wrow in zip(flat, want)])
    np.testing.assert_array_equal(idx, expect)
    if dtype is ml_dtypes.bfloat16:
        assert (np.diff(np.sort(idx.astype(np.int64), axis=1)) > 0).all()  # ties: distinct positions


def test_find_index8_gives_the_first_occurrence_and_the_sentinel():
    @nki.jit
    def k(x, v, idx_dtype):
        t, w = nl.load(x), nl.load(v)
        idx = nl.ndarray((x.shape[0], 8), idx_dtype, buffer=nl.sbuf)
        nisa.nc_find_index8(idx, t, w)
        out = nl.ndarray(idx.shape, idx_dtype, buffer=nl.shared_hbm)
        nl.store(out, idx)
        return out

    x = np.tile(np.array([5, 1, 5, 2, 3, 1, 9, 0, 4, 7], np.float32), (4, 1))
    v = np.tile(np.array([5, 1, 9, 0, 7, 2, 3, 42], np.float32), (4, 1))
    for dtype, sentinel in ((nl.uint32, 0xFFFFFFFF), (nl.uint16, 0xFFFF)):
        got = k(x, v, dtype)
        np.testing.assert_array_equal(got, np.tile([0, 1, 6, 7, 9, 3, 4, sentinel], (4, 1)))


def test_max8_writes_descending_values_cast_to_dst():
    @nki.jit
    def k(x):
        t = nl.load(x)
        v = nl.ndarray((x.shape[0], 8), nl.bfloat16, buffer=nl.sbuf)
        nisa.max8(v, t)
        out = nl.ndarray(v.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(out, v)
        return out

    x = RNG.standard_normal((16, 40)).astype(np.float32)
    want = (-np.sort(-x, axis=1)[:, :8]).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(k(x), want)


@pytest.mark.parametrize("free, match", [(7, "reads 8 to 16384"), (16385, "reads 8 to 16384")])
def test_max8_element_count_limits(free, match):
    with pytest.raises(NKIError, match=match):
        _top8(np.zeros((4, free), np.float32), nl.uint32)


def test_top8_operand_rules():
    @nki.jit
    def bad_idx_dtype(x):
        t = nl.load(x)
        v = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.max8(v, t)
        i = nl.ndarray((4, 8), nl.int32, buffer=nl.sbuf)
        nisa.nc_find_index8(i, t, v)

    @nki.jit
    def bad_dst_shape(x):
        v = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.max8(v, nl.load(x))

    @nki.jit
    def bad_vals(x):
        t = nl.load(x)
        v = nl.ndarray((4, 6), nl.float32, buffer=nl.sbuf)
        nisa.memset(v, 0.0)
        i = nl.ndarray((4, 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(i, t, v)

    @nki.jit
    def from_hbm(x):
        v = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.max8(v, x)

    x = np.zeros((4, 16), np.float32)
    with pytest.raises(NKIError, match="indices are uint32 or uint16"):
        bad_idx_dtype(x)
    with pytest.raises(NKIError, match=r"must hold 8 elements per partition"):
        bad_dst_shape(x)
    with pytest.raises(NKIError, match=r"vals shape \(4, 6\) must hold 8 values"):
        bad_vals(x)
    with pytest.raises(NKIError, match="cannot read"):
        from_hbm(x)
    with pytest.raises(NKIError, match="more than 3"):
        _top8_4d_find(np.zeros((4, 2, 2, 4), np.float32))


@nki.jit
def _top8_4d_find(x):
    t = nl.load(x)
    v = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
    nisa.max8(v, t)  # max8 takes up to 4 free axes
    i = nl.ndarray((4, 8), nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(i, t, v)  # nc_find_index8's data at most 3-D (SDK 2.32)


def test_new_instructions_are_traced_on_their_engines():
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    _top8(x, nl.uint32)
    ops = [(i.op, i.engine) for i in _top8.last_trace]
    assert ("nisa.max8", "vector") in ops and ("nisa.nc_find_index8", "vector") in ops
    _dma_transpose_from_hbm(x, None)
    assert ("nisa.dma_transpose", "dma") in [(i.op, i.engine) for i in _dma_transpose_from_hbm.last_trace]


def test_affine_select_offset_defaults_to_zero():
    """nki-library's cascaded_max builds an identity with affine_select and no offset."""
    @nki.jit
    def eye(x):
        n = x.shape[0]
        t = nl.ndarray((n, n), nl.float32, buffer=nl.sbuf)
        nisa.memset(t, 1.0)
        nisa.affine_select(dst=t, pattern=[[1, n]], channel_multiplier=-1, cmp_op=nl.equal,
                           on_true_tile=t, on_false_value=0.0)
        out = nl.ndarray((n, n), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    for n in (8, 128):
        np.testing.assert_array_equal(eye(np.zeros((n, 1), np.float32)), np.eye(n))


def test_nkiobject_dataclass_takes_unannotated_class_attributes_as_fields():
    """attention_cte builds `SectionParams(section_idx=...)` from a dataclass whose fields are plain
    class attributes; annotated fields, methods and plain (non-dataclass) subclasses are unchanged."""
    from dataclasses import dataclass, fields

    @dataclass
    class Section(nl.NKIObject):
        size: int
        index = None
        offset = 0

        def end(self):
            return self.offset + self.size

    s = Section(4, index=2, offset=8)
    assert (s.size, s.index, s.offset, s.end()) == (4, 2, 8, 12)
    assert [f.name for f in fields(Section)] == ["size", "index", "offset"]
    assert Section(1) == Section(1, None, 0) and Section(1) != Section(1, 3)

    class Plain(nl.NKIObject):
        k = 5

        def __init__(self, z):
            self.z = z

    assert Plain(3).z == 3 and Plain.k == 5
    # AWS's default initializer: a field without a default is an optional argument defaulting to None.
    assert (Section().size, Section().offset) == (None, 0)


def test_find_index8_pairs_repeated_vals_with_successive_matches():
    """AWS's example: data [1, 2, 3, 4, 8 x 7], vals [3, 8 x 7]: nc_find_index8 gives the 8s'
    positions ascending, nc_match_replace8 descending (its duplicate tie-break is the opposite)."""
    @nki.jit
    def k(x, v):
        t, w = nl.load(x), nl.load(v)
        idx = nl.ndarray((x.shape[0], 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(idx, t, w)
        rep_idx = nl.ndarray((x.shape[0], 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=t, data=t, vals=w, imm=-1.0, dst_idx=rep_idx)
        o1 = nl.ndarray(idx.shape, nl.uint32, buffer=nl.shared_hbm)
        o2 = nl.ndarray(idx.shape, nl.uint32, buffer=nl.shared_hbm)
        o3 = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(o1, idx)
        nl.store(o2, rep_idx)
        nl.store(o3, t)
        return o1, o2, o3

    x = np.tile(np.array([1, 2, 3, 4] + [8] * 7, np.float32), (2, 1))
    v = np.tile(np.array([3] + [8] * 7, np.float32), (2, 1))
    find, rep_idx, replaced = k(x, v)
    np.testing.assert_array_equal(find, np.tile([2, 4, 5, 6, 7, 8, 9, 10], (2, 1)))
    np.testing.assert_array_equal(rep_idx, np.tile([2, 10, 9, 8, 7, 6, 5, 4], (2, 1)))
    np.testing.assert_array_equal(replaced, np.tile([1, 2, -1, 4] + [-1] * 7, (2, 1)))


def test_match_replace8_removes_the_top8_for_a_running_top_k():
    """max8 + nc_match_replace8 (imm=-inf) repeated: the top 24 of each row, as nki-library's top-k
    runs it; dst is data itself."""
    @nki.jit
    def top24(x):
        t = nl.load(x)
        vals = nl.ndarray((x.shape[0], 24), nl.float32, buffer=nl.sbuf)
        idx = nl.ndarray((x.shape[0], 24), nl.uint32, buffer=nl.sbuf)
        for r in range(3):
            nisa.max8(dst=vals[:, nl.ds(8 * r, 8)], src=t)
            nisa.nc_match_replace8(dst=t, data=t, vals=vals[:, nl.ds(8 * r, 8)], imm=float("-inf"),
                                   dst_idx=idx[:, nl.ds(8 * r, 8)])
        ov = nl.ndarray(vals.shape, nl.float32, buffer=nl.shared_hbm)
        oi = nl.ndarray(idx.shape, nl.uint32, buffer=nl.shared_hbm)
        nl.store(ov, vals)
        nl.store(oi, idx)
        return ov, oi

    x = RNG.standard_normal((64, 300)).astype(np.float32)
    vals, idx = top24(x)
    np.testing.assert_array_equal(vals, -np.sort(-x, axis=1)[:, :24])
    np.testing.assert_array_equal(np.take_along_axis(x, idx.astype(np.int64), axis=1), vals)


def test_match_replace8_rules():
    @nki.jit
    def bad_dst(x):
        t = nl.load(x)
        v = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.max8(v, t)
        d = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=d, data=t, vals=v, imm=0.0)

    with pytest.raises(NKIError, match=r"dst shape \(4, 8\) must match data shape \(4, 16\)"):
        bad_dst(np.zeros((4, 16), np.float32))


@pytest.mark.parametrize("data_shape, idx_shape, dtype", [((16, 100), (16, 8), np.float32),
                                                          ((128, 4, 32), (128, 2, 5), ml_dtypes.bfloat16)])
def test_nc_n_gather_gathers_within_each_partition(data_shape, idx_shape, dtype):
    @nki.jit
    def gather(x, i):
        t, ii = nl.load(x), nl.load(i)
        d = nl.ndarray(i.shape, x.dtype, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=d, data=t, indices=ii)
        out = nl.ndarray(i.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out

    x = RNG.standard_normal(data_shape).astype(dtype)
    free = int(np.prod(data_shape[1:]))
    idx = RNG.integers(0, free, idx_shape).astype(np.uint32)
    want = np.take_along_axis(x.reshape(data_shape[0], -1), idx.reshape(idx_shape[0], -1).astype(np.int64), 1)
    np.testing.assert_array_equal(gather(x, idx), want.reshape(idx_shape))


def test_nc_n_gather_rules():
    def run(idx_dtype, dst_dtype, bad_index=False, psum=False):
        @nki.jit
        def k(x, i):
            t, ii = nl.load(x), nl.load(i)
            d = nl.ndarray(i.shape, dst_dtype, buffer=nl.psum if psum else nl.sbuf)
            nisa.nc_n_gather(dst=d, data=t, indices=ii)

        i = np.full((4, 8), 99 if bad_index else 1, idx_dtype)
        k(np.zeros((4, 16), np.float32), i)

    with pytest.raises(NKIError, match="indices dtype int32 must be uint32"):
        run(np.int32, nl.float32)
    with pytest.raises(NKIError, match="must be data's"):
        run(np.uint32, nl.bfloat16)
    with pytest.raises(NKIError, match="index 99 is past data's 16 elements"):
        run(np.uint32, nl.float32, bad_index=True)
    with pytest.raises(NKIError, match="GpSimd Engine cannot write"):
        run(np.uint32, nl.float32, psum=True)


# ---------------------------------------------------------------------------- nonzero_with_count / nc_stream_shuffle
@pytest.mark.parametrize("partitions, free, offset, pad", [(128, 64, 0, -1), (32, 16, 100, 7)])
def test_nonzero_with_count_on_each_gpsimd_cores_first_partition(partitions, free, offset, pad):
    @nki.jit
    def k(x):
        t = nl.load(x)
        d = nl.ndarray((x.shape[0], x.shape[1] + 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(d, 5)
        nisa.nonzero_with_count(dst=d, src=t, index_offset=offset, padding_val=pad)
        out = nl.ndarray(d.shape, nl.int32, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out

    x = (RNG.random((partitions, free)) < 0.3).astype(np.float32) * RNG.standard_normal((partitions, free))
    x = x.astype(np.float32)
    got = k(x)
    want = np.full((partitions, free + 1), 5, np.int32)  # other partitions keep their values
    for lane in range(0, partitions, 16):
        nz = np.flatnonzero(x[lane])
        want[lane, :free] = pad
        want[lane, :nz.size] = nz + offset
        want[lane, free] = nz.size
    np.testing.assert_array_equal(got, want)


def test_nonzero_with_count_rules():
    @nki.jit
    def k(x):
        d = nl.ndarray((x.shape[0], x.shape[1]), nl.int32, buffer=nl.sbuf)
        nisa.nonzero_with_count(dst=d, src=nl.load(x))

    with pytest.raises(NKIError, match="one more element per partition"):
        k(np.zeros((16, 8), np.float32))


@pytest.mark.parametrize("partitions", [32, 128])
def test_nc_stream_shuffle_moves_partitions_within_quadrants(partitions):
    mask = list(RNG.permutation(32)[:30]) + [255, 255]

    @nki.jit
    def k(x, in_place):
        t = nl.load(x)
        if in_place:
            nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=mask)
            d = t
        else:
            d = nl.ndarray(x.shape, x.dtype, buffer=nl.psum)
            nisa.memset(d, -3.0)
            nisa.nc_stream_shuffle(dst=d, src=t, shuffle_mask=mask)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(s, d)
        nl.store(out, s)
        return out

    x = RNG.standard_normal((partitions, 24)).astype(np.float32)
    for in_place, keep in ((True, x), (False, np.full_like(x, -3.0))):
        want = keep.copy()
        for q in range(0, partitions, 32):
            for i, m in enumerate(mask):
                if m != 255:
                    want[q + i] = x[q + m]
        np.testing.assert_array_equal(k(x, in_place), want)


def test_nc_stream_shuffle_rules():
    @nki.jit
    def k(x, mask, dst_dtype):
        t = nl.load(x)
        d = nl.ndarray(x.shape, dst_dtype, buffer=nl.sbuf)
        nisa.nc_stream_shuffle(dst=d, src=t, shuffle_mask=mask)

    x = np.zeros((32, 4), np.float32)
    with pytest.raises(NKIError, match="32 entries"):
        k(x, [0] * 16, nl.float32)
    with pytest.raises(NKIError, match="32 entries"):
        k(x, [40] * 32, nl.float32)
    with pytest.raises(NKIError, match="must be src's"):
        k(x, list(range(32)), nl.bfloat16)
    with pytest.raises(NKIError, match="past src's 16 partitions"):
        k(np.zeros((16, 4), np.float32), [20] + [255] * 31, nl.float32)


def test_nc_stream_shuffle_broadcasts_one_partition():
    """nki-library's stream_shuffle_broadcast: src [1, F], mask of zeros, dst up to 32 partitions
    per call (one call per quadrant of dst)."""
    @nki.jit
    def bcast(x, n):
        t = nl.load(x)
        d = nl.ndarray((n, x.shape[1]), x.dtype, buffer=nl.sbuf)
        for q in range((n + 31) // 32):
            rows = min(32, n - q * 32)
            nisa.nc_stream_shuffle(dst=d[q * 32:q * 32 + rows, :], src=t[0:1, :], shuffle_mask=[0] * 32)
        out = nl.ndarray(d.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out

    x = RNG.standard_normal((1, 40)).astype(ml_dtypes.bfloat16)
    for n in (7, 32, 100):
        np.testing.assert_array_equal(bcast(x, n), np.repeat(x, n, axis=0))
