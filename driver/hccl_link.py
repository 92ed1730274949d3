"""The cross-node HCCL transport: device actors reach their peers' devices over gRPC.

Installed by the device actor as ``device.hccl.remote``; the HCCL engine (``devices.hccl``) calls
``read``/``notify``/``alive`` for ranks whose node differs from its own.  Every call carries the cluster
token like any driver call; the peer serves a read only to members of one of its communicators.
"""
from __future__ import annotations

import threading

from devices.errors import HCCL_E_REMOTE, AclError, HcclError

from .client import RemoteDevice


class GrpcLinks:
    def __init__(self, token: str, client_id: str, timeout_s: float = 30.0):
        self._token = token
        self._client = client_id
        self._timeout = timeout_s
        self._peers: dict[tuple[str, int], RemoteDevice] = {}
        self._lock = threading.Lock()

    def _peer(self, p) -> RemoteDevice:
        key = (p.address, p.device_id)
        with self._lock:
            d = self._peers.get(key)
            if d is None or d.is_lost:
                d = self._peers[key] = RemoteDevice(p.address, self._token, p.device_id, client_id=self._client,
                                                    timeout_s=self._timeout, same_node=False)
            return d

    def read(self, p, comm: str, ptr: int, nbytes: int):
        try:
            return self._peer(p).hccl_read(comm, ptr, nbytes)
        except AclError as e:
            raise HcclError(f"read from rank {p.rank} (device {p.device_id}) failed: {e}", HCCL_E_REMOTE) from None

    def notify(self, p, msg) -> None:
        try:
            self._peer(p).hccl_notify(msg)
        except AclError as e:
            raise HcclError(f"rank {p.rank} (device {p.device_id}) unreachable: {e}", HCCL_E_REMOTE) from None

    def alive(self, p) -> bool:
        try:
            self._peer(p).health()
            return True
        except AclError:
            return False

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for d in peers:
            d.close()
