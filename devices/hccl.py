"""The device side of HCCL: communicators and the executor that runs a collective's schedule
(:mod:`devices.hccl_schedule`) as one stream task on this device.

Peers are reached through transports (:mod:`devices.hccl_transport`), one link per peer chosen when the
communicator is built: shared memory on one node (a rank *pulls* ranges straight out of a peer's HBM arena,
mapped from ``/dev/shm``, and rings its doorbell; the large AllReduce of a communicator on one node also
*pushes* its reduced chunk into the peers' receive buffers, at the pointers they named for the operator),
gRPC between device actors across nodes (pull only).  Either way the
data moves device to device, never through the user's process.  Control messages are small tuples
``(comm, seq, tag, from_rank, payload)``; the communicator id is a 128-bit random capability known only to
its members, and messages for unknown communicators are dropped.

A collective runs on a core thread and blocks it while it waits for peers, always with a deadline
(``exec_timeout_s``, HCCL_EXEC_TIMEOUT-style); it only orders the device for the host that enqueued it.
While waiting it probes the peers it waits for: a peer that is gone (its process died or its device
closed) fails the collective at once with HCCL_E_REMOTE instead of waiting for the timeout; a link that is
down (fault ``link-down``) fails it with HCCL_E_NETWORK.  An operator this rank does not run at all (its
stream skips it after an earlier failure: :meth:`HcclEngine.skip`) still takes its place in the
communicator's order and fails its peers at once with HCCL_E_REMOTE.

Tenancy (:mod:`devices.tenancy`): a communicator belongs to the client that created it and is released
with that client's lease (:meth:`HcclEngine.drop_owner`).  Communicator ids are scoped by tenant
(:func:`scoped_comm_id`): the id a client passes names a communicator of *its* tenant only, so knowing
another tenant's id (a rank table's id is derived from the table) reaches nothing of theirs; engines
exchange the scoped id.  A peer's read (the cross-node transport's ``HcclRead``,
:meth:`HcclEngine.read_for_peer`) is served only for ranges this rank exposes: the buffers of an operator
of that communicator while it runs (from before its "ready" message until its last barrier) and the
communicator's own work buffers -- never any other memory, and not after the operator ended.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .arena import ptr_device, ptr_offset
from .errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_NO_PERMISSION, ACL_ERROR_RT_PARAM_INVALID, HCCL_E_NETWORK,
                     HCCL_E_NOT_FOUND, HCCL_E_NOT_SUPPORT, HCCL_E_PARA, HCCL_E_REMOTE, HCCL_E_RUNTIME,
                     HCCL_E_TIMEOUT, AclError, HcclError, InvalidParamError)
from .hccl_transport import CROSS_NODE, PROCESS_LINK_KEY, SAME_NODE, ShmTransport
from .hccl_schedule import choose_algo, epilogue, prologue, schedule
from .node import same_node
from .tenancy import tenant_of

#: HcclDataType (hccl_types.h) -> numpy dtype name ("bfloat16" is carried as uint16 bit patterns)
HCCL_DTYPES = {0: "int8", 1: "int16", 2: "int32", 3: "float16", 4: "float32", 5: "int64", 6: "uint64",
               7: "uint8", 8: "uint16", 9: "uint32", 10: "float64", 11: "bfloat16"}
HCCL_DTYPE_IDS = {v: k for k, v in HCCL_DTYPES.items()}
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min"}
_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
_ITEM = {"bfloat16": 2}
DEFAULT_EXEC_TIMEOUT_S = float(os.environ.get("HCCL_EXEC_TIMEOUT", 1836))
DEFAULT_CONNECT_TIMEOUT_S = float(os.environ.get("HCCL_CONNECT_TIMEOUT", 120))
_PROBE_S = 0.05
#: what ranks compare at "ready" (one operator on every rank)
SIG_FIELDS = ("op", "count", "dtype", "redop", "root", "algorithm", "push (every peer's memory writable)")
#: how long a rank that gave up an operator waits for peers' writes in progress (one segment's copy each)
FENCE_TIMEOUT_S = 5.0
#: work buffers up to this size are kept per communicator (HCCL's CCL buffer) instead of allocated per
#: operator: a free bumps the arena generation, which would invalidate every cached launch plan,
#: captured graph binding and client range check of the device after each small collective
CCL_CACHE_MAX = 4 << 20
_CCL_MIN = 64 << 10
#: segment of a pull through a zero-copy link (shared memory): the reductions of one chunk run segment by
#: segment, so the partial sum stays in the core's L2 cache while every peer's segment is added to it
CACHE_SEGMENT_BYTES = 256 << 10
#: barriers of communicators up to this size send one message to every peer; larger ones disseminate
DIRECT_BARRIER_MAX = 4


#: owner of the engine's own buffers (no tenant can name them); their bytes count against the comm's owner
HCCL_OWNER = "hccl"


def itemsize(dtype: str) -> int:
    return _ITEM.get(dtype) or np.dtype(dtype).itemsize


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


@dataclass(frozen=True)
class CollectiveOp:
    """What the runtime asks for (see devices.tasks.Collective)."""
    comm: str
    op: str
    send: int
    recv: int
    count: int
    dtype: str
    redop: str = "sum"
    root: int = 0
    peer: int = -1


#: control-message tag of an operator that a rank had to give up (payload: [HcclResult, reason])
ABORT_TAG = "abort"
#: the ``seq`` of an abort that covers every operator of the communicator: a rank saw a peer gone, so no
#: later operator can complete either (the others stop waiting for ranks that gave up)
COMM_SEQ = "*"


class Mailbox:
    """Received control messages (from every transport), waited on by key ``(comm, seq, tag, from)``.
    An ``abort`` message for ``(comm, seq)`` fails every wait of that operator with its code; one for
    ``(comm, COMM_SEQ)`` every wait on the communicator (until it is destroyed)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._msgs: dict[tuple, object] = {}
        self._aborts: dict[tuple, tuple[int, str]] = {}
        self._waiting = 0                      # threads in wait_pending (waiters())

    def put(self, key: tuple, payload) -> None:
        with self._cv:
            if key[2] == ABORT_TAG:
                try:
                    code, reason = int(payload[0]), str(payload[1])
                except (TypeError, ValueError, IndexError):
                    return                     # malformed: drop
                self._aborts[key[:2]] = (code, f"rank {key[3]}: {reason}")
            else:
                self._msgs[key] = payload
            self._cv.notify_all()

    def take(self, keys: list[tuple], deadline: float, probe, cancelled) -> list:
        """Wait for every key (all of one operator); ``probe(missing)`` runs every few ms while waiting and
        may raise.  Host-blocking (a core thread) up to ``deadline``."""
        out = {}
        with self._cv:
            while True:
                for k in keys:
                    if k not in out and k in self._msgs:
                        out[k] = self._msgs.pop(k)
                if len(out) == len(keys):
                    return [out[k] for k in keys]
                abort = self._aborts.get(keys[0][:2]) or self._aborts.get((keys[0][0], COMM_SEQ))
                if abort is not None:
                    err = HcclError(abort[1], abort[0])
                    err.peers_told = True          # a peer gave up: it told the others itself
                    raise err
                now = time.monotonic()
                if now >= deadline:
                    missing = [k for k in keys if k not in out]
                    raise HcclError(f"timed out waiting for {missing[:3]}", HCCL_E_TIMEOUT)
                if cancelled():
                    raise HcclError("device aborted while waiting for peers", HCCL_E_REMOTE)
                self._cv.wait(min(_PROBE_S, deadline - now))
                self._cv.release()
                try:
                    probe([k for k in keys if k not in out])
                finally:
                    self._cv.acquire()

    def __len__(self) -> int:
        return len(self._msgs)

    def pending(self, comm: str | None = None) -> list[tuple]:
        """Keys ``(comm, seq, tag, from)`` of the messages received and not taken yet (of communicator
        ``comm`` when given): a snapshot, for inspection -- nothing is taken.  Does not block."""
        with self._cv:
            return [k for k in self._msgs if comm is None or k[0] == comm]

    def wait_pending(self, n: int, timeout_s: float, comm: str | None = None) -> bool:
        """Block the host until at least ``n`` messages (of ``comm`` when given) are pending, or
        ``timeout_s`` passed; whether they are.  Nothing is taken (a test's gate: "the peers have spoken")."""
        with self._cv:
            self._waiting += 1
            self._cv.notify_all()                  # wait_waiters
            try:
                return self._cv.wait_for(lambda: sum(1 for k in self._msgs if comm is None or k[0] == comm) >= n,
                                         timeout=timeout_s)
            finally:
                self._waiting -= 1

    def waiters(self) -> int:
        """How many threads are in :meth:`wait_pending` now.  Does not block."""
        with self._cv:
            return self._waiting

    def wait_waiters(self, n: int, timeout_s: float) -> bool:
        """Block the host until at least ``n`` threads wait in :meth:`wait_pending` (a test's gate: "the
        waiter waits"; a message put from then on is what wakes it), or ``timeout_s`` passed; whether they do."""
        with self._cv:
            return self._cv.wait_for(lambda: self._waiting >= n, timeout=timeout_s)

    def drop_comm(self, cid: str) -> None:
        with self._cv:
            for k in [k for k in self._msgs if k[0] == cid]:
                del self._msgs[k]
            for k in [k for k in self._aborts if k[0] == cid]:
                del self._aborts[k]

    def clear(self) -> None:
        with self._cv:
            self._msgs.clear()
            self._aborts.clear()
            self._cv.notify_all()


