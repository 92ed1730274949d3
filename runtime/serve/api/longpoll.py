"""Long polls of the History (``GET /admin/history/latest?after=T&wait_s=S``) that hold no thread.

A waiting request is a coroutine parked on an :class:`asyncio.Event`: the History's recording thread wakes
it through :meth:`History.subscribe` (``loop.call_soon_threadsafe``), so any number of dashboards can
long-poll without taking threads from the event loop's default executor -- which ``/metrics`` and every
admin action (fallback, restore, throttle, ...) run on.  Only the check "is there a newer sample?" (one
short SQLite read) runs on that executor, once per wake-up.

:meth:`LongPolls.close` ends every poll in flight at once (each answers with the newest samples as they
are) and makes later ones answer without waiting: the server calls it when it stops, so a stop never waits
for a poll's ``wait_s``.
"""
from __future__ import annotations

import asyncio
import threading


#: the longest a ``GET /admin/history/latest?wait_s=`` long poll (or an ``/admin/state?long_polls=`` wait)
#: may wait: under common proxies' idle timeouts and well below the server's graceful-shutdown timeout
#: (:data:`runtime.serve.server.GRACEFUL_SHUTDOWN_S`, 30 s) -- a stop ends the polls in flight anyway
#: (:meth:`LongPolls.close`), this bounds one that a stop somehow missed
MAX_HISTORY_WAIT_S = 20.0


class LongPolls:
    """The long polls in flight on one server; thread-safe :meth:`close` and :meth:`waiting`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._polls: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._next = 0
        #: woken whenever a poll parks (:meth:`parked`)
        self._watchers: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def waiting(self) -> int:
        """How many polls are waiting now (registered with the History, not yet answered)."""
        with self._lock:
            return len(self._polls)

    async def parked(self, n: int, wait_s: float) -> bool:
        """Wait (on this event loop, holding no thread) until at least ``n`` polls are parked, or ``wait_s``
        passes; whether they are (``GET /admin/state?long_polls=N&wait_s=S``: an operator's or a test's
        gate -- a tick recorded from then on is what wakes those polls)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        ev = asyncio.Event()
        while True:
            ev.clear()
            with self._lock:
                if len(self._polls) >= n:
                    return True
                left = deadline - loop.time()
                if left <= 0:
                    return False
                key = self._next
                self._next += 1
                self._watchers[key] = (loop, ev)
            try:
                await asyncio.wait_for(ev.wait(), left)
            except asyncio.TimeoutError:
                pass
            finally:
                with self._lock:
                    self._watchers.pop(key, None)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every poll in flight now (from any thread) and every later one at once."""
        with self._lock:
            self._closed = True
            polls = list(self._polls.values())
        for loop, ev in polls:
            _set_soon(loop, ev)

    async def wait_newer(self, history, after: float | None, wait_s: float, scope: str = "") -> bool:
        """Wait (on this event loop, holding no thread) until ``history`` has a sample in ``scope`` newer
        than ``after``, or ``wait_s`` passes, or :meth:`close` (or the history's); whether it has one.  The
        poll counts in :meth:`waiting` while it is parked (it has checked and found no newer sample): a tick
        recorded from then on is what wakes it."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        unsubscribe = history.subscribe(lambda: _set_soon(loop, woken))
        deadline = loop.time() + wait_s
        try:
            while True:
                woken.clear()                  # before the check: a tick recorded after it sets it again
                if await loop.run_in_executor(None, history.newer_than, after, scope):
                    return True
                left = deadline - loop.time()
                with self._lock:
                    if self._closed or left <= 0 or history.closed:
                        return False
                    key = self._next
                    self._next += 1
                    self._polls[key] = (loop, woken)
                    watchers = list(self._watchers.values())
                for wl, wev in watchers:
                    _set_soon(wl, wev)
                try:
                    await asyncio.wait_for(woken.wait(), left)
                except asyncio.TimeoutError:
                    pass
                finally:
                    with self._lock:
                        self._polls.pop(key, None)
        finally:
            unsubscribe()


def _set_soon(loop: asyncio.AbstractEventLoop, ev: asyncio.Event) -> None:
    """``ev.set()`` on ``loop`` from any thread; nothing once the loop is closed."""
    try:
        loop.call_soon_threadsafe(ev.set)
    except RuntimeError:                       # the loop is closed: nobody waits any more
        pass


__all__ = ["LongPolls"]
