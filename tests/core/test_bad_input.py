"""Every bad input gets its CANN error code and leaves the device (and other allocations) intact.

Each test fills a canary tensor with known data first and checks it after every bad call.
"""
from __future__ import annotations

import numpy as np
import pytest

from devices.arena import ACL_MEM_MALLOC_NORMAL_ONLY, make_ptr
from devices.errors import AclError, MemoryAccessError, error_for_code
from devices.kernel import TensorDesc, register_user_kernel
from runtime.api import Event, Stream

SYNC_MS = 20_000


def tb_set(ctx, *outs, value=0):
    for o in outs:
        o[0:o.size] = value


def tb_copy(ctx, src, dst):
    dst[0:dst.size] = src[0:src.size]


register_user_kernel("tb_set", tb_set, replace=True)
register_user_kernel("tb_copy", tb_copy, replace=True)


class Canary:
    """A tensor of known data plus a live stream; :meth:`check` verifies both still work."""

    def __init__(self, dev, n=1000, seed=0):
        self.dev = dev
        self.data = np.random.default_rng(seed).integers(-2**31, 2**31 - 1, n, dtype=np.int64).astype(np.int32)
        self.t = dev.from_numpy(self.data)
        self.free0 = dev.mem_info()[0]

    def check(self, *, mem_unchanged=True):
        assert np.array_equal(self.t.numpy(), self.data), "a bad call changed another allocation"
        if mem_unchanged:
            assert self.dev.mem_info()[0] == self.free0, "a bad call changed the free HBM"

    def release(self):
        self.t.free()


@pytest.fixture
def dev(rt):
    return rt.device(0)


@pytest.fixture
def canary(dev):
    c = Canary(dev)
    yield c
    c.check(mem_unchanged=False)
    c.release()


def check_error(e: AclError, code: int) -> None:
    """``e`` carries ``code`` and is of the class every backend raises for it (``error_for_code``: what the
    cluster backend rebuilds from the code on the wire), so one ``except`` works on every backend."""
    assert e.code == code, f"expected {code}, got {e.code}: {e}"
    assert str(code) in str(e)
    if not isinstance(e, MemoryAccessError):     # shares 107000 with InvalidParamError (see the report)
        assert type(e) is type(error_for_code(code)), \
            f"{type(e).__name__} for code {code}, but error_for_code gives {type(error_for_code(code)).__name__}"


def expect(code, fn, *args, exc=AclError, **kw):
    with pytest.raises(exc) as ei:
        fn(*args, **kw)
    check_error(ei.value, code)
    return ei.value


# ------------------------------------------------------------------------------------------ free
def test_double_free(dev, canary):
    p = dev.malloc(256)
    dev.free(p)
    canary.check()
    expect(207002, dev.free, p)
    canary.check()


def test_free_never_allocated(dev, canary):
    total = dev.mem_info()[1]
    p = make_ptr(dev.physical_id, total - 64)          # the last block of the arena, never handed out
    expect(107000, dev.free, p)
    canary.check()


def test_free_interior_pointer(dev, canary):
    p = dev.malloc(1024)
    expect(107000, dev.free, p + 64)
    expect(107000, dev.free, canary.t.ptr + 4)
    canary.check(mem_unchanged=False)
    dev.free(p)                                       # the allocation itself is still live
    canary.check()


def test_free_pointer_of_another_device(rt, dev, canary):
    other = rt.device(1)
    q = other.from_numpy(np.arange(64, dtype=np.int32))
    expect(107000, dev.free, q.ptr, exc=MemoryAccessError)
    expect(107000, other.free, canary.t.ptr, exc=MemoryAccessError)
    assert np.array_equal(q.numpy(), np.arange(64, dtype=np.int32))
    canary.check()
    q.free()


def test_free_non_pointer(dev, canary):
    expect(107000, dev.free, 12345)
    canary.check()


# ------------------------------------------------------------------------------------------ copies
def test_out_of_bounds_h2d(dev, canary):
    t = dev.from_numpy(np.zeros(16, np.int32))
    free0 = dev.mem_info()[0]
    over = t.view((17,))
    expect(107000, over.copy_from, np.ones(17, np.int32), exc=MemoryAccessError)
    s = dev.stream()
    with pytest.raises(MemoryAccessError) as ei:
        s.write(t.ptr + 8, np.ones(15, np.int32).tobytes())
        s.synchronize(SYNC_MS)
    assert ei.value.code == 107000
    s.synchronize(SYNC_MS)
    assert np.all(t.numpy() == 0), "a rejected copy wrote part of its data"
    assert dev.mem_info()[0] == free0
    canary.check(mem_unchanged=False)
    t.free()


