"""rpc tier: the driver over real gRPC on loopback (no Ray).

Devices run in this process, served by :func:`driver.service.serve` on 127.0.0.1 with an ephemeral port;
:class:`driver.client.RemoteDevice` talks to them exactly as the runtime does.  User kernels registered
here are visible to the served device (same process, same registry).
"""
from __future__ import annotations

import queue
import threading

import grpc
import numpy as np

import pytest

from devices.device import Device, DeviceConfig
from devices.errors import (AclError, DeviceLostError, InvalidHandleError, InvalidParamError, KernelError,
                            MemoryAllocationError)
from devices.kernel import TensorDesc, register_user_kernel
from devices.tasks import CopyD2D, ExecGraph, Launch, Memset, Record, Wait, WriteH2D
from devices.tenancy import Owner
from driver import credentials, wire
from driver.client import HealthEvent, RemoteDevice, RemoteDeviceInfo
from driver.service import serve
from runtime.backend import DeviceHandle

pytestmark = pytest.mark.rpc

TOKEN = "test-token-0123456789"
ARENA = 32 << 20
MiB = 1 << 20


# ---------------------------------------------------------------- kernels used below
def _affine_u8(ctx, x, y, mul=1, add=0):
    """y = x * mul + add (uint8, wrapping), split across blocks."""
    r = ctx.split(x.size)
    if len(r):
        y[r.start:r.stop] = x[r.start:r.stop] * np.uint8(mul) + np.uint8(add)


def _incr_f32(ctx, x):
    """x += 1 (one element; used to count launches)."""
    x[0:1] = x[0:1] + np.float32(1)


register_user_kernel("rpc_test_affine_u8", _affine_u8, replace=True)
register_user_kernel("rpc_test_incr_f32", _incr_f32, replace=True)


# ---------------------------------------------------------------- fixtures
class Served:
    """A device + its server + the clients made for it; everything is torn down in ``close``."""

    def __init__(self, device_id: int, **serve_kw):
        self.device = Device(DeviceConfig(device_id=device_id, arena_bytes=ARENA))
        self.server = None
        self.clients: list[RemoteDevice] = []
        try:
            self.server = serve(self.device, host="127.0.0.1", token=TOKEN, port=0, **serve_kw)
        except BaseException:
            self.device.close()
            raise

    def client(self, lease: bool = True, **kw) -> RemoteDevice:
        """A client of the served device; with ``lease`` (the default) it holds a lease, as every runtime
        client does (creating anything needs one)."""
        kw.setdefault("timeout_s", 10.0)
        c = RemoteDevice(self.server.address, kw.pop("token", TOKEN), kw.pop("device_id", self.device.id), **kw)
        self.clients.append(c)
        if lease:
            c.open_lease()
        return c

    def close(self) -> None:
        try:
            for c in self.clients:
                c.close()
        finally:
            try:
                if self.server is not None:
                    self.server.stop(grace=None)
            finally:
                self.device.close()


@pytest.fixture(scope="module")
def node():
    """One served device shared by the non-destructive tests of this module."""
    s = Served(3)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def fresh():
    """Served devices private to one test (for tests that stop servers or inject faults)."""
    made: list[Served] = []

    def make(device_id: int = 5, **kw) -> Served:
        s = Served(device_id, **kw)
        made.append(s)
        return s
    try:
        yield make
    finally:
        for s in made:
            s.close()


def _raw_channel(served: Served, **opts):
    options = [("grpc.max_send_message_length", 128 * MiB), ("grpc.max_receive_message_length", 128 * MiB)]
    return grpc.insecure_channel(served.server.address, options=options)


AUTH = (("authorization", f"Bearer {TOKEN}"), ("vnpu-client", "raw-test"))


# ---------------------------------------------------------------- schema
def test_service_names_are_pinned():
    assert wire.DMS_NAME == "vnpu.v1.DeviceManagement"
    assert wire.RMS_NAME == "vnpu.v1.ResourceManagement"
    assert wire.dms.DESCRIPTOR.package == wire.rms.DESCRIPTOR.package == "vnpu.v1"
    dms_methods = {m.name for m in wire.DMS_SERVICE.methods}
    rms_methods = {m.name for m in wire.RMS_SERVICE.methods}
    assert {"GetDeviceInfo", "GetHealth", "WatchHealth", "GetTelemetry", "Reset", "InjectFault"} <= dms_methods
    assert {"Malloc", "Free", "MemcpyH2D", "MemcpyD2H", "MemcpyD2D", "Memset", "CreateStream", "DestroyStream",
            "CreateEvent", "DestroyEvent", "Submit", "SynchronizeStream", "SynchronizeEvent", "SynchronizeDevice",
            "QueryStream", "QueryEvent", "EventElapsed", "EventTimestamp", "SignalEvent", "MemInfo",
            "CheckRange"} <= rms_methods
    m = wire.RMS_SERVICE.methods_by_name
    assert m["MemcpyH2D"].client_streaming and not m["MemcpyH2D"].server_streaming
    assert m["MemcpyD2H"].server_streaming and not m["MemcpyD2H"].client_streaming
    assert wire.DMS_SERVICE.methods_by_name["WatchHealth"].server_streaming


