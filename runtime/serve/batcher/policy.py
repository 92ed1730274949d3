"""The dynamic batcher: which queued requests run together, and when -- Triton's dynamic batcher
(``DynamicBatchScheduler::GetDynamicBatch``) with the seed's ``min_batch`` and atc's batch gears.

Each request brings its own rows (its batch axis); a request is never split across executions.  Forming a
batch walks the queued requests in serving order (:mod:`.queues`: priority levels highest first) and
takes them while their rows fit ``max_batch``; it stops at the first that does not fit, or that has another
key than the first's (an image-size model's (height, width): as Triton's, a batch holds one shape), and
no request overtakes another.  Let ``max_pref`` be the largest preferred batch size (``max_batch`` without
preferred sizes), ``best`` the longest prefix whose rows are a preferred size -- or, once the next request
would go past ``max_pref``, the prefix before it -- and ``due`` the oldest taken request's arrival plus
``max_queue_delay``.  Then, at clock ``now``:

1. ``best`` exists, ``now < due`` and ``best`` has at least ``min_batch`` rows: run ``best``;
2. the batch cannot grow (the next request does not fit ``max_batch``) or has ``max_pref`` rows: run it;
3. ``now >= due``, or there is no queue delay: run what was taken;
4. otherwise wait: :class:`Next` says until when (``due``, or an earlier request deadline).

The batch executes at the smallest gear that holds its rows (:func:`.plan.gear_for`); the padding rows
belong to no request (:class:`.plan.Batch`).  A request with more rows than ``max_batch`` is refused at
admission, so every admitted request fits a gear.  A model without dynamic batching runs one request per
execution, in order.

Time is the caller's: every call takes ``now`` (seconds on any monotonic clock, e.g. ``time.monotonic()``;
tests pass numbers).  Timed-out requests found while forming a batch are held until :meth:`expire` hands
them back, so every admitted request leaves exactly once: in a batch, from :meth:`expire`, :meth:`cancel`
or :meth:`drain`.  Pure and host-only; not thread-safe (the engine calls it under its lock).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from devices.errors import InvalidParamError

from ..engine.errors import InvalidRequest
from ..modelrepo.spec import DynamicBatching, ModelConfig
from .plan import Batch
from .queues import LevelQueues
from .request import Queued, Request


@dataclass(frozen=True)
class Next:
    """What :meth:`DynamicBatcher.next_batch` decided: a batch to run now, or none and ``wake_at`` -- the
    clock at which to ask again if no request arrives before (None: nothing to wait for)."""
    batch: Batch | None = None
    wake_at: float | None = None


class DynamicBatcher:
    """``max_batch``: the most rows an execution takes (the model's ``max_batch_size``); ``gears``: the
    compiled batch sizes (() runs any size as it is); ``batching``: the model's ``dynamic_batching`` (None:
    one request per execution)."""

    def __init__(self, max_batch: int, gears: Sequence[int] = (), batching: DynamicBatching | None = None):
        gears = tuple(sorted(set(gears)))
        if not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidParamError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if gears and gears[-1] < max_batch:
            raise InvalidParamError(f"max_batch {max_batch} is larger than the largest batch gear {gears[-1]}")
        b = batching or DynamicBatching()
        if b.preferred_batch_size and b.preferred_batch_size[-1] > max_batch or b.min_batch > max_batch:
            raise InvalidParamError(f"preferred batch sizes and min_batch must be <= max_batch {max_batch}")
        self.max_batch, self.gears, self.batching = max_batch, gears, batching
        self._single = batching is None
        self._pref = set(b.preferred_batch_size)
        self._max_pref = b.preferred_batch_size[-1] if b.preferred_batch_size else max_batch
        self._delay = b.max_queue_delay_microseconds / 1e6
        self._min = b.min_batch
        self._queues = LevelQueues(b)
        self._timed_out: list[Queued] = []

    @classmethod
    def for_model(cls, config: ModelConfig, gears: Sequence[int] = ()) -> "DynamicBatcher":
        """The batcher of a model configuration and a version's gears (:func:`~runtime.serve.modelrepo.batch_gears`);
        a model without a batch axis (``max_batch_size`` 0) runs one request (of 1 row) per execution."""
        if config.max_batch_size == 0:
            return cls(1)
        return cls(config.max_batch_size, gears, config.dynamic_batching)

    def __len__(self) -> int:
        """Requests waiting (the timed-out ones :meth:`expire` has not handed back included)."""
        return len(self._queues) + len(self._timed_out)

    def level_of(self, priority) -> int:
        """The priority level a request of ``priority`` queues at (InvalidRequest for a bad priority)."""
        return self._queues.level_of(priority)

    def waiting_at(self, level: int) -> int:
        """Requests waiting at priority ``level`` (those :meth:`expire` has not handed back excluded)."""
        return self._queues.count(level)

    # ------------------------------------------------------------------------------------------ calls
    def add(self, request: Request, now: float) -> Queued:
        """Admit ``request`` at ``now``, or refuse it: InvalidRequest (rows not in 1..max_batch, a bad
        priority or timeout), QueueFull (its level's ``max_queue_size``)."""
        rows = request.rows
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise InvalidRequest(f"a request needs at least one row on its batch axis, got {rows!r}", "inputs")
        if rows > self.max_batch:
            raise InvalidRequest(f"the request's batch size {rows} is larger than the model's max_batch_size "
                                 f"{self.max_batch}", "inputs")
        return self._queues.admit(request, now)

    def expire(self, now: float) -> tuple[Queued, ...]:
        """The requests that timed out under a REJECT policy by ``now`` (each once; fail them with
        :meth:`RequestTimedOut.of <.request.RequestTimedOut.of>`); DELAY ones move back in the queue."""
        out = self._timed_out + self._queues.expire(now)
        self._timed_out = []
        return tuple(out)

    def cancel(self, request_id: int) -> Queued | None:
        """Take a waiting request out (its client went away); None if it is not waiting."""
        found = self._queues.remove({request_id})
        return found[0] if found else None

    def drain(self) -> tuple[Queued, ...]:
        """Every waiting request (timed-out ones included), in serving order; the batcher is empty after."""
        out = self._timed_out + self._queues.drain()
        self._timed_out = []
        return tuple(out)

    def next_batch(self, now: float) -> Next:
        """The batch to run at ``now`` (taken out of the queue), or when to ask again (see the module)."""
        self._timed_out += self._queues.expire(now)
        order = self._queues.ordered()
        first = next(order, None)
        if first is None:
            return Next()
        if self._single:
            return Next(self._take([first], now))
        taken, best, full = self._gather(first, order)
        rows = sum(q.rows for q in taken)
        due = min(q.enqueued for q in taken) + self._delay if self._delay else None
        waited = due is not None and now >= due
        if best and not waited and sum(q.rows for q in taken[:best]) >= self._min:
            return Next(self._take(taken[:best], now))
        if full or rows >= self._max_pref or due is None or waited:
            return Next(self._take(taken, now))
        deadline = self._queues.closest_deadline()
        return Next(None, due if deadline is None else min(due, deadline))

    # ------------------------------------------------------------------------------------------ helpers
    def _gather(self, first: Queued, order: Iterator[Queued]) -> tuple[list[Queued], int, bool]:
        """The requests that fit, in order; ``best`` (how many of them form the batch to run early, 0:
        none) and whether the next request did not fit ``max_batch`` or has another key (an image model's
        other size: the batch cannot grow past it)."""
        taken, rows = [first], first.rows
        best = 1 if rows in self._pref else 0
        for q in order:
            if q.request.key != first.request.key:
                return taken, best, True
            if rows + q.rows > self._max_pref and not best:
                best = len(taken)
            if rows + q.rows > self.max_batch:
                return taken, best, True
            taken.append(q)
            rows += q.rows
            if rows in self._pref:
                best = len(taken)
        return taken, best, False

    def _take(self, requests: list[Queued], now: float) -> Batch:
        self._queues.remove({q.id for q in requests})
        return Batch.of(requests, self.gears, now)


__all__ = ["DynamicBatcher", "Next"]
