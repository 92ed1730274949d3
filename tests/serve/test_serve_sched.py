"""Priorities, aging and scheduler modes (serve tier).

Pure logic symbolically (no device): the priority policy's order and aging on explicit clocks, the
scheduler under random interleavings (every request finishes, the high class first, block tables of
different requests never share a block), the modes' limits against their definitions.  Then one real
engine (SmolLM2 on an in-process device, stepped by the test on an injectable clock): a high class
finishes first under contention while the low class still finishes, aging lets a long-waiting low
request run before a fresh high one, and every mode's limits hold at every step."""
from __future__ import annotations

import math
import random
import time

import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.engine import EngineConfig, GenerateEngine, InvalidRequest, SamplingParams
from runtime.serve.engine.block_manager import BlockManager
from runtime.serve.engine.modes import (MODES, LoadTracker, ModeConfig, Observation, StepLimits, adaptive,
                                        predicted_latency_s, throttled)
from runtime.serve.engine.policies import FcfsPolicy, PriorityPolicy
from runtime.serve.engine.request import Request
from runtime.serve.engine.scheduler import Scheduler

pytestmark = pytest.mark.serve


def _req(prio: int, t: float, n_prompt: int = 4, max_tokens: int = 4) -> Request:
    return Request(list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens, temperature=0),
                   priority=prio, arrival=t)


# ---------------------------------------------------------------------------------------------- policies
def test_priority_order_and_aging():
    p = PriorityPolicy(aging_s=10.0)
    low, high, high2 = _req(10, 0.0), _req(0, 1.0), _req(0, 2.0)
    order = lambda now, *more: list(p.order([high2, low, high, *more], now))          # noqa: E731
    assert order(2.0) == [high, high2, low]                    # lower value first, ties by arrival
    assert p.aged(low, 50.0) == pytest.approx(5.0)             # 50 s of waiting: five classes more urgent
    late = _req(0, 104.0)                                      # a high-class request arriving 104 s later ...
    assert order(105.0, late) == [high, high2, low, late]      # ... queues behind the low one that waited 105 s
    assert order(50.0, _req(0, 49.0))[2] is not low            # (at 50 s it still went first)
    assert PriorityPolicy(math.inf).aged(low, 1e9) == 10       # inf: no aging
    assert p.victim([high, low, high2], 3.0) is low            # max by (priority, arrival)
    assert p.victim([high, high2], 3.0) is high2
    assert p.displaces(high, low, 3.0) and not p.displaces(high2, high, 3.0)   # strictly more urgent only
    assert not p.displaces(_req(0, 199.0), low, 200.0)         # a request that waited long is not displaced forever
    f = FcfsPolicy()
    assert list(f.order([high2, low], 0)) == [high2, low] and not f.displaces(high, low, 0)


def _simulate(s: Scheduler, reqs_at: dict[int, list[Request]], steps: int, dt: float = 1.0):
    """Run the scheduler without a device: every scheduled request computes its tokens; a sampling one
    gets a token; finished ones leave.  Checks block-table isolation at every step.  Returns finish order."""
    done, t = [], 0.0
    for k in range(steps):
        for r in reqs_at.get(k, []):
            s.add(r)
        out = s.schedule(None, t)
        tables = [set(s.blocks.table(r.request_id)) for r in s.running]
        flat = [b for tb in tables for b in tb]
        assert len(flat) == len(set(flat)) and 0 not in flat       # no block in two tables, null never handed out
        s.advance(out)
        for x in out.scheduled:
            if x.samples:
                x.request.output_ids.append(7)
                if len(x.request.output_ids) >= x.request.params.max_tokens:
                    s.remove(x.request)
                    done.append(x.request)
        t += dt
        if not s.running and not s.waiting and k > max(reqs_at, default=0):
            break
    return done


def test_high_class_first_low_still_finishes_and_aging_prevents_starvation():
    cfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=16, block_size=4, max_model_len=64,
                       scheduling_policy="priority", priority_aging_s=5.0)
    s = Scheduler(cfg, BlockManager(64, 4))
    low = [_req(10, 0.0, max_tokens=8) for _ in range(2)]
    high = [_req(0, 1.0, max_tokens=3) for _ in range(2)]
    done = _simulate(s, {0: low, 1: high}, 100)
    assert done[:2] == high and set(done[2:]) == set(low)     # the high class displaced the low one and finished first
    assert s.num_displaced >= 1 and not s.running and s.blocks.pool.num_free == 63
    # a steady stream of high-class requests (one new every step, each needing 2 steps) on a batch of one:
    # without aging the low request never runs; with aging it does.
    for aging, expect in ((math.inf, False), (5.0, True)):
        cfg = EngineConfig(max_num_seqs=1, max_num_batched_tokens=16, block_size=4, max_model_len=64,
                           scheduling_policy="priority", priority_aging_s=aging)
        s = Scheduler(cfg, BlockManager(64, 4))
        victim = _req(10, 0.0, max_tokens=2)
        stream = {k: [_req(0, float(k), max_tokens=2)] for k in range(1, 200)}
        stream[0] = [victim]
        done = _simulate(s, stream, 200)
        assert (victim in done) is expect, aging


