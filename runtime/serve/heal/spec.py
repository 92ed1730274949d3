"""What a ``self_healing`` section says, as frozen specs, and the small grammars it uses.

- durations: ``10s``, ``5m``, ``1h``, ``250ms`` or a number of seconds;
- fractions: ``20%`` or ``0.2``;
- conditions: ``<op> <operand>`` with ``op`` one of ``> >= < <= == !=`` and the operand a number, a
  percentage (``> 5%`` is ``> 0.05``), a health word (``== lost``, ``>= alarm``: the ``device_health``
  codes), ``slo.<key>`` or ``<k> * slo.<key>`` (``> 2 * slo.target_p99_ms``), resolved when parsed.

A trigger *fires* when its condition holds for the aggregate (mean by default) of its metric over its
window, and is *released* when its release condition holds over the window -- by default the opposite of
the condition moved by ``hysteresis`` (``> 85`` with 10 %: released below 76.5), so a value that wanders
around the threshold does not fire and release in turn.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Callable

from devices.errors import InvalidParamError

from runtime.observe.metrics_store import HEALTH_CODES

#: condition operators (a registry)
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
#: the operator that releases a trigger of each operator
OPPOSITE = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}
def _drop(xs: list[float]) -> float:
    """How far the latest sample fell below the window's peak, as a fraction of the peak (0 when it did not)."""
    peak = max(xs)
    return max(0.0, 1.0 - xs[-1] / peak) if peak > 0 else 0.0


def _rise(xs: list[float]) -> float:
    """How far the latest sample rose above the window's low, as a fraction of the low (inf from 0)."""
    low = min(xs)
    if low <= 0:
        return math.inf if xs[-1] > 0 else 0.0
    return max(0.0, xs[-1] / low - 1.0)


#: aggregates of a window (a registry); ``drop``/``rise`` are relative: the seed's ``sudden_drop>40% in 1m``
#: is ``aggregate: drop, condition: "> 40%", window: 1m``
AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda xs: sum(xs) / len(xs), "max": max, "min": min, "last": lambda xs: xs[-1],
    "drop": _drop, "rise": _rise}
#: the aggregates that measure a change over the window (a trigger's streak is judged on them, not on samples)
RELATIVE = frozenset({"drop", "rise"})
HEALTH_WORDS = {k.lower(): v for k, v in HEALTH_CODES.items()}

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class SpecError(InvalidParamError):
    """A bad value in a ``self_healing`` or ``slo`` section (the config loader adds the key and line)."""


def parse_duration(v, what: str = "duration") -> float:
    """Seconds of ``10s`` / ``5m`` / ``1h`` / ``250ms`` / a number."""
    if isinstance(v, bool):
        raise SpecError(f"{what}: expected a duration (10s, 5m, 1h), got {v!r}")
    if isinstance(v, (int, float)):
        secs = float(v)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)\s*", str(v))
        if m is None:
            raise SpecError(f"{what}: expected a duration (10s, 5m, 1h), got {v!r}")
        secs = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(secs) or secs < 0:
        raise SpecError(f"{what}: must be a finite duration >= 0, got {v!r}")
    return secs


def parse_fraction(v, what: str = "fraction") -> float:
    """``20%`` -> 0.2; ``0.2`` -> 0.2 (in [0, 1])."""
    try:
        if isinstance(v, bool):
            raise ValueError
        f = float(str(v).strip()[:-1]) / 100 if isinstance(v, str) and v.strip().endswith("%") else float(v)
    except (TypeError, ValueError):
        raise SpecError(f"{what}: expected a percentage (20%) or a fraction (0.2), got {v!r}") from None
    if not 0 <= f <= 1:
        raise SpecError(f"{what}: must be in [0%, 100%], got {v!r}")
    return f


@dataclass(frozen=True)
class Condition:
    """``op threshold`` (already resolved); ``text`` is what the config said."""
    op: str
    threshold: float
    text: str = ""

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)

    def released(self, hysteresis: float) -> "Condition":
        """The default release condition: the opposite operator, the threshold moved away from the firing
        side by ``hysteresis`` of its magnitude (equality conditions release on inequality)."""
        op = OPPOSITE[self.op]
        if self.op in (">", ">="):
            t = self.threshold - abs(self.threshold) * hysteresis
        elif self.op in ("<", "<="):
            t = self.threshold + abs(self.threshold) * hysteresis
        else:
            t = self.threshold
        return Condition(op, t, f"{op} {t:g}")

    def __str__(self) -> str:
        return self.text or f"{self.op} {self.threshold:g}"