def test_out_of_bounds_d2h(dev, canary):
    t = dev.from_numpy(np.arange(16, dtype=np.int32))
    expect(107000, t.view((17,)).numpy, exc=MemoryAccessError)
    expect(107000, t.view((1,), offset_bytes=64).numpy, exc=MemoryAccessError)
    assert np.array_equal(t.numpy(), np.arange(16, dtype=np.int32))
    canary.check(mem_unchanged=False)
    t.free()


def test_out_of_bounds_d2d_and_memset(dev, canary):
    a = dev.from_numpy(np.arange(16, dtype=np.int32))
    b = dev.from_numpy(np.zeros(16, np.int32))
    s = dev.stream()
    for bad in (lambda: s.copy(b.ptr, a.ptr, 65),
                lambda: s.copy(b.ptr + 4, a.ptr, 64),
                lambda: s.copy(b.ptr, a.ptr + 4, 64),
                lambda: s.copy(b.ptr, canary.t.ptr, canary.t.nbytes + 1),
                lambda: s.memset(b.ptr, 0x7F, 65),
                lambda: s.memset(b.ptr + 64, 0, 1),
                lambda: s.memset(canary.t.ptr, 0, canary.t.nbytes + 4)):
        with pytest.raises(MemoryAccessError) as ei:
            bad()
            s.synchronize(SYNC_MS)
        assert ei.value.code == 107000
        s.synchronize(SYNC_MS)
    assert np.array_equal(a.numpy(), np.arange(16, dtype=np.int32))
    assert np.all(b.numpy() == 0)
    canary.check(mem_unchanged=False)
    # in-bounds versions still work on the same stream
    s.copy(b.ptr, a.ptr, 64)
    s.memset(a.ptr, 0, 64)
    assert np.array_equal(b.numpy(stream=s), np.arange(16, dtype=np.int32))
    assert np.all(a.numpy(stream=s) == 0)
    a.free()
    b.free()


def test_use_after_free(dev, canary):
    t = dev.from_numpy(np.arange(16, dtype=np.int32))
    view = t.view((16,))
    t.free()
    expect(107000, view.numpy, exc=MemoryAccessError)
    expect(107000, view.copy_from, np.ones(16, np.int32), exc=MemoryAccessError)
    canary.check()


# ------------------------------------------------------------------------------------------ launches
def test_launch_overrunning_its_allocation_is_rejected(dev, canary):
    witness = dev.from_numpy(np.zeros(8, np.int32))
    t = dev.from_numpy(np.zeros(16, np.int32))
    free0 = dev.mem_info()[0]
    bad = TensorDesc(t.ptr, (17,), "int32")
    with pytest.raises(MemoryAccessError) as ei:
        dev.launch("tb_set", outputs=[witness, bad], attrs={"value": 5})
    assert ei.value.code == 107000
    with pytest.raises(MemoryAccessError):
        dev.launch("tb_set", outputs=[witness, TensorDesc(t.ptr + 4, (16,), "int32")], attrs={"value": 5})
    with pytest.raises(MemoryAccessError):
        dev.launch("tb_copy", inputs=[TensorDesc(canary.t.ptr, (1001,), "int32")], outputs=[witness])
    dev.synchronize(SYNC_MS)
    assert np.all(witness.numpy() == 0), "a rejected launch ran"
    assert np.all(t.numpy() == 0)
    assert dev.mem_info()[0] == free0
    canary.check(mem_unchanged=False)
    dev.launch("tb_set", outputs=[witness, t], attrs={"value": 5})       # the good launch still works
    assert np.all(witness.numpy() == 5) and np.all(t.numpy() == 5)
    witness.free()
    t.free()


def test_unknown_kernel(dev, canary):
    t = dev.from_numpy(np.zeros(4, np.int32))
    expect(507027, dev.launch, "no_such_kernel_xyz", outputs=[t])
    expect(507027, dev.stream().launch, "", outputs=[t])
    assert np.all(t.numpy() == 0)
    canary.check(mem_unchanged=False)
    t.free()


def test_unknown_stream_handle(dev, canary):
    t = dev.from_numpy(np.zeros(4, np.int32))
    ghost = Stream(dev, 999999, 0)
    expect(107017, ghost.launch, "tb_set", outputs=[t], attrs={"value": 1})
    expect(107017, ghost.synchronize, 1000)
    expect(107017, ghost.query)
    expect(107017, ghost.memset, t.ptr, 1, 16)
    expect(107017, ghost.record, dev.event())
    expect(107017, ghost.wait, dev.event())
    dev.synchronize(SYNC_MS)
    assert np.all(t.numpy() == 0)
    canary.check(mem_unchanged=False)
    t.free()


