"""Captured task graphs: CANN's model run instances (``aclmdlRI``, "aclgraph", the CUDA-graph
equivalent) on the device side.

The runtime captures a stream's ops (``aclmdlRICaptureBegin`` .. ``End``) and hands them to the device
once; the device validates them once (every tensor inside a live allocation of the owner, shapes and
dtypes) and keeps the bound kernel runners.  ``aclmdlRIExecuteAsync`` then queues ONE stream task that
runs the whole sequence on one AI Core thread, back to back: no per-op submission, decoding, validation
or scheduling.  Values that change between replays (token ids, positions, sequence lengths) must live
in device memory that the captured kernels read; the pointers and shapes are frozen at capture.

Safety: a replay first compares the arena's generation with the one its steps were bound at; if any
allocation was freed since, every op is validated again, so a graph that refers to freed memory fails
its execution with the launch's own error (ACL_ERROR_RT_PARAM_INVALID) instead of touching reused memory.

Capturable ops: kernel launches, device-to-device copies, memsets and HCCL operators.  Event records and
waits and host-to-device writes of pageable data are refused at capture
(ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT), as are host-side synchronizations of a capturing stream
(ACL_ERROR_RT_STREAM_CAPTURED) -- the capture-time rules live in ``runtime.graph``.
"""
from __future__ import annotations

import bisect
import itertools
import threading
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import numpy as np

from .errors import (ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT, AclError, CaptureError, InvalidHandleError,
                     InvalidParamError)
from .kernel import KernelRunner, TensorDesc
from .tasks import Collective, CopyD2D, Launch, Memset
from .tenancy import same_tenant

#: stream op types a graph may hold
CAPTURABLE = (Launch, CopyD2D, Memset, Collective)


@dataclass(frozen=True)
class GraphStep:
    """One validated op of a graph: ``run(block)`` for each of its ``blocks``; ``skip(error)`` when it will
    not run (see :attr:`devices.scheduler.Task.skip`)."""
    name: str
    blocks: int
    run: Callable[[int], None]
    duration: float                 #: modeled seconds
    skip: Callable | None = None
    whole: Callable[[], None] | None = None     #: all blocks as one call (built-in kernels)
    one: Callable[[], KernelRunner] | None = None    #: its runner bound as one block: whose bare() a replay calls


