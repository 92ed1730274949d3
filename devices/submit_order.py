"""Ops that may arrive twice: the numbered runs of a submission, and the device's filter that queues each once.

A host thread that waits on a stream or event takes the ops queued so far and sends them *with* the wait (one
round trip for "submit, then wait").  Until that call has returned, another thread's submit or query could
overtake them -- a launch queued after them would run before them, a query of an event they record would
not see it.  So the runtime numbers a wait's ops (one counter per launch queue, a random ``session`` per
queue) and, while the wait is in progress, the next flush or wait of another thread sends them again first
(:class:`OpOrder` says which numbers a message holds and from which number on they are the sender's own).
Whichever copy arrives first is queued; the device drops the other (:class:`OrderFilter`: per caller and
session, the highest number any copy brought and the numbers below it none has brought yet -- a message
overtaken by a later one whose carried copy was lost is still queued when it arrives).  Ops sent with no wait
in progress go unnumbered and are queued as they come.

Each run of a message is queued as a batch of its own: a run that fails validation stops there, as any batch
does, and its batch counts as queued to its end (``OpOrder.ends``, also where a split message cut it), so no
copy queues any of it again.  The error goes to the run's sender: at once when the message is the sender's
own, else (another thread carried it) when the sender's own copy arrives; the carrier's own ops still queue.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from .errors import AclError, InvalidParamError

SESSIONS_PER_CALLER = 64   #: sessions a filter remembers per caller (its least recently used go first)
FAILED_PER_SESSION = 16    #: carried runs whose failure waits for their sender's copy, per session
GAPS_PER_SESSION = 64      #: ranges of numbers overtaken by later ones, per session (the oldest go first)


@dataclass(frozen=True)
class OpOrder:
    """The numbers of a message's ops: ``runs`` of (first number, count) cover them in order, ascending;
    numbers from ``own_from`` on are the sender's own ops (0: none are, the message only carries others').
    ``ends``: the last number of the batch each run belongs to (a message split in several cuts batches;
    empty: each run is a whole batch)."""
    session: int
    runs: tuple[tuple[int, int], ...]
    own_from: int = 0
    ends: tuple[int, ...] = ()

    def __post_init__(self):
        if not self.runs:
            raise InvalidParamError("op order: no runs")
        if not self.ends:
            object.__setattr__(self, "ends", tuple(f + c - 1 for f, c in self.runs))
        if len(self.ends) != len(self.runs):
            raise InvalidParamError("op order: a batch end for each run")
        last = 0
        for (first, count), end in zip(self.runs, self.ends):
            if first <= last or count < 1 or end < first + count - 1:
                raise InvalidParamError(f"op order runs must ascend and hold ops: {self.runs}, ends {self.ends}")
            last = end

    @property
    def count(self) -> int:
        return sum(c for _, c in self.runs)

    @property
    def carried(self) -> int:
        """How many leading ops are other senders' (numbered below ``own_from``)."""
        if not self.own_from:
            return self.count
        return sum(min(c, max(0, self.own_from - f)) for f, c in self.runs)

    def parts(self, sizes: Sequence[int]) -> list["OpOrder"]:
        """This order cut into consecutive parts of ``sizes`` ops (a message split in several)."""
        if sum(sizes) != self.count or any(s < 1 for s in sizes):
            raise InvalidParamError(f"op order numbers {self.count} ops, the parts hold {list(sizes)}")
        out, runs, i = [], list(self.runs), 0
        for size in sizes:
            part: list[tuple[int, int]] = []
            ends: list[int] = []
            while size:
                first, count = runs[i]
                take = min(size, count)
                part.append((first, take))
                ends.append(self.ends[i])
                size -= take
                if take == count:
                    i += 1
                else:
                    runs[i] = (first + take, count - take)
            out.append(OpOrder(self.session, tuple(part), self.own_from, tuple(ends)))
        return out


