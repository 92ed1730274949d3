"""HCCL peer transports: how one device reaches a peer device's HBM and control endpoint.

The HCCL engine (:mod:`devices.hccl`) chooses a transport per peer when a communicator is built
(:class:`Transports`, one per scope): the peer's node identity (:mod:`devices.node`) equal to this
device's -> :data:`SAME_NODE`, else :data:`CROSS_NODE`.  Each transport hands out one :class:`PeerLink` per
peer, and the engine's algorithm code talks only to links -- it never asks which transport it has:

- ``read(comm, ptr, nbytes)``: bytes of the peer's HBM (host-blocking; a zero-copy view where the
  transport allows it);
- ``notify(msg)``: deliver one small control message ``(comm, seq, tag, from_rank, payload)`` to the
  peer's engine (host-blocking send; never waits for an answer);
- ``probe()``: liveness -- raises :class:`~devices.errors.HcclError` ``HCCL_E_REMOTE`` when the peer is gone;
- ``zero_copy``: whether ``read`` returns a view of the peer's memory (then the engine reads in
  cache-sized segments; otherwise each read is one transfer of ``CommConfig.segment_bytes``);
- ``holding(comm, fence)``: a block during which the peer's buffers may be read (and written), entered
  only while the peer's fence holds the value it published for the operator -- a peer that gave up the
  operator is neither read nor written afterwards (host-blocking while the peer stops accesses);
- ``writable`` / ``writing(comm, ptr, nbytes, fence)``: whether this device may write the peer's HBM
  directly (same node: the mapped arena), and a writable view of a range for a block held the same way;
  the engine pushes only where every link is writable.

Any failure to reach a peer raises ``HCCL_E_REMOTE``.  What a device publishes so that peers can build
links to it is each transport's :meth:`Transport.endpoint` (merged into ``HcclEngine.info()``).

Trust: a doorbell is an abstract Unix socket, which any process of the machine can send to, so every
datagram is *sealed* -- an HMAC under the devices' link key (derived from the cluster secret by the device
host; a random per-process key for in-process devices) -- and one that does not verify is dropped.
Otherwise a client that knows its own communicator id could forge a peer's "ready" message and make its
rank pull from any address of the peer's HBM.  A mapped peer arena must carry the peer's device id in its
header, and a read must name a pointer of that device, so a forged peer table cannot pass one device's
HBM off as another's.

:class:`ShmTransport` (same node) lives here, as plain Python: data is pulled straight out of the peer's
HBM arena, mapped from ``/dev/shm``; control messages go through *doorbells*, one abstract-namespace Unix
datagram socket per device (no file; gone when its process dies).  The cross-node transport (gRPC between
device actors) lives at the driver's edge (``driver.hccl_grpc``) and is installed by the device host.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
from typing import Callable, Protocol

import numpy as np

from .arena import FENCE_OFFSET, SHM_DIR, attach, ptr_device, ptr_offset
from .errors import HCCL_E_NOT_SUPPORT, HCCL_E_PARA, HCCL_E_REMOTE, AclError, HcclError, InvalidParamError
from .node import same_node

#: transport scopes: the engine holds one transport per scope
SAME_NODE = "same-node"
CROSS_NODE = "cross-node"

#: the link key of in-process devices (devices of one process seal with it; device hosts derive theirs
#: from the cluster secret, :func:`link_key`)
PROCESS_LINK_KEY = secrets.token_bytes(32)
_MAC_BYTES = 16


def link_key(cluster_secret: str) -> bytes:
    """The doorbell link key of a cluster's devices: derived from the cluster secret (clients of tenants
    do not hold it, so they cannot forge a device's control message)."""
    return hmac.new(cluster_secret.encode(), b"vnpu hccl doorbell link key v1", hashlib.sha256).digest()


class PeerLink(Protocol):
    """One device's way to one peer device (built when a communicator is built)."""

    zero_copy: bool
    writable: bool

    def read(self, comm: str, ptr: int, nbytes: int) -> np.ndarray: ...
    def holding(self, comm: str, fence: int) -> contextlib.AbstractContextManager: ...
    def writing(self, comm: str, ptr: int, nbytes: int, fence: int) -> contextlib.AbstractContextManager: ...
    def notify(self, msg: tuple) -> None: ...
    def probe(self) -> None: ...


class Transport(Protocol):
    """Makes links to peers of one scope; ``endpoint()`` is what this device publishes for them."""

    def endpoint(self) -> dict: ...
    def link(self, peer) -> PeerLink: ...
    def close(self) -> None: ...


