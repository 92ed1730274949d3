"""runtime.torch: the ``torch.npu`` module (streams, events, memory, seeds), the CPU fallback (warned once,
counted, an error under VNPU_TORCH_STRICT=1), use after the memory is gone, and that npu work is vnpu
work: the profiler records its kernels, the sanitizer checks them.  In-process devices."""
from __future__ import annotations

import gc
import io
import warnings

import pytest
import torch

import runtime.torch as rtorch
from conftest import TEST_ARENA, installed, make_local_runtime
from devices.device import DeviceConfig
from devices.errors import ACL_ERROR_RT_FEATURE_NOT_SUPPORT
from runtime import profiler
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.sanitize import SanitizeOptions, Session


@pytest.fixture(scope="module", autouse=True)
def npu_runtime():
    with installed(make_local_runtime(2)) as r:
        yield r


def test_device_queries():
    assert torch.npu.is_available() and torch.npu.device_count() == 2
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1
        assert torch.ones(1, device="npu").device.index == 1
    assert torch.npu.current_device() == 0
    torch.npu.synchronize()
    torch.npu.synchronize("npu:1")


def test_stream_context_runs_work_on_that_vnpu_stream(npu_runtime):
    a = torch.randn(16, 16)
    x = a.npu()
    s = torch.npu.Stream()
    assert s.vstream.sid != torch.npu.default_stream().vstream.sid
    with profiler.recording(runtime=npu_runtime) as p:
        with torch.npu.stream(s):
            assert torch.npu.current_stream() == s
            y = torch.matmul(x, x)
            done = s.record_event()
        torch.npu.current_stream().wait_event(done)     # default stream work after s's matmul
        z = y + 1
        torch.npu.synchronize()
    tasks = [t for d in p.raw.devices for t in d["tasks"]]
    mm = [t for t in tasks if t["name"] == "matmul"]
    assert len(mm) == 1 and mm[0]["stream"] == s.vstream.sid
    assert any(t["name"] == "add_scalar" and t["stream"] == torch.npu.default_stream().vstream.sid for t in tasks)
    torch.testing.assert_close(z.cpu(), a @ a + 1, rtol=1e-5, atol=1e-4)


def test_events_order_streams_and_time_on_the_modeled_clock():
    s1, s2 = torch.npu.Stream(), torch.npu.Stream()
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    x = torch.ones(64, 64, device="npu")
    start.record(s1)
    with torch.npu.stream(s1):
        y = x @ x
    end.record(s1)
    s2.wait_event(end)
    with torch.npu.stream(s2):
        z = y * 2
    s2.synchronize()
    assert end.query() and start.query()
    assert start.elapsed_time(end) > 0                 # the cost model priced a 64x64x64 GEMM
    assert torch.equal(z.cpu(), torch.full((64, 64), 128.0))
    s2.wait_stream(s1)


def test_event_of_one_device_on_a_stream_of_another_is_refused():
    e = torch.npu.Event()
    e.record(torch.npu.Stream(0))
    with pytest.raises(rtorch.NpuDeviceMismatchError):
        e.record(torch.npu.Stream(1))


def test_memory_figures_follow_the_caching_pool():
    torch.npu.empty_cache()
    base = torch.npu.memory_allocated()
    torch.npu.reset_peak_memory_stats()
    x = torch.empty(1 << 18, device="npu")             # 1 MiB
    assert torch.npu.memory_allocated() >= base + (1 << 20)
    assert torch.npu.memory_reserved() >= torch.npu.memory_allocated()
    peak = torch.npu.max_memory_allocated()
    assert peak >= base + (1 << 20)
    del x
    assert torch.npu.memory_allocated() == base         # back to the pool at once
    assert torch.npu.max_memory_allocated() == peak
    reserved = torch.npu.memory_reserved()
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved() < reserved
    stats = torch.npu.memory_stats()
    assert stats["allocated_bytes.all.peak"] == peak and "reserved_bytes.all.current" in stats
    free, total = torch.npu.mem_get_info()
    assert 0 < free <= total == TEST_ARENA


