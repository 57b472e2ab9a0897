"""The allocator's history in CUDA's snapshot format (issue #18 item 3).

torch.neuron.memory._record_memory_history / _snapshot / _dump_snapshot, checked
against what the allocator did and read by PyTorch's memory visualizer
(torch.cuda._memory_viz) the way a user runs it. Allocations go to the last
core (as in tests/test_memory.py) through torch.empty, so that each one is
exactly one call to the allocator.
"""

from __future__ import annotations

import base64
import gc
import pickle
import pickletools
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.cuda._memory_viz as memory_viz

import torch_neuronx.neuron.memory as neuron_memory

MiB = 1024**2
DEV = torch.neuron.device_count() - 1
DEVICE = f"neuron:{DEV}"
memory = torch.neuron.memory  # reached as a user reaches torch.cuda.memory


def _line() -> int:
    """The caller's current line: `x, line = torch.empty(...), _line()`."""
    return sys._getframe(1).f_lineno


def _settle() -> None:
    """No cached block on any core, so that a run's segment actions are all its own."""
    gc.collect()
    torch.neuron.empty_cache()


def _actions(snapshot: dict, device: int = DEV) -> list[tuple]:
    return [(e["action"], e.get("addr"), e["size"]) for e in snapshot["device_traces"][device]]


def _first_frame(entry: dict) -> dict:
    return entry["frames"][0]