class Doorbell:
    """A device's control endpoint on its node: an abstract Unix datagram socket plus a receiver thread
    that hands every well-formed message sealed with ``key`` to ``deliver``."""

    def __init__(self, name: str, deliver: Callable[[tuple], bool], key: bytes = PROCESS_LINK_KEY):
        self.name = name
        self._deliver = deliver
        self._key = key
        self._rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._rx.bind("\0" + name)
        self._tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"doorbell-{name}")
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            try:
                data = self._rx.recv(1 << 16)
            except OSError:
                return
            if not data:
                continue                       # a liveness probe
            mac, body = data[:_MAC_BYTES], data[_MAC_BYTES:]
            if not hmac.compare_digest(mac, self._seal(body)):
                continue                       # not sealed by a device of this cluster: drop
            try:
                msg = tuple(json.loads(body))
            except (ValueError, TypeError):
                continue                       # malformed: drop
            self._deliver(msg)

    def _seal(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()[:_MAC_BYTES]

    def send(self, doorbell: str, msg: tuple) -> None:
        """Raises HcclError(E_REMOTE) when the peer's doorbell is gone."""
        body = json.dumps(msg).encode()
        try:
            self._tx.sendto(self._seal(body) + body, "\0" + doorbell)
        except OSError as e:            # refused, gone, broken pipe while the peer closes, ...
            raise HcclError(f"peer doorbell {doorbell} unreachable ({e.strerror or e})", HCCL_E_REMOTE) from None

    def alive(self, doorbell: str) -> bool:
        try:
            self._tx.sendto(b"", "\0" + doorbell)
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._rx.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._rx.close()
        self._tx.close()


class ShmLink:
    """A same-node peer: its arena mapped here (on first read), its doorbell for control messages."""

    zero_copy = True
    writable = True

    def __init__(self, transport: "ShmTransport", peer):
        self._t = transport
        self.peer = peer

    def read(self, comm: str, ptr: int, nbytes: int) -> np.ndarray:
        """A zero-copy view of the peer's HBM (the peer named the range in its own sealed control message;
        the pointer must be one of the peer's device)."""
        return self._view(ptr, nbytes)

    @contextlib.contextmanager
    def holding(self, comm: str, fence: int):
        """Run the block while the peer still accepts this operator's reads and writes of its buffers: under
        the peer segment's shared lock, and only if the peer's fence still holds ``fence``, the value the
        peer published with its buffers ("ready").  An operator the peer gave up, a reset or a close bumps
        the fence and then takes the lock exclusively (:meth:`devices.arena.HbmArena.fence_peers`), so no
        access of a range the peer may have handed back happens after that.  HCCL_E_REMOTE if it did."""
        with self._t.fenced(self.peer) as current:
            if current() != fence:
                raise HcclError(f"rank {self.peer.rank} (device {self.peer.device_id}) gave up the operator: "
                                f"its buffers are no longer read or written", HCCL_E_REMOTE)
            yield

    @contextlib.contextmanager
    def writing(self, comm: str, ptr: int, nbytes: int, fence: int):
        """A writable view of the peer's HBM ``[ptr, ptr + nbytes)`` (a range the peer named for this
        operator in its "ready" -- sealed, and relayed by other ranks of the communicator beyond a few
        ranks; the pointer must be one of the peer's device), valid inside the block only, which runs as
        :meth:`holding` does."""
        view = self._view(ptr, nbytes)
        with self.holding(comm, fence):
            yield view

    def _view(self, ptr: int, nbytes: int) -> np.ndarray:
        try:
            dev = ptr_device(ptr)
        except AclError:
            dev = -1
        if dev != self.peer.device_id:
            raise HcclError(f"0x{ptr:x} is not a pointer of rank {self.peer.rank}'s device {self.peer.device_id}",
                            HCCL_E_PARA)
        mem = self._t.mapped(self.peer)
        off = ptr_offset(ptr)
        if nbytes < 0 or off + nbytes > self.peer.arena_bytes:
            raise HcclError(f"range 0x{ptr:x}+{nbytes} outside rank {self.peer.rank}'s HBM", HCCL_E_PARA)
        return mem[off:off + nbytes]

    def notify(self, msg: tuple) -> None:
        self._t.doorbell.send(self.peer.doorbell, msg)

    def probe(self) -> None:
        if not self._t.doorbell.alive(self.peer.doorbell):
            raise HcclError(f"rank {self.peer.rank} (device {self.peer.device_id}) is gone", HCCL_E_REMOTE)


class ShmTransport:
    """Same-node transport: doorbells + mapped arenas.  ``deliver`` receives this device's messages;
    ``key`` seals them (see the module doc).  The arena must be a named (shared) one."""

    def __init__(self, arena, deliver: Callable[[tuple], bool], key: bytes = PROCESS_LINK_KEY):
        self._arena = arena
        self.doorbell = Doorbell(f"vnpu-hccs-{arena.name}", deliver, key)
        self._maps: dict[str, tuple] = {}
        self._lock = threading.Lock()

    def endpoint(self) -> dict:
        return {"arena": self._arena.name, "arena_bytes": self._arena.size, "doorbell": self.doorbell.name}

    def link(self, peer) -> ShmLink:
        return ShmLink(self, peer)

    def mapped(self, peer) -> np.ndarray:
        """uint8 view of a peer's whole arena, mapped once per peer arena (host-blocking the first time)."""
        return self._mapping(peer)[1]

    def _mapping(self, peer) -> tuple:
        with self._lock:
            m = self._maps.get(peer.arena)
            if m is None:
                try:
                    mm, view = attach(peer.arena, peer.arena_bytes, peer.device_id)
                except FileNotFoundError:
                    raise HcclError(f"rank {peer.rank}'s HBM (device {peer.device_id}) is gone",
                                    HCCL_E_REMOTE) from None
                except (OSError, ValueError) as e:
                    raise HcclError(f"rank {peer.rank}'s HBM: {e}", HCCL_E_PARA) from None
                fence = view[peer.arena_bytes + FENCE_OFFSET:peer.arena_bytes + FENCE_OFFSET + 8].view(np.uint64)
                m = self._maps[peer.arena] = (mm, view, fence)
            return m

    @contextlib.contextmanager
    def fenced(self, peer):
        """Hold the peer segment's shared lock; yields a reader of the peer's fence.  Each hold opens the
        segment anew: a flock belongs to an open file, so holds of concurrent operators (threads of this
        process) are independent -- none waits for another, whatever the order they take peers in."""
        _, _, fence = self._mapping(peer)
        try:
            fd = os.open(os.path.join(SHM_DIR, peer.arena), os.O_RDONLY)
        except FileNotFoundError:
            raise HcclError(f"rank {peer.rank}'s HBM (device {peer.device_id}) is gone", HCCL_E_REMOTE) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield lambda: int(fence[0])
        finally:
            os.close(fd)                     # releases the lock

    def close(self) -> None:
        self.doorbell.close()
        with self._lock:
            maps, self._maps = self._maps, {}
        for mm, _, _ in maps.values():
            try:
                mm.close()
            except BufferError:
                pass          # a view is still alive somewhere; the mapping goes with it


class Transports:
    """One device's transports, one per scope, and the choice of one for each peer.  ``node``: this
    device's node identity (:mod:`devices.node`)."""

    def __init__(self, node: str, transports: dict[str, Transport]):
        self.node = node
        self._by_scope = dict(transports)
        self._lock = threading.Lock()

    def install(self, scope: str, transport: Transport) -> None:
        """Install the transport for peers of ``scope`` (owned from then on: closed with the others); the
        one it replaces is closed."""
        if scope not in (SAME_NODE, CROSS_NODE):
            raise InvalidParamError(f"unknown transport scope {scope!r}")
        with self._lock:
            old, self._by_scope[scope] = self._by_scope.get(scope), transport
        if old is not None and old is not transport:
            old.close()

    def endpoints(self) -> dict:
        """What peers need to reach this device, merged over every transport's :meth:`Transport.endpoint`."""
        out: dict = {}
        for t in list(self._by_scope.values()):
            out.update(t.endpoint())
        return out

    def scope_of(self, p) -> str:
        """Which transport reaches peer ``p`` (a :class:`devices.hccl_comm.PeerInfo`): by node identity.
        Without a same-node transport (this device's arena is not shared, or the peer's is not), peers on
        this node are reached like peers on any other."""
        shm = SAME_NODE in self._by_scope and p.arena and p.doorbell
        return SAME_NODE if shm and same_node(p.node, self.node) else CROSS_NODE

    def link(self, p) -> PeerLink:
        """The link to peer ``p``: made by the transport of its scope (HCCL_E_NOT_SUPPORT without one)."""
        t = self._by_scope.get(self.scope_of(p))
        if t is None:
            raise HcclError(f"rank {p.rank} (device {p.device_id}) is on another node ({p.node or '?'}) and this "
                            f"device has no cross-node transport (device actors have one)", HCCL_E_NOT_SUPPORT)
        return t.link(p)

    def close(self) -> None:
        with self._lock:
            transports, self._by_scope = list(self._by_scope.values()), {}
        for t in transports:
            t.close()


__all__ = ["SAME_NODE", "CROSS_NODE", "PROCESS_LINK_KEY", "PeerLink", "Transport", "Doorbell", "ShmLink",
           "ShmTransport", "Transports", "link_key"]
