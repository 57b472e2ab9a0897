"""The engines' pseudo random number generators (AWS's current NKI reference, aws-neuron-sdk
81ce03ae): `rng` (32 random bits per element, Vector or GpSimd Engine), `rand2` (uniform floats,
Vector Engine, NeuronCore-v4+), `set_rng_seed` (seeds the Vector Engine's generator from one
32-bit value), `rand_set_state` / `rand_get_state` (write / read each compute lane's state: 6
uint32 words on the GpSimd Engine, 24 on the Vector Engine).

AWS documents the interface and the algorithm family (XORWOW), not how the hardware lays out its
state words, derives them from a seed or orders its draws, so the bits cannot match the
hardware's. The simulator keeps, per program (NeuronCore) and engine, one state per compute lane
(partition) and runs Marsaglia's XORWOW on its first six words (x, y, z, w, v, d; the Vector
Engine's other 18 words are kept and read back unchanged). The state is deterministic: before a
kernel seeds it, it comes from the launch's NumPy generator (seeded with 0 at each launch, or by
`nl.random_seed`); `set_rng_seed(s)` derives every lane's state from `s` with NumPy's generator.
Same seed, same numbers; a state read with `rand_get_state` and written back with
`rand_set_state` replays the same numbers.
"""

from __future__ import annotations

import numpy as np

from ..errors import NKIError
from ..runtime import PMAX, current
from .extra import require_gen

STATE_WORDS = {"gpsimd": 6, "vector": 24}
_XORWOW_D = np.uint32(362437)
_INT_DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "uint32")
_RAND2_DTYPES = ("float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float32", "tfloat32",
                 *_INT_DTYPES)


def _isa():
    from .. import isa

    return isa


def _states(instr, eng) -> np.ndarray:
    """The program's generator state of `eng`: [128 lanes, words] uint32, created from the
    launch's generator on first use."""
    run = current(instr)
    states = getattr(run, "rng_states", None)
    if states is None:
        states = run.rng_states = {}
    if eng not in states:
        gen = _isa().random_generator(instr)
        states[eng] = gen.integers(0, 2 ** 32, size=(PMAX, STATE_WORDS[eng]), dtype=np.uint32)
    return states[eng]


def _draw(state: np.ndarray, count: int) -> np.ndarray:
    """`count` XORWOW outputs for each lane of `state` ([lanes, >= 6] uint32, advanced in place)."""
    x, y, z, w, v, d = (state[:, i].copy() for i in range(6))
    out = np.empty((state.shape[0], count), np.uint32)
    with np.errstate(over="ignore"):
        for i in range(count):  # a recurrence: one NumPy step per element, all lanes at once
            t = x ^ (x >> np.uint32(2))
            x, y, z, w = y, z, w, v
            v = (v ^ (v << np.uint32(4))) ^ (t ^ (t << np.uint32(1)))
            d = d + _XORWOW_D
            out[:, i] = v + d
    for i, word in enumerate((x, y, z, w, v, d)):
        state[:, i] = word
    return out


def _bits(instr, eng, dst):
    """32 random bits for each element of dst ([P, F] uint32), from the lanes of dst's partitions."""
    isa = _isa()
    lanes = isa._lanes(dst)
    state = _states(instr, eng)
    block = state[lanes]
    bits = _draw(block, dst.free_size)
    if isa._issued():
        state[lanes] = block
    return bits


def _engine_for(instr, engine, default):
    isa = _isa()
    eng = isa._engine(engine, default, ("vector", "gpsimd"), instr)
    if eng == "gpsimd":
        require_gen(instr, 3, "the GpSimd Engine's random number generator")
    elif default == "gpsimd":  # rand_set_state / rand_get_state on the Vector Engine
        require_gen(instr, 4, "the Vector Engine's generator state access")
    return eng


def rng(dst, engine=None, name=None):
    """32 pseudo random bits per element of dst (an integer tile in SBUF, or PSUM on the Vector
    Engine), truncated to dst's dtype (its least significant bits). Vector Engine (default) or
    GpSimd Engine (NeuronCore-v3+)."""
    isa = _isa()
    instr = "nisa.rng"
    dst = isa._tensor(dst, instr, "dst")
    eng = _engine_for(instr, engine, "vector")
    isa._access(instr, eng, writes=[("dst", dst)])
    if dst.alloc.dtype_name not in _INT_DTYPES:
        raise NKIError(instr, f"dst dtype {dst.alloc.dtype_name} must be an integer type ({', '.join(_INT_DTYPES)})",
                       "write the bits as uint16 / uint32 and normalize them with a later instruction")
    bits = _bits(instr, eng, dst)
    isa._store(dst, bits.astype(dst.data.dtype).reshape(dst.shape))
    isa._record(instr, eng, [dst], [], ("elementwise", dst.free_size) if eng == "vector" else ("gpsimd", dst.free_size))


