"""Placements and the fallback chain: where an engine's model runs, and where it goes when that fails.

A :class:`Placement` is a set of visible device ids (tensor parallel over all of them) or the CPU
fallback device.  A model's chain is an ordered tuple of placements -- e.g. TP=3 on devices 0-2, then TP=1
on a spare, then the CPU -- and the engine runs on one entry at a time (:mod:`.llm_engine`:
``fallback()`` moves down, ``restore()`` back to the first entry).

:class:`DeviceBinder` turns placements into :class:`runtime.api.Device` objects on a runtime and answers
whether a placement is usable.  Loss is what the runtime's health watch already knows: a device's
``is_lost`` flag is set by the device itself (fault ``kill`` in-process) or by the cluster backend's
health/lease watch when the device process goes away (:mod:`runtime.cluster.remote`) -- reading it costs no
call.  :meth:`DeviceBinder.healthy` adds the device's reported health level (one call per device), for
decisions that can afford it (restore).  The CPU fallback device is an in-process
:class:`devices.device.Device` with the same kernels (as :class:`runtime.cluster.failover.DevicePool` uses),
created on first use and closed with the binder.

Blocking: :meth:`DeviceBinder.devices` may create the CPU device (an arena segment, host-synchronous);
:meth:`DeviceBinder.healthy` issues one health call per device; everything else is host-only.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from devices.errors import AclError, InvalidParamError

#: health levels that make a placement unusable (as the device pool's default)
UNHEALTHY_LEVELS = ("Alarm", "Critical")
#: physical ids of serve's CPU fallback devices (distinct from the device pool's)
SERVE_CPU_ID = 0x7E00


@dataclass(frozen=True)
class Placement:
    """Visible device ids (``devices``), or the CPU fallback device (``cpu=True``)."""
    devices: tuple[int, ...] = ()
    cpu: bool = False

    def __post_init__(self):
        if self.cpu and self.devices:
            raise InvalidParamError("a placement is either devices or the CPU, not both")
        if not self.cpu and not self.devices:
            raise InvalidParamError("a placement needs at least one device (or cpu)")

    @property
    def tp(self) -> int:
        return 1 if self.cpu else len(self.devices)

    def __str__(self) -> str:
        if self.cpu:
            return "cpu"
        d = self.devices
        if len(d) > 1 and d == tuple(range(d[0], d[-1] + 1)):
            return f"npu {d[0]}-{d[-1]} (tp={len(d)})"
        return f"npu {','.join(map(str, d))}" + (f" (tp={len(d)})" if len(d) > 1 else "")


class DeviceNamedTwice(ValueError):
    """A device list that names a device twice."""


def device_list(text) -> tuple[int, ...]:
    """``"2"`` / ``2`` -> (2,), ``"0-2"`` -> (0, 1, 2), ``"0,2"`` -> (0, 2); ValueError (with the reason) for
    anything else, a device named twice included."""
    if isinstance(text, bool):
        raise ValueError("not a device list")
    out: list[int] = []
    for part in str(text).split(","):
        a, _, b = part.strip().partition("-")
        lo, hi = int(a), int(b) if b else int(a)
        if lo < 0 or hi < lo:
            raise ValueError("not a device list")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise DeviceNamedTwice(text)
    return tuple(out)


def parse_placement(text, where: str = "") -> Placement:
    """``"cpu"``, ``3``, ``"3"``, ``"0-2"`` or ``"0,2"``."""
    if isinstance(text, str) and text.strip().lower() == "cpu":
        return Placement(cpu=True)
    try:
        return Placement(device_list(text))
    except DeviceNamedTwice:
        raise InvalidParamError(f"{where}placement {text!r} names a device twice") from None
    except ValueError:
        raise InvalidParamError(f"{where}bad placement {text!r} (use cpu, 3, 0-2 or 0,2)") from None


class DeviceBinder:
    """Placements as devices of runtime ``rt``; the CPU fallback device on demand (its arena: the HBM size
    of the runtime's devices unless ``cpu_arena_bytes`` says otherwise -- a sparse segment that costs only
    what is used)."""

    def __init__(self, rt, cpu_arena_bytes: int | None = None):
        self.rt = rt
        self.cpu_arena_bytes = cpu_arena_bytes
        self._cpu = None              # (devices.device.Device, runtime.api.Device)

    def devices(self, p: Placement) -> list:
        if p.cpu:
            return [self._cpu_device()]
        have = self.rt.device_count()
        bad = [i for i in p.devices if not 0 <= i < have]
        if bad:
            raise InvalidParamError(f"placement {p}: device {bad[0]} does not exist (the runtime has {have})")
        return [self.rt.device(i) for i in p.devices]

    def _cpu_device(self):
        if self._cpu is None:
            from devices.device import Device, DeviceConfig
            from runtime.cluster.failover import wrap_handle
            size = self.cpu_arena_bytes or self._npu_hbm()
            dev = Device(replace(DeviceConfig(), device_id=SERVE_CPU_ID, arena_bytes=int(size)))
            self._cpu = (dev, wrap_handle(dev, "cpu"))
        return self._cpu[1]

    def _npu_hbm(self) -> int:
        """HBM of the first reachable device (the CPU device mirrors it), else 2 GiB."""
        for i in range(self.rt.device_count()):
            d = self.rt.device(i)
            if not d.is_lost:
                with contextlib.suppress(AclError):
                    return int(d.mem_info()[1])
        return 2 << 30

    def lost(self, p: Placement) -> str | None:
        """Why ``p`` cannot run (a device is lost), from local state only; None when it can."""
        if p.cpu:
            return "the CPU fallback device is lost" if self._cpu is not None and self._cpu[1].is_lost else None
        for i in p.devices:
            if 0 <= i < self.rt.device_count() and self.rt.device(i).is_lost:
                return f"device {i} is lost"
        return None

    def healthy(self, p: Placement) -> tuple[bool, str]:
        """Whether ``p`` can serve: no device lost and none reporting an Alarm/Critical health level
        (one health call per device)."""
        why = self.lost(p)
        if why is not None:
            return False, why
        if p.cpu:
            return True, "ok"
        for i in p.devices:
            try:
                level, reasons = self.rt.device(i).health()
            except AclError as e:
                return False, f"device {i}: {e}"
            if level in UNHEALTHY_LEVELS:
                return False, f"device {i} is {level}: {'; '.join(reasons)}"
        return True, "ok"

    def close(self) -> None:
        if self._cpu is not None:
            dev, _ = self._cpu
            self._cpu = None
            with contextlib.suppress(Exception):
                dev.close()
