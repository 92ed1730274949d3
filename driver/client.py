"""The host end of the driver: :class:`RemoteDevice`, a :class:`runtime.backend.DeviceHandle` over gRPC.

One channel per device.  Every RPC goes through :meth:`RemoteDevice._rpc`, which adds the metadata
(bearer credential -- a tenant credential, or the cluster token for the admin --, client id, device id) and
a deadline, counts the call (:attr:`rpc_count`), and
turns a gRPC failure back into the typed CANN exception: the server's structured error detail when present
(code, class, and the HcclResult of a failed collective), else a code for the status (UNAVAILABLE /
CANCELLED -> :class:`DeviceLostError` ACL_ERROR_RT_DEVICE_TASK_ABORT, DEADLINE_EXCEEDED ->
ACL_ERROR_RT_TIMEOUT, ...; see :func:`driver.wire.code_for_status`).

Device loss: :meth:`watch_health` keeps a server-streaming heartbeat open.  When that stream breaks (or
goes silent for ``stale_after_s``) the device is marked lost at once (:attr:`lost`, :meth:`mark_lost`),
the callback hears about it, blocked ``synchronize_*`` calls are woken, and every later call raises
DeviceLostError (ACL_ERROR_RT_DEVICE_TASK_ABORT) without touching the network -- the same contract as an
in-process :class:`devices.device.Device` that is lost.

Leases: a client must hold a lease on a device before it creates anything there (:meth:`open_lease`;
``runtime.cluster.remote.RemoteBackend`` opens one per device); what it created is released when the
lease ends.  Reading needs none.

Same-node fast path: when the device is on this node (its published node identity equals this process's,
:mod:`driver.node`) and its HBM arena segment can be mapped here, a host copy is one small ``CheckRange``
RPC (the device checks bounds, tenant and ECC poison and returns the arena offset) plus one numpy memcpy
into/out of the mapped segment.  Otherwise (or with ``same_node=False``) copies stream in chunks over gRPC.
"""
from __future__ import annotations

import logging
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from . import wire  # first: it sets gRPC's log verbosity before gRPC loads
from .wire import dms, rms

import grpc  # noqa: E402,I100
import numpy as np  # noqa: E402

from devices.arena import ARENA_HEADER, SHM_DIR, attach, header_gen  # noqa: E402
from driver.credentials import claims_of  # noqa: E402
from devices.device import DeviceInfo  # noqa: E402
from devices.errors import (ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_RT_DEVICE_TASK_ABORT,  # noqa: E402
                            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT, ACL_ERROR_RT_NO_DEVICE, ACL_ERROR_RT_NO_PERMISSION,
                            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_ERROR_RT_TIMEOUT, AclError, InvalidDeviceError,
                            InvalidParamError, error_for_code)
from devices.faults import CLEAR  # noqa: E402
from devices.submit_order import OpOrder  # noqa: E402
from devices.tasks import WriteH2D  # noqa: E402

from .calls import DMS, RMS, Call, DeviceCalls  # noqa: E402
from .node import same_node as nodes_match, this_node  # noqa: E402

log = logging.getLogger("vnpu.driver.client")

_SYNC_TIMEOUT_CODES = (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, ACL_ERROR_RT_EVENT_SYNC_TIMEOUT)
_ON_NODE = object()     #: a kernel name the device resolves itself (see RemoteDevice._ship_user_kernels)
#: the first slice of a synchronize is a blocking call of at most this (see RemoteDevice._synchronize)
SHORT_WAIT_MS = 50.0
#: statuses with which a live device refuses a watch (bad token, wrong device ...): not a device loss
_REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED,
             grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED)
WATCH_RENEW_S = 3600.0          #: a health watch is one call with this deadline, renewed seamlessly
LEASE_BEAT_MS = 2000            #: heartbeat period of a lease watch (beats only keep the stream observably alive)
COPY_BYTES_PER_S = 100e6        #: deadline allowance for big chunked copies (far below loopback speed)
_COPY_ALLOWANCE_MAX = 1 << 42   #: bytes the allowance counts at most (an absurd size must not overflow a deadline)


@dataclass(frozen=True)
class RemoteDeviceInfo(DeviceInfo):
    """``DeviceInfo`` plus what the remote end tells about where it runs."""
    arena_size: int = 0
    node_address: str = ""
    host_pid: int = 0
    hostname: str = ""
    boot_id: str = ""


