"""Streams and events of the neuron device (torch.Stream / torch.Event kinds).

Execution on the emulated core is synchronous, so streams never hold pending
work; their identities, the current-stream state and event timing are real.
"""

from __future__ import annotations

from typing import Any

import torch


def _neuron(device: Any) -> torch.device:
    from torch_neuronx.device import _get_device_index

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


class Event(torch.Event):
    """A neuron event; ``elapsed_time`` needs ``enable_timing=True`` on both."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(
            cls, device="neuron", enable_timing=enable_timing, blocking=blocking,
            interprocess=interprocess,
        )

    def record(self, stream: "torch.Stream | None" = None) -> None:
        super().record(current_stream() if stream is None else stream)


def current_stream(device: Any = None) -> Stream:
    return _wrap(torch.accelerator.current_stream(_neuron(device)))


def default_stream(device: Any = None) -> Stream:
    current = torch.accelerator.current_stream(_neuron(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current on its core for the duration of a with-block."""

    def __init__(self, stream: "torch.Stream | None"):
        self.stream = stream
        self.previous: torch.Stream | None = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = torch.accelerator.current_stream(self.stream.device)
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.previous is not None:
            torch.accelerator.set_stream(self.previous)
        return False


def stream(stream: "torch.Stream | None") -> StreamContext:
    return StreamContext(stream)


def synchronize(device: Any = None) -> None:
    torch.accelerator.synchronize(_neuron(device))