def test_unknown_event_handle(dev, canary):
    ghost = Event(dev, 999999)
    s = dev.stream()
    expect(107017, ghost.query)
    expect(107017, ghost.synchronize, 1000)
    expect(107017, s.record, ghost)
    expect(107017, s.wait, ghost)
    good = dev.event()
    s.record(good)
    good.synchronize(SYNC_MS)
    expect(107017, good.elapsed, ghost)
    expect(107017, ghost.elapsed, good)
    s.synchronize(SYNC_MS)                            # nothing bad was queued on the stream
    canary.check()


@pytest.mark.parametrize("block_dim", [70000, 65536, -1])
def test_bad_block_dim(dev, canary, block_dim):
    t = dev.from_numpy(np.zeros(4, np.int32))
    expect(107000, dev.launch, "tb_set", outputs=[t], attrs={"value": 1}, block_dim=block_dim)
    dev.synchronize(SYNC_MS)
    assert np.all(t.numpy() == 0)
    dev.launch("tb_set", outputs=[t], attrs={"value": 2}, block_dim=0)        # 0: the device chooses
    dev.launch("tb_set", outputs=[t], attrs={"value": 3}, block_dim=65535)
    assert np.all(t.numpy() == 3)
    canary.check(mem_unchanged=False)
    t.free()


def test_bad_tensor_descs(dev, canary):
    t = dev.from_numpy(np.zeros(4, np.int32))
    expect(100026, dev.launch, "tb_set", outputs=[TensorDesc(t.ptr, (4,), "complex64")])
    expect(107000, dev.launch, "tb_set", outputs=[TensorDesc(t.ptr, (-1,), "int32")])
    expect(107000, dev.launch, "tb_set", outputs=[TensorDesc(t.ptr, (2, -2), "int32")])
    expect(107000, dev.launch, "tb_set", outputs=[np.zeros(4, np.int32)])
    dev.synchronize(SYNC_MS)
    assert np.all(t.numpy() == 0)
    canary.check(mem_unchanged=False)
    t.free()


# ------------------------------------------------------------------------------------------ allocation
@pytest.mark.parametrize("size", [0, -1, -4096])
def test_bad_malloc_size(dev, canary, size):
    expect(107000, dev.malloc, size)
    canary.check()


@pytest.mark.parametrize("shape", [(-1,), (4, -3)])
def test_negative_shape(dev, canary, shape):
    expect(107000, dev.empty, shape, "float32")
    expect(107000, canary.t.view, shape)
    canary.check()


@pytest.mark.parametrize("dtype", ["complex64", "object", "U4", "datetime64[s]"])
def test_unsupported_dtype(dev, canary, dtype):
    expect(100026, dev.empty, (4,), dtype)
    expect(100026, dev.empty, (4,), np.dtype(dtype))
    expect(100026, dev.from_numpy, np.zeros(4, dtype))
    canary.check()


def test_unknown_dtype_name(dev, canary):
    expect(100026, dev.empty, (4,), "not_a_dtype")
    canary.check()


