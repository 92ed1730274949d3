"""The engine lifecycle base (runtime/serve/engine/lifecycle.py) on its own, under a tiny engine of the
test's: each request is a float32 vector, a batch of them is multiplied by a weight vector held in the HBM
of the placement's device (one ``mul`` launch on in-process devices; the CPU fallback device last).

What the base owns is checked through that engine with real threads and real device faults: the engine
thread holds between two steps for ``paused()`` (requests queue meanwhile); a ``fallback`` requested
while held waits for the boundary and runs before the queued batch, which runs on the new placement;
``restore``/``away_from``/the last entry; a device killed between batches moves the engine down the chain
by itself, and with no entry left the engine fails (every request answered, later ones refused); a task
exception fails only its batch; ``drain`` stops admission and waits for what is in flight; ``shutdown``
lets a holder go, refuses what was pending and gives the HBM back; admission of n requests is all or
none.  Then the generation engine's ``add_requests`` (serve tier: a real SmolLM2 engine): one bad prompt
among n refuses them all before anything is queued or admitted, and the engine applies its defaults.

No sleeps: every wait is on a condition or a future, with a deadline.
"""
from __future__ import annotations

import contextlib
import threading
from collections import deque
from concurrent.futures import Future

import numpy as np
import pytest

from devices.device import DeviceConfig
from devices.errors import DeviceLostError
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.engine import EngineLifecycle, InvalidRequest, QueueFull, Unavailable
from runtime.serve.engine.errors import EngineFailure
from runtime.serve.engine.placement import Placement

D = 16                                      #: the vector length of a request
W = np.linspace(0.5, 2.0, D, dtype=np.float32)
WAIT = 60.0                                 #: the deadline of every wait (seconds)


class _Scaler:
    """What the tiny engine builds on a device list: the weights in the first device's HBM."""

    def __init__(self, devices: list):
        self.devices = devices
        self.dev = devices[0]
        self.w = self.dev.from_numpy(W)

    def run(self, xs: np.ndarray) -> np.ndarray:
        x, out = self.dev.from_numpy(xs), self.dev.empty(xs.shape)
        try:
            self.dev.default_stream.launch("mul", [x, self.w], [out])
            return out.numpy()
        finally:
            x.free()
            out.free()

    def close(self) -> None:
        self.w.free()
        self.dev.empty_cache()


class ScaleEngine(EngineLifecycle):
    """A third engine on the base, written as the compiled-model engine would be: its build, its requests
    (futures), its step (a pure function of its inputs, run through the base's replayable call)."""

    kind = "scale"
    thread_name = "scale"

    def __init__(self, rt, devices=(0,), fallback=(), max_batch: int = 4, max_queued: int = 8):
        super().__init__(rt, "scale", devices, fallback)
        self.max_batch, self.max_queued = max_batch, max_queued
        self._q: deque[tuple[np.ndarray, Future]] = deque()
        self.batches: list[tuple[str, int, bool]] = []        #: (placement, requests, re-run after a loss)
        self.failed: list[BaseException] = []
        self._open()

    def add_requests(self, xs: list[np.ndarray]) -> list[Future]:
        futs = [Future() for _ in xs]
        with self._admitting(len(xs)):
            self._q.extend(zip(xs, futs))
        return futs

    def step(self) -> None:
        """One batch on the caller's thread (an engine without a thread is stepped by its caller)."""
        self._step()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._q)

    def _build(self, devices):
        return _Scaler(devices)

    def _has_work(self) -> bool:
        return bool(self._q)

    def _queue_state(self):
        return len(self._q), self.max_queued, self.max_queued

    def _step(self) -> None:
        with self._lock:
            batch = [self._q.popleft() for _ in range(min(len(self._q), self.max_batch))]
        if not batch:
            return
        try:
            out, rerun = self._run_on_placement(lambda s: s.run(np.stack([x for x, _ in batch])), len(batch))
        except (EngineFailure, Unavailable) as e:
            self.failed.append(e)
            for _, f in batch:
                f.set_exception(e)
            self._retired(len(batch))
            return
        self.batches.append((str(self.placement), len(batch), rerun))
        for i, (_, f) in enumerate(batch):
            f.set_result(out[i])
        self._retired(len(batch))

    def _drop(self, e: BaseException) -> None:
        with self._lock:
            left, self._q = list(self._q), deque()
        for _, f in left:
            f.set_exception(e)
        self._retired(len(left))

    def _fail_requests(self, msg: str) -> None:
        self._drop(Unavailable(f"the scale engine failed: {msg}"))

    def _abort_requests(self) -> None:
        self._drop(Unavailable("the scale engine shut down"))


