"""The caching allocator and the memory API of the neuron device (issue item 3).

Checks are made on deltas (other live tensors in the process do not matter),
mostly on the last core so that the default core's state does not interfere.
Big allocations are never touched, so they cost address space, not RAM; they
still must fit in what the host has available (half a core's HBM at most), or
the allocator raises its host-memory error.
"""

from __future__ import annotations

import gc
import pickle
import re

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

import torch_neuronx

MiB = 1024**2
GiB = 1024**3
DEV = torch.neuron.device_count() - 1  # the core these tests use
STATS = (
    "allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
    "active_bytes", "inactive_split_bytes", "requested_bytes",
)
POOLS = ("all", "small_pool", "large_pool")
METRICS = ("current", "peak", "allocated", "freed")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")

needs_two = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs 2 NeuronCores")


def _bytes(n: int, device: int = DEV) -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device=f"neuron:{device}")


def _stats(device: int = DEV) -> dict[str, int]:
    return dict(torch.neuron.memory_stats(device))


def _delta(after: dict, before: dict) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def _settle() -> None:
    """Frees tensors of earlier tests that only a garbage collection reaches (a
    pytest.raises traceback holds its test's frame), for tests that compare
    absolute values; collecting costs ~0.3 s, so only they call it."""
    gc.collect()
    torch.neuron.empty_cache()


@pytest.fixture(autouse=True)
def _clean():
    torch.neuron.empty_cache()
    yield
    torch.neuron.empty_cache()


def test_memory_stats_use_cuda_key_names():
    stats = torch.neuron.memory_stats(DEV)
    expected = {f"{s}.{p}.{m}" for s in STATS for p in POOLS for m in METRICS} | set(COUNTERS)
    assert expected <= set(stats)
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())
    assert list(stats) == sorted(stats)  # an OrderedDict sorted by key, as CUDA's


def test_allocation_and_free_are_counted():
    _settle()
    before = _stats()
    x = torch.empty(1000, dtype=torch.float32, device=f"neuron:{DEV}")  # 4000 bytes requested
    during = _stats()
    d = _delta(during, before)
    assert d["requested_bytes.all.current"] == 4000
    assert 4000 <= d["allocated_bytes.all.current"] < 4000 + 1024  # rounded up to a size class
    assert d["allocated_bytes.small_pool.current"] == d["allocated_bytes.all.current"]
    assert d["allocation.all.current"] == 1 and d["active.all.current"] == 1
    assert d["active_bytes.all.current"] == d["allocated_bytes.all.current"]
    assert torch.neuron.memory_allocated(DEV) - before["allocated_bytes.all.current"] == d[
        "allocated_bytes.all.current"]
    assert torch.neuron.memory_reserved(DEV) >= torch.neuron.memory_allocated(DEV)
    assert x.data_ptr() % 64 == 0
    del x
    after = _stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["requested_bytes.all.current"] == before["requested_bytes.all.current"]
    # the block stays cached: reserved does not shrink until empty_cache()
    assert after["reserved_bytes.all.current"] == during["reserved_bytes.all.current"]
    assert after["allocated_bytes.all.freed"] - before["allocated_bytes.all.freed"] == d[
        "allocated_bytes.all.current"]


def test_every_block_is_64_byte_aligned():
    tensors = [_bytes(n) for n in (1, 63, 65, 1000, 4097, MiB - 1, MiB + 3, 5 * MiB + 7)]
    assert all(t.data_ptr() % 64 == 0 for t in tensors)


@pytest.mark.parametrize("nbytes", [4096, 300 * 1024, 3 * MiB])
def test_freed_memory_is_reused(nbytes):
    x = _bytes(nbytes)
    address = x.data_ptr()
    del x
    reserved = torch.neuron.memory_reserved(DEV)
    device_allocs = _stats()["num_device_alloc"]
    for _ in range(20):
        y = _bytes(nbytes)
        assert y.data_ptr() == address  # the cached block comes back
        y.fill_(7)
        assert torch.neuron.memory_reserved(DEV) == reserved
        del y
    assert _stats()["num_device_alloc"] == device_allocs


