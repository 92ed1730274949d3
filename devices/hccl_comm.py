"""HCCL communicators of one device: what a rank holds for each (its peers and the links to them, its place
in the operator order, its state) and the table of a device's communicators.

Communicator ids are scoped by tenant (:func:`scoped_comm_id`): the id a client passes names a
communicator of *its* tenant only, so knowing another tenant's id reaches nothing of theirs; engines
exchange the scoped id.  Operators are numbered per communicator (collectives) and per pair of ranks
(Send/Recv): :meth:`Communicators.next_seq`.  One lock (:attr:`Communicators.lock`) guards the table and
every communicator's counters, buffers and exposed ranges.  Nothing here moves data or sends a message
(:mod:`devices.hccl_control` does).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from .errors import HCCL_E_NOT_FOUND, HCCL_E_PARA, HcclError
from .tenancy import tenant_of

DEFAULT_EXEC_TIMEOUT_S = float(os.environ.get("HCCL_EXEC_TIMEOUT", 1836))
DEFAULT_CONNECT_TIMEOUT_S = float(os.environ.get("HCCL_CONNECT_TIMEOUT", 120))
#: barriers of communicators up to this size send one message to every peer; larger ones disseminate
DIRECT_BARRIER_MAX = 4


def scoped_comm_id(cid: str, owner) -> str:
    """The engine's id of communicator ``cid`` of ``owner``'s tenant (``cid`` itself when unchecked)."""
    tenant = tenant_of(owner)
    return cid if tenant is None else f"{len(tenant)}:{tenant}:{cid}"


@dataclass(frozen=True)
class PeerInfo:
    rank: int
    device_id: int
    arena: str
    arena_bytes: int
    doorbell: str
    node: str = ""
    address: str = ""        #: the peer device's gRPC endpoint (cross-node transport)

    @classmethod
    def of(cls, rank: int, info: dict) -> "PeerInfo":
        """From a device's ``HcclEngine.info()`` (HCCL_E_PARA when it lacks what a peer needs)."""
        try:
            return cls(rank, int(info["device_id"]), str(info["arena"]), int(info["arena_bytes"]),
                       str(info["doorbell"]), str(info.get("node", "")), str(info.get("address", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise HcclError(f"bad peer info for rank {rank}: {e!r}", HCCL_E_PARA) from None


@dataclass(frozen=True)
class CommConfig:
    exec_timeout_s: float = DEFAULT_EXEC_TIMEOUT_S
    algo: str | None = None          #: HCCL_ALGO-style override: ring | H-D_R | mesh
    segment_bytes: int = 4 << 20     #: pulls larger than this are done in segments
    direct_barrier_max: int = DIRECT_BARRIER_MAX    #: barriers above this many ranks disseminate

    @classmethod
    def of(cls, config: dict | None) -> "CommConfig":
        """From a client's config dict (HCCL_E_PARA for a key it does not know)."""
        try:
            return cls(**(config or {}))
        except TypeError as e:
            raise HcclError(f"bad communicator config: {e}", HCCL_E_PARA) from None


@dataclass
class Comm:
    cid: str
    rank: int
    peers: list[PeerInfo]
    config: CommConfig
    links: list = field(default_factory=list)   #: one PeerLink per rank (None for this rank)
    scopes: list = field(default_factory=list)  #: the transport scope of each link (None for this rank)
    seq: int = 0
    p2p_seq: dict = field(default_factory=dict)
    async_error: int = 0
    ccl: list = field(default_factory=list)     #: two persistent work buffers, used alternately
    ccl_last: int = 1                           #: which one the last operator completed here used
    ccl_bytes: int = 0
    ccl_epoch: int = 0                          #: the arena epoch they were allocated in
    busy: int = 0                               #: operators running (a destroyed comm frees its
    closed: bool = False                        #: buffers once the last one is done)
    cancelled: bool = False                     #: reset / owner released: running operators give up
    owner: object = None                        #: the client that created it (devices.tenancy)
    exposed: dict = field(default_factory=dict)  #: running operator -> [(offset, nbytes)] peers may read

    @property
    def size(self) -> int:
        return len(self.peers)


def check_comm_id(cid) -> None:
    """A client's communicator id: a random string of >= 16 characters (HCCL_E_PARA otherwise)."""
    if not isinstance(cid, str) or len(cid) < 16:
        raise HcclError("communicator id must be a random string of >= 16 characters", HCCL_E_PARA)


class Communicators:
    """The communicators of one device by scoped id, and the ids being joined (a peer may start an
    operator before this rank has created the communicator: its messages are kept meanwhile).
    Nothing here blocks but on :attr:`lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id: dict[str, Comm] = {}
        self._joining: set[str] = set()

    def known(self, cid: str) -> bool:
        return cid in self.by_id or cid in self._joining

    def joining(self, key: str, pending: bool = True) -> None:
        """Communicator ``key`` is being joined (``pending``), or no longer (the rendezvous failed)."""
        with self.lock:
            if pending:
                self._joining.add(key)
            else:
                self._joining.discard(key)

    def add(self, c: Comm) -> Comm | None:
        """Install ``c`` under its id; returns the communicator it replaced (to retire), if any."""
        with self.lock:
            old = self.by_id.get(c.cid)
            self.by_id[c.cid] = c
            self._joining.discard(c.cid)
        return old

    def find(self, cid, owner) -> Comm | None:
        return self.by_id.get(scoped_comm_id(cid, owner)) if isinstance(cid, str) else None

    def get(self, cid, owner) -> Comm:
        """Communicator ``cid`` of ``owner``'s tenant (HCCL_E_PARA when there is none)."""
        c = self.find(cid, owner)
        if c is None:
            raise HcclError(f"unknown communicator {str(cid)[:8]}...", HCCL_E_PARA)
        return c

    def async_error(self, cid, owner) -> int:
        c = self.find(cid, owner)
        if c is None:
            raise HcclError(f"unknown communicator {cid!r}"[:200], HCCL_E_NOT_FOUND)
        return c.async_error

    def remove(self, cid, owner) -> Comm | None:
        with self.lock:
            return self.by_id.pop(scoped_comm_id(cid, owner), None) if isinstance(cid, str) else None

    def close(self, c: Comm) -> bool:
        """Mark ``c`` closed; whether no operator of it runs (its buffers can go now)."""
        with self.lock:
            c.closed = True
            return c.busy == 0

    def of_owner(self, owner, remove: bool) -> list[Comm]:
        """``owner``'s communicators, cancelled (running operators give up) and, with ``remove``, out of
        the table (the caller retires them)."""
        with self.lock:
            mine = [c for c in self.by_id.values() if c.owner == owner]
            for c in mine:
                c.cancelled = True
                if remove:
                    self.by_id.pop(c.cid, None)
        return mine

    def clear(self) -> None:
        """Device reset: every communicator is gone at once, cancelled and closed; its work buffers and
        exposed ranges are forgotten (the arena reset drops the memory with everything else)."""
        with self.lock:
            comms, self.by_id = list(self.by_id.values()), {}
            self._joining.clear()
            for c in comms:
                c.cancelled = c.closed = True
                c.ccl, c.ccl_bytes = [], 0
                c.exposed.clear()

    def begin(self, cid, owner) -> Comm:
        """An operator of communicator ``cid`` starts running (HCCL_E_PARA when there is none)."""
        with self.lock:
            c = self.get(cid, owner)
            c.busy += 1
        return c

    def end(self, c: Comm) -> bool:
        """An operator of ``c`` ended; whether ``c`` is closed and idle now (its buffers can go)."""
        with self.lock:
            c.busy -= 1
            return c.closed and c.busy == 0

    def next_seq(self, c: Comm, op: str, peer: int) -> tuple:
        """``(seq, ranks)``: the place of this rank's next operator ``op`` (``peer``: Send/Recv's) in
        communicator ``c``'s order (collectives count on ``c.seq``, Send/Recv per pair of ranks) and the
        ranks that take part.  Every operator issued on a rank takes its place, whether it runs or not:
        ranks that skipped different operators must not end up counting differently."""
        with self.lock:
            if op in ("send", "recv"):
                pair = tuple(sorted((c.rank, peer)))
                c.p2p_seq[pair] = c.p2p_seq.get(pair, 0) + 1
                return f"p{pair[0]}-{pair[1]}-{c.p2p_seq[pair]}", pair
            c.seq += 1
            return c.seq, range(c.size)


__all__ = ["DEFAULT_EXEC_TIMEOUT_S", "DEFAULT_CONNECT_TIMEOUT_S", "DIRECT_BARRIER_MAX", "scoped_comm_id",
           "check_comm_id", "PeerInfo", "CommConfig", "Comm", "Communicators"]