class HcclEngine:
    """Communicators of one device and the collective executor.

    Peers are reached through :class:`~devices.hccl_transport.PeerLink` objects, one per peer, built when a
    communicator is built by the transport of the peer's scope (same node / cross node).  The same-node
    transport is built in; a device host installs a cross-node one with :meth:`set_transport`.  The
    device's fault state is read for ``link-down``: an operator that needs a peer whose link is down fails
    with HCCL_E_NETWORK, and tells the operator's other ranks so (the far end of a broken link notices the
    loss of carrier too), which fail with HCCL_E_NETWORK as well."""

    def __init__(self, device):
        self.device = device
        self.arena = device.arena
        self.faults = device.faults
        self.node = device.node
        self.mailbox = Mailbox()
        self.comms: dict[str, Comm] = {}
        self._pending_joins: set[str] = set()
        self._lock = threading.Lock()
        self._outbox: list[tuple[list, tuple]] = []     #: aborts to send: (links, message), in order
        self._sending = False                           #: a thread sends the outbox now
        self.aborted = False
        self.stats = {"collectives": 0, "bytes_pulled": 0, "bytes_pushed": 0, "messages": 0, "aborts_sent": 0,
                      f"bytes_{SAME_NODE}": 0, f"bytes_{CROSS_NODE}": 0}
        key = getattr(device.config, "link_key", b"") or PROCESS_LINK_KEY
        # same-node peers pull through mapped arenas -- only when this device's arena is a named segment
        self._transports: dict[str, object] = ({SAME_NODE: ShmTransport(self.arena, self.deliver, key)}
                                               if self.arena.shared else {})

    def set_transport(self, scope: str, transport) -> None:
        """Install the transport for peers of ``scope`` (:data:`CROSS_NODE`: set by the device host).  The
        engine owns it from then on (closes it with the device)."""
        if scope not in (SAME_NODE, CROSS_NODE):
            raise InvalidParamError(f"unknown transport scope {scope!r}")
        with self._lock:
            old, self._transports[scope] = self._transports.get(scope), transport
        if old is not None and old is not transport:
            old.close()

    def _known(self, cid: str, tag: str) -> bool:
        """Keep messages of known communicators, and a bounded number for ones not created here yet
        (a peer may start an operator before this rank has created the communicator)."""
        return cid in self.comms or cid in self._pending_joins or len(self.mailbox) < 65536

    # ---------------------------------------------------------------- communicators
    def info(self) -> dict:
        """What peers need to reach this device: its id and node, and every transport's endpoint."""
        out = {"device_id": self.device.id, "node": self.node, "address": "", "arena": "",
               "arena_bytes": self.arena.size, "doorbell": ""}
        for t in list(self._transports.values()):
            out.update(t.endpoint())
        out["stats"] = dict(self.stats)        # what went where (peers ignore it)
        return out

    def deliver(self, msg) -> bool:
        """A control message that arrived over a transport (any of them).  False when dropped."""
        try:
            cid, seq, tag, frm, payload = msg
            key = (cid, seq, tag, frm)
            hash(key)
        except (TypeError, ValueError):
            return False
        if not isinstance(cid, str) or not self._known(cid, tag):
            return False
        self.mailbox.put(key, payload)
        return True

    def read_for_peer(self, cid: str, ptr: int, nbytes: int) -> np.ndarray:
        """A peer on another node reads my HBM (``cid``: the engine's scoped id, as peers exchange it):
        served only for a range this rank exposes in communicator ``cid`` -- a buffer of one of its
        operators while that runs, or one of the communicator's work buffers (ACL_ERROR_RT_NO_PERMISSION
        otherwise) -- and only inside live allocations."""
        c = self.comms.get(cid) if isinstance(cid, str) else None
        if c is None:
            raise HcclError("unknown communicator", HCCL_E_PARA)
        if not isinstance(nbytes, int) or nbytes < 0 or ptr_device(ptr) != self.device.id:
            raise InvalidParamError(f"bad peer read of {nbytes!r} B at {ptr!r}"[:200])
        off = ptr_offset(ptr)
        with self._lock:
            ranges = [r for rs in c.exposed.values() for r in rs]
            ranges += [(ptr_offset(p), c.ccl_bytes) for p in c.ccl]
        if not any(s <= off and off + nbytes <= s + n for s, n in ranges):
            raise AclError(f"0x{ptr:x}+{nbytes} is not exposed by a running operator of this communicator",
                           code=ACL_ERROR_RT_NO_PERMISSION)
        return self.arena.view(ptr, nbytes)

    def _expose(self, c: Comm, ranges) -> object:
        """Let peers read ``[(ptr, nbytes)]`` of this rank until :meth:`_unexpose` (one operator's buffers)."""
        token = object()
        with self._lock:
            c.exposed[token] = [(ptr_offset(p), n) for p, n in ranges if p and n > 0]
        return token

    def _unexpose(self, c: Comm, token) -> None:
        with self._lock:
            c.exposed.pop(token, None)

    def scope_of(self, p: PeerInfo) -> str:
        """Which transport reaches peer ``p``: by node identity (:mod:`devices.node`).  Without a same-node
        transport (this device's arena is not shared, or the peer's is not), peers on this node are reached
        like peers on any other."""
        shm = SAME_NODE in self._transports and p.arena and p.doorbell
        return SAME_NODE if shm and same_node(p.node, self.node) else CROSS_NODE

    def _link(self, p: PeerInfo):
        """The link to peer ``p``: made by the transport of its scope (HCCL_E_NOT_SUPPORT without one)."""
        t = self._transports.get(self.scope_of(p))
        if t is None:
            raise HcclError(f"rank {p.rank} (device {p.device_id}) is on another node ({p.node or '?'}) and this "
                            f"device has no cross-node transport (device actors have one)", HCCL_E_NOT_SUPPORT)
        return t.link(p)

    def comm_init(self, cid: str, rank: int, peers: list[dict], config: dict | None = None, owner=None) -> None:
        """Create this rank of communicator ``cid`` of ``owner``'s tenant (an existing one of that id is
        replaced)."""
        if not isinstance(cid, str) or len(cid) < 16:
            raise HcclError("communicator id must be a random string of >= 16 characters", HCCL_E_PARA)
        self._init(scoped_comm_id(cid, owner), rank, peers, config, owner)

    def _init(self, key: str, rank: int, peers: list[dict], config: dict | None, owner) -> None:
        if not isinstance(peers, list):
            raise HcclError("peers must be a list of peer infos", HCCL_E_PARA)
        infos = [PeerInfo.of(i, p) for i, p in enumerate(peers)]
        if not isinstance(rank, int) or not 0 <= rank < len(infos) or infos[rank].device_id != self.device.id:
            raise HcclError(f"rank {rank} is not this device ({self.device.id})", HCCL_E_PARA)
        links = [None if p.rank == rank else self._link(p) for p in infos]
        scopes = [None if p.rank == rank else self.scope_of(p) for p in infos]
        try:
            cfg = CommConfig(**(config or {}))
        except TypeError as e:
            raise HcclError(f"bad communicator config: {e}", HCCL_E_PARA) from None
        with self._lock:
            old = self.comms.get(key)
            self.comms[key] = Comm(key, rank, infos, cfg, links, scopes, owner=owner)
            self._pending_joins.discard(key)
        if old is not None:
            self._retire(old)

    def comm_join(self, cid: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                  timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, owner=None) -> list[dict]:
        """Root-info rendezvous: every rank sends its info to the root device; the root answers everyone
        with the table.  Host-blocking, with ``timeout_s``."""
        if not isinstance(cid, str) or len(cid) < 16:
            raise HcclError("communicator id must be a random string of >= 16 characters", HCCL_E_PARA)
        if not isinstance(root, dict):
            raise HcclError("root info must be a peer info", HCCL_E_PARA)
        key = scoped_comm_id(cid, owner)
        with self._lock:
            self._pending_joins.add(key)
        deadline = time.monotonic() + timeout_s
        me = self.info()
        try:
            if rank == 0:
                if root.get("device_id") != self.device.id or root.get("arena") != me["arena"]:
                    raise HcclError("rank 0 must run on the root device", HCCL_E_PARA)
                keys = [(key, 0, "join", r) for r in range(1, nranks)]
                joins = self.mailbox.take(keys, deadline, lambda missing: None, lambda: self.aborted)
                table = [me] + joins
                for r, info in enumerate(table[1:], start=1):
                    self._link(PeerInfo.of(r, info)).notify((key, 0, "table", 0, table))
            else:
                self._link(PeerInfo.of(0, root)).notify((key, 0, "join", rank, me))
                (table,) = self.mailbox.take([(key, 0, "table", 0)], deadline, lambda m: None,
                                             lambda: self.aborted)
        except HcclError:
            with self._lock:
                self._pending_joins.discard(key)
            raise
        self._init(key, rank, table, config, owner)
        return table

    def comm_destroy(self, cid: str, owner=None) -> None:
        """Destroy communicator ``cid`` of ``owner``'s tenant (its work buffers go once its running
        operators are done; nothing happens for an id the tenant does not hold)."""
        with self._lock:
            c = self.comms.pop(scoped_comm_id(cid, owner), None) if isinstance(cid, str) else None
        if c is not None:
            self._retire(c)

    def _retire(self, c: Comm) -> None:
        with self._lock:
            c.closed = True
            idle = c.busy == 0
        self.mailbox.drop_comm(c.cid)
        if idle:
            self._free_ccl(c)

    def drop_owner(self, owner, cancel_only: bool = False) -> int:
        """A client left: its communicators' running operators give up at once (``cancel_only``), or its
        communicators are destroyed.  Returns how many it held."""
        with self._lock:
            mine = [c for c in self.comms.values() if c.owner == owner]
            for c in mine:
                c.cancelled = True
            if not cancel_only:
                for c in mine:
                    self.comms.pop(c.cid, None)
        if not cancel_only:
            for c in mine:
                self._retire(c)
        return len(mine)

    def reset(self) -> None:
        """Device reset: every communicator is gone at once; running operators give up (their waits end
        within a probe period) and nothing they free afterwards touches the arena's next epoch."""
        with self._lock:
            comms, self.comms = list(self.comms.values()), {}
            self._pending_joins.clear()
            for c in comms:
                c.cancelled = c.closed = True
                c.ccl, c.ccl_bytes = [], 0             # the arena reset drops them with everything else
                c.exposed.clear()
        self.mailbox.clear()

    def _free_ccl(self, c: Comm) -> None:
        bufs, c.ccl, c.ccl_bytes = c.ccl, [], 0
        for ptr in bufs:
            self.arena.free(ptr, epoch=c.ccl_epoch)

    def _alloc(self, c: Comm, nbytes: int) -> int:
        """An engine buffer for communicator ``c``: nobody else can name it; its bytes count against the
        quota of the client that owns ``c``."""
        quota = self.device.config.quota.limit("hbm_bytes", c.owner)
        return self.arena.malloc(nbytes, owner=HCCL_OWNER, quota=quota, charge=c.owner)

    def _work_buffer(self, c: Comm, nbytes: int) -> tuple[int, bool]:
        """(pointer, persistent): this operator's work buffer; small ones are the communicator's CCL
        buffers, used alternately: not the one of the last operator completed here (a peer may still read
        it, oneshot has no closing barrier), but the one before, which every peer finished reading before
        it could join that last operator's "ready" round.  Alternated by operators completed, not by
        sequence number: an operator that failed or was skipped (:meth:`skip`) had no such round."""
        if nbytes > CCL_CACHE_MAX:
            return self._alloc(c, nbytes), False
        if c.ccl_bytes < nbytes:
            self._free_ccl(c)
            size = _CCL_MIN
            while size < nbytes:
                size *= 2
            c.ccl_epoch = self.arena.epoch
            c.ccl = [self._alloc(c, size) for _ in range(2)]
            c.ccl_bytes = size
        return c.ccl[1 - c.ccl_last], True

    def async_error(self, cid: str, owner=None) -> int:
        c = self.comms.get(scoped_comm_id(cid, owner)) if isinstance(cid, str) else None
        if c is None:
            raise HcclError(f"unknown communicator {cid!r}"[:200], HCCL_E_NOT_FOUND)
        return c.async_error

    def _comm(self, cid: str, owner=None) -> Comm:
        c = self.comms.get(scoped_comm_id(cid, owner)) if isinstance(cid, str) else None
        if c is None:
            raise HcclError(f"unknown communicator {str(cid)[:8]}...", HCCL_E_PARA)
        return c

    # ---------------------------------------------------------------- validation at enqueue
    def check(self, op: CollectiveOp, owner=None) -> None:
        c = self._comm(op.comm, owner)
        if op.dtype not in HCCL_DTYPE_IDS:
            raise HcclError(f"unsupported data type {op.dtype!r}", HCCL_E_NOT_SUPPORT)
        if op.redop not in _UFUNC:
            raise HcclError(f"unsupported reduce op {op.redop!r}", HCCL_E_PARA)
        if not isinstance(op.count, int) or op.count < 0:
            raise HcclError(f"bad count {op.count!r}", HCCL_E_PARA)
        if op.op in ("broadcast", "reduce") and not 0 <= op.root < c.size:
            raise HcclError(f"root {op.root} outside [0, {c.size})", HCCL_E_PARA)
        if op.op in ("send", "recv") and not (0 <= op.peer < c.size and op.peer != c.rank):
            raise HcclError(f"peer {op.peer} invalid for rank {c.rank} of {c.size}", HCCL_E_PARA)
        send_n, recv_n = self.buffer_counts(op, c.size, c.rank)
        isz = itemsize(op.dtype)
        for ptr, n in ((op.send, send_n), (op.recv, recv_n)):
            if n:
                if ptr % isz:
                    raise HcclError(f"buffer 0x{ptr:x} not aligned to {isz} B", HCCL_E_PARA)
                self.arena.resolve(ptr, n * isz, owner)

    @staticmethod
    def buffer_counts(op: CollectiveOp, n: int, r: int) -> tuple[int, int]:
        """Elements of the send and recv buffers this rank touches."""
        k = op.count
        return {
            "allreduce": (k, k), "allgather": (k, k * n), "reducescatter": (k * n, k),
            "broadcast": (0, k), "reduce": (k, k if r == op.root else 0), "alltoall": (k * n, k * n),
            "send": (k, 0), "recv": (0, k), "barrier": (0, 0),
        }[op.op]

    def modeled_seconds(self, op: CollectiveOp, owner=None) -> float:
        c = self._comm(op.comm, owner)
        n = c.size
        nbytes = op.count * itemsize(op.dtype)
        algo = choose_algo(op.op, n, nbytes * (n if op.op == "allgather" else 1), c.config.algo) \
            if op.op not in ("send", "recv", "barrier") else "mesh"
        return self.device.cost.collective(op.op, algo, n, nbytes)

    # ---------------------------------------------------------------- execution (on a core thread)
    def _next_seq(self, c: Comm, op: CollectiveOp) -> tuple:
        """``(seq, ranks)``: the place of this rank's next operator ``op`` in communicator ``c``'s order
        (collectives count on ``c.seq``, Send/Recv per pair of ranks) and the ranks that take part.  Every
        operator issued on a rank takes its place, whether it runs (:meth:`run`) or not (:meth:`skip`):
        ranks that skipped different operators must not end up counting differently."""
        with self._lock:
            if op.op in ("send", "recv"):
                pair = tuple(sorted((c.rank, op.peer)))
                c.p2p_seq[pair] = c.p2p_seq.get(pair, 0) + 1
                return f"p{pair[0]}-{pair[1]}-{c.p2p_seq[pair]}", pair
            c.seq += 1
            return c.seq, range(c.size)

    def skip(self, op: CollectiveOp, err: AclError, owner=None) -> None:
        """Operator ``op`` of this rank will not run (its stream skips it after an earlier failure, or an
        injected failure takes its place): it still takes its place in the communicator's order, and its
        peers are told at once (HCCL_E_REMOTE) instead of waiting for this rank until their exec timeout --
        so that the operator after it, once the host has seen the error, pairs with the peers' again.
        Does not block (the messages go from another thread); a communicator gone meanwhile is ignored."""
        c = self.comms.get(scoped_comm_id(op.comm, owner)) if isinstance(op.comm, str) else None
        if c is None or c.cancelled:
            return
        seq, ranks = self._next_seq(c, op)
        self._abort_peers(c, seq, [q for q in ranks if q != c.rank], HCCL_E_REMOTE,
                          f"did not run its {op.op} (operator {seq}): an earlier task of its stream failed "
                          f"({err})"[:300])

    def run(self, op: CollectiveOp, owner=None) -> None:
        with self._lock:
            c = self._comm(op.comm, owner)
            c.busy += 1
        try:
            if op.op in ("send", "recv"):
                self._p2p(c, op)
            else:
                self._collective(c, op, owner)
            self.stats["collectives"] += 1
        except HcclError as e:
            c.async_error = e.hccl_code
            raise
        except AclError as e:
            c.async_error = HCCL_E_PARA if e.code in (ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_INVALID_PARAM) \
                else HCCL_E_RUNTIME
            raise
        finally:
            with self._lock:
                c.busy -= 1
                free = c.closed and c.busy == 0
            if free:
                self._free_ccl(c)

    def _deadline(self, c: Comm) -> float:
        return time.monotonic() + c.config.exec_timeout_s

    def _check_link(self, c: Comm, peer: int, seq, ranks) -> None:
        """Fault ``link-down``: the link to ``peer``'s device is down.  The other ranks of the operator
        (``ranks``) are told, best effort, then it fails with HCCL_E_NETWORK."""
        p = c.peers[peer]
        if not self.faults.link_down(p.device_id):
            return
        reason = f"link from device {self.device.id} to device {p.device_id} (rank {peer}) is down"
        for q in ranks:
            if q != c.rank:
                try:
                    c.links[q].notify((c.cid, seq, ABORT_TAG, c.rank, [HCCL_E_NETWORK, reason]))
                except HcclError:
                    pass
        err = HcclError(reason, HCCL_E_NETWORK)
        err.peers_told = True
        raise err

    def _post(self, c: Comm, peer: int, seq, tag: str, payload=None, ranks=None) -> None:
        self._check_link(c, peer, seq, range(c.size) if ranks is None else ranks)
        try:
            c.links[peer].notify((c.cid, seq, tag, c.rank, payload))
        except HcclError as e:
            self._peer_gone(c, peer, e)
        self.stats["messages"] += 1

    def _peer_gone(self, c: Comm, peer: int, e: HcclError) -> None:
        """Rank ``peer`` is unreachable (HCCL_E_REMOTE): tell the other ranks, best effort, that this
        communicator cannot complete any operator -- a rank that gives up must not leave the others
        waiting for it until their exec timeout -- then raise ``e``."""
        if e.hccl_code == HCCL_E_REMOTE:
            with self._lock:
                self.stats["aborts_sent"] += 1
            for q in range(c.size):
                if q not in (c.rank, peer):
                    try:
                        c.links[q].notify((c.cid, COMM_SEQ, ABORT_TAG, c.rank, [HCCL_E_REMOTE, str(e)]))
                    except HcclError:
                        pass
            e.peers_told = True                # the comm-wide abort covers this operator too
        raise e

    def _wait(self, c: Comm, waits: list[tuple[int, str]], seq, deadline: float, ranks=None) -> list:
        keys = [(c.cid, seq, tag, peer) for peer, tag in waits]
        ranks = range(c.size) if ranks is None else ranks

        def probe(missing):
            for (_, _, _, peer) in missing:
                self._check_link(c, peer, seq, ranks)
                try:
                    c.links[peer].probe()
                except HcclError as e:
                    self._peer_gone(c, peer, e)
        return self.mailbox.take(keys, deadline, probe, lambda: self.aborted or c.cancelled)

    def _barrier(self, c: Comm, seq, tag: str, deadline: float, payload=None) -> list:
        """Every rank reaches this point before any leaves it; returns every other rank's ``payload`` (in
        rank order).  Up to ``direct_barrier_max`` ranks: one message to every peer (one round); more:
        a dissemination barrier -- ceil(log2 n) rounds, in round k a message to rank r + 2^k carrying every
        payload heard so far -- n log n messages instead of n (n - 1)."""
        n, r = c.size, c.rank
        others = [q for q in range(n) if q != r]
        if n <= c.config.direct_barrier_max:
            for q in others:
                self._post(c, q, seq, tag, payload)
            return self._wait(c, [(q, tag) for q in others], seq, deadline)
        known = {r: payload}
        k, dist = 0, 1
        while dist < n:
            sub = f"{tag}.{k}"
            self._post(c, (r + dist) % n, seq, sub, [[q, p] for q, p in known.items()])
            (heard,) = self._wait(c, [((r - dist) % n, sub)], seq, deadline)
            try:
                for q, p in heard:
                    known.setdefault(int(q), p)
            except (TypeError, ValueError):
                raise HcclError(f"malformed {tag} message from rank {(r - dist) % n}", HCCL_E_PARA) from None
            k, dist = k + 1, dist * 2
        return [known.get(q) for q in others]

    def _collective(self, c: Comm, op: CollectiveOp, owner) -> None:
        seq, ranks = self._next_seq(c, op)
        with self._telling_peers(c, seq, ranks):
            self._collective_body(c, op, owner, seq)

    def _collective_body(self, c: Comm, op: CollectiveOp, owner, seq: int) -> None:
        n, r = c.size, c.rank
        deadline = self._deadline(c)
        isz = itemsize(op.dtype)
        total_bytes = op.count * isz * (n if op.op == "allgather" else 1)
        algo = choose_algo(op.op, n, total_bytes, c.config.algo)
        send_n, recv_n = self.buffer_counts(op, n, r)
        bufs = {"send": op.send, "recv": op.recv}
        for name, ptr, cnt in (("send", op.send, send_n), ("recv", op.recv, recv_n)):
            if cnt:
                self.arena.resolve(ptr, cnt * isz, owner)
        work_ptr = stage_ptr = exposure = None
        work_bytes = 0
        persistent = False
        epoch = self.arena.epoch
        for q in range(n):          # a down link fails every operator of the communicator, on both ends,
            if q != r:              # also when this rank exchanges nothing with that peer directly
                self._check_link(c, q, seq, range(n))
        # every peer's memory writable here (the whole communicator on one node): the large AllReduce
        # pushes its result (see devices.hccl_schedule); every rank decides the same, and says so below
        push = algo == "mesh" and all(c.links[q].writable for q in range(n) if q != r)
        pro = prologue(op.op, n, r, op.count, algo, op.root)
        epi = epilogue(op.op, n, r, op.count, algo)
        try:
            if any("work" in (p[0], p[2]) for p in pro + epi):
                work_n = op.count if algo == "oneshot" else op.count * n
                work_bytes = max(1, work_n * isz)                                    # count may be 0
                work_ptr, persistent = self._work_buffer(c, work_bytes)
                bufs["work"] = work_ptr
            me = self.arena.buf
            if op.op == "alltoall" and send_n and abs(op.send - op.recv) < send_n * isz:
                # in place: peers read my send blocks while I overwrite my recv blocks in the same
                # phase (a write-after-read hazard); they read a private copy instead
                stage_ptr = self._alloc(c, send_n * isz)
                self._move(me, op.send, 0, me, stage_ptr, 0, send_n, op.dtype, None)
                bufs["send"] = stage_ptr
            # what peers may read of mine while this operator runs (HcclRead serves nothing else)
            exposure = self._expose(c, [(bufs["send"], send_n * isz), (op.recv, recv_n * isz),
                                        (work_ptr, work_bytes)])
            for src, so, dst, do, cnt in pro:
                if bufs[src] != bufs[dst] or so != do:
                    self._move(me, bufs[src], so, me, bufs[dst], do, cnt, op.dtype, None)
            sig = [op.op, op.count, op.dtype, op.redop, op.root, algo, push]      # SIG_FIELDS
            # with the buffers, the fence peers access them under (only while it holds: devices.arena)
            ready = self._barrier(c, seq, "ready", deadline, [bufs.get("send", 0), bufs.get("recv", 0),
                                                             bufs.get("work", 0), sig, self.arena.peer_fence()])
            peer_bufs = {}
            for q, (s_ptr, r_ptr, w_ptr, psig, pfence) in zip([q for q in range(n) if q != r], ready):
                if psig != sig:
                    diff = ", ".join(f"{name} {a!r} vs {b!r}" for name, a, b in zip(SIG_FIELDS, psig, sig) if a != b)
                    raise HcclError(f"rank {q} and rank {r} issued different operators ({diff}): operators "
                                    f"must match on every rank", HCCL_E_PARA)
                peer_bufs[q] = {"send": s_ptr, "recv": r_ptr, "work": w_ptr, "fence": pfence}
            peer_bufs[r] = bufs
            red = op.redop
            for i, phase in enumerate(schedule(op.op, algo, n, r, op.count, op.root, push)):
                if i:
                    self._barrier(c, seq, f"phase{i}", deadline)
                for step in phase.steps:
                    if step.waits:
                        self._wait(c, list(step.waits), seq, deadline)
                    self._pulls(c, step.pulls, peer_bufs, op.dtype, red, seq, step.pushes)
                    for q in step.signals:
                        self._post(c, q, seq, step.tag)
            for src, so, dst, do, cnt in epi:
                self._move(me, bufs[src], so, me, bufs[dst], do, cnt, op.dtype, None)
            if not (algo == "oneshot" and persistent):
                # peers may still read my buffers; oneshot reads only the alternating CCL buffers,
                # which the next operator's "ready" round already protects
                self._barrier(c, seq, "done", deadline)
            if persistent and work_ptr in c.ccl:
                c.ccl_last = c.ccl.index(work_ptr)
        except BaseException:
            # peers may still be reading my buffers or writing my receive buffer: stop them before the
            # user has the buffers back (they may be freed and given to another tenant)
            self.arena.fence_peers(min(c.config.exec_timeout_s, FENCE_TIMEOUT_S))
            raise
        finally:
            if exposure is not None:
                self._unexpose(c, exposure)
            for ptr in (stage_ptr,) if persistent else (work_ptr, stage_ptr):
                if ptr is not None:
                    self.arena.free(ptr, epoch=epoch)

    def _pulls(self, c: Comm, pulls, peer_bufs: dict, dtype: str, redop: str, seq, pushes=()) -> None:
        """Run one step's pulls, then its pushes.  Consecutive reducing pulls into the same range (the
        contributions of every peer to one chunk) run as one group, segment by segment: each segment of
        the result is built in cache from every peer's segment before the next one is started -- and,
        where a push names that range, written to the push's peers right then, still in cache."""
        mine = peer_bufs[c.rank]
        fences = {q: b["fence"] for q, b in peer_bufs.items() if q != c.rank}
        left = list(pushes)
        i = 0
        while i < len(pulls):
            first, j = pulls[i], i + 1
            if first.reduce:
                while j < len(pulls) and pulls[j].reduce and pulls[j].base is None and \
                        (pulls[j].dst, pulls[j].dst_off, pulls[j].count) == (first.dst, first.dst_off, first.count):
                    j += 1
            srcs = [(p.peer, peer_bufs[p.peer][p.src], p.src_off, mine[p.base] if p.base else None)
                    for p in pulls[i:j]]
            fused = next((p for p in left if (p.buf, p.off, p.count) == (first.dst, first.dst_off, first.count)),
                         None)
            if fused is not None:
                left.remove(fused)
            self._transfer(c, srcs, mine[first.dst], first.dst_off, first.count, dtype,
                           redop if first.reduce else None, seq, range(c.size),
                           [(q, peer_bufs[q][fused.buf], peer_bufs[q]["fence"]) for q in fused.peers]
                           if fused else (), fences)
            i = j
        for p in left:              # a push of its own: one write of the range to each peer
            self._transfer(c, [], mine[p.buf], p.off, p.count, dtype, None, seq, range(c.size),
                           [(q, peer_bufs[q][p.buf], peer_bufs[q]["fence"]) for q in p.peers], fences)

    def _read_into(self, c: Comm, peer: int, src_ptr: int, src_off: int, dst_ptr: int, dst_off: int, count: int,
                   dtype: str, redop: str | None, seq, ranks) -> None:
        """Copy or reduce ``count`` elements of a rank's buffer into mine (see :meth:`_transfer`)."""
        self._transfer(c, [(peer, src_ptr, src_off, None)], dst_ptr, dst_off, count, dtype, redop, seq, ranks)

    def _transfer(self, c: Comm, srcs: list, dst_ptr: int, dst_off: int, count: int, dtype: str,
                  redop: str | None, seq, ranks, pushes=(), fences: dict | None = None) -> None:
        """``dst[dst_off:+count]`` (op)= each source in turn, segment by segment.  A source is ``(rank,
        ptr, element offset, base ptr or None)``, read through the link to that rank (or out of my own
        arena); with a base, the first reduction is ``dst = base op source`` (base at the source's
        offset).  Segments: cache-sized through zero-copy links, ``segment_bytes`` (one read each)
        through the others.  ``pushes``: ``(rank, ptr, fence)`` -- each finished segment is also written
        to that rank's buffer at the same element offset (writable links only; under that rank's peer fence,
        which must hold ``fence`` for the whole transfer), unless this device or the communicator gave up
        meanwhile.  ``fences``: rank -> the fence it published with its buffers; the sources are read only
        while theirs holds (:meth:`~devices.hccl_transport.ShmLink.holding`: a rank that gave up the
        operator is not read either).  ``seq``/``ranks``: the
        operator and its ranks (for link faults)."""
        if count <= 0:
            return
        me = self.arena.buf
        isz = itemsize(dtype)
        direct = all(peer == c.rank or c.links[peer].zero_copy for peer, *_ in srcs)
        if direct:      # views of memory: reductions in cache-sized segments, copies in one memcpy
            seg_bytes = CACHE_SEGMENT_BYTES if redop is not None else count * isz
        else:           # each read is one transfer
            seg_bytes = c.config.segment_bytes
        seg = max(1, seg_bytes // isz)
        with contextlib.ExitStack() as held:     # sources and targets: under their fences for the whole transfer
            for peer in {p for p, *_ in srcs if p != c.rank} if fences else ():
                held.enter_context(c.links[peer].holding(c.cid, fences[peer]))
            targets = [(peer, held.enter_context(c.links[peer].writing(c.cid, ptr + dst_off * isz, count * isz,
                                                                       fence)))
                       for peer, ptr, fence in pushes]
            done = 0
            while done < count:
                k = min(seg, count - done)
                for peer, src_ptr, src_off, base_ptr in srcs:
                    if peer == c.rank:
                        data, dptr = me, src_ptr
                        off = src_off + done
                    else:
                        self._check_link(c, peer, seq, ranks)
                        data = c.links[peer].read(c.cid, src_ptr + (src_off + done) * isz, k * isz)
                        dptr, off = 0, 0
                    base = None if base_ptr is None else ptr_offset(base_ptr) + (src_off + done) * isz
                    self._move(data, dptr, off, me, dst_ptr, dst_off + done, k, dtype, redop, base)
                if targets:
                    if self.aborted or c.cancelled:
                        raise HcclError("device aborted while writing to peers", HCCL_E_REMOTE)
                    at = ptr_offset(dst_ptr) + (dst_off + done) * isz
                    for peer, view in targets:
                        self._check_link(c, peer, seq, ranks)
                        np.copyto(view[done * isz:(done + k) * isz], me[at:at + k * isz])
                done += k
        for peer, *_ in srcs:
            if peer != c.rank:
                self.stats["bytes_pulled"] += count * isz
                self.stats[f"bytes_{c.scopes[peer]}"] += count * isz
        for peer, *_ in pushes:
            self.stats["bytes_pushed"] += count * isz
            self.stats[f"bytes_{c.scopes[peer]}"] += count * isz

    @staticmethod
    def _move(src_mem, src_ptr, src_off, dst_mem, dst_ptr, dst_off, count, dtype, redop, base=None) -> None:
        """``dst (op)= src`` for ``count`` elements; with ``base`` (a byte offset into ``dst_mem``):
        ``dst = dst_mem[base] op src``.  No temporaries (ufuncs write into ``dst``), but for bfloat16."""
        if count <= 0:
            return
        isz = itemsize(dtype)
        so = ptr_offset(src_ptr) + src_off * isz
        do = ptr_offset(dst_ptr) + dst_off * isz
        nb = count * isz
        if dtype == "bfloat16":
            s = src_mem[so:so + nb].view(np.uint16)
            d = dst_mem[do:do + nb].view(np.uint16)
            if redop is None:
                np.copyto(d, s)
            else:
                left = d if base is None else dst_mem[base:base + nb].view(np.uint16)
                acc = _UFUNC[redop](_bf16_to_f32(left), _bf16_to_f32(s))
                np.copyto(d, _f32_to_bf16(acc))
            return
        s = src_mem[so:so + nb].view(dtype)
        d = dst_mem[do:do + nb].view(dtype)
        if redop is None:
            np.copyto(d, s)
        elif base is None:
            _UFUNC[redop](d, s, out=d)
        else:
            _UFUNC[redop](dst_mem[base:base + nb].view(dtype), s, out=d)

    # ---------------------------------------------------------------- failures reach every rank
    @contextlib.contextmanager
    def _telling_peers(self, c: Comm, seq, ranks):
        """Run one operator; if it fails here (a peer gone, a timeout, a mismatch, a bad buffer), tell its
        other ranks at once (an ``abort`` message with the HcclResult), so that none of them waits for
        this rank until its own timeout: a lost node fails the operator on every surviving rank."""
        try:
            yield
        except (HcclError, AclError) as e:
            if not getattr(e, "peers_told", False):
                code = e.hccl_code if isinstance(e, HcclError) else (
                    HCCL_E_PARA if e.code in (ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_INVALID_PARAM) else HCCL_E_RUNTIME)
                self._abort_peers(c, seq, [q for q in ranks if q != c.rank], code,
                                  f"{e}"[:300])
            raise

    def _abort_peers(self, c: Comm, seq, peers: list[int], code: int, reason: str) -> None:
        """Best effort and off this core thread: a link to a dead peer may take its transport's deadline
        to fail, and the rank that gave up must report its own error now.  Never blocks: the message goes
        to the engine's outbox, which one thread at a time sends (a stream that skips hundreds of operators
        queues hundreds of aborts; a link that failed once in a round is not tried again in it)."""
        links = [c.links[q] for q in peers]
        msg = (c.cid, seq, ABORT_TAG, c.rank, [code, reason])
        with self._lock:
            self.stats["aborts_sent"] += 1      # core threads of many streams abort at once
            self._outbox.append((links, msg))
            if self._sending:
                return
            self._sending = True
        threading.Thread(target=self._send_outbox, name=f"hccl-abort-{self.device.id}", daemon=True).start()

    def _send_outbox(self) -> None:
        gone: set[int] = set()
        while True:
            with self._lock:
                batch, self._outbox = self._outbox, []
                if not batch:
                    self._sending = False
                    return
            for links, msg in batch:
                for link in links:
                    if id(link) in gone:
                        continue
                    try:
                        link.notify(msg)
                    except (HcclError, AclError, OSError):
                        gone.add(id(link))                 # that one is gone too

    def _p2p(self, c: Comm, op: CollectiveOp) -> None:
        seq, pair = self._next_seq(c, op)
        with self._telling_peers(c, seq, pair):
            self._p2p_body(c, op, seq, pair)

    def _p2p_body(self, c: Comm, op: CollectiveOp, seq: str, pair: tuple[int, int]) -> None:
        deadline = self._deadline(c)
        if op.op == "send":
            exposure = self._expose(c, [(op.send, op.count * itemsize(op.dtype))])
            try:
                self._post(c, op.peer, seq, "ready", [op.send, op.count, op.dtype], ranks=pair)
                self._wait(c, [(op.peer, "done")], seq, deadline, ranks=pair)
            finally:
                self._unexpose(c, exposure)
        else:
            (payload,) = self._wait(c, [(op.peer, "ready")], seq, deadline, ranks=pair)
            s_ptr, cnt, dt = payload
            if cnt != op.count or dt != op.dtype:
                self._post(c, op.peer, seq, "done", ranks=pair)
                raise HcclError(f"send of {cnt} x {dt} does not match recv of {op.count} x {op.dtype}",
                                HCCL_E_PARA)
            self._read_into(c, op.peer, s_ptr, 0, op.recv, 0, op.count, op.dtype, None, seq, pair)
            self._post(c, op.peer, seq, "done", ranks=pair)

    def abort(self) -> None:
        """The device is lost: operators waiting for peers give up (HCCL_E_REMOTE), peers see this rank's
        transports gone.  Idempotent."""
        self.close()

    def close(self) -> None:
        self.aborted = True
        with self._lock:
            transports, self._transports = list(self._transports.values()), {}
        for t in transports:
            t.close()


def _bf16_to_f32(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    rounded = u + (0x7FFF + ((u >> 16) & 1))     # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def validate_redop(redop) -> str:
    if isinstance(redop, int):
        if redop not in REDOPS:
            raise InvalidParamError(f"unknown HcclReduceOp {redop}")
        return REDOPS[redop]
    if redop not in _UFUNC:
        raise InvalidParamError(f"unknown reduce op {redop!r}")
    return redop
