"""What ``vnpu monitor`` shows, as data: the chosen metrics' recent series with sparklines, the per-device
table, recent events.  Pure over a :class:`~runtime.observe.source.HistorySource` (the terminal drawing
is :mod:`runtime.cli.monitor`'s).

Metric names on the command line may be the History's (``p99_latency_ms``) or short aliases
(:data:`ALIASES`: ``p99``, ``temp``, ``mem_frag`` ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .metrics_store import METRICS, Event

ALIASES: dict[str, str] = {
    "p50": "p50_latency_ms", "p95": "p95_latency_ms", "p99": "p99_latency_ms", "latency": "p99_latency_ms", "ttft": "ttft_p99_ms",
    "errors": "error_rate", "shed": "shed_rate", "queue": "queue_depth", "kv": "kv_cache_usage",
    "mem_frag": "hbm_fragmentation", "frag": "hbm_fragmentation", "pool_frag": "pool_fragmentation",
    "temp": "device_temperature_c", "power": "device_power_w", "util": "aicore_util", "aicore": "aicore_util",
    "hbm": "hbm_used_bytes", "health": "device_health",
}
DEFAULT_METRICS = ("qps", "p99", "error_rate", "mem_frag", "temp")

#: the per-device table's columns: (metric, header)
DEVICE_COLUMNS = (("device_health", "health"), ("device_temperature_c", "temp C"), ("device_power_w", "power W"),
                  ("aicore_util", "AICore %"), ("hbm_used_bytes", "HBM MiB"), ("hbm_fragmentation", "frag"))

_BARS = "▁▂▃▄▅▆▇█"
HEALTH_WORDS = {0: "OK", 1: "Warning", 2: "Alarm", 3: "Critical", 4: "Lost"}


def metric_name(s: str) -> str:
    """The History's name of ``s`` (a name or an alias); ValueError for an unknown one."""
    m = ALIASES.get(s.strip(), s.strip())
    if m not in METRICS:
        raise ValueError(f"unknown metric {s!r} (known: {', '.join(sorted(set(ALIASES) | set(METRICS)))})")
    return m


def sparkline(values: list[float], width: int = 40) -> str:
    """The last ``width`` values as block characters scaled between their min and max (flat: a low line)."""
    vs = values[-width:]
    if not vs:
        return ""
    lo, hi = min(vs), max(vs)
    if hi == lo:
        return _BARS[0] * len(vs)
    return "".join(_BARS[min(len(_BARS) - 1, int((v - lo) / (hi - lo) * len(_BARS)))] for v in vs)


@dataclass
class Row:
    metric: str
    scope: str
    latest: float | None
    lo: float | None
    hi: float | None
    spark: str


@dataclass
class View:
    now: float
    where: str
    rows: list[Row]
    devices: dict[str, dict[str, float]]
    events: list[Event]
    server: dict[str, float] = field(default_factory=dict)
    forecasts: list = field(default_factory=list)    #: runtime.observe.forecast.Forecast per model

    def to_dict(self) -> dict:
        return {"now": self.now, "source": self.where, "server": self.server,
                "metrics": [{"metric": r.metric, "scope": r.scope, "latest": r.latest, "min": r.lo, "max": r.hi}
                            for r in self.rows],
                "devices": self.devices, "events": [e.to_dict() for e in self.events],
                "forecasts": [f.to_dict() for f in self.forecasts]}


def build(src, metrics: list[str], window_s: float = 120.0, events: int = 8, width: int = 40) -> View:
    """One frame: the last ``window_s`` of each metric (device metrics: one row per device)."""
    server, devs = src.latest()
    now = max([t for t, _ in server.values()] + [t for d in devs.values() for t, _ in d.values()]
              + [src.now() if not server and not devs else 0.0])
    scopes = sorted(devs, key=lambda s: int(s.rpartition(":")[2]) if s.rpartition(":")[2].isdigit() else 1 << 30)
    rows = []
    for m in metrics:
        per_dev = METRICS[m][1].startswith("per device")
        for scope in (scopes if per_dev else [""]):
            pts = src.samples(m, now - window_s, now, scope)
            vs = [v for _, v in pts]
            rows.append(Row(m, scope, vs[-1] if vs else None, min(vs) if vs else None, max(vs) if vs else None,
                            sparkline(vs, width)))
    dev_table = {s: {m: devs[s][m][1] for m, _ in DEVICE_COLUMNS if m in devs[s]} for s in scopes}
    return View(now, src.where, rows, dev_table, src.events(limit=events),
                {m: v for m, (_, v) in server.items()}, src.forecasts())
