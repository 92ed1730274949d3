"""The metrics history and event log of a server: an embedded time-series store in one SQLite file.

A server samples its metrics about once a second (:meth:`History.record_samples`) and records every event
-- a fault detected, a trigger fired, an action taken with its result and duration, a config change, an
alert, an operator's command (``manual=True``: a *manual intervention*) -- with :meth:`History.record_event`.
``vnpu monitor`` / ``diagnose`` / ``postmortem`` / ``stress-test`` read it back.  The file lives in the
user's state directory (see :func:`default_path`), so the history survives a server restart; samples older
than the retention are pruned as new ones arrive (events are kept as long).

Samples are ``(ts, metric, scope, value)``: ``scope`` is ``""`` for a server-wide metric and
``"npu:<id>"`` for a device's (``device_temperature_c`` of NPU 3 is scope ``npu:3``).  Metric names are
the ones in :data:`METRICS`; a name not listed there is refused (:class:`UnknownMetric`), so a reader and a
writer cannot silently disagree.  Times are wall-clock seconds (``time.time()``) unless the store is given
another clock (tests replay minutes of history in milliseconds).

Thread safety: one connection guarded by a lock; every call is a short transaction (blocks the caller for
the SQLite write, typically well under a millisecond in WAL mode) -- except :meth:`History.wait_newer`,
which blocks its caller (with a deadline) until another thread records a newer sample.  An event loop
waits without a thread: it registers a wake-up with :meth:`History.subscribe` (called from the recording
thread, e.g. ``loop.call_soon_threadsafe(event.set)``) and checks :meth:`History.newer_than` when woken.
Several processes may open the same file (SQLite's WAL locking); readers never block the writer.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

#: metric name -> (unit, help).  Server-wide unless the help says "per device".
METRICS: dict[str, tuple[str, str]] = {
    "qps": ("1/s", "requests finished per second"),
    "p50_latency_ms": ("ms", "median end-to-end latency of the requests finished in the last window"),
    "p95_latency_ms": ("ms", "95th percentile end-to-end latency"),
    "p99_latency_ms": ("ms", "99th percentile end-to-end latency"),
    "ttft_p99_ms": ("ms", "99th percentile time to first token"),
    "error_rate": ("ratio", "server-side failures (5xx, engine errors, failed attempts) / requests; "
                            "client errors (4xx) and shed requests are not errors"),
    "shed_rate": ("ratio", "requests refused by admission control (429/503 before admission) / requests"),
    "queue_depth": ("requests", "requests waiting to be scheduled"),
    "running": ("requests", "requests in execution batches"),
    "kv_cache_usage": ("ratio", "KV-cache blocks in use / total"),
    "throttle": ("ratio", "admission factor (1 = not throttled)"),
    "replicas": ("replicas", "serving replicas"),
    "hbm_used_bytes": ("bytes", "per device: HBM in use"),
    "hbm_fragmentation": ("ratio", "per device: 1 - largest free block / free HBM"),
    "pool_fragmentation": ("ratio", "the caching pool's own fragmentation (memory_stats)"),
    "device_temperature_c": ("C", "per device: chip temperature"),
    "device_power_w": ("W", "per device: chip power"),
    "aicore_util": ("%", "per device: AI Core utilization"),
    "device_health": ("code", "per device: 0 healthy, 1 warning, 2 alarm, 3 critical, 4 lost"),
}

#: device health words -> the ``device_health`` sample value (npu-smi's Health words, then lost)
HEALTH_CODES: dict[str, int] = {"OK": 0, "Warning": 1, "Alarm": 2, "Critical": 3, "Lost": 4}

DEFAULT_RETENTION_S = 7 * 86400.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (ts REAL NOT NULL, metric TEXT NOT NULL, scope TEXT NOT NULL,
                                    value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS samples_by_metric ON samples (metric, scope, ts);
CREATE INDEX IF NOT EXISTS samples_by_ts ON samples (ts);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, kind TEXT NOT NULL,
                                   source TEXT NOT NULL, manual INTEGER NOT NULL, trigger TEXT NOT NULL,
                                   value REAL, diagnosis TEXT NOT NULL, result TEXT NOT NULL, duration_s REAL,
                                   detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_ts ON events (ts);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class HistoryError(Exception):
    """The store cannot be opened or read (not a SQLite file, a newer schema, a closed store)."""


class UnknownMetric(HistoryError, ValueError):
    """A metric name that :data:`METRICS` does not list."""


@dataclass(frozen=True)
class Event:
    """One recorded event.  ``kind`` says what happened (``fault``, ``trigger``, ``action``, ``config``,
    ``alert``, ``manual``, ``lifecycle``, ...); ``source`` who saw or did it; ``trigger`` the policy
    trigger's name (``""`` if none); ``value`` the metric value that fired it; ``diagnosis`` one line;
    ``result`` ``ok`` / ``failed: ...`` / ``""`` while pending; ``duration_s`` detection to recovery."""

    id: int
    ts: float
    kind: str
    source: str = ""
    manual: bool = False
    trigger: str = ""
    value: float | None = None
    diagnosis: str = ""
    result: str = ""
    duration_s: float | None = None
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"id": self.id, "ts": self.ts, "kind": self.kind, "source": self.source, "manual": self.manual,
                "trigger": self.trigger, "value": self.value, "diagnosis": self.diagnosis, "result": self.result,
                "duration_s": self.duration_s, "detail": dict(self.detail)}


def default_path(state_dir: Path) -> Path:
    """Where a server keeps its history: ``<state dir>/serve/history.sqlite`` (the user's state directory,
    ``$VNPU_HOME``, never an embedded cluster's temporary one)."""
    return Path(state_dir) / "serve" / "history.sqlite"


def device_scope(device: int) -> str:
    return f"npu:{int(device)}"


class History:
    """A metrics history and event log in the SQLite file ``path`` (created with its directory, mode 0600).

    ``clock`` gives "now" for events recorded without a time and for pruning; ``retention_s`` bounds how
    long samples are kept.  ``":memory:"`` keeps everything in memory (tests)."""

    SCHEMA_VERSION = "1"

    def __init__(self, path: str | Path, *, retention_s: float = DEFAULT_RETENTION_S,
                 clock: Callable[[], float] = time.time):
        if not retention_s > 0:
            raise ValueError(f"retention_s must be > 0, got {retention_s!r}")
        self.path = str(path)
        self.retention_s = float(retention_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)     # notified by record_tick and close
        self._waiting = 0                                     # threads in wait_newer
        self._wakers: dict[int, Callable[[], None]] = {}      # subscribe(): called by record_tick and close
        self._next_waker = 0
        self._last_prune = float("-inf")
        if self.path != ":memory:":
            p = Path(self.path)
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not p.exists():
                p.touch(mode=0o600)
        try:
            self._db: sqlite3.Connection | None = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)
            if self.path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (self.SCHEMA_VERSION,))
                self._db.commit()
            elif row[0] != self.SCHEMA_VERSION:
                raise HistoryError(f"{self.path}: history schema {row[0]}, this vnpu reads {self.SCHEMA_VERSION}")
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"{self.path}: not a vnpu history ({e})") from None

    # -------------------------------------------------------------- writing
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise HistoryError(f"{self.path}: the history is closed")
        return self._db

    def record_samples(self, ts: float, samples: Mapping[str, float], scope: str = "") -> None:
        """Record one sample per metric at ``ts`` (all in ``scope``); prunes expired samples at most once a
        minute.  NaN and infinite values are skipped (a percentile of no requests is not a number)."""
        self.record_tick(ts, {scope: samples})

    def record_tick(self, ts: float, by_scope: Mapping[str, Mapping[str, float]]) -> None:
        """:meth:`record_samples` for several scopes at once (a sampler's tick: the server's metrics and each
        device's), in one transaction: a reader -- a waiter in :meth:`wait_newer` too -- sees all of the
        tick or none of it."""
        rows = []
        for scope, samples in by_scope.items():
            for name, v in samples.items():
                if name not in METRICS:
                    raise UnknownMetric(f"unknown metric {name!r} (known: {', '.join(METRICS)})")
                v = float(v)
                if v == v and v not in (float("inf"), float("-inf")):
                    rows.append((float(ts), name, scope, v))
        with self._lock:
            db = self._conn()
            db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)", rows)
            if ts - self._last_prune >= 60.0:
                db.execute("DELETE FROM samples WHERE ts < ?", (float(ts) - self.retention_s,))
                self._last_prune = float(ts)
            db.commit()
            self._recorded.notify_all()
            wakers = list(self._wakers.values())
        self._wake(wakers)

    def record_event(self, kind: str, *, ts: float | None = None, source: str = "", manual: bool = False,
                     trigger: str = "", value: float | None = None, diagnosis: str = "", result: str = "",
                     duration_s: float | None = None, detail: Mapping | None = None) -> int:
        """Record an event; returns its id (for :meth:`update_event` when its result is known later)."""
        if not kind:
            raise ValueError("an event needs a kind")
        when = self.clock() if ts is None else float(ts)
        with self._lock:
            db = self._conn()
            cur = db.execute("INSERT INTO events (ts, kind, source, manual, trigger, value, diagnosis, result, "
                             "duration_s, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (when, kind, source, int(bool(manual)), trigger, value, diagnosis, result, duration_s,
                              json.dumps(dict(detail or {}), default=str)))
            db.commit()
            return int(cur.lastrowid or 0)

    def update_event(self, event_id: int, *, result: str | None = None, duration_s: float | None = None,
                     detail: Mapping | None = None) -> None:
        """Set an event's result / duration, and merge ``detail`` into its detail."""
        with self._lock:
            db = self._conn()
            row = db.execute("SELECT detail FROM events WHERE id=?", (int(event_id),)).fetchone()
            if row is None:
                raise KeyError(f"no event {event_id}")
            merged = {**json.loads(row[0]), **dict(detail or {})}
            db.execute("UPDATE events SET result=COALESCE(?, result), duration_s=COALESCE(?, duration_s), "
                       "detail=? WHERE id=?", (result, duration_s, json.dumps(merged, default=str), int(event_id)))
            db.commit()

    # -------------------------------------------------------------- reading
    def samples(self, metric: str, since: float | None = None, until: float | None = None,
                scope: str | None = "") -> list[tuple[float, float]]:
        """``(ts, value)`` of ``metric`` in ``[since, until]``, oldest first; ``scope=None`` reads every
        scope (use :meth:`scopes` to tell them apart)."""
        if metric not in METRICS:
            raise UnknownMetric(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
        q, args = "SELECT ts, value FROM samples WHERE metric=?", [metric]
        if scope is not None:
            q, args = q + " AND scope=?", args + [scope]
        if since is not None:
            q, args = q + " AND ts>=?", args + [float(since)]
        if until is not None:
            q, args = q + " AND ts<=?", args + [float(until)]
        with self._lock:
            return [(float(t), float(v)) for t, v in self._conn().execute(q + " ORDER BY ts", args)]

    def bucketed(self, metric: str, bucket_s: float, since: float, until: float,
                 scope: str = "") -> list[tuple[int, float]]:
        """``(bin, mean)`` of ``metric`` in ``scope`` over ``[since, until)`` in bins of ``bucket_s`` seconds
        (bin ``k`` covers ``[k * bucket_s, (k + 1) * bucket_s)``), oldest first; bins with no sample are left
        out; times are >= 0.  One aggregate query (the forecaster's read)."""
        if not bucket_s > 0:
            raise ValueError(f"bucket_s must be > 0, got {bucket_s!r}")
        with self._lock:
            rows = self._conn().execute(
                "SELECT CAST(ts / ? AS INTEGER) AS k, AVG(value) FROM samples WHERE metric=? AND scope=? "
                "AND ts >= ? AND ts < ? GROUP BY k ORDER BY k",
                (float(bucket_s), metric, scope, float(since), float(until))).fetchall()
        return [(int(k), float(v)) for k, v in rows]

    def scopes(self, metric: str) -> list[str]:
        """The scopes ``metric`` has samples in (``""``, ``npu:<id>``, ``model:<name>``), sorted.  A skip scan
        of the (metric, scope, ts) index: one probe per scope, not a pass over a week of samples."""
        out: list[str] = []
        with self._lock:
            db = self._conn()
            row = db.execute("SELECT MIN(scope) FROM samples WHERE metric=?", (metric,)).fetchone()
            while row is not None and row[0] is not None:
                out.append(row[0])
                row = db.execute("SELECT MIN(scope) FROM samples WHERE metric=? AND scope>?", (metric, row[0])).fetchone()
        return out

    def latest(self, scope: str = "") -> dict[str, tuple[float, float]]:
        """metric -> (ts, value) of its newest sample in ``scope``."""
        with self._lock:
            rows = self._conn().execute("SELECT metric, MAX(ts), value FROM samples WHERE scope=? GROUP BY metric",
                                        (scope,)).fetchall()
        return {m: (float(t), float(v)) for m, t, v in rows}

    def _newer(self, after: float | None, scope: str) -> bool:
        """(With the lock held.)  Whether ``scope`` has a sample newer than ``after``."""
        if self._db is None:
            return False
        row = self._db.execute("SELECT MAX(ts) FROM samples WHERE scope=?", (scope,)).fetchone()
        return row[0] is not None and (after is None or float(row[0]) > float(after))

    def newer_than(self, after: float | None, scope: str = "") -> bool:
        """Whether ``scope`` has a sample newer than ``after`` (any sample if None); False once closed."""
        with self._lock:
            return self._newer(after, scope)

    def wait_newer(self, after: float | None, timeout_s: float, scope: str = "") -> bool:
        """Block the calling thread until ``scope`` has a sample newer than ``after`` (any sample if None)
        -- recorded by another thread of this process -- or ``timeout_s`` passes, or the history is closed;
        whether it has one.  (An event loop waits with :meth:`subscribe` instead, holding no thread.)"""
        with self._recorded:
            self._waiting += 1
            self._recorded.notify_all()            # wait_waiters
            try:
                self._recorded.wait_for(lambda: self._db is None or self._newer(after, scope),
                                        timeout=max(0.0, float(timeout_s)))
                return self._newer(after, scope)
            finally:
                self._waiting -= 1

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` after every recorded tick and on :meth:`close`, from the thread that records (or
        closes) -- so it must be quick and must not call back into this History (hand it to an event loop:
        ``loop.call_soon_threadsafe(event.set)``); an exception from it is ignored.  Returns the function
        that unsubscribes.  A subscriber counts as a waiter (:meth:`waiters`) until it unsubscribes."""
        with self._lock:
            key = self._next_waker
            self._next_waker += 1
            self._wakers[key] = wake
            self._recorded.notify_all()            # wait_waiters

        def unsubscribe() -> None:
            with self._lock:
                self._wakers.pop(key, None)
        return unsubscribe

    def waiters(self) -> int:
        """How many are waiting for a newer sample now: threads in :meth:`wait_newer` and subscribers."""
        with self._lock:
            return self._waiting + len(self._wakers)

    def wait_waiters(self, n: int, timeout_s: float) -> bool:
        """Block until at least ``n`` wait for a newer sample (:meth:`waiters`; a test's gate: what is
        recorded from then on reaches them only through the wake-up), or ``timeout_s`` passed; whether they do."""
        with self._recorded:
            return self._recorded.wait_for(lambda: self._waiting + len(self._wakers) >= n, timeout=timeout_s)

    @staticmethod
    def _wake(wakers: list[Callable[[], None]]) -> None:
        for w in wakers:
            try:
                w()
            except Exception:  # noqa: BLE001 - a subscriber's failure (its loop closed) is not the writer's
                pass

    def events(self, since: float | None = None, until: float | None = None,
               kinds: Iterable[str] | None = None, limit: int | None = None) -> list[Event]:
        """Events in ``[since, until]`` (of ``kinds`` if given), oldest first; ``limit`` keeps the newest."""
        q, args = "SELECT * FROM events WHERE 1=1", []
        if since is not None:
            q, args = q + " AND ts>=?", args + [float(since)]
        if until is not None:
            q, args = q + " AND ts<=?", args + [float(until)]
        ks = list(kinds) if kinds is not None else None
        if ks is not None:
            q, args = q + f" AND kind IN ({','.join('?' * len(ks))})", args + ks
        q += " ORDER BY ts DESC, id DESC"
        if limit is not None:
            q, args = q + " LIMIT ?", args + [int(limit)]
        with self._lock:
            rows = self._conn().execute(q, args).fetchall()
        return [self._event(r) for r in reversed(rows)]

    def event(self, event_id: int) -> Event:
        with self._lock:
            r = self._conn().execute("SELECT * FROM events WHERE id=?", (int(event_id),)).fetchone()
        if r is None:
            raise KeyError(f"no event {event_id}")
        return self._event(r)

    @staticmethod
    def _event(r) -> Event:
        return Event(id=int(r[0]), ts=float(r[1]), kind=r[2], source=r[3], manual=bool(r[4]), trigger=r[5],
                     value=r[6], diagnosis=r[7], result=r[8], duration_s=r[9], detail=json.loads(r[10]))

    def span(self) -> tuple[float, float] | None:
        """(oldest, newest) sample time, or None when there are no samples."""
        with self._lock:
            lo, hi = self._conn().execute("SELECT (SELECT MIN(ts) FROM samples), (SELECT MAX(ts) FROM samples)"
                                          ).fetchone()       # two index probes (one MIN-and-MAX query scans)
        return None if lo is None else (float(lo), float(hi))

    # -------------------------------------------------------------- lifecycle
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._db is None

    def close(self) -> None:
        """Close the store; threads in :meth:`wait_newer` return (False), subscribers are woken."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._recorded.notify_all()
            wakers = list(self._wakers.values())
        self._wake(wakers)

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
