"""What a device server allows: the cluster's security settings, carried from ``ClusterSpec`` (``vnpu up``)
to every device host (:mod:`driver.host`) and its server (:mod:`driver.service`).

- ``kernels``: the kernel packages every device loads when it starts and again on the admin's
  ``ReloadKernels`` (:mod:`devices.kernel_packages`): package files, or directories whose ``*.py`` files are
  packages.  The cluster adds its node's package directory (``vnpu kernels install``) when it starts devices.
  Their kernels are launched by name by every tenant: this is how code reaches a device.
- ``pickled_kernels``: whether ``RegisterKernel`` with code (a pickled Python function) is accepted -- from
  the admin only, never from a tenant.  Off by default (``vnpu up --allow-pickled-kernels`` turns it on):
  the payload would be unpickled in the device process, which runs code with the process's rights.  A
  refused upload is refused before the request is even parsed.
- ``shm_fast_path``: whether the device's HBM arena is a named ``/dev/shm`` segment (mode 0600) that
  same-node processes of the device's Unix user may map: clients copy through it, HCCL reads (and the
  mesh AllReduce writes) between same-node devices through it, under the arena's peer fence.  Off, the
  arena is anonymous memory of the device process; clients copy over gRPC and HCCL goes over gRPC between all devices.  Turn it off when processes of one Unix account
  must be isolated from each other (they could otherwise map any arena of that account).
- ``quota``: what each tenant may hold on a device (:class:`devices.tenancy.TenantQuota`).
- ``revocations``: the cluster's revocation list file, loaded when the server starts (a restarted device
  learns what was revoked while it was down).

A frozen value; nothing here blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

from devices.tenancy import TenantQuota


@dataclass(frozen=True)
class DevicePolicy:
    kernels: tuple[str, ...] = ()
    pickled_kernels: bool = False
    shm_fast_path: bool = True
    quota: TenantQuota = TenantQuota()
    revocations: str = ""


__all__ = ["DevicePolicy"]