class TaskGraph:
    """A captured op sequence of one owner, validated and bound for replay.

    ``build(op)`` turns an op into a validated :class:`devices.scheduler.Task` (the device's own
    per-op path, so the checks and the kernels are exactly those of eager execution)."""

    def __init__(self, gid: int, owner, ops: tuple, build: Callable, arena):
        for op in ops:
            if not isinstance(op, CAPTURABLE):
                raise CaptureError(f"a {type(op).__name__} cannot be part of a captured graph "
                               "(capturable: kernel launches, D2D copies, memsets, HCCL operators)",
                               code=ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT)
        self.gid = gid
        self.owner = owner
        self.ops = ops
        self._build = build
        self._arena = arena
        self._lock = threading.Lock()
        self.replays = 0
        self._bare: tuple | None = None
        self.steps, self.gen = self._bind()
        self.duration = sum(s.duration for s in self.steps)      #: modeled seconds of one replay

    def _bind(self) -> tuple[tuple[GraphStep, ...], int]:
        gen = self._arena.gen
        steps = []
        for op in self.ops:
            t = self._build(op)
            steps.append(GraphStep(t.name or t.kind, t.block_dim or t.blocks, t.run, t.duration, t.skip, t.whole,
                                   t.one))
        return tuple(steps), gen

    def _calls(self) -> tuple:
        """Per step, what a replay calls: ``(bare call, runner)`` of a built-in kernel bound as one block
        (:meth:`devices.kernel.KernelRunner.bare`), else ``(None, None)`` (the step's own ``run``).  Made
        once per binding (under the lock), on the first replay."""
        if self._bare is None or self._bare[0] != self.gen:
            calls = []
            for s in self.steps:
                r = s.one() if s.one is not None else None
                calls.append((r.bare(), r) if r is not None else (None, None))
            self._bare = (self.gen, tuple(calls))
        return self._bare[1]

    def run(self) -> None:
        """Execute every step in order on the calling (AI Core) thread; the first error stops the
        graph and fails its stream task (the steps after it are skipped: :meth:`skip`).

        A built-in kernel's blocks would run one after another here, so it runs as one call, bound to its
        views once per binding and called bare (:meth:`devices.kernel.KernelRunner.bare`): the replay turns
        numpy's floating-point warnings off once for all its steps (the device's own semantics,
        :mod:`devices.ops.precision`) and translates a kernel's exception itself.  A step whose memory
        was freed while the replay ran (the arena's generation moved) takes its checked path instead."""
        with self._lock:
            steps = self.steps
            try:
                if self.gen != self._arena.gen:         # something was freed: validate everything again
                    self.steps, self.gen = self._bind()
                calls = self._calls()
            except BaseException as e:
                _skip_steps(steps, e)
                raise
            steps, gen = self.steps, self.gen
            self.replays += 1
        arena = self._arena
        with np.errstate(all="ignore"):
            for i, (s, (call, runner)) in enumerate(zip(steps, calls)):
                bare = call is not None and arena.gen == gen
                try:
                    if bare:
                        call()
                    elif s.whole is not None:
                        s.whole()
                    else:
                        for b in range(s.blocks):
                            s.run(b)
                except BaseException as e:
                    _skip_steps(steps[i + 1:], e)
                    if bare and isinstance(e, Exception) and not isinstance(e, AclError):
                        raise runner.fault(0, e) from e
                    raise

    def skip(self, err) -> None:
        """The replay will not run (its stream failed earlier): every step gives up what it promised
        others, as the same ops issued one by one would (an HCCL operator tells its peers).  Does not block."""
        _skip_steps(self.steps, err)

    def rebind(self, moves: "PointerMap") -> int:
        """Remap the captured ops' pointers through ``moves`` and bind them again (the graph object, its
        id and replay count stay); returns how many pointers changed.  An op the remap leaves invalid
        raises its launch-time error and the graph keeps its old ops."""
        ops, changed = remap_ops(self.ops, moves)
        if not changed:
            return 0
        with self._lock:
            old = self.ops
            self.ops = ops
            try:
                self.steps, self.gen = self._bind()
                self._bare = None
            except BaseException:
                self.ops = old
                raise
            self.duration = sum(s.duration for s in self.steps)
        return changed

    def info(self) -> dict:
        """What aclmdlRIDebugPrint shows: the tasks in order."""
        return {"graph": self.gid, "tasks": len(self.steps), "replays": self.replays,
                "modeled_us": round(self.duration * 1e6, 3),
                "steps": [{"name": s.name, "blocks": s.blocks} for s in self.steps]}


class GraphTable:
    """The device's graphs, by id; a graph is usable by its owner's tenant (:mod:`devices.tenancy`)."""

    def __init__(self):
        self._graphs: dict[int, TaskGraph] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def create(self, ops, owner, build: Callable, arena) -> int:
        with self._lock:
            gid = next(self._ids)
        g = TaskGraph(gid, owner, tuple(ops), build, arena)
        with self._lock:
            self._graphs[gid] = g
        return gid

    def get(self, gid: int, owner) -> TaskGraph:
        g = self._graphs.get(gid)
        if g is None or not same_tenant(g.owner, owner):
            raise InvalidHandleError(f"unknown graph (model run instance) {gid!r}")
        return g

    def rebind(self, gid: int, owner, moves) -> int:
        """See :meth:`TaskGraph.rebind`; ``moves`` are ``(old, new, nbytes)`` triples."""
        return self.get(gid, owner).rebind(PointerMap(moves))

    def destroy(self, gid: int, owner) -> None:
        """Forget a graph; replays already queued still run (they hold it)."""
        with self._lock:
            self.get(gid, owner)
            del self._graphs[gid]

    def clear(self) -> None:
        with self._lock:
            self._graphs.clear()

    def drop_owner(self, owner) -> int:
        """Forget every graph of one owner (a departed client: the whole owner); returns how many."""
        with self._lock:
            gids = [gid for gid, g in self._graphs.items() if g.owner == owner]
            for gid in gids:
                del self._graphs[gid]
        return len(gids)

    def __len__(self) -> int:
        return len(self._graphs)


