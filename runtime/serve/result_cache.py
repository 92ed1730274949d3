"""The recent-results cache (the seed's ``cache_recent_results``): exact-match answers of *deterministic*
generation requests, per tenant, for a time to live.

- only deterministic requests are cached or answered from the cache: greedy (``temperature`` 0) or with a
  ``seed`` -- the same request gives the same answer, so a cached answer is the answer;
- the key is the tenant, the model, the route (completion or chat) and everything the answer depends on
  (the prompt's token ids and every sampling parameter): a request that differs in any of them misses;
- one table per tenant: a tenant never sees another's entries (the tenant is part of every lookup);
- an entry lives ``ttl_s`` seconds on the cache's clock (injectable) and each tenant keeps at most
  ``max_entries`` (the least recently used goes first);
- the cache is off until self-healing turns it on (action ``cache_results``) and is emptied when it is
  turned off again (the action's release).  Streamed requests are never cached.

Blocking: host-only; every call takes one lock for a dictionary operation.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass(frozen=True)
class CacheOptions:
    ttl_s: float = 60.0
    max_entries: int = 1024


def deterministic(params) -> bool:
    """A request whose answer is a function of its input: greedy, or seeded."""
    return params.temperature == 0 or params.seed is not None


def cache_key(model: str, route: str, ids: list[list[int]], params) -> str:
    """What the answer depends on, hashed (the tenant is kept apart by the table, not the key)."""
    blob = json.dumps([model, route, ids, asdict(params)], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class ResultCache:
    """Per-tenant exact-match answers with a TTL on ``clock`` (off until :meth:`enable`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.options: CacheOptions | None = None
        self._tables: dict[str, OrderedDict[str, tuple[float, object]]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.options is not None

    def enable(self, options: CacheOptions, clock: Callable[[], float] | None = None) -> None:
        with self._lock:
            self.options = options
            if clock is not None:
                self.clock = clock

    def disable(self) -> int:
        """Turn the cache off and empty it; how many entries were dropped."""
        with self._lock:
            n = sum(len(t) for t in self._tables.values())
            self.options, self._tables = None, {}
            return n

    def get(self, tenant: str, key: str):
        """The cached answer of ``tenant`` for ``key``, or None (off, absent or expired)."""
        with self._lock:
            if self.options is None:
                return None
            table = self._tables.get(tenant)
            hit = table.get(key) if table is not None else None
            if hit is None or hit[0] <= self.clock():
                if hit is not None and table is not None:
                    del table[key]
                self.misses += 1
                return None
            table.move_to_end(key)                        # type: ignore[union-attr]
            self.hits += 1
            return hit[1]

    def put(self, tenant: str, key: str, answer) -> None:
        """Keep ``answer`` for ``ttl_s`` (nothing while the cache is off)."""
        with self._lock:
            if self.options is None:
                return
            table = self._tables.setdefault(tenant, OrderedDict())
            table[key] = (self.clock() + self.options.ttl_s, answer)
            table.move_to_end(key)
            while len(table) > self.options.max_entries:
                table.popitem(last=False)

    def stats(self) -> dict:
        with self._lock:
            return {"enabled": self.options is not None, "hits": self.hits, "misses": self.misses,
                    "entries": {t: len(x) for t, x in self._tables.items()},
                    **(asdict(self.options) if self.options is not None else {})}


__all__ = ["CacheOptions", "ResultCache", "cache_key", "deterministic"]