@dataclass(frozen=True)
class HealthEvent:
    """What a health-watch callback receives: one heartbeat, or (``lost=True``) the news of device loss."""
    device_id: int
    seq: int = 0
    health: str = "Unknown"
    reasons: tuple = ()
    telemetry: dict = field(default_factory=dict, compare=False)
    lost: bool = False
    error: AclError | None = None
    conditions: tuple = ()          #: the beat's HealthCondition objects (what failover reads)


def _host_bytes(data) -> np.ndarray:
    """Host data (bytes-like or ndarray) as a flat contiguous uint8 array (no copy when possible)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        raise InvalidParamError(f"host data must be bytes-like or a numpy array, got {type(data).__name__}") \
            from None


class RemoteDevice(DeviceCalls):
    """A device reached over gRPC (same surface as :class:`devices.device.Device`, minus ``owner``).  The
    methods that are one unary RPC each are the rows of :class:`driver.calls.DeviceCalls` (inherited);
    the rest are written out here.

    ``same_node``: None (default) decides by node identity (:mod:`driver.node`); True maps the device's
    arena for host copies whenever it can be mapped here; False never does."""

    def __init__(self, address: str, token: str, device_id: int, *, client_id: str | None = None,
                 timeout_s: float = 30.0, same_node: bool | None = None):
        self.id = int(device_id)
        self.address = address
        self.client_id = client_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.timeout_s = float(timeout_s)
        self.same_node = same_node
        self._md = ((wire.AUTH_KEY, f"Bearer {token}"), (wire.CLIENT_KEY, self.client_id),
                    (wire.DEVICE_KEY, str(self.id)))
        self._channel = grpc.insecure_channel(address, options=wire.channel_options())
        self._dms = wire.DeviceManagementStub(self._channel)
        self._rms = wire.ResourceManagementStub(self._channel)
        self._stubs = {DMS: self._dms, RMS: self._rms}
        self.lost = threading.Event()       #: set once the device is known dead
        self.lost_reason = ""
        self.rpc_count = 0                  #: RPCs issued (streams count once)
        #: of those, the waits that continue a blocking synchronize past its first bounded wait (how many
        #: depends on how long the device takes, not on what the caller batched)
        self.wait_continuations = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)    # notified when the last unary call in flight ends
        self._inflight = 0                  # unary calls in flight (what close(drain_s) waits for)
        self._closing = False
        self._waiters: set = set()          # in-flight interruptible calls (futures), cancelled on loss
        self._info: RemoteDeviceInfo | None = None
        self._shm = None                    # (mmap, uint8 array) of the device arena, same node only
        self._shm_checked = False
        self._watches: list[HealthWatch] = []
        self._shipped: dict[str, object] = {}
        self._templates = wire.LaunchTemplates()
        self._ranges: dict[tuple[int, int], tuple[int, int]] = {}
        self._closed = False

    # ------------------------------------------------------------------ the one call helper
    def _rpc(self, method, request, timeout: float | None = None, *, consume=None, interruptible: bool = False):
        """Issue one RPC with metadata and a deadline; map failures to typed AclErrors.

        ``consume(it)`` reads a server stream inside the error mapping; ``interruptible`` calls (the
        blocking synchronizes) return early with DeviceLostError when the device is marked lost."""
        if self.lost.is_set():
            raise self._lost_error()
        if self._closed:
            raise error_for_code(ACL_ERROR_RT_NO_DEVICE, f"client of device {self.id} is closed")
        unary = consume is None
        with self._lock:
            self.rpc_count += 1
            self._inflight += unary
        t = self.timeout_s if timeout is None else timeout
        try:
            if interruptible:
                return self._interruptible(method, request, t)
            resp = method(request, timeout=t, metadata=self._md)
            return consume(resp) if consume is not None else resp
        except grpc.RpcError as e:
            raise self._error(e) from None
        except ValueError as e:              # "Cannot invoke RPC on closed channel!"
            if self._closed:
                raise error_for_code(ACL_ERROR_RT_NO_DEVICE, f"client of device {self.id} is closed") from None
            raise
        finally:
            if unary:
                with self._lock:
                    self._inflight -= 1
                    if not self._inflight:
                        self._idle.notify_all()

    def _unary(self, call: Call, request):
        """One row of the table (:mod:`driver.calls`): its RPC with ``request``, through :meth:`_rpc`."""
        return self._rpc(getattr(self._stubs[call.service], call.rpc), request)

    def _copy_timeout(self, nbytes) -> float:
        """The deadline of a chunked copy of ``nbytes``: the call timeout plus time for the bytes."""
        n = nbytes if isinstance(nbytes, int) else 0
        return self.timeout_s + min(max(0, n), _COPY_ALLOWANCE_MAX) / COPY_BYTES_PER_S

    def _interruptible(self, method, request, t: float):
        """A call that device loss cancels (the caller waits on the call itself: no extra thread hop)."""
        fut = method.future(request, timeout=t, metadata=self._md)
        with self._lock:
            if self.lost.is_set():
                fut.cancel()
                raise self._lost_error()
            self._waiters.add(fut)
        try:
            return fut.result()
        except grpc.FutureCancelledError:
            raise self._lost_error() from None
        finally:
            with self._lock:
                self._waiters.discard(fut)

    def _error(self, e: grpc.RpcError) -> AclError:
        status = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = (e.details() if hasattr(e, "details") else "") or ""
        code = cls = hccl = None
        try:
            found = wire.error_from_trailers(e.trailing_metadata())
        except Exception:  # noqa: BLE001 - no (readable) metadata on this kind of failure
            found = None
        if found is not None:
            code, cls, hccl = found
        if code is None:
            if self._closed:
                code, details = ACL_ERROR_RT_NO_DEVICE, f"client of device {self.id} was closed during the call"
            else:
                code = wire.code_for_status(status)
                details = f"device {self.id} at {self.address}: {status.name}: {details}"
        err = error_for_code(code, details, cls, hccl_code=hccl)
        err.grpc_status = status
        return err

    def _lost_error(self) -> AclError:
        return error_for_code(ACL_ERROR_RT_DEVICE_TASK_ABORT,
                              f"device {self.id} at {self.address} is lost: {self.lost_reason}")

    def mark_lost(self, reason: str) -> bool:
        """Flag the device lost (once): every blocked synchronize wakes with, and every later call fails
        with, DeviceLostError (no network round trip).  True if this call flagged it."""
        with self._lock:
            if self.lost.is_set():
                return False
            self.lost_reason = reason
            self.lost.set()
            waiters = list(self._waiters)
        for fut in waiters:
            fut.cancel()
        log.warning("device %d at %s lost: %s", self.id, self.address, reason)
        return True

    @property
    def is_lost(self) -> bool:
        return self.lost.is_set()

    # ------------------------------------------------------------------ info / health (DMS)
    def info(self, refresh: bool = False) -> RemoteDeviceInfo:
        if self._info is None or refresh:
            d = wire.info_from_pb(self._rpc(self._dms.GetDeviceInfo, dms.GetDeviceInfoRequest()))
            info = RemoteDeviceInfo(**d)
            if info.device_id != self.id:
                raise InvalidDeviceError(f"{self.address} serves device {info.device_id}, not device {self.id}")
            self._info = info
        return self._info

    def health(self) -> tuple[str, list[str]]:
        """``(level, reasons)`` as npu-smi shows them."""
        return wire.health_status_from_pb(self._rpc(self._dms.GetHealth, dms.GetHealthRequest()))

    def inject_fault(self, kind: str, **params) -> None:
        """Chaos, as :meth:`devices.device.Device.inject_fault` (kinds and parameters:
        :data:`devices.faults.FAULT_KINDS`); ``kill`` ends the device's host process after the reply."""
        self._rpc(self._dms.InjectFault, wire.fault_request(kind, params))

    def clear_fault(self, kind: str | None = None) -> None:
        """Undo the faults of ``kind`` (every fault when None), as :meth:`devices.device.Device.clear_fault`."""
        if kind == CLEAR:
            raise InvalidParamError(f"{CLEAR!r} is not a fault kind: clear_fault() clears every kind")
        self._rpc(self._dms.ClearFault, wire.message(dms.ClearFaultRequest, kind=kind or ""))

    def health_stream(self, req: dms.WatchHealthRequest, consume, timeout: float) -> None:
        """One WatchHealth stream (what a :class:`HealthWatch` renews): ``consume(it)`` reads its beats.
        Host-blocking until the stream ends or ``timeout`` (s) passes; failures as typed AclErrors."""
        self._rpc(self._dms.WatchHealth, req, timeout=timeout, consume=consume)

    def watch_health(self, interval_ms: int, callback=None, *, stale_after_s: float | None = None,
                     lease: bool = False) -> "HealthWatch":
        """Start a background heartbeat watch; ``callback(HealthEvent)`` runs for every beat and once with
        ``lost=True`` if the stream breaks.  The returned :class:`HealthWatch` also works as the loss
        event (``watch.wait(timeout)``, ``watch.is_set()``).  ``stale_after_s`` (default max(10 s, 10
        intervals); 0 = off) also declares the device lost when beats stop arriving on a stream that stays
        open.  With ``lease`` the watch is this client's lease (:mod:`driver.lease`): once it ends for
        good, the device releases what this client still holds."""
        w = HealthWatch(self, int(interval_ms), callback, stale_after_s, lease)
        with self._lock:
            self._watches.append(w)
        w.start()
        if lease:                           # the lease must be in place before this client creates anything
            if not w.wait_open(self.timeout_s) and w.error is not None:
                raise w.error
        return w

    def open_lease(self, interval_ms: int = LEASE_BEAT_MS) -> "HealthWatch":
        """This client's lease on the device (host-blocking until the device has registered it): needed
        to create anything there, and what the device releases once it ends for good.  A refusal (bad
        credential, watch quota) raises; a lost device just shows as lost."""
        return self.watch_health(interval_ms, None, stale_after_s=0, lease=True)

    def revoke(self, tokens=(), tenants: dict | list = ()) -> None:
        """Admin: revoke tenant credentials (``tokens``) and every credential issued so far to ``tenants``
        (names, or name -> the time in ms before which their credentials were issued) on this device."""
        t_now = int(time.time() * 1000)
        tenants = tenants if isinstance(tenants, dict) else {t: t_now for t in tenants}
        req = dms.RevokeRequest(credentials=[{"id": c.token_id, "expires_s": c.expires_s}
                                             for c in map(claims_of, tokens)],
                                tenants=[{"tenant": k, "issued_before_ms": int(v)} for k, v in tenants.items()])
        self._rpc(self._dms.Revoke, req)

    def reload_kernels(self) -> dict:
        """Admin: the device loads its node's kernel packages again (host-synchronous; the device imports
        them).  Returns ``{"packages": {name: {"path", "kernels"}}, "errors": {file: line}}``."""
        return json.loads(self._rpc(self._dms.ReloadKernels, dms.ReloadKernelsRequest()).json)

    # ------------------------------------------------------------------ memory (RMS)
    def _arena(self) -> np.ndarray | None:
        """The device arena mapped here (same node), or None.  Decided once per client."""
        if self._shm is not None:
            return self._shm[1]
        if self.same_node is False or self._shm_checked:
            return None
        info = self.info()
        with self._lock:
            if self._shm_checked or self._closed:
                return self._shm[1] if self._shm else None
            self._shm_checked = True
            if self.same_node is None and not nodes_match(info.node, this_node()):
                return None                                  # another node (or a simulated one)
            path = os.path.join(SHM_DIR, info.arena_name)
            try:
                if not info.arena_name or os.stat(path).st_size != info.arena_size + ARENA_HEADER:
                    return None
                self._shm = attach(info.arena_name, info.arena_size, info.device_id)
            except (OSError, ValueError):
                return None
            return self._shm[1]

    @property
    def fast_path(self) -> bool:
        """Whether host copies go through the shared-memory arena."""
        return self._arena() is not None

    def _check_range(self, ptr: int, nbytes: int, write: bool) -> int:
        """The device validates the range (bounds, tenant, ECC) and returns its arena offset.  A range it
        validated before is not asked again while the arena's published generation is unchanged (no
        allocation freed, nothing poisoned since)."""
        gen = header_gen(self._shm[1], self._info.arena_size) if self._shm is not None else None
        key = (ptr, nbytes)
        hit = self._ranges.get(key)
        if hit is not None and gen is not None and hit[0] == gen:
            return hit[1]
        off = self.check_range(ptr, nbytes, write)
        if gen is not None:
            if len(self._ranges) > 4096:
                self._ranges.clear()
            self._ranges[key] = (gen, off)
        return off

    def memcpy_h2d(self, dst: int, data) -> None:
        src = _host_bytes(data)
        n = src.size
        arena = self._arena()
        if arena is not None:
            off = self._check_range(dst, n, True)
            np.copyto(arena[off:off + n], src)
            return
        first = wire.message(rms.H2DChunk, dst=dst, total=n, data=src[:wire.CHUNK_BYTES].tobytes())

        def chunks():
            yield first
            for i in range(wire.CHUNK_BYTES, n, wire.CHUNK_BYTES):
                yield rms.H2DChunk(data=src[i:i + wire.CHUNK_BYTES].tobytes())

        self._rpc(self._rms.MemcpyH2D, chunks(), timeout=self._copy_timeout(n))

    def memcpy_d2h(self, src: int, nbytes: int, out=None) -> np.ndarray:
        arena = self._arena()
        if arena is not None:
            off = self._check_range(src, nbytes, False)
            view = arena[off:off + nbytes]
            if out is None:
                return view.copy()
            np.copyto(out, view)
            return out
        req = wire.message(rms.D2HRequest, src=src, nbytes=nbytes)

        target = None
        if out is not None and isinstance(out, np.ndarray) and out.flags.c_contiguous and out.nbytes == nbytes:
            target = out.reshape(-1).view(np.uint8)

        def consume(it):
            res = target
            pos = 0
            for chunk in it:
                if res is None:              # allocated once the device has checked the range (it sent data)
                    res = np.empty(nbytes, dtype=np.uint8)
                k = len(chunk.data)
                if pos + k > res.size:
                    raise AclError(f"device sent more than the {nbytes} B asked for", code=ACL_ERROR_INTERNAL_ERROR)
                res[pos:pos + k] = np.frombuffer(chunk.data, dtype=np.uint8)
                pos += k
            if res is None:
                res = np.empty(0, dtype=np.uint8)
            if pos != res.size or pos != nbytes:
                raise AclError(f"device-to-host stream ended after {pos} of {nbytes} B", code=ACL_ERROR_INTERNAL_ERROR)
            return res

        res = self._rpc(self._rms.MemcpyD2H, req, timeout=self._copy_timeout(nbytes),
                        consume=consume)
        if out is None or target is not None:
            return out if target is not None else res
        np.copyto(out, res)
        return out

    # ------------------------------------------------------------------ streams / events
    # ------------------------------------------------------------------ work
    def submit(self, ops, *, order: OpOrder | None = None) -> None:
        """Queue a batch of stream ops: one RPC (several only when inline H2D data would exceed the
        message limit; they go in order).  ``order``: the ops' numbers (:mod:`devices.submit_order`)."""
        ops = ops if isinstance(ops, (list, tuple)) else list(ops)
        if not ops:
            return
        self._ship_user_kernels(ops)
        batches = _split(ops)
        orders = order.parts([len(b) for b in batches]) if order is not None else [None] * len(batches)
        for batch, part in zip(batches, orders):
            try:
                self._rpc(self._rms.Submit, self._submit_request(batch, part))
            except AclError as e:
                if not wire.is_unknown_template(e):
                    raise
                self._templates.reset()          # the device forgot them (restarted): send in full
                self._rpc(self._rms.Submit, self._submit_request(batch, part))

    def _submit_request(self, ops, order: OpOrder | None):
        """A SubmitRequest of ``ops``: those ``order`` carries for other waits in full, numbered by it."""
        req = wire.submit_request(ops, self._templates, plain=order.carried if order is not None else 0)
        wire.set_order(req, order)
        return req

    # ------------------------------------------------------------------ captured graphs (aclmdlRI)
    def graph_create(self, ops) -> int:
        """Send a capture's ops in full; the device validates and binds them (host-synchronous)."""
        ops = list(ops)
        self._ship_user_kernels(ops)
        return self._rpc(self._rms.GraphCreate, wire.submit_request(ops)).value

    def graph_rebind(self, gid: int, moves) -> int:
        """Re-point a graph's ops after memory moved (``(old, new, nbytes)`` triples); host-synchronous."""
        return self._rpc(self._rms.GraphRebind, wire.graph_rebind_request(gid, moves)).value

    # ------------------------------------------------------------------ profiling
    def list_kernels(self) -> dict:
        """The user kernels this client can launch by name on the device (one RPC): ``node`` (the installed
        packages' and the device process's), ``installed`` (name -> package), ``registered`` (its
        tenant's) and ``upload`` (whether it may :meth:`register_kernel` code)."""
        return json.loads(self._rpc(self._rms.ListKernels, rms.Empty()).json)

    def _ship_user_kernels(self, ops) -> None:
        """A launch names a user kernel of this process's registry: the device's kernel of that name runs
        when its node has one (an installed package's); otherwise the kernel is sent by value -- only where
        the device accepts code from this client (the admin of a cluster started with
        ``--allow-pickled-kernels``); anyone else gets ACL_ERROR_RT_NO_PERMISSION here, and no code leaves
        this process.  One :meth:`list_kernels` per kernel name not yet resolved."""
        from devices.kernel import registered
        from devices.tasks import Launch
        for op in ops:
            if type(op) is not Launch:
                continue
            k = registered(op.kernel)              # None: the device's own (or one registered there directly)
            if k is None or not k.user or self._shipped.get(op.kernel) in (k.run, _ON_NODE):
                continue
            there = self.list_kernels()
            if op.kernel in there["node"]:
                self._shipped[op.kernel] = _ON_NODE
            elif there["upload"]:
                self.register_kernel(op.kernel, k.run)
            else:
                raise AclError(f"kernel {op.kernel!r} is a Python function of this program, and device {self.id} "
                               f"accepts no code from it: launch a kernel of a package installed on the device's "
                               f"node (the cluster's admin installs it: vnpu kernels install FILE)",
                               code=ACL_ERROR_RT_NO_PERMISSION)

    def register_kernel(self, name: str, fn) -> None:
        """Admin, on a cluster started with ``--allow-pickled-kernels`` only: install a Python per-block
        kernel on the device (pickled by value) for this client's tenant (released with this client's
        lease); it runs in the device's process.  Anyone else: ACL_ERROR_RT_NO_PERMISSION, and the device
        does not read the payload."""
        import sys

        from ray import cloudpickle
        mod = sys.modules.get(getattr(fn, "__module__", ""), None)
        if mod is not None and not mod.__name__.startswith(("devices", "runtime", "driver")):
            cloudpickle.register_pickle_by_value(mod)
        try:
            code = cloudpickle.dumps(fn)
        finally:
            if mod is not None and not mod.__name__.startswith(("devices", "runtime", "driver")):
                cloudpickle.unregister_pickle_by_value(mod)
        self.register_kernel_payload(name, code)
        self._shipped[name] = fn

    def register_kernel_payload(self, name: str, code: bytes) -> None:
        """RegisterKernel with an already pickled kernel."""
        self._rpc(self._rms.RegisterKernel, wire.message(rms.RegisterKernelRequest, name=name, code=code))

    # ------------------------------------------------------------------ HCCL
    def hccl_comm_join(self, comm_id: str, rank: int, nranks: int, root: dict, config: dict | None = None,
                       timeout_s: float = 120.0) -> list[dict]:
        r = self._rpc(self._rms.HcclCommJoin,
                      wire.message(rms.HcclJoinRequest, comm=comm_id, rank=rank, nranks=nranks,
                                   root_json=json.dumps(root), config_json=json.dumps(config or {}),
                                   timeout_s=timeout_s),
                      timeout=timeout_s + 10, interruptible=True)
        return json.loads(r.json)

    def hccl_read(self, comm_id: str, ptr: int, nbytes: int) -> np.ndarray:
        """Device-to-device read over gRPC (the cross-node HCCL transport; the admin's)."""
        def consume(it):
            res = None
            pos = 0
            for chunk in it:
                if res is None:              # allocated once the peer has checked the range
                    res = np.empty(nbytes, dtype=np.uint8)
                k = len(chunk.data)
                if pos + k > nbytes:
                    raise AclError(f"peer sent more than the {nbytes} B asked for", code=ACL_ERROR_INTERNAL_ERROR)
                res[pos:pos + k] = np.frombuffer(chunk.data, dtype=np.uint8)
                pos += k
            if pos != nbytes:
                raise AclError(f"peer sent {pos} of {nbytes} B", code=ACL_ERROR_INTERNAL_ERROR)
            return res if res is not None else np.empty(0, dtype=np.uint8)
        return self._rpc(self._rms.HcclRead, wire.message(rms.HcclReadRequest, comm=comm_id, ptr=ptr, nbytes=nbytes),
                         timeout=self._copy_timeout(nbytes), consume=consume)

    def _synchronize(self, method, handle: int, timeout_ms: float, ops=(), order: OpOrder | None = None) -> None:
        """A blocking wait as a loop of bounded waits: each RPC has a deadline, device loss interrupts it,
        and -1 (forever) never turns into a spurious timeout.  ``ops`` ride on the first wait (queued by
        the device before it waits).  The first wait is a plain blocking call of at most
        :data:`SHORT_WAIT_MS` (most waits end within it, and a blocking call is cheaper than a
        cancellable one, which costs gRPC a polling thread); longer waits continue as calls that
        device loss cancels."""
        try:
            timeout_ms = float(timeout_ms)
        except (TypeError, ValueError):
            raise InvalidParamError(f"timeout_ms must be a number, got {timeout_ms!r}") from None
        forever = timeout_ms < 0
        end = None if forever else time.monotonic() + timeout_ms / 1000.0
        short = True
        while True:
            cap = SHORT_WAIT_MS if short else wire.CLIENT_WAIT_SLICE_MS
            if forever:
                slice_ms, last = cap, False
            else:
                left = max(0.0, (end - time.monotonic()) * 1000.0)
                slice_ms = min(left, cap)
                last = slice_ms >= left
            req = wire.message(rms.SynchronizeRequest, handle=handle, timeout_ms=slice_ms)
            if ops:                                  # carried ops (if any) in full; the numbers on this message
                req.ops.extend(wire.submit_request(ops, self._templates,
                                                   plain=order.carried if order is not None else 0).ops)
                wire.set_order(req, order)
            try:
                self._rpc(method, req, timeout=slice_ms / 1000.0 + self.timeout_s, interruptible=not short)
                return
            except AclError as e:
                if ops and wire.is_unknown_template(e):
                    self._templates.reset()          # the device forgot them (restarted): send in full
                    self.submit(ops, order=order)
                elif self.lost.is_set():
                    raise self._lost_error() from None
                elif e.code not in _SYNC_TIMEOUT_CODES or last:
                    raise
            ops = ()
            short = False
            with self._lock:
                self.wait_continuations += 1

    def synchronize_stream(self, sid: int, timeout_ms: float = -1, ops=(), order: OpOrder | None = None) -> None:
        """Wait for the stream; queued ``ops`` (numbered by ``order``) travel with the wait (one RPC) unless
        they are too large for one message (inline H2D data), then they go first as Submits."""
        self._synchronize(self._rms.SynchronizeStream, sid, timeout_ms, *self._riding(ops, order))

    def synchronize_event(self, eid: int, timeout_ms: float = -1, ops=(), order: OpOrder | None = None) -> None:
        """Wait for the event; queued ``ops`` travel with the wait (one RPC), as :meth:`synchronize_stream`."""
        self._synchronize(self._rms.SynchronizeEvent, eid, timeout_ms, *self._riding(ops, order))

    def _riding(self, ops, order: OpOrder | None) -> tuple[list, OpOrder | None]:
        """The queued ``ops`` (and their numbers) that travel with a wait: all of them (their user kernels
        shipped first), or none when they need more than one message (inline H2D data): those go first as
        Submits."""
        ops = list(ops)
        if ops:
            self._ship_user_kernels(ops)
            if len(_split(ops)) > 1:
                self.submit(ops, order=order)
                return [], None
        return ops, order

    def synchronize_device(self, timeout_ms: float = -1) -> None:
        self._synchronize(self._rms.SynchronizeDevice, 0, timeout_ms)

    # ------------------------------------------------------------------ lifecycle
    def close(self, drain_s: float = 0.0) -> None:
        """Stop watches, close the channel, unmap the arena (idempotent).  Device-side resources stay.

        ``drain_s`` > 0: first let the unary calls in flight finish -- up to ``drain_s``, blocking the host
        that long at most; calls still arriving meanwhile are served -- so that a caller that took this
        client just before it was replaced (a failover pool reconnecting to a device that came back) gets
        its answer instead of ACL_ERROR_RT_NO_DEVICE.  What is still in flight then is cancelled (207004)."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            watches, self._watches = self._watches, []
        for w in watches:
            w.stop()
        end = time.monotonic() + drain_s
        with self._idle:
            while self._inflight and (left := end - time.monotonic()) > 0:
                self._idle.wait(left)
            self._closed = True
            shm, self._shm = self._shm, None
        self._channel.close()
        if shm is not None:
            try:
                shm[0].close()
            except BufferError:
                pass    # a view handed out earlier is still alive; the mapping goes with it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"RemoteDevice(id={self.id}, address={self.address!r}, client={self.client_id!r})"


def _split(ops):
    """Batches under the message limit (only inline H2D data can make a batch big) and the op limit."""
    if len(ops) <= wire.MAX_BATCH_OPS and not any(type(op) is WriteH2D for op in ops):
        return (ops,)
    out, cur, size = [], [], 0
    for op in ops:
        n = wire.op_wire_bytes(op)
        if cur and (size + n > wire.SUBMIT_SPLIT_BYTES or len(cur) >= wire.MAX_BATCH_OPS):
            out.append(cur)
            cur, size = [], 0
        cur.append(op)
        size += n
    if cur:
        out.append(cur)
    return out


class HealthWatch:
    """A background WatchHealth stream of one :class:`RemoteDevice` (see :meth:`RemoteDevice.watch_health`)."""

    def __init__(self, dev: RemoteDevice, interval_ms: int, callback, stale_after_s: float | None,
                 lease: bool = False):
        self.dev = dev
        self.lease = lease           #: the watch is the client's lease (see driver.lease)
        self.interval_ms = max(10, interval_ms or 1000)
        self.callback = callback
        self.stale_after_s = (max(10.0, 10 * self.interval_ms / 1000.0) if stale_after_s is None
                              else float(stale_after_s))
        self.stopped = threading.Event()
        self.seq = 0                 #: last sequence number received
        self.beats = 0               #: heartbeats received
        self.last = None             #: the last HealthEvent
        self.error = None            #: why the device refused the watch (the watch then ends, device not lost)
        self.opened = threading.Event()    #: the device accepted the watch (and registered the lease)
        self.ended = threading.Event()     #: the watch thread is over (refused, lost or stopped)
        self._settled = threading.Event()  # opened or ended
        self._call = None
        self._stale = False
        self._last_t = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"vnpu-watch-{dev.id}", daemon=True)
        self._dog = None

    def start(self) -> None:
        self._thread.start()
        if self.stale_after_s > 0:
            self._dog = threading.Thread(target=self._watchdog, name=f"vnpu-watchdog-{self.dev.id}", daemon=True)
            self._dog.start()

    def _notify(self, ev: HealthEvent) -> None:
        self.last = ev
        if self.callback is not None:
            try:
                self.callback(ev)
            except Exception:  # noqa: BLE001 - a bad callback must not kill the watch
                log.exception("health-watch callback failed")

    def _consume(self, it) -> None:
        self._call = it
        if self.stopped.is_set():
            it.cancel()
        if any(k == wire.WATCH_KEY for k, _ in it.initial_metadata() or ()):
            self.opened.set()
            self._settled.set()
        for m in it:
            self._last_t = time.monotonic()
            self.seq = m.seq
            self.beats += 1
            health, reasons = wire.health_status_from_pb(m.status)
            self._notify(HealthEvent(self.dev.id, m.seq, health, tuple(reasons), wire.telemetry_from_pb(m.telemetry),
                                     conditions=tuple(wire.conditions_from_pb(m.status.conditions))))

    def wait_open(self, timeout: float | None = None) -> bool:
        """Block until the device has accepted the watch (True), or it ended without that / ``timeout``
        passed (False; :attr:`error` says why when the device refused it)."""
        self._settled.wait(timeout)
        return self.opened.is_set()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.ended.set()
            self._settled.set()

    def _loop(self) -> None:
        dev = self.dev
        error: AclError | None = None
        while not self.stopped.is_set():
            req = dms.WatchHealthRequest(interval_ms=self.interval_ms, start_seq=self.seq + 1, lease=self.lease)
            try:
                dev.health_stream(req, self._consume, WATCH_RENEW_S)
                reason = "health stream ended by the device"
            except AclError as e:
                status = getattr(e, "grpc_status", None)
                if status == grpc.StatusCode.DEADLINE_EXCEEDED and e.code == ACL_ERROR_RT_TIMEOUT and not self._stale:
                    continue                     # the watch's own long deadline: renew
                if status in _REFUSALS and not self.stopped.is_set():
                    # the device answered and said no (token, device id, ...): a setup error, not a loss
                    self.error = e
                    log.error("health watch of device %d refused: %s", dev.id, e)
                    self._notify(HealthEvent(dev.id, self.seq, "Unknown", (str(e),), {}, error=e))
                    return
                error = e
                reason = f"health stream broke: {e}"
            if self.stopped.is_set():
                return
            if self._stale:
                reason = f"no heartbeat for {self.stale_after_s:g} s"
            dev.mark_lost(reason)
            lost = error_for_code(ACL_ERROR_RT_DEVICE_TASK_ABORT, f"device {dev.id} at {dev.address} is lost: "
                                                                  f"{dev.lost_reason or reason}")
            self._notify(HealthEvent(dev.id, self.seq, "Unknown", (reason,), {}, lost=True, error=lost))
            return

    def _watchdog(self) -> None:
        period = min(1.0, self.stale_after_s / 4)
        while not self.stopped.wait(period):
            if time.monotonic() - self._last_t > self.stale_after_s:
                self._stale = True
                call = self._call
                if call is not None:
                    call.cancel()
                return
            if not self._thread.is_alive():
                return

    def stop(self) -> None:
        self.stopped.set()
        call = self._call
        if call is not None:
            call.cancel()
        for t in (self._thread, self._dog):
            if t is not None and t is not threading.current_thread() and t.is_alive():
                t.join(timeout=5)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # the watch doubles as its device's loss event: ``if not watch.wait(30): ...``
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the device is marked lost (True) or ``timeout`` passes (False)."""
        return self.dev.lost.wait(timeout)

    def is_set(self) -> bool:
        return self.dev.lost.is_set()


__all__ = ["RemoteDevice", "RemoteDeviceInfo", "HealthEvent", "HealthWatch"]
