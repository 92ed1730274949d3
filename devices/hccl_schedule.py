"""Collective algorithms as pure schedules: which rank pulls which element range from which peer, when.

A schedule is, per rank, a list of :class:`Phase`; phases are separated by a barrier of all ranks, and
inside a phase each :class:`Step` first waits for named steps of given peers, then performs its pulls
(read a range of a peer's buffer and copy or reduce it into a range of its own buffer), then its pushes
(write a range of its own buffer into the same range of peers' buffers), then signals the peers that
wait for it.  Data moves by *pull* from the peer's memory (the emulated HCCS/RDMA read), so a step's
dependencies are "the peer has finished writing what I read" (read-after-write); the phase barriers rule
out write-after-read across phases, and each algorithm is written so that no write-after-read exists
inside a phase.  Only where every peer's memory is writable here (one node: mapped arenas) does the large
AllReduce *push* (``schedule(..., push=True)``): each rank writes every segment of its reduced chunk into
every rank's receive buffer while the segment is still in cache, so the result is read from memory once
instead of once per rank; the closing barrier (every operator ends with one) orders those writes before
any rank returns, and a rank that gives up instead stops them with its peer fence (devices.arena).

Algorithms (reference 3.4): ``ring``, ``hd`` (recursive halving for reduce-scatter, doubling for
all-gather; non-power-of-two counts fold the extra ranks into partners first), ``mesh`` (direct reads,
HCCL's intra-server default) and, for small AllReduce buffers, ``oneshot`` (one round of direct reads
of every input; the latency-optimal choice).  Nothing here touches memory: tests check the schedules symbolically.
"""
from __future__ import annotations

from dataclasses import dataclass

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "barrier")
ALGOS = ("ring", "hd", "mesh", "oneshot")
ONESHOT_MAX_BYTES = 64 << 10
MESH_MAX_RANKS = 16         #: large AllReduces on more ranks use hd (see choose_algo)


@dataclass(frozen=True)
class Pull:
    peer: int            #: rank to read from
    src: str             #: which of the peer's buffers: "send" | "recv" | "work"
    src_off: int         #: element offset
    count: int           #: elements
    dst: str             #: which of my buffers: "recv" | "work"
    dst_off: int
    reduce: bool         #: reduce into dst (True) or copy (False)
    #: a reducing pull with a base reads its left operand from this buffer of the puller (same element
    #: range as ``src``) instead of from ``dst``: ``dst = base op peer`` -- the first reduction of a
    #: chunk, which spares the prologue's copy of the whole send buffer
    base: str | None = None


@dataclass(frozen=True)
class Push:
    peers: tuple[int, ...]   #: ranks whose buffer is written
    buf: str                 #: the same buffer on both sides: "recv"
    off: int                 #: element offset (the same on both sides)
    count: int               #: elements
    #: the engine fuses a push with the step's reducing pulls of the same range: each segment is written
    #: to the peers right after it is reduced, while it is in cache


@dataclass(frozen=True)
class Step:
    tag: str
    waits: tuple[tuple[int, str], ...] = ()     #: (peer, tag) that must have been signalled
    pulls: tuple[Pull, ...] = ()
    signals: tuple[int, ...] = ()               #: peers to tell that this step is done
    pushes: tuple[Push, ...] = ()               #: after the pulls: my ``buf`` range into the peers' same range


@dataclass(frozen=True)
class Phase:
    steps: tuple[Step, ...]


