"""Ops that may arrive twice: the numbered runs of a submission, and the device's filter that queues each once.

A host thread that waits on a stream or event takes the ops queued so far and sends them *with* the wait (one
round trip for "submit, then wait").  Until that call has delivered them, another thread's submit or query
could overtake them -- a launch queued after them would run before them, a query of an event they record
would not see it.  So the runtime numbers its ops (one counter per launch queue, a random ``session`` per
queue) and, while a wait's ops are on their way, sends them again in front of any later submission
(:class:`OpOrder` says which numbers a message holds).  Whichever copy arrives first is queued; the device
drops the other (:class:`OrderFilter`: per caller and session, the highest number queued so far).  Ops that
no other message repeats are sent without numbers and queued as they come.

A numbered message that fails validation part-way is still counted as queued up to its end (nothing of it
from the failing op on is queued, as for any batch): the copy that arrives later does not queue it again,
and the error goes to whichever caller's message arrived first.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from .errors import InvalidParamError

MAX_SESSIONS = 4096      #: sessions a filter remembers (least recently used go first)


@dataclass(frozen=True)
class OpOrder:
    """The numbers of a message's ops: ``runs`` of (first number, count) cover them in order, ascending."""
    session: int
    runs: tuple[tuple[int, int], ...]

    def __post_init__(self):
        last = 0
        for first, count in self.runs:
            if first <= last or count < 1:
                raise InvalidParamError(f"op order runs must ascend and hold ops: {self.runs}")
            last = first + count - 1

    @property
    def count(self) -> int:
        return sum(c for _, c in self.runs)

    def parts(self, sizes: Sequence[int]) -> list["OpOrder"]:
        """This order cut into consecutive parts of ``sizes`` ops (a message split in several)."""
        if sum(sizes) != self.count:
            raise InvalidParamError(f"op order numbers {self.count} ops, the message holds {sum(sizes)}")
        out, runs, i = [], list(self.runs), 0
        for size in sizes:
            part: list[tuple[int, int]] = []
            while size:
                first, count = runs[i]
                take = min(size, count)
                part.append((first, take))
                size -= take
                if take == count:
                    i += 1
                else:
                    runs[i] = (first + take, count - take)
            out.append(OpOrder(self.session, tuple(part)))
        return out


class OrderFilter:
    """Queues each numbered op once: :meth:`queue` hands ``enqueue`` the ops of a message not queued before."""

    def __init__(self, sessions: int = MAX_SESSIONS):
        self._high: OrderedDict[Hashable, int] = OrderedDict()
        self._sessions = sessions
        self._lock = threading.Lock()

    def queue(self, caller: Hashable, ops: Sequence, order: OpOrder, enqueue: Callable[[Sequence], None]) -> int:
        """``enqueue`` (called under this filter's lock, so numbered messages queue in number order) the ops
        of ``order`` above ``caller``'s highest number so far; returns how many it was given."""
        if order.count != len(ops):
            raise InvalidParamError(f"op order numbers {order.count} ops, the message holds {len(ops)}")
        key = (caller, order.session)
        with self._lock:
            high = self._high.get(key, 0)
            fresh: list = []
            i = 0
            for first, count in order.runs:
                fresh.extend(ops[i + max(0, high + 1 - first):i + count])     # the numbers above ``high``
                i += count
            last = order.runs[-1][0] + order.runs[-1][1] - 1 if order.runs else 0
            self._high[key] = max(high, last)        # counted before queuing: a failed copy is not retried
            self._high.move_to_end(key)
            while len(self._high) > self._sessions:
                self._high.popitem(last=False)
            if fresh:
                enqueue(fresh)
            return len(fresh)
