"""The device end of the driver: DMS and RMS gRPC services over one :class:`devices.device.Device`.

``serve(device, host, token)`` binds one port on ``host`` only (loopback by default; a device actor passes
its node's address) and serves both services from a thread pool.  One interceptor (:class:`_Gate`) sits in
front of every method and is the only place that
  * authenticates: metadata ``authorization: Bearer <credential>`` is the cluster token (the admin) or a
    tenant credential minted from it (:mod:`driver.credentials`: MAC, expiry, revocation list); anything
    else is refused with UNAUTHENTICATED before the method runs.  The tenant comes from the credential;
    ``vnpu-client`` only names the client (session) within it;
  * refuses tenants the admin-only methods (:data:`ADMIN_ONLY`: reset, faults, revocation, kernel
    package reload, and the device-to-device HCCL transport) with PERMISSION_DENIED /
    ACL_ERROR_RT_NO_PERMISSION, and refuses code uploads (``RegisterKernel``) the same way to everyone but
    the admin of a cluster that accepts them (see the trust boundary below);
  * refuses calls addressed to another device (``vnpu-device`` metadata, FAILED_PRECONDITION /
    ACL_ERROR_RT_INVALID_DEVICEID);
  * answers a request that does not parse with INVALID_ARGUMENT / ACL_ERROR_RT_PARAM_INVALID (gRPC itself
    would say INTERNAL);
  * maps errors: an :class:`~devices.errors.AclError` becomes the gRPC status of its code
    (:func:`driver.wire.status_for_code`) with the structured error detail in trailing metadata (code,
    class, HcclResult: :func:`driver.wire.error_trailers`); any other exception becomes INTERNAL with
    ACL_ERROR_INTERNAL_ERROR.  Servicer methods just call the device and let errors fly.

The methods that are one unary RPC each are made from the table of :mod:`driver.calls` (one handler per
row: :func:`_handler`); the rest -- streams, batches of stream ops, the health watch, faults, code
uploads -- are written out below.

Tenancy: every device call is made for the caller's :class:`devices.tenancy.Owner` (tenant from the
credential, client from ``vnpu-client``): what one tenant holds is invisible to the others, quotas are per
tenant, and what a client creates is released when its lease ends (:mod:`driver.lease`).  A call that would
create something (Malloc, CreateStream, CreateEvent, Submit, SynchronizeStream with ops, GraphCreate,
RegisterKernel, HcclCommInit, HcclCommJoin: the handlers that ask for ``_leased`` and the table's rows
marked ``leased``) is refused with
ACL_ERROR_RT_CONTEXT_NULL unless the client holds a lease on this device -- so nothing a client leaves
behind outlives it.  Open watches count against the tenant's
quota and the endpoint's threads (each holds one).

Trust boundary: no client ships code to a device by default.  Custom kernels are kernel packages that
the node's operator installs (:mod:`devices.kernel_packages`; ``vnpu kernels install``, the ``kernels`` of
:class:`driver.policy.DevicePolicy`): the server loads them when it starts and again on the admin's
``ReloadKernels`` (the files on this node, never code from a request), and every tenant launches their
kernels by name (``ListKernels`` says which there are).  ``RegisterKernel`` with code -- a pickle, which
would be unpickled in this process and then run on the device's core threads with the process's rights --
is accepted only from the admin (the cluster token) of a cluster started with
``DevicePolicy(pickled_kernels=True)`` (``vnpu up --allow-pickled-kernels``).  Anyone else is refused by the
gate with PERMISSION_DENIED / ACL_ERROR_RT_NO_PERMISSION before the request is even parsed, so not a byte
of a tenant's payload is unpickled: a tenant's code never runs here, and with it the cluster token (which
this process holds) stays out of a tenant's reach.

Faults: ``InjectFault`` / ``ClearFault`` just call the device's ``inject_fault`` / ``clear_fault``.  The
server installs the device's ``on_kill`` hook, so that the ``kill`` fault ends the hosting process (the
``on_kill`` given to :func:`serve`) after its reply has gone out, instead of marking an in-process device
lost.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
from concurrent import futures
from itertools import chain

from . import wire  # first: it sets gRPC's log verbosity before gRPC loads
from .calls import DMS, RMS, Call, DeviceCalls
from .credentials import CredentialError, Principal, Revocations, Verifier
from .lease import DEFAULT_GRACE_S, Leases
from .policy import DevicePolicy
from .wire import dms, rms

import grpc  # noqa: E402,I100

from devices.errors import (ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_RT_CONTEXT_NULL,  # noqa: E402
                            ACL_ERROR_RT_INVALID_DEVICEID, ACL_ERROR_RT_NO_PERMISSION, ACL_ERROR_RT_OVER_LIMIT,
                            ACL_ERROR_RT_PARAM_INVALID, AclError, InvalidParamError)
from devices.kernel import check_kernel_name  # noqa: E402
from devices.kernel_packages import load_all  # noqa: E402
from devices.node import boot_id  # noqa: E402
from devices.tenancy import Owner, Usage  # noqa: E402

log = logging.getLogger("vnpu.driver.service")

#: server threads per device endpoint; every open health watch (each runtime client's lease, each
#: failover pool's watch) holds one for its lifetime, so this bounds the concurrent clients of a device
RPC_WORKERS = 64
#: threads no watch may take (unary calls always find one)
RESERVED_WORKERS = 8
#: longest client id accepted
MAX_CLIENT_ID = 256

#: methods only the admin (the cluster token) may call: these, and the table's rows marked ``admin``
#: (driver.calls: Reset, HcclNotify)
ADMIN_ONLY = frozenset(wire.rpc_path(svc, m) for svc, m in (
    (DMS, "InjectFault"), (DMS, "ClearFault"), (DMS, "Revoke"), (DMS, "ReloadKernels"), (RMS, "HcclRead"))) \
    | frozenset(wire.rpc_path(c.service, c.rpc) for c in DeviceCalls.rows() if c.admin)
#: the method that carries code (a pickled kernel): the admin's, and only where the policy accepts it
CODE_UPLOAD = wire.rpc_path(RMS, "RegisterKernel")
#: why an upload is refused: a tenant's (always), the admin's (the policy accepts none)
_NO_UPLOAD = {
    "upload-tenant": "RegisterKernel with code is the cluster admin's: tenants launch the kernels of the packages "
                     "installed on the device's node by name (the admin installs them: vnpu kernels install FILE)",
    "upload-off": "RegisterKernel with code is refused: this cluster was not started to accept pickled kernels "
                  "(vnpu up --allow-pickled-kernels); install a kernel package instead (vnpu kernels install FILE)",
}


# ---------------------------------------------------------------- the gate: auth + error mapping
class _Malformed:
    """What a request that does not parse deserializes to (the handler answers INVALID_ARGUMENT)."""
    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


def _tolerant(deserialize):
    if deserialize is None:
        return None

    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as e:  # noqa: BLE001 - DecodeError and friends: the request is malformed
            return _Malformed(e)
    return parse


def _malformed(m: _Malformed) -> InvalidParamError:
    return InvalidParamError(f"malformed request: {type(m.error).__name__}: {m.error}"[:300])


def _checked(request_iterator):
    for r in request_iterator:
        if isinstance(r, _Malformed):
            raise _malformed(r)
        yield r


def _map_errors(context, e: Exception):
    if isinstance(e, CredentialError):          # a credential revoked or expired during the call
        context.set_trailing_metadata(wire.error_trailers_of(e))
        context.abort(grpc.StatusCode.UNAUTHENTICATED, e.detail)
    if isinstance(e, AclError):
        context.set_trailing_metadata(wire.error_trailers_of(e))
        context.abort(wire.status_for_code(e.code), e.detail)
    log.exception("unexpected error in an RPC handler")
    context.set_trailing_metadata(wire.error_trailers(ACL_ERROR_INTERNAL_ERROR))
    context.abort(wire.status_for_code(ACL_ERROR_INTERNAL_ERROR), f"{type(e).__name__}: {e}")


def _guard_unary(fn, streamed_request: bool):
    def call(request, context):
        try:
            if streamed_request:
                request = _checked(request)
            elif isinstance(request, _Malformed):
                raise _malformed(request)
            return fn(request, context)
        except Exception as e:  # noqa: BLE001 - every failure leaves as a status
            _map_errors(context, e)
    return call


def _guard_stream(fn, streamed_request: bool):
    def call(request, context):
        try:
            if streamed_request:
                request = _checked(request)
            elif isinstance(request, _Malformed):
                raise _malformed(request)
            yield from fn(request, context)
        except Exception as e:  # noqa: BLE001
            _map_errors(context, e)
    return call


def _guarded(h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    h = h._replace(request_deserializer=_tolerant(h.request_deserializer))
    if h.unary_unary is not None:
        return h._replace(unary_unary=_guard_unary(h.unary_unary, False))
    if h.stream_unary is not None:
        return h._replace(stream_unary=_guard_unary(h.stream_unary, True))
    if h.unary_stream is not None:
        return h._replace(unary_stream=_guard_stream(h.unary_stream, False))
    return h._replace(stream_stream=_guard_stream(h.stream_stream, True))


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
    def __init__(self, verifier: Verifier, device_id: int, code_upload: bool):
        self._verifier = verifier
        self._device = str(device_id)
        self._code_upload = code_upload      #: the policy's pickled_kernels (for the admin only)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._refusals: dict[tuple[str, str], grpc.RpcMethodHandler] = {}

    def intercept_service(self, continuation, details):
        h = continuation(details)
        if h is None:
            return None                      # unknown method: gRPC answers UNIMPLEMENTED
        auth = device = client = None
        for k, v in details.invocation_metadata or ():
            if k == wire.AUTH_KEY:
                auth = v
            elif k == wire.DEVICE_KEY:
                device = v
            elif k == wire.CLIENT_KEY:
                client = v
        who = self._verifier.principal(auth)
        if who is None:
            return self._refuse(details.method, h, "auth", grpc.StatusCode.UNAUTHENTICATED,
                                "missing, invalid, expired or revoked credential", None)
        if client is not None and len(client) > MAX_CLIENT_ID:
            return self._refuse(details.method, h, "client", grpc.StatusCode.INVALID_ARGUMENT,
                                f"client id longer than {MAX_CLIENT_ID} characters", ACL_ERROR_RT_PARAM_INVALID)
        if not who.admin and details.method in ADMIN_ONLY:
            return self._refuse(details.method, h, "admin", grpc.StatusCode.PERMISSION_DENIED,
                                f"{details.method.rsplit('/', 1)[-1]} is for the cluster's admin only",
                                ACL_ERROR_RT_NO_PERMISSION)
        if details.method == CODE_UPLOAD and not (who.admin and self._code_upload):
            why = "upload-off" if who.admin else "upload-tenant"
            return self._refuse(details.method, h, why, grpc.StatusCode.PERMISSION_DENIED, _NO_UPLOAD[why],
                                ACL_ERROR_RT_NO_PERMISSION)
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


# ---------------------------------------------------------------- the table's methods
def _handler(call: Call):
    """The servicer method of one row of the table (:mod:`driver.calls`): the request's fields into the
    device method's arguments -- plus the caller, once its lease is checked where the row asks for one --
    and its result into the reply."""
    def handle(self, request, context):
        args = call.arguments(request)
        if call.takes_owner:
            owner = args["owner"] = self._server.caller(context)
            if call.leased:
                self._server.require_lease(owner)
        return call.reply_message(getattr(self.device, call.serves)(**args))

    handle.__name__ = handle.__qualname__ = call.rpc
    handle.__doc__ = f"``Device.{call.serves}`` (the row ``{call.name}`` of driver.calls.DeviceCalls)."
    return handle


def _serving(service: str):
    """Class decorator: a servicer of ``service`` gets the handler of each of the table's rows of it; a
    method written out for an RPC of the table is a mistake (TypeError at import)."""
    def install(cls):
        for call in DeviceCalls.rows(service):
            if call.rpc in vars(cls):
                raise TypeError(f"{cls.__name__}.{call.rpc} is written out and also the row {call.name!r} of "
                                f"driver.calls.DeviceCalls")
            setattr(cls, call.rpc, _handler(call))
        return cls
    return install


# ---------------------------------------------------------------- DMS
@_serving(DMS)
class DeviceManagementServicer(wire.DeviceManagementServicer):
    def __init__(self, device, server: "DeviceServer"):
        self.device = device
        self._server = server

    def GetDeviceInfo(self, request, context):
        info = self.device.info()
        return wire.info_to_pb(info, arena_size=info.hbm_total, node_address=self._server.address,
                               host_pid=os.getpid(), hostname=socket.gethostname(), boot_id=boot_id())

    def WatchHealth(self, request, context):
        interval = min(60.0, max(0.01, (request.interval_ms or 1000) / 1000.0))
        srv = self._server
        caller = srv.caller(context)
        wake = threading.Event()
        context.add_callback(wake.set)               # the client cancelled / went away
        srv.watch_opened(caller, wake)               # quota: refused before anything is held
        lease = caller if request.lease else None
        if lease is not None:
            srv.leases.opened(lease)
        try:
            context.send_initial_metadata(((wire.WATCH_KEY, "lease" if lease is not None else "watch"),))
            seq = request.start_seq or 1
            while not wake.is_set() and not srv.stopping.is_set() and context.is_active():
                srv.caller(context)                  # a revoked or expired credential ends the watch
                beat = self._beat(caller)
                if beat is None:                     # a hung device misses its heartbeats (stream stays open)
                    wake.wait(min(interval, 0.02))
                    continue
                tele, report = beat
                yield dms.HealthBeat(seq=seq, status=wire.health_status_to_pb(report),
                                     telemetry=wire.telemetry_to_pb(tele), server_time_s=tele.get("uptime_s", 0.0))
                seq += 1
                wake.wait(interval)
        finally:
            srv.watch_closed(caller, wake)
            if lease is not None:
                srv.leases.closed(lease)

    def _beat(self, caller: Owner):
        """(telemetry, health report) for one heartbeat, or None while a hang fault holds the cores.  Asked
        again after the report: a hang injected meanwhile is in the report, and a hung device sends none."""
        d = self.device
        if d.hung:
            return None
        tele = d.telemetry(caller)                   # a tenant sees only its own tenant's HBM holders
        report = d.health_report()
        return None if d.hung else (tele, report)

    def InjectFault(self, request, context):
        with self._server.replying(context):        # a kill ends the process after this reply
            self.device.inject_fault(request.kind, **wire.fault_params(request))
        return dms.InjectFaultReply()

    def ClearFault(self, request, context):
        self.device.clear_fault(request.kind or None)
        return dms.ClearFaultReply()

    def Revoke(self, request, context):
        self._server.verifier.revoke({c.id: c.expires_s for c in request.credentials},
                                     {t.tenant: t.issued_before_ms for t in request.tenants})
        return dms.RevokeReply()

    def ReloadKernels(self, request, context):
        return dms.ReloadKernelsReply(json=json.dumps(self._server.reload_kernels()))


# ---------------------------------------------------------------- RMS
_EMPTY = rms.Empty()


def _wait_ms(timeout_ms: float) -> float:
    """Bound one server-side wait (clients loop for longer ones)."""
    return wire.SERVER_MAX_WAIT_MS if timeout_ms < 0 or timeout_ms > wire.SERVER_MAX_WAIT_MS else timeout_ms


@_serving(RMS)
class ResourceManagementServicer(wire.ResourceManagementServicer):
    def __init__(self, device, server: "DeviceServer"):
        self.device = device
        self._server = server
        self._templates = wire.TemplateTable()

    def _caller(self, context) -> Owner:
        return self._server.caller(context)

    def _leased(self, context) -> Owner:
        """The caller, who is about to create something: it must hold a lease on this device."""
        owner = self._server.caller(context)
        self._server.require_lease(owner)
        return owner

    # ---- memory
    def MemcpyH2D(self, request_iterator, context):
        owner = self._caller(context)
        it = iter(request_iterator)
        first = next(it, None)
        if first is None:
            raise InvalidParamError("empty host-to-device stream")
        dst, total = first.dst, first.total
        if total < 0:
            raise InvalidParamError(f"negative copy size {total}")
        d = self.device
        d.check_range(dst, total, owner, True)       # refuse a bad range before taking any data
        pos = 0
        for chunk in chain((first,), it):
            data = chunk.data
            n = len(data)
            if pos + n > total:                      # checked before a byte of this chunk is written
                raise InvalidParamError(f"host-to-device stream carries more than the announced {total} B")
            if n:
                d.memcpy_h2d(dst + pos, data, owner=owner)
            pos += n
        if pos != total:
            raise InvalidParamError(f"host-to-device stream ended after {pos} of {total} B")
        return _EMPTY

    def MemcpyD2H(self, request, context):
        view = self.device.mem_view(request.src, request.nbytes, self._caller(context))   # checked; chunked
        step = min(wire.CHUNK_BYTES, max(4096, request.chunk_bytes or wire.CHUNK_BYTES))
        for i in range(0, view.size, step):
            yield rms.D2HChunk(data=view[i:i + step].tobytes())

    # ---- work
    def Submit(self, request, context):
        owner = self._leased(context)
        ops = self._templates.decode(request.ops, owner)
        self.device.submit(ops, owner=owner, order=wire.order_of(request))
        return rms.SubmitReply(queued=len(ops))

    def SynchronizeStream(self, request, context):
        owner = self._riding(request, context)
        self.device.synchronize_stream(request.handle, _wait_ms(request.timeout_ms), owner=owner)
        return _EMPTY

    def SynchronizeEvent(self, request, context):
        owner = self._riding(request, context)
        self.device.synchronize_event(request.handle, _wait_ms(request.timeout_ms), owner=owner)
        return _EMPTY

    def _riding(self, request, context) -> Owner:
        """The caller of a wait, after the ops riding on it are queued (as one Submit would)."""
        if not request.ops:
            return self._caller(context)
        owner = self._leased(context)
        self.device.submit(self._templates.decode(request.ops, owner), owner=owner, order=wire.order_of(request))
        return owner

    def SynchronizeDevice(self, request, context):
        self.device.synchronize_device(_wait_ms(request.timeout_ms), owner=self._caller(context))
        return _EMPTY

    # ---- user kernels and HCCL
    def RegisterKernel(self, request, context):
        """Unpickles the admin's kernel in this process (see the module doc: the trust boundary; the gate
        let only the admin of a cluster that accepts code uploads through).  A built-in's name is refused
        before the payload is read."""
        import pickle

        owner = self._leased(context)
        check_kernel_name(request.name)
        try:
            fn = pickle.loads(request.code)     # runs the admin's code (the gate refused everyone else)
        except Exception as e:  # noqa: BLE001 - a bad payload is a parameter error
            raise InvalidParamError(f"cannot load kernel {request.name!r}: {type(e).__name__}: {e}"[:300]) from None
        self.device.register_kernel(request.name, fn, owner=owner)
        return _EMPTY

    def ListKernels(self, request, context):
        owner = self._caller(context)
        upload = not owner.limited and self._server.policy.pickled_kernels      # what the gate lets through
        return rms.JsonReply(json=json.dumps(dict(self.device.kernel_names(owner), upload=upload)))

    def drop_client(self, owner) -> None:
        """Forget a departed client's launch templates."""
        self._templates.drop(owner)

    # ---- captured graphs (aclmdlRI)
    def GraphCreate(self, request, context):
        owner = self._leased(context)
        return rms.IntReply(value=self.device.graph_create(self._templates.decode(request.ops, owner), owner=owner))

    def GraphRebind(self, request, context):
        return rms.IntReply(value=self.device.graph_rebind(request.graph, wire.moves_from_pb(request.moves),
                                                           owner=self._caller(context)))

    def HcclCommJoin(self, request, context):
        owner = self._leased(context)
        table = self.device.hccl_comm_join(request.comm, request.rank, request.nranks,
                                           wire.json_field(request.root_json, "HcclCommJoin: root_json"),
                                           wire.json_field(request.config_json, "HcclCommJoin: config_json"),
                                           request.timeout_s or 120.0, owner=owner)
        return rms.JsonReply(json=json.dumps(table))

    def HcclRead(self, request, context):
        view = self.device.hccl_read(request.comm, request.ptr, request.nbytes)
        for i in range(0, view.size, wire.CHUNK_BYTES):
            yield rms.D2HChunk(data=view[i:i + wire.CHUNK_BYTES].tobytes())

