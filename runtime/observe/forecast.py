"""The next hour's request rate, forecast from the metrics history with a seasonal-naive + EWMA-level model.

The model (documented in ``docs/observability.md``, "Predictive scheduling"), on ``qps`` samples of one
scope (``""``: the server; ``model:<name>``: one model's requests) bucketed into ``bucket_s`` bins (the
mean of the samples in each bin, aligned to the epoch so a bin's phase in the day is fixed):

- **season**: the profile ``S[p]`` = the mean of every past bin at phase ``p`` of the season (a day by
  default) over the history read (``lookback_s``, a week by default);
- **level**: ``L`` = the exponentially weighted mean (``alpha``) of the residuals ``y - S[phase]`` of the
  bins in time order -- how far today runs above or below the usual day;
- **forecast** at ``t``: ``max(0, S[phase(t)] + L)`` for each bin of the horizon (an hour by default).

With less than one whole season of history, no profile is known: the forecast is flat at the EWMA of the
bins (``seasonal`` is False).  Limits: one season only (a weekly pattern on top of the daily one is
averaged away), a level shift is followed at the EWMA's speed (``alpha`` per bin), a phase with no history
forecasts from the level alone, and the forecast knows nothing of events that never happened before.

Blocking: :func:`forecast` runs one aggregate query on the store (milliseconds for a week of 1 s samples)
(a few hundred milliseconds for a week of 1 s samples) and a pass over the bins;
:class:`Forecaster` caches it per scope for one bin, so keep one Forecaster per history (the server, the
policy engine and ``vnpu monitor`` each hold theirs).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from .metrics_store import History

#: forecast metrics -> the history metric they forecast (usable as a trigger's ``metric``)
FORECAST_METRICS: dict[str, str] = {"forecast_qps": "qps"}
MODEL_SCOPE_PREFIX = "model:"


def model_scope(model: str) -> str:
    """The history scope of one model's request rate."""
    return f"{MODEL_SCOPE_PREFIX}{model}"


@dataclass(frozen=True)
class ForecastOptions:
    bucket_s: float = 300.0          #: bin width (5 min)
    season_s: float = 86400.0        #: season length (a day)
    lookback_s: float = 7 * 86400.0  #: history read (a week: the store's default retention)
    horizon_s: float = 3600.0        #: how far ahead (an hour)
    alpha: float = 0.2               #: EWMA weight of the newest residual

    def __post_init__(self):
        if not (self.bucket_s > 0 and self.season_s >= self.bucket_s and self.lookback_s > 0
                and self.horizon_s > 0 and 0 < self.alpha <= 1):
            raise ValueError(f"bad forecast options {self!r}")


@dataclass(frozen=True)
class Forecast:
    """``points``: ``(bin start, forecast qps)`` for each bin of the horizon after ``now``."""
    now: float
    scope: str
    points: tuple[tuple[float, float], ...]
    level: float
    seasonal: bool
    bins: int                        #: history bins it was fitted on

    def peak(self, within_s: float | None = None) -> float:
        """The highest forecast within ``within_s`` after now (the whole horizon by default; NaN if none)."""
        xs = [v for t, v in self.points if within_s is None or t < self.now + within_s]
        return max(xs) if xs else math.nan

    def mean(self) -> float:
        return sum(v for _, v in self.points) / len(self.points) if self.points else math.nan

    def at(self, ahead_s: float) -> float:
        """The forecast of the bin due ``ahead_s`` after now (the first bin's if none is due yet; NaN if none)."""
        due = [v for t, v in self.points if t <= self.now + ahead_s]
        return due[-1] if due else (self.points[0][1] if self.points else math.nan)

    @property
    def model(self) -> str:
        """The model whose rate this is (``"*"``: the server's)."""
        return self.scope.removeprefix(MODEL_SCOPE_PREFIX) or "*"

    def to_dict(self) -> dict:
        return {"now": self.now, "scope": self.scope, "model": self.model, "level": self.level,
                "seasonal": self.seasonal, "bins": self.bins, "peak": self.peak() if self.points else None,
                "points": [[t, v] for t, v in self.points]}

    @classmethod
    def from_dict(cls, d: dict) -> "Forecast":
        return cls(float(d["now"]), str(d["scope"]), tuple((float(t), float(v)) for t, v in d["points"]),
                   float(d["level"]), bool(d["seasonal"]), int(d["bins"]))


def forecast(history: History, now: float, scope: str = "", opts: ForecastOptions = ForecastOptions(),
             metric: str = "qps") -> Forecast:
    """Forecast ``metric`` of ``scope`` for the ``opts.horizon_s`` after ``now`` from the history before it."""
    b = opts.bucket_s
    first = math.floor((now - opts.lookback_s) / b)
    last = math.floor(now / b)                           # the current bin, as far as it went
    bins = history.bucketed(metric, b, first * b, math.nextafter(now, math.inf), scope)
    nphase = max(1, round(opts.season_s / b))
    span = (bins[-1][0] - bins[0][0] + 1) if bins else 0
    seasonal = span >= nphase
    prof: dict[int, float] = {}
    if seasonal:
        sums: dict[int, list[float]] = {}
        for k, v in bins:
            sums.setdefault(k % nphase, []).append(v)
        prof = {p: sum(vs) / len(vs) for p, vs in sums.items()}
    level = 0.0
    started = False
    for k, v in bins:
        r = v - prof.get(k % nphase, 0.0)
        level = r if not started else opts.alpha * r + (1 - opts.alpha) * level
        started = True
    steps = max(1, math.ceil(opts.horizon_s / b))
    pts = tuple(((last + i) * b, max(0.0, prof.get((last + i) % nphase, 0.0) + level)) for i in range(1, steps + 1))
    if not bins:
        pts = ()
    return Forecast(float(now), scope, pts, level, seasonal, len(bins))


class Forecaster:
    """Forecasts of several scopes from one history, each recomputed at most once per bin (thread-safe)."""

    def __init__(self, history: History, opts: ForecastOptions = ForecastOptions()):
        self.history = history
        self.opts = opts
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[int, Forecast]] = {}

    def get(self, now: float, scope: str = "", metric: str = "qps") -> Forecast:
        k = math.floor(now / self.opts.bucket_s)
        with self._lock:
            hit = self._cache.get((metric, scope))
            if hit is not None and hit[0] == k:
                return hit[1]
        f = forecast(self.history, now, scope, self.opts, metric)
        with self._lock:
            self._cache[(metric, scope)] = (k, f)
        return f

    def scopes(self) -> list[str]:
        """The scopes with ``qps`` history: the server (``""``) and each model's."""
        return [s for s in self.history.scopes("qps") if s == "" or s.startswith(MODEL_SCOPE_PREFIX)]


    def all(self, now: float | None = None) -> list[Forecast]:
        """The forecast of every scope with history (the server first, then each model by name) as of ``now``
        (default: the newest sample's time -- a live server's now, a recorded history's end)."""
        if now is None:
            span = self.history.span()
            if span is None:
                return []
            now = span[1]
        return [f for f in (self.get(now, s) for s in self.scopes()) if f.points]
