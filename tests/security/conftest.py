"""security tier: attacks on the driver, each of which must fail.

Devices run in this process and are served by :func:`driver.service.serve` on 127.0.0.1 (real gRPC over
loopback, ephemeral ports); attackers and victims are :class:`driver.client.RemoteDevice` clients with
their own credentials -- tenant tokens minted from the cluster secret, or the cluster token (the admin).
No mocks: every refusal is the device's answer over the wire.  Budget: < 60 s on 2 cores.
"""
from __future__ import annotations

import numpy as np
import pytest

from devices.device import Device, DeviceConfig
from devices.tenancy import TenantQuota
from driver import credentials
from driver.client import RemoteDevice
from driver.policy import DevicePolicy
from driver.service import serve

SECRET = "security-tier-cluster-token-0123456789"
ARENA = 8 << 20


class Site:
    """Served devices and the clients made for them; everything is torn down in ``close``."""

    def __init__(self):
        self.servers: list = []
        self.clients: list[RemoteDevice] = []

    def device(self, device_id: int = 20, *, policy: DevicePolicy = DevicePolicy(), lease_grace_s: float = 0.2,
               **config):
        config.setdefault("arena_bytes", ARENA)
        config.setdefault("cores", 2)
        config.setdefault("shm", policy.shm_fast_path)
        dev = Device(DeviceConfig(device_id=device_id, quota=policy.quota, **config))
        try:
            srv = serve(dev, host="127.0.0.1", token=SECRET, port=0, policy=policy, lease_grace_s=lease_grace_s)
        except BaseException:
            dev.close()
            raise
        self.servers.append(srv)
        return srv

    def client(self, srv, token: str = SECRET, *, lease: bool = True, same_node: bool = False,
               **kw) -> RemoteDevice:
        c = RemoteDevice(srv.address, token, srv.device.id, timeout_s=10.0, same_node=same_node, **kw)
        self.clients.append(c)
        if lease:
            c.open_lease()
        return c

    def tenant(self, name: str, **kw) -> str:
        """A credential of tenant ``name`` for this site's cluster."""
        return credentials.mint(SECRET, name, **kw)

    def close(self) -> None:
        for c in self.clients:
            c.close()
        for srv in self.servers:
            srv.stop(grace=None)
            srv.device.close()


@pytest.fixture
def site():
    s = Site()
    try:
        yield s
    finally:
        s.close()


def quota(**kw) -> DevicePolicy:
    return DevicePolicy(quota=TenantQuota(**kw))


def filled(c: RemoteDevice, nbytes: int, value: int) -> int:
    p = c.malloc(nbytes)
    c.memcpy_h2d(p, np.full(nbytes, value, np.uint8))
    return p
