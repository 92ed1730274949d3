"""serve's device memory as ``memory:`` configures it (the seed's ``strategy``, ``pool_size``,
``defrag_interval``, ``overflow_protection``; ``vnpu serve --memory-strategy --enable-memory-pool
--pool-size --defrag-interval``): the caching pool of every device the engines run on
(:class:`runtime.memory.CachingAllocator`).

- **Pool size** (``pool_bytes``): once the engines are loaded, each device's pool is capped at that many
  reserved bytes (:meth:`~runtime.memory.CachingAllocator.set_limit`) and pre-warmed to it
  (:meth:`~runtime.memory.CachingAllocator.reserve`): later requests are served from cached segments
  without a driver call, and the pool never grows past it.  :meth:`MemoryManager.resize` grows or
  shrinks it live (``vnpu serve reconfigure --memory-pool-size 4GB``): no live block moves or is freed
  -- a size below what the engines hold (weights, KV caches, activations in flight) is refused
  (:class:`PoolTooSmall`); cached segments over the new size go back to the driver, then and at each tick
  (what was still in use then goes back once freed, without waiting for a busy stream).
- **Strategy** (:data:`STRATEGIES`): ``fragmentation_aware`` -- long-lived blocks in their own pools at
  the top of HBM (the pool's ``lifetime_pools``, on unless ``VNPU_ALLOC_CONF`` turns it off; refused
  then) and the periodic defragmentation below.
- **Defrag interval** (``defrag_interval_s``): every interval, on the manager's injectable clock, the
  server's live defragmentation (:meth:`runtime.serve.server.Frontend.defragment`: engines held between
  two steps, nothing dropped), then the pool is pre-warmed again (defragmentation gives cached segments
  back first).
- **Overflow protection**: per tick, the headroom of each pool -- ``1 - peak allocated since the last
  tick / pool size`` (the device's HBM without a pool size) -- decides (:func:`next_factor`): under
  ``low`` the cached segments go back to the driver (``empty_cache``: room for other pools and clients)
  and the engines are throttled to half their batch and queue (``Frontend.throttle``; at most down to
  ``floor``), once more per tick while it stays low; it doubles back towards 1 once the headroom projected
  for the doubled batch (use scaling with the batch) is at least ``high``.
  A step whose batch would have outgrown the pool runs smaller instead of failing with 207001.

Blocking: :meth:`MemoryManager.start` and :meth:`~MemoryManager.resize` block for the driver calls of the
pre-warm; :meth:`~MemoryManager.tick` blocks for a defragmentation when one is due (the engines pause for
it) and for ``empty_cache``.  The background thread (:meth:`~MemoryManager.start_thread`) ticks once a
``period_s`` of wall time; tests call :meth:`~MemoryManager.tick` with their own clock instead.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from devices.errors import InvalidParamError

#: memory strategy name -> what it does (a registry: ``memory.strategy`` names one)
STRATEGIES: dict[str, str] = {
    "fragmentation_aware": "long-lived blocks (weights, KV caches) packed at the top of HBM in their own pools, "
                           "short-lived churn at the other end; live defragmentation every defrag_interval",
}


class PoolTooSmall(InvalidParamError):
    """A pool size below what the engines hold on a device (shrinking to it would drop live memory)."""


@dataclass(frozen=True)
class OverflowGuard:
    """Overflow protection's thresholds: headroom under ``low`` degrades (halves the throttle, frees the
    cache); it recovers (doubles the throttle back towards 1) once the headroom *projected* for the doubled
    batch -- memory use scaling with it -- is at least ``high``; never under ``floor``."""
    low: float = 0.10
    high: float = 0.15
    floor: float = 1.0 / 16

    def __post_init__(self):
        if not (0 < self.low < 1 and 0 < self.high < 1):
            raise InvalidParamError(f"overflow guard needs low and high in (0, 1), got {self.low!r}, {self.high!r}")
        if not 0 < self.floor <= 1:
            raise InvalidParamError(f"overflow guard floor must be in (0, 1], got {self.floor!r}")


def next_factor(factor: float, headroom: float, guard: OverflowGuard = OverflowGuard()) -> float:
    """The engines' admission factor after a tick that saw ``headroom`` (pure)."""
    if headroom < guard.low:
        return max(guard.floor, factor / 2)
    if factor < 1.0:
        up = min(1.0, factor * 2)
        if 1.0 - (1.0 - headroom) * up / factor >= guard.high:
            return up
    return factor