@pytest.mark.parametrize("seed", range(6))
def test_random_interleavings_everything_finishes_in_class_order(seed):
    """Random arrivals of three classes with random lengths into a small KV cache (preemptions happen):
    every request finishes, blocks all come back, and with aging off no low-class request that arrived
    with a high-class one waiting finishes before it ... checked as: the mean finish rank grows with the class."""
    rng = random.Random(seed)
    cfg = EngineConfig(max_num_seqs=3, max_num_batched_tokens=12, block_size=4, max_model_len=64,
                       scheduling_policy="priority", priority_aging_s=math.inf)
    s = Scheduler(cfg, BlockManager(13, 4))                       # 12 usable blocks = 48 tokens
    arrivals: dict[int, list[Request]] = {}
    reqs = []
    for k in range(30):
        r = _req(rng.choice([0, 5, 10]), 0.0, n_prompt=rng.randint(1, 9), max_tokens=rng.randint(1, 8))
        reqs.append(r)
        arrivals.setdefault(0, []).append(r)
    done = _simulate(s, arrivals, 2000)
    assert set(done) == set(reqs) and s.blocks.pool.num_free == 12
    rank = {r.request_id: i for i, r in enumerate(done)}
    mean = {c: sum(rank[r.request_id] for r in reqs if r.priority == c) / max(1, sum(r.priority == c for r in reqs))
            for c in (0, 5, 10)}
    assert mean[0] < mean[5] < mean[10]


# ---------------------------------------------------------------------------------------------- modes
def _obs(demand_running=0, waiting=0, rate=0.0, a=None, b=None, tokens=16.0):
    return Observation(0.0, demand_running, waiting, rate, a, b, tokens)


def test_modes_match_their_definitions():
    ull, cons = MODES["ultra_low_latency"], MODES["conservative"]
    mc = ModeConfig("ultra_low_latency", low_latency_batch=2)
    for o in (_obs(), _obs(1, 30, 50.0, 0.02, 0.002)):
        assert ull(o, 16, 256, mc) == StepLimits(2, 256, 0.0)      # small batch, never waits
        assert cons(o, 16, 256, mc) == StepLimits(16, 256, 0.0)    # the configured limits
    assert ull(_obs(), 1, 256, mc).max_num_seqs == 1


@pytest.mark.parametrize("seed", range(20))
def test_adaptive_meets_the_target_with_the_smallest_batch_or_drains_fastest(seed):
    rng = random.Random(seed)
    a, b = rng.uniform(0.005, 0.05), rng.uniform(0.0, 0.02)
    target = rng.uniform(100, 5000)
    cfg = ModeConfig("adaptive", low_latency_batch=2, max_wait_ms=20, target_p99_ms=target)
    budget = cfg.margin * target / 1e3
    tokens = rng.uniform(4, 64)
    prev, feasible_before = 0, True
    for demand in range(0, 60):
        o = _obs(0, demand, rng.uniform(0, 200), a, b, tokens)
        lim = adaptive(o, 16, 256, cfg)
        bsz = lim.max_num_seqs
        pred = {k: predicted_latency_s(o, k) for k in range(2, 17)}
        assert 2 <= bsz <= 16 and lim.max_num_batched_tokens >= bsz
        assert bsz <= max(2, demand)                               # never more than the demand needs
        fits = [k for k, p in pred.items() if p <= budget]
        if fits:                                                   # the smallest batch within the target
            assert bsz == min(fits) and pred[bsz] <= budget + 1e-12
            if feasible_before:
                assert bsz >= prev                                 # grows with the demand
        else:                                                      # overloaded: drain the demand soonest
            assert pred[bsz] == min(pred.values())
        feasible_before = bool(fits)
        prev = bsz
        assert 0 <= lim.max_wait_s <= 0.02
        if lim.max_wait_s:
            slack = budget - pred[bsz]
            assert lim.max_wait_s <= slack / 4 + 1e-12 and lim.max_wait_s <= 1 / o.arrival_rate + 1e-12
    light = _obs(0, 1, 0.0, a, b, tokens)                          # one request: the low-latency batch
    assert adaptive(light, 16, 256, cfg).max_num_seqs == 2
    assert adaptive(_obs(0, 30), 16, 256, cfg).max_num_seqs == 2   # nothing timed yet: measure before growing


def test_throttle_scales_any_mode_s_limits():
    for seqs in range(1, 33):
        for tokens in (seqs, 64, 256):
            for f in (0.01, 0.2, 0.5, 0.8, 1.0):
                t = throttled(StepLimits(seqs, tokens, 0.01), f)
                assert t.max_num_seqs == max(1, math.floor(seqs * f)) and t.max_num_batched_tokens >= t.max_num_seqs
                assert t.max_num_batched_tokens <= max(tokens, 1) and t.max_wait_s == 0.01
    assert throttled(StepLimits(16, 256), 1.0) == StepLimits(16, 256)