def chunks(count: int, n: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``n`` balanced contiguous (offset, length) chunks."""
    q, r = divmod(count, n)
    out, off = [], 0
    for i in range(n):
        ln = q + (1 if i < r else 0)
        out.append((off, ln))
        off += ln
    return out


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def choose_algo(op: str, n: int, nbytes: int, override: str | None = None) -> str:
    """Pick an algorithm: ``override`` (HCCL_ALGO-style) wins; otherwise small AllReduces use oneshot
    (one round), medium ones hd (log steps), large ones the direct mesh (reduce-scatter out of the send
    buffers, then each chunk copied as soon as its owner has reduced it: the least memory traffic and no
    barrier between the halves); ring is used when halving-doubling does not fit (reduce-scatter/
    all-gather on a non-power-of-two count)."""
    if override:
        algo = override.lower().replace("h-d_r", "hd").replace("h-d", "hd")
        if algo not in ALGOS:
            raise ValueError(f"unknown HCCL algorithm {override!r} (ring | H-D_R | mesh)")
    elif nbytes >= (1 << 20):
        # large: bandwidth-bound.  The mesh reads every input once and copies every result chunk once
        # (2 (n-1)/n of the buffer per rank, like ring and hd) in two rounds; measured 1.6x faster than
        # hd at 64 MiB on 4 ranks (vnpu bench hccl).  Its reduce-to-copy signals are n (n - 1) messages:
        # beyond MESH_MAX_RANKS halving-doubling's partner-only steps (n log n) cost less (on 2 cores,
        # 1 MiB: mesh ahead at 16 ranks, even at 32)
        algo = "mesh" if op != "allreduce" or n <= MESH_MAX_RANKS else "hd"
    elif op == "allreduce" and nbytes <= ONESHOT_MAX_BYTES:
        algo = "oneshot"
    else:
        algo = "hd"
    if algo == "oneshot" and op != "allreduce":
        algo = "hd"
    if algo == "hd" and op in ("allgather", "reducescatter") and n & (n - 1):
        algo = "ring"
    if op not in ("allreduce", "allgather", "reducescatter"):
        algo = "mesh"
    return algo


# ------------------------------------------------------------------------------------ building blocks
def _ring_rs(r: int, n: int, ch: list[tuple[int, int]], buf: str, prefix: str) -> list[Step]:
    """Ring reduce-scatter in place in ``buf``: afterwards rank r holds the full reduction of chunk r."""
    prev, nxt = (r - 1) % n, (r + 1) % n
    steps = []
    for k in range(n - 1):
        c = (r - k - 2) % n
        off, ln = ch[c]
        waits = ((prev, f"{prefix}{k - 1}"),) if k > 0 else ()
        signals = (nxt,) if k < n - 2 else ()      # nobody waits for the last step
        steps.append(Step(f"{prefix}{k}", waits, (Pull(prev, buf, off, ln, buf, off, True),), signals))
    return steps


def _ring_ag(r: int, n: int, ch: list[tuple[int, int]], buf: str, prefix: str) -> list[Step]:
    """Ring all-gather in ``buf``: rank r starts with chunk r; afterwards it has every chunk."""
    prev, nxt = (r - 1) % n, (r + 1) % n
    steps = []
    for j in range(n - 1):
        c = (r - 1 - j) % n
        off, ln = ch[c]
        waits = ((prev, f"{prefix}{j - 1}"),) if j > 0 else ()
        signals = (nxt,) if j < n - 2 else ()      # nobody waits for the last step
        steps.append(Step(f"{prefix}{j}", waits, (Pull(prev, buf, off, ln, buf, off, False),), signals))
    return steps


def _hd_levels(p2: int) -> list[int]:
    d, out = p2 // 2, []
    while d >= 1:
        out.append(d)
        d //= 2
    return out


def _hd_rs(r: int, p2: int, count: int, buf: str, prefix: str) -> tuple[list[Step], tuple[int, int]]:
    """Recursive halving among ranks [0, p2): returns steps and the region rank r ends with."""
    lo, hi = 0, count
    levels = _hd_levels(p2)
    steps = []
    for k, d in enumerate(levels):
        partner = r ^ d
        mid = lo + (hi - lo) // 2
        keep = (lo, mid) if not r & d else (mid, hi)
        nxt_partner = (r ^ levels[k + 1],) if k + 1 < len(levels) else ()
        waits = ((partner, f"{prefix}{k - 1}"),) if k > 0 else ()
        pulls = (Pull(partner, buf, keep[0], keep[1] - keep[0], buf, keep[0], True),) if keep[1] > keep[0] else ()
        steps.append(Step(f"{prefix}{k}", waits, pulls, nxt_partner))
        lo, hi = keep
    return steps, (lo, hi)


def _hd_ag(r: int, p2: int, count: int, buf: str, prefix: str) -> list[Step]:
    """Recursive doubling among ranks [0, p2), the mirror of :func:`_hd_rs`."""
    levels = _hd_levels(p2)
    # regions per level as in the halving
    regions = []
    lo, hi = 0, count
    for d in levels:
        mid = lo + (hi - lo) // 2
        other = (mid, hi) if not r & d else (lo, mid)
        regions.append(other)
        lo, hi = (lo, mid) if not r & d else (mid, hi)
    steps = []
    order = list(range(len(levels)))[::-1]
    for i, k in enumerate(order):
        d = levels[k]
        partner = r ^ d
        other = regions[k]
        waits = ((partner, f"{prefix}{i - 1}"),) if i > 0 else ()
        nxt = (r ^ levels[order[i + 1]],) if i + 1 < len(order) else ()
        pulls = (Pull(partner, buf, other[0], other[1] - other[0], buf, other[0], False),) \
            if other[1] > other[0] else ()
        steps.append(Step(f"{prefix}{i}", waits, pulls, nxt))
    return steps


# ------------------------------------------------------------------------------------ schedules
def schedule(op: str, algo: str, n: int, r: int, count: int, root: int = 0, push: bool = False) -> list[Phase]:
    """The phases rank ``r`` of ``n`` runs for ``op``.  ``count`` is the element count of the op as
    HCCL defines it (AllReduce/Broadcast/Reduce: the whole buffer; AllGather: per-rank send count;
    ReduceScatter: per-rank receive count; AlltoAll: per-peer block).  ``push``: peers' memory is writable
    here (every rank of the communicator on one node); only the mesh AllReduce uses it.

    Buffers: "send" (the user's send buffer), "recv" (the user's receive buffer), "work" (a scratch
    buffer of the full reduce-scatter size, for ring/hd reduce-scatter).  Before phase 0 the engine has
    copied what the op needs into place (see :func:`prologue`)."""
    if not 0 <= r < n:
        raise ValueError(f"rank {r} outside [0, {n})")
    if op == "barrier" or n == 1:
        return []
    if op == "allreduce":
        return _allreduce(algo, n, r, count, push)
    if op == "allgather":
        total = count * n
        ch = [(i * count, count) for i in range(n)]
        if algo == "ring":
            return [Phase(tuple(_ring_ag(r, n, ch, "recv", "ag")))]
        if algo == "hd":
            return [Phase(tuple(_hd_ag(r, n, total, "recv", "ag")))]
        return [Phase((Step("ag", (), tuple(Pull(q, "recv", q * count, count, "recv", q * count, False)
                                             for q in range(n) if q != r)),))]
    if op == "reducescatter":
        ch = [(i * count, count) for i in range(n)]
        if algo == "ring":
            return [Phase(tuple(_ring_rs(r, n, ch, "work", "rs")))]
        if algo == "hd":
            steps, _ = _hd_rs(r, n, count * n, "work", "rs")
            return [Phase(tuple(steps))]
        return [Phase((Step("rs", (), tuple(Pull(q, "send", r * count, count, "recv", 0, True)
                                             for q in range(n) if q != r)),))]
    if op == "broadcast":
        if r == root:
            return [Phase(())]
        return [Phase((Step("bc", (), (Pull(root, "recv", 0, count, "recv", 0, False),)),))]
    if op == "reduce":
        if r != root:
            return [Phase(())]
        return [Phase((Step("rd", (), tuple(Pull(q, "send", 0, count, "recv", 0, True)
                                             for q in range(n) if q != r)),))]
    if op == "alltoall":
        return [Phase((Step("a2a", (), tuple(Pull(q, "send", r * count, count, "recv", q * count, False)
                                              for q in range(n) if q != r)),))]
    raise ValueError(f"unknown collective {op!r}")


def _allreduce(algo: str, n: int, r: int, count: int, push: bool = False) -> list[Phase]:
    ch = chunks(count, n)
    if algo == "oneshot":
        # latency-optimal for small buffers: one round; every rank sums all inputs in rank order, so
        # every rank gets bit-identical results (HCCL_DETERMINISTIC-like)
        pulls = (Pull(0, "work", 0, count, "recv", 0, False),) + tuple(
            Pull(q, "work", 0, count, "recv", 0, True) for q in range(1, n))
        return [Phase((Step("os", (), pulls),))]
    if algo == "ring":
        return [Phase(tuple(_ring_rs(r, n, ch, "recv", "rs"))), Phase(tuple(_ring_ag(r, n, ch, "recv", "ag")))]
    if algo == "mesh":
        off, ln = ch[r]
        others = [q for q in range(n) if q != r]
        # reduce-scatter straight out of the send buffers: my chunk = my send + every peer's send (the
        # first pull's left operand is my own send buffer: no prologue copy); the engine runs the pulls
        # of one chunk segment by segment, so the partial sum stays in cache between them
        pulls = tuple(Pull(q, "send", off, ln, "recv", off, True, "send" if i == 0 else None)
                      for i, q in enumerate(others) if ln)
        if push:
            # ... and write each reduced segment into every peer's receive buffer at once.  Hazards: my
            # chunk of a peer's receive buffer is written by me only, and read by nobody but me (in place
            # it is the peer's send chunk r, which only my reduction reads, segment by segment before the
            # write); the operator's closing barrier orders my writes before the peer returns (if it gives
            # up instead, its peer fence refuses them: devices.arena.HbmArena.fence_peers)
            return [Phase((Step("rs", (), pulls, (), (Push(tuple(others), "recv", off, ln),) if ln else ()),))]
        rs = Step("rs", (), pulls, tuple(others))
        # then copy each peer's chunk as soon as that peer has reduced it (no barrier between the two
        # halves: a rank that finished early starts copying).  Hazards: peers read only my send buffer
        # (chunk p for peer p) and my chunk r; I write chunk q only after q signalled that its reduction
        # -- the only reader of my send chunk q -- is done (in place, recv chunk q is send chunk q)
        ags = [Step(f"ag{q}", ((q, "rs"),), (Pull(q, "recv", ch[q][0], ch[q][1], "recv", ch[q][0], False),)
                    if ch[q][1] else ()) for q in others[r:] + others[:r]]
        return [Phase((rs, *ags))]
    if algo != "hd":
        raise ValueError(f"unknown algorithm {algo!r}")
    p2 = _pow2_floor(n)
    extra = n - p2
    phases = []
    if extra:   # fold ranks [p2, n) into partners [0, extra)
        if r < extra:
            phases.append(Phase((Step("fold", (), (Pull(r + p2, "recv", 0, count, "recv", 0, True),)),)))
        else:
            phases.append(Phase(()))
    if r < p2:
        rs, _ = _hd_rs(r, p2, count, "recv", "rs")
        phases.append(Phase(tuple(rs)))
        phases.append(Phase(tuple(_hd_ag(r, p2, count, "recv", "ag"))))
    else:
        phases += [Phase(()), Phase(())]
    if extra:   # unfold: the extra ranks copy the result back from their partners
        if r >= p2:
            phases.append(Phase((Step("unfold", (), (Pull(r - p2, "recv", 0, count, "recv", 0, False),)),)))
        else:
            phases.append(Phase(()))
    return phases


def prologue(op: str, n: int, r: int, count: int, algo: str, root: int = 0) -> list[tuple[str, int, str, int, int]]:
    """Local copies before phase 0, as (src buf, src off, dst buf, dst off, count)."""
    if op == "allreduce":
        if algo == "oneshot" and n > 1:
            return [("send", 0, "work", 0, count)]
        if algo == "mesh" and n > 1:
            return []                      # the reduce-scatter reads the send buffers directly
        return [("send", 0, "recv", 0, count)]
    if op == "allgather":
        return [("send", 0, "recv", r * count, count)]
    if op == "reducescatter":
        if algo == "mesh":
            return [("send", r * count, "recv", 0, count)]
        return [("send", 0, "work", 0, count * n)]
    if op == "broadcast":
        return []
    if op == "reduce":
        return [("send", 0, "recv", 0, count)] if r == root else []
    if op == "alltoall":
        return [("send", r * count, "recv", r * count, count)]
    return []


def epilogue(op: str, n: int, r: int, count: int, algo: str) -> list[tuple[str, int, str, int, int]]:
    """Local copies after the last phase."""
    if op == "reducescatter" and algo != "mesh":
        return [("work", r * count, "recv", 0, count)]
    return []