@dataclass(frozen=True)
class PoolPlan:
    """The ``memory:`` section as the manager applies it (see the module docstring); ``enabled=False``
    (``--enable-memory-pool false``): the pools are left as ``VNPU_ALLOC_CONF`` makes them."""
    strategy: str = "fragmentation_aware"
    pool_bytes: int | None = None
    defrag_interval_s: float | None = None
    overflow_protection: bool = False
    enabled: bool = True

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise InvalidParamError(f"memory strategy {self.strategy!r} is unknown (known: {', '.join(STRATEGIES)})")
        if self.pool_bytes is not None and (not isinstance(self.pool_bytes, int) or self.pool_bytes <= 0):
            raise InvalidParamError(f"pool size must be a positive number of bytes, got {self.pool_bytes!r}")
        if self.defrag_interval_s is not None and not self.defrag_interval_s > 0:
            raise InvalidParamError(f"defrag interval must be > 0 s, got {self.defrag_interval_s!r}")

    @classmethod
    def from_spec(cls, spec) -> "PoolPlan":
        """From a :class:`runtime.serve.config.MemorySpec` (None fields: the defaults)."""
        return cls(strategy=spec.strategy or "fragmentation_aware", pool_bytes=spec.pool_bytes,
                   defrag_interval_s=spec.defrag_interval_s, overflow_protection=bool(spec.overflow_protection))

    @property
    def active(self) -> bool:
        return self.enabled and (self.pool_bytes is not None or self.defrag_interval_s is not None
                                 or self.overflow_protection)