def test_load_tracker_fits_step_times():
    lt = LoadTracker(window_s=100)
    for i, bsz in enumerate([1, 2, 4, 8, 16, 3]):
        lt.decode_step(float(i), bsz, 0.010 + 0.002 * bsz)
    a, b = lt.fit()
    assert a == pytest.approx(0.010) and b == pytest.approx(0.002)
    for t in range(10):
        lt.arrived(float(t))
    lt.finished(8), lt.finished(12)
    o = lt.observe(10.0, 1, 2)
    assert o.arrival_rate == pytest.approx(1.0) and o.mean_tokens == 10 and o.demand == 3
    with pytest.raises(Exception):
        ModeConfig("adaptive")                                     # adaptive needs the SLO
    with pytest.raises(Exception):
        ModeConfig("fastest")


# ---------------------------------------------------------------------------------------------- engine
class Clock:
    """Monotonic time plus an offset the test moves (the engine's injectable clock)."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture(scope="module")
def eng():
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    clock = Clock()
    e = GenerateEngine(rt, "smollm2", [0], EngineConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=64,
                                                        num_gpu_blocks_override=32, scheduling_policy="priority",
                                                        priority_aging_s=10.0), clock=clock)
    e.test_clock = clock
    try:
        yield e
    finally:
        e.shutdown()
        rt.close()


def _drive(e, limit: int = 400) -> list[tuple[int, StepLimits]]:
    """Step until idle; (requests in the step's batch, the step's limits) per step."""
    seen = []
    for _ in range(limit):
        if not e.has_unfinished():
            return seen
        e.step()
        seen.append((e.snapshot().batch, e.limits))
    raise AssertionError("engine did not finish")


def _finish_order(handles, e):
    order, left = [], list(handles)
    for _ in range(400):
        if not left:
            return order
        e.step()
        for h in list(left):
            if h.done:
                order.append(h)
                left.remove(h)
    raise AssertionError("engine did not finish")


def test_engine_high_class_first_under_contention(eng):
    eng.set_mode(ModeConfig("ultra_low_latency", low_latency_batch=2))
    try:
        ids = eng.encode("the npu runs matrix kernels")
        lows = [eng.add_request(ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), priority=10)
                for _ in range(3)]
        while eng.snapshot().running < 2:
            eng.step()
        highs = [eng.add_request(ids, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), priority=0)
                 for _ in range(2)]
        order = _finish_order(lows + highs, eng)
        assert order[:2] == highs                                  # the high class finished first ...
        assert set(order[2:]) == set(lows)                         # ... and the low class still finished
        assert all(h.result(0).completion_tokens == 8 for h in lows)
        assert eng.scheduler.num_displaced >= 2
    finally:
        eng.set_mode(ModeConfig())
    with pytest.raises(InvalidRequest):
        eng.add_request(ids, SamplingParams(max_tokens=1), priority="high")


def test_engine_aging_lets_a_long_wait_run_first(eng):
    eng.set_mode(ModeConfig("ultra_low_latency", low_latency_batch=1))
    try:
        ids = eng.encode("the npu runs")
        sp = lambda n: SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)   # noqa: E731
        first = eng.add_request(ids, sp(3), priority=0)
        eng.step()                                                 # first runs (batch of one)
        low = eng.add_request(ids, sp(2), priority=10)
        eng.test_clock.offset += 150.0                             # the low request waits 150 s: 15 classes
        fresh = eng.add_request(ids, sp(2), priority=0)
        order = _finish_order([first, low, fresh], eng)
        assert order == [first, low, fresh]
    finally:
        eng.set_mode(ModeConfig())


@pytest.mark.parametrize("mode,target,throttle,expect", [
    ("ultra_low_latency", None, 1.0, 2), ("conservative", None, 1.0, 4),
    ("adaptive", 3_600_000.0, 1.0, 2),               # a loose target (1 h): the smallest batch meets it
    ("adaptive", 0.001, 1.0, 4),                     # an impossible one: drain the 8 soonest (2 rounds of 4)
    ("conservative", None, 0.5, 2),
    ("manual", None, 1.0, 4),                        # the configured batch, whatever the load
    ("auto", None, 1.0, 4)])                         # auto before a target is picked: as manual
def test_engine_honours_each_mode_s_limits(eng, mode, target, throttle, expect):
    eng.set_mode(ModeConfig(mode, low_latency_batch=2, target_p99_ms=target))
    eng.set_throttle(throttle)                                     # self-healing's throttle narrows any mode
    eng.load = type(eng.load)()                                    # no timing carried over from other modes
    try:
        ids = eng.encode("one two three")
        hs = [eng.add_request(ids, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)) for _ in range(8)]
        seen = _drive(eng)
        assert all(batch <= lim.max_num_seqs for batch, lim in seen)         # every step within its limits
        assert max(r for r, _ in seen) == expect                              # and the limit is what the mode says
        assert all(h.result(0).completion_tokens == 3 for h in hs)
    finally:
        eng.set_mode(ModeConfig())
        eng.set_throttle(1.0)
