"""``memory:`` as the seed writes it (issue 28 item 4): the device caching pool sized, pre-warmed,
defragmented on an interval and protected from overflow, on a real in-process device's pool and an
injectable clock (:mod:`runtime.serve.memory_pool`).

The overflow test drives the pool the way an engine's steps do -- each step holds ``batch`` activation
blocks of 2 MiB, its batch the scheduler mode's limit scaled by the admission factor
(:func:`runtime.serve.engine.modes.throttled`, what ``Frontend.throttle`` sets) -- while the demand ramps
up past what the pool can hold and back down: unprotected, a step fails with 207001; protected, the
guard degrades the batch before that step and every step runs, then recovers."""
from __future__ import annotations

import numpy as np
import pytest

from devices.device import DeviceConfig
from devices.errors import MemoryAllocationError
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.config import parse_config
from runtime.serve.engine.modes import StepLimits, throttled
from runtime.serve.memory_pool import MemoryManager, OverflowGuard, PoolPlan, PoolTooSmall, next_factor

pytestmark = pytest.mark.serve

MiB = 1 << 20
PER_SEQ = 2 * MiB


@pytest.fixture(scope="module")
def rt():
    r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=128 * MiB)))
    yield r
    r.close()


@pytest.fixture
def dev(rt):
    d = rt.device(0)
    assert d.pool.memory_stats()["allocated_bytes.all.current"] == 0      # no test leaves a block behind
    yield d
    d.pool.set_limit(None)
    d.empty_cache()


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _manager(dev, plan: PoolPlan, clock: Clock, factors: list, defrags: list) -> MemoryManager:
    return MemoryManager(lambda: [dev], factors.append, lambda: defrags.append(dev.defragment()) or [], plan, clock)


def _ramp(dev, mm: MemoryManager | None, clock: Clock, factor=lambda: 1.0) -> list[int]:
    """Demand 1..32 then back to 4; per step: the batch the limits allow, its blocks held, then a tick."""
    batches = []
    for demand in list(range(1, 33)) + list(range(32, 3, -4)):
        lim = throttled(StepLimits(32, 256), factor())
        b = min(demand, lim.max_num_seqs)
        hs = []
        try:
            for _ in range(b):
                hs.append(dev.alloc(PER_SEQ))                    # the step's activations
        finally:
            for h in hs:
                dev.pool.free(h)
        batches.append(b)
        clock.t += 1.0
        if mm is not None:
            mm.tick()
    return batches


def test_without_protection_the_ramp_runs_out_of_pool(dev):
    clock, factors, defrags = Clock(), [], []
    mm = _manager(dev, PoolPlan(pool_bytes=40 * MiB), clock, factors, defrags)
    mm.start()
    with pytest.raises(MemoryAllocationError) as e:
        _ramp(dev, mm, clock)
    assert e.value.code == 207001                              # 21 sequences need 42 MiB of a 40 MiB pool
    assert "size limit (40.00 MiB) is reached" in str(e.value)


def test_overflow_protection_degrades_before_the_oom_and_recovers(dev):
    clock, factors, defrags = Clock(), [], []
    mm = _manager(dev, PoolPlan(pool_bytes=40 * MiB, overflow_protection=True), clock, factors, defrags)
    assert mm.start() == {0: 40 * MiB}                           # pre-warmed to the pool size
    ooms = dev.pool.memory_stats()["num_ooms"]
    batches = _ramp(dev, mm, clock, lambda: mm.factor)            # no 207001
    assert max(batches) * PER_SEQ <= 40 * MiB
    assert max(batches) >= 18                                    # it used the pool before degrading
    assert factors[0] == 0.5 and mm.degrades >= 1               # degraded once the headroom fell under 10 %
    assert factors[-1] == 1.0 and mm.factor == 1.0              # and recovered as the demand fell
    assert dev.pool.memory_stats()["num_ooms"] == ooms


def test_next_factor_projects_the_doubled_batch():
    g = OverflowGuard()
    assert next_factor(1.0, 0.05, g) == 0.5 and next_factor(0.5, 0.05, g) == 0.25
    assert next_factor(1 / 16, 0.0, g) == 1 / 16                  # the floor
    assert next_factor(0.5, 0.2, g) == 0.5                       # 80 % used: doubled would not fit
    assert next_factor(0.5, 0.6, g) == 1.0                       # 40 % used: doubled leaves 20 %
    assert next_factor(1.0, 0.5, g) == 1.0


def test_periodic_defragmentation_on_the_clock_keeps_data_and_re_warms(dev):
    clock, factors, defrags = Clock(1000.0), [], []
    mm = _manager(dev, PoolPlan(pool_bytes=48 * MiB, defrag_interval_s=180.0), clock, factors, defrags)
    mm.start()
    keep = [dev.from_numpy(np.full(3 * MiB // 4, i, np.float32)) for i in range(4)]
    keep[1].free()                                               # a hole between live tensors
    keep[2].free()
    assert mm.tick(1179.9) == [] and not defrags
    assert mm.tick(1180.0) == ["defragment"] and len(defrags) == 1
    assert defrags[0].bytes_moved > 0                            # the live tensors moved
    assert mm.next_defrag == 1360.0
    for i in (0, 3):
        assert np.array_equal(keep[i].numpy(), np.full(3 * MiB // 4, i, np.float32))
    assert dev.pool.reserved() == 48 * MiB                       # pre-warmed again after the move
    assert mm.tick(1359.0) == [] and mm.tick(1361.0) == ["defragment"] and mm.defrags == 2
    keep[0].free()
    keep[3].free()


def test_resize_live_grows_and_shrinks_without_touching_what_is_held(dev):
    clock, factors, defrags = Clock(), [], []
    mm = _manager(dev, PoolPlan(pool_bytes=40 * MiB), clock, factors, defrags)
    mm.start()
    held = [dev.from_numpy(np.arange(MiB, dtype=np.float32) * (i + 1)) for i in range(3)]   # 12 MiB in flight
    with pytest.raises(PoolTooSmall, match="below what device 0 holds"):
        mm.resize(8 * MiB)
    assert dev.pool.limit == 40 * MiB                            # nothing changed
    assert mm.resize(20 * MiB) == {0: 20 * MiB} and dev.pool.limit == 20 * MiB
    assert mm.resize(64 * MiB) == {0: 64 * MiB}
    for i, t in enumerate(held):
        assert np.array_equal(t.numpy(), np.arange(MiB, dtype=np.float32) * (i + 1))
        t.free()
    assert mm.state()["pools"]["npu:0"]["limit"] == 64 * MiB


def test_the_seed_memory_section_is_acted_on():
    cfg = parse_config('memory:\n  strategy: "fragmentation_aware"\n  pool_size: "3GB"\n  defrag_interval: "3m"\n'
                       '  overflow_protection: true\n')
    plan = PoolPlan.from_spec(cfg.memory)
    assert plan == PoolPlan("fragmentation_aware", 3 << 30, 180.0, True)
    assert not [n for n in cfg.not_acted_on if n.path.startswith("memory")]
    with pytest.raises(Exception, match=r"line 1: memory.strategy: strategy 'lru' is unknown \(known: fragmentation_aware\)"):
        parse_config("memory: {strategy: lru}\n")