def _xs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(D).astype(np.float32) for _ in range(n)]


def _results(futs: list[Future], xs: list[np.ndarray]) -> None:
    """Every future holds its own vector times the weights (float32 multiply: exact)."""
    for f, x in zip(futs, xs):
        np.testing.assert_array_equal(f.result(WAIT), x * W)


def _kill(rt, i: int) -> None:
    with contextlib.suppress(DeviceLostError):          # the call itself may report the loss
        rt.device(i).handle.inject_fault("kill")


@pytest.fixture
def rt():
    r = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=64 << 20)))
    yield r
    r.close()


def test_a_fallback_requested_while_paused_runs_at_the_boundary_before_the_queued_batch(rt):
    eng = ScaleEngine(rt, (0,), fallback=(Placement((1,)), Placement(cpu=True)))
    try:
        eng.start()
        first = _xs(2, 1)
        _results(eng.add_requests(first), first)
        assert eng.batches == [("npu 0", 2, False)]
        res = {}
        with eng.paused(WAIT):                           # the engine thread is held between two steps
            xs = _xs(3, 2)
            futs = eng.add_requests(xs)                  # requests queue, nothing runs
            assert eng.wait_until(lambda e: e.waiting == 3, WAIT) and not any(f.done() for f in futs)
            fb = threading.Thread(target=lambda: res.setdefault("fb", eng.fallback("test")))
            fb.start()
            assert eng.wait_until(lambda e: e.pending_rebinds == 1, WAIT)
            assert eng.placement == Placement((0,)) and len(eng.batches) == 1
        fb.join(WAIT)
        _results(futs, xs)
        r = res["fb"]
        assert (r.moved, r.from_index, r.to_index, r.placement, r.replayed) == (True, 0, 1, "npu 1", 0)
        assert eng.batches[1:] == [("npu 1", 3, False)]  # the queued batch ran on the new placement
        assert [d.index for d in eng.devices] == [1] and eng.pending_rebinds == 0
        off = eng.fallback(away_from=0)                  # already off device 0: nothing to do
        assert not off.moved and eng.placement == Placement((1,))
        assert eng.fallback().placement == "cpu"
        with pytest.raises(Unavailable, match="last entry"):
            eng.fallback()
        back = eng.restore(WAIT)
        assert back.moved and (back.from_index, back.to_index) == (2, 0) and not eng.restore(WAIT).moved
        assert [(e["kind"], e["ok"]) for e in eng.events] == [("fallback", True), ("fallback", True),
                                                             ("restore", True)]
        assert eng.rebinds == 3 and eng.error is None
    finally:
        eng.shutdown()


