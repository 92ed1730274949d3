"""Faults during a stress test: a schedule (one every ``every_s``, kinds in turn, victims drawn with a
seeded RNG among the devices the server uses) and the injector -- :func:`runtime.cluster.chaos.inject`,
the same one ``vnpu chaos`` uses, with the campaign's parameters (:data:`runtime.cluster.chaos.CAMPAIGN_PARAMS`).
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Callable

#: kinds a stress test may inject (a subset of devices.faults.FAULT_KINDS that a serving run survives)
STRESS_FAULTS = ("kill", "hang", "overheat", "ecc", "slow", "task-fail")


@dataclass(frozen=True)
class Scheduled:
    at: float                 #: seconds from the start
    kind: str
    device: int


def schedule(kinds: tuple[str, ...], every_s: float, duration_s: float, devices: tuple[int, ...],
             seed: int = 0) -> list[Scheduled]:
    """One fault every ``every_s`` (first at ``every_s``, none in the last ``every_s / 2``), kinds in turn."""
    if not kinds or not devices:
        return []
    rng = random.Random(seed)
    out, t, i = [], every_s, 0
    while t <= duration_s - every_s / 2:
        out.append(Scheduled(t, kinds[i % len(kinds)], rng.choice(devices)))
        t += every_s
        i += 1
    return out


class DeviceInjector:
    """Injects into the devices of runtime ``rt`` (the cluster the server runs on, or an in-process one):
    ``kill`` is a real SIGKILL of the device's actor process when it has one here."""

    def __init__(self, rt, seed: int = 0, hbm_bytes: int | None = None):
        from runtime.cluster.chaos import ChaosConfig
        self.rt = rt
        self.rng = random.Random(seed)
        self.devices = rt.devices()
        self.cfg = ChaosConfig(arena_bytes=hbm_bytes or int(self.devices[0].telemetry()["hbm_total"]))
        backend = getattr(rt, "backend", None)
        self.where = dict(getattr(backend, "where", {}) or {})

    def pid_of(self, device: int) -> int:
        w = self.where.get(self.devices[device].physical_id) or self.where.get(device) or {}
        return int(w.get("pid", 0) or 0)

    def alive(self, device: int) -> bool:
        try:
            return not bool(self.devices[device].is_lost)
        except Exception:  # noqa: BLE001 - a device that cannot say is not a target
            return False

    def __call__(self, kind: str, device: int) -> dict:
        from runtime.cluster.chaos import CAMPAIGN_PARAMS, inject
        params = CAMPAIGN_PARAMS[kind](self.rng, self.cfg, None, device)
        return dict(inject(self.devices[device].handle, kind, params, self.pid_of(device)), device=device)


class FaultDriver:
    """Fires the scheduled faults as the generator reaches their times (each on its own thread: an injection
    RPC to a hung device must not hold the arrivals back)."""

    def __init__(self, plan: list[Scheduled], inject: Callable[[str, int], dict], clock: Callable[[], float],
                 record: Callable[[dict], None] | None = None, seed: int = 0):
        """``inject(kind, device)``; when it has an ``alive(device)`` method, a planned victim that is already
        lost (killed by an earlier fault, not restarted) is replaced by a live one of the plan's devices."""
        self.plan, self.inject, self.clock, self.record = list(plan), inject, clock, record
        self.rng = random.Random(seed + 1)
        self.devices = sorted({f.device for f in self.plan})
        self.fired: list[dict] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._next = 0

    def on_arrival(self, t: float) -> None:
        while self._next < len(self.plan) and self.plan[self._next].at <= t:
            f = self.plan[self._next]
            self._next += 1
            th = threading.Thread(target=self._fire, args=(f,), name="vnpu-stress-fault", daemon=True)
            self._threads.append(th)
            th.start()

    def _fire(self, f: Scheduled) -> None:
        import time
        alive = getattr(self.inject, "alive", None)
        if alive is not None and not alive(f.device):
            live = [d for d in self.devices if alive(d)]
            if live:
                f = Scheduled(f.at, f.kind, self.rng.choice(live))
        wall = time.time()
        try:
            r = self.inject(f.kind, f.device)
            r = dict(r, at=f.at, wall=wall, ok=True)
        except Exception as e:  # noqa: BLE001 - reported: a fault that could not be injected
            r = {"kind": f.kind, "device": f.device, "at": f.at, "wall": wall, "ok": False,
                 "error": f"{type(e).__name__}: {e}"}
        with self._lock:
            self.fired.append(r)
        if self.record is not None:
            try:
                self.record(r)
            except Exception:  # noqa: BLE001 - the event log is best effort; the report has the fault
                pass

    def join(self, timeout: float = 30.0) -> None:
        for th in self._threads:
            th.join(timeout)
