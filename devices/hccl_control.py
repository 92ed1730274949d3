"""HCCL control messages between the ranks of a communicator: posts, waits, barriers, the root-info
rendezvous, and the aborts that carry a rank's failure to every other rank.

Messages go out through the communicator's links (:mod:`devices.hccl_transport`) and come in through the
device's :class:`~devices.hccl_mailbox.Mailbox`.  A wait probes the peers it waits for: a peer that is
gone fails it at once with HCCL_E_REMOTE (and the other ranks are told that the communicator cannot
complete any operator), a link that is down (fault ``link-down``) with HCCL_E_NETWORK.  A rank that gives
up an operator tells its other ranks with an ``abort`` message carrying its HcclResult, from the outbox
thread (:meth:`Control.abort_peers`: never blocks a core thread on a dead peer's link).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

from .errors import (ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_PARAM_INVALID, HCCL_E_NETWORK, HCCL_E_PARA,
                     HCCL_E_REMOTE, HCCL_E_RUNTIME, AclError, HcclError)
from .hccl_comm import Comm, PeerInfo
from .hccl_mailbox import ABORT_TAG, COMM_SEQ, Mailbox
from .hccl_transport import Transports


def hccl_code_of(e: AclError) -> int:
    """The HcclResult a failed operator reports for ``e`` (an HcclError's own; a bad parameter's
    HCCL_E_PARA; anything else HCCL_E_RUNTIME)."""
    if isinstance(e, HcclError):
        return e.hccl_code
    return HCCL_E_PARA if e.code in (ACL_ERROR_RT_PARAM_INVALID, ACL_ERROR_INVALID_PARAM) else HCCL_E_RUNTIME


class Control:
    """The control plane of one device's engine.  ``stats`` is the engine's counters (``messages``,
    ``aborts_sent``); ``stopped()`` says whether the device gave up (aborted or closed)."""

    def __init__(self, device_id: int, mailbox: Mailbox, transports: Transports, faults, stats: dict,
                 stopped: Callable[[], bool]):
        self.device_id = device_id
        self.mailbox = mailbox
        self.transports = transports
        self.faults = faults
        self.stats = stats
        self.stopped = stopped
        self._lock = threading.Lock()
        self._outbox: list[tuple[list, tuple]] = []     #: aborts to send: (links, message), in order
        self._sending = False                           #: a thread sends the outbox now

    # ---------------------------------------------------------------- one operator's messages
    def check_link(self, c: Comm, peer: int, seq, ranks) -> None:
        """Fault ``link-down``: the link to ``peer``'s device is down.  The other ranks of the operator
        (``ranks``) are told, best effort, then it fails with HCCL_E_NETWORK."""
        p = c.peers[peer]
        if not self.faults.link_down(p.device_id):
            return
        reason = f"link from device {self.device_id} to device {p.device_id} (rank {peer}) is down"
        for q in ranks:
            if q != c.rank:
                try:
                    c.links[q].notify((c.cid, seq, ABORT_TAG, c.rank, [HCCL_E_NETWORK, reason]))
                except HcclError:
                    pass
        err = HcclError(reason, HCCL_E_NETWORK)
        err.peers_told = True
        raise err

    def post(self, c: Comm, peer: int, seq, tag: str, payload=None, ranks=None) -> None:
        self.check_link(c, peer, seq, range(c.size) if ranks is None else ranks)
        try:
            c.links[peer].notify((c.cid, seq, tag, c.rank, payload))
        except HcclError as e:
            self.peer_gone(c, peer, e)
        self.stats["messages"] += 1

    def peer_gone(self, c: Comm, peer: int, e: HcclError) -> None:
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

    def wait(self, c: Comm, waits: list[tuple[int, str]], seq, deadline: float, ranks=None) -> list:
        """The payloads of ``waits`` (``(peer, tag)`` of operator ``seq``), in order; host-blocking up to
        ``deadline`` while probing the peers still missing."""
        keys = [(c.cid, seq, tag, peer) for peer, tag in waits]
        ranks = range(c.size) if ranks is None else ranks

        def probe(missing):
            for (_, _, _, peer) in missing:
                self.check_link(c, peer, seq, ranks)
                try:
                    c.links[peer].probe()
                except HcclError as e:
                    self.peer_gone(c, peer, e)
        return self.mailbox.take(keys, deadline, probe, lambda: self.stopped() or c.cancelled)

    def barrier(self, c: Comm, seq, tag: str, deadline: float, payload=None) -> list:
        """Every rank reaches this point before any leaves it; returns every other rank's ``payload`` (in
        rank order).  Up to ``direct_barrier_max`` ranks: one message to every peer (one round); more:
        a dissemination barrier -- ceil(log2 n) rounds, in round k a message to rank r + 2^k carrying every
        payload heard so far -- n log n messages instead of n (n - 1)."""
        n, r = c.size, c.rank
        others = [q for q in range(n) if q != r]
        if n <= c.config.direct_barrier_max:
            for q in others:
                self.post(c, q, seq, tag, payload)
            return self.wait(c, [(q, tag) for q in others], seq, deadline)
        known = {r: payload}
        k, dist = 0, 1
        while dist < n:
            sub = f"{tag}.{k}"
            self.post(c, (r + dist) % n, seq, sub, [[q, p] for q, p in known.items()])
            (heard,) = self.wait(c, [((r - dist) % n, sub)], seq, deadline)
            try:
                for q, p in heard:
                    known.setdefault(int(q), p)
            except (TypeError, ValueError):
                raise HcclError(f"malformed {tag} message from rank {(r - dist) % n}", HCCL_E_PARA) from None
            k, dist = k + 1, dist * 2
        return [known.get(q) for q in others]

    # ---------------------------------------------------------------- the root-info rendezvous
    def rendezvous(self, key: str, rank: int, nranks: int, root: dict, me: dict, deadline: float) -> list[dict]:
        """Every rank sends its info ``me`` to the root device (rank 0); the root answers everyone with the
        table of all ranks' infos, which this returns.  Host-blocking up to ``deadline``."""
        if rank == 0:
            if root.get("device_id") != me["device_id"] or root.get("arena") != me["arena"]:
                raise HcclError("rank 0 must run on the root device", HCCL_E_PARA)
            keys = [(key, 0, "join", r) for r in range(1, nranks)]
            joins = self.mailbox.take(keys, deadline, lambda missing: None, self.stopped)
            table = [me] + joins
            for r, info in enumerate(table[1:], start=1):
                self.transports.link(PeerInfo.of(r, info)).notify((key, 0, "table", 0, table))
            return table
        self.transports.link(PeerInfo.of(0, root)).notify((key, 0, "join", rank, me))
        (table,) = self.mailbox.take([(key, 0, "table", 0)], deadline, lambda m: None, self.stopped)
        return table

    # ---------------------------------------------------------------- failures reach every rank
    @contextlib.contextmanager
    def telling_peers(self, c: Comm, seq, ranks):
        """Run one operator; if it fails here (a peer gone, a timeout, a mismatch, a bad buffer), tell its
        other ranks at once (an ``abort`` message with the HcclResult), so that none of them waits for
        this rank until its own timeout: a lost node fails the operator on every surviving rank."""
        try:
            yield
        except (HcclError, AclError) as e:
            if not getattr(e, "peers_told", False):
                self.abort_peers(c, seq, [q for q in ranks if q != c.rank], hccl_code_of(e), f"{e}"[:300])
            raise

    def abort_peers(self, c: Comm, seq, peers: list[int], code: int, reason: str) -> None:
        """Best effort and off this core thread: a link to a dead peer may take its transport's deadline
        to fail, and the rank that gave up must report its own error now.  Never blocks: the message goes
        to the outbox, which one thread at a time sends (a stream that skips hundreds of operators
        queues hundreds of aborts; a link that failed once in a round is not tried again in it)."""
        links = [c.links[q] for q in peers]
        msg = (c.cid, seq, ABORT_TAG, c.rank, [code, reason])
        with self._lock:
            self.stats["aborts_sent"] += 1      # core threads of many streams abort at once
            self._outbox.append((links, msg))
            if self._sending:
                return
            self._sending = True
        threading.Thread(target=self._send_outbox, name=f"hccl-abort-{self.device_id}", daemon=True).start()

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


__all__ = ["Control", "hccl_code_of"]
