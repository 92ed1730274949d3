"""What the pool needs from the driver: one device's allocator (``malloc`` / ``free`` / ``mem_info``).

The pool is a layer over this small interface, never a flag inside it: :class:`HandleAllocator` adapts
any :class:`runtime.backend.DeviceHandle` (an in-process :class:`devices.device.Device` or a
:class:`driver.client.RemoteDevice`), so the same pool runs in-process and over gRPC, and every driver
call it makes is one call here (counted as ``num_device_alloc`` / ``num_device_free``).

Every method blocks the host (it is a driver call: an RPC on the cluster backend) and orders no device
work.  Failures raise the driver's typed errors (207001 when the arena has no room).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from devices.arena import ACL_MEM_MALLOC_HUGE_FIRST


@dataclass(frozen=True)
class ArenaState:
    """The device arena as the driver reports it (all tenants' allocations together)."""
    free: int
    total: int
    largest_free: int

    @property
    def fragmentation(self) -> float:
        """1 - largest free block / free bytes (0 when nothing is free)."""
        return 1.0 - self.largest_free / self.free if self.free else 0.0


class DriverAllocator(Protocol):
    def malloc(self, size: int, placement: int) -> int:
        """One driver allocation of ``size`` bytes (``placement``: devices.arena.PLACEMENT_*)."""

    def free(self, ptr: int) -> None:
        """Return a driver allocation."""

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device's HBM."""

    def arena(self) -> ArenaState:
        """Free, total and largest free block of the device arena (for OOM messages and reports)."""


class HandleAllocator:
    """:class:`DriverAllocator` over one device handle.  Segments are allocated with CANN's default
    policy (huge pages first: a segment over 1 MiB takes whole 2 MiB pages, as the pool's sizes are)."""

    policy = ACL_MEM_MALLOC_HUGE_FIRST

    def __init__(self, handle):
        self.handle = handle

    def malloc(self, size: int, placement: int) -> int:
        return self.handle.malloc(size, self.policy, placement=placement)

    def free(self, ptr: int) -> None:
        self.handle.free(ptr)

    def mem_info(self) -> tuple[int, int]:
        return self.handle.mem_info()

    def arena(self) -> ArenaState:
        t = self.handle.telemetry()
        return ArenaState(int(t["hbm_free"]), int(t["hbm_total"]), int(t["hbm_largest_free"]))