# ------------------------------------------------------------------ the user's program
def _user_program(path) -> dict:
    """What a user does: record, allocate, free, run out of memory, dump."""
    _settle()
    start_us = time.time_ns() // 1000
    memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100_000)
    a, a_line = torch.empty(1000, device=DEVICE), _line()                      # small pool
    b, b_line = torch.empty(3 * MiB, dtype=torch.uint8, device=DEVICE), _line()  # large pool
    a_address, b_address = a.data_ptr(), b.data_ptr()
    del a; del_line = _line()  # noqa: E702
    c, c_line = torch.empty(1000, device=DEVICE), _line()  # reuses a's cached block
    del b  # cached; the OOM's flush returns it
    capacity = torch.neuron.get_device_properties(DEV).total_memory
    oom_bytes = 1 << capacity.bit_length()  # a power of two: no rounding, so the size asked is recorded
    with pytest.raises(torch.OutOfMemoryError) as oom:
        torch.empty(oom_bytes, dtype=torch.uint8, device=DEVICE)
    free_after_oom = torch.neuron.mem_get_info(DEV)[0]
    memory._dump_snapshot(str(path))
    stop_us = time.time_ns() // 1000
    segments_after = torch.neuron.memory_snapshot()  # right after the dump: nothing allocated between
    stats_after = {i: torch.neuron.memory_stats(i) for i in range(torch.neuron.device_count())}
    memory._record_memory_history(None)
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    return dict(
        snapshot=snapshot, path=path, a_line=a_line, b_line=b_line, c_line=c_line, del_line=del_line,
        a_address=a_address, b_address=b_address, c_address=c.data_ptr(), oom_bytes=oom_bytes,
        oom_message=str(oom.value), free_after_oom=free_after_oom, start_us=start_us, stop_us=stop_us,
        segments_after=segments_after, stats_after=stats_after, keep=c,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # No garbage collection while the program runs: a cycle left by an earlier
    # test could free a neuron tensor in the middle of the expected trace.
    gc.collect()
    gc.disable()
    try:
        return _user_program(tmp_path_factory.mktemp("memory_history") / "snap.pickle")
    finally:
        gc.enable()


@pytest.fixture
def history():
    """The recording function; history off and cleared after the test."""
    _settle()
    yield memory._record_memory_history
    memory._record_memory_history(None)


def test_private_api_is_reached_like_cudas():
    import torch.neuron.memory as through_torch

    assert through_torch._record_memory_history is neuron_memory._record_memory_history
    assert torch.neuron.memory._snapshot is neuron_memory._snapshot
    assert torch.neuron.memory._dump_snapshot is neuron_memory._dump_snapshot


def test_accelerator_snapshot_is_the_devices(history):
    # torch.accelerator.memory._snapshot() (PyTorch's device-generic spelling)
    history(stacks="python")
    x = torch.empty(1000, device=DEVICE)
    snapshot = torch.accelerator.memory._snapshot()
    assert ("alloc", x.data_ptr(), 4000) in _actions(snapshot)
    assert snapshot["segments"] == memory.memory_snapshot()
    del x


def test_trace_is_what_the_allocator_did(run):
    a, b = run["a_address"], run["b_address"]
    expected = [
        ("segment_alloc", a, 4096), ("alloc", a, 4000),            # sizes: segment rounded, alloc asked
        ("segment_alloc", b, 3 * MiB), ("alloc", b, 3 * MiB),
        ("free_requested", a, 4000), ("free_completed", a, 4000),  # frees are immediate
        ("alloc", a, 4000),                                        # c: the cached block, no new segment
        ("free_requested", b, 3 * MiB), ("free_completed", b, 3 * MiB),
        ("segment_free", b, 3 * MiB),                              # the OOM's retry flushes the cache
        ("oom", None, run["oom_bytes"]),
    ]
    trace = run["snapshot"]["device_traces"][DEV]
    assert _actions(run["snapshot"])[:-1] == expected
    assert run["c_address"] == a
    last = trace[-1]
    dev_segments = [s for s in run["snapshot"]["segments"] if s["device"] == DEV]
    assert last["action"] == "snapshot" and last["size"] == sum(s["active_size"] for s in dev_segments)
    times = [e["time_us"] for e in trace]
    assert times == sorted(times) and run["start_us"] <= times[0] and times[-1] <= run["stop_us"]
    assert all(e["stream"] == 0 for e in trace)
    # The other cores did nothing but take part in the snapshot.
    for device, other in enumerate(run["snapshot"]["device_traces"]):
        if device != DEV:
            assert [e["action"] for e in other] == ["snapshot"]


def test_oom_is_recorded_before_raising(run):
    (oom,) = [e for e in run["snapshot"]["device_traces"][DEV] if e["action"] == "oom"]
    assert oom["size"] == run["oom_bytes"]
    assert "addr" not in oom and oom["device_free"] == run["free_after_oom"]
    gib = run["oom_bytes"] / 1024**3
    assert f"Tried to allocate {gib:.2f} GiB" in run["oom_message"]
    assert _first_frame(oom)["name"] == "_user_program"


def test_frames_point_at_the_users_lines(run):
    def frame(line):
        return {"filename": __file__, "line": line, "name": "_user_program"}

    trace = run["snapshot"]["device_traces"][DEV]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert [_first_frame(e) for e in allocs] == [frame(run["a_line"]), frame(run["b_line"]), frame(run["c_line"])]
    frees = [e for e in trace if e["action"].startswith("free") and e["addr"] == run["a_address"]]
    assert [_first_frame(e) for e in frees] == [frame(run["del_line"])] * 2  # context="all": where it was freed
    # The caller's caller is there too (the stack, not just its top).
    assert any(f["name"] == "run" for f in allocs[0]["frames"])
    # The live block carries its allocation's stack; its segment, the stack that created it.
    seg = next(s for s in run["snapshot"]["segments"] if s["address"] == run["c_address"])
    assert _first_frame(seg["blocks"][0]) == frame(run["c_line"])
    assert _first_frame(seg) == frame(run["a_line"])
    for entry in trace:
        for f in entry.get("frames", []):
            assert set(f) == {"filename", "line", "name"}
            assert isinstance(f["line"], int) and isinstance(f["filename"], str)


def test_segments_agree_with_memory_snapshot_and_stats(run):
    segments = run["snapshot"]["segments"]
    assert segments == run["segments_after"]
    for device, stats in run["stats_after"].items():
        mine = [s for s in segments if s["device"] == device]
        blocks = [b for s in mine for b in s["blocks"]]
        active = [b for b in blocks if b["state"] == "active_allocated"]
        assert sum(s["total_size"] for s in mine) == stats["reserved_bytes.all.current"]
        assert sum(s["allocated_size"] for s in mine) == stats["allocated_bytes.all.current"]
        assert sum(b["size"] for b in active) == stats["active_bytes.all.current"]
        assert sum(b["requested_size"] for b in active) == stats["requested_bytes.all.current"]
        assert len(mine) == stats["segment.all.current"] and len(active) == stats["active.all.current"]
    assert run["snapshot"]["allocator_settings"] == {"expandable_segments": False}
    assert run["snapshot"]["external_annotations"] == []


def _replay_backwards(snapshot: dict, device: int) -> int:
    """Undoes the trace from the snapshot's state, action by action, as the
    visualizer's "Allocator State History" view does, and checks that every
    step is possible: each block inside a segment, each action undoing a state
    that exists. Returns the number of actions undone."""
    segments = {s["address"]: s["total_size"] for s in snapshot["segments"] if s["device"] == device}
    blocks = {b["address"]: b["requested_size"] for s in snapshot["segments"] if s["device"] == device
              for b in s["blocks"] if b["state"] == "active_allocated"}
    undone = 0
    for e in reversed(snapshot["device_traces"][device]):
        action, addr = e["action"], e.get("addr")
        if action == "alloc":
            assert blocks.pop(addr) == e["size"]
        elif action == "free_completed":
            assert addr not in blocks
            blocks[addr] = e["size"]
        elif action == "free_requested":
            assert blocks[addr] == e["size"]
        elif action == "segment_alloc":
            assert segments.pop(addr) == e["size"]
        elif action == "segment_free":
            assert addr not in segments
            segments[addr] = e["size"]
        else:
            assert action in ("oom", "snapshot")
        for block in blocks:
            assert any(start <= block < start + size for start, size in segments.items()), e
        undone += 1
    return undone


def test_replaying_the_trace_backwards_is_consistent(run):
    assert _replay_backwards(run["snapshot"], DEV) == len(run["snapshot"]["device_traces"][DEV])


# The opcodes of the unpickler in PyTorch's MemoryViz.js, which reads the
# pickle _memory_viz embeds in its pages: anything else fails in the browser.
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE",
    "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE",
}


