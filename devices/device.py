"""One virtual NPU: HBM arena + scheduler + kernels + cost model + telemetry + fault switches.

This is the device-side interface that the runtime's backends drive: in-process directly (local backend)
or through the gRPC services of a device actor.  Methods named ``memcpy_*``/``malloc``/``free``/``memset``
are host-synchronous; :meth:`submit` only orders the device (it returns once the ops are queued);
``synchronize_*`` block the host with a deadline.  ``owner`` names the tenant (client) on whose behalf a
call is made: memory, streams and events of one owner are invisible to others.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .arena import HbmArena
from .chip import ASCEND_910B3, ChipSpec, CostModel, Work
from .errors import InvalidParamError, KernelError
from .kernel import KernelRunner, check_launch, default_block_dim, lookup
from .scheduler import Scheduler, Task
from .hccl import CollectiveOp, HcclEngine
from .graph import GraphTable
from .tasks import Collective, CopyD2D, ExecGraph, Launch, Memset, Record, StreamOp, Wait, WriteH2D, launch_key

DEFAULT_ARENA = 1 << 30


@dataclass(frozen=True)
class DeviceConfig:
    device_id: int = 0                  #: physical id, unique on the cluster; pointers carry it
    spec: ChipSpec = ASCEND_910B3
    arena_bytes: int = DEFAULT_ARENA
    host_threads: int = 2               #: blocks that can really run at once (caps the block-dim helper)
    cores: int | None = None            #: worker threads; default spec.ai_cores


@dataclass(frozen=True)
class DeviceInfo:
    device_id: int
    chip: str
    short_name: str
    ai_cores: int
    vector_cores: int
    hbm_total: int
    bus_id: str
    arena_name: str


HEALTH = ("OK", "Warning", "Alarm", "Critical")


@dataclass
class Faults:
    """Fault switches (chaos).  Mutated under the device's lock."""
    task_fail: int = 0                  #: fail the next N tasks
    overheat_c: float = 0.0
    link_down: set = field(default_factory=set)
    reasons: list = field(default_factory=list)


