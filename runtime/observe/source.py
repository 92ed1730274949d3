"""Where an operator's command reads a server's history from: the same read API over a local History
file (``--history FILE``) or over a running server's ``/admin/history/*`` routes (``--url``).

:class:`HistorySource` is that API (``samples``, ``scopes``, ``latest``, ``devices``, ``events``, ``event``,
``span``, ``now``, ``record_event``); :class:`FileSource` reads a :class:`~runtime.observe.metrics_store.History`
(read and written in this process), :class:`HttpSource` asks the server (admin key required; stdlib HTTP,
no third-party client).  :func:`open_source` picks one the way every command does:

1. ``--history FILE``: that file (it must exist: a typo does not create an empty history);
2. ``--url U``: the server at ``U`` (key from ``--api-key``, else ``$VNPU_API_KEY``);
3. the server file ``<state dir>/serve/server.json`` written by a running ``vnpu serve`` (url, pid,
   history path; :mod:`runtime.observe.serverfile`): its URL when a key is known, else its history file
   (the file holds no key);
4. the history file in the state directory (a stopped server's history).

Blocking: every call of :class:`HttpSource` is one HTTP round trip (``timeout_s``); :class:`FileSource`
calls are one SQLite read.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterable

from . import serverfile
from .forecast import Forecast, Forecaster
from .metrics_store import METRICS, Event, History, HistoryError, UnknownMetric, default_path


class SourceError(Exception):
    """No history to read (no file, no server), or the server refused / failed a read.  Its message is one
    line for the command to print."""


class HistorySource:
    """The read API every operator command uses (and ``record_event`` for operator events)."""

    where: str = ""

    def samples(self, metric: str, since: float | None = None, until: float | None = None,
                scope: str = "") -> list[tuple[float, float]]:
        raise NotImplementedError

    def latest(self) -> tuple[dict[str, tuple[float, float]], dict[str, dict[str, tuple[float, float]]]]:
        """(server metric -> (ts, v), {``npu:<id>``: metric -> (ts, v)})."""
        raise NotImplementedError

    def events(self, since: float | None = None, until: float | None = None, kinds: Iterable[str] | None = None,
               limit: int | None = None) -> list[Event]:
        raise NotImplementedError

    def record_event(self, kind: str, *, diagnosis: str = "", detail: dict | None = None,
                     manual: bool = False, source: str = "operator") -> int | None:
        raise NotImplementedError

    def now(self) -> float:
        """The time the history's newest data speaks of ("now" for ``--since 1h``): the newest sample or
        event, or the wall clock for a live server."""
        raise NotImplementedError

    def forecasts(self) -> list[Forecast]:
        """The next hour's forecast request rate of the server and of each model with history
        (:mod:`runtime.observe.forecast`), as of :meth:`now`."""
        raise NotImplementedError

    def devices(self) -> list[str]:
        """Device scopes (``npu:<id>``) with samples, by device number."""
        _, devs = self.latest()
        return sorted(devs, key=_scope_key)

    def event(self, event_id: int) -> Event:
        for e in self.events():
            if e.id == event_id:
                return e
        raise SourceError(f"no event {event_id} in {self.where}")

    def close(self) -> None:
        pass

    def __enter__(self) -> "HistorySource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _scope_key(s: str) -> tuple[int, str]:
    tail = s.rpartition(":")[2]
    return (int(tail), s) if tail.isdigit() else (1 << 30, s)


class FileSource(HistorySource):
    """A History file (``must_exist``: refuse a path that is not there rather than create it)."""

    def __init__(self, path: str | Path | History, must_exist: bool = True):
        if isinstance(path, History):
            self.h, self._own = path, False
        else:
            p = Path(path)
            if must_exist and not p.is_file():
                raise SourceError(f"no history file {p}")
            try:
                self.h, self._own = History(p), True
            except HistoryError as e:
                raise SourceError(str(e)) from None
        self.where = self.h.path
        self._fc: Forecaster | None = None

    def samples(self, metric, since=None, until=None, scope=""):
        try:
            return self.h.samples(metric, since, until, scope)
        except UnknownMetric as e:
            raise SourceError(str(e)) from None

    def latest(self):
        devs = {}
        for m in METRICS:
            for s in self.h.scopes(m):
                if s.startswith("npu:"):                  # devices (a model's scope holds its qps)
                    devs.setdefault(s, {})
        for s in devs:
            devs[s] = self.h.latest(s)
        return self.h.latest(""), devs

    def events(self, since=None, until=None, kinds=None, limit=None):
        return self.h.events(since, until, kinds, limit)

    def forecasts(self):
        if self._fc is None:                          # one per source: monitor redraws within a bin
            self._fc = Forecaster(self.h)
        return self._fc.all()

    def event(self, event_id):
        try:
            return self.h.event(event_id)
        except KeyError:
            raise SourceError(f"no event {event_id} in {self.where}") from None

    def record_event(self, kind, *, diagnosis="", detail=None, manual=False, source="operator"):
        return self.h.record_event(kind, source=source, diagnosis=diagnosis, detail=detail, manual=manual)

    def now(self):
        span = self.h.span()
        evs = self.h.events(limit=1)
        cands = ([span[1]] if span else []) + [e.ts for e in evs]
        return max(cands) if cands else time.time()

    def close(self):
        if self._own:
            self.h.close()


class HttpSource(HistorySource):
    """A running server's ``/admin/history/*`` routes (``Authorization: Bearer <admin key>``)."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float = 10.0):
        u = urllib.parse.urlparse(url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise SourceError(f"bad server URL {url!r} (e.g. http://127.0.0.1:8000)")
        self.url, self.key, self.timeout_s = url.rstrip("/"), api_key, timeout_s
        self.where = self.url

    def _call(self, method: str, path: str, params: dict | None = None, body: dict | None = None) -> dict:
        q = {k: v for k, v in (params or {}).items() if v is not None}
        url = self.url + path + (("?" + urllib.parse.urlencode(q)) if q else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return json.loads(r.read().decode() or "{}")
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read().decode())["error"]["message"]
            except Exception:  # noqa: BLE001 - not an OpenAI-style error body
                msg = e.reason
            hint = " (give an admin key: --api-key or VNPU_API_KEY)" if e.code in (401, 403) else ""
            raise SourceError(f"{self.url}{path}: HTTP {e.code}: {msg}{hint}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise SourceError(f"cannot reach the server at {self.url}: {getattr(e, 'reason', e)}") from None

    def samples(self, metric, since=None, until=None, scope=""):
        if metric not in METRICS:
            raise SourceError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
        doc = self._call("GET", "/admin/history/samples",
                         {"metric": metric, "since": since, "until": until, "scope": scope})
        return [(float(t), float(v)) for t, v in doc.get("points", [])]

    def latest(self):
        doc = self._call("GET", "/admin/history/latest")
        conv = lambda d: {m: (float(tv[0]), float(tv[1])) for m, tv in d.items()}  # noqa: E731
        return conv(doc.get("server", {})), {s: conv(d) for s, d in doc.get("devices", {}).items()}

    def events(self, since=None, until=None, kinds=None, limit=None):
        ks = ",".join(kinds) if kinds is not None else None
        doc = self._call("GET", "/admin/history/events", {"since": since, "until": until, "kinds": ks,
                                                          "limit": limit})
        out = [Event(**{**e, "detail": e.get("detail") or {}}) for e in doc.get("events", [])]
        return [e for e in out if until is None or e.ts <= until]

    def forecasts(self):
        doc = self._call("GET", "/admin/history/forecast")
        return [Forecast.from_dict(d) for d in doc.get("forecasts", [])]

    def record_event(self, kind, *, diagnosis="", detail=None, manual=False, source="operator"):
        doc = self._call("POST", "/admin/events", body={"kind": kind, "diagnosis": diagnosis, "source": source,
                                                        "detail": dict(detail or {}), "manual": manual})
        return doc.get("id")

    def now(self):
        return time.time()


def open_source(state_dir: Path, history: str | None = None, url: str | None = None,
                api_key: str | None = None) -> HistorySource:
    """The source a command reads (see the module doc for the order).  Raises :class:`SourceError`."""
    if history:
        return FileSource(history)
    key = api_key or os.environ.get("VNPU_API_KEY") or None
    if url:
        return HttpSource(url, key)
    doc = serverfile.read(state_dir)
    if doc is not None:
        if doc.get("url") and key:
            return HttpSource(str(doc["url"]), key)
        if doc.get("history") and Path(doc["history"]).is_file():
            return FileSource(doc["history"])
    p = default_path(state_dir)
    if p.is_file():
        return FileSource(p)
    raise SourceError(f"no running server (no {serverfile.path(state_dir)}) and no history at {p}; "
                      f"give --url or --history")

