"""Item 7: no input crashes or hangs a process.  Malformed protobuf, an H2D stream that sends more than it
announced, an absurd D2H size, launches with absurd argument or attribute counts, and a device whose
cores are stuck: each gets a clear answer and the device keeps serving."""
from __future__ import annotations

import queue
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from devices.errors import AclError
from devices.health import Condition
from devices.kernel import MAX_LAUNCH_ATTRS, MAX_LAUNCH_TENSORS, MAX_TENSOR_DIMS, TensorDesc, register_user_kernel
from devices.tasks import Launch
from driver import wire

from .conftest import ARENA, SECRET

pytestmark = pytest.mark.security


def _raw(srv):
    return grpc.insecure_channel(srv.address, options=[("grpc.max_send_message_length", 128 << 20),
                                                      ("grpc.max_receive_message_length", 128 << 20)])


def _md(client_id="raw"):
    return (("authorization", f"Bearer {SECRET}"), ("vnpu-client", client_id))


@pytest.mark.parametrize("method,kind", [("/vnpu.v1.ResourceManagement/Malloc", "unary"),
                                         ("/vnpu.v1.ResourceManagement/MemcpyH2D", "client-stream"),
                                         ("/vnpu.v1.ResourceManagement/MemcpyD2H", "server-stream"),
                                         ("/vnpu.v1.DeviceManagement/InjectFault", "unary")])
def test_malformed_protobuf_is_invalid_argument(site, method, kind):
    srv = site.device()
    ch = _raw(srv)
    garbage = b"\xff\xff\xff\xff\x0f"                    # a varint that never ends
    try:
        with pytest.raises(grpc.RpcError) as e:
            if kind == "unary":
                ch.unary_unary(method)(garbage, metadata=_md(), timeout=10)
            elif kind == "client-stream":
                ch.stream_unary(method)(iter([garbage]), metadata=_md(), timeout=10)
            else:
                list(ch.unary_stream(method)(garbage, metadata=_md(), timeout=10))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(e.value.trailing_metadata())["vnpu-acl-code"] == "107000"
    finally:
        ch.close()
    c = site.client(srv, SECRET)
    assert c.mem_info() == (ARENA, ARENA)                           # the device serves, and nothing was allocated


