"""The straggler rule on numbers (runtime.cluster.straggler): no devices, no clock -- time is the
timestamp of each synthetic or recorded report.  The pool's use of it on real devices is in
tests/cluster/test_failover.py."""
from __future__ import annotations

import dataclasses

import pytest

from latency_noise import CPU_HOGS, healthy_stream, recorded, windows
from runtime.cluster.failover import FailoverOptions
from runtime.cluster.straggler import MAD_TO_SIGMA, StragglerRule, StragglerWatch, judge

DEFAULT = FailoverOptions().straggler_rule()
#: the rule before this one: the ratio alone, acted on at once
RATIO_ONLY = dataclasses.replace(DEFAULT, min_excess_s=0.0, mad_k=0.0, persist_s=0.0)


def ms(*xs: float) -> list[float]:
    return [x / 1000.0 for x in xs]


def verdict(own, peers, rule: StragglerRule = DEFAULT):
    return judge(own, peers, factor=rule.factor, min_excess_s=rule.min_excess_s, mad_k=rule.mad_k)


def healthy_sources():
    """(name, reports): the recorded trace and seeded models, quiet and with CPU hogs."""
    yield "recorded", recorded()
    for seed in range(3):
        yield f"model-{seed}", healthy_stream(seed, 3000)
        yield f"hogs-{seed}", healthy_stream(seed, 3000, **CPU_HOGS)


def take_outs(reports, rule: StragglerRule) -> list:
    """Feed ``reports`` to a watch as the pool does (every device a peer of every other); a device taken
    out is forgotten (it would be reset before it serves again).  Returns the verdicts acted on."""
    watch = StragglerWatch(rule)
    devs = sorted({d for _, d, _ in reports})
    out = []
    for t, d, s in reports:
        v = watch.report(d, s, t, devs)
        if v is not None:
            out.append((t, d, v))
            watch.forget(d)
    return out


def test_numbers_against_a_hand_computation():
    peers = [ms(1, 2, 3), ms(2, 3, 4), ms(3, 4, 5)]
    v = judge(ms(7, 8, 9), peers, factor=2.0, min_excess_s=0.0005, mad_k=1.0)
    # R = median of the peers' medians (2, 3, 4) = 3 ms; |pooled - 3| = 2,1,0,1,0,1,0,1,2 -> MAD 1 ms
    assert v.latency_s == pytest.approx(8e-3) and v.reference_s == pytest.approx(3e-3)
    assert v.spread_s == pytest.approx(MAD_TO_SIGMA * 1e-3)
    assert v.threshold_s == pytest.approx(max(2 * 3e-3, 3e-3 + 0.5e-3, 3e-3 + 1.0 * MAD_TO_SIGMA * 1e-3))
    assert v.slow and v.ratio == pytest.approx(8 / 3)
    assert judge(ms(5.9), peers, factor=2.0, min_excess_s=0.0, mad_k=0.0).slow is False    # 5.9 <= 2 x 3
    assert judge([], peers, factor=2.0, min_excess_s=0, mad_k=0) is None                 # nothing of its own
    assert judge(ms(9), [[], []], factor=2.0, min_excess_s=0, mad_k=0) is None          # no peer with samples


def test_a_device_slowed_100x_is_a_straggler_against_every_healthy_window():
    """(a) A device 100x slower than it was (the ``slow`` fault): against the peers of every window of the
    recorded trace and the models, noisy or not, the verdict is "slow"."""
    n = 0
    for name, reports in healthy_sources():
        for _t, d, own, peers in windows(reports):
            if d != 1 or not peers:
                continue
            v = verdict([100 * s for s in own], peers)
            assert v.slow, (name, v.describe())
            n += 1
    assert n > 1000


def test_a_straggler_is_taken_out_once_it_stays_slow_for_the_persistence_time():
    """(a) The watch acts on a 100x straggler after ``persist_s`` of unbroken slow verdicts, not before."""
    reports = healthy_stream(7, 20000)
    t_fault = reports[500][0]
    slowed = [(t, d, s * 100 if d == 1 and t >= t_fault else s) for t, d, s in reports]
    acted = take_outs(slowed, DEFAULT)
    assert [d for _, d, _ in acted][:1] == [1], acted[:3]
    t, _, v = acted[0]
    assert v.slow_for_s >= DEFAULT.persist_s and v.ratio > 20
    assert t >= t_fault + DEFAULT.persist_s
    assert "x its peers'" in v.describe()


@pytest.mark.parametrize("source", [name for name, _ in healthy_sources()])
def test_healthy_devices_under_tiny_noisy_requests_are_not_taken_out(source):
    """(b) Healthy devices, tiny requests, the noise of the 2-core box (recorded, and modeled with and
    without two CPU hogs): the default rule takes nothing out, where the ratio alone would have -- the
    data does carry the noise that quarantined healthy devices before."""
    reports = dict(healthy_sources())[source]
    assert take_outs(reports, DEFAULT) == []
    assert take_outs(reports, RATIO_ONLY), "this noise does not fool even the ratio alone: a useless check"


