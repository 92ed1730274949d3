"""Rate profiles of the open-loop generator: the intended arrival rate (requests/s) over ``[0, duration]``,
and the arrival times that follow it.

Built-in profiles (:data:`PROFILES`, each scaled by the peak rate ``R``):

- ``steady``: ``R`` throughout;
- ``burst``: ``R/4``, with bursts of ``R`` for 10 % of every period (period = duration/6, at least 10 s);
- ``diurnal``: a day compressed into the duration: ``R * (0.55 - 0.45 cos(2 pi t / duration))`` (a trough at
  the start and end, the peak at mid-run);
- ``spike``: ``R/4``, then ``R`` for 5 % of the duration from 45 %.

A YAML profile gives points ``{at: 30s, rate: 20}`` joined linearly (``step: true`` holds each rate until
the next point); ``rate`` may be ``"50%"`` of ``--rate``.

Arrivals are a non-homogeneous Poisson process (``poisson=True``, seeded) by time rescaling: unit
exponential gaps in the integrated rate ``Lambda(t)``, mapped back through its inverse; or evenly spaced
in ``Lambda`` (``poisson=False``: arrival ``k`` when ``Lambda(t) = k + 1/2``).  Pure functions.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Profile:
    name: str
    duration_s: float
    rate: Callable[[float], float]          #: t (s from the start) -> intended requests/s
    peak: float

    def expected(self, t0: float = 0.0, t1: float | None = None, steps: int = 4000) -> float:
        """Requests intended in ``[t0, t1]`` (the integral of the rate)."""
        t1 = self.duration_s if t1 is None else t1
        if t1 <= t0:
            return 0.0
        ts = np.linspace(t0, t1, steps + 1)
        r = np.array([self.rate(float(t)) for t in ts])
        return float(np.sum((r[1:] + r[:-1]) * 0.5 * np.diff(ts)))


def _steady(R: float, d: float):
    return lambda t: R


def _burst(R: float, d: float):
    period = max(10.0, d / 6.0)
    on = 0.1 * period
    return lambda t: R if (t % period) >= period - on else R / 4.0


def _diurnal(R: float, d: float):
    return lambda t: R * (0.55 - 0.45 * math.cos(2.0 * math.pi * t / d))


def _spike(R: float, d: float):
    return lambda t: R if 0.45 * d <= t < 0.5 * d else R / 4.0


#: name -> (peak rate, duration) -> rate function
PROFILES: dict[str, Callable[[float, float], Callable[[float], float]]] = {
    "steady": _steady, "burst": _burst, "diurnal": _diurnal, "spike": _spike}


class ProfileError(ValueError):
    """A profile that cannot be used (unknown name, bad YAML); one line."""


def builtin(name: str, rate: float, duration_s: float) -> Profile:
    if name not in PROFILES:
        raise ProfileError(f"unknown profile {name!r} (known: {', '.join(PROFILES)}, or a .yaml file)")
    if not rate > 0 or not duration_s > 0:
        raise ProfileError("the rate and the duration must be > 0")
    return Profile(name, duration_s, PROFILES[name](rate, duration_s), rate)


def from_doc(doc, rate: float, duration_s: float, name: str = "profile.yaml") -> Profile:
    """A profile from a parsed YAML document ``{points: [{at, rate}, ...], step: false}`` (or a bare list)."""
    from runtime.cliargs import parse_duration
    pts = doc.get("points") if isinstance(doc, dict) else doc
    step = bool(doc.get("step", False)) if isinstance(doc, dict) else False
    if not isinstance(pts, list) or not pts:
        raise ProfileError(f"{name}: give points: [{{at: 0s, rate: 10}}, ...]")
    out = []
    for i, p in enumerate(pts):
        if not isinstance(p, dict) or "at" not in p or "rate" not in p:
            raise ProfileError(f"{name}: point {i} needs at and rate")
        try:
            at = parse_duration(str(p["at"])) if not isinstance(p["at"], (int, float)) else float(p["at"])
        except ValueError as e:
            raise ProfileError(f"{name}: point {i}: {e}") from None
        r = p["rate"]
        if isinstance(r, str) and r.strip().endswith("%"):
            try:
                r = float(r.strip()[:-1]) / 100.0 * rate
            except ValueError:
                raise ProfileError(f"{name}: point {i}: bad rate {p['rate']!r}") from None
        if not isinstance(r, (int, float)) or isinstance(r, bool) or r < 0 or math.isnan(r):
            raise ProfileError(f"{name}: point {i}: rate must be a number >= 0 or a percentage")
        out.append((at, float(r)))
    ats = [a for a, _ in out]
    if ats != sorted(ats) or ats[0] != 0:
        raise ProfileError(f"{name}: points must start at 0 and go forward in time")
    if max(r for _, r in out) <= 0:
        raise ProfileError(f"{name}: every rate is 0")
    xs, ys = np.array(ats), np.array([r for _, r in out])

    def f(t: float) -> float:
        if step:
            return float(ys[max(0, int(np.searchsorted(xs, t, side="right")) - 1)])
        return float(np.interp(t, xs, ys))
    return Profile(name, duration_s, f, float(ys.max()))


def arrivals(p: Profile, seed: int = 0, poisson: bool = True, steps: int = 20000) -> list[float]:
    """Arrival times (s from the start, sorted, all in ``[0, duration)``) following ``p``'s rate."""
    ts = np.linspace(0.0, p.duration_s, steps + 1)
    r = np.array([max(0.0, p.rate(float(t))) for t in ts])
    lam = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) * 0.5 * np.diff(ts))])
    total = float(lam[-1])
    if poisson:
        rng = random.Random(seed)
        marks, x = [], rng.expovariate(1.0)
        while x < total:
            marks.append(x)
            x += rng.expovariate(1.0)
    else:
        marks = [k + 0.5 for k in range(int(math.floor(total - 0.5)) + 1) if k + 0.5 < total]
    out = np.interp(np.array(marks), lam, ts) if marks else np.array([])
    return [float(t) for t in out if t < p.duration_s]