def test_the_small_block_freed_last_is_handed_out_first():
    """Small blocks of one size class are reused newest first (its bytes are the likeliest to be
    in cache); a block of another class is never handed out for it, and emptying the cache gives
    every cached block back."""
    blocks = [_bytes(4096) for _ in range(4)]
    other = _bytes(8192)
    addresses = [t.data_ptr() for t in blocks]
    other_address = other.data_ptr()
    del other
    for i in (2, 0, 3, 1):
        blocks[i] = None
    again = [_bytes(4096) for _ in range(5)]  # the fifth: a new block
    reused = [t.data_ptr() for t in again]
    assert reused[:4] == [addresses[i] for i in (1, 3, 0, 2)]
    assert reused[4] not in addresses and other_address not in reused
    torch.neuron.empty_cache()
    assert _stats()["num_device_free"] > 0


def test_reserved_stays_constant_in_a_training_like_loop():
    w = torch.randn(256, 256, device=f"neuron:{DEV}")
    x = torch.randn(64, 256, device=f"neuron:{DEV}")
    for _ in range(3):  # warm up the cache
        (torch.relu(x @ w) * 2).sum()
    reserved = torch.neuron.memory_reserved(DEV)
    allocated = torch.neuron.memory_allocated(DEV)
    for _ in range(20):
        (torch.relu(x @ w) * 2).sum()
        assert torch.neuron.memory_reserved(DEV) == reserved
    assert torch.neuron.memory_allocated(DEV) == allocated


def test_small_and_large_pools():
    before = _stats()
    small = _bytes(100 * 1024)
    d = _delta(_stats(), before)
    assert d.get("allocated_bytes.small_pool.current", 0) >= 100 * 1024
    assert "allocated_bytes.large_pool.current" not in d
    assert d["segment.small_pool.current"] == 1
    before = _stats()
    large = _bytes(2 * MiB)
    d = _delta(_stats(), before)
    assert d["allocated_bytes.large_pool.current"] >= 2 * MiB
    assert "allocated_bytes.small_pool.current" not in d
    assert d["reserved_bytes.large_pool.current"] >= 2 * MiB
    stats = _stats()
    assert stats["reserved_bytes.large_pool.peak"] >= stats["reserved_bytes.large_pool.current"] >= 2 * MiB
    for stat in ("allocated_bytes", "reserved_bytes", "allocation", "segment"):
        for metric in METRICS[:1]:
            assert stats[f"{stat}.all.{metric}"] == (
                stats[f"{stat}.small_pool.{metric}"] + stats[f"{stat}.large_pool.{metric}"])
    del small, large


def test_a_request_just_under_1_mib_is_small():
    before = _stats()
    x = _bytes(MiB - 1)
    d = _delta(_stats(), before)
    assert d.get("allocation.small_pool.current") == 1, d
    del x


def test_peak_stats_and_reset():
    _settle()
    base = torch.neuron.memory_allocated(DEV)
    x = _bytes(64 * MiB)
    del x
    assert torch.neuron.max_memory_allocated(DEV) >= base + 64 * MiB
    assert torch.neuron.max_memory_reserved(DEV) >= 64 * MiB
    assert _stats()["allocated_bytes.large_pool.peak"] >= 64 * MiB
    torch.neuron.reset_peak_memory_stats(DEV)
    assert torch.neuron.max_memory_allocated(DEV) == torch.neuron.memory_allocated(DEV) == base
    assert torch.neuron.max_memory_reserved(DEV) == torch.neuron.memory_reserved(DEV)
    y = _bytes(8 * MiB)
    assert torch.neuron.max_memory_allocated(DEV) == torch.neuron.memory_allocated(DEV)
    del y
    torch_neuronx.reset_peak_memory_stats(f"neuron:{DEV}")
    assert torch.neuron.max_memory_allocated(DEV) == base