def rand2(dst, min, max, name=None):  # noqa: A002 - AWS's parameter names
    """Uniform pseudo random numbers in [min, max) (float32, numbers or [P, 1] tiles) on the Vector
    Engine, cast to dst's dtype; NeuronCore-v4+. Each draw is min + (bits >> 8) * 2^-24 * (max - min)."""
    isa = _isa()
    instr = "nisa.rand2"
    require_gen(instr, 4)
    dst = isa._tensor(dst, instr, "dst")
    isa._access(instr, "vector", writes=[("dst", dst)])
    if dst.alloc.dtype_name not in _RAND2_DTYPES:
        raise NKIError(instr, f"dst dtype {dst.alloc.dtype_name} is not supported", "use float32 or bfloat16")
    lo, lo_t = isa._scalar_operand(min, instr, "min", dst.partitions, "vector")
    hi, hi_t = isa._scalar_operand(max, instr, "max", dst.partitions, "vector")
    if np.any(np.asarray(lo) >= np.asarray(hi)):
        raise NKIError(instr, f"min must be less than max (got min={min!r}, max={max!r})", "swap or widen the range")
    unit = (_bits(instr, "vector", dst) >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)
    isa._write(dst, lo + unit * (hi - lo))
    reads = [t for t in (lo_t, hi_t) if t is not None]
    isa._record(instr, "vector", [dst], reads, ("elementwise", dst.free_size))


def set_rng_seed(src_seeds, name=None):
    """Seed the Vector Engine's generator from one 32-bit value (a [1, 1] tile in SBUF or PSUM):
    every lane's state is derived from it, so the same seed gives the same numbers."""
    isa = _isa()
    instr = "nisa.set_rng_seed"
    seeds = isa._tensor(src_seeds, instr, "src_seeds")
    isa._access(instr, "vector", reads=[("src_seeds", seeds)])
    if seeds.data.size != 1 or seeds.partitions != 1:
        raise NKIError(instr, f"src_seeds shape {seeds.shape} must be [1, 1] (one 32-bit seed)")
    if np.dtype(seeds.data.dtype).itemsize != 4:
        raise NKIError(instr, f"src_seeds dtype {seeds.alloc.dtype_name} must be a 32-bit type",
                       "store the seed as uint32 or int32")
    seed = int(seeds.data.reshape(-1).view(np.uint32)[0])
    if isa._issued():
        state = _states(instr, "vector")
        state[...] = np.random.default_rng(seed).integers(0, 2 ** 32, size=state.shape, dtype=np.uint32)
    isa._record(instr, "vector", [], [seeds], ("elementwise", 1))


def _state_tile(instr, t, eng, role):
    words = STATE_WORDS[eng]
    if t.alloc.dtype_name != "uint32":
        raise NKIError(instr, f"{role} dtype {t.alloc.dtype_name} must be uint32")
    if t.free_size != words:
        raise NKIError(instr, f"{role} has {t.free_size} elements per partition; an XORWOW state of the "
                       f"{'GpSimd' if eng == 'gpsimd' else 'Vector'} Engine is {words} uint32 words",
                       f"allocate {role} as [P, {words}] uint32")


def rand_set_state(src_seeds, engine=None, name=None):
    """Set the generator state of the lanes of src_seeds' partitions (SBUF, uint32, [P, 6] for the
    GpSimd Engine, the default, or [P, 24] for the Vector Engine, NeuronCore-v4+); NeuronCore-v3+."""
    isa = _isa()
    instr = "nisa.rand_set_state"
    require_gen(instr, 3)
    seeds = isa._tensor(src_seeds, instr, "src_seeds")
    eng = _engine_for(instr, engine, "gpsimd")
    isa._access(instr, eng, reads=[("src_seeds", seeds)])
    if seeds.buffer.kind != "sbuf":
        raise NKIError(instr, f"src_seeds is in {seeds.buffer!r}; it must be in SBUF", "copy it to SBUF first")
    _state_tile(instr, seeds, eng, "src_seeds")
    if isa._issued():
        _states(instr, eng)[isa._lanes(seeds)] = seeds.data.reshape(seeds.partitions, -1)
    cost = ("elementwise", seeds.free_size) if eng == "vector" else ("gpsimd", seeds.free_size)
    isa._record(instr, eng, [], [seeds], cost)


def rand_get_state(dst, engine=None, name=None):
    """Write the generator state of the lanes of dst's partitions into dst (uint32, [P, 6] for the
    GpSimd Engine, the default, or [P, 24] for the Vector Engine, NeuronCore-v4+); SBUF (PSUM too
    from the Vector Engine on NeuronCore-v4+); NeuronCore-v3+."""
    isa = _isa()
    instr = "nisa.rand_get_state"
    require_gen(instr, 3)
    dst = isa._tensor(dst, instr, "dst")
    eng = _engine_for(instr, engine, "gpsimd")
    isa._access(instr, eng, writes=[("dst", dst)])
    _state_tile(instr, dst, eng, "dst")
    isa._store(dst, _states(instr, eng)[isa._lanes(dst)].copy().reshape(dst.shape))
    cost = ("elementwise", dst.free_size) if eng == "vector" else ("gpsimd", dst.free_size)
    isa._record(instr, eng, [dst], [], cost)
