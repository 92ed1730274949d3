"""The batcher's queues, Triton's ``PriorityQueue`` of ``PolicyQueue``s: one queue per priority level
(1 is served first; a model without priority levels has the one level 0), each under its
:class:`~runtime.serve.modelrepo.spec.QueuePolicy`:

- admission: a level holding ``max_queue_size`` requests (0: unbounded) refuses the next one
  (:class:`~runtime.serve.engine.errors.QueueFull`); a priority outside the model's levels, or rows that are
  not a positive integer, are an :class:`~runtime.serve.engine.errors.InvalidRequest`;
- timeouts: a request's deadline is its arrival plus its level's timeout (:meth:`QueuePolicy.timeout_us`);
  once the clock reaches it, a REJECT level drops it (it is handed back by :meth:`LevelQueues.expire`),
  a DELAY level moves it behind every request of its level that has not timed out (it stays served before
  lower levels, and never times out again);
- order (:meth:`LevelQueues.ordered`): levels highest first; within a level, arrival order, then the
  delayed requests in the order they timed out.

Pure, host-only, not thread-safe (the engine holds its lock around every call).
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Iterator

from ..engine.errors import InvalidRequest, QueueFull
from ..modelrepo.spec import DynamicBatching
from .request import Queued, Request


class _Level:
    __slots__ = ("policy", "main", "delayed")

    def __init__(self, policy):
        self.policy = policy
        self.main: deque[Queued] = deque()
        self.delayed: deque[Queued] = deque()

    def __len__(self) -> int:
        return len(self.main) + len(self.delayed)


class LevelQueues:
    def __init__(self, batching: DynamicBatching):
        self.batching = batching
        self._levels = {lv: _Level(batching.queue_policy(lv)) for lv in batching.levels}
        self._ids = itertools.count()

    def __len__(self) -> int:
        return sum(len(q) for q in self._levels.values())

    def level_of(self, priority) -> int:
        """The level of a request's ``priority`` (0: the default level)."""
        b = self.batching
        if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
            raise InvalidRequest(f"priority must be an integer >= 0, got {priority!r}", "priority")
        if priority == 0:
            return b.default_priority_level
        if b.priority_levels == 0:
            raise InvalidRequest(f"priority {priority}: this model has no priority levels (use 0)", "priority")
        if priority > b.priority_levels:
            raise InvalidRequest(f"priority {priority} is out of range: this model has priority levels "
                                 f"1..{b.priority_levels} (1 is the highest; 0: the default, "
                                 f"{b.default_priority_level})", "priority")
        return priority

    def count(self, level: int) -> int:
        """Requests waiting at ``level`` (delayed ones included; 0 for a level the model does not have)."""
        lq = self._levels.get(level)
        return len(lq) if lq is not None else 0

    def admit(self, request: Request, now: float) -> Queued:
        """Queue ``request`` at ``now``; InvalidRequest / QueueFull as the module says."""
        if not isinstance(request.timeout_us, int) or isinstance(request.timeout_us, bool) or request.timeout_us < 0:
            raise InvalidRequest(f"timeout must be an integer number of microseconds >= 0, got "
                                 f"{request.timeout_us!r}", "timeout")
        level = self.level_of(request.priority)
        lq = self._levels[level]
        cap = lq.policy.max_queue_size
        if cap and len(lq) >= cap:
            which = f"priority level {level}" if self.batching.priority_levels else "this model"
            raise QueueFull(f"exceeds the maximum queue size: the queue of {which} holds {cap} requests "
                            "(max_queue_size); retry later")
        t_us = lq.policy.timeout_us(request.timeout_us)
        q = Queued(next(self._ids), request, level, now, now + t_us / 1e6 if t_us else None)
        lq.main.append(q)
        return q

    def expire(self, now: float) -> list[Queued]:
        """Apply the levels' timeout actions at ``now``: the timed-out requests of REJECT levels, removed
        (in level, then arrival order); those of DELAY levels move to their level's delayed queue."""
        out = []
        for lq in self._levels.values():
            if not any(q.deadline is not None and now >= q.deadline for q in lq.main):
                continue
            keep = deque()
            for q in lq.main:
                if q.deadline is None or now < q.deadline:
                    keep.append(q)
                elif lq.policy.timeout_action == "DELAY":
                    lq.delayed.append(q)
                else:
                    out.append(q)
            lq.main = keep
        return out

    def ordered(self) -> Iterator[Queued]:
        """Every queued request in serving order (see the module); a view, do not change the queues while
        iterating."""
        for level in sorted(self._levels):
            lq = self._levels[level]
            yield from lq.main
            yield from lq.delayed

    def closest_deadline(self) -> float | None:
        """The earliest deadline of a request that can still time out (delayed ones cannot)."""
        return min((q.deadline for lq in self._levels.values() for q in lq.main if q.deadline is not None),
                   default=None)

    def remove(self, ids: set[int]) -> list[Queued]:
        """Take the requests with these ids out of the queues (those found, in serving order)."""
        out = [q for q in self.ordered() if q.id in ids]
        if out:
            for lq in self._levels.values():
                lq.main = deque(q for q in lq.main if q.id not in ids)
                lq.delayed = deque(q for q in lq.delayed if q.id not in ids)
        return out

    def drain(self) -> list[Queued]:
        """Every queued request, in serving order; the queues are empty after."""
        out = list(self.ordered())
        for lq in self._levels.values():
            lq.main.clear()
            lq.delayed.clear()
        return out


__all__ = ["LevelQueues"]
