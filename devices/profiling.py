"""Device-side task records for the profiler (msprof's "task time" data), per profiling client.

A profiling client (an owner: a tenant's client over the driver, ``None`` for the in-process runtime)
starts a session on the device (:meth:`TaskProfiler.start`); from then on, and only for the tasks *that
owner* submits, the device attaches a :class:`TaskRecord` to each task that runs on a core (kernels,
copies, collectives, graph replays -- event records and waits take no core and are not recorded).  The
scheduler fills the record as the task runs: per-block wall spans with the core that ran them, and the
task's modeled start and end on its stream's modeled clock.  :meth:`TaskProfiler.stop` ends the session and
hands back the records as plain dicts (they cross the wire as JSON).  Another owner's tasks never get a
record, so a profile never shows another tenant's work.

``seq`` numbers the recorded tasks of one stream in submission order from 0 at the session start; the
host numbers the ops it sends the same way, so ``(stream, seq)`` links a host launch to its device task
(the profiler's flow id).

Cost when nobody profiles: one attribute read per submitted batch (``TaskProfiler.active``) and one
``None`` check per finished block.  Wall times are ``time.perf_counter()`` (CLOCK_MONOTONIC: one clock for
every process on a node).  Nothing here blocks.
"""
from __future__ import annotations

import threading
from typing import Any

from .chip import DVPP_UNITS

#: records kept per session before later ones are only counted (bounds a forgotten session's memory)
MAX_RECORDS = 1 << 19

#: a kernel's unit -> msprof Task Type
_TASK_TYPES = {"cube": "AI_CORE", "vector": "AI_VECTOR_CORE", **{u: "DVPP" for u in DVPP_UNITS}}


class TaskRecord:
    """One task's profile; filled by the scheduler while it runs (its lock held for ``finish``)."""

    __slots__ = ("stream", "seq", "name", "op_type", "task_type", "block_dim", "inputs", "outputs",
                 "enqueued", "blocks", "model_start", "model_end", "error", "_session")

    def __init__(self, session: "_Session", stream: int, seq: int, name: str, op_type: str, task_type: str,
                 block_dim: int, inputs: tuple, outputs: tuple, enqueued: float):
        self._session = session
        self.stream, self.seq, self.name, self.op_type, self.task_type = stream, seq, name, op_type, task_type
        self.block_dim, self.inputs, self.outputs, self.enqueued = block_dim, inputs, outputs, enqueued
        self.blocks: list[tuple[int, int, float, float]] = []     #: (block, core, wall start, wall end)
        self.model_start = self.model_end = 0.0
        self.error = ""

    def block(self, block: int, core: int, t0: float, t1: float) -> None:
        """A block ran on ``core`` from ``t0`` to ``t1`` (wall, perf_counter seconds)."""
        self.blocks.append((block, core, t0, t1))

    def finish(self, model_start: float, model_end: float, error) -> None:
        """The task's last block finished; its modeled span on the stream's clock (seconds)."""
        self.model_start, self.model_end = model_start, model_end
        if error is not None:
            self.error = f"{getattr(error, 'code', '')} {error}"[:200]
        self._session.done(self)

    def as_dict(self) -> dict[str, Any]:
        starts = [b[2] for b in self.blocks]
        ends = [b[3] for b in self.blocks]
        return {"stream": self.stream, "seq": self.seq, "name": self.name, "op_type": self.op_type,
                "task_type": self.task_type, "block_dim": self.block_dim,
                "inputs": [_desc(d) for d in self.inputs], "outputs": [_desc(d) for d in self.outputs],
                "enqueued": self.enqueued,
                "start": min(starts) if starts else self.enqueued, "end": max(ends) if ends else self.enqueued,
                "model_start": self.model_start, "model_end": self.model_end, "error": self.error,
                "blocks": [list(b) for b in self.blocks]}


class _Session:
    def __init__(self):
        self.records: list[TaskRecord] = []
        self.seq: dict[int, int] = {}
        self.dropped = 0
        self.lock = threading.Lock()

    def next_seq(self, stream: int) -> int:
        n = self.seq.get(stream, 0)
        self.seq[stream] = n + 1
        return n

    def done(self, rec: TaskRecord) -> None:
        with self.lock:
            if len(self.records) < MAX_RECORDS:
                self.records.append(rec)
            else:
                self.dropped += 1


def _desc(d) -> list:
    return [list(d.shape), d.dtype]


class TaskProfiler:
    """The device's profiling sessions, one per profiling owner (see the module docstring)."""

    def __init__(self, device_id: int):
        self.device_id = device_id
        self.active = False                       #: any session open (the cheap check on the submit path)
        self._sessions: dict[Any, _Session] = {}
        self._lock = threading.Lock()

    def start(self, owner) -> None:
        """Open (or restart, dropping what it held) ``owner``'s session."""
        with self._lock:
            self._sessions[owner] = _Session()
            self.active = True

    def stop(self, owner) -> dict[str, Any]:
        """Close ``owner``'s session; its finished tasks as dicts (``tasks``), how many it could not keep
        (``dropped``), and the device id.  Stopping with no session open returns no tasks."""
        with self._lock:
            s = self._sessions.pop(owner, None)
            self.active = bool(self._sessions)
        if s is None:
            return {"device": self.device_id, "tasks": [], "dropped": 0}
        with s.lock:
            recs = list(s.records)
        recs.sort(key=lambda r: (r.stream, r.seq))
        return {"device": self.device_id, "tasks": [r.as_dict() for r in recs], "dropped": s.dropped}

    def release(self, owner) -> None:
        """A departed client's session goes with it."""
        with self._lock:
            self._sessions.pop(owner, None)
            self.active = bool(self._sessions)

    def session(self, owner) -> _Session | None:
        """``owner``'s open session, else None (only ever that owner's: never another's)."""
        return self._sessions.get(owner) if self.active else None

    def attach(self, session: _Session, op, task, now: float, unit: str = "vector") -> None:
        """Give ``task`` (a scheduler task built from stream op ``op``; ``unit``: the kernel's cube or
        vector unit) a record of ``session``; record and wait tasks get none."""
        kind = task.kind
        if kind not in ("kernel", "copy"):
            return
        name = task.name or kind
        block_dim = task.block_dim or task.blocks
        ins: tuple = ()
        outs: tuple = ()
        op_type = type(op).__name__
        if op_type == "Launch":
            task_type = _TASK_TYPES.get(unit, "AI_VECTOR_CORE")
            op_type = op.kernel
            ins, outs = op.inputs, op.outputs          # frozen TensorDescs: turned into lists when fetched
        elif op_type == "Collective":
            task_type = "HCCL"
            op_type = f"hcom_{op.op}"
        elif op_type == "ExecGraph":
            task_type = "AI_CORE"
            op_type = "ModelExecute"
        else:
            task_type = "MEMCPY"
            op_type = {"CopyD2D": "MemcpyAsync", "WriteH2D": "MemcpyAsync", "Memset": "Memset"}.get(op_type, op_type)
        task.prof = TaskRecord(session, op.stream, session.next_seq(op.stream), name, op_type, task_type,
                               block_dim, ins, outs, now)
