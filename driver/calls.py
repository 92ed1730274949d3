"""The device methods that travel as one unary RPC each, in one table: the rows of :class:`DeviceCalls`.

A row (:class:`Call`) is named for the method and says which RPC carries it (service and method of
``proto/vnpu/v1``), the request fields its arguments travel in (in the order of its parameters), what of
the reply it returns, whether the caller must hold a lease (a method that creates something) or be the
cluster's admin, and -- when the name differs -- the device method it calls.  Both ends are made from it:

* the client's method: :class:`driver.client.RemoteDevice` inherits :class:`DeviceCalls`, so every row
  is a method of the remote handle -- arguments into the request, the reply back into the result, through
  the client's one call helper (deadline, credentials, typed CANN errors);
* the service's handler: :mod:`driver.service` installs one per row -- the request's fields into the
  device method's arguments, plus the caller (``owner``) when the device method takes one (its lease
  checked where the row says so), the result into the reply.

The parameters (names, order, defaults) are those of the in-process device's method
(:class:`devices.device.Device`) without ``owner``; ``tests/driver/test_rpc.py`` checks them against the
runtime's :class:`runtime.backend.DeviceHandle`, ``tests/driver/test_device_calls.py`` every row against the proto
and the device, and every RPC for a handler.  A field named ``json`` or
ending in ``_json`` carries a JSON document (an empty one is None).  Methods with more to them -- streams,
batches of stream ops and their launch templates, synchronizes, the health watch, fault parameters, code
uploads -- are written out in the client and the servicer.  Nothing here opens a socket.
"""
from __future__ import annotations

import functools
import inspect
import json
import operator
from dataclasses import dataclass
from typing import Any, Callable

from devices.device import Device
from devices.errors import InvalidParamError

from . import wire

DMS, RMS = "dms", "rms"


@dataclass(frozen=True)
class Codec:
    """A reply carried as a whole message: ``to_pb(result)`` on the device's end, ``from_pb(reply)`` on
    the client's."""
    to_pb: Callable[[Any], Any]
    from_pb: Callable[[Any], Any]


def _is_json(field: str) -> bool:
    return field == "json" or field.endswith("_json")


def _bind(name: str, names: tuple[str, ...], defaults: dict, args: tuple, kw: dict) -> tuple:
    """The arguments of a call of method ``name`` (parameters ``names``, some with ``defaults``) in
    parameter order; TypeError as Python's own for a call that does not fit."""
    if len(args) > len(names):
        raise TypeError(f"{name}() takes {len(names)} arguments but {len(args)} were given")
    out = list(args)
    for n in names[len(args):]:
        if n in kw:
            out.append(kw.pop(n))
        elif n in defaults:
            out.append(defaults[n])
        else:
            raise TypeError(f"{name}() missing required argument: {n!r}")
    if kw:
        raise TypeError(f"{name}() got an unexpected keyword argument {next(iter(kw))!r}")
    return tuple(out)


@dataclass(frozen=True)
class Call:
    """One row: ``service`` (:data:`DMS` | :data:`RMS`) and ``rpc`` carry the method; ``fields``: the request
    fields of its arguments, in order; ``reply``: None (nothing), a field, a tuple of fields (returned as a
    tuple) or a :class:`Codec`; ``leased``: the caller must hold a lease; ``admin``: the cluster's admin
    only; ``serves``: the device method, when not the row's own name."""
    service: str
    rpc: str
    fields: tuple[str, ...] = ()
    reply: str | tuple[str, ...] | Codec | None = None
    leased: bool = False
    admin: bool = False
    serves: str = ""
    name: str = ""                     #: the method (set from the row's name in DeviceCalls)

    def __set_name__(self, owner, name: str) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "serves", self.serves or name)

    def __get__(self, obj, objtype=None) -> Callable[..., Any]:
        return self.client_method.__get__(obj, objtype)

    # ---------------------------------------------------------------- what the row derives
    @functools.cached_property
    def messages(self) -> tuple[type, type]:
        """(request class, reply class) of the RPC."""
        return wire.rpc_messages(self.service, self.rpc)

    @functools.cached_property
    def device_signature(self) -> inspect.Signature:
        return inspect.signature(getattr(Device, self.serves))

    @property
    def takes_owner(self) -> bool:
        """Whether the device method is called for the caller (its ``owner`` parameter)."""
        return "owner" in self.device_signature.parameters

    @functools.cached_property
    def params(self) -> tuple[inspect.Parameter, ...]:
        """The method's parameters: the device method's, without ``self`` and ``owner``, one per field."""
        ps = [p for p in self.device_signature.parameters.values() if p.name not in ("self", "owner")]
        return tuple(ps[:len(self.fields)])

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """The client method's signature (``self`` first)."""
        ret = "None" if self.reply is None else self.device_signature.return_annotation
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return inspect.Signature([this, *(p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                          for p in self.params)], return_annotation=ret)

    @functools.cached_property
    def client_method(self) -> Callable[..., Any]:
        """The remote handle's method: the arguments in order, the request sent (``self._unary``), the
        result returned."""
        call, name, n = self, self.name, len(self.params)
        names = tuple(p.name for p in self.params)
        defaults = {p.name: p.default for p in self.params if p.default is not p.empty}

        request, result = self.request, self.result

        def method(self, *args, **kw):
            if kw or len(args) != n:
                args = _bind(name, names, defaults, args, kw)
            return result(self._unary(call, request(args)))

        method.__name__ = method.__qualname__ = self.name
        method.__signature__ = self.signature            # type: ignore[attr-defined]
        doc = inspect.getdoc(getattr(Device, self.serves)) or ""
        method.__doc__ = f"{doc}\n\n(over gRPC: {self.service.upper()} {self.rpc})".lstrip()
        return method

    # ---------------------------------------------------------------- the client's end
    @functools.cached_property
    def _json_fields(self) -> frozenset[str]:
        return frozenset(f for f in self.fields if _is_json(f))

    def request(self, values) -> Any:
        """The request carrying ``values`` (the arguments, in order); a value the field cannot hold is a
        parameter error (InvalidParamError, ACL_ERROR_RT_PARAM_INVALID)."""
        kw = dict(zip(self.fields, values))
        for f in self._json_fields or ():
            try:
                kw[f] = json.dumps(kw[f])
            except (TypeError, ValueError) as e:
                raise InvalidParamError(f"{self.name}: cannot encode {f} as JSON: {e}"[:300]) from None
        return wire.message(self.messages[0], **kw)

    @functools.cached_property
    def result(self) -> Callable[[Any], Any]:
        """What the client method returns for a reply: ``result(reply)``."""
        r = self.reply
        if r is None:
            return lambda reply: None
        if isinstance(r, Codec):
            return r.from_pb
        if isinstance(r, tuple):
            return operator.attrgetter(*r) if len(r) > 1 else lambda reply: (getattr(reply, r[0]),)
        if _is_json(r):
            return lambda reply: json.loads(getattr(reply, r))
        return operator.attrgetter(r)

    # ---------------------------------------------------------------- the device's end
    def arguments(self, request) -> dict:
        """The device method's arguments (by parameter name) from ``request``'s fields; a JSON field that
        does not parse is a parameter error."""
        return {p.name: wire.json_field(getattr(request, f), f"{self.rpc}: {f}") if _is_json(f)
                else getattr(request, f) for p, f in zip(self.params, self.fields)}

    def reply_message(self, result) -> Any:
        """The reply carrying the device method's ``result``."""
        r, cls = self.reply, self.messages[1]
        if r is None:
            return cls()
        if isinstance(r, Codec):
            return r.to_pb(result)
        if isinstance(r, tuple):
            return cls(**dict(zip(r, result)))
        return cls(**{r: json.dumps(result) if _is_json(r) else result})


