"""runtime.acl: the pyACL-compatible module (unit tier, in-process devices).

Every test gets a fresh 4-device local runtime installed with ``set_runtime`` and finalizes acl after.
Nothing sleeps: blocked streams are built from a BLOCK callback that waits on a ``threading.Event``.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from acl_checks import ok
from conftest import installed, make_local_runtime
from devices.arena import ptr_device
from runtime import acl

WAIT_S = 10          # deadline for anything the tests wait on (only reached when something is broken)


def _reset_acl():
    acl.finalize()                 # drop state a failed test may have left (ret ignored)
    acl.get_recent_err_msg()


@pytest.fixture
def fresh():
    with installed(make_local_runtime()) as r:
        _reset_acl()
        try:
            yield r
        finally:
            _reset_acl()


@pytest.fixture
def dev0(fresh):
    """acl initialized, device 0 set; yields its default context."""
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.get_context()
    assert ret == 0
    yield ctx


def axpy_kernel(ctx, x, y, out, alpha=1.0):
    r = ctx.split(len(x))
    out[r.start:r.stop] = alpha * x[r.start:r.stop] + y[r.start:r.stop]


def oob_kernel(ctx, x):
    x[len(x)] = 1.0          # one past the end: AI Core write-overflow trap


acl.rt.register_kernel("acl_test_axpy", axpy_kernel)
acl.rt.register_kernel("acl_test_oob", oob_kernel)


class ReportThread:
    """The pyACL callback pattern: a util.start_thread thread looping on process_report."""

    def __init__(self, ctx, timeout_ms: int = 20):
        self.stop = threading.Event()
        self.ctx = ctx
        self.rets: list[int] = []
        self.tid = ok(acl.util.start_thread(self._loop, [ctx, timeout_ms]))

    def _loop(self, args):
        ctx, timeout_ms = args
        acl.rt.set_context(ctx)
        while not self.stop.is_set():
            self.rets.append(acl.rt.process_report(timeout_ms))

    def close(self):
        self.stop.set()
        ok(acl.util.stop_thread(self.tid))


# ---------------------------------------------------------------------------------------------- script
def test_pyacl_style_script(fresh):
    n = 1000
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 2.0, dtype=np.float32)
    out = np.zeros(n, dtype=np.float32)
    nbytes = x.nbytes

    ok(acl.init())
    ok(acl.rt.set_device(0))
    assert ok(acl.rt.get_device_count()) == 4
    ctx = ok(acl.rt.get_context())
    stream = ok(acl.rt.create_stream())
    dx = ok(acl.rt.malloc(nbytes, acl.ACL_MEM_MALLOC_HUGE_FIRST))
    dy = ok(acl.rt.malloc(nbytes, acl.ACL_MEM_MALLOC_NORMAL_ONLY))
    dout = ok(acl.rt.malloc(nbytes, acl.ACL_MEM_MALLOC_HUGE_FIRST))
    ok(acl.rt.memcpy(dx, nbytes, acl.util.numpy_to_ptr(x), nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE))
    ok(acl.rt.memcpy(dy, nbytes, acl.util.numpy_to_ptr(y), nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE))

    fn = ok(acl.rt.binary_get_function(0, "acl_test_axpy"))
    args = [(dx, (n,), acl.ACL_FLOAT), (dy, (n,), acl.ACL_FLOAT), (dout, (n,), acl.ACL_FLOAT)]
    ok(acl.rt.launch_kernel(fn, 4, args, stream, num_outputs=1, attrs={"alpha": 3.0}))
    ok(acl.rt.synchronize_stream(stream))
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), nbytes, dout, nbytes, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    np.testing.assert_allclose(out, 3.0 * x + y)

    add = ok(acl.rt.binary_get_function(None, "add"))
    ok(acl.rt.launch_kernel(add, 1, args, 0))                # default stream
    ok(acl.rt.synchronize_stream(0))
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), nbytes, dout, nbytes, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    np.testing.assert_allclose(out, x + y)

    # the pyACL bytes idiom: copy device memory into a bytes object through its address
    buf = bytes(nbytes)
    ok(acl.rt.memcpy(acl.util.bytes_to_ptr(buf), nbytes, dx, nbytes, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    np.testing.assert_array_equal(np.frombuffer(buf, dtype=np.float32), x)

    for p in (dx, dy, dout):
        ok(acl.rt.free(p))
    ok(acl.rt.destroy_stream(stream))
    assert ok(acl.rt.get_context()) == ctx
    ok(acl.rt.reset_device(0))
    ok(acl.finalize())


def test_async_copies_and_memset(dev0):
    n = 256
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.zeros(n, dtype=np.float32)
    stream = ok(acl.rt.create_stream())
    a = ok(acl.rt.malloc(x.nbytes))
    b = ok(acl.rt.malloc(x.nbytes))
    ok(acl.rt.memcpy_async(a, x.nbytes, acl.util.numpy_to_ptr(x), x.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream))
    ok(acl.rt.memcpy_async(b, x.nbytes, a, x.nbytes, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, stream))
    ok(acl.rt.memcpy_async(acl.util.numpy_to_ptr(out), out.nbytes, b, x.nbytes, acl.ACL_MEMCPY_DEFAULT, stream))
    ok(acl.rt.memset_async(a, x.nbytes, 0, x.nbytes, stream))     # ordered after the D2H read of b
    ok(acl.rt.synchronize_stream(stream))
    np.testing.assert_array_equal(out, x)

    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, a, x.nbytes, acl.ACL_MEMCPY_DEFAULT))
    assert not out.any()
    ok(acl.rt.memset(b, x.nbytes, 0x3F, 8))
    raw = np.zeros(8, dtype=np.uint8)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(raw), 8, b, 8, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    assert (raw == 0x3F).all()

    # async D2H out of the device buffer's bounds: reported by the next synchronize of that stream
    big = np.zeros(4 * n, dtype=np.float32)
    ok(acl.rt.memcpy_async(acl.util.numpy_to_ptr(big), big.nbytes, a, 4 * x.nbytes,
                           acl.ACL_MEMCPY_DEVICE_TO_HOST, stream))
    assert acl.rt.synchronize_stream(stream) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert "overruns its allocation" in acl.get_recent_err_msg()
    ok(acl.rt.synchronize_stream(stream))
    # ... and past the end of the host buffer: refused at once (the host-pointer table), nothing queued
    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(out), 4 * out.nbytes, a, 4 * x.nbytes,
                               acl.ACL_MEMCPY_DEVICE_TO_HOST, stream) == acl.ACL_ERROR_INVALID_PARAM
    assert "runs past the end" in acl.get_recent_err_msg()
    ok(acl.rt.synchronize_stream(stream))

    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(out), 8, acl.util.numpy_to_ptr(x), 8,
                               acl.ACL_MEMCPY_HOST_TO_HOST, stream) == acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT


def test_d2d_across_devices_and_host_memory(fresh):
    ok(acl.init())
    ok(acl.rt.set_device(1))
    src = ok(acl.rt.malloc(64))
    host = ok(acl.rt.malloc_host(64))
    data = np.arange(16, dtype=np.int32)
    ok(acl.rt.memcpy(host, 64, acl.util.numpy_to_ptr(data), 64, acl.ACL_MEMCPY_HOST_TO_HOST))
    np.testing.assert_array_equal(acl.util.ptr_to_numpy(host, (16,), np.dtype(np.int32).num), data)
    ok(acl.rt.memcpy(src, 64, host, 64, acl.ACL_MEMCPY_HOST_TO_DEVICE))
    ok(acl.rt.set_device(2))
    dst = ok(acl.rt.malloc(64))
    ok(acl.rt.memcpy(dst, 64, src, 64, acl.ACL_MEMCPY_DEVICE_TO_DEVICE))       # device 1 -> device 2
    back = acl.rt.memcpy(acl.util.numpy_to_ptr(np.zeros(1)), 8, dst, 8, acl.ACL_MEMCPY_DEVICE_TO_HOST)
    assert back == 0
    assert acl.util.ptr_to_bytes(host, 64) == data.tobytes()
    view = acl.util.ptr_to_numpy(host, 16, "int32")
    view[:] = 0
    ok(acl.rt.memcpy(host, 64, dst, 64, acl.ACL_MEMCPY_DEFAULT))
    np.testing.assert_array_equal(view, data)
    ok(acl.rt.free_host(host))
    assert acl.rt.free_host(host) == acl.ACL_ERROR_RT_PARAM_INVALID


# ---------------------------------------------------------------------------------------------- the package
def test_namespaces_are_real_modules_and_constants_are_complete():
    """acl.rt / acl.util / acl.mdl / acl.prof are the modules runtime.acl.rt ... (plain functions, their
    own names, nothing renamed at import; what dir() of each lists: tests/core/test_acl_namespace.py), and acl
    exposes every ACL_* code of the one error table."""
    import sys

    import devices.errors as errors
    from runtime.acl import _constants as constants

    for ns in ("rt", "util", "mdl", "prof"):
        mod = getattr(acl, ns)
        assert sys.modules[f"runtime.acl.{ns}"] is mod
    for fn, mod in ((acl.rt.malloc, "runtime.acl.rt"), (acl.util.start_thread, "runtime.acl.util"),
                    (acl.mdl.ri_capture_begin, "runtime.acl.mdl"), (acl.init, "runtime.acl")):
        assert fn.__module__ == mod and fn.__qualname__ == fn.__name__
    codes = {k: v for k, v in vars(errors).items() if k.startswith("ACL_")}
    assert len(codes) > 50
    missing = sorted(k for k in codes if getattr(acl, k, None) != codes[k])
    assert not missing, f"ACL_* codes of devices.errors missing from acl: {missing}"
    consts = [k for k in vars(constants) if k.isupper() and not k.startswith("_")]
    assert [k for k in consts if getattr(acl, k, None) is not getattr(constants, k)] == []


def test_error_text_names_the_call(fresh):
    """get_recent_err_msg() starts with the name of the failing call, in each namespace."""
    assert acl.rt.malloc(16)[1] == acl.ACL_ERROR_UNINITIALIZE
    assert acl.get_recent_err_msg().startswith("acl.rt.malloc: ")
    assert acl.util.start_thread(None, None)[1] == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.get_recent_err_msg().startswith("acl.util.start_thread: ")
    assert acl.init("/no/such/acl.json") == acl.ACL_ERROR_INVALID_PARAM
    assert acl.get_recent_err_msg().startswith("acl.init: ")
    ok(acl.init())
    ok(acl.rt.set_device(0))
    assert acl.mdl.ri_destroy(12345) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.get_recent_err_msg().startswith("acl.mdl.ri_destroy: ")
    assert acl.rt.destroy_stream_force(0) == acl.ACL_ERROR_RT_PARAM_INVALID     # an alias keeps its first name
    assert acl.get_recent_err_msg().startswith("acl.rt.destroy_stream: ")


# ---------------------------------------------------------------------------------------------- return codes
def test_calls_before_init_and_init_refcount(fresh):
    assert acl.rt.set_device(0) == acl.ACL_ERROR_UNINITIALIZE
    assert acl.get_recent_err_msg()
    assert acl.get_recent_err_msg() == ""                     # reading clears it
    assert acl.rt.malloc(16, 0) == (0, acl.ACL_ERROR_UNINITIALIZE)
    assert acl.rt.get_device_count()[1] == acl.ACL_ERROR_UNINITIALIZE

    ok(acl.init())
    ok(acl.init())                                             # reference-counted: adds 1
    assert ok(acl.finalize_reference()) == 1
    ok(acl.rt.set_device(0))                                   # still initialized
    assert ok(acl.finalize_reference()) == 0
    assert acl.rt.get_device_count()[1] == acl.ACL_ERROR_UNINITIALIZE
    assert acl.finalize() == acl.ACL_ERROR_REPEAT_FINALIZE

    ok(acl.init())
    ok(acl.init())
    ok(acl.finalize())                                         # frees whatever the count
    assert acl.rt.get_device_count()[1] == acl.ACL_ERROR_UNINITIALIZE


def test_finalize_destroys_what_acl_made_on_a_callers_runtime(fresh):
    """acl.finalize on a runtime acl did not create (it stays open): the contexts' streams and events are
    destroyed (they were left behind when finalize forgot its tables before releasing the contexts)."""
    dev = fresh.device(0)
    streams, events = set(dev.live_streams), set(dev.live_events)
    ok(acl.init())
    ok(acl.rt.set_device(0))
    ok(acl.rt.create_stream())
    ok(acl.rt.create_event())
    ok(acl.rt.create_context(0))
    ok(acl.rt.create_stream())
    assert len(dev.live_streams) == len(streams) + 4 and len(dev.live_events) == len(events) + 1
    ok(acl.finalize())
    assert dev.live_streams == streams and dev.live_events == events


def test_init_config_file(fresh, tmp_path):
    cfg = tmp_path / "acl.json"
    cfg.write_text('{"dump": {"dump_mode": "output"}}')
    ok(acl.init(str(cfg)))
    ok(acl.finalize())
    assert acl.init(str(tmp_path / "missing.json")) == acl.ACL_ERROR_INVALID_PARAM
    assert "missing.json" in acl.get_recent_err_msg()
    cfg.write_text("{not json")
    assert acl.init(str(cfg)) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.get_device_count()[1] == acl.ACL_ERROR_UNINITIALIZE


def test_device_ids_and_contexts(fresh):
    ok(acl.init())
    assert acl.rt.set_device(4) == acl.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.set_device(-1) == acl.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.query_device_status(7)[1] == acl.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.get_device() == (-1, acl.ACL_ERROR_RT_CONTEXT_NULL)
    assert acl.rt.malloc(16, 0)[1] == acl.ACL_ERROR_RT_CONTEXT_NULL
    assert ok(acl.rt.query_device_status(0)) == acl.ACL_RT_DEVICE_STATUS_NORMAL
    assert ok(acl.rt.get_run_mode()) == acl.ACL_HOST
    assert ok(acl.rt.device_get_stream_priority_range()) == (7, 0)

    ok(acl.rt.set_device(0))
    ok(acl.rt.set_device(0))                                   # ref count 2
    ctx0 = ok(acl.rt.get_context())
    s0 = ok(acl.rt.create_stream_with_config(3, acl.ACL_STREAM_FAST_LAUNCH))
    assert ok(acl.rt.get_stream_priority(s0)) == 3
    assert ok(acl.rt.stream_get_flags(s0)) == acl.ACL_STREAM_FAST_LAUNCH
    default_stream = ok(acl.rt.ctx_get_current_default_stream())
    assert acl.rt.destroy_stream(default_stream) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert ok(acl.rt.get_stream_priority(ok(acl.rt.create_stream_with_config(9, 0)))) == 7

    ctx1 = ok(acl.rt.create_context(1))                        # becomes current
    assert ok(acl.rt.get_device()) == 1
    s1 = ok(acl.rt.create_stream())
    assert acl.rt.synchronize_stream(s0) == acl.ACL_ERROR_RT_STREAM_CONTEXT
    ok(acl.rt.set_context(ctx0))
    assert ok(acl.rt.get_device()) == 0
    assert acl.rt.synchronize_stream(s1) == acl.ACL_ERROR_RT_STREAM_CONTEXT
    assert acl.rt.destroy_context(ctx0) == acl.ACL_ERROR_RT_PARAM_INVALID    # the default context
    ok(acl.rt.destroy_context(ctx1))
    assert acl.rt.set_context(ctx1) == acl.ACL_ERROR_RT_INVALID_HANDLE

    # another thread: no context until it sets the device, then it shares the default context
    seen = {}

    def worker():
        seen["before"] = acl.rt.get_context()[1]
        acl.rt.set_device(0)
        seen["ctx"] = acl.rt.get_context()
        acl.rt.reset_device(0)

    t = threading.Thread(target=worker)
    t.start()
    t.join(WAIT_S)
    assert seen["before"] == acl.ACL_ERROR_RT_CONTEXT_NULL
    assert seen["ctx"] == (ctx0, 0)

    ok(acl.rt.reset_device(0))                                 # count 2 -> 1: still usable
    ok(acl.rt.synchronize_stream(s0))
    ok(acl.rt.reset_device(0))                                 # -> 0: default context and its streams go
    assert acl.rt.get_device()[1] == acl.ACL_ERROR_RT_CONTEXT_NULL
    assert acl.rt.reset_device(0) == acl.ACL_ERROR_RT_CONTEXT_NULL
    ok(acl.rt.set_device(0))
    assert acl.rt.synchronize_stream(s0) == acl.ACL_ERROR_RT_INVALID_HANDLE
    ok(acl.rt.reset_device_force(0))
    assert acl.rt.reset_device_force(0) == acl.ACL_ERROR_RT_CONTEXT_NULL                # nothing left to reset


def test_memory_errors(dev0):
    p = ok(acl.rt.malloc(64))
    host = np.zeros(32, dtype=np.uint8)
    hp = acl.util.numpy_to_ptr(host)
    # size 0 and an unknown copy kind are rejected by CANN's acl layer itself, before the runtime:
    # ACL_REQUIRES_POSITIVE_REPORT(size) in aclMallocMemInner and MemcpyKindTranslate's default branch in
    # hicann/runtime src/acl/aclrt_impl/memory.cpp both return ACL_ERROR_INVALID_PARAM (100000), not 107000
    assert acl.rt.malloc(0, 0)[1] == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(p, 16, hp, 32, acl.ACL_MEMCPY_HOST_TO_DEVICE) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert "dest_max" in acl.get_recent_err_msg()
    # a kind that contradicts the addresses is not an error for the synchronous copy: current CANN calls
    # aclrtMemcpy's kind "reserved; the system decides from the src and dst pointers" (docs/zh/api_ref/
    # 11-03_memory_copy_and_set.md), so this host->device copy succeeds (test_memcpy_kind_follows_cann)
    ok(acl.rt.memcpy(p, 64, hp, 32, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    assert acl.rt.memcpy(p, 64, hp, 32, 99) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(p + 48, 32, hp, 32, acl.ACL_MEMCPY_HOST_TO_DEVICE) == acl.ACL_ERROR_RT_PARAM_INVALID  # past the end
    assert "overruns" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(hp, 32, p + 64, 32, acl.ACL_MEMCPY_DEVICE_TO_HOST) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert "past the end" in acl.get_recent_err_msg()
    assert acl.rt.memset(p, 64, 0, 65) == acl.ACL_ERROR_RT_PARAM_INVALID
    ok(acl.rt.memcpy(p, 64, hp, 32, acl.ACL_MEMCPY_DEFAULT))

    free0, total = ok(acl.rt.get_mem_info(acl.ACL_HBM_MEM))
    assert 0 < free0 <= total
    big = ok(acl.rt.malloc(1 << 20))
    assert ok(acl.rt.get_mem_info(acl.ACL_DDR_MEM))[0] < free0
    assert acl.rt.get_mem_info(99)[-1] == acl.ACL_ERROR_RT_PARAM_INVALID
    ok(acl.rt.free(big))

    ok(acl.rt.free(p))
    assert acl.rt.free(p) == acl.ACL_ERROR_RT_MEMORY_FREE                      # double free
    assert "double free" in acl.get_recent_err_msg()
    assert acl.rt.free(p + 64) == acl.ACL_ERROR_RT_PARAM_INVALID                 # never allocated
    assert acl.get_recent_err_msg()
    assert acl.rt.free(hp) == acl.ACL_ERROR_RT_PARAM_INVALID                    # a host address
    assert acl.rt.malloc(1 << 40)[1] == acl.ACL_ERROR_RT_MEMORY_ALLOCATION


def test_get_run_mode_before_init(fresh):
    """aclrtGetRunMode checks no init (hicann/runtime src/acl/aclrt_impl/device.cpp): programs read it at
    import time to choose between H2D/D2H and D2D copies; vnpu runs on the host."""
    assert acl.rt.get_device_count()[1] == acl.ACL_ERROR_UNINITIALIZE
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0) == (1, 0)
    ok(acl.init())
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0)


def test_acl_layer_parameter_errors_are_100000(dev0):
    """What CANN's acl layer checks itself returns ACL_ERROR_INVALID_PARAM (100000), before the runtime
    (107000) is reached: ACL_REQUIRES_NOT_NULL / ACL_REQUIRES_POSITIVE and MemcpyKindTranslate in
    hicann/runtime src/acl/aclrt_impl/memory.cpp.  A zero count is checked first and is a no-op."""
    p = ok(acl.rt.malloc(64))
    h = ok(acl.rt.malloc_host(64))
    H2D, D2H = acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_MEMCPY_DEVICE_TO_HOST
    stream = ok(acl.rt.create_stream())
    invalid = {
        "malloc 0": acl.rt.malloc(0)[1],
        "malloc_cached 0": acl.rt.malloc_cached(0)[1],
        "malloc_host 0": acl.rt.malloc_host(0)[1],
        "free(0)": acl.rt.free(0),
        "free(None)": acl.rt.free(None),
        "free_host(0)": acl.rt.free_host(0),
        "memcpy to NULL": acl.rt.memcpy(0, 64, h, 64, H2D),
        "memcpy from NULL": acl.rt.memcpy(p, 64, None, 64, H2D),
        "memcpy_async to NULL": acl.rt.memcpy_async(0, 64, p, 64, D2H, stream),
        "memcpy kind 99": acl.rt.memcpy(p, 64, h, 64, 99),
        "memcpy kind INNER_DEVICE_TO_DEVICE": acl.rt.memcpy(p, 64, p, 64, acl.ACL_MEMCPY_INNER_DEVICE_TO_DEVICE),
        "memcpy_async kind INTER_DEVICE_TO_DEVICE": acl.rt.memcpy_async(p, 64, p, 64,
                                                                        acl.ACL_MEMCPY_INTER_DEVICE_TO_DEVICE, stream),
        "memset NULL": acl.rt.memset(0, 64, 1, 64),
        "memset_async NULL": acl.rt.memset_async(None, 64, 1, 64, stream),
    }
    assert invalid == dict.fromkeys(invalid, acl.ACL_ERROR_INVALID_PARAM)
    # count 0 copies / sets nothing and succeeds, NULL or not (checked before anything else)
    for res in (acl.rt.memcpy(0, 0, 0, 0, 99), acl.rt.memcpy_async(0, 0, None, 0, H2D, stream),
                acl.rt.memset(0, 0, 7, 0), acl.rt.memset_async(0, 0, 7, 0, stream)):
        ok(res)
    # what the runtime checks keeps the runtime's codes
    assert acl.rt.memcpy(p, 16, h, 32, H2D) == acl.ACL_ERROR_RT_PARAM_INVALID          # count > dest_max
    assert acl.rt.memset(p, 16, 0, 32) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free(h) == acl.ACL_ERROR_RT_PARAM_INVALID                            # not device memory
    assert acl.rt.free_host(p) == acl.ACL_ERROR_RT_PARAM_INVALID                       # not malloc_host memory
    ok(acl.rt.free(p))
    assert acl.rt.free(p) == acl.ACL_ERROR_RT_MEMORY_FREE
    ok(acl.rt.free_host(h))
    ok(acl.rt.synchronize_stream(stream))


def test_memcpy_kind_follows_cann(dev0):
    """A kind that contradicts the addresses, as current CANN handles it (hicann/runtime):

    - aclrtMemcpy: the kind is "a reserved parameter; the system decides from the source and destination
      pointers" (docs/zh/api_ref/11-03_memory_copy_and_set.md): every valid kind copies the real way;
    - aclrtMemcpyAsync: ApiErrorDecorator::MemcpyKindAutoCorrect (src/runtime/api/impl/api_error.cc)
      corrects the kind between device and registered (malloc_host) memory, and with pageable host
      memory accepts only the kinds its MemcpyKindReviseMap allows, else RT_ERROR_INVALID_VALUE (107000).
    """
    n = 64
    data = np.arange(n, dtype=np.uint8)
    d1, d2 = ok(acl.rt.malloc(n)), ok(acl.rt.malloc(n))
    pinned = ok(acl.rt.malloc_host(n))
    page = np.zeros(n, np.uint8)
    pp = acl.util.numpy_to_ptr(page)
    src = acl.util.numpy_to_ptr(data)
    K = (acl.ACL_MEMCPY_HOST_TO_HOST, acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_MEMCPY_DEVICE_TO_HOST,
         acl.ACL_MEMCPY_DEVICE_TO_DEVICE, acl.ACL_MEMCPY_DEFAULT)

    def read(dptr):
        out = np.zeros(n, np.uint8)
        ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), n, dptr, n, acl.ACL_MEMCPY_DEVICE_TO_HOST))
        return out

    # synchronous: every kind goes the way the addresses say
    for k in K:
        ok(acl.rt.memset(d1, n, 0, n))
        ok(acl.rt.memcpy(d1, n, src, n, k))                                    # host -> device
        np.testing.assert_array_equal(read(d1), data)
        ok(acl.rt.memcpy(d2, n, d1, n, k))                                     # device -> device
        np.testing.assert_array_equal(read(d2), data)
        page[:] = 0
        ok(acl.rt.memcpy(pp, n, d2, n, k))                                     # device -> host
        np.testing.assert_array_equal(page, data)
        ok(acl.rt.memcpy(pinned, n, pp, n, k))                                 # host -> host
        np.testing.assert_array_equal(acl.util.ptr_to_numpy(pinned, (n,), np.dtype(np.uint8).num), data)

    stream = ok(acl.rt.create_stream())
    # asynchronous, device <-> pinned memory: corrected to the real direction
    for k in (acl.ACL_MEMCPY_DEVICE_TO_HOST, acl.ACL_MEMCPY_HOST_TO_HOST, acl.ACL_MEMCPY_DEVICE_TO_DEVICE):
        ok(acl.rt.memset(d1, n, 0, n))
        ok(acl.rt.memcpy_async(d1, n, pinned, n, k, stream))
        ok(acl.rt.synchronize_stream(stream))
        np.testing.assert_array_equal(read(d1), data)
    ok(acl.rt.memset(pinned, n, 0, n))
    ok(acl.rt.memcpy_async(pinned, n, d1, n, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream))
    ok(acl.rt.synchronize_stream(stream))
    np.testing.assert_array_equal(acl.util.ptr_to_numpy(pinned, (n,), np.dtype(np.uint8).num), data)
    # asynchronous with pageable memory: the allowed kinds work, the others are refused and queue nothing
    ok(acl.rt.memset(d2, n, 0, n))
    for k in (acl.ACL_MEMCPY_HOST_TO_DEVICE, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, acl.ACL_MEMCPY_DEFAULT):
        ok(acl.rt.memcpy_async(d2, n, src, n, k, stream))                      # pageable -> device
        ok(acl.rt.synchronize_stream(stream))
        np.testing.assert_array_equal(read(d2), data)
        ok(acl.rt.memset(d2, n, 0, n))
    refused = {
        "pageable -> device as D2H": acl.rt.memcpy_async(d2, n, src, n, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream),
        "pageable -> device as H2H": acl.rt.memcpy_async(d2, n, src, n, acl.ACL_MEMCPY_HOST_TO_HOST, stream),
        "device -> pageable as H2D": acl.rt.memcpy_async(pp, n, d1, n, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream),
        "pinned -> pageable as D2H": acl.rt.memcpy_async(pp, n, pinned, n, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream),
        "pageable -> pinned as H2D": acl.rt.memcpy_async(pinned, n, pp, n, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream),
        "staged H2D from device memory": acl.rt.memcpy_async(d2, n, d1, n, acl.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE,
                                                              stream),
    }
    assert refused == dict.fromkeys(refused, acl.ACL_ERROR_RT_PARAM_INVALID)
    assert "does not fit the addresses" in acl.get_recent_err_msg()
    ok(acl.rt.synchronize_stream(stream))
    assert not read(d2).any()                                                  # nothing was queued
    page[:] = 0
    for k in (acl.ACL_MEMCPY_DEVICE_TO_HOST, acl.ACL_MEMCPY_DEVICE_TO_DEVICE, acl.ACL_MEMCPY_DEFAULT):
        ok(acl.rt.memcpy_async(pp, n, d1, n, k, stream))                       # device -> pageable
    ok(acl.rt.synchronize_stream(stream))
    np.testing.assert_array_equal(page, data)
    ok(acl.rt.memcpy_async(d2, n, src, n, acl.ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE, stream))
    ok(acl.rt.synchronize_stream(stream))
    np.testing.assert_array_equal(read(d2), data)
    # host <-> host stays unsupported asynchronously (EP mode), whatever kind is given
    assert acl.rt.memcpy_async(pinned, n, pp, n, acl.ACL_MEMCPY_DEFAULT, stream) == \
        acl.ACL_ERROR_RT_FEATURE_NOT_SUPPORT


def test_memset_host_memory(dev0):
    """aclrtMemset / aclrtMemsetAsync: "host or device memory, the system decides from the address"
    (docs/zh/api_ref/11-03); host memory goes through the host-pointer table, and memset_async sets it
    at once, not on the stream (aclrtMemsetD32Async: host memory initialization is not issued to the
    stream)."""
    n = 256
    h = ok(acl.rt.malloc_host(n))
    view = acl.util.ptr_to_numpy(h, (n,), np.dtype(np.uint8).num)
    ok(acl.rt.memset(h, n, 0x5A, n))
    assert (view == 0x5A).all()
    stream = ok(acl.rt.create_stream())
    ok(acl.rt.memset_async(h, n, 0x1FF, 16, stream))                 # value & 0xFF, first 16 bytes
    assert (view[:16] == 0xFF).all() and (view[16:] == 0x5A).all()   # done before the call returned
    page = np.ones(32, np.uint8)
    ok(acl.rt.memset_async(acl.util.numpy_to_ptr(page), 32, 3, 32, stream))
    assert (page == 3).all()
    assert acl.rt.memset(h, 4 * n, 0, 4 * n) == acl.ACL_ERROR_INVALID_PARAM       # past the host buffer
    assert "runs past the end" in acl.get_recent_err_msg()
    ok(acl.rt.synchronize_stream(stream))
    ok(acl.rt.free_host(h))
    # use after free: aclrtMemset -> drvMemsetD8 on a freed SVM host address is refused by the A2 (910B)
    # driver's page-reference check (EINVAL -> DRV_ERROR_PARA_ERROR, hicann/driver svm/v2), a driver code
    # hicann/runtime's errcode_manage.cc does not map: RT_ERROR_DRV_ERR -> ACL_ERROR_RT_DRV_INTERNAL_ERROR
    assert acl.rt.memset(h, n, 0, n) == acl.ACL_ERROR_RT_DRV_INTERNAL_ERROR == 507899
    assert "freed" in acl.get_recent_err_msg()
    assert acl.rt.memset(h + 8, n - 8, 0, 8) == acl.ACL_ERROR_RT_DRV_INTERNAL_ERROR   # inside it, too
    assert (view[:16] == 0xFF).all() and (view[16:] == 0x5A).all()   # nothing written (an old view maps it)
    assert acl.rt.memset(0x10, 8, 0, 8) == acl.ACL_ERROR_INVALID_PARAM              # never host memory acl knew
    assert acl.rt.memset_async(h, n, 0, n, stream) == acl.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memset_async(0x10, 8, 0, 8, stream) == acl.ACL_ERROR_INVALID_PARAM
    d = ok(acl.rt.malloc(n))                                          # device memory still stream-ordered
    ok(acl.rt.memset_async(d, n, 9, n, stream))
    ok(acl.rt.synchronize_stream(stream))
    out = np.zeros(n, np.uint8)
    ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), n, d, n, acl.ACL_MEMCPY_DEVICE_TO_HOST))
    assert (out == 9).all()


def test_argument_errors_raise_like_pyacl_and_messages_are_per_thread(dev0):
    with pytest.raises(TypeError):
        acl.rt.malloc()
    assert acl.rt.free(12345) == acl.ACL_ERROR_RT_PARAM_INVALID
    other = {}
    t = threading.Thread(target=lambda: other.setdefault("msg", acl.get_recent_err_msg()))
    t.start()
    t.join(WAIT_S)
    assert other["msg"] == ""
    assert acl.get_recent_err_msg()


# ---------------------------------------------------------------------------------------------- events, streams
def test_event_status_numbering_and_elapsed(fresh, dev0, monkeypatch):
    stream = ok(acl.rt.create_stream())
    start, end, never = (ok(acl.rt.create_event()) for _ in range(3))
    assert ok(acl.rt.query_event_status(never)) == acl.ACL_EVENT_RECORDED_STATUS_COMPLETE == 1
    assert ok(acl.rt.query_event(never)) == acl.ACL_EVENT_STATUS_COMPLETE == 0

    p = ok(acl.rt.malloc(4096))
    ok(acl.rt.record_event(start, stream))
    ok(acl.rt.memset_async(p, 4096, 1, 4096, stream))
    ok(acl.rt.record_event(end, stream))
    ok(acl.rt.synchronize_event(end))
    ok(acl.rt.synchronize_stream(stream))
    assert ok(acl.rt.query_event_status(end)) == acl.ACL_EVENT_RECORDED_STATUS_COMPLETE
    ms = ok(acl.rt.event_elapsed_time(start, end))
    assert ms > 0.0                                                      # a memset ran between them
    monkeypatch.setenv("VNPU_CLOCK", "modeled")
    cost = fresh.device(0).handle.cost                                   # the in-process device's model
    assert ok(acl.rt.event_elapsed_time(start, end)) == pytest.approx(cost.device_copy(4096) / 2 * 1e3, rel=1e-6)
    monkeypatch.delenv("VNPU_CLOCK")
    assert acl.rt.event_elapsed_time(start, never)[1] == acl.ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID
    assert acl.rt.event_elapsed_time(end, start)[1] == acl.ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL
    ok(acl.rt.reset_event(start, stream))
    for e in (start, end, never):
        ok(acl.rt.destroy_event(e))
    assert acl.rt.query_event_status(start)[1] == acl.ACL_ERROR_RT_INVALID_HANDLE

    # an event of device 0 recorded on a stream of device 1
    ev0 = ok(acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC))
    ok(acl.rt.create_context(1))
    assert acl.rt.record_event(ev0, 0) == acl.ACL_ERROR_RT_STREAM_CONTEXT


def test_blocked_stream_timeouts_and_status(dev0):
    stream = ok(acl.rt.create_stream())
    ev = ok(acl.rt.create_event_ex_with_flag(acl.ACL_EVENT_SYNC))
    waiter = ok(acl.rt.create_stream())
    reporter = ReportThread(dev0)
    try:
        ok(acl.rt.subscribe_report(reporter.tid, stream))
        entered, gate = threading.Event(), threading.Event()

        def hold(_):
            entered.set()
            gate.wait(WAIT_S)

        ok(acl.rt.launch_callback(hold, None, acl.ACL_CALLBACK_BLOCK, stream))
        ok(acl.rt.record_event(ev, stream))
        ok(acl.rt.stream_wait_event(waiter, ev))
        assert entered.wait(WAIT_S)
        assert ok(acl.rt.stream_query(stream)) == acl.ACL_STREAM_STATUS_NOT_READY
        assert ok(acl.rt.query_event_status(ev)) == acl.ACL_EVENT_RECORDED_STATUS_NOT_READY == 0
        assert ok(acl.rt.query_event(ev)) == acl.ACL_EVENT_STATUS_NOT_READY == 1
        assert acl.rt.synchronize_stream_with_timeout(stream, 20) == acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        assert acl.rt.synchronize_stream_with_timeout(waiter, 0) == acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        assert acl.rt.synchronize_event_with_timeout(ev, 20) == acl.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
        assert acl.rt.synchronize_device_with_timeout(0) == acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        gate.set()
        ok(acl.rt.synchronize_stream_with_timeout(stream, WAIT_S * 1000))
        ok(acl.rt.synchronize_stream(waiter))
        assert ok(acl.rt.stream_query(stream)) == acl.ACL_STREAM_STATUS_COMPLETE
        assert ok(acl.rt.query_event_status(ev)) == acl.ACL_EVENT_RECORDED_STATUS_COMPLETE
        ok(acl.rt.unsubscribe_report(reporter.tid, stream))
    finally:
        gate.set()
        reporter.close()
    ok(acl.rt.synchronize_device())


# ---------------------------------------------------------------------------------------------- callbacks
def test_callbacks_run_in_subscribed_thread_in_stream_order(dev0):
    stream = ok(acl.rt.create_stream())
    order: list[str] = []
    ran_in: list[int] = []
    gate, entered = threading.Event(), threading.Event()

    def marker(tag):
        def k(ctx, x):
            order.append(tag)
        return k

    acl.rt.register_kernel("acl_test_mark_k1", marker("k1"), replace=True)
    acl.rt.register_kernel("acl_test_mark_k2", marker("k2"), replace=True)
    k1 = ok(acl.rt.binary_get_function(0, "acl_test_mark_k1"))
    k2 = ok(acl.rt.binary_get_function(0, "acl_test_mark_k2"))
    p = ok(acl.rt.malloc(64))
    arg = [(p, (16,), acl.ACL_FLOAT)]

    # no subscriber yet
    assert acl.rt.launch_callback(lambda u: None, None, acl.ACL_CALLBACK_NO_BLOCK, stream) == \
        acl.ACL_ERROR_RT_STREAM_NO_CB_REG
    assert acl.rt.process_report(0) == acl.ACL_ERROR_RT_REPORT_TIMEOUT

    reporter = ReportThread(dev0)
    try:
        ok(acl.rt.subscribe_report(reporter.tid, stream))
        assert acl.rt.subscribe_report(reporter.tid, stream) == acl.ACL_ERROR_REPEAT_SUBSCRIBE

        def no_block(user):
            order.append(user)
            ran_in.append(threading.get_ident())

        def block(user):
            order.append(user + "-start")
            ran_in.append(threading.get_ident())
            entered.set()
            gate.wait(WAIT_S)
            order.append(user + "-end")

        ok(acl.rt.launch_kernel(k1, 1, arg, stream, num_outputs=0))
        ok(acl.rt.launch_callback(no_block, "cb1", acl.ACL_CALLBACK_NO_BLOCK, stream))
        ok(acl.rt.launch_callback(block, "cb2", acl.ACL_CALLBACK_BLOCK, stream))
        ok(acl.rt.launch_kernel(k2, 1, arg, stream, num_outputs=0))
        assert entered.wait(WAIT_S)
        assert "k2" not in order                  # the BLOCK callback holds the stream's later work
        gate.set()
        ok(acl.rt.synchronize_stream(stream))
        assert order.index("k1") < order.index("cb1")
        assert order.index("cb2-start") < order.index("cb2-end") < order.index("k2")
        assert ran_in == [reporter.tid, reporter.tid]
        ok(acl.rt.unsubscribe_report(reporter.tid, stream))
        assert acl.rt.unsubscribe_report(reporter.tid, stream) == acl.ACL_ERROR_RT_STREAM_NO_CB_REG
    finally:
        gate.set()
        reporter.close()
    assert acl.ACL_ERROR_RT_REPORT_TIMEOUT in reporter.rets


def test_launch_host_func(dev0):
    stream = ok(acl.rt.create_stream())
    seen = []
    ok(acl.rt.launch_host_func(stream, seen.append, "x"))
    ok(acl.rt.launch_host_func(stream, lambda a: 1 / 0, None))           # a failing one does not wedge
    ok(acl.rt.launch_host_func(stream, seen.append, "y"))
    ok(acl.rt.synchronize_stream(stream))
    assert seen == ["x", "y"]


# ---------------------------------------------------------------------------------------------- kernels
def test_kernel_lookup_and_launch_errors(dev0):
    fn = ok(acl.rt.binary_get_function(0, "acl_test_axpy"))
    assert ok(acl.rt.binary_get_function(0, "acl_test_axpy")) == fn
    p = ok(acl.rt.malloc(64))
    assert acl.rt.launch_kernel(fn + 12345, 1, [(p, (16,), acl.ACL_FLOAT)], 0) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.launch_kernel(fn, 1, [(p, (16,), 99)] * 3, 0) == acl.ACL_ERROR_UNSUPPORTED_DATA_TYPE
    assert acl.rt.launch_kernel(fn, 1, [(p, (16,), acl.ACL_FLOAT)], 0, num_outputs=2) == \
        acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.launch_kernel(fn, 1, [(p, (64,), acl.ACL_FLOAT)] * 3, 0) == acl.ACL_ERROR_RT_PARAM_INVALID  # > buffer
    assert acl.rt.register_kernel("acl_test_axpy", oob_kernel) == acl.ACL_ERROR_KERNEL_ALREADY_REGISTERED

    oob = ok(acl.rt.binary_get_function(0, "acl_test_oob"))
    ok(acl.rt.launch_kernel(oob, 1, [(p, (16,), acl.ACL_FLOAT)], 0, num_outputs=0))
    assert acl.rt.synchronize_stream(0) == acl.ACL_ERROR_RT_AICORE_TRAP_WRITE_OVERFLOW
    assert "index 16" in acl.get_recent_err_msg()
    ok(acl.rt.synchronize_stream(0))                                       # the error was reported once

    assert acl.rt.binary_get_function(0, "no_such_kernel")[1] == acl.ACL_ERROR_RT_KERNEL_LOOKUP


def test_model_run_instance_capture_and_replay(dev0):
    """aclmdlRICaptureBegin / GetInfo / End / ExecuteAsync / Execute / Destroy with their codes."""
    n = 64
    x, y, out = np.arange(n, dtype=np.float32), np.ones(n, np.float32), np.zeros(n, np.float32)
    stream = ok(acl.rt.create_stream())
    dx, dy, do = (ok(acl.rt.malloc(x.nbytes)) for _ in range(3))
    ok(acl.rt.memcpy(dy, y.nbytes, acl.util.numpy_to_ptr(y), y.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE))
    fn = ok(acl.rt.binary_get_function(0, "acl_test_axpy"))
    args = [(p, (n,), acl.ACL_FLOAT) for p in (dx, dy, do)]
    assert acl.mdl.ri_capture_end(stream)[1] == 107029                         # STREAM_NOT_CAPTURED
    ok(acl.mdl.ri_capture_begin(stream, 0))
    assert acl.mdl.ri_capture_get_info(stream)[:2] == (1, 0)                     # ACTIVE
    ok(acl.rt.launch_kernel(fn, 2, args, stream, attrs={"alpha": 2.0}))
    assert acl.rt.synchronize_stream(stream) == 107027                           # STREAM_CAPTURED
    ri = ok(acl.mdl.ri_capture_end(stream))
    assert acl.mdl.ri_capture_get_info(stream)[0] == 0
    for k in (1.0, 5.0):
        xs = x * k
        ok(acl.rt.memcpy(dx, xs.nbytes, acl.util.numpy_to_ptr(xs), xs.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE))
        ok(acl.mdl.ri_execute_async(ri, stream))
        ok(acl.rt.synchronize_stream(stream))
        ok(acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, do, out.nbytes, acl.ACL_MEMCPY_DEVICE_TO_HOST))
        np.testing.assert_allclose(out, 2.0 * xs + y)
    ok(acl.mdl.ri_execute(ri, -1))
    ok(acl.mdl.ri_debug_print(ri))
    ok(acl.mdl.ri_destroy(ri))
    assert acl.mdl.ri_execute_async(ri, stream) == acl.ACL_ERROR_RT_PARAM_INVALID
    ok(acl.mdl.ri_capture_begin(stream, 0))                                      # a failed call invalidates
    assert acl.rt.launch_kernel(fn, 1, [(dx, (4 * n,), acl.ACL_FLOAT)] * 3, stream) == \
        acl.ACL_ERROR_RT_PARAM_INVALID                                                    # past the buffer
    assert acl.mdl.ri_capture_get_info(stream)[0] == 2
    assert acl.mdl.ri_capture_end(stream)[1] == 507903
    assert "invalidated" in acl.get_recent_err_msg()
    for p in (dx, dy, do):
        ok(acl.rt.free(p))
    ok(acl.rt.destroy_stream(stream))


# ---------------------------------------------------------------------------------------------- visible devices
def test_visible_devices_renumbering():
    with installed(make_local_runtime(visible="1,3")):
        _reset_acl()
        try:
            ok(acl.init())
            assert ok(acl.rt.get_device_count()) == 2
            assert acl.rt.set_device(2) == acl.ACL_ERROR_RT_INVALID_DEVICEID
            ok(acl.rt.set_device(1))
            p = ok(acl.rt.malloc(128))
            assert ptr_device(p) == 3                          # user id 1 is physical device 3
            ok(acl.rt.set_device(0))
            q = ok(acl.rt.malloc(128))
            assert ptr_device(q) == 1
            ok(acl.rt.memcpy(q, 128, p, 128, acl.ACL_MEMCPY_DEVICE_TO_DEVICE))
            ok(acl.rt.free(p))
            assert acl.get_soc_name() == "Ascend910B3"
            ok(acl.finalize())
        finally:
            acl.finalize()