def test_codec_round_trip_every_op_and_attr_kind():
    P = 0xAC << 56
    d = TensorDesc(P + 64, (2, 3), "float16")
    attrs = {"i": -7, "f": 0.5, "b": True, "s": "gelu", "none": None, "ints": (1, -2, 3), "floats": [0.5, 2],
             "bools": (True, False), "strs": ("a", "b"), "empty": (), "big": (1 << 64) - 1,
             "np_int": np.int32(4), "np_float": np.float32(0.25), "np_list": np.array([1, 2], dtype=np.int64)}
    ops = [Launch(1, "k", (d, d), (d,), attrs, 4), Launch(2, "k2"), Record(1, 9), Wait(2, 9, 3),
           CopyD2D(1, P + 128, P, 64), Memset(1, P, 255, 10), WriteH2D(1, P, b"\x00\x01xyz"), ExecGraph(3, 17)]
    back = wire.ops_from_pb(wire.rms.SubmitRequest.FromString(wire.submit_request(ops).SerializeToString()).ops)
    assert back[1:] == ops[1:]
    got = back[0]
    assert (got.stream, got.kernel, got.inputs, got.outputs, got.block_dim) == (1, "k", (d, d), (d,), 4)
    want = {"i": -7, "f": 0.5, "b": True, "s": "gelu", "none": None, "ints": (1, -2, 3), "floats": (0.5, 2.0),
            "bools": (True, False), "strs": ("a", "b"), "empty": (), "big": (1 << 64) - 1, "np_int": 4,
            "np_float": 0.25, "np_list": (1, 2)}
    assert got.attrs == want
    assert type(got.attrs["b"]) is bool and type(got.attrs["i"]) is int
    with pytest.raises(InvalidParamError):
        wire.submit_request([Launch(1, "k", attrs={"bad": object()})])
    with pytest.raises(InvalidParamError):
        wire.submit_request([Memset(1, -1, 0, 4)])          # not a device pointer (negative)


def test_codec_cost_per_launch_is_small():
    """What a launch costs on the wire, counted in bytes (never timed): a full launch at most twice its raw
    payload (kernel name, 8-byte pointer + 8 bytes per dimension + dtype name per tensor, attributes), and
    a launch seen before (a template reference) a few bytes; both decode back to the same ops."""
    P = 0xAC << 56
    ops = [Launch(1, "add", (TensorDesc(P + 64 * i, (32, 64)), TensorDesc(P, (32, 64))), (TensorDesc(P, (32, 64)),),
                  {"alpha": 1.5}) for i in range(1000)]
    raw = len("add") + 3 * (8 + 2 * 8 + len("float32")) + len("alpha") + 8
    full = wire.submit_request(ops).SerializeToString()
    assert wire.ops_from_pb(wire.rms.SubmitRequest.FromString(full).ops) == ops
    assert len(full) / len(ops) <= 2 * raw, (len(full) / len(ops), raw)
    templates, table = wire.LaunchTemplates(), wire.TemplateTable()
    first = wire.submit_request(ops, templates).SerializeToString()
    again = wire.submit_request(ops, templates).SerializeToString()
    assert len(first) / len(ops) <= 2 * raw + 4                     # + the template id
    assert len(again) / len(ops) <= 12, len(again) / len(ops)        # stream + template reference
    assert table.decode(wire.rms.SubmitRequest.FromString(first).ops, "c") == ops
    assert table.decode(wire.rms.SubmitRequest.FromString(again).ops, "c") == ops


def test_remote_device_has_the_device_handle_signatures():
    """Same parameter names and defaults as the runtime's DeviceHandle (extra parameters only with defaults)."""
    import inspect
    for name, fn in vars(DeviceHandle).items():
        if name.startswith("_") or not callable(fn):
            continue
        want = list(inspect.signature(fn).parameters.values())[1:]
        got = list(inspect.signature(getattr(RemoteDevice, name)).parameters.values())[1:]
        assert [(p.name, p.default) for p in got[:len(want)]] == [(p.name, p.default) for p in want], name
        assert all(p.default is not inspect.Parameter.empty for p in got[len(want):]), name


