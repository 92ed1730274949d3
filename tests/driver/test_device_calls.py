"""The table of device methods that are one unary RPC each (``driver/calls.py``): nothing is missing on
either side of the wire.

Every RPC of both services has a handler of its own (a row's, or one written out in the servicer: the
generated base would answer UNIMPLEMENTED); every row names a unary RPC of the proto with the fields it
uses and a device method that takes them; every method of the runtime's ``DeviceHandle`` is a method of
both handles (mypy checks the names; ``tests/driver/test_rpc.py`` the remote handle's parameters).  The codec of
the rows (JSON fields, tuples, whole-message replies) round-trips without a network.
"""
from __future__ import annotations

import inspect

import pytest

from devices.device import Device
from devices.errors import InvalidParamError
from driver import wire
from driver.calls import DMS, RMS, Codec, DeviceCalls
from driver.client import RemoteDevice
from driver.service import DeviceManagementServicer, ResourceManagementServicer
from runtime.backend import DeviceHandle

SERVICERS = {DMS: DeviceManagementServicer, RMS: ResourceManagementServicer}
ROWS = DeviceCalls.rows()


def test_every_rpc_of_both_services_has_its_handler():
    for service, servicer in SERVICERS.items():
        rows = {c.rpc: c for c in DeviceCalls.rows(service)}
        for rpc in wire.rpc_names(service):
            handler = vars(servicer).get(rpc)          # not the generated base's UNIMPLEMENTED one
            assert handler is not None, f"{service} {rpc} has no handler: add a row to driver.calls or write it out"
            if rpc in rows:
                assert handler.__name__ == rpc and rows[rpc].name in handler.__doc__, rpc
        assert not set(rows) - set(wire.rpc_names(service)), "rows name RPCs the proto lacks"


@pytest.mark.parametrize("call", ROWS, ids=[c.name for c in ROWS])
def test_a_row_names_a_unary_rpc_with_its_fields_and_a_device_method_that_takes_them(call):
    assert wire.rpc_is_unary(call.service, call.rpc)
    request, reply = wire.rpc_messages(call.service, call.rpc)
    fields = request.DESCRIPTOR.fields_by_name
    assert all(f in fields for f in call.fields), (call.name, sorted(fields))
    assert all(fields[f].type == fields[f].TYPE_STRING for f in call.fields if f == "json" or f.endswith("_json"))
    if isinstance(call.reply, (str, tuple)):
        names = (call.reply,) if isinstance(call.reply, str) else call.reply
        assert all(n in reply.DESCRIPTOR.fields_by_name for n in names), call.name
    elif call.reply is None:
        assert not reply.DESCRIPTOR.fields, f"{call.name} drops the reply's fields"
    params = [p for p in inspect.signature(getattr(Device, call.serves)).parameters.values()
              if p.name not in ("self", "owner")]
    assert len(params) >= len(call.fields), f"Device.{call.serves} takes fewer arguments than {call.fields}"
    assert all(p.default is not p.empty for p in params[len(call.fields):]), \
        f"Device.{call.serves} has parameters the RPC does not carry and that have no default"
    assert all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params)


def test_every_device_handle_method_is_a_method_of_both_handles():
    names = [n for n, v in vars(DeviceHandle).items() if not n.startswith("_") and callable(v)]
    assert len(names) > 30
    missing = {h.__name__: [n for n in names if not hasattr(h, n)] for h in (Device, RemoteDevice)}
    assert missing == {"Device": [], "RemoteDevice": []}
    rows = {c.name: c for c in ROWS}
    for n in names:
        if n in rows:              # a row, not shadowed by a method written out in the client
            assert getattr(RemoteDevice, n) is rows[n].client_method, n


def test_a_servicer_that_writes_out_a_row_is_refused_at_import():
    from driver import service

    class Twice(wire.ResourceManagementServicer):
        def Malloc(self, request, context):
            return None

    with pytest.raises(TypeError, match="Malloc is written out and also the row 'malloc'"):
        service._serving(RMS)(Twice)


def test_the_rows_codec_round_trips_json_tuples_and_whole_messages():
    init = DeviceCalls.__dict__["hccl_comm_init"]
    peers = [{"device_id": 1, "arena": "a"}, {"device_id": 2, "arena": "b"}]
    req = init.messages[0]
    wire_req = req.FromString(init.request(["x" * 16, 1, peers, None]).SerializeToString())
    assert init.arguments(wire_req) == {"comm_id": "x" * 16, "rank": 1, "peers": peers, "config": None}
    with pytest.raises(InvalidParamError, match="peers_json is not JSON"):
        init.arguments(req(comm="c", peers_json="{"))
    with pytest.raises(InvalidParamError, match="cannot encode peers_json as JSON"):
        init.request(["x" * 16, 1, [object()], None])
    with pytest.raises(InvalidParamError):
        init.request(["x" * 16, "one", peers, None])             # an int field given a string
    elapsed = DeviceCalls.__dict__["event_elapsed"]
    assert elapsed.result(elapsed.reply_message((1.5, 2.5))) == (1.5, 2.5)
    info = DeviceCalls.__dict__["hccl_info"]
    assert info.result(info.reply_message({"device_id": 3, "stats": {"messages": 1}})) == \
        {"device_id": 3, "stats": {"messages": 1}}
    tele = DeviceCalls.__dict__["telemetry"]
    assert isinstance(tele.reply, Codec)
    t = {"health": "OK", "conditions": [], "aicore_util": [0.5], "temperature_c": 40.0}
    back = tele.result(wire.dms.Telemetry.FromString(tele.reply_message(t).SerializeToString()))
    assert back["health"] == "OK" and back["aicore_util"] == [0.5] and back["temperature_c"] == 40.0
