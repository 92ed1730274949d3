"""Scheduler modes: how large the next step's batch may be and how long to hold it for more arrivals,
chosen per step from the load the engine has seen (a registry, :data:`MODES`, named by the config's
``scheduler.mode``).

- ``ultra_low_latency``: small batches (``low_latency_batch`` sequences), never waits.  Each request gets
  the fastest steps the device can give; throughput is capped by the small batch.
- ``conservative``: the configured limits (``max_num_seqs``, ``max_num_batched_tokens``), never waits: what
  the engine does without a mode.
- ``adaptive``: sized against ``slo.target_p99_ms`` (the end-to-end request latency target).  From the
  decode step times it has observed it fits ``step(B) = a + b*B``; the demand D (running + waiting
  requests) drains at batch ``B`` in ``ceil(D / B)`` rounds of ``tokens + 1`` steps (``tokens``: the mean
  output length of recent requests), so the last of them finishes after about
  ``ceil(D / B) * (tokens + 1) * step(B)``.  Adaptive runs the smallest batch (at least
  ``low_latency_batch``) for which that stays within ``margin * target`` -- the fastest steps the target
  allows -- and, when no batch can, the one that drains the demand soonest.  Light load runs like
  ``ultra_low_latency``; as a queue builds up the batch grows just enough to keep its tail within the
  target -- the queue drains instead of growing, which is what keeps p99 within the
  target where a small fixed batch lets it explode.  When requests arrive faster than one per
  ``max_wait_ms`` and the predicted latency leaves slack, it holds a step that would admit new requests for
  up to one mean inter-arrival gap (never more than ``max_wait_ms``, never more than a quarter of the slack)
  so that they join one prefill.
- ``manual`` (the seed's, and Triton's dynamic batcher): the configured batch (``max_num_seqs``, the
  seed's ``max_batch``) and delay (``max_wait_ms``, the seed's ``timeout_ms``), whatever the load: a step
  that would admit new requests is held until the batch is full or the oldest new request has waited
  ``max_wait_ms``.  Never adapts.
- ``hybrid``: adaptive within the manual bounds -- the batch adaptive picks, never below
  ``low_latency_batch`` (the seed's ``min_batch``) nor above ``max_num_seqs``, the hold never over
  ``max_wait_ms``; before it has a model of the device (no decode step timed yet) or without a target it
  runs as ``manual``.
- ``auto``: adaptive, against a target picked from the server's history (:mod:`runtime.serve.auto_slo`:
  ``target_p99_ms`` is replaced when the server starts and finds enough history); with no target yet it
  runs as ``hybrid`` does without one (``manual``).

Everything here is pure (no device, no thread, no wall clock): :class:`LoadTracker` keeps the
observations on the engine's injectable clock, :func:`MODES` entries map an :class:`Observation` to
:class:`StepLimits`.  Tested symbolically.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from devices.errors import InvalidParamError


@dataclass(frozen=True)
class ModeConfig:
    """``mode``: a name in :data:`MODES`; ``low_latency_batch``: the small batch of
    ``ultra_low_latency`` (and adaptive's floor); ``max_wait_ms``: adaptive's longest hold of a step;
    ``target_p99_ms``: the SLO (``slo.target_p99_ms``; adaptive needs it); ``margin``: the share of the
    target adaptive plans for (the rest absorbs noise)."""
    mode: str = "conservative"
    low_latency_batch: int = 2
    max_wait_ms: float = 20.0
    target_p99_ms: float | None = None
    margin: float = 0.8

    def __post_init__(self):
        if self.mode not in MODES:
            raise InvalidParamError(f"mode {self.mode!r} is unknown (known: {', '.join(MODES)})")
        b = self.low_latency_batch
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise InvalidParamError(f"low_latency_batch must be a positive integer, got {b!r}")
        w = self.max_wait_ms
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 <= w <= 10_000:
            raise InvalidParamError(f"max_wait_ms must be in [0, 10000], got {w!r}")
        t = self.target_p99_ms
        if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0):
            raise InvalidParamError(f"target_p99_ms must be > 0, got {t!r}")
        if self.mode in NEEDS_TARGET and t is None:
            raise InvalidParamError("mode adaptive needs slo.target_p99_ms (the latency it sizes batches against)")
        if not 0 < self.margin <= 1:
            raise InvalidParamError(f"margin must be in (0, 1], got {self.margin!r}")


@dataclass(frozen=True)
class StepLimits:
    """What the next step may do: sequences in the running batch, tokens in the step, and how long the
    engine may hold the step for more arrivals."""
    max_num_seqs: int
    max_num_batched_tokens: int
    max_wait_s: float = 0.0


@dataclass(frozen=True)
class Observation:
    """The load as the engine saw it at ``now``: queue and batch, arrival rate (requests/s over the
    window), the fitted decode step time ``step_a + step_b * B`` (None before any decode step), and the
    mean output length of recent requests."""
    now: float
    running: int
    waiting: int
    arrival_rate: float
    step_a: float | None
    step_b: float | None
    mean_tokens: float

    @property
    def demand(self) -> int:
        return self.running + self.waiting

    def step_time(self, b: int) -> float | None:
        if self.step_a is None:
            return None
        return self.step_a + (self.step_b or 0.0) * b


class Mode(Protocol):
    def __call__(self, obs: Observation, max_num_seqs: int, max_num_batched_tokens: int,
                 cfg: ModeConfig) -> StepLimits: ...


def ultra_low_latency(obs: Observation, max_num_seqs: int, max_num_batched_tokens: int,
                      cfg: ModeConfig) -> StepLimits:
    b = min(cfg.low_latency_batch, max_num_seqs)
    return StepLimits(b, max_num_batched_tokens, 0.0)


def conservative(obs: Observation, max_num_seqs: int, max_num_batched_tokens: int, cfg: ModeConfig) -> StepLimits:
    return StepLimits(max_num_seqs, max_num_batched_tokens, 0.0)


def predicted_latency_s(obs: Observation, b: int) -> float | None:
    """The predicted end-to-end time of the last request of the current demand at batch ``b``: the demand
    drains in ``ceil(demand / b)`` rounds of ``tokens + 1`` steps (output tokens plus the prefill) of
    ``step(b)`` each."""
    t = obs.step_time(b)
    if t is None:
        return None
    rounds = -(-max(obs.demand, 1) // b)
    return rounds * (obs.mean_tokens + 1.0) * t


def adaptive_batch(obs: Observation, max_num_seqs: int, cfg: ModeConfig) -> int:
    """The batch adaptive runs: the smallest one (at least the low-latency batch) whose predicted latency
    for the whole demand stays within ``margin * target``; when none does, the one that drains the demand
    soonest (the smallest of equals).  Before any decode step has been timed: the low-latency batch."""
    floor = min(cfg.low_latency_batch, max_num_seqs)
    if obs.step_a is None:
        return floor
    budget = cfg.margin * (cfg.target_p99_ms or math.inf) / 1e3
    preds = {b: predicted_latency_s(obs, b) for b in range(floor, max_num_seqs + 1)}
    ok = [b for b, p in preds.items() if p is not None and p <= budget]
    if ok:
        return min(ok)
    return min(preds, key=lambda b: (preds[b], b))


def adaptive(obs: Observation, max_num_seqs: int, max_num_batched_tokens: int, cfg: ModeConfig) -> StepLimits:
    b = adaptive_batch(obs, max_num_seqs, cfg)
    wait = 0.0
    p = predicted_latency_s(obs, b)
    if obs.arrival_rate > 0 and p is not None and obs.demand < b:
        gap = 1.0 / obs.arrival_rate
        slack = cfg.margin * (cfg.target_p99_ms or 0.0) / 1e3 - p
        if slack > 0 and gap <= cfg.max_wait_ms / 1e3:
            wait = min(gap, cfg.max_wait_ms / 1e3, slack / 4)
    return StepLimits(b, max(b, max_num_batched_tokens), wait)


def manual(obs: Observation, max_num_seqs: int, max_num_batched_tokens: int, cfg: ModeConfig) -> StepLimits:
    wait = cfg.max_wait_ms / 1e3 if obs.demand < max_num_seqs else 0.0
    return StepLimits(max_num_seqs, max_num_batched_tokens, wait)


def hybrid(obs: Observation, max_num_seqs: int, max_num_batched_tokens: int, cfg: ModeConfig) -> StepLimits:
    if cfg.target_p99_ms is None or obs.step_a is None:
        return manual(obs, max_num_seqs, max_num_batched_tokens, cfg)
    lim = adaptive(obs, max_num_seqs, max_num_batched_tokens, cfg)
    b = min(max(lim.max_num_seqs, min(cfg.low_latency_batch, max_num_seqs)), max_num_seqs)
    return StepLimits(b, max(b, max_num_batched_tokens), min(lim.max_wait_s, cfg.max_wait_ms / 1e3))


def auto(obs: Observation, max_num_seqs: int, max_num_batched_tokens: int, cfg: ModeConfig) -> StepLimits:
    if cfg.target_p99_ms is None:
        return manual(obs, max_num_seqs, max_num_batched_tokens, cfg)
    return adaptive(obs, max_num_seqs, max_num_batched_tokens, cfg)


def throttled(lim: StepLimits, factor: float) -> StepLimits:
    """``lim`` with the batch and the token budget scaled by ``factor`` (0 < factor <= 1; at least one
    sequence, and at least as many tokens as sequences): what a throttled engine may do per step."""
    if factor >= 1.0:
        return lim
    seqs = max(1, math.floor(lim.max_num_seqs * factor))
    return StepLimits(seqs, max(seqs, math.floor(lim.max_num_batched_tokens * factor)), lim.max_wait_s)


#: scheduler mode name -> limits of the next step (a registry: ``scheduler.mode`` names one)
MODES: dict[str, Callable[..., StepLimits]] = {
    "ultra_low_latency": ultra_low_latency,
    "conservative": conservative,
    "adaptive": adaptive,
    "manual": manual,
    "hybrid": hybrid,
    "auto": auto,
}
#: modes that cannot run without ``target_p99_ms`` (auto and hybrid run as manual until they have one)
NEEDS_TARGET = ("adaptive",)


class LoadTracker:
    """Observations over a sliding ``window_s`` on the engine's clock: arrivals, decode step times by batch
    size, output lengths of finished requests.  Pure bookkeeping (the engine thread feeds it)."""

    def __init__(self, window_s: float = 10.0, max_samples: int = 256):
        self.window_s = window_s
        self.arrivals: deque[float] = deque()
        self.steps: deque[tuple[float, int, float]] = deque(maxlen=max_samples)     #: (t, batch, seconds)
        self.lengths: deque[int] = deque(maxlen=64)

    def arrived(self, t: float) -> None:
        self.arrivals.append(t)

    def decode_step(self, t: float, batch: int, seconds: float) -> None:
        self.steps.append((t, batch, seconds))

    def finished(self, tokens: int) -> None:
        self.lengths.append(tokens)

    def _trim(self, now: float) -> None:
        while self.arrivals and now - self.arrivals[0] > self.window_s:
            self.arrivals.popleft()
        while self.steps and now - self.steps[0][0] > self.window_s and len(self.steps) > 8:
            self.steps.popleft()

    def fit(self) -> tuple[float | None, float | None]:
        """Least-squares ``step = a + b * batch`` over the recent decode steps (b >= 0; one batch size
        seen: b from the per-row share ``a/8``, a mild guess that only matters until sizes vary)."""
        if not self.steps:
            return None, None
        xs = [float(b) for _, b, _ in self.steps]
        ys = [s for _, _, s in self.steps]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        if sxx == 0:
            per = my / (mx + 8.0)
            return my - per * mx, per
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
        return max(my - slope * mx, 0.0), slope

    def observe(self, now: float, running: int, waiting: int, default_tokens: float = 16.0) -> Observation:
        self._trim(now)
        rate = 0.0
        if len(self.arrivals) >= 2:
            span = max(now - self.arrivals[0], 1e-6)
            rate = len(self.arrivals) / max(span, self.window_s / 10)
        a, b = self.fit()
        mean = sum(self.lengths) / len(self.lengths) if self.lengths else default_tokens
        return Observation(now, running, waiting, rate, a, b, mean)
