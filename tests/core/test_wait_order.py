"""Ops that ride on a wait are not overtaken (devices.submit_order, runtime.api.LaunchQueue).

A stream or event wait takes the ops queued so far and sends them with the wait (one round trip).  While
that message is on its way, another thread's submission or wait must not overtake it: the runtime sends the
riding ops again in front (numbered), and the device queues each number once.  The race is made certain
here by holding the wait's message before it reaches the device (a handle that delays one wait, as a slow
network would) -- over the in-process device and over a real gRPC server and client -- and what is
checked is device memory: the order the ops ran in, and that none ran twice.
"""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest

from devices.device import Device, DeviceConfig
from devices.errors import ACL_ERROR_RT_PARAM_INVALID, AclError, InvalidParamError
from devices.submit_order import OpOrder, OrderFilter
from devices.kernel import TensorDesc
from devices.tasks import Launch, Memset, WriteH2D
from driver.client import RemoteDevice
from driver.service import serve
from driver import wire
from driver.wire import LaunchTemplates, submit_request
from runtime.cluster.failover import wrap_handle

TOKEN = "wait-order-token"
WAIT_S = 30.0


# ------------------------------------------------------------------------------------------ the filter
def test_order_parts_cut_runs_at_message_bounds():
    o = OpOrder(7, ((1, 3), (10, 2)))
    assert o.count == 5
    assert [p.runs for p in o.parts([2, 2, 1])] == [((1, 2),), ((3, 1), (10, 1)), ((11, 1),)]
    assert all(p.session == 7 for p in o.parts([5]))


@pytest.mark.parametrize("runs, ends", [((), ()), (((0, 1),), ()), (((3, 0),), ()), (((5, 2), (6, 1)), ()),
                                        (((5, 2), (2, 1)), ()), (((5, 2),), (5,)), (((1, 2), (4, 1)), (4, 4)),
                                        (((1, 2),), (2, 3))])
def test_order_runs_must_ascend_and_hold_ops(runs, ends):
    with pytest.raises(InvalidParamError):
        OpOrder(1, runs, 0, ends)


def test_carried_ops_are_the_ones_numbered_below_own_from():
    assert OpOrder(1, ((1, 2), (5, 3)), own_from=5).carried == 2
    assert OpOrder(1, ((1, 2), (5, 3))).carried == 5                      # own_from 0: all carried
    assert [p.carried for p in OpOrder(1, ((1, 2), (5, 3)), 5).parts([3, 2])] == [2, 0]


def test_filter_queues_each_number_once_per_caller_and_session():
    f = OrderFilter(sessions=2)
    got: list = []
    assert f.queue("a", ["x1", "x2"], OpOrder(1, ((1, 2),), 1), got.extend) == 2
    assert f.queue("a", ["x1", "x2", "y3"], OpOrder(1, ((1, 2), (3, 1)), 3), got.extend) == 1   # a resend + one new
    assert f.queue("a", ["x1", "x2"], OpOrder(1, ((1, 2),), 1), got.extend) == 0              # late copy
    assert f.queue("a", ["z2", "z3", "z4"], OpOrder(1, ((2, 3),)), got.extend) == 1           # overlaps: the tail
    assert got == ["x1", "x2", "y3", "z4"]
    assert f.queue("b", ["b1"], OpOrder(1, ((1, 1),), 1), got.extend) == 1    # another caller: its own numbers
    assert f.queue("a", ["s1"], OpOrder(2, ((1, 1),), 1), got.extend) == 1    # another session too
    with pytest.raises(InvalidParamError):
        f.queue("a", ["x"], OpOrder(1, ((9, 2),)), got.extend)                  # numbers 2 ops, holds 1


def test_a_message_overtaken_by_a_later_one_is_still_queued_once():
    f = OrderFilter()
    got: list = []
    assert f.queue("a", ["w5", "w6"], OpOrder(1, ((5, 2),), 5), got.extend) == 2    # a later wait arrives first
    assert f.queue("a", ["w2", "w3"], OpOrder(1, ((2, 2),), 2), got.extend) == 2    # the overtaken one: queued
    assert f.queue("a", ["w1", "w2", "w3", "w4"], OpOrder(1, ((1, 4),)), got.extend) == 2   # only 1 and 4 were missing
    assert f.queue("a", ["w1", "w2", "w3", "w4", "w5"], OpOrder(1, ((1, 5),)), got.extend) == 0
    assert got == ["w5", "w6", "w2", "w3", "w1", "w4"]