def test_h2d_stream_longer_than_announced_writes_nothing_past_it(site):
    srv = site.device()
    c = site.client(srv, SECRET, client_id="raw")
    p, guard = c.malloc(64), c.malloc(4096)             # guard sits right after p in the arena
    c.memcpy_h2d(guard, np.full(4096, 0xEE, np.uint8))
    ch = _raw(srv)
    stub = wire.ResourceManagementStub(ch)
    sent = []

    def chunks(first: bytes, rest: list[bytes]):
        yield wire.rms.H2DChunk(dst=p, total=64, data=first)
        for r in rest:
            sent.append(len(r))
            yield wire.rms.H2DChunk(data=r)
    try:
        for first, rest in ((b"\x01" * 64 + b"\x02" * 4096, []), (b"\x01" * 32, [b"\x02" * 32 + b"\x03" * 4096]),
                            (b"\x01" * 64, [b"\x03"] * 1000)):
            with pytest.raises(grpc.RpcError) as e:
                stub.MemcpyH2D(chunks(first, rest), metadata=_md(), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert dict(e.value.trailing_metadata())["vnpu-acl-code"] == "107000"
            assert c.memcpy_d2h(guard, 4096).tolist() == [0xEE] * 4096
    finally:
        ch.close()
    assert sum(sent) < 1000 + 4096 + 64                   # the server stopped reading the stream


@pytest.mark.parametrize("nbytes", [1 << 60, (1 << 63) - 1, 1 << 40])
def test_an_absurd_d2h_size_is_a_code_not_a_memory_error(site, nbytes):
    srv = site.device()
    c = site.client(srv, SECRET)
    p = c.malloc(64)
    with pytest.raises(AclError) as e:
        c.memcpy_d2h(p, nbytes)
    assert e.value.code == 107000
    with pytest.raises(AclError) as e:                   # the device-to-device read allocates late as well
        c.hccl_read("c" * 32, p, nbytes)
    assert e.value.code == 107000
    assert c.memcpy_d2h(p, 8).size == 8


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _absurd_launch(what: str, stream: int, ptr: int) -> Launch:
    d = TensorDesc(ptr, (4,), "float32")
    return {"tensors": Launch(stream, "add", (d,) * (10 ** 6), (d,)),
            "attrs": Launch(stream, "relu", (d,), (d,), {f"a{i}": i for i in range(10 ** 5)}),
            "dims": Launch(stream, "relu", (TensorDesc(ptr, (1,) * 100_000, "float32"),), (d,))}[what]


def _absurd_wire(what: str, stream: int, ptr: int) -> bytes:
    """The same launches as a raw SubmitRequest (built as bytes: no client-side check can stop them)."""
    desc = wire.rms.TensorDesc(ptr=ptr, shape=[4], dtype="float32").SerializeToString()
    head = wire.rms.LaunchOp(kernel="add" if what == "tensors" else "relu").SerializeToString() + _field(3, desc)
    if what == "tensors":
        body = _field(2, desc) * (10 ** 6)
    elif what == "attrs":
        body = _field(2, desc) + b"".join(_field(4, _field(1, f"a{i}".encode()) + _field(2, b"\x08\x02"))
                                          for i in range(10 ** 5))
    else:
        big = wire.rms.TensorDesc(ptr=ptr, shape=[1] * 100_000, dtype="float32").SerializeToString()
        body = _field(2, big)
    op = _varint(1 << 3) + _varint(stream) + _field(2, head + body)
    return _field(1, op)


@pytest.mark.parametrize("path", ["client", "wire"])
@pytest.mark.parametrize("what", ["tensors", "attrs", "dims"])
def test_absurd_launches_are_refused(site, what, path):
    srv = site.device()
    c = site.client(srv, SECRET, client_id="raw")
    s, p = c.create_stream(), c.malloc(64)
    limit = str({"tensors": MAX_LAUNCH_TENSORS, "attrs": MAX_LAUNCH_ATTRS, "dims": MAX_TENSOR_DIMS}[what])
    if path == "client":
        with pytest.raises(AclError) as e:
            c.submit([_absurd_launch(what, s, p)])
        assert e.value.code == 107000 and limit in e.value.detail
    else:
        ch = _raw(srv)
        try:
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary("/vnpu.v1.ResourceManagement/Submit")(_absurd_wire(what, s, p), metadata=_md(),
                                                                       timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and limit in e.value.details()
            assert dict(e.value.trailing_metadata())["vnpu-acl-code"] == "107000"
        finally:
            ch.close()
    d = TensorDesc(p, (4,), "float32")
    c.submit([Launch(s, "relu", (d,), (d,))])               # the device still serves
    c.synchronize_stream(s, 10_000)
    assert srv.device.sched.stats()["tasks_run"] == 1


_release = threading.Event()


def _stuck(ctx, x):
    sys.modules[__name__]._release.wait(30)          # (the client ships kernels by value: no lock in them)


register_user_kernel("security_stuck_kernel", _stuck, replace=True)


def test_get_health_of_a_hung_device_says_it_is_hung(site):
    """Cores stuck in a task (a kernel that never returns, a collective whose peer never comes) are a hung
    device: GetHealth says so (HANG, Critical) while it lasts, and stops saying so when the task ends."""
    _release.clear()
    srv = site.device(hang_after_s=0.05)
    c = site.client(srv, SECRET)
    s, p = c.create_stream(), c.malloc(64)
    assert c.health()[0] == "OK"
    beats: queue.Queue = queue.Queue()
    watch = c.watch_health(20, beats.put)                # the device's heartbeats: waited on, never polled
    c.submit([Launch(s, "security_stuck_kernel", (TensorDesc(p, (4,), "float32"),), ())])
    try:
        deadline = time.monotonic() + 10.0               # a beat once the task has run past hang_after_s
        while not any(x.kind == Condition.HANG for x in beats.get(timeout=10.0).conditions):
            assert time.monotonic() < deadline, "no heartbeat reported the hang"
        report = c.health_report()
        assert report.has(Condition.HANG)
        assert report.level == "Critical" and "security_stuck_kernel" in " ".join(report.reasons)
    finally:
        _release.set()
        watch.stop()
    c.synchronize_stream(s, 10_000)
    assert not c.health_report().has(Condition.HANG)
