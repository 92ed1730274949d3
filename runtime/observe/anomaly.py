"""Anomalies in one metric's time series: pure functions over ``(ts, value)`` lists (no store, no clock).

A series is first split at its *change points* (level shifts: binary segmentation of the mean, a split kept
when its two-sample t statistic exceeds ``shift_t``); the rest is measured against the level of its
segment with a *robust z-score* (distance to the segment's median in units of the noise scale
``1.4826 * MAD``, never below the metric's ``floor`` -- a flat series of zeros has MAD 0, and a 0.2 % error
rate on it is not "infinitely" anomalous).  Runs of points beyond ``z`` are *spikes* (at most
``spike_points`` samples) or *bursts* (longer, and back to the level afterwards).  A *trend* is a steady
slope (least squares over the whole series) whose total change exceeds ``trend_sigmas`` noise scales and
explains most of the variance (R^2 >= ``trend_r2``).

Every :class:`Anomaly` says where it starts (``onset``: the first sample beyond the threshold, or the first
sample after a change point), where it peaks, the level it departs from (``baseline``) and its ``score``
(robust z of the peak, or the t statistic of a shift, or the trend's change in noise scales).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KINDS = ("spike", "burst", "shift", "trend")


@dataclass(frozen=True)
class Detection:
    """Thresholds of :func:`detect` (defaults suit a 1 Hz series of minutes to hours)."""

    z: float = 4.0                 #: robust z beyond which a point is anomalous
    spike_points: int = 5          #: a run of at most this many points is a spike, longer a burst
    shift_t: float = 8.0           #: t statistic a level shift must exceed
    min_segment: int = 8           #: points on each side of a change point
    max_shifts: int = 3
    trend_sigmas: float = 6.0      #: a trend's total change, in noise scales
    trend_r2: float = 0.6
    max_points: int = 720          #: longer series are averaged into this many buckets for shifts/trends


@dataclass(frozen=True)
class Anomaly:
    metric: str
    scope: str
    kind: str                     #: one of :data:`KINDS`
    onset: float                  #: ts where it starts
    end: float                    #: ts of its last anomalous sample (a shift/trend: the series' end)
    peak_ts: float
    peak: float                   #: the most extreme value (a shift: the new level)
    baseline: float               #: the level it departs from
    score: float                  #: how strong (robust z, t statistic, or noise scales)
    direction: int = 1            #: +1 up, -1 down
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "scope": self.scope, "kind": self.kind, "onset": self.onset,
                "end": self.end, "peak_ts": self.peak_ts, "peak": self.peak, "baseline": self.baseline,
                "score": round(self.score, 3), "direction": self.direction, "detail": dict(self.detail)}


def robust_scale(x: np.ndarray, floor: float = 0.0) -> float:
    """``1.4826 * median(|x - median(x)|)`` (the standard deviation of normal noise), at least ``floor``."""
    if x.size == 0:
        return max(floor, 0.0)
    mad = float(np.median(np.abs(x - np.median(x))))
    return max(1.4826 * mad, floor)


def robust_z(x, floor: float = 0.0) -> np.ndarray:
    """Robust z-scores of ``x`` against its own median and :func:`robust_scale` (0 where the scale is 0)."""
    a = np.asarray(x, dtype=float)
    s = robust_scale(a, floor)
    if s <= 0:
        return np.zeros_like(a)
    return (a - float(np.median(a))) / s


def change_points(x, min_segment: int = 8, t_min: float = 8.0, max_points: int = 3,
                  floor: float = 0.0) -> list[int]:
    """Indices ``k`` where the mean of ``x`` shifts (``x[:k]`` vs ``x[k:]``), by binary segmentation: the
    split maximising Welch's t statistic (noise from the two sides' robust scales, at least ``floor``),
    kept when t >= ``t_min``, then each side searched again.  Sorted."""
    a = np.asarray(x, dtype=float)
    found: list[int] = []

    def best(lo: int, hi: int) -> tuple[int, float]:
        seg = a[lo:hi]
        n = seg.size
        if n < 2 * min_segment:
            return -1, 0.0
        cs = np.concatenate([[0.0], np.cumsum(seg)])
        ks = np.arange(min_segment, n - min_segment + 1)
        m1 = cs[ks] / ks
        m2 = (cs[n] - cs[ks]) / (n - ks)
        # coarse noise of the whole segment's first differences: robust to the shift itself
        noise = max(robust_scale(np.diff(seg), 0.0) / np.sqrt(2.0), floor, 1e-12)
        t = np.abs(m1 - m2) / (noise * np.sqrt(1.0 / ks + 1.0 / (n - ks)))
        i = int(np.argmax(t))
        k = int(ks[i])
        # confirm with the sides' own robust scales (a spike inflates the mean, not the median)
        left, right = seg[:k], seg[k:]
        s = max(np.sqrt((robust_scale(left) ** 2 + robust_scale(right) ** 2) / 2.0), floor, 1e-12)
        tm = abs(float(np.median(right) - np.median(left))) / (s * np.sqrt(1.0 / k + 1.0 / (n - k)))
        return lo + k, min(float(t[i]), tm)

    stack = [(0, a.size)]
    while stack and len(found) < max_points:
        lo, hi = stack.pop()
        k, t = best(lo, hi)
        if k < 0 or t < t_min:
            continue
        found.append(k)
        stack += [(lo, k), (k, hi)]
    return sorted(found)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end] index pairs of the True runs of ``mask``."""
    out, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, len(mask) - 1))
    return out


