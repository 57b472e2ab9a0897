"""Kernels written for NKI 0.1.0 (`neuronxcc.nki`) keep that version's rules where AWS changed them
in NKI 0.2.0 (`import nki`): the dialect is the defining module's import
(torch_neuronx/nki/v0_1.py), so each kernel here lives in a module file of its own, written
once per import style. References are the inputs themselves (copies: exact)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from torch_neuronx import nki

RNG = np.random.default_rng(101)

_IMPORTS = {
    "0.1": "import neuronxcc.nki as nki\nimport neuronxcc.nki.language as nl\nimport neuronxcc.nki.isa as nisa\n"
           "import neuronxcc.nki.compiler as ncc",
    "0.2": "import nki\nimport nki.language as nl\nimport nki.isa as nisa\nimport nki.compiler as ncc",
}


def _module(tmp_path, dialect, source, **fields):
    """`source` (with {imports} and `fields`) as a module of its own, importing NKI as `dialect`."""
    path = tmp_path / f"kernels_{dialect.replace('.', '_')}_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(source.format(imports=_IMPORTS[dialect], **fields))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- nl loops, traced once
# AWS (NKI migration guide, "Consistent control flow behavior"): NKI 0.1.0 ran an nl loop's body
# once in Python; NKI 0.2.0+ runs it per iteration. A direct allocation at an address the body
# advances (`cur += ...`, AWS's allocated SD attention kernel) therefore sits at one place in every
# iteration of a 0.1.0 kernel.
_LOOP_KERNEL = '''
import numpy as np
{imports}

@nki.jit
def place_in_loop(a, step):
    n = a.shape[0]
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    first = nl.ndarray((128, 64), a.dtype, buffer=nl.shared_hbm)
    cur = 0
    for i in nl.{loop}(n):
        t = nl.ndarray((nl.par_dim(128), 64), dtype=a.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=cur))
        cur += step
        nisa.dma_copy(dst=t, src=a[i])
        nisa.dma_copy(dst=out[i], src=t)
    at_zero = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf, address=(0, 0))
    nisa.dma_copy(dst=first, src=at_zero)
    return out, first


@nki.jit
def nested_with_helper(a, step):
    out = nl.ndarray((2, 2, 128, 64), a.dtype, buffer=nl.shared_hbm)
    cur = [0]

    def staged(x):
        t = nl.ndarray((nl.par_dim(128), 64), dtype=x.dtype, buffer=ncc.sbuf.mod_alloc(base_addr=cur[0]))
        cur[0] += step
        nisa.dma_copy(dst=t, src=x)
        return t

    for i in nl.affine_range(2):
        for j in nl.sequential_range(2):
            nisa.dma_copy(dst=out[i, j], src=staged(a[2 * i + j]))
    places = nl.ndarray((2, 128, 64), a.dtype, buffer=nl.shared_hbm)
    for k in nl.static_range(2):
        nisa.dma_copy(dst=places[k], src=nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf, address=(0, k * step)))
    return out, places
'''
def _loop_module(tmp_path, dialect, loop="affine_range"):
    return _module(tmp_path, dialect, _LOOP_KERNEL, loop=loop)


@pytest.mark.parametrize("loop", ["affine_range", "sequential_range"])
def test_nki_0_1_loop_body_places_its_tensors_once(tmp_path, loop):
    """0.1.0: every iteration's tile at the first trace's address (0), so after the loop address 0
    holds the last iteration's data; 0.2.0: tiles at 0, 256, 512, 768, address 0 holds the first."""
    a = RNG.standard_normal((4, 128, 64), dtype=np.float32)
    out, first = _loop_module(tmp_path, "0.1", loop).place_in_loop(a, 256)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(first, a[3])
    out, first = _loop_module(tmp_path, "0.2", loop).place_in_loop(a, 256)
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(first, a[0])


def test_nki_0_1_address_past_sbuf_after_the_first_iteration_is_not_reached(tmp_path):
    """A step that would leave trn2's 224 KiB SBUF by the third iteration: fine traced once
    (NKI 0.1.0), the real overflow per iteration (NKI 0.2.0+)."""
    a = RNG.standard_normal((3, 128, 64), dtype=np.float32)
    out, _ = _loop_module(tmp_path, "0.1").place_in_loop(a, 120_000)
    np.testing.assert_array_equal(out, a)
    with pytest.raises(nki.NKIError, match=r"SBUF address out of range: a \(128, 64\) tensor needs bytes "
                                           r"\[240000, 240256\)"):
        _loop_module(tmp_path, "0.2").place_in_loop(a, 120_000)


