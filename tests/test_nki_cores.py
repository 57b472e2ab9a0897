"""Logical NeuronCores in the NKI simulator: the programs of an LNC 2 launch run concurrently, and
`nisa.core_barrier` / `nisa.sendrecv` synchronize them; virtual registers (`nisa.register_*`,
`nl.dynamic_range`); unary ALU operators (`nl.abs` as op0); `nki.collectives` on one rank.

References are NumPy. Exchanges and copies are exact (data moves bit for bit); reductions in float32
to rtol 1e-6, bfloat16 results to one bfloat16 ulp (rtol 8e-3). Deadlocks and misuse are NKIErrors
whose messages say what, why and what to do.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.collectives as ncc
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

RNG = np.random.default_rng(27)
BF16 = ml_dtypes.bfloat16


def _data(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------- sendrecv
@nki.jit
def _swap_halves(a):
    """Core r loads half r of `a` and sends it to the other core, which stores it in its own half."""
    rank = nl.program_id(0)
    half = a.shape[0] // 2
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((half, a.shape[1]), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(mine, a[nl.ds(rank * half, half), :])
    theirs = nl.ndarray((half, a.shape[1]), a.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    nisa.dma_copy(out[nl.ds(rank * half, half), :], theirs)
    return out


@pytest.mark.parametrize("shape, dtype", [((8, 16), np.float32), ((256, 64), BF16), ((64, 3), np.int32)])
def test_sendrecv_exchanges_tiles_between_the_two_cores(shape, dtype):
    a = _data(shape).astype(dtype) if dtype is not np.int32 else RNG.integers(-2**31, 2**31 - 1, shape, np.int32)
    got = nki.cpu_simulate(_swap_halves)[2](a=a)
    half = shape[0] // 2
    np.testing.assert_array_equal(got, np.concatenate([a[half:], a[:half]]))  # bit for bit


@pytest.mark.parametrize("x4", [nl.float8_e4m3fn_x4, nl.float4_e2m1fn_x4])
def test_sendrecv_moves_packed_mx_containers_bit_for_bit(x4):
    """Packed MX tiles (nki-library's rmsnorm_mx_quantize_tkg exchanges its quantized halves)."""
    values = RNG.standard_normal((64, 32)).astype(np.float32) * 4
    a = nl.static_cast(values, x4)  # [64, 8] containers
    got = nki.cpu_simulate(_swap_halves)[2](a=a)
    storage = np.uint32 if x4 is nl.float8_e4m3fn_x4 else np.uint16
    bits = np.asarray(a).view(storage)
    np.testing.assert_array_equal(np.asarray(got).view(storage), np.concatenate([bits[32:], bits[:32]]))
    np.testing.assert_array_equal(nl.static_cast(got, np.float32)[:32], nl.static_cast(a, np.float32)[32:])


@nki.jit
def _lnc_row_sums(x):
    """rmsnorm_tkg's pattern: each core sums its half of the columns, the cores exchange the partial
    sums with sendrecv and add them: both hold the full row sums."""
    rank = nl.program_id(0)
    p, f = x.shape
    half = f // 2
    tile = nl.ndarray((p, half), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(tile, x[:, nl.ds(rank * half, half)])
    part = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(part, nl.add, tile, axis=1)
    other = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.sendrecv(src=part, dst=other, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=3)
    total = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(total, part, other, op=nl.add)
    out = nl.ndarray((2, p), nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(out[rank].reshape((p, 1)), total)
    return out


@pytest.mark.parametrize("shape", [(128, 512), (32, 6)])
def test_sendrecv_all_reduce_of_partial_sums(shape):
    x = _data(shape)
    got = _lnc_row_sums[2](x)
    want = x.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0], got[1])  # both cores hold the same sum


@nki.jit
def _two_pipes(a, b):
    rank = nl.program_id(0)
    out = nl.ndarray((2,) + a.shape, a.dtype, buffer=nl.shared_hbm)
    ta, tb = (nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf) for _ in range(2))
    nisa.dma_copy(ta, a)
    nisa.dma_copy(tb, b)
    nisa.tensor_scalar(ta, ta, op0=nl.add, operand0=float(rank))  # core-specific data
    nisa.tensor_scalar(tb, tb, op0=nl.add, operand0=float(rank))
    ra, rb = (nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf) for _ in range(2))
    nisa.sendrecv(src=ta, dst=ra, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
    nisa.sendrecv(src=tb, dst=rb, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=1,
                  dma_engine=nisa.dma_engine.gpsimd_dma)
    # The sender overwrites its tile after the send: the receiver still gets what was sent.
    nisa.memset(ta, 0.0)
    nisa.tensor_tensor(ra, ra, rb, op=nl.subtract)
    nisa.dma_copy(out[rank], ra)
    return out


def test_sendrecv_pipes_keep_their_tiles_apart():
    a, b = _data((16, 8)), _data((16, 8))
    got = _two_pipes[2](a, b)
    for rank in (0, 1):
        other = 1 - rank
        np.testing.assert_allclose(got[rank], (a + other) - (b + other), rtol=1e-6)


# ---------------------------------------------------------------------------- core_barrier
@nki.jit
def _write_then_read_other_half(a, barrier=True):
    """Core r writes 2 * a's half r into a shared HBM tensor; after the barrier each core reads the
    whole tensor back and stores its row sums: correct only if the other core's half is there."""
    rank = nl.program_id(0)
    p, f = a.shape
    half = p // 2
    shared = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    sums = nl.ndarray((2, p), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((half, f), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, a[nl.ds(rank * half, half), :])
    nisa.tensor_scalar(t, t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(shared[nl.ds(rank * half, half), :], t)
    if barrier:
        nisa.core_barrier(shared, (0, 1))
    whole = nl.ndarray((p, f), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(whole, shared)
    s = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(s, nl.add, whole, axis=1)
    nisa.dma_copy(sums[rank].reshape((p, 1)), s)
    return shared, sums


@pytest.mark.parametrize("shape, dtype, rtol", [((16, 32), np.float32, 1e-5), ((128, 64), BF16, 8e-3)])
def test_core_barrier_makes_the_other_cores_writes_visible(shape, dtype, rtol):
    a = _data(shape).astype(dtype)
    shared, sums = nki.cpu_simulate(_write_then_read_other_half)[2](a=a)
    np.testing.assert_array_equal(shared, (2 * a.astype(np.float32)).astype(dtype))
    want = (2 * a.astype(np.float32)).astype(dtype).astype(np.float64).sum(axis=1)
    for rank in (0, 1):
        np.testing.assert_allclose(sums[rank], want, rtol=rtol, atol=1e-4)


def test_without_the_barrier_core_0_reads_before_core_1_wrote():
    """The cores really run concurrently: without the barrier, core 0 runs to its end first and
    reads core 1's half before it is written (fresh HBM is NaN); core 1 then sees both halves."""
    a = _data((16, 32))
    _, sums = _write_then_read_other_half[2](a, barrier=False)
    assert np.isnan(sums[0][8:]).all() and not np.isnan(sums[0][:8]).any()
    assert not np.isnan(sums[1]).any()


@nki.jit
def _barrier_loop(a, n):
    """n rounds: core r adds 1 to its row of a shared counter, then (after a barrier) copies the
    other core's row; a missing barrier in any round would leave a stale value."""
    rank = nl.program_id(0)
    state = nl.ndarray((2, a.shape[1]), a.dtype, buffer=nl.shared_hbm)
    seen = nl.ndarray((2, n, a.shape[1]), a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((1, a.shape[1]), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, a[nl.ds(rank, 1), :])
    for i in nl.sequential_range(n):
        nisa.tensor_scalar(t, t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(state[nl.ds(rank, 1), :], t)
        nisa.core_barrier(state, cores=[0, 1])
        o = nl.ndarray((1, a.shape[1]), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(o, state[nl.ds(1 - rank, 1), :])
        nisa.dma_copy(seen[rank, nl.ds(i, 1), :], o)
        nisa.core_barrier(state, cores=(0, 1), engine=nisa.engine.vector)  # before the next round's write
    return seen


def test_core_barrier_in_a_loop_pairs_the_nth_barriers():
    a = _data((2, 8))
    seen = _barrier_loop[2](a, 3)
    for rank in (0, 1):
        for i in range(3):
            np.testing.assert_allclose(seen[rank, i], a[1 - rank] + (i + 1), rtol=1e-6)


def test_a_launch_without_barriers_runs_its_programs_in_order_with_own_memory():
    a = _data((16, 32))
    _swap = _write_then_read_other_half
    _swap[2](a, barrier=False)
    trace = _swap.last_trace
    # program 0's instructions all come before program 1's (sequential, as before)
    locations = [ins.op for ins in trace]
    assert len(locations) == 2 * 6
    # each program is its own core: SBUF peak is one program's tiles, not both cores' together
    # the [16, 32] whole and the [16, 1] sums: the [8, 32] half's last use comes before them (liveness)
    one_core = (32 * 4) + 4
    assert _swap.last_run.peak_sbuf == one_core


def test_a_barrier_at_lnc_1_waits_for_nothing():
    """AWS 2.33: at LNC 1 the (0, 1) barrier pairs two logical cores, each running its own launch;
    the partner is not simulated (nki-library's router_topk issues it at any LNC)."""
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, a)
        nisa.dma_copy(out, t)
        nisa.core_barrier(out, (0, 1))
        return out

    a = _data((4, 4))
    np.testing.assert_array_equal(k(a), a)
    assert [i.op for i in k.last_trace][-1] == "nisa.core_barrier"


def test_a_single_core_barrier_and_a_self_sendrecv_on_one_program():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        r = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, a)
        nisa.sendrecv(src=t, dst=r, send_to_rank=0, recv_from_rank=0, pipe_id=0)
        nisa.dma_copy(out, r)
        nisa.core_barrier(out, (0))  # nki-library's NUM_SHARDS == 1 barrier
        return out

    a = _data((4, 4))
    np.testing.assert_array_equal(k(a), a)
    np.testing.assert_array_equal(k[1](a), a)


# ---------------------------------------------------------------------------- deadlocks and errors
def test_a_barrier_one_core_never_reaches_is_a_deadlock():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 0:
            nisa.core_barrier(out, (0, 1))
        return out

    with pytest.raises(nki.NKIError, match=r"deadlock.*core 0 waits at nisa.core_barrier\(cores=\(0, 1\)\) number 1"
                       r".*core 1 finished the kernel.*Fix: make every core"):
        k[2](np.zeros((2, 2), np.float32))


def test_unequal_barrier_counts_deadlock():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        for _ in range(2 - nl.program_id(0)):  # core 0: two barriers, core 1: one
            nisa.core_barrier(out, (0, 1))
        return out

    with pytest.raises(nki.NKIError, match=r"deadlock.*core 0 waits at .*number 2"):
        k[2](np.zeros((2, 2), np.float32))


def test_a_sendrecv_without_partner_is_a_deadlock_naming_the_pipe():
    @nki.jit
    def k(a):
        rank = nl.program_id(0)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.memset(t, 1.0)
        pipe = 0 if rank == 0 else 1  # the cores use different pipes: nothing arrives
        nisa.sendrecv(src=t, dst=t, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=pipe)
        return None

    with pytest.raises(nki.NKIError, match=r"deadlock.*core 0 waits at nisa.sendrecv\(recv_from_rank=1, pipe_id=0\)"
                       r".*core 1 waits at nisa.sendrecv\(recv_from_rank=0, pipe_id=1\)"):
        k[2](np.zeros((2, 2), np.float32))


def test_an_error_on_one_core_stops_the_launch_with_that_error():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        if nl.program_id(0) == 1:
            nl.ndarray((129, 4), nl.float32, buffer=nl.sbuf)  # partition dimension > 128
        nisa.core_barrier(out, (0, 1))
        return out

    with pytest.raises(nki.NKIError, match="partition dimension 129"):
        k[2](np.zeros((2, 2), np.float32))
    # and the next launch runs normally
    np.testing.assert_array_equal(nki.cpu_simulate(_swap_halves)[2](a=np.eye(4, dtype=np.float32)),
                                  np.eye(4, dtype=np.float32)[[2, 3, 0, 1]])


def _sendrecv_kernel(src_buf=nl.sbuf, dst_buf=nl.sbuf, dst_dtype=nl.float32, dst_shape=(4, 8), to=None, frm=None,
                     engine=None, src_shape=(4, 8)):
    @nki.jit
    def k(a):
        rank = nl.program_id(0)
        src = nl.ndarray(src_shape, nl.float32, buffer=src_buf)
        dst = nl.ndarray(dst_shape, dst_dtype, buffer=dst_buf)
        nisa.sendrecv(src=src, dst=dst, send_to_rank=1 - rank if to is None else to,
                      recv_from_rank=1 - rank if frm is None else frm, pipe_id=0,
                      **({} if engine is None else {"dma_engine": engine}))
        return None
    return k


@pytest.mark.parametrize("kwargs, grid, match", [
    ({"src_buf": nl.psum}, 2, r"src is in nl.psum.*must both be in nl.sbuf.*Fix: copy the tile to SBUF"),
    ({"dst_buf": nl.shared_hbm}, 2, r"dst is in nl.shared_hbm.*must both be in nl.sbuf"),
    ({"dst_dtype": nl.bfloat16}, 2, r"src is float32 and dst is bfloat16; sendrecv does not convert"),
    ({"dst_shape": (4, 4)}, 2, r"dst shape \(4, 4\) does not match src shape \(4, 8\)"),
    ({"to": 2}, 2, r"send_to_rank=2: .*ranks 0 and 1"),
    ({"to": 1, "frm": 1}, 1, r"send_to_rank=1, but this launch has 1 program.*Fix: launch the kernel on both cores"),
    ({"engine": nisa.dma_engine.gpsimd_dma, "src_shape": (4, 512), "dst_shape": (4, 512)}, 2,
     r"gpsimd_dma moves at most 1024 bytes per partition of a 32-bit type; src has 2048"),
])
def test_sendrecv_rules(kwargs, grid, match):
    with pytest.raises(nki.NKIError, match=match):
        _sendrecv_kernel(**kwargs)[grid](np.zeros((1, 1), np.float32))


def test_sendrecv_receiving_a_different_tile_is_an_error():
    @nki.jit
    def k(a):
        rank = nl.program_id(0)
        shape = (4, 8) if rank == 0 else (8, 4)
        t = nl.ndarray(shape, nl.float32, buffer=nl.sbuf)
        nisa.memset(t, 0.0)
        nisa.sendrecv(src=t, dst=t, send_to_rank=1 - rank, recv_from_rank=1 - rank, pipe_id=0)
        return None

    with pytest.raises(nki.NKIError, match=r"core 1 receives into a float32 \(8, 4\) dst, but core 0 sent a "
                       r"float32 \(4, 8\) tile on pipe_id 0"):
        k[2](np.zeros((1, 1), np.float32))


@pytest.mark.parametrize("cores, grid, match", [
    ((0, 2), 2, r"cores=\(0, 2\).*only cores=\(0, 1\) is supported"),
    ((1,), 1, r"core 0 issued a barrier over cores=\(1,\), which does not include it"),
    ("ab", 2, r"cores must be a core index or a tuple of them"),
])
def test_core_barrier_rules(cores, grid, match):
    @nki.jit
    def k(a):
        nisa.core_barrier(a, cores)
        return None

    with pytest.raises(nki.NKIError, match=match):
        k[grid](np.zeros((2, 2), np.float32))


def test_core_barrier_caller_must_be_listed_and_engine_checked():
    @nki.jit
    def k(a, engine=None):
        nisa.core_barrier(a, (0,), **({} if engine is None else {"engine": engine}))
        return None

    with pytest.raises(nki.NKIError, match=r"core 1 issued a barrier over cores=\(0,\), which does not include it"):
        k[2](np.zeros((2, 2), np.float32))
    with pytest.raises(nki.NKIError, match=r"engine 'dma' cannot run a barrier"):
        k(np.zeros((2, 2), np.float32), "dma")


# ---------------------------------------------------------------------------- registers
@nki.jit
def _dynamic_rows(a, n_tiles):
    """dynamic_elementwise_add's pattern: a trip count loaded into a register bounds the loop;
    the row offset lives in SBUF and indexes HBM through scalar_offset."""
    p, f = 4, a.shape[1]
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
    nisa.memset(zero, 0.0)
    nisa.dma_copy(out, zero)
    count = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(count, n_tiles)
    reg = nisa.register_alloc()
    nisa.register_load(reg, count)
    row = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(row, 0)
    for _ in nl.dynamic_range(0, reg, 1):
        t = nl.ndarray((p, f), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(t, a.ap(pattern=[[f, p], [1, f]], offset=0, scalar_offset=row, indirect_dim=0))
        nisa.tensor_scalar(t, t, op0=nl.multiply, operand0=3.0)
        nisa.dma_copy(out.ap(pattern=[[f, p], [1, f]], offset=0, scalar_offset=row, indirect_dim=0), t)
        nisa.tensor_scalar(row, row, op0=nl.add, operand0=p)
    done = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
    counter = nisa.register_alloc(0)
    while reg:  # count down the register (AWS: `while reg:` loops on a register)
        nisa.register_store(count, reg)
        nisa.tensor_scalar(count, count, op0=nl.subtract, operand0=1)
        nisa.register_load(reg, count)
        nisa.register_store(row, counter)
        nisa.tensor_scalar(row, row, op0=nl.add, operand0=1)
        nisa.register_load(counter, row)
    moved = nisa.register_alloc()
    nisa.register_move(moved, counter)
    nisa.register_store(done, moved)
    return out, done


@pytest.mark.parametrize("n, dtype", [(0, np.float32), (2, np.float32), (4, BF16)])
def test_registers_bound_dynamic_loops(n, dtype):
    a = _data((16, 8)).astype(dtype)
    out, done = _dynamic_rows(a, np.array([[n]], np.int32))
    want = np.zeros_like(a)
    want[:4 * n] = (a[:4 * n].astype(np.float32) * 3).astype(dtype)
    np.testing.assert_array_equal(out, want)
    assert done.item() == n


def test_register_values_and_rules():
    seen = {}

    @nki.jit
    def k(a, case):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(t, a)
        if case == "values":
            r = nisa.register_alloc(t[0, 0])  # nki-library passes a tile element
            seen["from_tile"] = int(r)
            nisa.register_move(r, 2**31 + 5)  # 32-bit: wraps as int32
            seen["wrapped"] = int(r)
            seen["range"] = list(nl.dynamic_range(nisa.register_alloc(3)))
            hits = []
            nl.fori_loop(1, nisa.register_alloc(4), lambda i: hits.append(int(i)))
            seen["fori"] = hits
        elif case == "uninitialized":
            for _ in nl.dynamic_range(nisa.register_alloc()):
                pass
        elif case == "multi":
            nisa.register_load(nisa.register_alloc(), nl.ndarray((2, 1), nl.int32, buffer=nl.sbuf))
        elif case == "psum":
            nisa.register_load(nisa.register_alloc(), nl.ndarray((1, 1), nl.int32, buffer=nl.psum))
        elif case == "step":
            nl.dynamic_range(0, 4, nisa.register_alloc(1))
        elif case == "move":
            nisa.register_move(nisa.register_alloc(), t)
        return None

    k(np.array([[-7]], np.int32), "values")
    assert seen == {"from_tile": -7, "wrapped": -2**31 + 5, "range": [0, 1, 2], "fori": [1, 2, 3]}
    for case, match in [("uninitialized", r"allocated without a value and never set.*Fix: initialize it"),
                        ("multi", r"src has shape \(2, 1\); a register holds one 32-bit scalar"),
                        ("psum", r"src is in nl.psum; registers load from and store to HBM or SBUF"),
                        ("step", r"step must be a positive integer constant"),
                        ("move", r"src must be a constant integer or a register.*Fix: load a tensor's value")]:
        with pytest.raises(nki.NKIError, match=match):
            k(np.array([[1]], np.int32), case)


# ---------------------------------------------------------------------------- unary ALU operators
@nki.jit
def _absmax(x, op0=nl.abs, operand0=0.0):
    p, f = x.shape
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x)
    a = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    m = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=a, data=t, op0=op0, operand0=operand0, reduce_op=nl.maximum, reduce_res=m)
    s = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(s, t, op0=nl.abs, operand0=None, op1=nl.multiply, operand1=0.5)
    q = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=q, data=t, op0=nl.square, operand0=0, op1=nl.add, operand1=s)
    outs = [nl.ndarray(v.shape, v.dtype, buffer=nl.shared_hbm) for v in (a, m, q)]
    for o, v in zip(outs, (a, m, q)):
        nisa.dma_copy(o, v)
    return tuple(outs)


@pytest.mark.parametrize("shape, dtype", [((128, 96), np.float32), ((16, 512), BF16)])
def test_abs_and_square_as_alu_operators(shape, dtype):
    x = _data(shape).astype(dtype)
    a, m, q = _absmax(x)
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(a, np.abs(x))  # abs is exact
    np.testing.assert_array_equal(m.ravel(), np.abs(x32).max(axis=1))
    np.testing.assert_allclose(q, x32 * x32 + 0.5 * np.abs(x32), rtol=1e-6)


def test_unary_alu_operator_rules():
    x = _data((4, 8))
    with pytest.raises(nki.NKIError, match=r"operand0 is 2.0, but nl.abs is a unary operator: its operand must be "
                       r"None or 0.*Fix: pass operand0=0.0"):
        _absmax(x, nl.abs, 2.0)
    with pytest.raises(nki.NKIError, match=r"nl.exp is an activation function, not an ALU operator.*nisa.activation"):
        _absmax(x, nl.exp, 0.0)


# ---------------------------------------------------------------------------- nki.collectives
@nki.jit
def _collectives(a, rg, memory="sbuf"):
    """Every collective on a one-rank group, SBUF and HBM, at the launch's LNC."""
    buf = nl.sbuf if memory == "sbuf" else nl.shared_hbm
    t = nl.ndarray(a.shape, a.dtype, buffer=buf)
    nisa.dma_copy(t, a)
    outs = [nl.ndarray(a.shape, a.dtype, buffer=buf) for _ in range(4)]
    ncc.all_reduce(srcs=[t], dsts=[outs[0]], replica_group=rg, op=nl.add)
    ncc.all_gather(srcs=[t], dsts=[outs[1]], replica_group=rg, collective_dim=0)
    ncc.reduce_scatter(srcs=[t], dsts=[outs[2]], replica_group=rg, collective_dim=0, op=nl.maximum)
    ncc.collective_permute_implicit_reduce(srcs0_by_channel=[[t]], srcs1_by_channel=[[outs[0]]],
                                           dsts_by_channel=[[outs[3]]], replica_group=rg, op=nl.add)
    assert int(ncc.rank_id()) == 0
    assert int(ncc.collective_permute_implicit_current_processing_rank_id(iteration_id=1, replica_group=rg)) == 0
    results = [nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm) for _ in range(6)]
    for r, o in zip(results, outs):
        nisa.dma_copy(r, o)
    if memory == "hbm":
        ncc.all_to_all(srcs=[t], dsts=[results[4]], replica_group=rg, collective_dim=0)
        ncc.collective_permute(srcs=[t], dsts=[results[5]], source_target_pairs=[(0, 0)])
    else:
        ncc.collective_permute_implicit(srcs_by_channel=[[t], [outs[0]]], dsts_by_channel=[[outs[1]], [outs[2]]],
                                        replica_group=rg, channel_ids=[0, 1])
        nisa.dma_copy(results[4], outs[1])
        nisa.dma_copy(results[5], outs[2])
    return tuple(results)


@pytest.mark.parametrize("memory, grid", [("sbuf", 2), ("hbm", 1)])
@pytest.mark.parametrize("shape, dtype", [((8, 16), np.float32), ((128, 32), BF16)])
def test_collectives_on_a_one_rank_group(memory, grid, shape, dtype):
    a = _data(shape).astype(dtype)
    got = _collectives[grid](a, ncc.ReplicaGroup([[0]]), memory)
    for i in (0, 1, 2, 4, 5):  # an all-reduce / all-gather / ... of one contribution is that contribution
        np.testing.assert_array_equal(got[i], a)
    np.testing.assert_array_equal(got[3], (2 * a.astype(np.float32)).astype(dtype))  # op(src0, src1)


@pytest.mark.parametrize("call, match", [
    (lambda t, o, rg: ncc.all_reduce([t], [o], ncc.ReplicaGroup([[0, 1, 2, 3]]), nl.add),
     r"replica group \[\[0, 1, 2, 3\]\] names rank 1, but the simulated world has 1 rank\(s\).*Fix: simulate the "
     r"ranks together with nki.multi_rank_simulate"),
    (lambda t, o, rg: ncc.all_reduce([t], [o], rg, nl.multiply), r"op nl.multiply is not a collective reduction"),
    (lambda t, o, rg: ncc.all_gather([t], [o], rg, collective_dim=2), r"collective_dim=2 is not supported for SBUF"),
    (lambda t, o, rg: ncc.all_to_all([t], [o], rg, collective_dim=0), r"AWS supports only HBM tensors"),
    (lambda t, o, rg: ncc.all_reduce(t, [o], rg, nl.add), r"srcs must be a list of tensors"),
    (lambda t, o, rg: ncc.all_gather_v([t], [o], rg, t), r"variable-size collective .* is not simulated"),
    (lambda t, o, rg: ncc.collective_permute([nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)],
                                             [nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)], [(0, 1), (1, 0)]),
     r"source_target_pairs name rank 1, but the simulated world has 1 rank\(s\)"),
    (lambda t, o, rg: ncc.all_reduce([t], [nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)], rg, nl.add),
     r"the tensors mix HBM and SBUF"),
])
def test_collective_rules(call, match):
    @nki.jit
    def k(a):
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        o = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        call(t, o, ncc.ReplicaGroup([[0]]))
        return None

    with pytest.raises(nki.NKIError, match=match):
        k(np.zeros((1, 1), np.float32))