def test_reset_accumulated_stats():
    x = _bytes(MiB)
    del x
    assert _stats()["allocated_bytes.all.allocated"] > 0
    torch.neuron.reset_accumulated_memory_stats(DEV)
    stats = _stats()
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.freed"] == 0
    assert stats["num_device_alloc"] == 0


def test_empty_cache_returns_cached_blocks():
    _settle()
    x = _bytes(32 * MiB)
    del x
    stats = _stats()
    cached = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    assert cached >= 32 * MiB
    free_before, total = torch.neuron.mem_get_info(DEV)
    torch_neuronx.empty_cache()
    after = _stats()
    assert after["reserved_bytes.all.current"] == after["allocated_bytes.all.current"]
    assert after["num_device_free"] > stats["num_device_free"]
    free_after, total_after = torch.neuron.mem_get_info(DEV)
    assert total_after == total and free_after - free_before == cached


def test_mem_get_info():
    x = _bytes(3 * MiB)
    free, total = torch.neuron.mem_get_info(DEV)
    assert total == torch.neuron.get_device_properties(DEV).total_memory
    assert free == total - torch.neuron.memory_reserved(DEV)
    assert torch.neuron.mem_get_info(f"neuron:{DEV}") == (free, total)
    del x


def test_torch_accelerator_memory_api_agrees():
    x = _bytes(5 * MiB)
    y = _bytes(1000)
    del y
    n, acc = torch.neuron, torch.accelerator
    assert acc.memory_allocated(DEV) == n.memory_allocated(DEV) > 0
    assert acc.max_memory_allocated(DEV) == n.max_memory_allocated(DEV)
    assert acc.memory_reserved(DEV) == n.memory_reserved(DEV)
    assert acc.max_memory_reserved(DEV) == n.max_memory_reserved(DEV)
    assert acc.memory_stats(DEV) == n.memory_stats(DEV)
    assert acc.memory_stats(torch.device("neuron", DEV)) == n.memory_stats(DEV)
    assert acc.get_memory_info(DEV) == n.mem_get_info(DEV)
    acc.reset_peak_memory_stats(DEV)
    assert n.max_memory_allocated(DEV) == n.memory_allocated(DEV)
    acc.empty_cache()
    assert n.memory_reserved(DEV) == n.memory_allocated(DEV)
    with torch.neuron.device(DEV):  # no argument: the current core
        assert n.memory_allocated() == acc.memory_allocated() == n.memory_allocated(DEV)
    del x


def test_memory_stats_answer_torchneurons_names_too():
    """TorchNeuron's names (nested byte stats, its two counters) on the same dict,
    which iterates, compares and sizes as CUDA's flat one."""
    torch.neuron.reset_accumulated_memory_stats(DEV)
    before = torch_neuronx.memory_stats(DEV)
    x = _bytes(3 * MiB)
    stats = torch.neuron.memory_stats(f"neuron:{DEV}")
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        assert name in stats and name not in list(stats)
        assert stats[name] == {m: stats[f"{name}.all.{m}"] for m in METRICS}
    assert stats["allocated_bytes"]["current"] - before["allocated_bytes"]["current"] == 3 * MiB
    assert stats["allocation_requests"] == stats["allocation.all.allocated"] == before["allocation_requests"] + 1
    del x
    after = torch.neuron.memory_stats(DEV)
    assert after["num_tensor_frees"] == stats["num_tensor_frees"] + 1 == after["allocation.all.freed"]
    assert after.get("num_tensor_frees") == after["num_tensor_frees"] and after.get("nope", -1) == -1
    with pytest.raises(KeyError):
        after["allocated_bytes.all"]
    assert all(isinstance(v, int) for v in after.values()) and len(after) == len(dict(after))
    torch.neuron.reset_accumulated_memory_stats(DEV)
    reset = torch_neuronx.memory_stats(DEV)
    assert (reset["num_tensor_frees"], reset["allocation_requests"], reset["num_ooms"]) == (0, 0, 0)


