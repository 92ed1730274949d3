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

What every engine of a chain shares (the generation engine and the embedding engine): the decision of
what a ``fallback`` / ``restore`` request means where the engine stands (:func:`rebind_candidates`), binding
the first usable entry of some candidates (:func:`bind_first`), and what a re-bind did
(:class:`RebindResult`, also recorded as an event).

Blocking: :meth:`DeviceBinder.devices` may create the CPU device (an arena segment, host-synchronous);
:meth:`DeviceBinder.healthy` issues one health call per device (so does :func:`rebind_candidates` for a
restore); :func:`bind_first` blocks for what ``build`` does; everything else is host-only.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence, TypeVar

from devices.errors import AclError, InvalidParamError

from .errors import Unavailable

T = TypeVar("T")

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


@dataclass(frozen=True)
class RebindResult:
    """What one re-bind did (also recorded as an event)."""
    moved: bool
    from_index: int
    to_index: int
    placement: str
    reason: str
    replayed: int                        #: unfinished requests (or batches) replayed on the new placement
    seconds: float


def rebind_candidates(binder: DeviceBinder, chain: Sequence[Placement], index: int, kind: str, model: str,
                      away_from: int | None = None) -> RebindResult | range | tuple[int, ...]:
    """What a ``fallback``, ``restore`` or ``restart`` request means for an engine on ``chain[index]``: a
    :class:`RebindResult` with ``moved`` False when there is nothing to do (already off device ``away_from``,
    already on the first entry), else the chain entries to try, in order (a restart: the entry it is on,
    built again).  :class:`Unavailable` when the request cannot be met (a fallback from the last entry; a
    restore to a first entry that is not healthy: one health call per device)."""
    here = chain[index]
    if kind == "restart":
        return (index,)
    if kind == "fallback" and away_from is not None and (here.cpu or away_from not in here.devices):
        return RebindResult(False, index, index, str(here), f"already off device {away_from}", 0, 0.0)
    if kind == "fallback":
        if index + 1 >= len(chain):
            raise Unavailable(f"the {model} engine runs on the last entry of its fallback chain ({here})")
        return range(index + 1, len(chain))
    if index == 0:
        return RebindResult(False, 0, 0, str(here), "already on the first placement", 0, 0.0)
    ok, why = binder.healthy(chain[0])
    if not ok:
        raise Unavailable(f"cannot restore {chain[0]}: {why}")
    return (0, index)


def bind_first(binder: DeviceBinder, chain: Sequence[Placement], candidates: Iterable[int],
               build: Callable[[list], T], model: str) -> tuple[int, T]:
    """Build the engine's model (``build(devices)``) on the first candidate entry of ``chain`` that has no
    lost device and builds; ``(index, what build returned)``.  :class:`Unavailable` naming every entry
    tried and why when none does."""
    tried = []
    for i in candidates:
        why = binder.lost(chain[i])
        if why is not None:
            tried.append(f"{chain[i]}: {why}")
            continue
        try:
            return i, build(binder.devices(chain[i]))
        except Exception as e:  # noqa: BLE001 - try the next entry
            tried.append(f"{chain[i]}: {type(e).__name__}: {e}")
    raise Unavailable(f"no usable placement for {model} ({'; '.join(tried) or 'none left'})")


def release(built, model: str, where: Placement) -> None:
    """Close what an engine built on ``where`` (a model runner or a job; nothing when None).  A lost device
    cannot free its share (logged); the others are freed all the same."""
    if built is None:
        return
    try:
        built.close()
    except Exception as e:  # noqa: BLE001 - a lost device cannot free; the others were freed
        logging.getLogger("vnpu.serve").info("engine %s: releasing %s: %s", model, where, e)