def test_pickle_uses_only_what_the_browser_viewer_reads(run):
    used = {op.name for op, _, _ in pickletools.genops(pickle.dumps(run["snapshot"]))}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES


def test_visualizer_commands_render_the_dump(run, tmp_path):
    # As a user runs them, both at once (each is a Python start-up).
    commands = {kind: tmp_path / f"{kind}.html" for kind in ("trace_plot", "segment_plot")}
    procs = {kind: subprocess.Popen(
        [sys.executable, "-m", "torch.cuda._memory_viz", kind, str(run["path"]), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for kind, out in commands.items()}
    for kind, proc in procs.items():
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output
        html = commands[kind].read_text()
        assert html.lstrip().startswith("<!DOCTYPE html>")
        # The page embeds the snapshot; the frames inside name this file and lines.
        encoded = re.search(r'"base64": "([A-Za-z0-9+/=]+)"', html).group(1)
        embedded = pickle.loads(base64.b64decode(encoded))
        assert embedded == run["snapshot"]
        frames = [f for e in embedded["device_traces"][DEV] for f in e.get("frames", [])]
        assert {"filename": __file__, "line": run["b_line"], "name": "_user_program"} in frames


def test_pytorch_text_tools_read_the_trace(run):
    snapshot = run["snapshot"]
    listing = memory_viz.trace(snapshot)
    assert f"Device {DEV} ----------------" in listing
    assert f"raise OutOfMemoryError # {memory_viz.Bytes(run['oom_bytes'])} requested" in listing
    assert "cudaFree(" in listing  # the segment the OOM's retry returned
    assert memory_viz.segsum(snapshot).startswith("Summary of segments")
    flame = memory_viz.segments(snapshot, format_flamegraph=lambda text: text)
    assert f"test_memory_history.py:{run['c_line']}:_user_program" in flame


# ------------------------------------------------------------------ the arguments
def test_max_entries_keeps_the_newest_actions(history):
    history(max_entries=4, stacks="python")
    x = torch.empty(1000, device=DEVICE)
    address = x.data_ptr()
    del x
    y = torch.empty(1000, device=DEVICE)  # noqa: F841  (the cached block again)
    actions = _actions(memory._snapshot())
    assert actions[:3] == [  # segment_alloc and the first alloc fell out
        ("free_requested", address, 4000), ("free_completed", address, 4000), ("alloc", address, 4000),
    ]
    assert len(actions) == 4 and actions[3][0] == "snapshot"
    # Made smaller, not cleared: the newest two stay (the oldest two would
    # leave a free_completed in front of the new snapshot).
    history(max_entries=2, stacks="python")
    assert [a for a, _, _ in _actions(memory._snapshot())] == ["snapshot", "snapshot"]


def test_none_stops_and_clears_as_cuda(history):
    history(stacks="python")
    x, line = torch.empty(1000, device=DEVICE), _line()
    assert len(memory._snapshot()["device_traces"][DEV]) == 3
    history(None)
    y = torch.empty(1000, device=DEVICE)
    snapshot = memory._snapshot()
    assert snapshot["device_traces"] == [[] for _ in range(torch.neuron.device_count())]
    blocks = {b["address"]: b for s in snapshot["segments"] for b in s["blocks"]}
    assert blocks[x.data_ptr()]["frames"][0]["line"] == line  # a live block keeps its stack
    assert blocks[y.data_ptr()]["frames"] == []
    history(stacks="python")  # recording again starts from an empty trace
    assert _actions(memory._snapshot())[0][0] == "snapshot"
    del x
    history(stacks="python", clear_history=True)
    assert [a for a, _, _ in _actions(memory._snapshot())] == ["snapshot"]


@pytest.mark.parametrize("context", [None, "state", "alloc", "all"])
def test_context_decides_which_actions_keep_a_stack(history, context):
    history(context=context, stacks="python")
    x, alloc_line = torch.empty(1000, device=DEVICE), _line()
    address = x.data_ptr()
    block = next(b for s in memory.memory_snapshot() for b in s["blocks"] if b["address"] == address)
    del x; free_line = _line()  # noqa: E702
    trace = memory._snapshot()["device_traces"][DEV]
    alloc = next(e for e in trace if e["action"] == "alloc")
    free = next(e for e in trace if e["action"] == "free_requested")
    assert (block["frames"] != []) == (context is not None)
    assert ("frames" in alloc) == (context in ("alloc", "all"))
    if context == "alloc":
        assert _first_frame(free)["line"] == alloc_line  # as CUDA: the allocation's stack
    elif context == "all":
        assert _first_frame(free)["line"] == free_line
    else:
        assert "frames" not in free


def test_state_keeps_a_one_entry_trace(history):
    history(enabled="state", stacks="python")
    x, line = torch.empty(1000, device=DEVICE), _line()
    snapshot = memory._snapshot()
    assert [a for a, _, _ in _actions(snapshot)] == ["snapshot"]
    blocks = {b["address"]: b for s in snapshot["segments"] for b in s["blocks"]}
    assert blocks[x.data_ptr()]["frames"][0]["line"] == line


def test_skip_actions(history):
    history(stacks="python", skip_actions=["free_requested", "snapshot"])
    x = torch.empty(1000, device=DEVICE)
    del x
    assert [a for a, _, _ in _actions(memory._snapshot())] == ["segment_alloc", "alloc", "free_completed"]


def test_stacks_all_adds_cpp_frames(history):
    history(stacks="all")
    x, line = torch.empty(1000, device=DEVICE), _line()
    (alloc,) = [e for e in memory._snapshot()["device_traces"][DEV] if e["action"] == "alloc"]
    names = [f["name"] for f in alloc["frames"]]
    assert any("NeuronAllocator::allocateOn" in name for name in names)  # the allocator itself
    assert {"filename": __file__, "line": line, "name": "test_stacks_all_adds_cpp_frames"} in alloc["frames"]
    del x


def test_legacy_bool_form(history):
    history(True, trace_alloc_max_entries=2, trace_alloc_record_context=True)
    x, line = torch.empty(1000, device=DEVICE), _line()
    trace = memory._snapshot()["device_traces"][DEV]
    assert [e["action"] for e in trace] == ["alloc", "snapshot"]
    assert any(f["line"] == line for f in trace[0]["frames"])  # record_context_cpp=False: still a stack
    history(False)
    assert memory._snapshot()["device_traces"][DEV] == []
    del x


def test_backward_on_the_autograd_worker_records_without_deadlock(history):
    # The backward of neuron tensors runs on PyTorch's per-device worker thread,
    # which gathers Python stacks while the main thread waits without the GIL.
    history(stacks="python")
    w = torch.ones(64, 64, device=DEVICE, requires_grad=True)
    (w * 2).sum().backward()
    trace = memory._snapshot()["device_traces"][DEV]
    assert w.grad is not None and w.grad.data_ptr() in {e["addr"] for e in trace if e["action"] == "alloc"}
    assert _replay_backwards(memory._snapshot(), DEV) > 0


def test_stacks_stop_at_exit_and_the_trace_stays(history):
    # At exit, before torch_neuronx drains the autograd workers, gathering
    # stops (it would take the GIL while Python finalizes); the trace stays
    # readable by exit handlers that dump it.
    history(stacks="python", max_entries=10)
    assert neuron_memory._stop_stacks_at_exit
    x = torch.empty(1000, device=DEVICE)
    neuron_memory._stop_stacks()  # what the atexit handler runs
    y = torch.empty(1000, device=DEVICE)
    trace = memory._snapshot()["device_traces"][DEV]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert [e["addr"] for e in allocs] == [x.data_ptr(), y.data_ptr()]
    assert "frames" in allocs[0] and "frames" not in allocs[1]
    history(None)
    neuron_memory._stop_stacks()  # after recording was stopped: stays stopped
    assert memory._snapshot()["device_traces"][DEV] == []


def test_bad_arguments_say_what_is_expected(history):
    with pytest.raises(ValueError, match=r"expected enabled to be one of None, 'state', 'all', got 'yes'"):
        history("yes")
    with pytest.raises(ValueError, match="expected stacks to be one of 'python', 'all'"):
        history(stacks="cpp")
    with pytest.raises(ValueError, match="unknown action 'malloc' in skip_actions"):
        history(skip_actions=["malloc"])
    with pytest.warns(UserWarning, match="compile_context=True has no effect on neuron"):
        history(stacks="python", compile_context=True)