def test_replica_group_forms_and_overlap():
    assert ncc.ReplicaGroup([0]).groups == [[0]]
    assert ncc.ReplicaGroup([[0], [1]]).groups == [[0], [1]]
    with pytest.raises(nki.NKIError, match=r"rank 1 is in two rank-lists"):
        ncc.ReplicaGroup([[0, 1], [1, 2]])


def test_nki_collectives_imports_as_aws_spells_it():
    import nki.collectives as aws_ncc
    from nki.collectives import ReplicaGroup

    assert aws_ncc is ncc and ReplicaGroup is ncc.ReplicaGroup
    assert nki.isa.core_barrier is nisa.core_barrier and nisa.sendrecv and nisa.register_alloc


# ---------------------------------------------------------------------------- nki.multi_rank_simulate
def _ranks(n, shape, dtype=np.float32):
    return [_data(shape).astype(dtype) for _ in range(n)]


@nki.jit
def _hbm_collectives(x, rg, n):
    """all_reduce (add, max), all_gather, reduce_scatter and all_to_all of one HBM tensor."""
    p, f = x.shape
    src = nl.ndarray(x.shape, x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(src, x)
    total = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    top = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    gathered = nl.ndarray((n * p, f), x.dtype, buffer=nl.shared_hbm)
    scattered = nl.ndarray((p // n, f), x.dtype, buffer=nl.shared_hbm)
    swapped = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    ncc.all_reduce(srcs=[src], dsts=[total], replica_group=rg, op=nl.add)
    ncc.all_reduce(srcs=[src], dsts=[top], replica_group=rg, op=nl.maximum)
    ncc.all_gather(srcs=[src], dsts=[gathered], replica_group=rg, collective_dim=0)
    ncc.reduce_scatter(srcs=[src], dsts=[scattered], replica_group=rg, collective_dim=0, op=nl.add)
    ncc.all_to_all(srcs=[src], dsts=[swapped], replica_group=rg, collective_dim=0)
    rank = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
    nisa.register_store(rank, ncc.rank_id())
    return total, top, gathered, scattered, swapped, rank


@pytest.mark.parametrize("groups, dtype, rtol", [([[0, 1, 2, 3]], np.float32, 1e-6), ([[0, 2], [1, 3]], BF16, 8e-3)])
def test_multi_rank_hbm_collectives(groups, dtype, rtol):
    xs = _ranks(4, (8, 16), dtype)
    rg = ncc.ReplicaGroup(groups)
    n = len(groups[0])
    outs = nki.multi_rank_simulate(_hbm_collectives, world_size=4,
                                   per_rank_inputs={r: ((xs[r], rg, n), {}) for r in range(4)})
    for rank, (total, top, gathered, scattered, swapped, rid) in enumerate(outs):
        group = next(g for g in groups if rank in g)
        me = group.index(rank)
        mine = [xs[r].astype(np.float64) for r in group]
        np.testing.assert_allclose(total.astype(np.float64), sum(mine), rtol=rtol, atol=1e-2 if dtype is BF16 else 1e-6)
        np.testing.assert_array_equal(top, np.maximum.reduce([xs[r] for r in group]))
        np.testing.assert_array_equal(gathered, np.concatenate([xs[r] for r in group]))  # bit for bit
        rows = 8 // n
        np.testing.assert_allclose(scattered.astype(np.float64), sum(mine)[me * rows:(me + 1) * rows], rtol=rtol,
                                   atol=1e-2 if dtype is BF16 else 1e-6)
        np.testing.assert_array_equal(swapped, np.concatenate([xs[r][me * rows:(me + 1) * rows] for r in group]))
        assert rid.item() == rank


@nki.jit
def _lnc_sbuf_all_gather(x, rg, n):
    """At LNC 2 each core all-gathers its own half of the rows (an SBUF collective along the free
    axis), then the cores swap halves with sendrecv."""
    core = nl.program_id(0)
    p, f = x.shape
    half = p // 2
    t = nl.ndarray((half, f), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(t, x[nl.ds(core * half, half), :])
    g = nl.ndarray((half, n * f), x.dtype, buffer=nl.sbuf)
    ncc.all_gather(srcs=[t], dsts=[g], replica_group=rg, collective_dim=1)
    other = nl.ndarray((half, n * f), x.dtype, buffer=nl.sbuf)
    nisa.sendrecv(src=g, dst=other, send_to_rank=1 - core, recv_from_rank=1 - core, pipe_id=0)
    out = nl.ndarray((2, p, n * f), x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(out[core, nl.ds(core * half, half), :], g)
    nisa.dma_copy(out[core, nl.ds((1 - core) * half, half), :], other)
    return out


def test_multi_rank_at_lnc_2_combines_collectives_and_sendrecv():
    xs = _ranks(3, (16, 4))
    rg = ncc.ReplicaGroup([[0, 1, 2]])
    outs = nki.multi_rank_simulate(_lnc_sbuf_all_gather[2], world_size=3,
                                   per_rank_inputs=[((xs[r], rg, 3), {}) for r in range(3)])
    want = np.concatenate(xs, axis=1)
    for out in outs:
        for core in (0, 1):
            np.testing.assert_array_equal(out[core], want)


@nki.jit
def _ring_all_gather(x, rg, n):
    """A ring all-gather as nki-library's fine-grained kernels write it: pass a buffer around the
    ring n-1 times; the rank whose chunk arrives is collective_permute_implicit_current_processing_rank_id."""
    p, f = x.shape
    out = nl.ndarray((n * p, f), x.dtype, buffer=nl.shared_hbm)
    bufs = [nl.ndarray(x.shape, x.dtype, buffer=nl.private_hbm) for _ in range(2)]
    nisa.dma_copy(bufs[0], x)
    me = ncc.collective_permute_implicit_current_processing_rank_id(iteration_id=0, replica_group=rg)
    nisa.dma_copy(out[nl.ds(int(me) * p, p), :], bufs[0])
    for step in range(1, n):
        src, dst = bufs[(step - 1) % 2], bufs[step % 2]
        ncc.collective_permute_implicit(srcs_by_channel=[[src]], dsts_by_channel=[[dst]], replica_group=rg)
        owner = ncc.collective_permute_implicit_current_processing_rank_id(iteration_id=step, replica_group=rg)
        nisa.dma_copy(out[nl.ds(int(owner) * p, p), :], dst)
    reduced = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
    ncc.collective_permute_implicit_reduce(srcs0_by_channel=[[bufs[0]]], srcs1_by_channel=[[bufs[1]]],
                                           dsts_by_channel=[[reduced]], replica_group=rg, op=nl.add)
    return out, reduced


def test_multi_rank_ring_all_gather_and_ring_reduce():
    n = 3
    xs = _ranks(n, (4, 8))
    rg = ncc.ReplicaGroup([list(range(n))])
    outs = nki.multi_rank_simulate(_ring_all_gather, world_size=n,
                                   per_rank_inputs=[((xs[r], rg, n), {}) for r in range(n)])
    for rank, (gathered, reduced) in enumerate(outs):
        np.testing.assert_array_equal(gathered, np.concatenate(xs))
        # after n-1 = 2 steps rank r's buffers hold the chunks of ranks r-2 (bufs[0]) and r-1 (bufs[1]);
        # it sends their sum and receives its predecessor's: the chunks of r-3 = r and r-2
        np.testing.assert_allclose(reduced, xs[rank] + xs[(rank - 2) % n], rtol=1e-6)


@nki.jit
def _permute(x, pairs):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(out, x)  # a rank that receives nothing keeps its own data
    src = nl.ndarray(x.shape, x.dtype, buffer=nl.private_hbm)
    nisa.dma_copy(src, x)
    ncc.collective_permute(srcs=[src], dsts=[out], source_target_pairs=pairs)
    return out


def test_multi_rank_collective_permute():
    xs = _ranks(4, (2, 8))
    pairs = [(0, 1), (1, 2), (2, 0)]  # rank 3 takes no part
    outs = nki.multi_rank_simulate(_permute, world_size=4, per_rank_inputs=[((xs[r], pairs), {}) for r in range(4)])
    for rank, want in enumerate([xs[2], xs[0], xs[1], xs[3]]):
        np.testing.assert_array_equal(outs[rank], want)


def test_multi_rank_deadlock_and_mismatch_and_input_rules():
    @nki.jit
    def k(x, rg, skip_rank=-1, kind=None):
        src = nl.ndarray(x.shape, x.dtype, buffer=nl.private_hbm)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(src, x)
        rank = int(ncc.rank_id())
        if rank == skip_rank:
            return out
        if kind == "mixed" and rank == 1:
            ncc.all_gather(srcs=[src], dsts=[out], replica_group=ncc.ReplicaGroup([[1]]), collective_dim=0)
            ncc.all_to_all(srcs=[src], dsts=[out], replica_group=rg, collective_dim=0)
        else:
            ncc.all_reduce(srcs=[src], dsts=[out], replica_group=rg, op=nl.add)
        return out

    x = np.ones((4, 4), np.float32)
    rg = ncc.ReplicaGroup([[0, 1]])
    with pytest.raises(nki.NKIError, match=r"deadlock.*rank 0 core 0 waits at nki.collectives.all_reduce number 1 over "
                       r"ranks \[0, 1\] \(waiting for rank\(s\) \[1\]\).*rank 1 core 0 finished the kernel"):
        nki.multi_rank_simulate(k, world_size=2, per_rank_inputs=[((x, rg), {"skip_rank": 1})] * 2)
    with pytest.raises(nki.NKIError, match=r"issued different collectives .*rank 0: nki.collectives.all_reduce, "
                       r"rank 1: nki.collectives.all_to_all"):
        nki.multi_rank_simulate(k, world_size=2, per_rank_inputs=[((x, rg), {"kind": "mixed"})] * 2)
    with pytest.raises(nki.NKIError, match=r"per_rank_inputs has 1 entries for world_size=2"):
        nki.multi_rank_simulate(k, world_size=2, per_rank_inputs=[((x, rg), {})])
    with pytest.raises(nki.NKIError, match=r"argument 0 differs between rank 0 .* and rank 1 .*same shape and dtype"):
        nki.multi_rank_simulate(k, world_size=2, per_rank_inputs=[((x, rg), {}), ((np.ones((2, 4), np.float32), rg), {})])
    with pytest.raises(nki.NKIError, match=r"argument 'skip_rank' differs .*non-array arguments are static"):
        nki.multi_rank_simulate(k, world_size=2, per_rank_inputs=[((x, rg), {"skip_rank": 0}), ((x, rg), {"skip_rank": 1})])
    with pytest.raises(nki.NKIError, match=r"rank 2 is in no rank-list of replica group \[\[0, 1\]\]"):
        nki.multi_rank_simulate(k, world_size=3, per_rank_inputs=[((x, rg), {})] * 3)


def test_threads_only_where_programs_overlap():
    """A grid without barriers runs in the calling thread; a program that starts while another
    waits at a barrier gets a thread of its own."""
    import threading

    seen = []

    @nki.jit
    def k(a, barrier):
        seen.append((nl.program_id(0), threading.current_thread() is threading.main_thread()))
        if barrier:
            nisa.core_barrier(a, (0, 1))
        return None

    k[4](np.zeros((2, 2), np.float32), False)
    assert seen == [(0, True), (1, True), (2, True), (3, True)]
    seen.clear()
    k[2](np.zeros((2, 2), np.float32), True)
    assert seen == [(0, True), (1, False)]