def test_telemetry_codec_keeps_keys_and_types(node):
    local = node.device.telemetry()
    back = wire.telemetry_from_pb(wire.telemetry_to_pb(local))
    assert set(back) == set(local)
    for k, v in local.items():
        assert type(back[k]) is type(v) or (isinstance(v, float) and isinstance(back[k], float)), k


# ---------------------------------------------------------------- basics
def test_binds_loopback_and_reports_info(node):
    srv = node.server
    assert srv.address == f"127.0.0.1:{srv.port}" and srv.port > 0
    c = node.client()
    info = c.info()
    assert isinstance(info, RemoteDeviceInfo)
    assert info.device_id == 3 and info.chip == "Ascend910B3" and info.hbm_total == ARENA
    assert info.arena_name == node.device.arena.name and info.arena_size == ARENA
    assert info.node_address == srv.address
    assert set(c.telemetry()) == set(node.device.telemetry())
    assert c.health() == ("OK", [])
    assert isinstance(c, DeviceHandle)
    free, total = c.mem_info()
    assert total == ARENA and 0 < free <= total


@pytest.mark.parametrize("same_node", [True, False], ids=["shm", "grpc"])
@pytest.mark.parametrize("size", [1, 3 * MiB + 7], ids=["1B", "3MiB+7"])
def test_round_trip_h2d_launch_d2h(node, same_node, size):
    c = node.client(same_node=same_node)
    assert c.fast_path is same_node
    rng = np.random.default_rng(size)
    host = rng.integers(0, 256, size, dtype=np.uint8)
    x = c.malloc(size)
    y = c.malloc(size)
    try:
        before = c.rpc_count
        c.memcpy_h2d(x, host)
        if same_node:
            assert c.rpc_count - before == 1              # one CheckRange + a local memcpy
        s = c.create_stream()
        c.submit([Launch(s, "rpc_test_affine_u8", (TensorDesc(x, (size,), "uint8"),),
                         (TensorDesc(y, (size,), "uint8"),), {"mul": 3, "add": 7}, 4)])
        c.synchronize_stream(s)
        got = c.memcpy_d2h(y, size)
        assert got.dtype == np.uint8 and got.shape == (size,)
        np.testing.assert_array_equal(got, host * np.uint8(3) + np.uint8(7))
        np.testing.assert_array_equal(c.memcpy_d2h(x, size), host)
        out = np.empty(size, dtype=np.uint8)
        assert c.memcpy_d2h(x, size, out=out) is out
        np.testing.assert_array_equal(out, host)
        # the device's own view agrees (no stale copies anywhere)
        np.testing.assert_array_equal(node.device.memcpy_d2h(y, size), got)
        c.destroy_stream(s)
    finally:
        c.free(x)
        c.free(y)


def test_copy_paths_agree_and_check_bounds(node):
    fast, slow = node.client(same_node=True), node.client(same_node=False)
    for c in (fast, slow):
        p = c.malloc(4096)
        c.memcpy_h2d(p, np.arange(4096, dtype=np.uint8).tobytes())
        c.memset(p + 10, 0xAB, 6)
        q = c.malloc(4096)
        c.memcpy_d2d(q, p, 4096)
        got = c.memcpy_d2h(q, 4096)
        want = np.arange(4096, dtype=np.uint8)
        want[10:16] = 0xAB
        np.testing.assert_array_equal(got, want)
        with pytest.raises(AclError) as e:
            c.memcpy_h2d(p + 4000, bytes(200))           # overruns the allocation
        assert e.value.code == 107000
        with pytest.raises(AclError) as e:
            c.memcpy_d2h(p, 4097)
        assert e.value.code == 107000
        c.free(p)
        with pytest.raises(AclError) as e:
            c.memcpy_d2h(p, 16)                           # use after free
        assert e.value.code == 107000
        c.free(q)