def test_a_callers_sessions_never_push_out_another_callers():
    f = OrderFilter(sessions=2)
    got: list = []
    f.queue("victim", ["v1"], OpOrder(1, ((1, 1),), 1), got.extend)
    for session in range(2, 50):                                               # a tenant's many sessions
        f.queue("other", ["o"], OpOrder(session, ((1, 1),), 1), got.extend)
    assert f.queue("victim", ["v1"], OpOrder(1, ((1, 1),), 1), got.extend) == 0   # still remembered: once
    f.drop("victim")                                                           # the client departed
    assert f.queue("victim", ["v1"], OpOrder(1, ((1, 1),), 1), got.extend) == 1


def _device_like(queued: list):
    """An enqueue that queues ops in order and refuses the op "bad" (the ops before it stay queued)."""
    def enqueue(ops):
        if "bad" in ops:
            queued.extend(ops[:ops.index("bad")])
            raise InvalidParamError("bad op")
        queued.extend(ops)
    return enqueue


def test_a_carried_runs_error_goes_to_its_sender_and_the_carriers_ops_still_queue():
    f = OrderFilter()
    queued: list = []
    enqueue = _device_like(queued)
    # B's flush carries A's run (1-2, failing at its second op) in front of B's own op 3
    assert f.queue(None, ["a1", "bad", "b3"], OpOrder(1, ((1, 2), (3, 1)), 3), enqueue) == 1
    assert queued == ["a1", "b3"]                              # A's op before the failure, and B's own
    with pytest.raises(InvalidParamError):                      # A's own copy arrives: A gets its error
        f.queue(None, ["a1", "bad"], OpOrder(1, ((1, 2),), 1), enqueue)
    assert f.queue(None, ["a1", "bad"], OpOrder(1, ((1, 2),), 1), enqueue) == 0   # once
    with pytest.raises(InvalidParamError):                      # a sender's own failing run: raised at once
        f.queue(None, ["c4", "bad"], OpOrder(1, ((4, 2),), 4), enqueue)
    assert queued == ["a1", "b3", "c4"]
    assert f.queue(None, ["c4", "bad"], OpOrder(1, ((4, 2),), 4), enqueue) == 0   # its late copy: not again


def test_a_batch_cut_by_a_split_message_is_one_batch():
    o = OpOrder(1, ((1, 4), (5, 1)), own_from=5)
    assert [(p.runs, p.ends) for p in o.parts([2, 3])] == [(((1, 2),), (4,)), (((3, 2), (5, 1)), (4, 5))]
    queued: list = []
    enqueue = _device_like(queued)
    f = OrderFilter()

    def f_queue(enqueue, ops, order):
        return f.queue("split", ops, order, enqueue)
    # B's flush, split: its first part carries A's batch 1-4 up to A's failing op 2
    first, rest = OpOrder(1, ((1, 4), (5, 1)), 5).parts([2, 3])
    f_queue(enqueue, ["a1", "bad"], first)                                # a carried failure: no error here
    assert f_queue(enqueue, ["a3", "a4", "b5"], rest) == 1               # A's batch stops at its failure
    assert queued == ["a1", "b5"]
    with pytest.raises(InvalidParamError):                                # A's own message: A gets the error
        f_queue(enqueue, ["a1", "bad", "a3", "a4"], OpOrder(1, ((1, 4),), 1))
    # the other way round: A's own message, split, fails in its first part (it never sends the second);
    # B's copy of the whole batch does not run what followed the failure
    with pytest.raises(InvalidParamError):
        f_queue(enqueue, ["a6", "bad"], OpOrder(1, ((6, 4),), 6).parts([2, 2])[0])
    assert f_queue(enqueue, ["a6", "bad", "a8", "a9", "b10"], OpOrder(1, ((6, 4), (10, 1)), 10)) == 1
    assert queued == ["a1", "b5", "a6", "b10"]


