"""Vector clocks: the happens-before order of one client's host and device streams.

Every *agent* -- the host (:data:`HOST`) and each stream -- has a vector clock (a dict agent -> count;
missing entries are 0).  An access by agent ``a`` at clock ``n`` (its *epoch*) happens before an access
whose agent's clock ``V`` has ``V[a] >= n``.  The edges (:class:`Clocks`):

- stream order: a task of stream ``s`` gets epoch ``V_s[s] + 1`` (:meth:`Clocks.issue`);
- the host issues every task: the task's stream first learns what the host knows (what the host did
  before the enqueue happens before the task), then the host ticks (what it does after does not);
- an event record snapshots its stream's clock; a stream that waits on it, or the host that
  synchronizes on it (or sees it complete through a query), joins that snapshot (:meth:`Clocks.acquire`);
- a stream synchronize (or a successful stream query) joins the stream's clock into the host's; a device
  synchronize joins every stream of the device.

Everything here is plain data; the caller (:mod:`runtime.sanitize.tracker`) holds the session lock.
"""
from __future__ import annotations

#: the host's agent id
HOST = 0


def join(into: dict, other: dict) -> None:
    """``into := max(into, other)`` entry by entry."""
    get = into.get
    for k, v in other.items():
        if get(k, 0) < v:
            into[k] = v


def happens_before(agent: int, clock: int, vc: dict) -> bool:
    """Whether the access of ``agent`` at ``clock`` happens before anything of clock ``vc``."""
    return vc.get(agent, 0) >= clock


class Clocks:
    """The vector clocks of one client: the host's and one per stream (an agent id each)."""

    def __init__(self) -> None:
        self._next = HOST + 1
        self.vc: dict[int, dict[int, int]] = {HOST: {HOST: 1}}

    @property
    def host(self) -> dict[int, int]:
        return self.vc[HOST]

    def new_agent(self) -> int:
        """A new stream's agent id (its clock starts empty: it knows nothing yet)."""
        a = self._next
        self._next += 1
        self.vc[a] = {}
        return a

    def host_snapshot(self) -> dict[int, int]:
        """What the host knows now (kept with a task whose ordering is decided later)."""
        return dict(self.vc[HOST])

    def issue(self, agent: int, host_vc: dict[int, int] | None = None) -> int:
        """The host issued a task to stream ``agent`` (knowing ``host_vc``, default: what it knows now):
        the stream learns it and ticks; returns the task's epoch.  Call :meth:`host_released` once per
        host call that issued tasks."""
        v = self.vc[agent]
        join(v, self.vc[HOST] if host_vc is None else host_vc)
        n = v.get(agent, 0) + 1
        v[agent] = n
        return n

    def host_released(self) -> None:
        """The host handed work to the device: its later accesses are not ordered before that work."""
        h = self.vc[HOST]
        h[HOST] += 1

    def acquire(self, agent: int, vc: dict[int, int]) -> None:
        """Agent ``agent`` (a stream, or :data:`HOST`) learns everything ``vc`` knows."""
        join(self.vc[agent], vc)

    def snapshot(self, agent: int) -> dict[int, int]:
        return dict(self.vc[agent])
