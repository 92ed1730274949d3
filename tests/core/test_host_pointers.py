"""runtime.acl checks host pointers like a sanitizer: a pointer that is not inside a live host buffer
(``malloc_host``, or one registered by ``util.numpy_to_ptr`` / ``util.bytes_to_ptr``) is answered with
ACL_ERROR_INVALID_PARAM (100000) and touches nothing.

The bad inputs each run in a SUBPROCESS: before the host-pointer table they crashed the Python process
with SIGSEGV (or hung it), and a crash must show as a failed test, not kill pytest.  Each subprocess also
checks that the device keeps working after the refused call.  The table itself
(:mod:`runtime.hostmem`) is tested in-process below.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from devices.errors import ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_DRV_INTERNAL_ERROR, AclError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PRELUDE = textwrap.dedent("""
    import os, sys
    import numpy as np
    from runtime import acl
    from devices.errors import AclError
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    N = 16 << 20                     # big enough that a freed buffer is unmapped (a real SIGSEGV before)
    dev, ret = acl.rt.malloc(N); assert ret == 0

    def freed(n=N):
        p, ret = acl.rt.malloc_host(n); assert ret == 0
        assert acl.rt.free_host(p) == 0
        return p

    def stream():
        s, ret = acl.rt.create_stream(); assert ret == 0
        return s

    def check_device_still_works():
        x = np.arange(1024, dtype=np.float32)
        out = np.zeros_like(x)
        assert acl.rt.memcpy(dev, x.nbytes, acl.util.numpy_to_ptr(x), x.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
        assert acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, dev, x.nbytes,
                             acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
        assert np.array_equal(out, x)
""")

#: name -> the statement whose result (``ret``) must be 100000
CASES = {
    "memset on freed malloc_host": "ret = acl.rt.memset(freed(), N, 1, N)",
    "memcpy D2H into freed malloc_host": "ret = acl.rt.memcpy(freed(), N, dev, N, acl.ACL_MEMCPY_DEVICE_TO_HOST)",
    "memcpy H2D from freed malloc_host": "ret = acl.rt.memcpy(dev, N, freed(), N, acl.ACL_MEMCPY_HOST_TO_DEVICE)",
    "memcpy H2H between freed buffers": "ret = acl.rt.memcpy(freed(), N, freed(), N, acl.ACL_MEMCPY_HOST_TO_HOST)",
    "memcpy_async D2H into freed malloc_host":
        "s = stream(); ret = acl.rt.memcpy_async(freed(), N, dev, N, acl.ACL_MEMCPY_DEVICE_TO_HOST, s); "
        "assert acl.rt.synchronize_stream(s) == 0",
    "memcpy_async H2D from freed malloc_host":
        "s = stream(); ret = acl.rt.memcpy_async(dev, N, freed(), N, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)",
    "memset at 0x10": "ret = acl.rt.memset(0x10, 8, 1, 8)",
    "memset at 0x1000": "ret = acl.rt.memset(0x1000, 64, 1, 64)",
    "memcpy D2H to 0x1000": "ret = acl.rt.memcpy(0x1000, 64, dev, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST)",
    "memcpy H2D from 0x10": "ret = acl.rt.memcpy(dev, 64, 0x10, 64, acl.ACL_MEMCPY_HOST_TO_DEVICE)",
    "memcpy_async D2H to 0x1000":
        "s = stream(); ret = acl.rt.memcpy_async(0x1000, 64, dev, 64, acl.ACL_MEMCPY_DEVICE_TO_HOST, s); "
        "assert acl.rt.synchronize_stream(s) == 0",
    "memcpy_async H2D from 0x10":
        "s = stream(); ret = acl.rt.memcpy_async(dev, 64, 0x10, 64, acl.ACL_MEMCPY_HOST_TO_DEVICE, s)",
    "ptr_to_bytes of 0x10": textwrap.dedent("""
        try:
            acl.util.ptr_to_bytes(0x10, 8); ret = 0
        except AclError as e:
            ret = e.code
        """),
    "ptr_to_numpy of 0x1000": textwrap.dedent("""
        try:
            acl.util.ptr_to_numpy(0x1000, (16,), np.dtype(np.float32).num); ret = 0
        except AclError as e:
            ret = e.code
        """),
    "memset 1 MiB into a 1-byte malloc_host buffer":
        "p, _ = acl.rt.malloc_host(1); ret = acl.rt.memset(p, 1 << 20, 7, 1 << 20)",
    "memcpy 1 MiB into a 1-byte malloc_host buffer":
        "p, _ = acl.rt.malloc_host(1); ret = acl.rt.memcpy(p, 1 << 20, dev, 1 << 20, acl.ACL_MEMCPY_DEVICE_TO_HOST)",
    "memcpy_async 1 MiB into a 1-byte malloc_host buffer":
        "p, _ = acl.rt.malloc_host(1); s = stream(); "
        "ret = acl.rt.memcpy_async(p, 1 << 20, dev, 1 << 20, acl.ACL_MEMCPY_DEVICE_TO_HOST, s)",
    "memcpy past the end of a registered numpy array":
        "a = np.zeros(4, np.uint8); ret = acl.rt.memcpy(acl.util.numpy_to_ptr(a), 1 << 20, dev, 1 << 20, "
        "acl.ACL_MEMCPY_DEVICE_TO_HOST)",
    "memcpy from a pointer inside a dead numpy array": textwrap.dedent("""
        a = np.ones(N, np.uint8); p = acl.util.numpy_to_ptr(a)
        del a
        keep = [np.zeros(1, np.uint8) for _ in range(2000)]        # later registrations push it out of the
        for k in keep:                                             # grace LRU: it is tracked weakly now
            acl.util.numpy_to_ptr(k)
        ret = acl.rt.memcpy(dev, N, p, N, acl.ACL_MEMCPY_HOST_TO_DEVICE)
        """),
}

#: the cases CANN answers with a code of its own rather than crashing: aclrtMemset of freed malloc_host
#: memory fails in the A2 (910B) driver (drvMemsetD8 on a freed SVM host address: EINVAL ->
#: DRV_ERROR_PARA_ERROR, which the runtime does not map -> ACL_ERROR_RT_DRV_INTERNAL_ERROR)
EXPECTED = {"memset on freed malloc_host": ACL_ERROR_RT_DRV_INTERNAL_ERROR}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_host_pointer_is_refused_not_a_crash(case):
    script = _PRELUDE + CASES[case] + textwrap.dedent("""
        print("RET", ret, acl.get_recent_err_msg(), flush=True)
        check_device_still_works()
        assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
        print("DEVICE OK", flush=True)
        """)
    env = dict(os.environ, VNPU_DEVICES="1", VNPU_HBM_BYTES=str(64 << 20), OPENBLAS_NUM_THREADS="1")
    env.pop("VNPU_BACKEND", None)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=env)
    assert p.returncode == 0, f"exit {p.returncode} (negative: killed by signal {-p.returncode})\n" \
                              f"{p.stdout[-2000:]}{p.stderr[-3000:]}"
    ret_line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RET "))
    assert ret_line.split()[1] == str(EXPECTED.get(case, ACL_ERROR_INVALID_PARAM)), ret_line
    assert "DEVICE OK" in p.stdout


# ---------------------------------------------------------------------------------------------- the table
@pytest.fixture
def table():
    from runtime.hostmem import HostMemoryTable
    return HostMemoryTable(max_strong_objects=4, max_strong_bytes=1 << 20)


def test_lookup_answers_only_live_ranges(table):
    a = np.arange(64, dtype=np.uint8)
    p = a.ctypes.data
    table.register(p, a.nbytes, a, kind="numpy")
    r = table.lookup(p + 8, 16)
    assert (r.start, r.nbytes, r.kind) == (p, 64, "numpy")
    np.testing.assert_array_equal(r.view(p + 8, 16), a[8:24])
    r.view(p, 4)[:] = 200                                          # a writable view of the same bytes
    assert list(a[:4]) == [200] * 4
    for bad in ((p + 60, 8), (p - 1, 2), (p, 65), (0x10, 1), (p, -1)):
        with pytest.raises(AclError) as ei:
            table.lookup(*bad)
        assert ei.value.code == ACL_ERROR_INVALID_PARAM


def test_release_makes_a_range_freed(table):
    buf = np.empty(128, np.uint8)
    p = buf.ctypes.data
    table.register(p, 128, buf, kind="malloc_host")
    assert table.release(p, kind="malloc_host").nbytes == 128
    with pytest.raises(AclError) as ei:
        table.lookup(p, 1)
    assert ei.value.code == ACL_ERROR_INVALID_PARAM and "freed" in ei.value.detail
    with pytest.raises(AclError) as ei:
        table.release(p, kind="malloc_host")                      # double free
    assert ei.value.code == ACL_ERROR_INVALID_PARAM, ei.value
    with pytest.raises(AclError) as ei:
        table.release(p + 1, kind="malloc_host")                  # not the start of an allocation
    assert ei.value.code == ACL_ERROR_INVALID_PARAM, ei.value


def test_a_registered_array_stays_valid_while_alive_and_not_after(table):
    """Registrations hold a grace reference (bounded LRU); past it a numpy array is tracked weakly:
    valid while the caller holds it, refused once it is gone."""
    keep = np.ones(1000, np.uint8)
    pk = keep.ctypes.data
    table.register(pk, keep.nbytes, keep, kind="numpy")
    tmp = np.ones(1000, np.uint8)
    pt = tmp.ctypes.data
    table.register(pt, tmp.nbytes, tmp, kind="numpy")
    for _ in range(10):                                           # push both out of the strong LRU
        x = np.ones(10, np.uint8)
        table.register(x.ctypes.data, 10, x, kind="numpy")
    del tmp
    gc.collect()
    assert table.lookup(pk, 1000).start == pk
    with pytest.raises(AclError) as ei:
        table.lookup(pt, 1000)
    assert ei.value.code == ACL_ERROR_INVALID_PARAM


def test_a_held_range_keeps_its_memory(table):
    """A range returned by lookup pins its buffer (an async copy holds it until it ran)."""
    buf = np.zeros(1 << 16, np.uint8)
    p = buf.ctypes.data
    table.register(p, buf.nbytes, buf, kind="malloc_host")
    r = table.lookup(p, buf.nbytes)
    table.release(p, kind="malloc_host")
    del buf
    gc.collect()
    r.view(p, 1 << 16)[:] = 3                                     # still mapped: the range holds it
    assert int(r.view(p, 1 << 16).sum()) == 3 << 16


def test_overlapping_registrations(table):
    a = np.arange(256, dtype=np.uint8)
    table.register(a.ctypes.data, 256, a, kind="numpy")
    v = a[100:110]
    table.register(v.ctypes.data, 10, v, kind="numpy")
    assert table.lookup(a.ctypes.data + 120, 100).start == a.ctypes.data     # the enclosing one answers
    assert table.lookup(v.ctypes.data, 10).nbytes in (10, 256)