def test_template_ids_are_never_reused_and_carried_ops_travel_in_full():
    t = LaunchTemplates()
    op = Launch(0, "add", (TensorDesc(1 << 40, (4,)),), (TensorDesc(1 << 40, (4,)),))
    first = t.encode(op)["launch"]["tid"]
    assert t.encode(op) == {"stream": 0, "launch_ref": {"tid": first}}
    t.reset()
    assert t.encode(op)["launch"]["tid"] > first                # after a reset: a new id, never an old one
    req = submit_request([op, op], t, plain=1)
    assert [m.WhichOneof("op") for m in req.ops] == ["launch", "launch_ref"]
    assert not req.ops[0].launch.tid                            # in full, defining nothing


# ------------------------------------------------------------------------------------------ the race
class _HeldWait:
    """A device handle whose next wait carrying ops is held before it reaches the device, until released."""

    def __init__(self, inner):
        self.inner = inner
        self.armed = False
        self.taken = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _hold(self, ops) -> None:
        if self.armed and ops:
            self.armed = False
            self.taken.set()
            if not self.release.wait(WAIT_S):
                raise TimeoutError("the held wait was never released")

    def synchronize_stream(self, sid, timeout_ms=-1, *, ops=(), order=None):
        self._hold(ops)
        self.inner.synchronize_stream(sid, timeout_ms, ops=ops, order=order)

    def synchronize_event(self, eid, timeout_ms=-1, *, ops=(), order=None):
        self._hold(ops)
        self.inner.synchronize_event(eid, timeout_ms, ops=ops, order=order)


@pytest.fixture(params=["in-process", "grpc"])
def held(request):
    """(runtime device with launches batched, the held handle) over an in-process device or a served one."""
    dev = Device(DeviceConfig(device_id=0, arena_bytes=64 << 20, shm=False))
    server = client = None
    try:
        inner = dev
        if request.param == "grpc":
            server = serve(dev, host="127.0.0.1", token=TOKEN, port=0)
            client = inner = RemoteDevice(server.address, TOKEN, 0, timeout_s=10.0)
            client.open_lease()
        h = _HeldWait(inner)
        d = wrap_handle(h)                           # a runtime over this one handle, launches batched
        assert d.rt.batch_size > 1
        try:
            yield d, h
        finally:
            h.release.set()
            d.rt.close()
    finally:
        if client is not None:
            client.close()
        if server is not None:
            server.stop(grace=None)
        dev.close()


def _tensors(dev):
    return dev.from_numpy(np.zeros(4, np.float32)), dev.from_numpy(np.ones(4, np.float32))


class _Waiter:
    """``target`` (a wait) on a thread, started and held once it has taken the queued ops (not yet delivered)."""

    def __init__(self, h, target):
        self.h, self.errors = h, []
        self.thread = threading.Thread(target=self._run, args=(target,))
        h.armed = True
        self.thread.start()
        assert h.taken.wait(WAIT_S), "the wait did not take the queued ops"

    def _run(self, target) -> None:
        try:
            target()
        except Exception as e:       # noqa: BLE001 - reported by finish()
            self.errors.append(e)

    def finish(self) -> list:
        """Release the held wait, wait for the thread, and return what it raised."""
        self.h.release.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the released wait did not return"
        return self.errors


def test_a_launch_queued_after_a_waits_ops_runs_after_them(held):
    dev, h = held
    x, one = _tensors(dev)
    s = dev.stream()
    s.launch("add", [x, one], [x])                 # queued: rides on the wait below
    w = _Waiter(h, s.synchronize)
    s.memset(x.ptr, 0, 16)                         # after the add in program order (this thread saw it queued)
    dev.flush()                                    # delivered now, with the riding add in front
    assert w.finish() == []
    s.synchronize()
    # add, then memset: 0; the memset overtaking the add, or the add's late copy run again: 1
    np.testing.assert_array_equal(x.numpy(), np.zeros(4, np.float32))