class MemoryManager:
    """Applies a :class:`PoolPlan` to the pools of ``devices()`` (runtime devices with a ``pool``);
    ``throttle(factor)`` degrades/restores the engines, ``defragment()`` runs the server's live
    defragmentation; ``clock``: seconds (injectable)."""

    def __init__(self, devices: Callable[[], list], throttle: Callable[[float], object],
                 defragment: Callable[[], list], plan: PoolPlan, clock: Callable[[], float] = time.monotonic,
                 guard: OverflowGuard = OverflowGuard()):
        self.devices, self._throttle, self._defragment = devices, throttle, defragment
        self.plan, self.clock, self.guard = plan, clock, guard
        self.factor = 1.0
        self.next_defrag: float | None = None
        self.defrags = 0
        self.degrades = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- size
    def start(self) -> dict[int, int]:
        """Check the strategy against each pool, cap and pre-warm them; arm the defragmentation timer.
        Returns device index -> bytes reserved ({} when the plan is disabled: nothing is touched)."""
        if not self.plan.enabled:
            return {}
        with self._lock:
            self.check_size(self.plan.pool_bytes)
            for d in self.devices():
                if not d.pool.config.lifetime_pools:
                    raise InvalidParamError(f"memory strategy fragmentation_aware needs the pool's lifetime_pools "
                                            f"(VNPU_ALLOC_CONF sets lifetime_pools:False on device {d.index})")
            if self.plan.defrag_interval_s is not None:
                self.next_defrag = self.clock() + self.plan.defrag_interval_s
            return self._size(self.plan.pool_bytes)

    def _size(self, nbytes: int | None) -> dict[int, int]:
        out = {}
        for d in self.devices():
            d.pool.set_limit(nbytes)
            out[d.index] = d.pool.reserve(nbytes) if nbytes is not None else d.pool.reserved()
        return out

    def check_size(self, nbytes: int | None) -> None:
        """Raise :class:`PoolTooSmall` when ``nbytes`` is below what the engines hold on a device."""
        if nbytes is None:
            return
        for d in self.devices():
            live = d.pool.memory_stats()["allocated_bytes.all.current"]
            if live > nbytes:
                raise PoolTooSmall(f"memory pool size {nbytes} B is below what device {d.index} holds now "
                                   f"({live} B: weights, KV caches, requests in flight); nothing changed")

    def resize(self, nbytes: int | None) -> dict[int, int]:
        """Grow or shrink every pool to ``nbytes`` (None: uncapped) without touching a live block: checked
        first on every device (:class:`PoolTooSmall`, nothing changed), then capped and pre-warmed."""
        with self._lock:
            self.check_size(nbytes)
            self.plan = PoolPlan(self.plan.strategy, nbytes, self.plan.defrag_interval_s,
                                 self.plan.overflow_protection, self.plan.enabled)
            return self._size(nbytes)

    def update(self, plan: PoolPlan) -> dict[int, int]:
        """A new plan, live (reconfigure): the pools resized as :meth:`resize` does (checked first), the
        defragmentation timer re-armed from now, overflow protection's throttle lifted when it is turned
        off.  Returns device index -> bytes reserved."""
        with self._lock:
            self.check_size(plan.pool_bytes)
            old, self.plan = self.plan, PoolPlan(plan.strategy, plan.pool_bytes, plan.defrag_interval_s,
                                                 plan.overflow_protection, self.plan.enabled)
            if plan.defrag_interval_s != old.defrag_interval_s:
                self.next_defrag = None if plan.defrag_interval_s is None else self.clock() + plan.defrag_interval_s
            if not plan.overflow_protection and self.factor < 1.0:
                self.factor = 1.0
                self._throttle(1.0)
            if self.plan.active and self._thread is None:
                self.start_thread()
            if plan.pool_bytes != old.pool_bytes:
                return self._size(plan.pool_bytes)
            return {d.index: d.pool.reserved() for d in self.devices()}

    # -------------------------------------------------------------- periodic work
    def tick(self, now: float | None = None) -> list[str]:
        """One round at ``now`` (default: the clock): a defragmentation when due, then overflow protection.
        Returns what it did (``defragment``, ``degrade <factor>``, ``recover <factor>``)."""
        now = self.clock() if now is None else now
        did: list[str] = []
        if not self.plan.enabled:
            return did
        with self._lock:
            if self.next_defrag is not None and now >= self.next_defrag:
                self._defragment()
                self.defrags += 1
                if self.plan.pool_bytes is not None:
                    self._size(self.plan.pool_bytes)           # defragmentation gave the cached segments back
                self.next_defrag = now + (self.plan.defrag_interval_s or 0.0)
                did.append("defragment")
            if self.plan.overflow_protection:
                did += self._protect()
            for d in self.devices():                         # a shrink finishes as the blocks it waited for free
                p = d.pool
                if p.limit is not None and p.reserved() > p.limit:
                    p.trim(0)
        return did

    def headroom(self) -> float:
        """The smallest ``1 - peak allocated / pool size`` over the devices since the last call (peaks reset)."""
        worst = 1.0
        for d in self.devices():
            p = d.pool
            size = p.limit if p.limit is not None else d.mem_info()[1]
            peak = p.memory_stats()["allocated_bytes.all.peak"]
            p.reset_peak_stats()
            worst = min(worst, 1.0 - peak / size if size else 0.0)
        return worst

    def _protect(self) -> list[str]:
        h = self.headroom()
        f = next_factor(self.factor, h, self.guard)
        if f == self.factor:
            return []
        kind = "degrade" if f < self.factor else "recover"
        if kind == "degrade":
            for d in self.devices():
                d.pool.empty_cache(0)
            self.degrades += 1
        self.factor = f
        self._throttle(f)
        return [f"{kind} {f:g}"]

    def start_thread(self, period_s: float = 1.0) -> None:
        """Tick every ``period_s`` s in a daemon thread until :meth:`stop` (once; later calls do nothing)."""
        if self._thread is not None:
            return
        def run():
            while not self._stop.wait(period_s):
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - a failed round is logged; the next one tries again
                    import logging
                    logging.getLogger(__name__).exception("memory manager tick failed")
        self._thread = threading.Thread(target=run, name="vnpu-serve-memory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def state(self) -> dict:
        """For ``/admin/state``: the plan, each pool's size and use, the throttle and counts."""
        pools = {}
        for d in self.devices():
            st = d.pool.memory_stats()
            pools[f"npu:{d.index}"] = {"limit": d.pool.limit, "reserved": st["reserved_bytes.all.current"],
                                       "allocated": st["allocated_bytes.all.current"]}
        return {"strategy": self.plan.strategy, "pool_bytes": self.plan.pool_bytes,
                "defrag_interval_s": self.plan.defrag_interval_s, "overflow_protection": self.plan.overflow_protection,
                "factor": self.factor, "defrags": self.defrags, "degrades": self.degrades, "pools": pools}


__all__ = ["MemoryManager", "OverflowGuard", "PoolPlan", "PoolTooSmall", "STRATEGIES", "next_factor"]
