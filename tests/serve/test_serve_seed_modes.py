"""The seed's scheduler modes (issue 28 item 3): ``manual``, ``hybrid`` and ``auto``, pure logic on an
injectable clock (no device, no sleeps).

A simulated engine loop feeds a real :class:`LoadTracker` (arrivals, timed decode steps of a known
``a + b*B`` device) at times the test chooses, and asks the mode for each step's limits: manual never
changes its batch or delay, hybrid adapts but never leaves ``[min_batch, max_batch]`` nor holds longer than
``timeout_ms``, auto picks its target from a recorded history (checked against numpy's nearest-rank
quantile) and then runs exactly as adaptive against it."""
from __future__ import annotations

import random

import numpy as np
import pytest

from runtime.observe.metrics_store import History
from runtime.serve.auto_slo import AutoSlo, pick_target
from runtime.serve.config import ConfigError, parse_config
from runtime.serve.engine.modes import MODES, LoadTracker, ModeConfig, StepLimits, adaptive, manual

pytestmark = pytest.mark.serve

MIN_B, MAX_B, TIMEOUT_MS = 2, 16, 50.0


def _timeline(mode: str, target: float | None, seed: int, steps: int = 300):
    """(observation, limits) of each step of a simulated engine: demand ramps up then down, arrivals and
    decode steps recorded on the test's clock, a device whose step takes ``0.01 + 0.002*B`` s."""
    rng = random.Random(seed)
    cfg = ModeConfig(mode, low_latency_batch=MIN_B, max_wait_ms=TIMEOUT_MS, target_p99_ms=target)
    fn, tr, now, demand, out = MODES[mode], LoadTracker(), 1000.0, 0, []
    for i in range(steps):
        arrivals = rng.randint(0, 6) if i < steps // 2 else 0
        for _ in range(arrivals):
            now += rng.uniform(0.0, 0.004)
            tr.arrived(now)
        demand += arrivals
        obs = tr.observe(now, min(demand, MAX_B), max(0, demand - MAX_B))
        lim = fn(obs, MAX_B, 256, cfg)
        out.append((obs, lim))
        batch = min(demand, lim.max_num_seqs)
        if batch:
            secs = 0.01 + 0.002 * batch
            now += secs
            tr.decode_step(now, batch, secs)
            done = sum(rng.random() < 0.2 for _ in range(batch))
            demand -= done
            for _ in range(done):
                tr.finished(16)
        else:
            now += 0.01
    return out


@pytest.mark.parametrize("seed", range(5))
def test_manual_never_changes_its_batch_or_delay(seed):
    for obs, lim in _timeline("manual", None, seed):
        assert lim.max_num_seqs == MAX_B and lim.max_num_batched_tokens == 256
        assert lim.max_wait_s == (TIMEOUT_MS / 1e3 if obs.demand < MAX_B else 0.0)   # hold to fill, never over
    # with a target too: manual ignores it
    assert {lim.max_num_seqs for _, lim in _timeline("manual", 10.0, seed)} == {MAX_B}


@pytest.mark.parametrize("seed", range(5))
def test_hybrid_adapts_within_the_manual_bounds(seed):
    target = 400.0
    cfg = ModeConfig("adaptive", low_latency_batch=MIN_B, max_wait_ms=TIMEOUT_MS, target_p99_ms=target)
    run = _timeline("hybrid", target, seed)
    sizes = set()
    for obs, lim in run:
        assert MIN_B <= lim.max_num_seqs <= MAX_B
        assert 0.0 <= lim.max_wait_s <= TIMEOUT_MS / 1e3
        if obs.step_a is None:                                     # no device model yet: as manual
            assert lim == manual(obs, MAX_B, 256, cfg)
        else:                                                      # adapting: adaptive's choice in bounds
            assert lim.max_num_seqs == adaptive(obs, MAX_B, 256, cfg).max_num_seqs
            sizes.add(lim.max_num_seqs)
    assert len(sizes) >= 2                                         # it does adapt to the ramp
    assert {lim.max_num_seqs for _, lim in _timeline("hybrid", None, seed)} == {MAX_B}   # no target: manual


