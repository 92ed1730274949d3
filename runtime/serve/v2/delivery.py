"""Results handed from engine threads to an event loop with one wake-up per burst, not one per request.

``asyncio.wrap_future`` schedules one ``call_soon_threadsafe`` per finished future: a write to the loop's
self-pipe and a handle each, so a batch of N requests finished together costs N wake-ups of the loop.
:func:`wrap` gives the same awaitable (an asyncio future on the running loop that takes the concurrent
future's result, exception or cancellation; cancelling it cancels the concurrent future) but finished
futures go into the loop's :class:`_Mailbox`, and only the first of a burst schedules the drain: the
futures an engine finishes in one loop (a batch's requests) reach the loop in one handle.

Blocking: nothing here blocks; the done-callback runs on whichever thread finishes the future (it takes a
short lock), the drain on the loop.
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from concurrent.futures import Future


class _Mailbox:
    """The finished futures of one loop waiting for its next drain."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._done: list[tuple[asyncio.Future, Future]] = []

    def post(self, target: asyncio.Future, source: Future) -> None:
        """Any thread: ``source`` finished; copied into ``target`` at the loop's next drain."""
        with self._lock:
            self._done.append((target, source))
            first = len(self._done) == 1
        if first:
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:                 # the loop is closed: nobody awaits the target any more
                with self._lock:
                    self._done.clear()

    def _drain(self) -> None:
        with self._lock:
            done, self._done = self._done, []
        for target, source in done:
            _copy(source, target)


def _copy(source: Future, target: asyncio.Future) -> None:
    if target.done():                            # cancelled by its awaiter meanwhile
        return
    if source.cancelled():
        target.cancel()
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


_mailboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox]" = weakref.WeakKeyDictionary()


def wrap(source: Future) -> asyncio.Future:
    """On a running loop: an asyncio future that finishes as ``source`` does (batched hand-over, see the
    module doc); cancelling it cancels ``source``."""
    loop = asyncio.get_running_loop()
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    target = loop.create_future()

    def cancelled(t: asyncio.Future) -> None:
        if t.cancelled():
            source.cancel()

    target.add_done_callback(cancelled)
    source.add_done_callback(lambda s: box.post(target, s))
    return target


__all__ = ["wrap"]