def test_memory_summary():
    x = _bytes(3 * MiB)
    summary = torch.neuron.memory_summary(DEV)
    assert f"Neuron Memory Summary, Device {DEV} (neuron:{DEV}" in summary  # TorchNeuron's title
    for row in ("Allocated memory", "Reserved memory", "Active memory", "from large pool", "OOMs"):
        assert row in summary
    allocated = torch.neuron.memory_allocated(DEV) / MiB
    line = next(l for l in summary.splitlines() if l.startswith("| Allocated memory"))
    assert f"{allocated:.2f} MiB" in line
    short = torch_neuronx.memory_summary(f"neuron:{DEV}", abbreviated=True)
    assert "from small pool" not in short and "Allocated memory" in short
    del x


def test_results_of_ops_are_counted():
    _settle()
    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    na, nb = a.to(f"neuron:{DEV}"), b.to(f"neuron:{DEV}")
    before = torch.neuron.memory_allocated(DEV)
    c = na @ nb
    assert torch.neuron.memory_allocated(DEV) - before >= 256 * 256 * 4
    d = torch.tanh(c) + 1
    assert torch.neuron.memory_allocated(DEV) - before >= 2 * 256 * 256 * 4
    torch.testing.assert_close(c.cpu(), a @ b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(d.cpu(), torch.tanh(a @ b) + 1, rtol=1e-5, atol=1e-4)
    snapshot_addresses = {
        blk["address"] for seg in torch.neuron.memory_snapshot() for blk in seg["blocks"]
        if blk["state"] == "active_allocated"
    }
    assert c.data_ptr() in snapshot_addresses and d.data_ptr() in snapshot_addresses
    del c, d
    assert torch.neuron.memory_allocated(DEV) == before


@needs_two
def test_stats_are_per_device():
    other = 0 if DEV != 0 else 1
    before_other = _stats(other)
    before = _stats(DEV)
    x = _bytes(2 * MiB, DEV)
    y = x.float() + 1  # an op result on the same core
    assert _stats(other) == before_other
    assert torch.neuron.memory_allocated(DEV) - before["allocated_bytes.all.current"] >= 10 * MiB
    z = _bytes(MiB, other)
    assert torch.neuron.memory_allocated(other) - before_other["allocated_bytes.all.current"] >= MiB
    del x, y, z


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def test_out_of_memory_is_cuda_like_and_recoverable():
    _settle()
    capacity = torch.neuron.get_device_properties(DEV).total_memory
    hold = _bytes(MiB)
    ooms = _stats()["num_ooms"]
    allocated = torch.neuron.memory_allocated(DEV)
    with pytest.raises(torch.OutOfMemoryError) as info:
        _bytes(capacity)  # one size class, so the message shows exactly this size
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert re.search(r"out of memory\. Tried to allocate " + re.escape(_gib(capacity)), message)
    assert f"total capacity of {_gib(capacity)}" in message
    assert "is allocated by PyTorch" in message and "reserved by PyTorch but unallocated" in message
    assert f"NeuronCore {DEV}" in message
    assert _stats()["num_ooms"] == ooms + 1
    assert torch.neuron.memory_allocated(DEV) == allocated
    # the allocator still works afterwards
    x = torch.arange(1000, dtype=torch.float32, device=f"neuron:{DEV}")
    torch.testing.assert_close((x * 2).sum().cpu(), torch.tensor(999.0 * 1000))
    # Two blocks that do not fit together, each as small as that allows: the emulated HBM is
    # host memory, and a block the host cannot give raises the host's error instead.
    big = _bytes(capacity // 2 + MiB)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        _bytes(capacity // 2)
    del big
    again = _bytes(capacity // 2)  # fits once the first block is gone
    del again, hold, x, info
    assert _stats()["num_ooms"] == ooms + 2


def test_oom_retries_after_flushing_the_cache():
    capacity = torch.neuron.get_device_properties(DEV).total_memory
    size = capacity // 2  # a size class of its own (classes are quarters of a power of two)
    x = _bytes(size)
    del x  # cached: reserved still holds it
    assert torch.neuron.memory_reserved(DEV) >= size
    retries = _stats()["num_alloc_retries"]
    y = _bytes(size + MiB)  # the next class (14 GiB of 24): no reuse, no room beside it; fits after a flush
    assert _stats()["num_alloc_retries"] == retries + 1
    assert torch.neuron.memory_reserved(DEV) < 2 * size
    del y


def test_oom_on_one_core_leaves_the_others_alone():
    capacity = torch.neuron.get_device_properties(0).total_memory
    stats0 = _stats(0) if DEV != 0 else None
    with pytest.raises(torch.OutOfMemoryError):
        _bytes(capacity + GiB)
    if stats0 is not None:
        assert _stats(0) == stats0


# ------------------------------------------------------------------ snapshot
def test_memory_snapshot_segment_format():
    _settle()
    x = torch.empty(1000, device=f"neuron:{DEV}")
    big = _bytes(3 * MiB)
    freed = _bytes(2048)
    freed_address = freed.data_ptr()
    del freed
    segments = torch.neuron.memory_snapshot()
    assert segments == sorted(segments, key=lambda s: (s["device"], s["address"]))
    for seg in segments:
        assert {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "blocks"} <= set(seg)
        assert seg["segment_type"] in ("small", "large")
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        for blk in seg["blocks"]:
            assert {"address", "size", "requested_size", "state"} <= set(blk)
            assert blk["state"] in ("active_allocated", "inactive")
    by_address = {b["address"]: (s, b) for s in segments for b in s["blocks"]}
    seg, blk = by_address[x.data_ptr()]
    assert seg["device"] == DEV and blk["state"] == "active_allocated" and blk["requested_size"] == 4000
    assert seg["segment_type"] == "small"
    assert by_address[big.data_ptr()][0]["segment_type"] == "large"
    assert by_address[freed_address][1]["state"] == "inactive"
    for device in range(torch.neuron.device_count()):
        mine = [s for s in segments if s["device"] == device]
        assert sum(s["total_size"] for s in mine) == torch.neuron.memory_reserved(device)
        assert sum(s["allocated_size"] for s in mine) == torch.neuron.memory_allocated(device)
    del x, big


def test_private_snapshot_dict():
    x = _bytes(MiB)
    snap = torch.neuron.memory._snapshot()
    assert set(snap) >= {"segments", "device_traces"}
    assert len(snap["device_traces"]) == torch.neuron.device_count()
    assert snap["segments"] == torch.neuron.memory_snapshot()
    del x


def test_pytorch_memory_visualizer_reads_the_snapshot(tmp_path):
    x = _bytes(3 * MiB)
    y = torch.empty(100, device=f"neuron:{DEV}")
    snap = torch.neuron.memory._snapshot()
    segments = snap["segments"]

    summary = memory_viz.segsum(snap)
    assert f"segments: {len(segments)}" in summary
    total = sum(s["total_size"] for s in segments)
    assert f"total_reserved: {memory_viz.Bytes(total)}" in summary

    def identity(text):
        return text

    flame = memory_viz.segments(snap, format_flamegraph=identity)
    assert f"seg_{x.data_ptr()};active_allocated" in flame
    assert f"{3 * MiB}" in flame
    by_state = memory_viz.memory(snap, format_flamegraph=identity)
    active = sum(int(line.rsplit(" ", 1)[1]) for line in by_state.splitlines()
                 if ";active_allocated;" in line)
    assert active == sum(memory_viz.calc_active(s) for s in segments)

    z = _bytes(5 * MiB)
    after = torch.neuron.memory_snapshot()
    diff = memory_viz.compare(segments, after, format_flamegraph=identity)
    assert f"only_after;stream_0;seg_{z.data_ptr()}" in diff

    html = memory_viz.segment_plot(snap)
    assert html.lstrip().startswith("<") and "snapshot.pickle" in html
    assert "snapshot.pickle" in memory_viz.trace_plot(snap)

    path = tmp_path / "snapshot.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert memory_viz.segsum(loaded).startswith("Summary of segments")
    del x, y, z


def test_large_blocks_start_on_a_page_boundary_and_small_ones_on_64_bytes():
    # Where host code's buffers start within a page changes its speed (gloo's
    # all_reduce: 20% at page offset 128), so large blocks are page aligned.
    for numel in (2**18, 2**20 + 3, 5 * 2**20):  # 1 MiB and more
        assert torch.empty(numel, device="neuron").data_ptr() % 4096 == 0
    for numel in (1, 100, 2**17):
        assert torch.empty(numel, device="neuron").data_ptr() % 64 == 0


# ------------------------------------------------------------------ a host smaller than the device

HOST_LIMIT_SCRIPT = r"""
import json, resource, torch
torch.ones(1, device="neuron")  # the runtime is up before the limit is set
pages = int(open("/proc/self/statm").read().split()[0])
room = 1 << 30  # the address space may grow by 1 GiB more
limit = pages * resource.getpagesize() + room
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
out = {}
try:
    torch.empty(2 << 30, dtype=torch.uint8, device="neuron")
except torch.OutOfMemoryError as error:
    out["large"] = str(error)
held = []
try:
    for _ in range(200):  # 10 MiB blocks, touched: a model growing past the host's memory
        held.append(torch.ones(10 << 20, dtype=torch.uint8, device="neuron"))
except torch.OutOfMemoryError as error:
    out["growing"] = str(error)
out["held_mib"] = 10 * len(held)
del held
out["after"] = torch.ones(64 << 20, dtype=torch.uint8, device="neuron").numel()  # it recovers
out["ooms"] = torch.neuron.memory_stats(0)["num_ooms"]
print(json.dumps(out))
"""


def test_host_out_of_memory_is_a_clear_error():
    """Under an address-space limit (RLIMIT_AS) far below the emulated 24 GiB core, an
    allocation the host cannot give raises torch.OutOfMemoryError saying the host ran out,
    not the emulated HBM, with what to do; the program goes on after freeing memory."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    proc = subprocess.run([sys.executable, "-c", HOST_LIMIT_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("large", "growing"):
        message = out[key]
        assert message.startswith("NEURON out of host memory. Tried to allocate"), message
        assert "RLIMIT_AS" in message and "the emulated instance is larger than this host" in message
        assert "TORCH_NEURONX_INSTANCE" in message and "has a capacity of 24.00 GiB" in message
    assert "2.00 GiB" in out["large"]
    assert 0 < out["held_mib"] < 1024  # stopped before the limit, not at the 2000 MiB asked
    assert out["after"] == 64 << 20 and out["ooms"] == 2


def test_an_allocation_beyond_the_hosts_available_memory_is_refused():
    """MemAvailable, not the emulated capacity, is the limit when it is the smaller:
    a trn3 core (36 GiB) on this host is refused what the host cannot give."""
    import os
    import subprocess
    import sys

    available = next(int(line.split()[1]) * 1024 for line in open("/proc/meminfo")
                     if line.startswith("MemAvailable:"))
    request = available + GiB
    if request >= 36 * GiB:
        pytest.skip(f"this host has {available / GiB:.1f} GiB available: more than a trn3 core holds")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
    env["TORCH_NEURONX_INSTANCE"] = "trn3.3xlarge"
    script = ("import torch\n"
              "try:\n"
              f"    torch.empty({request}, dtype=torch.uint8, device='neuron')\n"
              "except torch.OutOfMemoryError as error:\n"
              "    print(error)\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NEURON out of host memory" in proc.stdout and "(MemAvailable)" in proc.stdout, proc.stdout
