"""Streams and events of the neuron device (torch.Stream / torch.Event kinds).

Execution on the emulated core is synchronous, so streams never hold pending
work; their identities, the current-stream state and event timing are real.
"""

from __future__ import annotations

from typing import Any

import torch


def _neuron(device: Any) -> torch.device:
    from torch_neuronx.neuron import _get_device_index

    return torch.device("neuron", _get_device_index(device))


class Stream(torch.Stream):
    """A neuron stream. ``Stream()`` creates a new stream on the current core."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if kwargs:  # wrapping an existing stream (stream_id/device_index/device_type)
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=_neuron(device), priority=priority)

    def wait_event(self, event: "torch.Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: "torch.Stream") -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: "torch.Event | None" = None) -> "torch.Event":
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device={self.device} stream_id={self.stream_id}>"


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(
        stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
    )


class _EventMeta(type):
    """``isinstance(e, torch.neuron.Event)`` is true for any neuron ``torch.Event``."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return type(obj) is torch.Event and obj.device.type == "neuron"


class Event(torch.Event, metaclass=_EventMeta):
    """A neuron event; ``elapsed_time`` needs ``enable_timing=True`` on both.

    Constructing one returns a plain ``torch.Event`` on the neuron device, not an
    instance of a subclass: PyTorch's ``Event.elapsed_time`` and
    ``Stream.record_event`` accept only objects whose type is exactly
    ``torch.Event``, so a subclass instance could not be timed or recorded by
    generic code. ``record()`` / ``wait()`` without a stream use the current
    stream of the current core.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return torch.Event(
            device="neuron", enable_timing=enable_timing, blocking=blocking,
            interprocess=interprocess,
        )


def current_stream(device: Any = None) -> Stream:
    return _wrap(torch.accelerator.current_stream(_neuron(device)))


def default_stream(device: Any = None) -> Stream:
    current = torch.accelerator.current_stream(_neuron(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current for the duration of a with-block.

    As with ``torch.cuda.StreamContext``, the stream's core becomes the current
    device inside the block; on exit the previous current stream of that core,
    the previous current device and its current stream are restored.
    """

    def __init__(self, stream: "torch.Stream | None"):
        self.stream = stream
        self.src_prev_stream: torch.Stream | None = None
        self.dst_prev_stream: torch.Stream | None = None

    def __enter__(self):
        if self.stream is None:
            return None
        self.src_prev_stream = torch.accelerator.current_stream()
        self.dst_prev_stream = torch.accelerator.current_stream(self.stream.device)
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        # set_stream also makes the stream's core current, so the source
        # device's stream goes last to restore the previous current device.
        torch.accelerator.set_stream(self.dst_prev_stream)
        torch.accelerator.set_stream(self.src_prev_stream)
        return False


def stream(stream: "torch.Stream | None") -> StreamContext:
    return StreamContext(stream)


def synchronize(device: Any = None) -> None:
    torch.accelerator.synchronize(_neuron(device))