def test_an_event_wait_sees_a_record_riding_on_another_threads_wait(held):
    dev, h = held
    x, one = _tensors(dev)
    s, e = dev.stream(), dev.event()
    for _ in range(3):
        s.launch("add", [x, one], [x])
    e.record(s)
    w = _Waiter(h, s.synchronize)
    e.synchronize()                                # sends the riding ops first: the record is there to wait for
    seen = dev.handle.memcpy_d2h(x.ptr, 16)        # straight from the device: nothing else sent before
    np.testing.assert_array_equal(np.frombuffer(bytes(seen), np.float32), np.full(4, 3, np.float32))
    assert w.finish() == []
    s.synchronize()
    np.testing.assert_array_equal(x.numpy(), np.full(4, 3, np.float32))   # three adds, each once


def test_a_riding_ops_error_goes_to_its_wait_not_to_the_thread_that_carried_it(held):
    dev, h = held
    x, _ = _tensors(dev)
    s = dev.stream()
    s.enqueue(Memset(s.sid, x.ptr + (32 << 20), 0, 16))     # past every allocation: the device refuses it
    w = _Waiter(h, s.synchronize)
    s.memset(x.ptr, 7, 16)                         # this thread's own, valid op
    dev.flush()                                    # carries the bad memset in front: no error of its own
    errors = w.finish()
    assert len(errors) == 1 and getattr(errors[0], "code", None) == ACL_ERROR_RT_PARAM_INVALID, errors
    s.synchronize()
    assert (x.numpy().view(np.uint8) == 7).all()   # the carrier's own op ran


@pytest.fixture
def served():
    """A device served over gRPC and a leased client of it."""
    dev = Device(DeviceConfig(device_id=1, arena_bytes=96 << 20, shm=False))
    server = serve(dev, host="127.0.0.1", token=TOKEN, port=0)
    c = RemoteDevice(server.address, TOKEN, 1, timeout_s=30.0)
    try:
        c.open_lease()
        yield c, server
    finally:
        c.close()
        server.stop(grace=None)
        dev.close()


def test_numbered_ops_sent_twice_over_grpc_run_once(served):
    c, _ = served
    p = c.malloc(64)
    s = c.create_stream()
    c.memset(p, 0, 64)
    c.submit([Memset(s, p, 1, 8), Memset(s, p + 8, 2, 8)], order=OpOrder(99, ((1, 1), (2, 1)), 1))
    c.synchronize_stream(s, ops=[Memset(s, p, 7, 8)], order=OpOrder(99, ((1, 1),)))       # a late copy of #1
    c.submit([Memset(s, p + 8, 5, 8), Memset(s, p + 16, 3, 8)], order=OpOrder(99, ((2, 2),)))   # #2 again, #3
    c.synchronize_stream(s)
    got = np.frombuffer(bytes(c.memcpy_d2h(p, 24)), np.uint8)
    np.testing.assert_array_equal(got, np.repeat([1, 2, 3], 8).astype(np.uint8))