def _bucket(ts: np.ndarray, v: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    if ts.size <= n:
        return ts, v
    edges = np.linspace(0, ts.size, n + 1).astype(int)
    return (np.array([ts[a:b].mean() for a, b in zip(edges[:-1], edges[1:])]),
            np.array([v[a:b].mean() for a, b in zip(edges[:-1], edges[1:])]))


def detect(points, metric: str = "", scope: str = "", floor: float = 0.0,
           opts: Detection = Detection()) -> list[Anomaly]:
    """The anomalies of one series ``points`` = ``[(ts, value), ...]`` (oldest first), strongest first."""
    if len(points) < 3:
        return []
    ts = np.array([p[0] for p in points], dtype=float)
    v = np.array([p[1] for p in points], dtype=float)
    out: list[Anomaly] = []

    # a steady trend fits better than any single step: no change points then (a ramp is not a staircase)
    bts, bv = _bucket(ts, v, opts.max_points)
    trend = _trend(ts, v, bts, bv, floor, opts)
    # level shifts (on the bucketed series), mapped back to sample indices
    cps_b = [] if trend is not None else change_points(bv, opts.min_segment, opts.shift_t, opts.max_shifts, floor)
    cps = sorted({int(np.searchsorted(ts, bts[k])) for k in cps_b})
    bounds = [0] + cps + [v.size]
    level = np.empty_like(v)
    for a, b in zip(bounds[:-1], bounds[1:]):
        level[a:b] = np.median(v[a:b])
    for k in cps:
        before, after = float(level[k - 1]), float(level[k])
        left = v[max(0, k - 4 * opts.min_segment):k]
        right = v[k:min(v.size, k + 4 * opts.min_segment)]
        s = max(np.sqrt((robust_scale(left) ** 2 + robust_scale(right) ** 2) / 2.0), floor, 1e-12)
        nxt = next((c for c in cps if c > k), v.size)
        out.append(Anomaly(metric, scope, "shift", float(ts[k]), float(ts[nxt - 1]), float(ts[k]), after, before,
                           float(abs(after - before) / s), 1 if after > before else -1,
                           {"before": before, "after": after}))

    # spikes and bursts: residuals from the segment levels
    resid = v - level
    noise = robust_scale(resid, floor)
    if noise > 0:
        z = resid / noise
        for a, b in _runs(np.abs(z) >= opts.z):
            i = a + int(np.argmax(np.abs(z[a:b + 1])))
            kind = "spike" if b - a + 1 <= opts.spike_points else "burst"
            out.append(Anomaly(metric, scope, kind, float(ts[a]), float(ts[b]), float(ts[i]), float(v[i]),
                               float(level[i]), float(abs(z[i])), 1 if z[i] > 0 else -1,
                               {"points": b - a + 1}))

    if trend is not None:
        out.append(Anomaly(metric, scope, "trend", *trend))
    out.sort(key=lambda a: -a.score)
    return out


def _trend(ts, v, bts, bv, floor: float, opts: Detection):
    """(onset, end, peak_ts, peak, baseline, score, direction, detail) of a significant linear trend that
    explains the series better than the best single step, else None."""
    n = bv.size
    if n < 2 * opts.min_segment:
        return None
    t0 = bts - bts[0]
    slope, icpt = np.polyfit(t0, bv, 1)
    fit = slope * t0 + icpt
    ss_tot = float(np.sum((bv - bv.mean()) ** 2))
    if ss_tot <= 0:
        return None
    sse_lin = float(np.sum((bv - fit) ** 2))
    r2 = 1.0 - sse_lin / ss_tot
    # the best one-step (two-level) fit, from cumulative sums
    cs, cs2 = np.concatenate([[0.0], np.cumsum(bv)]), np.concatenate([[0.0], np.cumsum(bv * bv)])
    ks = np.arange(opts.min_segment, n - opts.min_segment + 1)
    sse_step = (cs2[ks] - cs[ks] ** 2 / ks) + (cs2[n] - cs2[ks] - (cs[n] - cs[ks]) ** 2 / (n - ks))
    step_noise = max(robust_scale(np.diff(v), 0.0) / np.sqrt(2.0), floor, 1e-12)
    change = float(slope * (ts[-1] - ts[0]))
    if r2 < opts.trend_r2 or abs(change) < opts.trend_sigmas * step_noise or sse_lin >= float(np.min(sse_step)):
        return None
    return (float(ts[0]), float(ts[-1]), float(ts[-1]), float(fit[-1]), float(fit[0]), abs(change) / step_noise,
            1 if change > 0 else -1, {"slope_per_s": float(slope), "r2": r2})
