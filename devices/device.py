"""One virtual NPU: HBM arena + scheduler + kernels + cost model + telemetry + fault state.

This is the device-side interface that the runtime's backends drive: in-process directly (local backend)
or through the gRPC services of a device actor.  Methods named ``memcpy_*``/``malloc``/``free``/``memset``
are host-synchronous; :meth:`submit` only orders the device (it returns once the ops are queued);
``synchronize_*`` block the host with a deadline.  ``owner`` names the caller on whose behalf a call is
made (:mod:`devices.tenancy`: a tenant and a client; the driver's service supplies it, in-process callers
pass none): memory, streams, events, graphs, communicators and registered kernels are usable by their
owner's tenant only, count against its quotas (``DeviceConfig.quota``), and go when the client that made
them is released (:meth:`Device.release_owner`).

Faults (:meth:`Device.inject_fault` / :meth:`Device.clear_fault`, kinds in :data:`devices.faults.FAULT_KINDS`)
live in the device's own :class:`~devices.faults.FaultState`, which its scheduler, arena and HCCL engine
read.  Health (:meth:`Device.health_report`) is data: the active conditions and the worst level.
A device that is lost (fault ``kill`` in-process, or :meth:`Device.mark_lost`) fails every later call with
ACL_ERROR_RT_DEVICE_TASK_ABORT -- as a driver client does for a device whose process died -- and
:attr:`Device.lost` is set; only :meth:`Device.close` still works.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .arena import HbmArena
from .chip import ASCEND_910B3, ChipSpec, CostModel, Work
from .errors import ACL_ERROR_RT_DEVICE_TASK_ABORT, InvalidParamError, error_for_code
from .faults import CLEAR, FaultState
from .health import Condition, HealthCondition, HealthReport
from .kernel import KernelRunner, KernelTable, check_launch, default_block_dim, register_user_kernel
from .node import node_id
from .profiling import TaskProfiler
from .scheduler import Scheduler, Task
from .submit_order import OpOrder, OrderFilter
from .hccl import CollectiveOp, HcclEngine
from .graph import GraphTable
from .tasks import Collective, CopyD2D, ExecGraph, Launch, Memset, Record, StreamOp, Wait, WriteH2D, launch_key
from .tenancy import Owner, TenantQuota, limited, same_tenant, tenant_of

DEFAULT_ARENA = 1 << 30


@dataclass(frozen=True)
class DeviceConfig:
    device_id: int = 0                  #: physical id, unique on the cluster; pointers carry it
    spec: ChipSpec = ASCEND_910B3
    arena_bytes: int = DEFAULT_ARENA
    host_threads: int = 2               #: blocks that can really run at once (caps the block-dim helper)
    cores: int | None = None            #: worker threads; default spec.ai_cores
    node: str = ""                      #: node identity (devices.node); "" = this process's own
    quota: TenantQuota = TenantQuota()  #: what one tenant may hold (authenticated, non-admin callers)
    #: a block that runs longer than this makes the device report itself hung (health condition HANG)
    hang_after_s: float = 60.0
    #: the HBM arena is a named /dev/shm segment (same-node clients and peers may map it); False: anonymous
    shm: bool = True
    #: the key that seals HCCL doorbell messages (devices.hccl_transport); b"" = this process's own
    link_key: bytes = field(default=b"", repr=False)


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
    node: str = ""                      #: node identity (devices.node)


def _live(fn):
    """A device call: refused with the device-lost code once the device is lost."""
    @functools.wraps(fn)
    def call(self, *args, **kw):
        if self.lost.is_set():
            raise self._lost_error()
        return fn(self, *args, **kw)
    return call


class Device:
    def __init__(self, config: DeviceConfig = DeviceConfig()):
        self.config = config
        self.id = config.device_id
        self.spec = config.spec
        self.node = config.node or node_id()
        self.cost = CostModel(config.spec)
        #: the device's fault state: the scheduler, the arena and the HCCL engine read it
        self.faults = FaultState(config.arena_bytes, config.device_id)
        self.arena = HbmArena(config.device_id, config.arena_bytes, faults=self.faults, shared=config.shm)
        self.kernels = KernelTable()        #: kernels the device's tenants registered (and the process's)
        cores = config.cores or config.spec.ai_cores
        self.sched = Scheduler(config.device_id, cores, max_streams=config.spec.max_streams,
                               max_events=config.spec.max_events, faults=self.faults)
        self.lost = threading.Event()       #: set once the device is lost (every later call fails)
        self.lost_reason = ""
        #: what the ``kill`` fault does: None = the device marks itself lost (the process lives); a device
        #: host installs one that ends its process instead (see driver.service)
        self.on_kill = None
        self._on_fault = {"ecc": self.arena.invalidate, "kill": self._killed}
        self.faults.listen(lambda kind: self._on_fault.get(kind, _nothing)())
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._tele_last = (self._t0, [0.0] * cores)
        self._power = config.spec.idle_w
        self._temp_c = config.spec.ambient_c + config.spec.c_per_w * self._power
        self._overheat_seen = 0.0
        self._util = 0.0
        self.closed = False
        self.hccl = HcclEngine(self)
        self._plans: dict = {}
        self.graphs = GraphTable()
        self._order = OrderFilter()              # numbered ops that may arrive twice (devices.submit_order)
        self.prof = TaskProfiler(config.device_id)   #: task records for profiling owners (devices.profiling)
        self.default_stream = self.sched.create_stream(0)

    # ------------------------------------------------------------------ info
    @_live
    def info(self) -> DeviceInfo:
        return DeviceInfo(self.id, self.spec.name, self.spec.short_name, self.spec.ai_cores,
                          self.spec.vector_cores, self.arena.size, f"0000:{0xC1 + self.id:02X}:00.0",
                          self.arena.name, self.node)

    # ------------------------------------------------------------------ memory (host-synchronous)
    @_live
    def malloc(self, size: int, policy: int = 0, owner="", placement: int = 0) -> int:
        """``placement``: where in the arena (:data:`devices.arena.PLACEMENT_BEST_FIT` / ``_LOW`` /
        ``_HIGH``), a hint the caching pool passes for short- and long-lived segments."""
        return self.arena.malloc(size, policy, owner, quota=self.config.quota.limit("hbm_bytes", owner),
                                 placement=placement)

    @_live
    def free(self, ptr: int, owner=None) -> None:
        self.arena.free(ptr, owner)

    @_live
    def memcpy_h2d(self, dst: int, data, owner=None) -> None:
        """Copy host bytes (bytes, memoryview or a uint8-viewable array) into device memory now."""
        src = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
        view = self.arena.view(dst, src.size, owner)
        np.copyto(view, src)

    @_live
    def memcpy_d2h(self, src: int, nbytes: int, owner=None, out=None) -> np.ndarray:
        """Copy device bytes to the host now; returns a uint8 array (or fills ``out``)."""
        view = self.arena.view(src, nbytes, owner)
        if out is None:
            return view.copy()
        np.copyto(out, view)
        return out

    @_live
    def memcpy_d2d(self, dst: int, src: int, nbytes: int, owner=None) -> None:
        d = self.arena.view(dst, nbytes, owner)
        s = self.arena.view(src, nbytes, owner)
        np.copyto(d, s)

    @_live
    def memset(self, ptr: int, value: int, nbytes: int, owner=None) -> None:
        self.arena.view(ptr, nbytes, owner)[:] = value & 0xFF

    @_live
    def mem_info(self) -> tuple[int, int]:
        st = self.arena.stats()
        return st.free, st.total

    @_live
    def check_range(self, ptr: int, nbytes: int, owner=None, write: bool = False) -> int:
        """Validate ``[ptr, ptr + nbytes)`` (bounds, tenant, ECC) and return its arena offset (the driver's
        same-node fast path copies through the mapped arena at that offset)."""
        self._check_range(ptr, nbytes, owner)
        return self.arena.resolve(ptr, nbytes, owner, write)

    @_live
    def mem_view(self, ptr: int, nbytes: int, owner=None) -> np.ndarray:
        """A checked zero-copy uint8 view of device memory (the driver streams device-to-host copies
        from it)."""
        return self.arena.view(ptr, nbytes, owner)

    # ------------------------------------------------------------------ streams / events
    @_live
    def create_stream(self, priority: int = 0, owner="") -> int:
        return self.sched.create_stream(priority, owner, self.config.quota.limit("streams", owner))

    @_live
    def destroy_stream(self, sid: int, owner=None) -> None:
        self.sched.destroy_stream(sid, owner)

    @_live
    def create_event(self, flags: int = 0, owner="") -> int:
        return self.sched.create_event(flags, owner, self.config.quota.limit("events", owner))

    def usage(self, owner) -> dict[str, int]:
        """What the tenant of ``owner`` holds on this device: streams, events and HBM bytes (reserved)."""
        return dict(self.sched.usage(owner), hbm_bytes=self.arena.used_by(owner))

    @_live
    def destroy_event(self, eid: int, owner=None) -> None:
        self.sched.destroy_event(eid, owner)

    @_live
    def synchronize_stream(self, sid: int, timeout_ms: float = -1, owner=None, ops=(),
                           order: OpOrder | None = None) -> None:
        """Block until the stream is idle; ``ops`` are submitted first (a flush riding on the wait; ``order``
        as for :meth:`submit`)."""
        if ops:
            self.submit(ops, owner, order=order)
        self.sched.synchronize_stream(sid, timeout_ms, owner)

    @_live
    def synchronize_event(self, eid: int, timeout_ms: float = -1, owner=None, ops=(),
                          order: OpOrder | None = None) -> None:
        """Block until the event's latest record ran; ``ops`` are submitted first (a flush riding on the wait;
        ``order`` as for :meth:`submit`)."""
        if ops:
            self.submit(ops, owner, order=order)
        self.sched.synchronize_event(eid, timeout_ms, owner)

    @_live
    def synchronize_device(self, timeout_ms: float = -1, owner=None) -> None:
        self.sched.synchronize_device(timeout_ms, owner)

    @_live
    def query_event(self, eid: int, owner=None) -> bool:
        return self.sched.query_event(eid, owner)

    @_live
    def query_stream(self, sid: int, owner=None) -> bool:
        return self.sched.stream_idle(sid, owner)

    @_live
    def event_elapsed(self, start: int, end: int, owner=None) -> tuple[float, float]:
        return self.sched.elapsed(start, end, owner)

    @_live
    def event_timestamp(self, eid: int, owner=None) -> tuple[float, float]:
        """(wall seconds since device start, modeled seconds) of the event's last completed record."""
        w, m = self.sched.event_times(eid, owner)
        return w - self._t0, m

    @_live
    def signal_event(self, eid: int, gen: int, owner=None) -> None:
        self.sched.signal(eid, gen, owner)

    # ------------------------------------------------------------------ task submission
    @_live
    def submit(self, ops: list[StreamOp] | tuple, owner=None, *, order: OpOrder | None = None) -> None:
        """Queue a batch of stream ops, in order.  Validation errors raise here (host-synchronous) and
        nothing of the batch from the failing op on is queued; execution errors surface at the next
        synchronize of the stream.  ``order``: the ops are numbered (:mod:`devices.submit_order`): those
        this owner's session has sent before are not queued again, each run is a batch of its own, and only
        the sender's own runs raise (a carried run's error goes to its sender's copy)."""
        if order is not None:
            self._order.queue(owner, ops, order, lambda fresh: self._queue(fresh, owner))
        else:
            self._queue(ops, owner)

    def _queue(self, ops, owner) -> None:
        run: list[Task] = []
        sid = None
        prof = self.prof.session(owner) if self.prof.active else None
        for op in ops:
            if sid is not None and op.stream != sid:
                self.sched.enqueue(sid, run, owner)
                run = []
            sid = op.stream
            task = self._task(op, owner)
            if prof is not None:
                self._profile_task(prof, op, task, owner)
            run.append(task)
        if run:
            self.sched.enqueue(sid, run, owner)

    def _profile_task(self, session, op: StreamOp, task: Task, owner) -> None:
        unit = "vector"
        if isinstance(op, Launch):
            plan = self._plans.get(_plan_key(op, owner))
            unit = plan.kernel.unit if plan is not None else self.kernels.lookup(op.kernel, owner).unit
        self.prof.attach(session, op, task, time.perf_counter(), unit)

    @_live
    def profile(self, action: str, owner=None) -> dict:
        """Profiling of ``owner``'s own tasks on this device (:mod:`devices.profiling`): ``start`` opens
        its session (records from the next submitted task on), ``stop`` closes it and returns its task
        records (``{"device", "tasks", "dropped"}``).  Host-synchronous; another owner's tasks are never
        recorded for it."""
        if action == "start":
            self.prof.start(owner)
            return {"device": self.id, "tasks": [], "dropped": 0}
        if action == "stop":
            return self.prof.stop(owner)
        raise InvalidParamError(f"unknown profile action {action!r} (start | stop)")

    def _task(self, op: StreamOp, owner) -> Task:
        if isinstance(op, Launch):
            return self._launch_task(op, owner)
        if isinstance(op, Record):
            return Task("record", event=self.sched.event(op.event, owner))
        if isinstance(op, Wait):
            return Task("wait", event=self.sched.event(op.event, owner), gen=op.gen)
        if isinstance(op, CopyD2D):
            self._check_range(op.dst, op.nbytes, owner)
            self._check_range(op.src, op.nbytes, owner)
            return Task("copy", run=lambda b: self._copy_d2d(op.dst, op.src, op.nbytes, owner),
                        duration=self.cost.device_copy(op.nbytes), name="memcpy_d2d")
        if isinstance(op, Memset):
            self._check_range(op.ptr, op.nbytes, owner)
            return Task("copy", run=lambda b: self._fill(op.ptr, op.value, op.nbytes, owner),
                        duration=self.cost.device_copy(op.nbytes) / 2, name="memset")
        if isinstance(op, Collective):
            cop = CollectiveOp(op.comm, op.op, op.send, op.recv, op.count, op.dtype, op.redop, op.root, op.peer)
            self.hccl.check(cop, owner)
            return Task("copy", run=lambda b: self.hccl.run(cop, owner),
                        duration=self.hccl.modeled_seconds(cop, owner), name=f"hccl_{op.op}",
                        skip=lambda err: self.hccl.skip(cop, err, owner))
        if isinstance(op, ExecGraph):
            g = self.graphs.get(op.graph, owner)
            return Task("kernel", run=lambda b: g.run(), duration=g.duration, name="model_ri", skip=g.skip)
        if isinstance(op, WriteH2D):
            self._check_range(op.dst, len(op.data), owner)
            return Task("copy", run=lambda b: self._write(op.dst, op.data, owner),
                        duration=self.cost.host_copy(len(op.data)), name="memcpy_h2d")
        raise InvalidParamError(f"unknown stream op {type(op).__name__}")

    def _check_range(self, ptr: int, nbytes: int, owner) -> None:
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise InvalidParamError(f"bad byte count {nbytes!r}")
        self.arena.resolve(ptr, nbytes, owner)

    # the bodies of copy tasks (on a core thread; the memory was checked when the task was made and is
    # checked again here: it may have been freed or poisoned since)
    def _copy_d2d(self, dst: int, src: int, nbytes: int, owner) -> None:
        np.copyto(self.arena.view(dst, nbytes, owner), self.arena.view(src, nbytes, owner))

    def _fill(self, ptr: int, value: int, nbytes: int, owner) -> None:
        self.arena.view(ptr, nbytes, owner)[:] = value & 0xFF

    def _write(self, dst: int, data, owner) -> None:
        src = np.frombuffer(data, dtype=np.uint8)
        np.copyto(self.arena.view(dst, src.size, owner), src)

    def _launch_task(self, op: Launch, owner) -> Task:
        key = _plan_key(op, owner)
        plan = self._plans.get(key) if key is not None else None
        if plan is None or plan.gen != self.arena.gen or plan.kernel is not self.kernels.lookup(op.kernel, owner):
            plan = self._plan(op, owner)
            if key is not None:
                if len(self._plans) >= 4096:
                    self._plans.clear()
                self._plans[key] = plan

        return Task("kernel", blocks=plan.exec_blocks, run=lambda b: plan.runner().run_block(b),
                    duration=plan.duration, name=op.kernel, block_dim=plan.block_dim,
                    whole=None if plan.kernel.user else plan.run_whole,
                    one=None if plan.kernel.user else plan.one)

    def _plan(self, op: Launch, owner) -> "LaunchPlan":
        """Validate a launch (shapes, dtypes, every tensor inside a live allocation of ``owner``) and
        price it.  Cached per distinct launch while no allocation has been freed since."""
        k = self.kernels.lookup(op.kernel, owner)
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

    @_live
    def release_owner(self, owner, timeout_s: float = 30.0) -> dict:
        """Release everything a departed client holds: graphs, communicators (their running operators
        give up first), streams (queued work dropped, running work waited for, host-blocking up to
        ``timeout_s``), events, registered kernels, then its memory.  Memory stays allocated if its work
        does not finish in time (a hung device)."""
        graphs = self.graphs.drop_owner(owner)
        self._order.drop(owner)
        self.prof.release(owner)
        self.hccl.drop_owner(owner, cancel_only=True)
        quiet = self.sched.drop_owner(owner, timeout_s)
        comms = self.hccl.drop_owner(owner)
        kernels = self.kernels.drop_owner(owner)
        freed = self.arena.free_owner(owner) if quiet else 0
        return {"graphs": graphs, "communicators": comms, "kernels": kernels, "allocations": freed,
                "quiesced": quiet}

    # ------------------------------------------------------------------ user kernels
    def register_kernel(self, name: str, fn, owner=None) -> None:
        """Install user kernel ``fn`` as ``name``: for ``owner``'s tenant only (released with that client),
        or -- with no owner, the in-process API -- in this process's table.  A built-in's name is refused
        (InvalidParamError).  The kernel is code that runs in this process."""
        if owner is None:
            register_user_kernel(name, fn, replace=True)
        else:
            self.kernels.register(name, fn, owner)

    def install_kernels(self, packages) -> None:
        """Make the kernels of ``packages`` (loaded :class:`devices.kernel_packages.Package` s: the node's
        installed packages) launchable by every caller, replacing the ones installed before.  Nothing
        blocks; a reset keeps them."""
        self.kernels.install(packages)

    def kernel_names(self, owner=None) -> dict:
        """The user kernels ``owner`` can launch by name here: ``node`` (installed packages' and this
        process's, every caller's), ``installed`` (name -> package) and ``registered`` (its tenant's)."""
        return {"node": self.kernels.node_kernels(), "installed": self.kernels.installed(),
                "registered": self.kernels.names(owner) if owner is not None else []}

    # ------------------------------------------------------------------ captured graphs (aclmdlRI)
    @_live
    def graph_create(self, ops, owner=None) -> int:
        """Validate and bind a captured op sequence (host-synchronous); returns the graph id.  A bad op
        raises its launch-time error and nothing is kept."""
        return self.graphs.create(ops, owner, lambda op: self._task(op, owner), self.arena)

    @_live
    def graph_destroy(self, gid: int, owner=None) -> None:
        self.graphs.destroy(gid, owner)

    @_live
    def graph_rebind(self, gid: int, moves, owner=None) -> int:
        """Re-point a graph's captured ops after memory moved (live defragmentation): every pointer
        inside an ``(old, new, nbytes)`` range is remapped to the same offset from ``new``, and the ops
        are validated and bound again (host-synchronous).  Returns how many pointers changed; a remap
        that leaves an op invalid raises its launch-time error and keeps the graph as it was."""
        return self.graphs.rebind(gid, owner, moves)

    @_live
    def graph_info(self, gid: int, owner=None) -> dict:
        return self.graphs.get(gid, owner).info()

    # ------------------------------------------------------------------ HCCL communicators
    @_live
    def hccl_info(self) -> dict:
        """What peers need to reach this device (node, and each transport's endpoint)."""
        return self.hccl.info()

    @_live
    def hccl_comm_init(self, comm_id: str, rank: int, peers: list[dict], config: dict | None = None,
                       owner=None) -> None:
        self.hccl.comm_init(comm_id, rank, peers, config, owner)

    @_live
    def hccl_comm_join(self, comm_id: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                       timeout_s: float = 120.0, owner=None) -> list[dict]:
        """Root-info rendezvous (host-blocking up to ``timeout_s``)."""
        return self.hccl.comm_join(comm_id, rank, nranks, root, config, timeout_s, owner)

    @_live
    def hccl_comm_destroy(self, comm_id: str, owner=None) -> None:
        self.hccl.comm_destroy(comm_id, owner)

    @_live
    def hccl_async_error(self, comm_id: str, owner=None) -> int:
        return self.hccl.async_error(comm_id, owner)

    @_live
    def hccl_read(self, comm_id: str, ptr: int, nbytes: int) -> np.ndarray:
        """A peer device on another node reads this device's HBM (the cross-node transport's serving end;
        host-synchronous).  ``comm_id`` is the engine's scoped id; only ranges a running operator of that
        communicator exposes are served (:meth:`devices.hccl.HcclEngine.read_for_peer`)."""
        return self.hccl.read_for_peer(comm_id, ptr, nbytes)

    @_live
    def hccl_deliver(self, msg) -> bool:
        """A control message from a peer on another node (the cross-node transport's serving end)."""
        return self.hccl.deliver(msg)

    # ------------------------------------------------------------------ faults
    @_live
    def inject_fault(self, kind: str, **params) -> None:
        """Chaos: apply fault ``kind`` (see :data:`devices.faults.FAULT_KINDS` for the kinds and their
        parameters; ``duration_ms`` makes a timed fault clear itself).  Host-synchronous; the effect on work
        already queued follows (a hang holds it, a slow fault stretches it ...).  ``kill``: the device is
        lost -- every later call fails with ACL_ERROR_RT_DEVICE_TASK_ABORT -- unless a host installed
        ``on_kill`` (a device actor's process then dies).  ``"clear"`` is :meth:`clear_fault`.
        InvalidParamError for an unknown kind or a bad parameter."""
        if kind == CLEAR:
            if params:
                raise InvalidParamError(f"clear takes no parameters; not {', '.join(sorted(params))}")
            self.clear_fault()
            return
        self.faults.apply(kind, params)

    @_live
    def clear_fault(self, kind: str | None = None) -> None:
        """Undo the faults of ``kind`` (every fault when None); normal operation resumes (hung cores run
        again, poisoned ranges are readable again).  Host-synchronous."""
        self.faults.clear(kind)

    @property
    def hung(self) -> bool:
        """Whether a ``hang`` fault holds the cores (a hung device misses its heartbeats)."""
        return self.faults.hung()

    @property
    def is_lost(self) -> bool:
        """True once the device can serve no more calls: lost (fault ``kill``, :meth:`mark_lost`) or closed."""
        return self.closed or self.lost.is_set()

    def mark_lost(self, reason: str) -> bool:
        """The device is lost: queued and running work fails with ACL_ERROR_RT_DEVICE_TASK_ABORT, blocked
        synchronizes wake with it, HCCL peers see this rank gone, and every later call is refused with it.
        Only :meth:`close` works afterwards.  True if this call marked it (once)."""
        with self._lock:
            if self.lost.is_set():
                return False
            self.lost_reason = reason
            self.lost.set()
        self.sched.abort(ACL_ERROR_RT_DEVICE_TASK_ABORT, f"device {self.id} is lost: {reason}")
        self.hccl.abort()
        self.faults.close()
        return True

    def _killed(self) -> None:
        if self.on_kill is not None:
            self.on_kill()
        else:
            self.mark_lost("fault kill")

    def _lost_error(self):
        return error_for_code(ACL_ERROR_RT_DEVICE_TASK_ABORT, f"device {self.id} is lost: {self.lost_reason}")

    # ------------------------------------------------------------------ telemetry
    @_live
    def memory_holders(self, viewer=None) -> list[dict]:
        """Who holds HBM here, largest first: tenant, client, reserved bytes, allocations -- for a tenant
        ``viewer`` only its own tenant's clients, for the admin or an in-process caller (None) everyone."""
        return [{"tenant": tenant_of(o) or "", "client": o.client if isinstance(o, Owner) else "", "hbm_bytes": b,
                 "allocations": n} for o, b, n in self.arena.holders() if not limited(viewer) or same_tenant(o, viewer)]

    def telemetry(self, owner=None) -> dict:
        """The device's state as npu-smi shows it; ``holders``: :meth:`memory_holders` as ``owner`` may
        see them (a tenant: its own tenant's; the admin or an in-process caller, None: everyone's)."""
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
        self._thermal(power, dt)
        st = self.arena.stats()
        ss = self.sched.stats()
        report = self.health_report()
        return {
            "device_id": self.id, "chip": s.name, "name": s.short_name,
            "health": report.level, "conditions": list(report.conditions),
            "hbm_total": st.total, "hbm_used": st.used, "hbm_free": st.free, "hbm_peak": st.peak,
            "hbm_largest_free": st.largest_free, "allocations": st.allocations,
            "fragmentation": st.fragmentation, "canary_violations": st.canary_violations,
            "aicore_util": [round(u, 1) for u in per_core], "aicore_util_avg": round(util * 100, 1),
            "tasks_run": ss["tasks_run"], "queued": ss["queued"], "streams": ss["streams"],
            "events": ss["events"], "modeled_time_s": ss["model_now_s"],
            "power_w": round(power, 1), "temperature_c": round(self._temp_c, 1),
            "uptime_s": now - self._t0, "busy_s": sum(busy),
            "holders": self.memory_holders(owner),
        }

    def _thermal(self, power: float, dt: float) -> None:
        """The die temperature follows the power draw with a 5 s time constant; an ``overheat`` fault moves
        it at once, and so does the fault's end (cleared or expired)."""
        s = self.spec
        overheat = self.faults.overheat_c()
        target = s.ambient_c + s.c_per_w * power + overheat
        if overheat or overheat != self._overheat_seen:
            self._temp_c = target
        else:
            self._temp_c += (target - self._temp_c) * min(1.0, dt / 5.0)
        self._overheat_seen = overheat
        self._power = power

    @_live
    def health(self) -> tuple[str, list[str]]:
        """(OK | Warning | Alarm | Critical, reasons): :meth:`health_report` as npu-smi shows it."""
        return self.health_report().as_tuple()

    @_live
    def health_report(self) -> HealthReport:
        """The active conditions (faults, the thermal model's alarms, overwritten guard bytes) and the
        worst level among them (host-synchronous; the power draw as of the last :meth:`telemetry`)."""
        conds = self.faults.conditions()
        self._thermal(self._power, 0.0)
        temp = self._temp_c
        alarm_c, critical_c = self.config.spec.temp_alarm_c, self.config.spec.temp_critical_c
        if temp >= alarm_c:
            level = "Critical" if temp >= critical_c else "Alarm"
            limit = critical_c if temp >= critical_c else alarm_c
            conds.append(HealthCondition(Condition.OVERHEAT, level, f"temperature {temp:.0f} C >= {limit:.0f} C",
                                         value=round(temp, 1)))
        canaries = self.arena.stats().canary_violations
        if canaries:
            conds.append(HealthCondition(Condition.CANARY, "Warning", "HBM guard bytes overwritten",
                                         value=canaries))
        stuck = self.sched.longest_running()
        if stuck is not None and stuck[0] > self.config.hang_after_s:
            secs, name, sid = stuck
            conds.append(HealthCondition(Condition.HANG, "Critical",
                                         f"cores hung: task {name} on stream {sid} has run for {secs:.1f} s "
                                         f"(> {self.config.hang_after_s:g} s)", value=round(secs, 3)))
        return HealthReport.of(conds)

    # ------------------------------------------------------------------ lifecycle
    @_live
    def reset(self, timeout_s: float = 10.0) -> None:
        """Abort all work and drop every allocation, stream, event, graph, communicator and registered
        kernel (HBM starts empty); the chip restarts, so every fault is cleared too.  Works in any state:
        queued work is dropped, communicators are closed first (operators waiting for peers give up), held
        cores are let go, and running blocks are waited for (host-blocking, up to ``timeout_s``) before the
        HBM is dropped."""
        self.sched.abort(message=f"device {self.id} reset")
        self.hccl.reset()
        self.faults.clear()                  # hung cores wake up (and skip the aborted blocks)
        self.sched.quiesce(timeout_s)
        self.sched.clear_abort()
        self.sched.clear()
        self.graphs.clear()
        self.kernels.clear()
        self._plans.clear()
        self.arena.reset()
        self.default_stream = self.sched.create_stream(0)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.faults.close()
        self.hccl.close()
        self.sched.close()
        self.arena.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LaunchPlan:
    """A validated launch and, once it first runs, its bound views (reused while the arena's
    generation is unchanged: no allocation freed, so every view still points at live memory).

    Priced and run apart: the cost model prices ``block_dim`` blocks (the modeled clock), while a built-in
    kernel runs as ``exec_blocks`` = min(block_dim, the device's host threads) blocks -- each a larger share
    of the same split rule, so a matmul is one BLAS call per thread that can really run, not one slice per
    emulated AI Core one after another -- and as one call (:meth:`run_whole`) where its blocks would run
    one after another anyway (a graph replay).  A user kernel runs exactly ``block_dim`` blocks: its code
    may depend on them."""

    __slots__ = ("dev", "kernel", "op", "attrs", "block_dim", "exec_blocks", "duration", "owner", "gen",
                 "_runners", "_lock")

    def __init__(self, dev, kernel, op, attrs, block_dim, duration, owner, gen):
        self.dev, self.kernel, self.op, self.attrs = dev, kernel, op, attrs
        self.block_dim, self.duration, self.owner, self.gen = block_dim, duration, owner, gen
        self.exec_blocks = block_dim if kernel.user else max(1, min(block_dim, dev.config.host_threads))
        self._runners: dict[int, tuple] = {}
        self._lock = threading.Lock()

    def runner(self, blocks: int = 0) -> KernelRunner:
        """The kernel bound to its views, run as ``blocks`` blocks (0: :attr:`exec_blocks`)."""
        blocks = blocks or self.exec_blocks
        arena = self.dev.arena
        with self._lock:
            cached = self._runners.get(blocks)
            if cached is not None and cached[0] == arena.gen:
                return cached[1]
            gen = arena.gen
            ins = [arena.typed_view(d.ptr, d.shape, d.dtype, self.owner) for d in self.op.inputs]
            for a in ins:
                a.flags.writeable = False
            outs = [arena.typed_view(d.ptr, d.shape, d.dtype, self.owner) for d in self.op.outputs]
            r = KernelRunner(self.kernel, ins, outs, self.attrs, blocks, self.dev.id)
            self._runners[blocks] = (gen, r)
            return r

    def run_whole(self) -> None:
        """The whole launch as one block (one call of the kernel over every tensor; built-in kernels)."""
        self.runner(1).run_block(0)

    def one(self) -> KernelRunner:
        """The runner of the whole launch as one block, bound to views of the arena's current generation."""
        return self.runner(1)


def _nothing() -> None:
    pass


def _plan_key(op: Launch, owner):
    key = launch_key(op)
    return None if key is None else (key, owner)


def local_config(device_id: int, **kw) -> DeviceConfig:
    return replace(DeviceConfig(), device_id=device_id, **kw)
