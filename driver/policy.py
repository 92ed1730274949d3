"""What a device server allows: the cluster's security settings, carried from ``ClusterSpec`` (``vnpu up``)
to every device host (:mod:`driver.host`) and its server (:mod:`driver.service`).

- ``user_kernels``: whether ``RegisterKernel`` is accepted.  Registering a kernel runs the client's code
  in the device process (the payload is unpickled there, and the kernel then runs on its core threads
  with the process's rights, as a Ray task would): a cluster whose tenants must not run code on the
  devices turns it off; registration is then refused before the payload is even read.
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
    user_kernels: bool = True
    shm_fast_path: bool = True
    quota: TenantQuota = TenantQuota()
    revocations: str = ""


__all__ = ["DevicePolicy"]