def test_a_lost_device_moves_the_engine_down_the_chain_then_it_fails_with_nowhere_left(rt):
    eng = ScaleEngine(rt, (0,), fallback=(Placement((1,)),))
    try:
        eng.start()
        _kill(rt, 0)
        xs = _xs(2, 3)
        _results(eng.add_requests(xs), xs)               # moved by itself before the batch; nothing lost
        ev = eng.events[-1]
        assert ev["kind"] == "fallback" and ev["reason"].startswith("automatic: device 0 is lost")
        assert eng.placement == Placement((1,)) and eng.batches == [("npu 1", 2, False)]
        with pytest.raises(Unavailable, match="device 0 is lost"):
            eng.restore(WAIT)                            # the primary is lost: restore refused, nothing moves
        _kill(rt, 1)
        futs = eng.add_requests(_xs(2, 4))
        for f in futs:                                   # every request answered, none left hanging
            with pytest.raises(Unavailable, match="no fallback is left"):
                f.result(WAIT)
        assert eng.wait_idle(WAIT) and not eng.has_unfinished() and not eng.accepting
        assert "no fallback is left" in eng.error
        with pytest.raises(Unavailable, match="engine failed"):
            eng.add_requests(_xs(1))
        with pytest.raises(Unavailable, match="engine failed"):
            eng.fallback()
    finally:
        eng.shutdown()


def test_a_task_exception_fails_only_its_batch(rt):
    eng = ScaleEngine(rt, (0,), fallback=(Placement((1,)),))
    try:
        eng.start()
        rt.device(0).handle.inject_fault("task-fail", count=1)
        with pytest.raises(EngineFailure, match="ACL_ERROR_RT_AICORE_EXCEPTION"):
            eng.add_requests(_xs(1))[0].result(WAIT)
        xs = _xs(3, 5)
        _results(eng.add_requests(xs), xs)               # the engine serves on, where it was
        assert eng.error is None and eng.placement == Placement((0,)) and eng.events == []
    finally:
        eng.shutdown()


def test_drain_stops_admission_and_waits_for_what_is_in_flight(rt):
    eng = ScaleEngine(rt, (0,))
    try:
        eng.start()
        xs = _xs(3, 6)
        with eng.paused(WAIT):
            futs = eng.add_requests(xs)
            assert not eng.drain(0) and not eng.accepting and eng.has_unfinished()
            with pytest.raises(Unavailable, match="draining"):
                eng.add_requests(_xs(1))
        assert eng.drain(WAIT) and not eng.has_unfinished()
        _results(futs, xs)
    finally:
        eng.shutdown()


def test_shutdown_lets_a_holder_go_refuses_what_was_pending_and_frees_the_hbm(rt):
    d = rt.device(0)
    base = d.mem_info()
    eng = ScaleEngine(rt, (0,), fallback=(Placement((1,)),))
    assert d.mem_info()[0] < base[0]                     # the weights are in HBM
    eng.start()
    res: dict = {}

    def ask_fallback():
        try:
            eng.fallback()
        except Unavailable as e:
            res["fb"] = e
    with eng.paused(WAIT):
        futs = eng.add_requests(_xs(2, 7))
        fb = threading.Thread(target=ask_fallback)
        fb.start()
        assert eng.wait_until(lambda e: e.pending_rebinds == 1, WAIT)
        eng.shutdown()                                   # from inside the hold: the engine thread is let go
    fb.join(WAIT)
    assert "shutting down" in str(res["fb"])
    for f in futs:
        with pytest.raises(Unavailable, match="shut down"):
            f.result(0)
    assert not eng.has_unfinished() and eng.devices == []
    assert not any(t.name == "vnpu-scale-scale" for t in threading.enumerate())
    with pytest.raises(Unavailable, match="shutting down"):
        eng.fallback()
    with pytest.raises(Unavailable, match="shutting down"):
        with eng.paused(WAIT):
            pass
    with pytest.raises(Unavailable):
        eng.add_requests(_xs(1))
    assert d.mem_info() == base                          # HBM back to baseline


def test_admission_of_n_requests_is_all_or_none(rt):
    eng = ScaleEngine(rt, (0,), max_queued=4)
    try:
        held = eng.add_requests(_xs(3, 8))               # no thread yet: they wait
        with pytest.raises(QueueFull, match="3 requests waiting .*max_queued_requests=4"):
            eng.add_requests(_xs(2))                     # room for one of the two: neither is queued
        assert eng.waiting == 3
        last = eng.add_requests(_xs(1, 9))
        assert eng.waiting == 4
        eng.step()                                       # stepped by the caller: one batch of 4
        assert eng.waiting == 0 and all(f.done() for f in held + last) and not eng.has_unfinished()
        assert eng.batches == [("npu 0", 4, False)]
    finally:
        eng.shutdown()