def _history(values: list[float], t0: float) -> History:
    h = History(":memory:", clock=lambda: t0)
    for i, v in enumerate(values):
        h.record_samples(t0 + i, {"p99_latency_ms": v})
    return h


def test_auto_picks_its_target_from_the_recorded_history():
    rng = np.random.default_rng(7)
    day = list(rng.lognormal(np.log(300.0), 0.4, size=400))
    old = [5000.0] * 100                                           # older than the lookback: not counted
    t0 = 1_000_000.0
    with _history(old + day, t0) as h:
        now = t0 + 499
        rule = AutoSlo(lookback_s=399.0)
        want = float(np.quantile(np.array(day), 0.9, method="inverted_cdf"))
        got = pick_target(h, now, rule)
        assert got == pytest.approx(want, abs=1e-3)
        assert pick_target(h, now, AutoSlo(lookback_s=399.0, quantile=0.5)) == pytest.approx(
            float(np.quantile(np.array(day), 0.5, method="inverted_cdf")), abs=1e-3)
        assert pick_target(h, now, AutoSlo(lookback_s=10.0, min_samples=30)) is None     # too little history
        # auto runs adaptive against the picked target, step for step
        cfg = ModeConfig("auto", low_latency_batch=MIN_B, max_wait_ms=TIMEOUT_MS, target_p99_ms=got)
        ref = ModeConfig("adaptive", low_latency_batch=MIN_B, max_wait_ms=TIMEOUT_MS, target_p99_ms=got)
        for obs, lim in _timeline("auto", got, 3):
            assert lim == adaptive(obs, MAX_B, 256, ref) == MODES["auto"](obs, MAX_B, 256, cfg)


def test_auto_without_history_runs_manual_and_a_tighter_history_shrinks_batches():
    for obs, lim in _timeline("auto", None, 1):
        assert lim.max_num_seqs == MAX_B
    with _history([900.0] * 40, 0.0) as loose, _history([60.0] * 40, 0.0) as tight:
        t_loose, t_tight = pick_target(loose, 39.0), pick_target(tight, 39.0)
        assert (t_loose, t_tight) == (900.0, 60.0)
        big = [lim.max_num_seqs for obs, lim in _timeline("auto", t_tight, 2) if obs.step_a is not None]
        small = [lim.max_num_seqs for obs, lim in _timeline("auto", t_loose, 2) if obs.step_a is not None]
        assert sum(big) > sum(small)                               # a tighter history: larger batches drain sooner


def test_seed_modes_load_from_the_seed_yaml_without_an_slo():
    for word in ("manual", "hybrid", "auto"):
        text = (f"scheduler:\n  mode: {word}\n  strategies:\n    - name: dynamic_batching\n      min_batch: 3\n"
                f"      max_batch: 8\n      timeout_ms: 40\nmodels: [smollm2]\n")
        e = parse_config(text).models[0].engine
        assert (e.mode.mode, e.mode.low_latency_batch, e.max_num_seqs, e.mode.max_wait_ms) == (word, 3, 8, 40)
    with pytest.raises(ConfigError, match="adaptive sizes batches against slo"):
        parse_config("scheduler: {mode: adaptive}\nmodels: [smollm2]\n")
    with pytest.raises(ConfigError, match=r"unknown mode 'automatic'"):
        parse_config("scheduler: {mode: automatic}\n")


def test_step_limits_of_manual_are_a_fixed_point():
    cfg = ModeConfig("manual", low_latency_batch=1, max_wait_ms=TIMEOUT_MS)
    for obs, _ in _timeline("adaptive", 100.0, 4):
        assert manual(obs, 7, 64, cfg) in (StepLimits(7, 64, TIMEOUT_MS / 1e3), StepLimits(7, 64, 0.0))
