"""Who a device call is made for, what that caller may touch, and how much it may hold.

Two levels, as the driver's gRPC service defines them (``driver.service``):

- the **tenant** is the authenticated identity (a tenant credential, or the cluster token for the admin).
  Access is decided per tenant: every client of a tenant may use the memory, streams, events, graphs,
  communicators and kernels of every other client of that tenant, and of no other tenant;
- the **client** is a process (a session) of a tenant.  Lifetime is decided per client: what a client
  created is released when its lease ends (``driver.lease``), whoever else of its tenant used it.

An :class:`Owner` names both.  The device stores the owner of every resource it creates and compares
tenants on access (:func:`same_tenant`) and whole owners on release.  A plain string owner (the
in-process API, the tests of the device model) is its own tenant; ``None`` means "no check" (the
in-process runtime is one tenant and passes no owner).

Quotas (:class:`TenantQuota`) bound what one tenant holds on one device, so that one tenant cannot take a
device from the others: exceeding one raises the CANN code of the exhausted resource.  Owners with
``limited=False`` (the admin, the device's own HCCL buffers, in-process callers) have no quota.

Values only: nothing here blocks or orders anything.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Owner:
    """A call's caller: ``tenant`` (access) and ``client`` (lifetime), and whether quotas apply."""
    tenant: str
    client: str = ""
    limited: bool = True

    def __str__(self) -> str:
        return f"{self.tenant}/{self.client}" if self.client else self.tenant


def tenant_of(owner) -> str | None:
    """The tenant an owner belongs to (a plain string owner is its own tenant; None stays None)."""
    if owner is None:
        return None
    return owner.tenant if isinstance(owner, Owner) else str(owner)


def same_tenant(holder, caller) -> bool:
    """Whether ``caller`` may use a resource held by ``holder`` (``caller`` None: an unchecked call)."""
    return caller is None or tenant_of(holder) == tenant_of(caller)


def limited(owner) -> bool:
    """Whether quotas apply to ``owner`` (only authenticated, non-admin callers carry them)."""
    return isinstance(owner, Owner) and owner.limited


@dataclass(frozen=True)
class TenantQuota:
    """What one tenant may hold on one device (0 = no limit of its own; the device's limits still apply).

    The defaults leave room for several tenants on a device: a tenant gets a quarter of the streams a
    910B exposes (1984), an eighth of its events (65536), and 16 open health watches (each holds one of the
    endpoint's server threads).  HBM is not partitioned by default -- as on a real NPU, one process may
    fill it -- set ``hbm_bytes`` to partition it."""
    streams: int = 496
    events: int = 8192
    hbm_bytes: int = 0
    watches: int = 16

    def limit(self, resource: str, owner) -> int:
        """The limit on ``resource`` ("streams", "events", "hbm_bytes", "watches") for ``owner``;
        0 when none applies."""
        return getattr(self, resource) if limited(owner) else 0


class Usage:
    """Counts per tenant of one resource (not thread-safe: the holder's lock guards it)."""

    def __init__(self):
        self._by: dict[str, int] = {}

    def get(self, owner) -> int:
        return self._by.get(tenant_of(owner) or "", 0)

    def add(self, owner, n: int = 1) -> None:
        t = tenant_of(owner) or ""
        v = self._by.get(t, 0) + n
        if v > 0:
            self._by[t] = v
        else:
            self._by.pop(t, None)

    def clear(self) -> None:
        self._by.clear()

    def as_dict(self) -> dict[str, int]:
        return dict(self._by)


__all__ = ["Owner", "TenantQuota", "Usage", "limited", "same_tenant", "tenant_of"]
