"""Live defragmentation: which segments to evacuate, in what order, and what the caller is told.

The plan is pure data (tested on its own).  The pool cannot see the arena's layout (other tenants and
raw ``acl.rt.malloc`` memory share it), so compaction works by asking the driver for a replacement and
keeping it only when it lands where it helps:

* Short-lived segments slide DOWN: a group's live blocks are packed into one new, tight segment placed
  at the lowest free range that fits (``PLACEMENT_LOW``); one segment's replacement is kept if it
  starts lower, several segments' always (the next pass slides it into the space they leave).
  Long-lived segments slide UP the same way (``PLACEMENT_HIGH``).
* Groups: sparse small-pool segments of one (stream, lifetime) are packed together up to one small
  segment (2 MiB); large-pool segments move one by one.  Groups are tried from the low end up (short)
  or the high end down (long), so every move fills the hole nearest the arena's end, and the old
  segments are returned at once, which merges their space with the holes next to them.
* Segments holding a pinned block (``Tensor.pin()``) never move; raw driver allocations (``acl.rt``)
  and other tenants' memory are not the pool's and are never touched.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .blocks import LONG, SHORT, SMALL
from .config import ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE


@dataclass(frozen=True)
class SegmentInfo:
    """What the planner needs of one pool segment."""
    ptr: int
    size: int
    stream: int
    kind: str
    lifetime: str
    payload: int        #: bytes of its allocated blocks (rounded block sizes)
    movable: bool       #: holds live blocks and no pinned one


@dataclass(frozen=True)
class Group:
    """Segments whose live blocks go, packed in this order, into one new segment of ``size`` bytes."""
    sources: tuple[int, ...]
    size: int
    stream: int
    kind: str
    lifetime: str


def tight_size(payload: int) -> int:
    """A segment that just holds ``payload``: whole 2 MiB pages beyond 1 MiB (what the arena reserves
    for huge-page allocations anyway), else exact."""
    if payload > SMALL_SIZE:
        return -(-payload // ROUND_LARGE) * ROUND_LARGE
    return payload


def plan(segments: list[SegmentInfo], small_cap: int = SMALL_BUFFER, exact: bool = False) -> list[Group]:
    """The groups to try, in the order to try them.  ``exact``: segments hold one block of exactly its
    bytes (the pool does not cache): each moves alone into a segment of its size."""
    by_class: dict[tuple, list[SegmentInfo]] = {}
    for s in segments:
        if s.movable and s.payload > 0:
            by_class.setdefault((s.lifetime, s.stream, s.kind), []).append(s)
    groups: list[Group] = []
    for (lifetime, stream, kind), segs in by_class.items():
        segs.sort(key=lambda s: s.ptr, reverse=lifetime == LONG)
        cur: list[SegmentInfo] = []
        for s in segs:
            fits = not exact and kind == SMALL and cur and sum(c.payload for c in cur) + s.payload <= small_cap
            if cur and not fits:
                groups.append(_group(cur))
                cur = []
            cur.append(s)
        if cur:
            groups.append(_group(cur))
    if exact:
        groups = [Group(g.sources, sum(s.payload for s in segments if s.ptr in g.sources), g.stream, g.kind,
                        g.lifetime) for g in groups]
    short = sorted((g for g in groups if g.lifetime != LONG), key=lambda g: min(g.sources))
    long_ = sorted((g for g in groups if g.lifetime == LONG), key=lambda g: -max(g.sources))
    return short + long_


def _group(segs: list[SegmentInfo]) -> Group:
    s0 = segs[0]
    return Group(tuple(s.ptr for s in segs), tight_size(sum(s.payload for s in segs)), s0.stream, s0.kind,
                 s0.lifetime)


def better(group: Group, new_ptr: int) -> bool:
    """Whether a replacement at ``new_ptr`` helps: several segments become one (wherever it lands: the
    next pass slides it into the space they leave), or one segment moves toward its end of the arena."""
    if len(group.sources) > 1:
        return True
    if group.lifetime == LONG:
        return new_ptr > min(group.sources)
    return new_ptr < max(group.sources)


@dataclass(frozen=True)
class DefragReport:
    """What ``Device.defragment()`` did.  ``pause_s`` is the host time the call took (the caller's work
    on this device waits that long); ``copy_s`` the part spent copying on the device."""
    bytes_moved: int = 0
    blocks_moved: int = 0
    segments_moved: int = 0
    segments_released: int = 0           #: cached segments returned to the driver (moved ones included)
    graphs_rebound: int = 0
    passes: int = 0
    pause_s: float = 0.0
    copy_s: float = 0.0
    arena_free_before: int = 0
    arena_largest_free_before: int = 0
    arena_fragmentation_before: float = 0.0
    arena_free_after: int = 0
    arena_largest_free_after: int = 0
    arena_fragmentation_after: float = 0.0
    pool_fragmentation_before: float = 0.0
    pool_fragmentation_after: float = 0.0
    moves: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)   #: (old, new, nbytes)

    @property
    def copy_gbs(self) -> float:
        """Device-to-device copy throughput of the moves (GB/s)."""
        return self.bytes_moved / self.copy_s / 1e9 if self.copy_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("moves")
        d["copy_gbs"] = self.copy_gbs
        return d

    def __str__(self) -> str:
        return (f"defragment: moved {self.blocks_moved} blocks ({self.bytes_moved} B) out of {self.segments_moved} "
                f"segments, released {self.segments_released} segments, rebound {self.graphs_rebound} graphs "
                f"in {self.pause_s * 1e3:.1f} ms; arena fragmentation {self.arena_fragmentation_before:.3f} -> "
                f"{self.arena_fragmentation_after:.3f} (largest free {self.arena_largest_free_before} -> "
                f"{self.arena_largest_free_after} B), pool {self.pool_fragmentation_before:.3f} -> "
                f"{self.pool_fragmentation_after:.3f}")


__all__ = ["SegmentInfo", "Group", "plan", "better", "tight_size", "DefragReport", "SHORT", "LONG"]