class DeviceCalls:
    """The table: one :class:`Call` per device method that is one unary RPC, named for the method.  A
    class inheriting it (the remote handle) has each as a method, sent with its ``_unary(call, request)``."""

    # ---- info, health, lifecycle (DMS)
    health_report = Call(DMS, "GetHealth", reply=Codec(wire.health_status_to_pb, wire.health_report_from_pb))
    telemetry = Call(DMS, "GetTelemetry", reply=Codec(wire.telemetry_to_pb, wire.telemetry_from_pb))
    reset = Call(DMS, "Reset", admin=True)

    # ---- memory
    malloc = Call(RMS, "Malloc", ("size", "policy", "placement"), "ptr", leased=True)
    free = Call(RMS, "Free", ("ptr",))
    memcpy_d2d = Call(RMS, "MemcpyD2D", ("dst", "src", "nbytes"))
    memset = Call(RMS, "Memset", ("ptr", "value", "nbytes"))
    check_range = Call(RMS, "CheckRange", ("ptr", "nbytes", "write"), "offset")
    mem_info = Call(RMS, "MemInfo", reply=("free", "total"))

    # ---- streams and events
    create_stream = Call(RMS, "CreateStream", ("priority",), "stream", leased=True)
    destroy_stream = Call(RMS, "DestroyStream", ("stream",))
    create_event = Call(RMS, "CreateEvent", ("flags",), "event", leased=True)
    destroy_event = Call(RMS, "DestroyEvent", ("event",))
    query_stream = Call(RMS, "QueryStream", ("stream",), "done")
    query_event = Call(RMS, "QueryEvent", ("event",), "done")
    event_elapsed = Call(RMS, "EventElapsed", ("start", "end"), ("wall_ms", "model_ms"))
    event_timestamp = Call(RMS, "EventTimestamp", ("event",), ("wall_s", "model_s"))
    signal_event = Call(RMS, "SignalEvent", ("event", "gen"))

    # ---- captured graphs, profiling
    graph_destroy = Call(RMS, "GraphDestroy", ("graph",))
    graph_info = Call(RMS, "GraphInfo", ("graph",), "json")
    profile = Call(RMS, "Profile", ("action",), "json")

    # ---- HCCL
    hccl_info = Call(RMS, "HcclInfo", reply="json")
    hccl_comm_init = Call(RMS, "HcclCommInit", ("comm", "rank", "peers_json", "config_json"), leased=True)
    hccl_comm_destroy = Call(RMS, "HcclCommDestroy", ("comm",))
    hccl_async_error = Call(RMS, "HcclAsyncError", ("comm",), "value")
    hccl_notify = Call(RMS, "HcclNotify", ("json",), admin=True, serves="hccl_deliver")

    def _unary(self, call: Call, request) -> Any:
        """Send ``request`` of ``call`` and return the reply (the inheriting handle's call helper)."""
        raise NotImplementedError

    @classmethod
    def rows(cls, service: str | None = None) -> list[Call]:
        """The table's rows (of ``service`` when given), in order."""
        return [v for v in vars(DeviceCalls).values()
                if isinstance(v, Call) and (service is None or v.service == service)]


__all__ = ["DMS", "RMS", "Codec", "Call", "DeviceCalls"]
