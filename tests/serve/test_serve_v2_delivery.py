"""runtime.serve.v2.delivery: a batch's finished requests reach the event loop in one wake-up, each with
its own outcome (result, error, cancellation), and an awaiter that gives up cancels its request."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from runtime.serve.v2 import delivery

pytestmark = pytest.mark.serve


def _counting_loop():
    """A real event loop whose cross-thread wake-ups are counted."""
    loop = asyncio.new_event_loop()
    calls: list = []
    plain = loop.call_soon_threadsafe

    def counted(cb, *args, **kw):
        calls.append(cb)
        return plain(cb, *args, **kw)

    loop.call_soon_threadsafe = counted          # type: ignore[method-assign]
    return loop, calls


def test_a_burst_of_outcomes_reaches_the_loop_in_one_wakeup_each_its_own():
    loop, calls = _counting_loop()

    async def main():
        sources = [Future() for _ in range(8)]
        targets = [delivery.wrap(f) for f in sources]

        def engine():                            # one batch finished on another thread
            for i, f in enumerate(sources[:6]):
                f.set_result(i * 10)
            sources[6].set_exception(ValueError("row 6 failed"))
            sources[7].cancel()

        t = threading.Thread(target=engine)
        t.start()
        t.join()                                 # the loop is held meanwhile: the whole batch is posted first
        return await asyncio.gather(*targets, return_exceptions=True)

    try:
        out = loop.run_until_complete(main())
    finally:
        loop.close()
    assert out[:6] == [0, 10, 20, 30, 40, 50]
    assert isinstance(out[6], ValueError) and str(out[6]) == "row 6 failed"
    assert isinstance(out[7], asyncio.CancelledError)
    assert len(calls) == 1                       # asyncio.wrap_future would have scheduled 8


def test_giving_up_on_the_awaitable_cancels_the_request_and_a_late_result_is_dropped():
    loop, _ = _counting_loop()
    errors: list = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

    async def main():
        queued, running = Future(), Future()
        running.set_running_or_notify_cancel()   # its batch already started: it cannot be cancelled
        a, b = delivery.wrap(queued), delivery.wrap(running)
        a.cancel()
        b.cancel()
        await asyncio.sleep(0)                   # a yield: the done-callbacks scheduled by cancel() run
        running.set_result("late")               # the engine finishes it anyway
        await asyncio.sleep(0)                   # a yield: the drain scheduled by the result runs
        await asyncio.sleep(0)
        return queued.cancelled(), running.cancelled(), a.cancelled(), b.cancelled()

    try:
        assert loop.run_until_complete(main()) == (True, False, True, True)
    finally:
        loop.close()
    assert errors == []                          # the late result went nowhere, quietly


def test_a_source_already_done_is_delivered_too():
    async def main():
        src = Future()
        src.set_result("ready")
        return await delivery.wrap(src)

    assert asyncio.run(main()) == "ready"