class Device:
    def __init__(self, config: DeviceConfig = DeviceConfig()):
        self.config = config
        self.id = config.device_id
        self.spec = config.spec
        self.cost = CostModel(config.spec)
        self.arena = HbmArena(config.device_id, config.arena_bytes)
        cores = config.cores or config.spec.ai_cores
        self.sched = Scheduler(config.device_id, cores, max_streams=config.spec.max_streams,
                               max_events=config.spec.max_events)
        self.faults = Faults()
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._tele_last = (self._t0, [0.0] * cores)
        self._temp_c = config.spec.ambient_c + config.spec.c_per_w * config.spec.idle_w
        self._util = 0.0
        self.closed = False
        self.hccl = HcclEngine(self)
        self._plans: dict = {}
        self.graphs = GraphTable()
        self.default_stream = self.sched.create_stream(0)

    # ------------------------------------------------------------------ info
    def info(self) -> DeviceInfo:
        return DeviceInfo(self.id, self.spec.name, self.spec.short_name, self.spec.ai_cores,
                          self.spec.vector_cores, self.arena.size, f"0000:{0xC1 + self.id:02X}:00.0",
                          self.arena.name)

    # ------------------------------------------------------------------ memory (host-synchronous)
    def malloc(self, size: int, policy: int = 0, owner: str = "", placement: int = 0) -> int:
        """``placement``: where in the arena (:data:`devices.arena.PLACEMENT_BEST_FIT` / ``_LOW`` /
        ``_HIGH``), a hint the caching pool passes for short- and long-lived segments."""
        return self.arena.malloc(size, policy, owner, placement)

    def free(self, ptr: int, owner: str | None = None) -> None:
        self.arena.free(ptr, owner)

    def memcpy_h2d(self, dst: int, data, owner: str | None = None) -> None:
        """Copy host bytes (bytes, memoryview or a uint8-viewable array) into device memory now."""
        src = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
        view = self.arena.view(dst, src.size, owner)
        np.copyto(view, src)

    def memcpy_d2h(self, src: int, nbytes: int, owner: str | None = None, out=None) -> np.ndarray:
        """Copy device bytes to the host now; returns a uint8 array (or fills ``out``)."""
        view = self.arena.view(src, nbytes, owner)
        if out is None:
            return view.copy()
        np.copyto(out, view)
        return out

    def memcpy_d2d(self, dst: int, src: int, nbytes: int, owner: str | None = None) -> None:
        d = self.arena.view(dst, nbytes, owner)
        s = self.arena.view(src, nbytes, owner)
        np.copyto(d, s)

    def memset(self, ptr: int, value: int, nbytes: int, owner: str | None = None) -> None:
        self.arena.view(ptr, nbytes, owner)[:] = value & 0xFF

    def mem_info(self) -> tuple[int, int]:
        st = self.arena.stats()
        return st.free, st.total

    # ------------------------------------------------------------------ streams / events
    def create_stream(self, priority: int = 0, owner: str = "") -> int:
        return self.sched.create_stream(priority, owner)

    def destroy_stream(self, sid: int, owner: str | None = None) -> None:
        self.sched.destroy_stream(sid, owner)

    def create_event(self, flags: int = 0, owner: str = "") -> int:
        return self.sched.create_event(flags, owner)

    def destroy_event(self, eid: int, owner: str | None = None) -> None:
        self.sched.destroy_event(eid, owner)

    def synchronize_stream(self, sid: int, timeout_ms: float = -1, owner: str | None = None, ops=()) -> None:
        """Block until the stream is idle; ``ops`` are submitted first (a flush riding on the wait)."""
        if ops:
            self.submit(ops, owner)
        self.sched.synchronize_stream(sid, timeout_ms, owner)

    def synchronize_event(self, eid: int, timeout_ms: float = -1, owner: str | None = None) -> None:
        self.sched.synchronize_event(eid, timeout_ms, owner)

    def synchronize_device(self, timeout_ms: float = -1, owner: str | None = None) -> None:
        self.sched.synchronize_device(timeout_ms, owner)

    def query_event(self, eid: int, owner: str | None = None) -> bool:
        return self.sched.query_event(eid, owner)

    def query_stream(self, sid: int, owner: str | None = None) -> bool:
        return self.sched.stream_idle(sid, owner)

    def event_elapsed(self, start: int, end: int, owner: str | None = None) -> tuple[float, float]:
        return self.sched.elapsed(start, end, owner)

    def event_timestamp(self, eid: int, owner: str | None = None) -> tuple[float, float]:
        """(wall seconds since device start, modeled seconds) of the event's last completed record."""
        w, m = self.sched.event_times(eid, owner)
        return w - self._t0, m

    def signal_event(self, eid: int, gen: int, owner: str | None = None) -> None:
        self.sched.signal(eid, gen, owner)

    # ------------------------------------------------------------------ task submission
    def submit(self, ops: list[StreamOp] | tuple, owner: str | None = None) -> None:
        """Queue a batch of stream ops, in order.  Validation errors raise here (host-synchronous) and
        nothing of the batch from the failing op on is queued; execution errors surface at the next
        synchronize of the stream."""
        run: list[Task] = []
        sid = None
        for op in ops:
            if sid is not None and op.stream != sid:
                self.sched.enqueue(sid, run, owner)
                run = []
            sid = op.stream
            run.append(self._task(op, owner))
        if run:
            self.sched.enqueue(sid, run, owner)

    def _task(self, op: StreamOp, owner: str | None) -> Task:
        if isinstance(op, Launch):
            return self._launch_task(op, owner)
        if isinstance(op, Record):
            return Task("record", event=self.sched._event(op.event, owner))
        if isinstance(op, Wait):
            return Task("wait", event=self.sched._event(op.event, owner), gen=op.gen)
        if isinstance(op, CopyD2D):
            self._check_range(op.dst, op.nbytes, owner)
            self._check_range(op.src, op.nbytes, owner)
            return Task("copy", run=lambda b: self._guarded(lambda: self.memcpy_d2d(op.dst, op.src, op.nbytes,
                                                                                      owner)),
                        duration=self.cost.device_copy(op.nbytes), name="memcpy_d2d")
        if isinstance(op, Memset):
            self._check_range(op.ptr, op.nbytes, owner)
            return Task("copy", run=lambda b: self._guarded(lambda: self.memset(op.ptr, op.value, op.nbytes, owner)),
                        duration=self.cost.device_copy(op.nbytes) / 2, name="memset")
        if isinstance(op, Collective):
            cop = CollectiveOp(op.comm, op.op, op.send, op.recv, op.count, op.dtype, op.redop, op.root, op.peer)
            self.hccl.check(cop, owner)
            return Task("copy", run=lambda b: self._guarded(lambda: self.hccl.run(cop, owner)),
                        duration=self.hccl.modeled_seconds(cop), name=f"hccl_{op.op}")
        if isinstance(op, ExecGraph):
            g = self.graphs.get(op.graph, owner)
            return Task("kernel", run=lambda b: g.run(), duration=g.duration, name="model_ri")
        if isinstance(op, WriteH2D):
            self._check_range(op.dst, len(op.data), owner)
            return Task("copy", run=lambda b: self._guarded(lambda: self.memcpy_h2d(op.dst, op.data, owner)),
                        duration=self.cost.host_copy(len(op.data)), name="memcpy_h2d")
        raise InvalidParamError(f"unknown stream op {type(op).__name__}")

    def _check_range(self, ptr: int, nbytes: int, owner: str | None) -> None:
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise InvalidParamError(f"bad byte count {nbytes!r}")
        self.arena.resolve(ptr, nbytes, owner)

    def _guarded(self, fn) -> None:
        with self._lock:
            if self.faults.task_fail > 0:
                self.faults.task_fail -= 1
                raise KernelError("injected task failure (fault task-fail)")
        fn()

    def _launch_task(self, op: Launch, owner: str | None) -> Task:
        key = _plan_key(op, owner)
        plan = self._plans.get(key) if key is not None else None
        if plan is None or plan.gen != self.arena.gen or plan.kernel is not lookup(op.kernel):
            plan = self._plan(op, owner)
            if key is not None:
                if len(self._plans) >= 4096:
                    self._plans.clear()
                self._plans[key] = plan

        def run(b: int) -> None:
            if self.faults.task_fail:
                self._guarded(lambda: None)
            plan.runner().run_block(b)

        return Task("kernel", blocks=plan.block_dim, run=run, duration=plan.duration, name=op.kernel)

    def _plan(self, op: Launch, owner: str | None) -> "LaunchPlan":
        """Validate a launch (shapes, dtypes, every tensor inside a live allocation of ``owner``) and
        price it.  Cached per distinct launch while no allocation has been freed since."""
        k = lookup(op.kernel)
        gen = self.arena.gen
        attrs = dict(op.attrs) if op.attrs else {}
        block_dim = op.block_dim
        check_launch(k, op.inputs, op.outputs, attrs, block_dim or 1)
        for d in op.inputs + op.outputs:
            self._check_range(d.ptr, d.nbytes, owner)
        if not block_dim:
            block_dim = default_block_dim(k, op.inputs, op.outputs, attrs, self.spec.ai_cores,
                                          self.config.host_threads)
        work = k.work(op.inputs, op.outputs, attrs) if k.work else \
            Work(bytes=sum(d.nbytes for d in op.inputs + op.outputs))
        return LaunchPlan(self, k, op, attrs, block_dim, self.cost.kernel(work, block_dim), owner, gen)

    def release_owner(self, owner: str, timeout_s: float = 30.0) -> dict:
        """Release everything a departed client holds: graphs, streams (queued work dropped, running
        work waited for, host-blocking up to ``timeout_s``), events, then its memory.  Memory stays
        allocated if its work does not finish in time (a hung device)."""
        graphs = self.graphs.drop_owner(owner)
        quiet = self.sched.drop_owner(owner, timeout_s)
        freed = self.arena.free_owner(owner) if quiet else 0
        return {"graphs": graphs, "allocations": freed, "quiesced": quiet}

    # ------------------------------------------------------------------ captured graphs (aclmdlRI)
    def graph_create(self, ops, owner: str | None = None) -> int:
        """Validate and bind a captured op sequence (host-synchronous); returns the graph id.  A bad op
        raises its launch-time error and nothing is kept."""
        return self.graphs.create(ops, owner, lambda op: self._task(op, owner), self.arena)

    def graph_destroy(self, gid: int, owner: str | None = None) -> None:
        self.graphs.destroy(gid, owner)

    def graph_rebind(self, gid: int, moves, owner: str | None = None) -> int:
        """Re-point a graph's captured ops after memory moved (live defragmentation): every pointer
        inside an ``(old, new, nbytes)`` range is remapped to the same offset from ``new``, and the ops
        are validated and bound again (host-synchronous).  Returns how many pointers changed; a remap
        that leaves an op invalid raises its launch-time error and keeps the graph as it was."""
        return self.graphs.rebind(gid, owner, moves)

    def graph_info(self, gid: int, owner: str | None = None) -> dict:
        return self.graphs.get(gid, owner).info()

    # ------------------------------------------------------------------ HCCL communicators
    def hccl_info(self) -> dict:
        """What peers need to reach this device (arena segment, doorbell, node)."""
        return self.hccl.info()

    def hccl_comm_init(self, comm_id: str, rank: int, peers: list[dict], config: dict | None = None) -> None:
        self.hccl.comm_init(comm_id, rank, peers, config)

    def hccl_comm_join(self, comm_id: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                       timeout_s: float = 120.0) -> list[dict]:
        """Root-info rendezvous (host-blocking up to ``timeout_s``)."""
        return self.hccl.comm_join(comm_id, rank, nranks, root, config, timeout_s)

    def hccl_comm_destroy(self, comm_id: str) -> None:
        self.hccl.comm_destroy(comm_id)

    def hccl_async_error(self, comm_id: str) -> int:
        return self.hccl.async_error(comm_id)

    # ------------------------------------------------------------------ telemetry
    def telemetry(self) -> dict:
        now = time.perf_counter()
        busy = list(self.sched.busy_s)
        t_last, busy_last = self._tele_last
        dt = max(now - t_last, 1e-9)
        per_core = [min(100.0, 100.0 * (b - bl) / dt) for b, bl in zip(busy, busy_last)]
        if dt > 0.05:
            self._tele_last = (now, busy)
            util = sum(per_core) / len(per_core) / 100.0
            self._util = util
        else:
            util = self._util
        s = self.spec
        power = s.idle_w + (s.tdp_w - s.idle_w) * min(1.0, util * 4)
        target = s.ambient_c + s.c_per_w * power + self.faults.overheat_c
        alpha = min(1.0, dt / 5.0)
        self._temp_c += (target - self._temp_c) * alpha if self.faults.overheat_c == 0 else (target - self._temp_c)
        st = self.arena.stats()
        ss = self.sched.stats()
        return {
            "device_id": self.id, "chip": s.name, "name": s.short_name,
            "health": self.health()[0],
            "hbm_total": st.total, "hbm_used": st.used, "hbm_free": st.free, "hbm_peak": st.peak,
            "hbm_largest_free": st.largest_free, "allocations": st.allocations,
            "fragmentation": st.fragmentation, "canary_violations": st.canary_violations,
            "aicore_util": [round(u, 1) for u in per_core], "aicore_util_avg": round(util * 100, 1),
            "tasks_run": ss["tasks_run"], "queued": ss["queued"], "streams": ss["streams"],
            "events": ss["events"], "modeled_time_s": ss["model_now_s"],
            "power_w": round(power, 1), "temperature_c": round(self._temp_c, 1),
            "uptime_s": now - self._t0, "busy_s": sum(busy),
        }

    def health(self) -> tuple[str, list[str]]:
        """(OK | Warning | Alarm | Critical, reasons)."""
        reasons = list(self.faults.reasons)
        level = 0
        temp = self._temp_c
        if temp >= 105:
            level, reasons = 3, reasons + [f"temperature {temp:.0f} C >= 105 C"]
        elif temp >= 95:
            level, reasons = max(level, 2), reasons + [f"temperature {temp:.0f} C >= 95 C"]
        if self.arena.stats().canary_violations:
            level = max(level, 1)
            reasons.append("HBM guard bytes overwritten")
        if self.arena._poison:
            level = max(level, 2)
            reasons.append("uncorrectable HBM ECC error")
        return HEALTH[level], reasons

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Abort all work and drop every allocation, stream and event (HBM starts empty)."""
        self.sched.abort(message=f"device {self.id} reset")
        self.sched.clear_abort()
        with self.sched._lock:
            self.sched.streams.clear()
            self.sched.events.clear()
        self.arena.reset()
        self.graphs.clear()
        for cid in list(self.hccl.comms):
            self.hccl.comm_destroy(cid)
        self.faults = Faults()
        self.default_stream = self.sched.create_stream(0)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.hccl.close()
        self.sched.close()
        self.arena.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LaunchPlan:
    """A validated launch and, once it first runs, its bound views (reused while the arena's
    generation is unchanged: no allocation freed, so every view still points at live memory)."""

    __slots__ = ("dev", "kernel", "op", "attrs", "block_dim", "duration", "owner", "gen", "_runner", "_lock")

    def __init__(self, dev, kernel, op, attrs, block_dim, duration, owner, gen):
        self.dev, self.kernel, self.op, self.attrs = dev, kernel, op, attrs
        self.block_dim, self.duration, self.owner, self.gen = block_dim, duration, owner, gen
        self._runner: tuple | None = None
        self._lock = threading.Lock()

    def runner(self) -> KernelRunner:
        arena = self.dev.arena
        with self._lock:
            cached = self._runner
            if cached is not None and cached[0] == arena.gen:
                return cached[1]
            gen = arena.gen
            ins = [arena.typed_view(d.ptr, d.shape, d.dtype, self.owner) for d in self.op.inputs]
            for a in ins:
                a.flags.writeable = False
            outs = [arena.typed_view(d.ptr, d.shape, d.dtype, self.owner) for d in self.op.outputs]
            r = KernelRunner(self.kernel, ins, outs, self.attrs, self.block_dim, self.dev.id)
            self._runner = (gen, r)
            return r


def _plan_key(op: Launch, owner):
    key = launch_key(op)
    return None if key is None else (key, owner)


def local_config(device_id: int, **kw) -> DeviceConfig:
    return replace(DeviceConfig(), device_id=device_id, **kw)
