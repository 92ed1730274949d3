"""The device end of the driver: DMS and RMS gRPC services over one :class:`devices.device.Device`.

``serve(device, host, token)`` binds one port on ``host`` only (loopback by default; a device actor passes
its node's address) and serves both services from a thread pool.  One interceptor (:class:`_Gate`) sits in
front of every method and is the only place that
  * authenticates: metadata ``authorization: Bearer <token>`` compared in constant time; anything else is
    refused with UNAUTHENTICATED before the method runs;
  * refuses calls addressed to another device (``vnpu-device`` metadata, FAILED_PRECONDITION /
    ACL_ERROR_RT_INVALID_DEVICEID);
  * maps errors: an :class:`~devices.errors.AclError` becomes the gRPC status of its code
    (:func:`driver.wire.status_for_code`) with the structured error detail in trailing metadata (code,
    class, HcclResult: :func:`driver.wire.error_trailers`); any other exception becomes INTERNAL with
    ACL_ERROR_INTERNAL_ERROR.  Servicer methods just call the device and let errors fly.

Faults: ``InjectFault`` / ``ClearFault`` just call the device's ``inject_fault`` / ``clear_fault``.  The
server installs the device's ``on_kill`` hook, so that the ``kill`` fault ends the hosting process (the
``on_kill`` given to :func:`serve`) after its reply has gone out, instead of marking an in-process device
lost.

Tenancy: the ``vnpu-client`` metadata names the owner on whose behalf the device acts, so allocations,
streams and events of one client are invisible to another.
"""
from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
from concurrent import futures
from itertools import chain

from . import wire  # first: it sets gRPC's log verbosity before gRPC loads
from .lease import DEFAULT_GRACE_S, Leases
from .wire import dms, rms

import grpc  # noqa: E402,I100

from devices.errors import ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_RT_INVALID_DEVICEID, AclError  # noqa: E402
from devices.errors import InvalidParamError  # noqa: E402
from devices.node import boot_id  # noqa: E402

log = logging.getLogger("vnpu.driver.service")

#: server threads per device endpoint; every open health watch (each runtime client's lease, each
#: failover pool's watch) holds one for its lifetime, so this bounds the concurrent clients of a device
RPC_WORKERS = 64


def _owner(context) -> str:
    for k, v in context.invocation_metadata():
        if k == wire.CLIENT_KEY:
            return v or wire.ANONYMOUS
    return wire.ANONYMOUS


# ---------------------------------------------------------------- the gate: auth + error mapping
def _map_errors(context, e: Exception):
    if isinstance(e, AclError):
        context.set_trailing_metadata(wire.error_trailers_of(e))
        context.abort(wire.status_for_code(e.code), e.detail)
    log.exception("unexpected error in an RPC handler")
    context.set_trailing_metadata(wire.error_trailers(ACL_ERROR_INTERNAL_ERROR))
    context.abort(wire.status_for_code(ACL_ERROR_INTERNAL_ERROR), f"{type(e).__name__}: {e}")


def _guard_unary(fn):
    def call(request, context):
        try:
            return fn(request, context)
        except Exception as e:  # noqa: BLE001 - every failure leaves as a status
            _map_errors(context, e)
    return call


def _guard_stream(fn):
    def call(request, context):
        try:
            yield from fn(request, context)
        except Exception as e:  # noqa: BLE001
            _map_errors(context, e)
    return call


