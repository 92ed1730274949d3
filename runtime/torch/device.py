"""``torch.npu``: the device module of the ``npu`` device (registered by :mod:`runtime.torch`).

Devices are the vnpu runtime's visible devices (:mod:`.context`).  Streams and events are vnpu streams
and events: :class:`Stream` work is ordered on the device, :class:`Event` ``record``/``wait`` only order
the device, ``synchronize``/``elapsed_time`` block the host.  Memory figures come from each device's
caching pool (``runtime.memory``; PyTorch's key names).  Random operators draw from a per-device CPU
generator seeded by :func:`manual_seed` (the numbers are then uploaded), so a seed gives the same tensor
on ``npu`` as on the CPU.  Bad device indices raise :class:`~.errors.NpuDeviceError`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from runtime import api

from . import context
from .errors import NpuDeviceError, NpuDeviceMismatchError


def is_available() -> bool:
    """True when the runtime has at least one device (creates the runtime on first call)."""
    try:
        return context.device_count() > 0
    except Exception:          # no cluster to attach to, ...: not available, as torch.cuda says
        return False


def is_initialized() -> bool:
    return api.current_runtime() is not None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return context.device_count()


def current_device() -> int:
    return context.current_index()


def _idx(device: Any = None) -> int:
    if device is None:
        return context.current_index()
    if isinstance(device, int) and not isinstance(device, bool):
        return context.check_index(device)
    d = torch.device(device)
    if d.type != "npu":
        raise NpuDeviceError(f"expected an npu device, got {d}")
    return context.current_index() if d.index is None else context.check_index(d.index)


def set_device(device: Any) -> None:
    """Make ``device`` (an index, ``"npu:N"`` or a torch.device) this thread's current npu device."""
    context.set_index(_idx(device))


class device:                                                # noqa: N801 (torch's name)
    """``with torch.npu.device(i):`` -- ``i`` is the current device inside the block."""

    def __init__(self, device: Any):
        self.idx = _idx(device) if device is not None else -1
        self.prev = -1

    def __enter__(self):
        self.prev = context.current_index()
        if self.idx >= 0:
            context.set_index(self.idx)
        return self

    def __exit__(self, *exc) -> None:
        context.set_index(self.prev)


def synchronize(device: Any = None) -> None:
    """Block the host until all work on the device (default: current) is done; raises its first task error."""
    context.device(_idx(device)).synchronize()


# ---------------------------------------------------------------------------------------------- streams
class Stream:
    """A vnpu stream of ``device`` (``priority``: smaller runs first, as in vnpu)."""

    def __init__(self, device: Any = None, priority: int = 0, *, _wrap: "api.Stream | None" = None):
        self.vstream = _wrap if _wrap is not None else context.device(_idx(device)).stream(priority)
        self.device = torch.device("npu", self.vstream.device.index)

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.vstream is self.vstream

    def __hash__(self) -> int:
        return hash(id(self.vstream))

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device={self.device} vnpu stream {self.vstream.sid}>"

    def wait_event(self, event: "Event") -> None:
        """Later work on this stream waits for ``event`` (only orders the device)."""
        event.wait(self)

    def wait_stream(self, stream: "Stream") -> None:
        """Later work on this stream waits for the work queued on ``stream`` so far (only orders the device)."""
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return self.vstream.query()

    def synchronize(self) -> None:
        """Block the host until this stream's work is done."""
        self.vstream.synchronize()


def current_stream(device: Any = None) -> Stream:
    dev = context.device(_idx(device))
    return Stream(_wrap=context.current_stream(dev))


def default_stream(device: Any = None) -> Stream:
    return Stream(_wrap=context.device(_idx(device)).default_stream)


def set_stream(stream: Stream) -> None:
    context.set_stream(stream.vstream, stream.vstream.device.index)


