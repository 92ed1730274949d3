"""The device side of HCCL: the engine that runs a collective's schedule (:mod:`devices.hccl_schedule`) as
one stream task on this device -- which operator, which algorithm, its buffers, its phases and steps, the
pulls and pushes that move the data -- and the element types and reductions it moves them with.

What the engine keeps between operators lives in small modules of their own, named for what they hold:
the communicators (peers, links, sequence numbers, state: :mod:`devices.hccl_comm`), the memory it holds
for them and what peers may read of it (:mod:`devices.hccl_buffers`), the transports that reach each peer
(:mod:`devices.hccl_transport`), the control messages received (:mod:`devices.hccl_mailbox`) and sent --
posts, waits, barriers, the rendezvous, aborts (:mod:`devices.hccl_control`).

Peers are reached through transports, one link per peer chosen when the communicator is built: shared
memory on one node (a rank *pulls* ranges straight out of a peer's HBM arena, mapped from ``/dev/shm``, and
rings its doorbell; the large AllReduce of a communicator on one node also *pushes* its reduced chunk into
the peers' receive buffers, at the pointers they named for the operator), gRPC between device actors across
nodes (pull only).  Either way the data moves device to device, never through the user's process.  Control
messages are small tuples ``(comm, seq, tag, from_rank, payload)``; the communicator id is a 128-bit random
capability known only to its members, and messages for unknown communicators are dropped.

A collective runs on a core thread and blocks it while it waits for peers, always with a deadline
(``exec_timeout_s``, HCCL_EXEC_TIMEOUT-style); it only orders the device for the host that enqueued it.
While waiting it probes the peers it waits for: a peer that is gone (its process died or its device
closed) fails the collective at once with HCCL_E_REMOTE instead of waiting for the timeout; a link that is
down (fault ``link-down``) fails it with HCCL_E_NETWORK.  An operator this rank does not run at all (its
stream skips it after an earlier failure: :meth:`HcclEngine.skip`) still takes its place in the
communicator's order and fails its peers at once with HCCL_E_REMOTE.

Tenancy (:mod:`devices.tenancy`): a communicator belongs to the client that created it and is released
with that client's lease (:meth:`HcclEngine.drop_owner`); ids are scoped by tenant
(:func:`~devices.hccl_comm.scoped_comm_id`).  A peer's read (the cross-node transport's ``HcclRead``,
:meth:`HcclEngine.read_for_peer`) is served only for ranges this rank exposes: the buffers of an operator
of that communicator while it runs (from before its "ready" message until its last barrier) and the
communicator's own work buffers -- never any other memory, and not after the operator ended.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np

from .arena import ptr_offset
from .errors import HCCL_E_NOT_SUPPORT, HCCL_E_PARA, HCCL_E_REMOTE, AclError, HcclError, InvalidParamError
from .hccl_buffers import CCL_CACHE_MAX, HCCL_OWNER, CommBuffers
from .hccl_comm import (DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_EXEC_TIMEOUT_S, DIRECT_BARRIER_MAX, Comm, CommConfig,
                        Communicators, PeerInfo, check_comm_id, scoped_comm_id)
from .hccl_control import Control, hccl_code_of
from .hccl_mailbox import ABORT_TAG, COMM_SEQ, Mailbox
from .hccl_schedule import choose_algo, epilogue, prologue, schedule
from .hccl_transport import CROSS_NODE, PROCESS_LINK_KEY, SAME_NODE, ShmTransport, Transports

#: HcclDataType (hccl_types.h) -> numpy dtype name ("bfloat16" is carried as uint16 bit patterns)
HCCL_DTYPES = {0: "int8", 1: "int16", 2: "int32", 3: "float16", 4: "float32", 5: "int64", 6: "uint64",
               7: "uint8", 8: "uint16", 9: "uint32", 10: "float64", 11: "bfloat16"}
HCCL_DTYPE_IDS = {v: k for k, v in HCCL_DTYPES.items()}
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min"}
_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
_ITEM = {"bfloat16": 2}
#: what ranks compare at "ready" (one operator on every rank)
SIG_FIELDS = ("op", "count", "dtype", "redop", "root", "algorithm", "push (every peer's memory writable)")
#: how long a rank that gave up an operator waits for peers' writes in progress (one segment's copy each)
FENCE_TIMEOUT_S = 5.0
#: segment of a pull through a zero-copy link (shared memory): the reductions of one chunk run segment by
#: segment, so the partial sum stays in the core's L2 cache while every peer's segment is added to it
CACHE_SEGMENT_BYTES = 256 << 10
#: most control messages kept for communicators this device does not know (yet)
_UNKNOWN_KEPT = 65536


def itemsize(dtype: str) -> int:
    return _ITEM.get(dtype) or np.dtype(dtype).itemsize


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


@dataclass(frozen=True)
class _Plan:
    """How this rank runs one collective operator: decided before anything is allocated."""
    algo: str
    send_n: int               #: elements of the send buffer this rank touches
    recv_n: int
    push: bool                #: every peer's memory writable here: the large AllReduce pushes its result
    pro: list                 #: the schedule's prologue / epilogue moves (src, src_off, dst, dst_off, count)
    epi: list
    deadline: float


@dataclass
class _Held:
    """What one collective operator holds while it runs (released by :meth:`HcclEngine._release`)."""
    epoch: int                #: the arena epoch its buffers were allocated in
    work: int | None = None
    work_bytes: int = 0
    persistent: bool = False  #: ``work`` is one of the communicator's CCL buffers (kept)
    stage: int | None = None  #: private copy of an in-place AllToAll's input
    exposure: object = None   #: the token of its exposed ranges


class HcclEngine:
    """Communicators of one device and the collective executor.  The engine drives each operator (its plan,
    buffers, "ready" round, phases, pulls and pushes); what it keeps between operators is held by
    :attr:`communicators` (:mod:`devices.hccl_comm`), :attr:`buffers` (:mod:`devices.hccl_buffers`),
    :attr:`transports` (:mod:`devices.hccl_transport`), :attr:`mailbox` and :attr:`control`
    (:mod:`devices.hccl_mailbox`, :mod:`devices.hccl_control`).

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
        self.aborted = False
        self.stats = {"collectives": 0, "bytes_pulled": 0, "bytes_pushed": 0, "messages": 0, "aborts_sent": 0,
                      f"bytes_{SAME_NODE}": 0, f"bytes_{CROSS_NODE}": 0}
        self.mailbox = Mailbox()
        self.communicators = Communicators()
        self.buffers = CommBuffers(self.arena, lambda owner: device.config.quota.limit("hbm_bytes", owner),
                                   self.communicators.lock, device.id)
        key = getattr(device.config, "link_key", b"") or PROCESS_LINK_KEY
        # same-node peers pull through mapped arenas -- only when this device's arena is a named segment
        self.transports = Transports(self.node, {SAME_NODE: ShmTransport(self.arena, self.deliver, key)}
                                     if self.arena.shared else {})
        self.control = Control(device.id, self.mailbox, self.transports, self.faults, self.stats,
                               lambda: self.aborted)

    @property
    def comms(self) -> dict[str, Comm]:
        """This device's communicators by scoped id (the live table: read it, do not change it)."""
        return self.communicators.by_id

    def set_transport(self, scope: str, transport) -> None:
        """Install the transport for peers of ``scope`` (:data:`CROSS_NODE`: set by the device host).  The
        engine owns it from then on (closes it with the device)."""
        self.transports.install(scope, transport)

    def scope_of(self, p: PeerInfo) -> str:
        """Which transport reaches peer ``p`` (:meth:`devices.hccl_transport.Transports.scope_of`)."""
        return self.transports.scope_of(p)

    # ---------------------------------------------------------------- communicators
    def info(self) -> dict:
        """What peers need to reach this device: its id and node, and every transport's endpoint."""
        out = {"device_id": self.device.id, "node": self.node, "address": "", "arena": "",
               "arena_bytes": self.arena.size, "doorbell": ""}
        out.update(self.transports.endpoints())
        out["stats"] = dict(self.stats)        # what went where (peers ignore it)
        return out

    def deliver(self, msg) -> bool:
        """A control message that arrived over a transport (any of them).  False when dropped: malformed,
        or for a communicator not known here once many such are kept (a peer may start an operator before
        this rank has created the communicator)."""
        try:
            cid, seq, tag, frm, payload = msg
            key = (cid, seq, tag, frm)
            hash(key)
        except (TypeError, ValueError):
            return False
        if not isinstance(cid, str) or not (self.communicators.known(cid) or len(self.mailbox) < _UNKNOWN_KEPT):
            return False
        self.mailbox.put(key, payload)
        return True

    def read_for_peer(self, cid: str, ptr: int, nbytes: int) -> np.ndarray:
        """A peer on another node reads my HBM (``cid``: the engine's scoped id, as peers exchange it):
        served only for a range this rank exposes in communicator ``cid`` -- a buffer of one of its
        operators while that runs, or one of the communicator's work buffers (ACL_ERROR_RT_NO_PERMISSION
        otherwise) -- and only inside live allocations."""
        c = self.communicators.by_id.get(cid) if isinstance(cid, str) else None
        return self.buffers.read_for_peer(c, ptr, nbytes)

    def comm_init(self, cid: str, rank: int, peers: list[dict], config: dict | None = None, owner=None) -> None:
        """Create this rank of communicator ``cid`` of ``owner``'s tenant (an existing one of that id is
        replaced)."""
        check_comm_id(cid)
        self._init(scoped_comm_id(cid, owner), rank, peers, config, owner)

    def _init(self, key: str, rank: int, peers: list[dict], config: dict | None, owner) -> None:
        if not isinstance(peers, list):
            raise HcclError("peers must be a list of peer infos", HCCL_E_PARA)
        infos = [PeerInfo.of(i, p) for i, p in enumerate(peers)]
        if not isinstance(rank, int) or not 0 <= rank < len(infos) or infos[rank].device_id != self.device.id:
            raise HcclError(f"rank {rank} is not this device ({self.device.id})", HCCL_E_PARA)
        links = [None if p.rank == rank else self.transports.link(p) for p in infos]
        scopes = [None if p.rank == rank else self.transports.scope_of(p) for p in infos]
        old = self.communicators.add(Comm(key, rank, infos, CommConfig.of(config), links, scopes, owner=owner))
        if old is not None:
            self._retire(old)

    def comm_join(self, cid: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                  timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S, owner=None) -> list[dict]:
        """Root-info rendezvous: every rank sends its info to the root device; the root answers everyone
        with the table.  Host-blocking, with ``timeout_s``."""
        check_comm_id(cid)
        if not isinstance(root, dict):
            raise HcclError("root info must be a peer info", HCCL_E_PARA)
        key = scoped_comm_id(cid, owner)
        self.communicators.joining(key)
        try:
            table = self.control.rendezvous(key, rank, nranks, root, self.info(), time.monotonic() + timeout_s)
        except HcclError:
            self.communicators.joining(key, pending=False)
            raise
        self._init(key, rank, table, config, owner)
        return table

    def comm_destroy(self, cid: str, owner=None) -> None:
        """Destroy communicator ``cid`` of ``owner``'s tenant (its work buffers go once its running
        operators are done; nothing happens for an id the tenant does not hold)."""
        c = self.communicators.remove(cid, owner)
        if c is not None:
            self._retire(c)

    def _retire(self, c: Comm) -> None:
        idle = self.communicators.close(c)
        self.mailbox.drop_comm(c.cid)
        if idle:
            self.buffers.free_ccl(c)

    def drop_owner(self, owner, cancel_only: bool = False) -> int:
        """A client left: its communicators' running operators give up at once (``cancel_only``), or its
        communicators are destroyed.  Returns how many it held."""
        mine = self.communicators.of_owner(owner, remove=not cancel_only)
        if not cancel_only:
            for c in mine:
                self._retire(c)
        return len(mine)

    def reset(self) -> None:
        """Device reset: every communicator is gone at once; running operators give up (their waits end
        within a probe period) and nothing they free afterwards touches the arena's next epoch."""
        self.communicators.clear()
        self.mailbox.clear()

    def async_error(self, cid: str, owner=None) -> int:
        return self.communicators.async_error(cid, owner)

    # ---------------------------------------------------------------- validation at enqueue
    def check(self, op: CollectiveOp, owner=None) -> None:
        c = self.communicators.get(op.comm, owner)
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
        c = self.communicators.get(op.comm, owner)
        n = c.size
        nbytes = op.count * itemsize(op.dtype)
        algo = choose_algo(op.op, n, nbytes * (n if op.op == "allgather" else 1), c.config.algo) \
            if op.op not in ("send", "recv", "barrier") else "mesh"
        return self.device.cost.collective(op.op, algo, n, nbytes)

    # ---------------------------------------------------------------- execution (on a core thread)
    def skip(self, op: CollectiveOp, err: AclError, owner=None) -> None:
        """Operator ``op`` of this rank will not run (its stream skips it after an earlier failure, or an
        injected failure takes its place): it still takes its place in the communicator's order, and its
        peers are told at once (HCCL_E_REMOTE) instead of waiting for this rank until their exec timeout --
        so that the operator after it, once the host has seen the error, pairs with the peers' again.
        Does not block (the messages go from another thread); a communicator gone meanwhile is ignored."""
        c = self.communicators.find(op.comm, owner)
        if c is None or c.cancelled:
            return
        seq, ranks = self.communicators.next_seq(c, op.op, op.peer)
        self.control.abort_peers(c, seq, [q for q in ranks if q != c.rank], HCCL_E_REMOTE,
                                 f"did not run its {op.op} (operator {seq}): an earlier task of its stream "
                                 f"failed ({err})"[:300])

    def run(self, op: CollectiveOp, owner=None) -> None:
        """Run operator ``op`` of this rank (host-blocking: the core thread waits for peers, up to the
        communicator's exec timeout)."""
        c = self.communicators.begin(op.comm, owner)
        try:
            seq, ranks = self.communicators.next_seq(c, op.op, op.peer)
            with self.control.telling_peers(c, seq, ranks):
                if op.op in ("send", "recv"):
                    self._p2p(c, op, seq, ranks)
                else:
                    self._collective(c, op, owner, seq)
            self.stats["collectives"] += 1
        except AclError as e:
            c.async_error = hccl_code_of(e)
            raise
        finally:
            if self.communicators.end(c):
                self.buffers.free_ccl(c)

    def _deadline(self, c: Comm) -> float:
        return time.monotonic() + c.config.exec_timeout_s

    def _collective(self, c: Comm, op: CollectiveOp, owner, seq: int) -> None:
        """One collective: its plan, its buffers, the "ready" round (every rank's buffers and operator), the
        schedule's phases, the epilogue and the closing barrier.  A failure fences the peers off this
        rank's memory before the user has the buffers back (they may be freed and given to another
        tenant)."""
        plan = self._plan(c, op, owner, seq)
        held = _Held(self.arena.epoch)
        try:
            bufs = self._buffers(c, op, plan, held)
            peer_bufs = self._ready(c, op, seq, plan, bufs)
            self._phases(c, op, seq, plan, peer_bufs)
            me = self.arena.buf
            for src, so, dst, do, cnt in plan.epi:
                self._move(me, bufs[src], so, me, bufs[dst], do, cnt, op.dtype, None)
            if not (plan.algo == "oneshot" and held.persistent):
                # peers may still read my buffers; oneshot reads only the alternating CCL buffers,
                # which the next operator's "ready" round already protects
                self.control.barrier(c, seq, "done", plan.deadline)
            if held.persistent:
                self.buffers.completed(c, held.work)
        except BaseException:
            # peers may still be reading my buffers or writing my receive buffer: stop them first
            self.arena.fence_peers(min(c.config.exec_timeout_s, FENCE_TIMEOUT_S))
            raise
        finally:
            self._release(c, held)

    def _plan(self, c: Comm, op: CollectiveOp, owner, seq: int) -> _Plan:
        """Algorithm, buffer extents, push, prologue/epilogue and deadline of ``op`` on this rank; checks
        the user's buffers and every link first (a down link fails every operator of the communicator, on
        both ends, also when this rank exchanges nothing with that peer directly)."""
        n, r = c.size, c.rank
        deadline = self._deadline(c)
        isz = itemsize(op.dtype)
        algo = choose_algo(op.op, n, op.count * isz * (n if op.op == "allgather" else 1), c.config.algo)
        send_n, recv_n = self.buffer_counts(op, n, r)
        for ptr, cnt in ((op.send, send_n), (op.recv, recv_n)):
            if cnt:
                self.arena.resolve(ptr, cnt * isz, owner)
        for q in range(n):
            if q != r:
                self.control.check_link(c, q, seq, range(n))
        # every peer's memory writable here (the whole communicator on one node): the large AllReduce
        # pushes its result (see devices.hccl_schedule); every rank decides the same, and says so at "ready"
        push = algo == "mesh" and all(c.links[q].writable for q in range(n) if q != r)
        return _Plan(algo, send_n, recv_n, push, prologue(op.op, n, r, op.count, algo, op.root),
                     epilogue(op.op, n, r, op.count, algo), deadline)

    def _buffers(self, c: Comm, op: CollectiveOp, plan: _Plan, held: _Held) -> dict:
        """This rank's buffers of ``op`` by schedule name (send, recv, work): the work buffer and an
        in-place AllToAll's staged input allocated, what peers may read exposed, the prologue run."""
        isz = itemsize(op.dtype)
        bufs = {"send": op.send, "recv": op.recv}
        if any("work" in (p[0], p[2]) for p in plan.pro + plan.epi):
            work_n = op.count if plan.algo == "oneshot" else op.count * c.size
            held.work_bytes = max(1, work_n * isz)                                   # count may be 0
            held.work, held.persistent = self.buffers.work_buffer(c, held.work_bytes)
            bufs["work"] = held.work
        me = self.arena.buf
        if op.op == "alltoall" and plan.send_n and abs(op.send - op.recv) < plan.send_n * isz:
            # in place: peers read my send blocks while I overwrite my recv blocks in the same
            # phase (a write-after-read hazard); they read a private copy instead
            held.stage = self.buffers.alloc(c, plan.send_n * isz)
            self._move(me, op.send, 0, me, held.stage, 0, plan.send_n, op.dtype, None)
            bufs["send"] = held.stage
        # what peers may read of mine while this operator runs (HcclRead serves nothing else)
        held.exposure = self.buffers.expose(c, [(bufs["send"], plan.send_n * isz), (op.recv, plan.recv_n * isz),
                                                (held.work, held.work_bytes)])
        for src, so, dst, do, cnt in plan.pro:
            if bufs[src] != bufs[dst] or so != do:
                self._move(me, bufs[src], so, me, bufs[dst], do, cnt, op.dtype, None)
        return bufs

    def _ready(self, c: Comm, op: CollectiveOp, seq: int, plan: _Plan, bufs: dict) -> dict:
        """The "ready" round: every rank's buffers, operator and peer fence; returns rank -> its buffers
        (HCCL_E_PARA when a rank issued a different operator)."""
        r = c.rank
        sig = [op.op, op.count, op.dtype, op.redop, op.root, plan.algo, plan.push]      # SIG_FIELDS
        # with the buffers, the fence peers access them under (only while it holds: devices.arena)
        ready = self.control.barrier(c, seq, "ready", plan.deadline,
                                     [bufs.get("send", 0), bufs.get("recv", 0), bufs.get("work", 0), sig,
                                      self.arena.peer_fence()])
        peer_bufs = {}
        for q, (s_ptr, r_ptr, w_ptr, psig, pfence) in zip([q for q in range(c.size) if q != r], ready):
            if psig != sig:
                diff = ", ".join(f"{name} {a!r} vs {b!r}" for name, a, b in zip(SIG_FIELDS, psig, sig) if a != b)
                raise HcclError(f"rank {q} and rank {r} issued different operators ({diff}): operators "
                                f"must match on every rank", HCCL_E_PARA)
            peer_bufs[q] = {"send": s_ptr, "recv": r_ptr, "work": w_ptr, "fence": pfence}
        peer_bufs[r] = bufs
        return peer_bufs

    def _phases(self, c: Comm, op: CollectiveOp, seq: int, plan: _Plan, peer_bufs: dict) -> None:
        """The schedule's phases (a barrier between two), each step: its waits, pulls, pushes, signals."""
        for i, phase in enumerate(schedule(op.op, plan.algo, c.size, c.rank, op.count, op.root, plan.push)):
            if i:
                self.control.barrier(c, seq, f"phase{i}", plan.deadline)
            for step in phase.steps:
                if step.waits:
                    self.control.wait(c, list(step.waits), seq, plan.deadline)
                self._pulls(c, step.pulls, peer_bufs, op.dtype, op.redop, seq, step.pushes)
                for q in step.signals:
                    self.control.post(c, q, seq, step.tag)

    def _release(self, c: Comm, held: _Held) -> None:
        """Hide the operator's buffers from peers, free the ones it allocated (in the arena epoch they
        were allocated in: a reset meanwhile freed them already)."""
        if held.exposure is not None:
            self.buffers.unexpose(c, held.exposure)
        for ptr in (held.stage,) if held.persistent else (held.work, held.stage):
            if ptr is not None:
                self.arena.free(ptr, epoch=held.epoch)

    def _p2p(self, c: Comm, op: CollectiveOp, seq: str, pair: tuple[int, int]) -> None:
        deadline = self._deadline(c)
        if op.op == "send":
            exposure = self.buffers.expose(c, [(op.send, op.count * itemsize(op.dtype))])
            try:
                self.control.post(c, op.peer, seq, "ready", [op.send, op.count, op.dtype], ranks=pair)
                self.control.wait(c, [(op.peer, "done")], seq, deadline, ranks=pair)
            finally:
                self.buffers.unexpose(c, exposure)
        else:
            (payload,) = self.control.wait(c, [(op.peer, "ready")], seq, deadline, ranks=pair)
            s_ptr, cnt, dt = payload
            if cnt != op.count or dt != op.dtype:
                self.control.post(c, op.peer, seq, "done", ranks=pair)
                raise HcclError(f"send of {cnt} x {dt} does not match recv of {op.count} x {op.dtype}",
                                HCCL_E_PARA)
            self._read_into(c, op.peer, s_ptr, 0, op.recv, 0, op.count, op.dtype, None, seq, pair)
            self.control.post(c, op.peer, seq, "done", ranks=pair)

    # ---------------------------------------------------------------- moving the data
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
                        self.control.check_link(c, peer, seq, ranks)
                        data = c.links[peer].read(c.cid, src_ptr + (src_off + done) * isz, k * isz)
                        dptr, off = 0, 0
                    base = None if base_ptr is None else ptr_offset(base_ptr) + (src_off + done) * isz
                    self._move(data, dptr, off, me, dst_ptr, dst_off + done, k, dtype, redop, base)
                if targets:
                    if self.aborted or c.cancelled:
                        raise HcclError("device aborted while writing to peers", HCCL_E_REMOTE)
                    at = ptr_offset(dst_ptr) + (dst_off + done) * isz
                    for peer, view in targets:
                        self.control.check_link(c, peer, seq, ranks)
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

    # ---------------------------------------------------------------- lifecycle
    def abort(self) -> None:
        """The device is lost: operators waiting for peers give up (HCCL_E_REMOTE), peers see this rank's
        transports gone.  Idempotent."""
        self.close()

    def close(self) -> None:
        self.aborted = True
        self.transports.close()


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


__all__ = ["HCCL_DTYPES", "HCCL_DTYPE_IDS", "REDOPS", "SIG_FIELDS", "FENCE_TIMEOUT_S", "CACHE_SEGMENT_BYTES",
           "itemsize", "validate_redop", "CollectiveOp", "HcclEngine",
           # what the engine keeps, from the modules that hold it (imported from here by older code)
           "DEFAULT_EXEC_TIMEOUT_S", "DEFAULT_CONNECT_TIMEOUT_S", "DIRECT_BARRIER_MAX", "scoped_comm_id", "PeerInfo",
           "CommConfig", "Comm", "HCCL_OWNER", "CCL_CACHE_MAX", "Mailbox", "ABORT_TAG", "COMM_SEQ",
           "SAME_NODE", "CROSS_NODE"]