# ---------------------------------------------------------------- auth and robustness
def test_unauthenticated_calls_are_refused_and_do_nothing(node):
    allocs = node.device.arena.stats().allocations
    ch = _raw_channel(node)
    try:
        stub = wire.ResourceManagementStub(ch)
        for md in [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)]:
            with pytest.raises(grpc.RpcError) as e:
                stub.Malloc(wire.rms.MallocRequest(size=64), metadata=md, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:          # client streaming too
            stub.MemcpyH2D(iter([wire.rms.H2DChunk(dst=1, total=1, data=b"x")]), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:          # and server streaming
            list(wire.DeviceManagementStub(ch).WatchHealth(wire.dms.WatchHealthRequest(interval_ms=10), timeout=10))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        ch.close()
    bad = node.client(token="not-the-token", lease=False)
    with pytest.raises(AclError) as e:
        bad.malloc(64)
    assert e.value.grpc_status == grpc.StatusCode.UNAUTHENTICATED and e.value.code == 207006
    refused: queue.Queue[HealthEvent] = queue.Queue()
    w = bad.watch_health(20, refused.put)                # a refused watch is an error, not a device loss
    ev = refused.get(timeout=10)
    assert ev.error is not None and ev.error.code == 207006 and not ev.lost
    w.stop()
    assert not bad.lost.is_set()
    assert node.device.arena.stats().allocations == allocs
    good = node.client()
    p = good.malloc(64)                                  # the device still serves others
    good.free(p)


def test_oversized_and_malformed_messages_are_refused_server_keeps_working(node):
    c = node.client()
    as_c = (AUTH[0], ("vnpu-client", c.client_id))       # a client that holds a lease
    ch = _raw_channel(node)
    try:
        stub = wire.ResourceManagementStub(ch)
        huge = wire.rms.SubmitRequest(ops=[wire.rms.StreamOp(stream=1, write_h2d=wire.rms.WriteH2DOp(
            dst=0, data=bytes(wire.MAX_MESSAGE_BYTES + 1)))])
        with pytest.raises(grpc.RpcError) as e:
            stub.Submit(huge, metadata=as_c, timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        garbage = ch.unary_unary("/vnpu.v1.ResourceManagement/Malloc")      # raw bytes, no serializer
        with pytest.raises(grpc.RpcError) as e:
            garbage(b"\xff\xff\xff\xff\x0f", metadata=as_c, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:                              # op with an empty oneof
            stub.Submit(wire.rms.SubmitRequest(ops=[wire.rms.StreamOp(stream=1)]), metadata=as_c, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(e.value.trailing_metadata())["vnpu-acl-code"] == "107000"
        with pytest.raises(grpc.RpcError) as e:                              # H2D stream shorter than announced
            stub.MemcpyH2D(iter([wire.rms.H2DChunk(dst=c.malloc(64), total=64, data=b"abc")]), metadata=as_c,
                           timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(e.value.trailing_metadata())["vnpu-acl-code"] == "107000"
    finally:
        ch.close()
    with pytest.raises(AclError) as e:                   # the client's own limit: refused before sending
        c.submit([WriteH2D(c.create_stream(), c.malloc(64), bytes(wire.MAX_MESSAGE_BYTES + 1))])
    assert e.value.code == 207012
    p = c.malloc(128)                                    # still serving
    c.memcpy_h2d(p, b"ok")
    assert c.memcpy_d2h(p, 2).tobytes() == b"ok"


def test_malformed_launches_get_the_device_codes(node):
    c = node.client()
    s = c.create_stream()
    a = c.malloc(4 * 16)
    with pytest.raises(KernelError) as e:
        c.submit([Launch(s, "no_such_kernel", (TensorDesc(a, (16,)),), (TensorDesc(a, (16,)),))])
    assert e.value.code == 507027
    with pytest.raises(InvalidParamError) as e:          # wrong shapes for a built-in kernel
        c.submit([Launch(s, "add", (TensorDesc(a, (4,)), TensorDesc(a, (4,))), (TensorDesc(a, (5,)),))])
    assert e.value.code == 107000
    with pytest.raises(AclError) as e:                   # bad dtype
        c.submit([Launch(s, "rpc_test_affine_u8", (TensorDesc(a, (4,), "float128"),), (TensorDesc(a, (4,)),))])
    assert e.value.code == 100026
    with pytest.raises(AclError) as e:                   # tensor larger than its allocation
        c.submit([Launch(s, "rpc_test_affine_u8", (TensorDesc(a, (1000,), "uint8"),), (TensorDesc(a, (4,), "uint8"),))])
    assert e.value.code == 107000
    with pytest.raises(InvalidParamError):
        c.malloc(0)
    with pytest.raises(InvalidParamError):
        c.malloc(-5)
    c.synchronize_stream(s)                              # nothing was queued: the stream is clean
    c.free(a)


def test_unknown_handles_are_107017(node):
    c = node.client()
    for call in (lambda: c.synchronize_stream(987654), lambda: c.synchronize_event(987654),
                 lambda: c.query_stream(987654), lambda: c.query_event(987654), lambda: c.destroy_stream(987654),
                 lambda: c.destroy_event(987654), lambda: c.event_timestamp(987654),
                 lambda: c.submit([Record(987654, 1)])):
        with pytest.raises(InvalidHandleError) as e:
            call()
        assert e.value.code == 107017
    s = c.create_stream()
    with pytest.raises(InvalidHandleError):
        c.submit([Record(s, 987654)])


def test_pointer_of_another_device_is_refused(node, fresh):
    other = fresh(4)
    mine, theirs = node.client(), other.client()
    p_other = theirs.malloc(256)
    for c in (mine, node.client(same_node=False)):
        with pytest.raises(AclError) as e:
            c.memcpy_d2h(p_other, 16)
        assert e.value.code == 107000 and "device 4" in str(e.value)
        with pytest.raises(AclError) as e:
            c.free(p_other)
        assert e.value.code == 107000
        s = c.create_stream()
        with pytest.raises(AclError) as e:
            c.submit([Memset(s, p_other, 0, 16)])
        assert e.value.code == 107000


def test_tenants_are_isolated(node):
    """Two tenants (credentials minted from the cluster token): neither reaches the other's memory, streams,
    events or graphs, over gRPC or the same-node fast path.  (tests/security has one test per attack.)"""
    alice = node.client(token=credentials.mint(TOKEN, "alice"), client_id="alice")
    bob_tok = credentials.mint(TOKEN, "bob")
    bob, bob_fast = node.client(token=bob_tok, client_id="bob", same_node=False), node.client(token=bob_tok)
    p = alice.malloc(1024)
    alice.memcpy_h2d(p, bytes(range(256)) * 4)
    s = alice.create_stream()
    e = alice.create_event()
    for b in (bob, bob_fast):
        with pytest.raises(AclError) as err:
            b.free(p)
        assert err.value.code == 207006
        with pytest.raises(AclError) as err:
            b.memcpy_d2h(p, 16)
        assert err.value.code == 207006
        with pytest.raises(AclError) as err:
            b.memcpy_h2d(p, b"evil")
        assert err.value.code == 207006
        with pytest.raises(InvalidHandleError):
            b.synchronize_stream(s)
        with pytest.raises(InvalidHandleError):
            b.destroy_event(e)
        bs = b.create_stream()
        with pytest.raises(AclError) as err:
            b.submit([Memset(bs, p, 0, 16)])                 # alice's memory on bob's own stream
        assert err.value.code == 207006
    g = alice.graph_create([Memset(s, p, 7, 16)])            # a captured graph is its owner's too
    for b in (bob, bob_fast):
        with pytest.raises(InvalidHandleError):
            b.graph_destroy(g)
        with pytest.raises(InvalidHandleError):
            b.graph_info(g)
        with pytest.raises(InvalidHandleError):
            b.submit([ExecGraph(b.create_stream(), g)])
    assert alice.graph_info(g)["tasks"] == 1
    alice.graph_destroy(g)
    assert alice.memcpy_d2h(p, 8).tolist() == list(range(8))
    alice.submit([Record(s, e)])
    alice.synchronize_event(e)
    alice.free(p)


def test_wrong_device_id_is_refused(node):
    c = node.client(device_id=99, lease=False)
    with pytest.raises(AclError) as e:
        c.mem_info()
    assert e.value.code == 107001


# ---------------------------------------------------------------- batching and synchronization
def test_batched_submit_is_one_rpc(node):
    c = node.client()
    x = c.malloc(4)
    c.memcpy_h2d(x, np.zeros(1, np.float32))
    s = c.create_stream()
    e0, e1 = c.create_event(), c.create_event()
    ops = [Record(s, e0)] + [Launch(s, "rpc_test_incr_f32", (), (TensorDesc(x, (1,)),)) for _ in range(1000)] \
        + [Record(s, e1)]
    warm = c.malloc(4)                                   # the kernel's name is resolved once, up front
    c.synchronize_stream(s, ops=[Launch(s, "rpc_test_incr_f32", (), (TensorDesc(warm, (1,)),))])
    def round_trips(before: tuple[int, int]) -> int:
        """RPCs since ``before``, less the waits that only continue a synchronize the device made longer
        than its first bounded wait (a loaded machine)."""
        return (c.rpc_count - before[0]) - (c.wait_continuations - before[1])

    before = (c.rpc_count, c.wait_continuations)
    c.submit(ops)
    c.synchronize_stream(s)
    assert round_trips(before) == 2                      # exactly: Submit + SynchronizeStream
    assert c.memcpy_d2h(x, 4).view(np.float32)[0] == 1000.0
    before = (c.rpc_count, c.wait_continuations)
    c.synchronize_stream(s, ops=ops[1:-1])               # the batch riding on the wait: ONE round trip
    assert round_trips(before) == 1
    assert c.memcpy_d2h(x, 4).view(np.float32)[0] == 2000.0
    wall_ms, model_ms = c.event_elapsed(e0, e1)
    e2, e3 = c.create_event(), c.create_event()
    c.synchronize_stream(s, ops=[Record(s, e2), ops[1], Record(s, e3)])
    one = c.event_elapsed(e2, e3)[1]                     # the modeled time of one of those launches
    assert wall_ms > 0 and one > 0
    assert model_ms == pytest.approx(1000 * one, rel=1e-9)   # modeled time adds up, launch by launch
    assert c.query_stream(s) and c.query_event(e1)
    before = (c.rpc_count, c.wait_continuations)
    c.synchronize_event(e1, ops=ops[1:])                 # the batch riding on an event's wait: ONE round trip
    assert round_trips(before) == 1
    assert c.memcpy_d2h(x, 4).view(np.float32)[0] == 3001.0     # e1's new record came after 1000 more launches


def test_blocking_synchronize_does_not_starve_other_calls(node):
    c = node.client()
    s, gate = c.create_stream(), c.create_event()
    c.submit([Wait(s, gate, 1)])                         # parks the stream until the host signals
    assert not c.query_stream(s)
    done = queue.Queue()
    t = threading.Thread(target=lambda: done.put(c.synchronize_stream(s)))
    t.start()
    for _ in range(20):                                  # other calls go through meanwhile
        c.free(c.malloc(64))
    with pytest.raises(AclError) as e:                   # a bounded wait times out with the CANN code
        c.synchronize_stream(s, timeout_ms=20)
    assert e.value.code == 507046
    assert t.is_alive()
    c.signal_event(gate, 1)
    assert done.get(timeout=10) is None
    t.join(timeout=10)


def test_error_mapping_round_trip(node):
    c = node.client()
    with pytest.raises(MemoryAllocationError) as e:
        c.malloc(ARENA * 2)
    assert e.value.code == 207001 and e.value.grpc_status == grpc.StatusCode.RESOURCE_EXHAUSTED
    ev = c.create_event()
    with pytest.raises(AclError) as e:
        c.event_timestamp(ev)                            # never recorded
    assert e.value.code == 107006
    p = c.malloc(64)
    with pytest.raises(AclError) as e:
        c.free(p + 64)                                   # not the start of an allocation
    assert e.value.code == 107000
    c.free(p)
    with pytest.raises(AclError) as e:
        c.free(p)                                        # double free
    assert e.value.code == 207002


# ---------------------------------------------------------------- DMS: faults, health watch, loss
def test_faults_reset_and_kernel_errors(fresh):
    srv = fresh(6)
    c = srv.client()
    s = c.create_stream()
    x = c.malloc(4)
    c.memcpy_h2d(x, np.zeros(1, np.float32))
    c.inject_fault("task-fail", count=1)
    c.submit([Launch(s, "rpc_test_incr_f32", (), (TensorDesc(x, (1,)),))])
    with pytest.raises(KernelError) as e:
        c.synchronize_stream(s)
    assert e.value.code == 507015
    off = c._check_range(x, 4, False)
    c.inject_fault("ecc", offset=off, length=4)
    assert c.health()[0] == "Alarm"
    with pytest.raises(AclError) as e:
        c.memcpy_d2h(x, 4)
    assert e.value.code == 507054
    c.inject_fault("overheat", celsius=80)
    assert c.telemetry()["temperature_c"] >= 105 and c.health()[0] == "Critical"
    c.inject_fault("link-down", peer=2)
    assert any("link to device 2" in r for r in c.health()[1])
    c.inject_fault("clear")
    c.telemetry()
    c.inject_fault("hang")                               # cores stop: queued work waits ...
    c.submit([Launch(s, "rpc_test_incr_f32", (), (TensorDesc(x, (1,)),))])
    assert not c.query_stream(s)
    with pytest.raises(AclError) as e:
        c.synchronize_stream(s, timeout_ms=30)
    assert e.value.code == 507046
    c.inject_fault("clear")                              # ... until the fault is cleared
    c.synchronize_stream(s, timeout_ms=10_000)
    c.inject_fault("hang", duration_ms=30)               # a timed hang undoes itself
    c.submit([Launch(s, "rpc_test_incr_f32", (), (TensorDesc(x, (1,)),))])
    c.synchronize_stream(s, timeout_ms=10_000)
    assert c.memcpy_d2h(x, 4).view(np.float32)[0] == 2.0
    assert c.memcpy_d2h(x, 4).size == 4
    with pytest.raises(InvalidParamError):
        c.inject_fault("meteor")
    with pytest.raises(InvalidParamError):
        c.inject_fault("slow", bogus=1)
    c.reset()
    assert srv.device.arena.stats().allocations == 0
    with pytest.raises(InvalidHandleError):
        c.synchronize_stream(s)                          # reset dropped every stream


def test_kill_fault_calls_the_hook(fresh):
    killed = threading.Event()
    srv = fresh(7, on_kill=killed.set)
    c = srv.client()
    c.inject_fault("kill")
    assert killed.wait(10)
    c.mem_info()                                         # the hook decides; this one left the server up


def test_health_watch_sequence_and_loss_on_server_stop(fresh):
    srv = fresh(8)
    c = srv.client()
    beats: queue.Queue[HealthEvent] = queue.Queue()
    watch = c.watch_health(20, beats.put)
    seqs = [beats.get(timeout=10) for _ in range(5)]
    assert all(not b.lost for b in seqs)
    assert [b.seq for b in seqs] == list(range(seqs[0].seq, seqs[0].seq + 5))
    assert seqs[0].health == "OK" and seqs[-1].telemetry["device_id"] == 8
    assert set(seqs[-1].telemetry) == set(srv.device.telemetry())
    # a host thread blocked in synchronize is woken by the loss, not by a deadline
    s, gate = c.create_stream(), c.create_event()
    c.submit([Wait(s, gate, 1)])
    blocked: queue.Queue = queue.Queue()

    def sync():
        try:
            c.synchronize_stream(s)
            blocked.put(None)
        except AclError as e:
            blocked.put(e)
    t = threading.Thread(target=sync)
    t.start()
    srv.server.stop(grace=None)
    assert watch.wait(10), "the watch did not flag the device lost"
    assert c.lost.is_set() and watch.is_set()
    err = blocked.get(timeout=10)
    assert isinstance(err, DeviceLostError) and err.code in (107022, 207004)
    while True:                                          # drain to the loss notice
        ev = beats.get(timeout=10)
        if ev.lost:
            break
    assert isinstance(ev.error, DeviceLostError) and ev.error.code == 107022
    with pytest.raises(DeviceLostError) as e:
        c.malloc(64)
    assert e.value.code == 107022
    before = c.rpc_count
    with pytest.raises(DeviceLostError):
        c.synchronize_device()
    assert c.rpc_count == before                         # refused locally, no network round trip
    watch.stop()
    t.join(timeout=10)
    srv.device.signal_event(gate, 1)                     # release the server-side waiter


def test_silent_heartbeat_flags_the_device_lost(fresh):
    srv = fresh(10)
    c = srv.client()
    release = threading.Event()
    real = srv.device.telemetry
    calls = []

    def stalling_telemetry(*args, **kw):                 # beats stop, but the stream stays open
        calls.append(1)
        if len(calls) > 3:
            release.wait(30)
        return real(*args, **kw)
    srv.device.telemetry = stalling_telemetry
    try:
        events: queue.Queue[HealthEvent] = queue.Queue()
        c.watch_health(20, events.put, stale_after_s=0.5)
        assert c.lost.wait(10)
        assert "no heartbeat" in c.lost_reason
        while not (ev := events.get(timeout=10)).lost:
            pass
        with pytest.raises(DeviceLostError):
            c.mem_info()
    finally:
        release.set()


def test_default_kill_stops_the_endpoint(fresh):
    srv = fresh(9)
    c = srv.client()
    c.watch_health(20)
    c.inject_fault("kill")
    assert c.lost.wait(10)
    with pytest.raises(DeviceLostError):
        c.mem_info()
    other = srv.client()                                 # a client without a watch: refused connection
    with pytest.raises(DeviceLostError) as e:
        other.mem_info()
    assert e.value.code == 107022


def test_close_is_idempotent_and_final(node):
    c = node.client()
    c.watch_health(50)
    c.mem_info()
    c.close()
    c.close()
    with pytest.raises(AclError) as e:
        c.mem_info()
    assert e.value.code == 207004
    assert not c.lost.is_set()


@pytest.mark.parametrize("drain_s", [10.0, 0.0])
def test_close_drains_the_calls_in_flight(fresh, drain_s):
    """``close(drain_s)`` lets a call already in flight finish (a failover pool replacing the client of a
    device that came back must not fail a caller that took the old client just before); without a drain
    the call is cancelled.  The call: a synchronize held on the device by a hang, released by a second
    client clearing the fault while the close waits."""
    from runtime.cluster.failover import wait_polled
    s = fresh(6)
    c, ctl = s.client(), s.client()
    sid, ptr = c.create_stream(0), c.malloc(64)
    c.inject_fault("hang")
    c.submit((Memset(sid, ptr, 7, 64),))
    n0 = c.rpc_count
    out: dict = {}

    def sync():
        try:
            c.synchronize_stream(sid, 10_000)
            out["sync"] = None
        except AclError as e:
            out["sync"] = e
    t = threading.Thread(target=sync)
    t.start()
    assert wait_polled(threading.Condition(), lambda: c.rpc_count > n0, 5), "the synchronize never started"
    closer = threading.Thread(target=c.close, kwargs={"drain_s": drain_s})
    closer.start()
    if drain_s:
        assert t.is_alive()                           # held by the hang, and the close waits for it
        ctl.inject_fault("clear")
    t.join(15)
    closer.join(15)
    ctl.inject_fault("clear")
    assert not t.is_alive() and not closer.is_alive()
    if drain_s:
        assert out["sync"] is None, out["sync"]       # completed, not cancelled by the close
    else:
        assert isinstance(out["sync"], AclError), out
    with pytest.raises(AclError) as e:
        c.mem_info()
    assert e.value.code == 207004                     # closed for good either way


# ---------------------------------------------------------------- client leases
_DOOMED_CLIENT = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from devices.tasks import Memset
from runtime.api import Runtime
from runtime.cluster.remote import RemoteBackend
rt = Runtime(RemoteBackend([{"device_id": int(sys.argv[4]), "address": sys.argv[2]}], sys.argv[3],
                           client_id="doomed"))
d = rt.device(0)
t = d.empty((1 << 18,))
s = d.stream()
e = d.event()
e.record(s)
s.begin_capture()
s.memset(t.ptr, 1, 64)
g = s.end_capture()
s.synchronize()
print("ready", flush=True)
sys.stdin.read()                  # until killed
"""


DOOMED = Owner("admin", "doomed", limited=False)      # the cluster token authenticates the admin tenant


def test_a_client_that_dies_is_released_after_its_lease(fresh):
    """A runtime client holds a lease on each device; SIGKILLed, it leaves memory, a stream, an event
    and a graph behind, which the device releases once the lease's grace period is over.  Another client
    (its lease alive) keeps its allocation, and the device keeps serving."""
    import os
    import subprocess
    import sys
    srv = fresh(6, lease_grace_s=0.2)
    keeper = srv.client(client_id="keeper")
    kp = keeper.malloc(4096)
    keeper.memcpy_h2d(kp, bytes(range(256)) * 16)
    dev = srv.device
    used0, streams0, events0 = dev.arena.stats().used, len(dev.sched.streams), len(dev.sched.events)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", _DOOMED_CLIENT, repo, srv.server.address, TOKEN, str(dev.id)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert srv.server.leases.holds(DOOMED)
        assert dev.arena.stats().used >= used0 + (1 << 20)
        assert len(dev.sched.streams) > streams0 and len(dev.sched.events) > events0 and len(dev.graphs) == 1
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()
    assert srv.server.leases.wait_released(DOOMED, 30.0)
    assert dev.arena.stats().used == used0
    assert (len(dev.sched.streams), len(dev.sched.events), len(dev.graphs)) == (streams0, events0, 0)
    assert keeper.memcpy_d2h(kp, 8).tolist() == list(range(8))          # another client: untouched
    assert Owner("admin", "keeper", limited=False) not in srv.server.leases.released
    keeper.free(kp)


def test_a_renewed_lease_cancels_the_release(fresh):
    from driver.lease import Leases
    released = []
    leases = Leases(released.append, grace_s=30.0)
    leases.opened("a")
    leases.closed("a")                 # armed ...
    stale = leases._armed["a"]
    leases.opened("a")                 # ... and renewed before the grace period ended
    assert leases.holds("a") and not leases._armed
    leases.closed("a")
    leases._expire("a", stale)                         # a stale timer does nothing
    assert not released
    armed = leases._armed["a"]
    armed.cancel()                                     # (fired by hand below, not by its thread)
    leases._expire("a", armed)                         # the armed one releases
    assert released == ["a"] and leases.released == ["a"]
    leases.close()


def test_two_overlapping_lease_watches_closing_one_releases_nothing(fresh):
    """One client holding two lease watches on a device (a second runtime of the same client, a renewed
    watch that overlaps the old one): the end of one leaves the client leased -- nothing is released,
    however long after the grace period -- and only the end of the last one releases what it holds."""
    srv = fresh(7, lease_grace_s=0.2)
    c = srv.client(client_id="twice", lease=False)
    first, second = c.open_lease(), c.open_lease()
    owner = Owner("admin", "twice", limited=False)
    leases = srv.server.leases
    assert leases.wait_count(owner, 2, 10.0)
    p = c.malloc(4096)
    c.memcpy_h2d(p, bytes(range(256)) * 16)
    used = srv.device.arena.stats().used
    first.stop()
    assert leases.wait_count(owner, 1, 10.0)           # the device saw that watch end
    assert not leases.wait_released(owner, 5 * 0.2)    # 5 grace periods later: still nothing released
    assert leases.holds(owner) and owner not in leases.released
    assert srv.device.arena.stats().used == used
    assert c.memcpy_d2h(p, 8).tolist() == list(range(8))
    c.free(c.malloc(64))                               # creating still works: the client is leased
    second.stop()
    assert leases.wait_released(owner, 10.0)           # the last one ended: released after the grace
    assert srv.device.arena.stats().allocations == 0