# ---------------------------------------------------------------- the server
class DeviceServer:
    """A running DMS+RMS endpoint for one device.  ``stop()`` does not close the device."""

    def __init__(self, device, host: str, token: str, port: int, on_kill, workers: int, max_message_bytes: int,
                 lease_grace_s: float = DEFAULT_GRACE_S, policy: DevicePolicy = DevicePolicy()):
        self.device = device
        self.host = host
        self.token = token
        self.policy = policy
        revocations = Revocations.load(policy.revocations) if policy.revocations else Revocations()
        self.verifier = Verifier(token, revocations)
        self._watch_usage = Usage()                  # open watches per tenant
        self._watch_total = 0
        self.max_watches = max(1, workers - RESERVED_WORKERS)
        self.stopping = threading.Event()
        self._watchers: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._on_kill = on_kill
        self._reply = threading.local()          # the RPC context a fault is injected in (see replying)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers,
                                                              thread_name_prefix=f"npu{device.id}-rpc"),
                                   interceptors=(_Gate(self.verifier, device.id, policy.pickled_kernels),),
                                   options=wire.server_options(max_message_bytes))
        self.dms = DeviceManagementServicer(device, self)
        self.rms = ResourceManagementServicer(device, self)
        self.leases = Leases(self._release_client, lease_grace_s)
        self.kernel_report = self.reload_kernels()   # the node's packages, before the first call is served
        wire.add_DeviceManagementServicer_to_server(self.dms, self._server)
        wire.add_ResourceManagementServicer_to_server(self.rms, self._server)
        bind = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.port = self._server.add_insecure_port(f"{bind}:{port}")
        if not self.port:
            raise OSError(f"cannot bind the device {device.id} services to {bind}:{port}")
        self.address = f"{bind}:{self.port}"
        device.on_kill = self._kill_after_reply      # the kill fault ends the host, not just the device
        self._server.start()

    def _release_client(self, owner: Owner) -> None:
        """A client's lease ran out: free what it left behind (host-blocking, on the lease timer)."""
        res = self.device.release_owner(owner)
        self.rms.drop_client(owner)
        log.info("device %d released departed client %s: %s", self.device.id, owner, res)

    # ---- kernel packages
    def reload_kernels(self) -> dict:
        """Load the kernel packages the policy names (host-blocking: imports them) and install them on the
        device in place of the previous ones.  A package that does not load is left out and reported
        (``errors``: file -> one line) instead of keeping the device from serving."""
        packages, errors = load_all(self.policy.kernels)
        self.device.install_kernels(packages)
        for path, line in errors.items():
            log.error("device %d: kernel package %s not loaded: %s", self.device.id, path, line)
        return {"packages": {p.name: p.describe() for p in packages}, "errors": errors}

    # ---- callers
    def caller(self, context) -> Owner:
        """The call's owner: the tenant its credential authenticates (checked again: a revocation or an
        expiry during a long call shows) and the client it names."""
        auth, client = None, wire.ANONYMOUS
        for k, v in context.invocation_metadata():
            if k == wire.AUTH_KEY:
                auth = v
            elif k == wire.CLIENT_KEY:
                client = v or wire.ANONYMOUS
        who: Principal | None = self.verifier.principal(auth)
        if who is None:
            raise CredentialError("credential revoked or expired")
        return Owner(who.tenant, client, limited=not who.admin)

    def require_lease(self, owner: Owner) -> None:
        """Creating something needs the client's lease on this device (ACL_ERROR_RT_CONTEXT_NULL)."""
        if not self.leases.holds(owner):
            raise AclError(f"client {owner.client!r} of tenant {owner.tenant!r} holds no lease on device "
                           f"{self.device.id}: open one (WatchHealth with lease=true, RemoteDevice.open_lease) "
                           f"before creating anything", code=ACL_ERROR_RT_CONTEXT_NULL)

    def watch_opened(self, owner: Owner, wake: threading.Event) -> None:
        """Count a watch against its tenant's quota and the endpoint's threads (ACL_ERROR_RT_OVER_LIMIT);
        once counted, :meth:`stop` sets ``wake`` (the watch's loop ends) until :meth:`watch_closed`."""
        limit = self.device.config.quota.limit("watches", owner)
        with self._lock:
            if self._watch_total >= self.max_watches:
                raise AclError(f"device {self.device.id}: {self._watch_total} watches already hold the endpoint's "
                               f"threads", code=ACL_ERROR_RT_OVER_LIMIT)
            if limit and self._watch_usage.get(owner) >= limit:
                raise AclError(f"device {self.device.id}: tenant {owner.tenant!r} holds its quota of {limit} open "
                               f"watches", code=ACL_ERROR_RT_OVER_LIMIT)
            self._watch_usage.add(owner)
            self._watch_total += 1
            self._watchers.add(wake)

    def watch_closed(self, owner: Owner, wake: threading.Event) -> None:
        """The watch :meth:`watch_opened` counted ended: uncount it, forget ``wake``."""
        with self._lock:
            self._watchers.discard(wake)
            self._watch_usage.add(owner, -1)
            self._watch_total -= 1

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
          lease_grace_s: float = DEFAULT_GRACE_S, policy: DevicePolicy = DevicePolicy()) -> DeviceServer:
    """Serve ``device`` (DMS + RMS) on ``host:port`` (port 0 = ephemeral) and return the running server.

    ``host`` is the only interface bound (loopback by default; an all-interfaces address only when asked for).  ``token``
    is the cluster secret: the admin's bearer token, and the key tenant credentials are verified with;
    default: ``$VNPU_TOKEN``, else a fresh random token (``server.token``) -- a server never runs
    unauthenticated.  ``policy``: what the server allows (kernel packages, code uploads, revocations;
    :mod:`driver.policy`); its kernel packages are loaded before the server starts serving.  ``on_kill`` runs when the ``kill`` fault is
    injected, after the reply has been sent (a device actor passes one that ends its process); by default
    the endpoint just stops at once, which looks the same to clients.  Either way the device itself is not
    marked lost: its host decides what a kill means.
    """
    if not host:
        raise InvalidParamError("serve() needs an explicit host to bind")
    token = token or os.environ.get("VNPU_TOKEN") or secrets.token_urlsafe(32)
    return DeviceServer(device, host, token, port, on_kill, workers, max_message_bytes, lease_grace_s, policy)


__all__ = ["serve", "DeviceServer", "DeviceManagementServicer", "ResourceManagementServicer"]
