"""Client leases: what a device does for a client that goes away without cleaning up.

A runtime client holds a *lease watch* (``WatchHealth`` with ``lease=true``) on every device it uses,
for as long as it lives; gRPC ends the call when the client's process dies or its channel closes.
When a client's last lease watch has ended and no new one arrived within ``grace_s``, the device
releases everything the client still holds -- memory, streams, events, graphs, launch templates -- as
CANN's driver does for a process that exits.  Clients that never took a lease are never released this
way (their resources live until they free them or the device is reset).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

log = logging.getLogger("vnpu.lease")

#: seconds between a client's last lease ending and its release (a renewed watch arrives well within)
DEFAULT_GRACE_S = float(os.environ.get("VNPU_LEASE_GRACE_S", 5.0))


class Leases:
    """Lease watches per client (owner) of one device server."""

    def __init__(self, release: Callable[[str], None], grace_s: float = DEFAULT_GRACE_S):
        self._release = release
        self.grace_s = grace_s
        self._open: dict[str, int] = {}
        self._armed: dict[str, threading.Timer] = {}   # owner -> its pending release (only that one fires)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self.released: list[str] = []          #: owners released so far (newest last)
        self._closed = False

    def opened(self, owner: str) -> None:
        with self._lock:
            self._open[owner] = self._open.get(owner, 0) + 1
            t = self._armed.pop(owner, None)
            self._cv.notify_all()
        if t is not None:
            t.cancel()

    def closed(self, owner: str) -> None:
        with self._lock:
            self._cv.notify_all()
            n = self._open.get(owner, 0) - 1
            if n > 0:
                self._open[owner] = n
                return
            self._open.pop(owner, None)
            if self._closed:
                return
            t = threading.Timer(self.grace_s, self._expire)
            t.args = (owner, t)
            t.daemon = True
            old, self._armed[owner] = self._armed.get(owner), t
        if old is not None:
            old.cancel()
        t.start()

    def holds(self, owner: str) -> bool:
        with self._lock:
            return self._open.get(owner, 0) > 0

    def armed(self, owner: str) -> bool:
        """Whether a release of ``owner`` is pending (its last watch ended less than the grace ago)."""
        with self._lock:
            return owner in self._armed

    def count(self, owner: str) -> int:
        """How many lease watches of ``owner`` are open now."""
        with self._lock:
            return self._open.get(owner, 0)

    def wait_count(self, owner: str, n: int, timeout: float) -> bool:
        """Block until ``owner`` has exactly ``n`` open lease watches (True) or ``timeout`` passes."""
        with self._cv:
            return self._cv.wait_for(lambda: self._open.get(owner, 0) == n, timeout)

    def _expire(self, owner: str, timer: threading.Timer) -> None:
        with self._lock:
            # only the armed timer releases: a renewal (opened) or close() removes it, a later end of the
            # lease (closed) replaces it -- so an owner with an open watch never has one armed
            if self._armed.get(owner) is not timer:
                return
            del self._armed[owner]
        try:
            self._release(owner)
        except Exception:  # noqa: BLE001 - a failed release is logged; the device keeps serving
            log.exception("releasing client %s failed", owner)
            return
        with self._lock:
            self.released.append(owner)
            self._cv.notify_all()

    def wait_released(self, owner: str, timeout: float) -> bool:
        """Block until ``owner`` has been released (True) or ``timeout`` seconds pass (False)."""
        with self._cv:
            return self._cv.wait_for(lambda: owner in self.released, timeout)

    def close(self) -> None:
        """Stop: pending releases are cancelled (the device is going away)."""
        with self._lock:
            self._closed = True
            timers, self._armed = list(self._armed.values()), {}
        for t in timers:
            t.cancel()
