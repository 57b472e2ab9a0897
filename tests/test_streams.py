"""Streams and events of the neuron device (issue item 4).

Execution on the emulated core is synchronous, so these tests check the
semantics generic code relies on: stream identity, the current-stream state
per core, context managers, event recording, waiting and timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import torch_neuronx

needs_two = pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs 2 NeuronCores")


@pytest.fixture(autouse=True)
def _restore_streams():
    yield
    for index in range(torch.neuron.device_count()):
        torch.accelerator.set_stream(torch.neuron.default_stream(index))
    torch.neuron.set_device(0)


def test_stream_is_a_torch_stream_on_the_current_core():
    s = torch.neuron.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("neuron", torch.neuron.current_device())
    assert s.device.type == "neuron"
    other = torch.neuron.Stream()
    assert s != other and s.stream_id != other.stream_id
    assert s == s and hash(s) == hash(s)
    assert torch_neuronx.Stream is torch.neuron.Stream


@needs_two
def test_stream_on_a_given_core():
    for spelling in (1, "neuron:1", torch.device("neuron", 1)):
        assert torch.neuron.Stream(device=spelling).device == torch.device("neuron", 1)
    with torch.neuron.device(1):
        assert torch.neuron.Stream().device_index == 1


def test_default_and_current_stream():
    default = torch.neuron.default_stream()
    assert torch.neuron.current_stream() == default
    assert isinstance(default, torch.neuron.Stream)
    assert torch.accelerator.current_stream() == default
    assert default.query()
    for index in range(torch.neuron.device_count()):
        assert torch.neuron.default_stream(index).device_index == index
        assert torch.neuron.current_stream(index) == torch.neuron.default_stream(index)


def test_set_stream():
    s = torch.neuron.Stream()
    torch.neuron.set_stream(s)
    assert torch.neuron.current_stream() == s
    assert torch.accelerator.current_stream() == s
    torch_neuronx.set_stream(torch.neuron.default_stream())
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    torch.neuron.set_stream(None)  # no-op, as in torch.cuda
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_stream_context_manager():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s) as entered:
        assert entered == s
        assert torch.neuron.current_stream() == s
        inner = torch.neuron.Stream()
        with torch_neuronx.stream(inner):
            assert torch.neuron.current_stream() == inner
        assert torch.neuron.current_stream() == s
        with torch.neuron.stream(None):
            assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    with pytest.raises(ZeroDivisionError):
        with torch.neuron.stream(s):
            1 / 0
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_streams_as_torch_stream_context():
    s = torch.neuron.Stream()
    with s:
        assert torch.neuron.current_stream() == s
    plain = torch.Stream(device="neuron:0")
    assert plain.device == torch.device("neuron", 0)
    with plain:
        assert torch.accelerator.current_stream() == plain
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_torch_stream_without_index_uses_the_current_core():
    s = torch.Stream(device="neuron")
    assert s.device == torch.device("neuron", torch.neuron.current_device())


@needs_two
def test_current_stream_is_per_core():
    s1 = torch.neuron.Stream(device=1)
    torch.neuron.set_stream(s1)  # like torch.cuda.set_stream, this makes core 1 current
    assert torch.neuron.current_device() == 1
    assert torch.neuron.current_stream(1) == s1
    assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
    torch.neuron.set_device(0)
    assert torch.neuron.current_stream() == torch.neuron.default_stream(0)
    assert torch.neuron.current_stream(1) == s1


@needs_two
def test_stream_context_on_another_core_restores_device_and_streams():
    s0 = torch.neuron.Stream(device=0)
    s1 = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s1):
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream(1) == s1
        assert torch.ones(1, device="neuron").device.index == 1
        with torch.neuron.stream(s0):
            assert torch.neuron.current_device() == 0
            assert torch.neuron.current_stream(0) == s0
            assert torch.neuron.current_stream(1) == s1
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)


def test_work_on_a_side_stream_matches_cpu():
    a = torch.randn(64, 32)
    b = torch.randn(32, 16)
    s = torch.neuron.Stream()
    na, nb = a.to("neuron"), b.to("neuron")
    with torch.neuron.stream(s):
        out = torch.relu(na @ nb) + 1
    torch.neuron.current_stream().wait_stream(s)
    torch.testing.assert_close(out.cpu(), torch.relu(a @ b) + 1, rtol=1e-5, atol=1e-5)


def test_stream_query_synchronize_wait():
    s = torch.neuron.Stream()
    x = torch.ones(1000, device="neuron")
    with torch.neuron.stream(s):
        y = x * 3
    assert s.query()
    s.synchronize()
    event = s.record_event()
    assert event.query()
    other = torch.neuron.Stream()
    other.wait_event(event)
    other.wait_stream(s)
    torch.neuron.current_stream().wait_stream(other)
    assert y.sum().item() == 3000.0


def test_synchronize():
    x = torch.randn(100, device="neuron")
    torch.neuron.synchronize()
    torch_neuronx.synchronize(0)
    for index in range(torch.neuron.device_count()):
        torch.neuron.synchronize(f"neuron:{index}")
    torch.accelerator.synchronize()
    assert torch.isfinite(x).all().item()


def test_record_stream():
    s = torch.neuron.Stream()
    torch.neuron.empty_cache()  # no other free block of this size class left by earlier tests
    x = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    address = x.data_ptr()
    with torch.neuron.stream(s):
        x.fill_(1)
    x.record_stream(s)
    assert x.sum().item() == 1 << 20
    del x
    torch.neuron.synchronize()
    y = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    assert y.data_ptr() == address  # synchronous execution: reusable at once


# ------------------------------------------------------------------- events
def test_event_is_a_torch_event():
    e = torch.neuron.Event()
    assert type(e) is torch.Event  # generic PyTorch code requires the exact type
    assert isinstance(e, torch.neuron.Event) and isinstance(e, torch.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.neuron.Event)
    assert torch_neuronx.Event is torch.neuron.Event
    e.record()
    assert e.device == torch.device("neuron", 0)
    assert e.query()
    e.synchronize()
    e.wait()
    e.wait(torch.neuron.Stream())


def test_event_elapsed_time():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    x = torch.randn(256, 256, device="neuron")
    for _ in range(10):
        x = torch.tanh(x @ x)
    time.sleep(0.05)
    t1 = time.perf_counter()
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    host_ms = (t1 - t0) * 1000
    assert isinstance(elapsed, float)
    assert elapsed >= 50.0 * 0.9
    assert elapsed <= host_ms + 1000.0  # same clock domain as the host, loosely
    assert end.elapsed_time(start) == pytest.approx(-elapsed)


def test_elapsed_time_with_torch_event_and_side_stream():
    s = torch.neuron.Stream()
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    s.record_event(start)  # torch.Stream.record_event accepts exactly torch.Event
    time.sleep(0.02)
    torch.Stream(device="neuron:0").record_event(end)
    assert start.elapsed_time(end) >= 20.0 * 0.9


def test_elapsed_time_needs_enable_timing():
    a = torch.neuron.Event()
    b = torch.neuron.Event()
    a.record()
    b.record()
    # c10::Event raises ValueError here (CUDA's backend raises RuntimeError)
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)
    timed = torch.neuron.Event(enable_timing=True)
    timed.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        timed.elapsed_time(b)


def test_elapsed_time_needs_recorded_events():
    a = torch.neuron.Event(enable_timing=True)
    b = torch.neuron.Event(enable_timing=True)
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)


def test_event_records_on_the_current_stream_and_core():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        e = torch.neuron.Event()
        e.record()
    assert e.device == torch.device("neuron", 0)
    if torch.neuron.device_count() > 1:
        with torch.neuron.device(1):
            e1 = torch.neuron.Event()
            e1.record()
        assert e1.device == torch.device("neuron", 1)
        e2 = torch.neuron.Event()
        e2.record(torch.neuron.Stream(device=1))
        assert e2.device == torch.device("neuron", 1)


def test_torch_event_and_stream_with_device_neuron():
    s = torch.Stream(device="neuron:0")
    e = torch.Event(device="neuron", enable_timing=True)
    e.record(s)
    assert e.query() and s.query()
    s.wait_event(e)
    s.synchronize()
    e2 = s.record_event()
    assert type(e2) is torch.Event and e2.device.type == "neuron"


# ------------------------------------------------------- NEURON_LAUNCH_BLOCKING
def test_malformed_launch_blocking_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX", "NEURON_"))}
    env.update(NEURON_LAUNCH_BLOCKING="yes")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    result = subprocess.run([sys.executable, "-c", "import torch; torch.ones(1, device='neuron'); print('started')"],
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0 and "started" not in result.stdout
    assert "NEURON_LAUNCH_BLOCKING='yes': expected '0' or '1'" in result.stderr


def test_launch_blocking_is_accepted():
    code = (
        "import torch\n"
        "s = torch.neuron.Stream()\n"
        "a = torch.arange(12.0).reshape(3, 4)\n"
        "with torch.neuron.stream(s):\n"
        "    y = (a.to('neuron') @ a.to('neuron').T).sum()\n"
        "assert s.query()\n"
        "print(y.item())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX", "NEURON_"))}
    env.update(NEURON_LAUNCH_BLOCKING="1")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    a = torch.arange(12.0).reshape(3, 4)
    assert float(result.stdout.strip().splitlines()[-1]) == (a @ a.T).sum().item()
