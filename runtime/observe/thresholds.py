"""The absolute limits a finding of ``vnpu diagnose`` must cross, each with where it comes from.

A statistical anomaly alone (a series moved by several noise scales) is not a finding: 52 C that rose from
50 C is not "a device ran hot".  A metric becomes a finding only when its samples cross a limit that means
something -- the chip's specs (:class:`devices.chip.ChipSpec`: the thermal throttle point, the TDP, the
saturation point of the AI Cores), the SLO (the p99 target, the error budget of the availability target),
or npu-smi's health codes -- in at least ``min_samples`` samples.  Metrics without such a limit
(``qps``, ``hbm_used_bytes``: the history does not say the capacity) are never findings by themselves.

Pure data and arithmetic: nothing here reads the history or blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

from devices.chip import ASCEND_910B3, ChipSpec

from .metrics_store import HEALTH_CODES, METRICS


@dataclass(frozen=True)
class Threshold:
    """``metric`` is bad beyond ``limit`` (above it when ``direction`` is +1, below when -1)."""

    metric: str
    limit: float
    direction: int
    what: str            #: "the chip's 85 °C throttle point"
    source: str          #: "chip spec Ascend910B3", "SLO (event #3)", ...

    def crossed(self, v: float) -> bool:
        return v >= self.limit if self.direction > 0 else v < self.limit

    def count(self, points: list[tuple[float, float]]) -> int:
        """How many of ``points`` (``(ts, value)``) cross the limit."""
        return sum(1 for _, v in points if self.crossed(v))

    def to_dict(self) -> dict:
        return {"metric": self.metric, "limit": self.limit, "direction": self.direction, "what": self.what,
                "source": self.source}


def fmt_value(metric: str, v: float) -> str:
    """A metric's value with its unit (``91 °C``, ``1200 ms``, ``6.9 %``, ``0.42``)."""
    unit = METRICS[metric][0]
    if unit == "ratio":
        return f"{v:.3g}"
    if unit == "bytes":
        return f"{v / 2**20:.0f} MiB"
    if unit == "code":
        return f"{v:.0f}"
    return f"{v:.4g} {'°C' if unit == 'C' else unit}"


def _slo_source(origin: str) -> str:
    return "SLO, " + ("serve config default" if origin == "default" else origin)


def thresholds(chip: ChipSpec = ASCEND_910B3, target_p99_ms: float = 800.0, availability: float = 0.995,
               slo_origin: str = "default") -> dict[str, Threshold]:
    """metric -> its :class:`Threshold` for ``chip`` and the SLO (``slo_origin``: where the SLO came from)."""
    slo = _slo_source(slo_origin)
    spec = f"chip spec {chip.name}"
    budget = max(0.0, 1.0 - availability)
    out = [Threshold(m, target_p99_ms, 1, f"the {target_p99_ms:.0f} ms p99 target", slo)
           for m in ("p99_latency_ms", "p95_latency_ms", "ttft_p99_ms")]
    out += [Threshold(m, max(budget, 1e-9), 1, f"the {budget:.2%} error budget of the {availability:.2%} availability target",
                      slo) for m in ("error_rate", "shed_rate")]
    out += [
        Threshold("device_temperature_c", chip.temp_throttle_c, 1, f"the chip's {chip.temp_throttle_c:.0f} °C "
                  f"throttle point", spec),
        Threshold("device_power_w", 0.95 * chip.tdp_w, 1, f"95 % of the chip's {chip.tdp_w:.0f} W TDP", spec),
        Threshold("aicore_util", chip.saturation_util_pct, 1, f"the AI Cores' {chip.saturation_util_pct:.0f} % "
                  f"saturation point", spec),
        Threshold("device_health", float(HEALTH_CODES["Alarm"]), 1, "health Alarm (code 2) or worse",
                  "npu-smi health codes"),
        Threshold("hbm_fragmentation", 0.7, 1, "0.7 (the largest free block under 30 % of free HBM)",
                  "vnpu default, as stress-test's risk threshold"),
        Threshold("pool_fragmentation", 0.7, 1, "0.7 (the largest free block under 30 % of the pool's free)",
                  "vnpu default, as stress-test's risk threshold"),
        Threshold("kv_cache_usage", 0.95, 1, "95 % of the KV blocks (preemptions re-run prefills)",
                  "vnpu default, as stress-test's risk threshold"),
        Threshold("throttle", 1.0, -1, "1 (admission throttled)", "definition of the admission factor"),
    ]
    return {t.metric: t for t in out}