# ---------------------------------------------------------------------------------------------- remapping
class PointerMap:
    """Moved memory ranges: ``(old, new, nbytes)``; :meth:`map` sends a pointer inside ``[old, old +
    nbytes)`` to the same offset from ``new`` and leaves any other pointer alone.  Ranges must not overlap."""

    def __init__(self, moves: Iterable[tuple[int, int, int]]):
        rows = sorted((int(o), int(n), int(k)) for o, n, k in moves)
        for o, n, k in rows:
            if k <= 0 or o < 0 or n < 0:
                raise InvalidParamError(f"bad moved range (old 0x{o:x}, new 0x{n:x}, {k} B)")
        for (o1, _, k1), (o2, _, _) in zip(rows, rows[1:]):
            if o1 + k1 > o2:
                raise InvalidParamError(f"moved ranges overlap at 0x{o2:x}")
        self._starts = [o for o, _, _ in rows]
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def map(self, ptr: int) -> int:
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0:
            o, n, k = self._rows[i]
            if ptr < o + k:
                return n + (ptr - o)
        return ptr


def _remap_desc(d: TensorDesc, m: PointerMap) -> TensorDesc:
    p = m.map(d.ptr)
    return d if p == d.ptr else TensorDesc(p, d.shape, d.dtype)


def _remap_launch(op: Launch, m: PointerMap) -> tuple[Launch, int]:
    ins = tuple(_remap_desc(d, m) for d in op.inputs)
    outs = tuple(_remap_desc(d, m) for d in op.outputs)
    n = sum(a is not b for a, b in zip(ins + outs, op.inputs + op.outputs))
    return (replace(op, inputs=ins, outputs=outs) if n else op), n


def _remap_copy(op: CopyD2D, m: PointerMap) -> tuple[CopyD2D, int]:
    dst, src = m.map(op.dst), m.map(op.src)
    return replace(op, dst=dst, src=src), (dst != op.dst) + (src != op.src)


def _remap_memset(op: Memset, m: PointerMap) -> tuple[Memset, int]:
    ptr = m.map(op.ptr)
    return replace(op, ptr=ptr), int(ptr != op.ptr)


def _skip_steps(steps, err) -> None:
    for s in steps:
        if s.skip is not None:
            s.skip(err)


def _remap_collective(op: Collective, m: PointerMap) -> tuple[Collective, int]:
    send = m.map(op.send) if op.send else 0          # 0 = no buffer (recv of a send, ...)
    recv = m.map(op.recv) if op.recv else 0
    return replace(op, send=send, recv=recv), (send != op.send) + (recv != op.recv)


#: op type -> remap(op, moves) -> (op, pointers changed); one entry per capturable op
_REMAP: dict = {Launch: _remap_launch, CopyD2D: _remap_copy, Memset: _remap_memset, Collective: _remap_collective}


def remap_ops(ops: tuple, moves: PointerMap) -> tuple[tuple, int]:
    """``ops`` with every pointer sent through ``moves``, and how many pointers changed."""
    out, changed = [], 0
    for op in ops:
        new, n = _REMAP[type(op)](op, moves)
        out.append(new if n else op)
        changed += int(n)
    return tuple(out), changed
