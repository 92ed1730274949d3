"""HCCL control messages received by one device: the mailbox every transport delivers into.

A control message is a small tuple ``(comm, seq, tag, from_rank, payload)`` (:mod:`devices.hccl_transport`
carries it); the mailbox keeps it under the key ``(comm, seq, tag, from_rank)`` until the operator that
waits for it takes it.  An ``abort`` message is not kept as a message: it fails the waits of the operator
(or, with ``seq`` :data:`COMM_SEQ`, of the whole communicator) it names.  Nothing here sends anything.
"""
from __future__ import annotations

import threading
import time

from .errors import HCCL_E_REMOTE, HCCL_E_TIMEOUT, HcclError

#: how often a wait for peers probes them (s)
_PROBE_S = 0.05

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