def test_a_numbered_batch_split_over_messages_runs_once(served):
    c, _ = served
    n = (wire.SUBMIT_SPLIT_BYTES // 2) + 1024      # two writes: more than one message holds
    a, b = c.malloc(n), c.malloc(n)
    s = c.create_stream()
    ops = [WriteH2D(s, a, bytes([1]) * n), WriteH2D(s, b, bytes([2]) * n), Memset(s, a, 9, 4)]
    before = c.rpc_count
    c.submit(ops, order=OpOrder(5, ((1, 3),), 1))
    assert c.rpc_count - before >= 2                # it was split
    c.submit(ops[:2] + [Memset(s, a + 4, 8, 4)], order=OpOrder(5, ((1, 3),)))   # its copy, split the same way
    c.synchronize_stream(s)
    assert bytes(c.memcpy_d2h(a, 8)) == bytes([9] * 4 + [1] * 4)   # the memset ran once, after its write
    assert bytes(c.memcpy_d2h(b, 4)) == bytes([2] * 4)


def test_a_malformed_order_is_refused_by_the_device_which_keeps_working(served):
    c, server = served
    s = c.create_stream()
    p = c.malloc(16)
    ch = grpc.insecure_channel(server.address)
    try:
        stub = wire.ResourceManagementStub(ch)
        meta = (("authorization", f"Bearer {TOKEN}"), ("vnpu-client", c.client_id))
        op = wire.op_to_pb(Memset(s, p, 1, 4))
        bad = [wire.rms.OpOrder(session=1, run_first=[1], run_count=[2]),      # numbers 2 ops, holds 1
               wire.rms.OpOrder(session=1, run_first=[1, 2], run_count=[1]),   # a count missing
               wire.rms.OpOrder(session=1),                                    # no runs
               wire.rms.OpOrder(session=1, run_first=[3], run_count=[1], run_end=[2])]   # ends before it does
        for order in bad:
            with pytest.raises(grpc.RpcError) as e:
                stub.Submit(wire.rms.SubmitRequest(ops=[op], order=order), metadata=meta, timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, order
            assert dict(e.value.trailing_metadata())["vnpu-acl-code"] == str(ACL_ERROR_RT_PARAM_INVALID)
    finally:
        ch.close()
    c.memset(p, 3, 16)                               # still serving
    assert bytes(c.memcpy_d2h(p, 4)) == bytes([3] * 4)


@pytest.mark.parametrize("held", ["grpc"], indirect=True)     # only a wire has ops it cannot carry
def test_a_wait_whose_ops_cannot_be_sent_fails_alone_and_the_queue_keeps_working(held):
    dev, h = held
    x, one = _tensors(dev)
    s = dev.stream()
    s.launch("add", [x, one], [x], attrs={"alpha": 1 << 70})    # no message can hold this attribute
    w = _Waiter(h, s.synchronize)
    s.memset(x.ptr, 0, 16)
    dev.flush()                                    # carries the unsendable launch: its error is not this thread's
    errors = w.finish()
    assert len(errors) == 1 and isinstance(errors[0], AclError), errors    # the wait that queued it fails
    s.launch("add", [x, one], [x])                 # and the device and the queue keep working
    s.synchronize()
    np.testing.assert_array_equal(x.numpy(), np.ones(4, np.float32))


class _CarryFailsOnce:
    """A device handle whose first numbered Submit (ops carried for a wait) fails as a broken link would."""

    def __init__(self, inner):
        self.inner, self.failed = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, ops, *, order=None):
        if order is not None and not self.failed:
            self.failed += 1
            raise AclError("link down (injected)", code=ACL_ERROR_RT_PARAM_INVALID)
        self.inner.submit(ops, order=order)


def test_ops_whose_carried_copy_was_lost_still_run_once(held):
    dev, h = held
    h.inner = flaky = _CarryFailsOnce(h.inner)
    x, one = _tensors(dev)
    s = dev.stream()
    s.launch("add", [x, one], [x])
    w = _Waiter(h, s.synchronize)
    dev.flush()                                    # the carried copy is lost: no error here, the add rides on
    s2 = dev.stream()
    s2.launch("add", [x, one], [x])
    s2.synchronize()                               # carries the add again (delivered now), then its own wait
    assert flaky.failed == 1
    assert w.finish() == []                        # the held copy arrives late: not run again
    s.synchronize()
    np.testing.assert_array_equal(x.numpy(), np.full(4, 2, np.float32))


@pytest.mark.parametrize("held", ["grpc"], indirect=True)
def test_one_thread_pays_one_round_trip_a_wait_and_a_flush(held):
    dev, h = held
    rpc = h.inner
    x, one = _tensors(dev)
    s = dev.stream()
    s.synchronize()

    def round_trips(fn) -> int:
        before = (rpc.rpc_count, rpc.wait_continuations)
        fn()
        return (rpc.rpc_count - before[0]) - (rpc.wait_continuations - before[1])
    for _ in range(3):
        s.launch("add", [x, one], [x])
        assert round_trips(s.synchronize) == 1     # the add rides on the wait, nothing else is sent
        s.launch("add", [x, one], [x])
        assert round_trips(dev.flush) == 1         # no ride of the wait before is left to send again
    s.launch("add", [x, one], [x], attrs={"alpha": 1 << 70})   # a wait that fails before sending
    with pytest.raises(AclError):
        s.synchronize()
    s.launch("add", [x, one], [x])
    assert round_trips(dev.flush) == 1             # its ops ride no longer either
    s.synchronize()
    np.testing.assert_array_equal(x.numpy(), np.full(4, 7, np.float32))