def test_an_engine_without_a_thread_is_stepped_by_its_caller(rt):
    eng = ScaleEngine(rt, (0,), fallback=(Placement((1,)),))
    try:
        xs = _xs(2, 10)
        futs = eng.add_requests(xs)
        with eng.paused(0):                              # the caller is the one stepping: no wait
            assert not any(f.done() for f in futs)
        r = eng.fallback()                               # runs here, on the caller's thread
        assert r.moved and eng.placement == Placement((1,)) and eng.waiting == 2
        eng.step()
        _results(futs, xs)
        assert eng.batches == [("npu 1", 2, False)] and eng.wait_idle(0)
    finally:
        eng.shutdown()


# ---------------------------------------------------------------------------------------------- generation
@pytest.fixture(scope="module")
def gen():
    from runtime.serve.engine import EngineConfig, GenerateEngine
    r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    e = GenerateEngine(r, "smollm2", [0], EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                                                       num_gpu_blocks_override=24, max_queued_requests=4))
    try:
        yield e
    finally:
        e.shutdown()
        r.close()


@pytest.mark.serve
def test_add_requests_refuses_all_when_one_prompt_is_bad(gen):
    from runtime.serve.engine import SamplingParams
    ok = gen.encode("the npu runs")
    admitted: list[int] = []
    sp = SamplingParams(max_tokens=4, temperature=0)
    with pytest.raises(InvalidRequest) as e:             # the second of three is beyond the context
        gen.add_requests([ok, list(range(1, 70)), ok], sp, admit=admitted.append)
    assert (e.value.param, e.value.code) == ("prompt", "context_length_exceeded")
    with pytest.raises(InvalidRequest) as e:             # a priority the fcfs policy does not take
        gen.add_requests([ok, ok], sp, priority=3, prompt_param="messages", admit=admitted.append)
    assert e.value.param == "priority"
    with pytest.raises(InvalidRequest) as e:             # more prompts than could ever be queued
        gen.add_requests([ok] * 5, sp, admit=admitted.append)
    assert (e.value.param, e.value.code) == ("prompt", "too_many_prompts")
    with pytest.raises(InvalidRequest, match="already in use"):
        gen.add_requests([ok, ok], sp, request_ids=["same", "same"], admit=admitted.append)
    def refuse(tokens):
        raise QueueFull("over quota")
    with pytest.raises(QueueFull, match="over quota"):      # the caller's admission refuses them all
        gen.add_requests([ok, ok], sp, admit=refuse)
    assert admitted == [2 * (len(ok) + 4)]               # only the id clash got past the checks and admission
    assert not gen.has_unfinished() and gen.snapshot().waiting == 0
    gen.step()
    assert gen.snapshot().running == 0                   # nothing was queued


@pytest.mark.serve
def test_add_requests_applies_the_engine_defaults_and_queues_all(gen):
    from runtime.serve.engine import SamplingParams
    short, long = gen.encode("one"), list(range(1, gen.capacity_tokens - 5))     # the long one leaves 6 tokens
    seen: list = []
    admitted: list[int] = []
    hs = gen.add_requests([short, long], SamplingParams(max_tokens=None, temperature=0, ignore_eos=True),
                          on_output=lambda i, o: seen.append(i), admit=admitted.append)
    default = gen.capacity_tokens - len(long)            # what the context leaves after the longest prompt
    assert default == 6 and admitted == [len(short) + len(long) + 2 * default]
    while gen.has_unfinished():
        gen.step()
    outs = [h.result(0) for h in hs]
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert [o.completion_tokens for o in outs] == [default, default] and set(seen) == {0, 1}