def parse_condition(text, slo: dict[str, float | None] | None = None) -> Condition:
    """``"> 85"``, ``"> 5%"``, ``"== lost"``, ``"> 2 * slo.target_p99_ms"`` (``slo``: the SLO's values)."""
    if not isinstance(text, str):
        raise SpecError(f"condition: expected text like '> 85', got {text!r}")
    m = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*(.+?)\s*", text)
    if m is None:
        raise SpecError(f"condition {text!r}: expected '<op> <value>' with op one of {' '.join(OPS)}")
    op, rhs = m.group(1), m.group(2)
    return Condition(op, _operand(rhs, text, slo or {}), text.strip())


def _operand(rhs: str, text: str, slo: dict) -> float:
    word = rhs.lower()
    if word in HEALTH_WORDS:
        return float(HEALTH_WORDS[word])
    m = re.fullmatch(r"(?:([0-9]*\.?[0-9]+)\s*\*\s*)?slo\.([a-z_0-9]+)", rhs)
    if m is not None:
        key = m.group(2)
        if key not in slo:
            raise SpecError(f"condition {text!r}: slo has no key {key!r} (known: {', '.join(slo) or 'none'})")
        if slo[key] is None:
            raise SpecError(f"condition {text!r}: needs slo.{key}; add slo: {{{key}: ...}}")
        return float(m.group(1) or 1.0) * float(slo[key])
    try:
        return float(rhs[:-1]) / 100 if rhs.endswith("%") else float(rhs)
    except ValueError:
        raise SpecError(f"condition {text!r}: {rhs!r} is not a number, a percentage, a health word "
                        f"({', '.join(HEALTH_WORDS)}) or slo.<key>") from None


@dataclass(frozen=True)
class TriggerSpec:
    """One trigger: when ``metric`` (aggregated over ``window_s``) meets ``condition``, run ``action``."""
    name: str
    metric: str
    condition: Condition
    action: str
    window_s: float = 0.0
    params: dict = field(default_factory=dict)       #: the action's, already checked by it
    release: Condition | None = None                 #: None: the condition's opposite with hysteresis
    aggregate: str = "mean"
    cooldown_s: float | None = None                  #: None: recovery.cooldown
    lead_s: float = 0.0                              #: forecast metrics: look this far ahead (peak within)
    model: str = ""                                  #: forecast metrics: one model's rate ("" the server's)

    def release_condition(self, hysteresis: float) -> Condition:
        return self.release if self.release is not None else self.condition.released(hysteresis)


@dataclass(frozen=True)
class RecoverySpec:
    """After an action: warm a restarted device with ``warmup_requests`` runs, check health, undo the
    action when the check fails (``rollback_on_failure``); a trigger waits ``cooldown_s`` after its action
    ended before it may fire again.  With ``move_back`` the engines a ``restart_device`` moved off go back
    to the device once it passed the deep check for ``return_after_s`` (and are warmed there with
    ``warmup_requests`` real requests; moved off again when that fails and ``rollback_on_failure``)."""
    warmup_requests: int = 3
    health_check: bool = True
    rollback_on_failure: bool = True
    cooldown_s: float = 120.0
    move_back: bool = False                          #: engines return to a restarted device by themselves
    return_after_s: float = 30.0                     #: ... once it passed the deep check this long


@dataclass(frozen=True)
class FlappingSpec:
    """A trigger that fired ``max_fires`` times within ``window_s`` is *flapping*: it is held (no action)
    for ``hold_s`` and an alert says so."""
    window_s: float = 600.0
    max_fires: int = 3
    hold_s: float = 1800.0


@dataclass(frozen=True)
class AlertSpec:
    """One alert sink: ``kind`` (log, file, webhook, slack) and its settings (``path``, ``url``, a Slack
    ``channel``)."""
    kind: str
    path: str | None = None
    url: str | None = None
    timeout_s: float = 5.0
    channel: str | None = None


@dataclass(frozen=True)
class SelfHealingSpec:
    enabled: bool = False
    triggers: tuple[TriggerSpec, ...] = ()
    recovery: RecoverySpec = field(default_factory=RecoverySpec)
    alerts: tuple[AlertSpec, ...] = ()
    max_actions_per_hour: int = 20
    hysteresis: float = 0.1
    flapping: FlappingSpec = field(default_factory=FlappingSpec)
    risk_ratio: float = 0.9                          #: a "risk" event at this share of a threshold