def test_the_absolute_floor_matters():
    """(c) Peers at a steady 0.3 ms, the device at 0.9 ms: 3x and far out of the peers' (tiny) noise, but
    0.6 ms over them -- below the 2 ms floor, so not a straggler; without the floor it would be one."""
    peers = [ms(0.30, 0.31, 0.29, 0.30, 0.32, 0.30, 0.28, 0.31, 0.30)] * 3
    own = ms(*[0.9] * 9)
    v = verdict(own, peers)
    assert v.ratio == pytest.approx(3.0, rel=1e-6) and v.latency_s - v.reference_s > DEFAULT.mad_k * v.spread_s
    assert not v.slow and v.threshold_s == pytest.approx(v.reference_s + DEFAULT.min_excess_s)
    assert verdict(own, peers, dataclasses.replace(DEFAULT, min_excess_s=0.0)).slow


def test_the_peers_spread_matters():
    """(c) Noisy peers (median 3 ms, MAD 1.5 ms: a robust sigma of 2.2 ms), the device at 8 ms: 2.7x and
    5 ms over them -- above the ratio and the floor, but within 3.5 sigmas of the peers' own noise, so not a
    straggler; without the spread rule it would be one."""
    peers = [ms(1.5, 3.0, 4.5, 1.5, 3.0, 4.5, 1.5, 3.0, 4.5)] * 3
    own = ms(*[8.0] * 9)
    v = verdict(own, peers)
    assert v.spread_s == pytest.approx(MAD_TO_SIGMA * 1.5e-3)
    assert v.ratio > DEFAULT.factor and v.latency_s - v.reference_s > DEFAULT.min_excess_s
    assert not v.slow and v.threshold_s == pytest.approx(v.reference_s + DEFAULT.mad_k * v.spread_s)
    assert verdict(own, peers, dataclasses.replace(DEFAULT, mad_k=0.0)).slow


def test_the_factor_matters():
    """A device 40 ms over steady 50 ms peers clears the floor and the spread but is 1.8x, not 2x."""
    peers = [ms(50, 50.5, 49.5, 50, 50, 50.5, 49.5, 50, 50)] * 3
    own = ms(*[90.0] * 9)
    assert not verdict(own, peers).slow
    assert verdict(own, peers, dataclasses.replace(DEFAULT, factor=1.5)).slow


def test_persistence_matters_and_a_break_restarts_it():
    """Slow requests every quarter of ``persist_s`` (exact in binary): acted on only once the slow verdicts
    span ``persist_s``; a fast stretch between them starts the count again."""
    step = DEFAULT.persist_s / 4
    assert step * 4 == DEFAULT.persist_s and DEFAULT.min_samples == 8 and DEFAULT.window == 9

    def watch_with_peers():
        w = StragglerWatch(DEFAULT)
        for p in ("a", "b", "c"):
            for i in range(9):
                w.report(p, 0.001, i * 0.001, ("a", "b", "c", "x"))
        return w
    peers = ("a", "b", "c")
    w = watch_with_peers()
    got = {k: w.report("x", 0.050, k * step, peers) for k in range(1, 13)}
    # the 8th report is the first judged (min_samples): slow from there, acted on persist_s (4 steps) later
    assert [k for k, v in got.items() if v is not None][:1] == [12]
    assert got[12].slow_for_s == DEFAULT.persist_s and got[12].ratio == pytest.approx(50.0)

    w = watch_with_peers()
    for k in range(1, 12):                                      # slow from step 8 to 11 (3 steps)
        assert w.report("x", 0.050, k * step, peers) is None
    for i in range(5):                                          # five fast requests: the median drops
        assert w.report("x", 0.001, (11.2 + 0.1 * i) * step, peers) is None
    # slow again from step 12; the window holds 5 slow ones again at step 16: a new streak starts there
    # (without the break it would be acted on at once, slow since step 8)
    got = {k: w.report("x", 0.050, k * step, peers) for k in range(12, 21)}
    assert [k for k, v in got.items() if v is not None] == [20]
    assert got[20].slow_for_s == DEFAULT.persist_s


@pytest.mark.parametrize("field, value", [
    ("slow_factor", 1.0), ("slow_factor", 0.5), ("slow_factor", float("nan")), ("slow_factor", True),
    ("slow_min_excess_ms", -1.0), ("slow_min_excess_ms", float("inf")), ("slow_mad_k", -0.5),
    ("slow_mad_k", "3"), ("slow_persist_s", -0.1), ("slow_min_samples", 0), ("slow_min_samples", 2.5),
    ("slow_window", 0),
])
def test_bad_straggler_options_are_refused_with_one_line(field, value):
    with pytest.raises(ValueError) as e:
        FailoverOptions(**{field: value})
    assert field in str(e.value) and "\n" not in str(e.value)


def test_default_options_build_the_documented_rule():
    assert DEFAULT == StragglerRule(factor=2.0, min_excess_s=0.002, mad_k=3.5, persist_s=2.0, min_samples=8,
                                    window=9)