def _guarded(h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    if h.unary_unary is not None:
        return h._replace(unary_unary=_guard_unary(h.unary_unary))
    if h.stream_unary is not None:
        return h._replace(stream_unary=_guard_unary(h.stream_unary))
    if h.unary_stream is not None:
        return h._replace(unary_stream=_guard_stream(h.unary_stream))
    return h._replace(stream_stream=_guard_stream(h.stream_stream))


def _refusal(h: grpc.RpcMethodHandler, status: grpc.StatusCode, message: str, code: int | None):
    """A handler of ``h``'s shape that refuses the call (the request is not even parsed)."""
    def refuse(request, context):
        if code is not None:
            context.set_trailing_metadata(wire.error_trailers(code))
        context.abort(status, message)

    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if h.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.stream_stream_rpc_method_handler(refuse)


class _Gate(grpc.ServerInterceptor):
    def __init__(self, token: str, device_id: int):
        self._expected = f"Bearer {token}".encode()
        self._device = str(device_id)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._refusals: dict[tuple[str, str], grpc.RpcMethodHandler] = {}

    def intercept_service(self, continuation, details):
        h = continuation(details)
        if h is None:
            return None                      # unknown method: gRPC answers UNIMPLEMENTED
        auth = device = None
        for k, v in details.invocation_metadata or ():
            if k == wire.AUTH_KEY:
                auth = v
            elif k == wire.DEVICE_KEY:
                device = v
        if auth is None or not hmac.compare_digest(auth.encode() if isinstance(auth, str) else auth,
                                                   self._expected):
            return self._refuse(details.method, h, "auth", grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid bearer token", None)
        if device is not None and device != self._device:
            return self._refuse(details.method, h, "device", grpc.StatusCode.FAILED_PRECONDITION,
                                f"this endpoint serves device {self._device}, not device {device}",
                                ACL_ERROR_RT_INVALID_DEVICEID)
        g = self._handlers.get(details.method)
        if g is None:
            g = self._handlers[details.method] = _guarded(h)
        return g

    def _refuse(self, method, h, why, status, message, code):
        r = self._refusals.get((method, why))
        if r is None:
            r = self._refusals[(method, why)] = _refusal(h, status, message, code)
        return r


# ---------------------------------------------------------------- DMS
class DeviceManagementServicer(wire.DeviceManagementServicer):
    def __init__(self, device, server: "DeviceServer"):
        self.device = device
        self._server = server

    def GetDeviceInfo(self, request, context):
        info = self.device.info()
        return wire.info_to_pb(info, arena_size=info.hbm_total, node_address=self._server.address,
                               host_pid=os.getpid(), hostname=socket.gethostname(), boot_id=boot_id())

    def GetHealth(self, request, context):
        return wire.health_status_to_pb(self.device.health_report())

    def GetTelemetry(self, request, context):
        return wire.telemetry_to_pb(self.device.telemetry())

    def WatchHealth(self, request, context):
        interval = min(60.0, max(0.01, (request.interval_ms or 1000) / 1000.0))
        wake = threading.Event()
        context.add_callback(wake.set)               # the client cancelled / went away
        self._server._watchers.add(wake)
        owner = _owner(context) if request.lease else None
        if owner is not None:
            self._server.leases.opened(owner)
        try:
            seq = request.start_seq or 1
            while not wake.is_set() and not self._server.stopping.is_set() and context.is_active():
                d = self.device
                if d.hung:
                    wake.wait(min(interval, 0.02))   # a hung device misses its heartbeats (stream stays open)
                    continue
                tele = d.telemetry()
                yield dms.HealthBeat(seq=seq, status=wire.health_status_to_pb(d.health_report()),
                                     telemetry=wire.telemetry_to_pb(tele), server_time_s=tele.get("uptime_s", 0.0))
                seq += 1
                wake.wait(interval)
        finally:
            self._server._watchers.discard(wake)
            if owner is not None:
                self._server.leases.closed(owner)

    def Reset(self, request, context):
        self.device.reset()
        return dms.ResetReply()

    def InjectFault(self, request, context):
        with self._server.replying(context):        # a kill ends the process after this reply
            self.device.inject_fault(request.kind, **wire.fault_params(request))
        return dms.InjectFaultReply()

    def ClearFault(self, request, context):
        self.device.clear_fault(request.kind or None)
        return dms.ClearFaultReply()


# ---------------------------------------------------------------- RMS
_EMPTY = rms.Empty()


def _wait_ms(timeout_ms: float) -> float:
    """Bound one server-side wait (clients loop for longer ones)."""
    return wire.SERVER_MAX_WAIT_MS if timeout_ms < 0 or timeout_ms > wire.SERVER_MAX_WAIT_MS else timeout_ms


class ResourceManagementServicer(wire.ResourceManagementServicer):
    def __init__(self, device):
        self.device = device
        self._templates = wire.TemplateTable()

    # ---- memory
    def Malloc(self, request, context):
        return rms.MallocReply(ptr=self.device.malloc(request.size, request.policy, owner=_owner(context),
                                                      placement=request.placement))

    def Free(self, request, context):
        self.device.free(request.ptr, owner=_owner(context))
        return _EMPTY

    def MemcpyH2D(self, request_iterator, context):
        owner = _owner(context)
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise InvalidParamError("empty host-to-device stream")
        dst, total = first.dst, first.total
        if total < 0:
            raise InvalidParamError(f"negative copy size {total}")
        d = self.device
        self._check(dst, total, owner, True)         # refuse a bad range before taking any data
        pos = 0
        for chunk in chain((first,), it):
            data = chunk.data
            n = len(data)
            if pos + n > total:
                raise InvalidParamError(f"host-to-device stream carries more than the announced {total} B")
            if n:
                d.memcpy_h2d(dst + pos, data, owner=owner)
            pos += n
        if pos != total:
            raise InvalidParamError(f"host-to-device stream ended after {pos} of {total} B")
        return _EMPTY

    def MemcpyD2H(self, request, context):
        view = self.device.mem_view(request.src, request.nbytes, _owner(context))   # checked; sent chunk by chunk
        step = min(wire.CHUNK_BYTES, max(4096, request.chunk_bytes or wire.CHUNK_BYTES))
        for i in range(0, view.size, step):
            yield rms.D2HChunk(data=view[i:i + step].tobytes())

    def MemcpyD2D(self, request, context):
        self.device.memcpy_d2d(request.dst, request.src, request.nbytes, owner=_owner(context))
        return _EMPTY

    def Memset(self, request, context):
        self.device.memset(request.ptr, request.value, request.nbytes, owner=_owner(context))
        return _EMPTY

    def _check(self, ptr: int, nbytes: int, owner: str, write: bool) -> int:
        return self.device.check_range(ptr, nbytes, owner, write)

    def CheckRange(self, request, context):
        return rms.CheckRangeReply(offset=self._check(request.ptr, request.nbytes, _owner(context),
                                                      request.write))

    def MemInfo(self, request, context):
        free, total = self.device.mem_info()
        return rms.MemInfoReply(free=free, total=total)

    # ---- streams / events
    def CreateStream(self, request, context):
        return rms.StreamReply(stream=self.device.create_stream(request.priority, owner=_owner(context)))

    def DestroyStream(self, request, context):
        self.device.destroy_stream(request.stream, owner=_owner(context))
        return _EMPTY

    def CreateEvent(self, request, context):
        return rms.EventReply(event=self.device.create_event(request.flags, owner=_owner(context)))

    def DestroyEvent(self, request, context):
        self.device.destroy_event(request.event, owner=_owner(context))
        return _EMPTY

    # ---- work
    def Submit(self, request, context):
        owner = _owner(context)
        ops = self._templates.decode(request.ops, owner)
        self.device.submit(ops, owner=owner)
        return rms.SubmitReply(queued=len(ops))

    def SynchronizeStream(self, request, context):
        owner = _owner(context)
        if request.ops:
            self.device.submit(self._templates.decode(request.ops, owner), owner=owner)
        self.device.synchronize_stream(request.handle, _wait_ms(request.timeout_ms), owner=owner)
        return _EMPTY

    def SynchronizeEvent(self, request, context):
        self.device.synchronize_event(request.handle, _wait_ms(request.timeout_ms), owner=_owner(context))
        return _EMPTY

    def SynchronizeDevice(self, request, context):
        self.device.synchronize_device(_wait_ms(request.timeout_ms), owner=_owner(context))
        return _EMPTY

    def QueryStream(self, request, context):
        return rms.QueryReply(done=self.device.query_stream(request.stream, owner=_owner(context)))

    def QueryEvent(self, request, context):
        return rms.QueryReply(done=self.device.query_event(request.event, owner=_owner(context)))

    def EventElapsed(self, request, context):
        w, m = self.device.event_elapsed(request.start, request.end, owner=_owner(context))
        return rms.EventElapsedReply(wall_ms=w, model_ms=m)

    def EventTimestamp(self, request, context):
        w, m = self.device.event_timestamp(request.event, owner=_owner(context))
        return rms.EventTimestampReply(wall_s=w, model_s=m)

    def SignalEvent(self, request, context):
        self.device.signal_event(request.event, request.gen, owner=_owner(context))
        return _EMPTY

    # ---- user kernels and HCCL
    def RegisterKernel(self, request, context):
        import pickle

        from devices.registry import register_user_kernel, registered
        try:
            fn = pickle.loads(request.code)     # authenticated clients only (the gate ran first)
        except Exception as e:  # noqa: BLE001 - a bad payload is a parameter error
            raise InvalidParamError(f"cannot load kernel {request.name!r}: {type(e).__name__}: {e}") from None
        old = registered(request.name)
        same = old is not None and old.user and _same_code(old.run, fn)
        if not same:        # an identical kernel (e.g. this very process's own) stays as it is
            register_user_kernel(request.name, fn, replace=True)
        return _EMPTY

    def drop_client(self, owner: str) -> None:
        """Forget a departed client's launch templates."""
        self._templates.drop(owner)

    # ---- captured graphs (aclmdlRI)
    def GraphCreate(self, request, context):
        owner = _owner(context)
        return rms.IntReply(value=self.device.graph_create(self._templates.decode(request.ops, owner), owner=owner))

    def GraphDestroy(self, request, context):
        self.device.graph_destroy(request.graph, owner=_owner(context))
        return _EMPTY

    def GraphInfo(self, request, context):
        return rms.JsonReply(json=json.dumps(self.device.graph_info(request.graph, owner=_owner(context))))

    def GraphRebind(self, request, context):
        return rms.IntReply(value=self.device.graph_rebind(request.graph, wire.moves_from_pb(request.moves),
                                                           owner=_owner(context)))

    def HcclInfo(self, request, context):
        return rms.JsonReply(json=json.dumps(self.device.hccl_info()))

    def HcclCommInit(self, request, context):
        self.device.hccl_comm_init(request.comm, request.rank, json.loads(request.peers_json),
                                   json.loads(request.config_json or "{}"))
        return _EMPTY

    def HcclCommJoin(self, request, context):
        table = self.device.hccl_comm_join(request.comm, request.rank, request.nranks,
                                           json.loads(request.root_json), json.loads(request.config_json or "{}"),
                                           request.timeout_s or 120.0)
        return rms.JsonReply(json=json.dumps(table))

    def HcclCommDestroy(self, request, context):
        self.device.hccl_comm_destroy(request.comm)
        return _EMPTY

    def HcclAsyncError(self, request, context):
        return rms.IntReply(value=self.device.hccl_async_error(request.comm))

    def HcclRead(self, request, context):
        view = self.device.hccl_read(request.comm, request.ptr, request.nbytes)
        for i in range(0, view.size, wire.CHUNK_BYTES):
            yield rms.D2HChunk(data=view[i:i + wire.CHUNK_BYTES].tobytes())

    def HcclNotify(self, request, context):
        try:
            msg = json.loads(request.json)
        except ValueError:
            raise InvalidParamError("HcclNotify: the message is not JSON") from None
        self.device.hccl_deliver(msg)
        return _EMPTY


def _same_code(a, b) -> bool:
    ca, cb = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return ca is not None and cb is not None and ca.co_code == cb.co_code and ca.co_consts == cb.co_consts \
        and ca.co_names == cb.co_names


# ---------------------------------------------------------------- the server
class DeviceServer:
    """A running DMS+RMS endpoint for one device.  ``stop()`` does not close the device."""

    def __init__(self, device, host: str, token: str, port: int, on_kill, workers: int, max_message_bytes: int,
                 lease_grace_s: float = DEFAULT_GRACE_S):
        self.device = device
        self.host = host
        self.token = token
        self.stopping = threading.Event()
        self._watchers: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._on_kill = on_kill
        self._reply = threading.local()          # the RPC context a fault is injected in (see replying)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                              thread_name_prefix=f"npu{device.id}-rpc"),
                                   interceptors=(_Gate(token, device.id),),
                                   options=wire.server_options(max_message_bytes))
        self.dms = DeviceManagementServicer(device, self)
        self.rms = ResourceManagementServicer(device)
        self.leases = Leases(self._release_client, lease_grace_s)
        wire.add_DeviceManagementServicer_to_server(self.dms, self._server)
        wire.add_ResourceManagementServicer_to_server(self.rms, self._server)
        bind = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.port = self._server.add_insecure_port(f"{bind}:{port}")
        if not self.port:
            raise OSError(f"cannot bind the device {device.id} services to {bind}:{port}")
        self.address = f"{bind}:{self.port}"
        device.on_kill = self._kill_after_reply      # the kill fault ends the host, not just the device
        self._server.start()

    def _release_client(self, owner: str) -> None:
        """A client's lease ran out: free what it left behind (host-blocking, on the lease timer)."""
        res = self.device.release_owner(owner)
        self.rms.drop_client(owner)
        log.info("device %d released departed client %s: %s", self.device.id, owner, res)

    # ---- the kill fault
    @contextlib.contextmanager
    def replying(self, context):
        """Within: a kill fault raised by this RPC takes effect once its reply has gone out."""
        self._reply.context = context
        try:
            yield
        finally:
            self._reply.context = None

    def _kill_after_reply(self) -> None:
        """The device's ``on_kill`` hook (runs in the RPC that injected the fault)."""
        run = lambda: threading.Thread(target=self._kill, name="vnpu-kill", daemon=True).start()  # noqa: E731
        context = getattr(self._reply, "context", None)
        if context is not None:
            context.add_callback(run)
        else:
            run()

    def _kill(self) -> None:
        if self._on_kill is not None:
            self._on_kill()
        else:                                # in-process default: the endpoint vanishes at once
            self.stop(grace=0)

    # ---- lifecycle
    def stop(self, grace: float | None = None) -> None:
        """Stop serving (idempotent): health watches end, in-flight calls are cancelled after ``grace``."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.leases.close()
        for w in list(self._watchers):
            w.set()
        if self.device.on_kill == self._kill_after_reply:
            self.device.on_kill = None
        done = self._server.stop(grace)
        done.wait((grace or 0) + 5.0)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self) -> str:
        return f"DeviceServer(device={self.device.id}, address={self.address!r})"


def serve(device, host: str = "127.0.0.1", token: str | None = None, port: int = 0, on_kill=None, *,
          workers: int = RPC_WORKERS, max_message_bytes: int = wire.MAX_MESSAGE_BYTES,
          lease_grace_s: float = DEFAULT_GRACE_S) -> DeviceServer:
    """Serve ``device`` (DMS + RMS) on ``host:port`` (port 0 = ephemeral) and return the running server.

    ``host`` is the only interface bound (loopback by default; an all-interfaces address only when asked for).  ``token``
    is the bearer token every call must carry; default: ``$VNPU_TOKEN``, else a fresh random token
    (``server.token``) -- a server never runs unauthenticated.  ``on_kill`` runs when the ``kill`` fault is
    injected, after the reply has been sent (a device actor passes one that ends its process); by default
    the endpoint just stops at once, which looks the same to clients.  Either way the device itself is not
    marked lost: its host decides what a kill means.
    """
    if not host:
        raise InvalidParamError("serve() needs an explicit host to bind")
    token = token or os.environ.get("VNPU_TOKEN") or secrets.token_urlsafe(32)
    return DeviceServer(device, host, token, port, on_kill, workers, max_message_bytes, lease_grace_s)


__all__ = ["serve", "DeviceServer", "DeviceManagementServicer", "ResourceManagementServicer"]