def test_oom_then_device_still_works(dev, canary):
    free, total = dev.mem_info()
    expect(207001, dev.malloc, total + 1)
    expect(207001, dev.malloc, free + 1)
    expect(207001, dev.empty, (total // 4 + 1,), "float32")
    canary.check()
    # fill the arena nearly up, then fail, then recover
    big = dev.malloc(free - 4096, ACL_MEM_MALLOC_NORMAL_ONLY)       # (huge pages would round up)
    expect(207001, dev.malloc, 8192)
    dev.free(big)
    canary.check()
    t = dev.from_numpy(np.arange(32, dtype=np.int32))
    dev.launch("tb_copy", inputs=[t], outputs=[canary.t.view((32,))])
    assert np.array_equal(canary.t.numpy()[:32], np.arange(32, dtype=np.int32))
    canary.data[:32] = np.arange(32, dtype=np.int32)
    t.free()
    canary.check()


# ------------------------------------------------------------------------------------------ other devices
def test_pointers_and_tensors_of_another_device(rt, dev, canary):
    other = rt.device(1)
    q = other.from_numpy(np.arange(16, dtype=np.int32))
    t = dev.from_numpy(np.zeros(16, np.int32))
    s = dev.stream()
    # a raw descriptor naming the other device's memory
    expect(107000, dev.launch, "tb_copy", inputs=[q.desc], outputs=[t], exc=MemoryAccessError)
    # a Tensor object of the other device
    expect(107000, dev.launch, "tb_copy", inputs=[q], outputs=[t])
    # stream-ordered copies and memsets with a foreign pointer
    for bad in (lambda: s.copy(t.ptr, q.ptr, 64), lambda: s.copy(q.ptr, t.ptr, 64), lambda: s.memset(q.ptr, 0, 64)):
        with pytest.raises(MemoryAccessError) as ei:
            bad()
            s.synchronize(SYNC_MS)
        check_error(ei.value, 107000)
    s.synchronize(SYNC_MS)
    assert np.all(t.numpy() == 0)
    assert np.array_equal(q.numpy(), np.arange(16, dtype=np.int32))
    # events of another device
    expect(107003, s.record, other.event())
    expect(207000, s.wait, other.event())
    s.synchronize(SYNC_MS)
    canary.check(mem_unchanged=False)
    q.free()
    t.free()


def test_bad_stream_priority_and_destroyed_stream(dev, canary):
    expect(107000, dev.stream, -1)
    s = dev.stream(99)                                  # clamped to the lowest priority, not an error
    t = dev.from_numpy(np.zeros(4, np.int32))
    s.launch("tb_set", outputs=[t], attrs={"value": 1})
    s.synchronize(SYNC_MS)
    s.destroy()
    expect(107017, s.launch, "tb_set", outputs=[t], attrs={"value": 2})
    expect(107017, s.synchronize, 1000)
    assert np.all(t.numpy() == 1)
    canary.check(mem_unchanged=False)
    t.free()


# ------------------------------------------------------------------------------------------ public entry points
def test_pointer_level_copies_and_memset(dev, canary):
    """Device.memcpy_h2d/d2h/d2d and memset by pointer (what the acl layer uses): data round-trips, ``out``
    is filled in place, and an overrun, a bad ``out`` or another device's pointer is refused untouched."""
    data = np.arange(64, dtype=np.uint8)
    p, q = dev.malloc(64), dev.malloc(64)
    try:
        dev.memcpy_h2d(p, data)
        assert np.array_equal(dev.memcpy_d2h(p, 64), data)
        out = np.zeros((4, 16), np.uint8)
        assert dev.memcpy_d2h(p, 64, out=out) is out and np.array_equal(out.ravel(), data)
        dev.memcpy_d2d(q, p, 64)
        dev.memset(q + 32, 0xAB, 32)
        want = np.concatenate([data[:32], np.full(32, 0xAB, np.uint8)])
        assert np.array_equal(dev.memcpy_d2h(q, 64), want)
        expect(107000, dev.memcpy_h2d, p + 32, data, exc=MemoryAccessError)
        expect(107000, dev.memcpy_d2h, p, 65, exc=MemoryAccessError)
        expect(107000, dev.memcpy_d2d, q, p, 65, exc=MemoryAccessError)
        expect(107000, dev.memset, q + 64, 0, 1, exc=MemoryAccessError)
        expect(107000, dev.memcpy_d2h, p, 64, out=np.zeros(63, np.uint8))                  # wrong size
        expect(107000, dev.memcpy_d2h, p, 64, out=np.zeros((16, 8), np.uint8)[:, ::2])     # not contiguous
        expect(107000, dev.memcpy_h2d, make_ptr(dev.physical_id + 1, 0x10000), data, exc=MemoryAccessError)
        expect(107000, dev.check_range, p + 48, 32, exc=MemoryAccessError)
        dev.check_range(p + 48, 16)
        assert np.array_equal(dev.memcpy_d2h(q, 64), want), "a refused call changed memory"
    finally:
        dev.free(p)
        dev.free(q)
    canary.check()


def test_stream_enqueue_checks_its_ops(dev, canary):
    """Stream.enqueue (the one path graphs and HCCL queue their ops through) takes an op of its own
    stream and refuses another stream's op, an unknown event and a destroyed stream."""
    from devices.errors import InvalidHandleError, InvalidParamError
    from devices.tasks import Memset, Record

    s, other = dev.stream(), dev.stream()
    t = dev.from_numpy(np.zeros(16, np.int32))
    try:
        s.enqueue(Memset(s.sid, t.ptr, 0x01, 64))
        assert np.all(t.numpy(stream=s) == 0x01010101)
        expect(107000, s.enqueue, Memset(other.sid, t.ptr, 0, 64), exc=InvalidParamError)
        expect(107017, s.enqueue, Record(s.sid, 987654), exc=InvalidHandleError)
        other.destroy()
        expect(107017, other.enqueue, Memset(other.sid, t.ptr, 0, 64), exc=InvalidHandleError)
        s.synchronize(SYNC_MS)
        assert np.all(t.numpy() == 0x01010101), "a refused op ran"
        assert not dev.is_lost and dev.health()[0] == "OK"
    finally:
        t.free()
        s.destroy()
    canary.check()


def test_closed_local_device_is_lost():
    """is_lost (the DeviceHandle protocol's lost state) as runtime.api shows it: a closed device is lost."""
    from conftest import make_local_runtime
    r = make_local_runtime(1, 16 << 20)
    try:
        d = r.device(0)
        assert d.is_lost is False
        r.backend.device(d.physical_id).close()
        assert d.is_lost is True
    finally:
        r.close()