@dataclass
class _Session:
    high: int = 0                                                  #: the highest number any copy brought
    #: numbers below ``high`` that no copy has brought yet (first, last), ascending: a message overtaken
    #: by a later one (its carried copy lost) is still queued when it arrives, once
    gaps: list[tuple[int, int]] = field(default_factory=list)
    failed: list[tuple[int, int, AclError]] = field(default_factory=list)   #: (first, last, error) of carried runs
    lock: threading.Lock = field(default_factory=threading.Lock)  #: held while its messages queue

    def claim(self, first: int, last: int) -> list[tuple[int, int]]:
        """Mark numbers [first, last] brought; returns the sub-ranges no copy had brought before."""
        new: list[tuple[int, int]] = []
        if first <= self.high:
            kept: list[tuple[int, int]] = []
            for a, b in self.gaps:
                lo, hi = max(a, first), min(b, last)
                if lo > hi:
                    kept.append((a, b))
                    continue
                new.append((lo, hi))
                if a < lo:
                    kept.append((a, lo - 1))
                if hi < b:
                    kept.append((hi + 1, b))
            self.gaps = kept
        if last > self.high:
            start = max(first, self.high + 1)
            if start > self.high + 1:
                self.gaps.append((self.high + 1, start - 1))
                del self.gaps[:-GAPS_PER_SESSION]
            new.append((start, last))
            self.high = last
        return new


class OrderFilter:
    """Queues each numbered op once (:meth:`queue`); state per caller, dropped with it (:meth:`drop`)."""

    def __init__(self, sessions: int = SESSIONS_PER_CALLER):
        self._callers: dict[Hashable, OrderedDict[int, _Session]] = {}
        self._sessions = sessions
        self._lock = threading.Lock()

    def _session(self, caller: Hashable, session: int) -> _Session:
        with self._lock:
            table = self._callers.setdefault(caller, OrderedDict())
            s = table.get(session)
            if s is None:
                s = table[session] = _Session()
                while len(table) > self._sessions:     # only this caller's own sessions make room
                    table.popitem(last=False)
            else:
                table.move_to_end(session)
            return s

    def drop(self, caller: Hashable) -> None:
        """Forget a departed caller's sessions."""
        with self._lock:
            self._callers.pop(caller, None)

    def queue(self, caller: Hashable, ops: Sequence, order: OpOrder, enqueue: Callable[[Sequence], None]) -> int:
        """``enqueue`` each run's ops not queued before (a batch a run; blocks the host behind other messages
        of the same caller and session, so they queue in number order); returns how many it was given.
        Raises the validation error of a run of the sender's own (``order.own_from``), also one that another
        message carried and that failed there."""
        if order.count != len(ops):
            raise InvalidParamError(f"op order numbers {order.count} ops, the message holds {len(ops)}")
        s = self._session(caller, order.session)
        own = order.own_from or (1 << 64)
        queued = 0
        err: AclError | None = None
        with s.lock:
            i = 0
            for (first, count), end in zip(order.runs, order.ends):
                last = first + count - 1
                new = s.claim(first, last)                    # counted before queuing: not retried by a copy
                fresh = [op for a, b in new for op in ops[i + a - first:i + b - first + 1]] \
                    if len(new) != 1 or new[0] != (first, last) else ops[i:i + count]
                i += count
                mine = first >= own
                if len(fresh) < count and mine and err is None:   # some of my run came in another message:
                    err = _take_failed(s, first, last)            # did it fail there?
                if not fresh:
                    continue
                try:
                    enqueue(fresh)
                    queued += len(fresh)
                except AclError as e:
                    s.claim(first, end)                       # nothing of the batch from the failing op on
                    if mine:
                        err = err or e
                    else:
                        s.failed.append((first, end, _bare(e)))
                        del s.failed[:-FAILED_PER_SESSION]
        if err is not None:
            raise err
        return queued


def _take_failed(s: _Session, first: int, last: int) -> AclError | None:
    """The error of a carried batch within [first, last] that failed, removed (it goes to one sender)."""
    for k, (a, b, e) in enumerate(s.failed):
        if a <= last and b >= first:
            del s.failed[k]
            return e
    return None


def _bare(e: AclError) -> AclError:
    """``e`` without its traceback and chained exceptions (kept, they would hold the message's ops)."""
    e.__context__ = e.__cause__ = None
    return e.with_traceback(None)