def test_seeds_make_npu_random_numbers_repeatable():
    torch.manual_seed(3)                                # also seeds torch.npu (manual_seed_all)
    a = torch.rand(5, device="npu").cpu()
    torch.npu.manual_seed(3)
    b = torch.rand(5, device="npu").cpu()
    assert torch.equal(a, b) and 0 <= float(a.min()) and float(a.max()) < 1
    state = torch.npu.get_rng_state()
    c = torch.randn(3, device="npu").cpu()
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.randn(3, device="npu").cpu(), c)


def test_fallback_warns_once_counts_and_gives_cpu_results():
    rtorch.reset_fallback_counts()
    a = torch.randn(4, 9)
    x = a.npu()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        v1, i1 = torch.topk(x, 3)
        v2, _ = torch.topk(x * 2, 3)
    msgs = [str(m.message) for m in w if issubclass(m.category, rtorch.NpuFallbackWarning)]
    assert len(msgs) == 1 and "aten::topk has no vnpu kernel" in msgs[0]
    assert rtorch.fallback_counts() == {"aten::topk": 2}
    assert v1.device.type == "npu" and i1.device.type == "npu"
    want_v, want_i = torch.topk(a, 3)
    assert torch.equal(v1.cpu(), want_v) and torch.equal(i1.cpu(), want_i) and torch.equal(v2.cpu(), want_v * 2)


def test_fallback_writes_back_in_place_results():
    rtorch.reset_fallback_counts()
    a = torch.tensor([3.0, 1.0, 2.0])
    x = a.npu()
    x.fmod_(2.0)                                        # in place, no vnpu kernel
    assert torch.equal(x.cpu(), a.fmod(2.0)) and rtorch.fallback_counts() == {"aten::fmod_.Scalar": 1}


def test_strict_mode_makes_a_fallback_a_typed_error(monkeypatch):
    monkeypatch.setenv("VNPU_TORCH_STRICT", "1")
    x = torch.randn(3, 4).npu()
    with pytest.raises(rtorch.NpuFallbackError, match=r"aten::topk has no vnpu kernel.*VNPU_TORCH_STRICT=1") as e:
        torch.topk(x, 2)
    assert e.value.code == ACL_ERROR_RT_FEATURE_NOT_SUPPORT
    assert isinstance(e.value, RuntimeError)
    assert torch.equal((x + 1).cpu(), x.cpu() + 1)       # kernels still run


def test_memory_of_a_closed_runtime_is_a_typed_error():
    with installed(make_local_runtime(1)):
        x = torch.ones(3, device="npu")
        assert torch.equal(x.cpu(), torch.ones(3))
    with pytest.raises(rtorch.NpuStorageFreedError, match="use after free"):
        x.cpu()
    with pytest.raises(rtorch.NpuStorageFreedError):
        x + 1


def test_npu_tensor_helpers_refuse_cpu_tensors_and_strided_views():
    with pytest.raises(rtorch.NpuDeviceMismatchError, match="expected an npu tensor"):
        rtorch.device_ptr(torch.ones(2))
    x = torch.ones(4, 4, device="npu")
    with pytest.raises(rtorch.NpuDeviceMismatchError, match="contiguous"):
        rtorch.device_bytes(x.t())
    b = rtorch.device_bytes(x[1])
    assert b.nbytes == 16 and b.ptr == rtorch.device_ptr(x) + 16


def test_sanitizer_finds_nothing_wrong_in_npu_work():
    """memcheck, racecheck, initcheck, leakcheck over views, strided writes, GEMMs and a fallback round trip."""
    out = io.StringIO()
    s = Session(SanitizeOptions(tools=("memcheck", "racecheck", "initcheck", "leakcheck")), out=out)
    with installed(Runtime(LocalBackend(1, DeviceConfig(arena_bytes=TEST_ARENA)), sanitizer=s)):
        a = torch.randn(8, 8)
        x = a.npu()
        x[:, 2] = x[:, 3] * 2
        y = torch.nn.functional.linear(x, x, x[0]).softmax(-1)
        z = torch.topk(y, 2).values.sum()
        a[:, 2] = a[:, 3] * 2
        want = torch.topk(torch.nn.functional.linear(a, a, a[0]).softmax(-1), 2).values.sum()
        got = z.cpu()
        del x, y, z
        gc.collect()
        torch.npu.synchronize()                         # the queued frees (uncached pool) have run
    s.finish()
    assert [f.message for f in s.findings] == []
    assert s.counts()["tasks"] >= 6
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