@contextlib.contextmanager
def stream(s: "Stream | None") -> Iterator["Stream | None"]:
    """``with torch.npu.stream(s):`` -- npu work of this thread on ``s``'s device goes to ``s`` (and that
    device is current) inside the block; None: no change."""
    if s is None:
        yield s
        return
    idx = s.vstream.device.index
    prev_dev = context.current_index()
    old = context.set_stream(s.vstream, idx)
    context.set_index(idx)
    try:
        yield s
    finally:
        context.set_stream(old, idx)
        context.set_index(prev_dev)


class Event:
    """A vnpu event, created on the device of the first stream it is recorded on."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.vevent: "api.Event | None" = None

    def record(self, stream: "Stream | None" = None) -> None:
        """Mark the current point of ``stream`` (default: the current stream) -- only orders the device."""
        s = stream.vstream if stream is not None else context.current_stream(context.device())
        if self.vevent is None:
            self.vevent = s.device.event()
        elif self.vevent.device is not s.device:
            raise NpuDeviceMismatchError(f"event of npu:{self.vevent.device.index} recorded on a stream of "
                                         f"npu:{s.device.index}")
        self.vevent.record(s)

    def wait(self, stream: "Stream | None" = None) -> None:
        """Later work on ``stream`` (default: current) waits for the latest record (only orders the device)."""
        if self.vevent is None:
            return
        s = stream.vstream if stream is not None else context.current_stream(self.vevent.device)
        if s.device is not self.vevent.device:
            raise NpuDeviceMismatchError(f"a stream of npu:{s.device.index} cannot wait on an event of "
                                         f"npu:{self.vevent.device.index}")
        s.wait(self.vevent)

    def query(self) -> bool:
        return True if self.vevent is None else self.vevent.query()

    def synchronize(self) -> None:
        """Block the host until the latest record is done."""
        if self.vevent is not None:
            self.vevent.synchronize()

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded and completed): the device's modeled
        time, the figure a real NPU would report (host-blocking only for the hand-over)."""
        if self.vevent is None or end.vevent is None:
            raise NpuDeviceMismatchError("elapsed_time: both events must have been recorded")
        return float(self.vevent.elapsed(end.vevent).modeled_ms)


# ---------------------------------------------------------------------------------------------- memory
def memory_stats(device: Any = None) -> dict:
    """The device's caching-pool counters (``allocated_bytes.all.current`` ... as ``torch.cuda``)."""
    return context.device(_idx(device)).memory_stats()


def memory_allocated(device: Any = None) -> int:
    return context.device(_idx(device)).memory_allocated()


def memory_reserved(device: Any = None) -> int:
    return context.device(_idx(device)).memory_reserved()


def max_memory_allocated(device: Any = None) -> int:
    return int(memory_stats(device)["allocated_bytes.all.peak"])


def max_memory_reserved(device: Any = None) -> int:
    return int(memory_stats(device)["reserved_bytes.all.peak"])


def reset_peak_memory_stats(device: Any = None) -> None:
    context.device(_idx(device)).reset_peak_memory_stats()


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    return context.device(_idx(device)).memory_summary(abbreviated)


def empty_cache() -> None:
    """Give every device's unused cached segments back to the driver (host-blocking, see runtime.api)."""
    rt = api.current_runtime()
    if rt is not None:
        for d in rt.devices():
            d.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return context.device(_idx(device)).mem_info()


# ---------------------------------------------------------------------------------------------- random
_GENERATORS: dict[int, torch.Generator] = {}


def generator(index: int) -> torch.Generator:
    """The CPU generator behind npu:index's random operators."""
    g = _GENERATORS.get(index)
    if g is None:
        g = _GENERATORS[index] = torch.Generator()
        g.manual_seed(torch.initial_seed() + index)
    return g


def manual_seed(seed: int) -> None:
    generator(context.current_index()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(max(1, _count_or_zero())):
        generator(i).manual_seed(int(seed))


def _count_or_zero() -> int:
    try:
        return context.device_count()
    except Exception:
        return 0


def seed() -> None:
    generator(context.current_index()).seed()


def initial_seed() -> int:
    return generator(context.current_index()).initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return generator(_idx(device)).get_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    generator(_idx(device)).set_state(state)