def test_nki_0_1_nested_loops_and_helpers_reuse_each_call_sites_placement(tmp_path):
    """Nested affine/sequential loops through a helper: one placement for the helper's allocation.
    0.1.0: every stage at address 0, so address 0 holds the last stage and address 256 was never
    written (fresh memory's 0xFF poison: NaN); 0.2.0: four stages at 0, 256, 512, 768. The
    nl.static_range loop that reads them back is unrolled in both (one placement per iteration)."""
    a = RNG.standard_normal((4, 128, 64), dtype=np.float32)
    out, places = _loop_module(tmp_path, "0.1").nested_with_helper(a, 256)
    np.testing.assert_array_equal(out.reshape(4, 128, 64), a)
    np.testing.assert_array_equal(places[0], a[3])
    assert np.isnan(places[1]).all()
    out, places = _loop_module(tmp_path, "0.2").nested_with_helper(a, 256)
    np.testing.assert_array_equal(out.reshape(4, 128, 64), a)
    np.testing.assert_array_equal(places, a[:2])


def test_written_for_nki_0_1_reads_the_defining_modules_imports(tmp_path):
    from torch_neuronx.nki.v0_1 import written_for_nki_0_1

    assert written_for_nki_0_1(_loop_module(tmp_path, "0.1").place_in_loop.func)
    assert not written_for_nki_0_1(_loop_module(tmp_path, "0.2").place_in_loop.func)
    assert not written_for_nki_0_1(test_written_for_nki_0_1_reads_the_defining_modules_imports)
    mixed = tmp_path / "mixed.py"  # NKI 0.2.0+ that takes its typing names from neuronxcc (router_topk)
    mixed.write_text("import nki\nimport neuronxcc.nki.typing as nt\n\ndef k():\n    pass\n")
    namespace = {}
    exec(compile(mixed.read_text(), str(mixed), "exec"), namespace)
    assert not written_for_nki_0_1(namespace["k"])


# ---------------------------------------------------------------- nisa.affine_select from PSUM
_SELECT_KERNEL = '''
import numpy as np
{imports}

@nki.jit
def causal_from_psum(q, k):
    """q, k: [64, 128] (contraction on the partitions): scores = q.T @ k in PSUM, the upper
    triangle masked straight from PSUM, as AWS's 0.1.0 SD attention tutorial does."""
    out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
    qt = nl.load(q)
    kt = nl.load(k)
    scores = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=scores, stationary=qt, moving=kt)
    masked = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    nisa.affine_select(dst=masked, pattern=[[-1, 128]], offset=0, channel_multiplier=1,
                       on_true_tile=scores, on_false_value=-9984.0)
    nl.store(out, masked)
    return out
'''


def test_nki_0_1_affine_select_reads_psum_nki_0_2_refuses(tmp_path):
    """NKI 0.1.0's reference gave affine_select no buffer rule and AWS's 0.1.0 kernels select from
    the matmul's PSUM tile; NKI 0.2.0+'s reference: the GpSimd Engine cannot access PSUM."""
    q = RNG.standard_normal((64, 128), dtype=np.float32)
    k = RNG.standard_normal((64, 128), dtype=np.float32)
    scores = q.T.astype(np.float64) @ k
    expected = np.where(np.arange(128)[:, None] >= np.arange(128)[None, :], scores, -9984.0)
    out = _module(tmp_path, "0.1", _SELECT_KERNEL).causal_from_psum(q, k)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(nki.NKIError, match="on_true_tile is in nl.psum, but the GpSimd Engine cannot read"):
        _module(tmp_path, "0.2", _SELECT_KERNEL).causal_from_psum(q, k)


# ---------------------------------------------------------------- nisa.tensor_tensor's free-axis broadcast
_SCALE_KERNEL = '''
import numpy as np
{imports}

@nki.jit
def scale_rows(x, s):
    """x: [128, 96], s: [128, 1]: every row of x times its partition's scale, with tensor_tensor
    (nki-samples' double-row matmul dequantizes this way)."""
    scaled = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    again = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    xt = nl.load(x)
    st = nl.load(s)
    nl.store(scaled, nisa.tensor_tensor(xt, st, nl.multiply))
    nl.store(again, nisa.tensor_tensor(nisa.tensor_tensor(st, xt, nl.subtract), xt, nl.add))  # s - x + x
    return scaled, again
'''


def test_nki_0_1_tensor_tensor_broadcasts_free_axes_nki_0_2_refuses(tmp_path):
    """NKI 0.1.0's reference sends free-axis broadcasting in tensor_tensor to tensor_scalar as the
    faster way (so tensor_tensor had it); NKI 0.2.0+: the same elements per partition."""
    x = RNG.standard_normal((128, 96), dtype=np.float32)
    s = RNG.standard_normal((128, 1), dtype=np.float32)
    scaled, again = _module(tmp_path, "0.1", _SCALE_KERNEL).scale_rows(x, s)
    np.testing.assert_allclose(scaled, x * s, rtol=1e-6)
    np.testing.assert_allclose(again, (s - x) + x, rtol=1e-6, atol=1e-6)
    with pytest.raises(nki.NKIError, match=r"nisa.tensor_tensor: dst shape \(128, 96\) does not match data2"):
        _module(tmp_path, "0.2", _SCALE_KERNEL).scale_rows(x, s)
