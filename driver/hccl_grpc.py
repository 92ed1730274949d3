"""HCCL's cross-node transport: a device reaches peer devices on other nodes over gRPC.

The device host (:mod:`driver.host`) installs :class:`GrpcTransport` as the HCCL engine's
``CROSS_NODE`` transport (:mod:`devices.hccl_transport` defines the interface); the engine uses it for
ranks whose node identity differs from its own.  A link reads a peer range with the peer's ``HcclRead``
(streamed), delivers control messages with ``HcclNotify``, and probes liveness with ``GetHealth``.  Every
call carries the cluster token like any driver call; the peer serves a read only to members of one of its
communicators.  All calls block the calling core thread (with the client's deadlines); any failure to
reach the peer is HCCL_E_REMOTE.
"""
from __future__ import annotations

import contextlib
import threading

from devices.errors import HCCL_E_NOT_SUPPORT, HCCL_E_REMOTE, AclError, HcclError

from .client import RemoteDevice


class GrpcLink:
    """One peer device on another node."""

    zero_copy = False        #: every read is one streamed HcclRead (a copy)
    writable = False         #: peers across nodes are only read (pulled), never written


    def __init__(self, transport: "GrpcTransport", peer):
        self._t = transport
        self.peer = peer

    def read(self, comm: str, ptr: int, nbytes: int):
        p = self.peer
        try:
            return self._t.client(p).hccl_read(comm, ptr, nbytes)
        except AclError as e:
            raise HcclError(f"read from rank {p.rank} (device {p.device_id}) failed: {e}", HCCL_E_REMOTE) from None

    def holding(self, comm: str, fence: int):
        """Nothing to hold: the peer serves ``HcclRead`` only while its operator exposes the range."""
        return contextlib.nullcontext()

    def writing(self, comm: str, ptr: int, nbytes: int, fence: int):
        raise HcclError(f"rank {self.peer.rank} (device {self.peer.device_id}) is on another node: its HBM is "
                        f"read, not written", HCCL_E_NOT_SUPPORT)

    def notify(self, msg: tuple) -> None:
        p = self.peer
        try:
            self._t.client(p).hccl_notify(msg)
        except AclError as e:
            raise HcclError(f"rank {p.rank} (device {p.device_id}) unreachable: {e}", HCCL_E_REMOTE) from None

    def probe(self) -> None:
        p = self.peer
        try:
            self._t.client(p).health()
        except AclError as e:
            raise HcclError(f"rank {p.rank} (device {p.device_id}) is gone: {e}", HCCL_E_REMOTE) from None


class GrpcTransport:
    """Cross-node transport of one device: ``address`` is this device's own endpoint (published to peers),
    ``token`` the cluster token its calls to peers carry."""

    def __init__(self, address: str, token: str, client_id: str, timeout_s: float = 30.0):
        self.address = address
        self._token = token
        self._client_id = client_id
        self._timeout = timeout_s
        self._peers: dict[tuple[str, int], RemoteDevice] = {}
        self._lock = threading.Lock()

    def endpoint(self) -> dict:
        return {"address": self.address}

    def link(self, peer) -> GrpcLink:
        if not peer.address:
            raise HcclError(f"rank {peer.rank} (device {peer.device_id}) publishes no cross-node endpoint",
                            HCCL_E_NOT_SUPPORT)
        return GrpcLink(self, peer)

    def client(self, p) -> RemoteDevice:
        """The (cached) driver client of peer ``p``; a new one when the old one saw the peer lost."""
        key = (p.address, p.device_id)
        with self._lock:
            d = self._peers.get(key)
            if d is None or d.is_lost:
                d = self._peers[key] = RemoteDevice(p.address, self._token, p.device_id, client_id=self._client_id,
                                                    timeout_s=self._timeout, same_node=False)
            return d

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for d in peers:
            d.close()


__all__ = ["GrpcTransport", "GrpcLink"]
