"""HTTP tenants of a server: API keys, priority classes and quotas.

The server is ONE tenant of the devices (its device credential: :mod:`runtime.serve.credentials`); its own
clients are *HTTP tenants* that it tells apart and isolates itself:

- **Keys.** ``Authorization: Bearer <key>`` names the tenant.  Keys are kept as SHA-256 digests only
  (a config may give ``sha256:<hex>`` instead of the key) and compared in constant time.  A missing or
  unknown key is refused (401, ``invalid_api_key``).  With no tenant configured the server is *open*:
  every caller is the ``default`` tenant (no quotas, priority 0, admin) -- and the server refuses to bind
  a non-loopback address that way unless told to (:func:`check_bind`).
- **Priority class.** vLLM's meaning, lower runs first.  A request's own ``priority`` may ask to run
  *later* than its tenant's class, never earlier: the effective priority is
  ``max(class, requested)`` (:meth:`Tenant.effective_priority`).
- **Quotas** (:class:`Quotas`, on an injectable clock): concurrent requests, and tokens per minute over a
  sliding 60 s window.  A request is charged ``prompt + max_tokens`` when admitted (as OpenAI counts
  ``max_tokens`` against the limit) and settled to what it really used when it ends -- a request whose
  client went away is charged the work the engine did for it (its concurrency slot is freed at once, its
  charge settled when the engine reports).  Over a quota ->
  :class:`RateLimited` (429, ``rate_limit_exceeded``) with the time after which the same request would
  be admitted (``Retry-After``, capped at 120 s: the official client stops retrying beyond that); a
  request larger than the whole per-minute quota can never pass and says so (``x-should-retry: false``).
- **Isolation.** Requests carry their tenant; a tenant sees its own usage only (``/v1/usage``); what spans
  tenants (``/metrics``, ``/admin/...``) needs an admin key; a tenant limited to some models gets 404 for
  the others, as OpenAI answers for models one has no access to.  The prefix cache
  (:mod:`runtime.serve.engine.block_manager`) reuses a tenant's KV blocks for that tenant's later requests
  only -- a block's hash includes the tenant -- unless the tenant is configured with
  ``share_prefix_cache: true``: then its blocks and those of every other sharing tenant are one pool.

Pure host-side logic (no HTTP): routes call :meth:`TenantRegistry.authenticate`, :meth:`Quotas.precheck`
(before tokenizing, on a lower bound of the request's tokens), :meth:`Quotas.admit` and
:meth:`Ticket.settle`.  Nothing here blocks.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from devices.errors import InvalidParamError

from .circuit import BreakerSpec
from .engine.errors import ServeError

RETRY_AFTER_MAX_S = 120.0     #: the official client gives up on a larger Retry-After
WINDOW_S = 60.0               #: tokens-per-minute window


class Unauthorized(ServeError):
    """No or an unknown API key (HTTP 401, ``invalid_api_key``)."""


class Forbidden(ServeError):
    """A valid key without the right to this (HTTP 403): admin-only routes."""


class RateLimited(ServeError):
    """Over a quota (HTTP 429, ``rate_limit_exceeded``).  ``retry_after_s``: when the same request would
    pass (None: never -- it is larger than the quota itself); ``limit``: ``requests``, ``tokens`` or ``hbm``."""

    def __init__(self, message: str, retry_after_s: float | None, limit: str, headers: dict | None = None):
        super().__init__(message, None, "rate_limit_exceeded")
        self.retry_after_s = retry_after_s
        self.limit = limit
        self.headers = dict(headers or {})

    def __reduce__(self):
        return (type(self), (self.message, self.retry_after_s, self.limit, self.headers))


class HbmQuotaExceeded(RateLimited):
    """Over the tenant's HBM quota (HTTP 429, code ``hbm_quota_exceeded``; the device's out-of-memory error,
    CANN 207001, that the request would have risked is named in the message)."""

    def __init__(self, message: str, retry_after_s: float | None, limit: str = "hbm", headers: dict | None = None):
        super().__init__(message, retry_after_s, limit, headers)
        self.code = "hbm_quota_exceeded"


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_key(text: str) -> str:
    """A configured key as its digest: ``sha256:<64 hex>`` as given, anything else is the key itself."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidParamError("an API key must be a non-empty string")
    t = text.strip()
    if t.startswith("sha256:"):
        h = t[7:].lower()
        if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise InvalidParamError("sha256: keys take 64 hex digits")
        return h
    if len(t) < 8:
        raise InvalidParamError("an API key must have at least 8 characters")
    return key_digest(t)


@dataclass(frozen=True)
class Quota:
    """``concurrent_requests``: requests in flight at once; ``tokens_per_minute``: prompt + completion
    tokens over a sliding minute; ``hbm_bytes`` (serve.yaml ``hbm_quota: 1GB``): device memory the tenant's
    requests in flight may hold -- each request counts its worst case, the KV-cache blocks of its prompt
    plus ``max_tokens`` on the model's devices, from admission until the engine has finished it.  None:
    unlimited."""
    concurrent_requests: int | None = None
    tokens_per_minute: int | None = None
    retry_after_s: float = 1.0          #: what a concurrency refusal asks the client to wait
    hbm_bytes: int | None = None

    def __post_init__(self):
        for k in ("concurrent_requests", "tokens_per_minute", "hbm_bytes"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise InvalidParamError(f"{k} must be a positive integer, got {v!r}")
        r = self.retry_after_s
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= RETRY_AFTER_MAX_S:
            raise InvalidParamError(f"retry_after_s must be in (0, {RETRY_AFTER_MAX_S:g}], got {r!r}")


@dataclass(frozen=True)
class Tenant:
    name: str
    key_digests: tuple[str, ...] = ()
    priority: int = 0                        #: priority class (lower runs first)
    quota: Quota = field(default_factory=Quota)
    admin: bool = False
    models: tuple[str, ...] | None = None    #: the models it may use (None: all)
    circuit_breaker: BreakerSpec | None = None   #: :mod:`runtime.serve.circuit` (None: none)
    share_prefix_cache: bool = False         #: its KV blocks are reused by (and it reuses) other sharing tenants

    @property
    def cache_salt(self) -> str:
        """The prefix-cache namespace of its requests: the shared one ("") or its own."""
        return "" if self.share_prefix_cache else f"tenant:{self.name}"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise InvalidParamError(f"tenant name must be letters, digits, - or _, got {self.name!r}")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise InvalidParamError(f"priority must be an integer, got {self.priority!r}")
        if not isinstance(self.share_prefix_cache, bool):
            raise InvalidParamError(f"share_prefix_cache must be true or false, got {self.share_prefix_cache!r}")

    def effective_priority(self, requested: int | None, tag_class: int | None = None) -> int:
        """A request may ask to run later than its class, never earlier; so may its tag's class
        (:mod:`runtime.serve.tags`): the stricter -- the largest -- of the three."""
        return max([self.priority] + [int(x) for x in (requested, tag_class) if x is not None])

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


#: who every caller is on a server without keys
OPEN_TENANT = Tenant("default", (), 0, Quota(), admin=True)


class TenantRegistry:
    """API key digests -> tenants."""

    def __init__(self, tenants: tuple[Tenant, ...] = ()):
        names = [t.name for t in tenants]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise InvalidParamError(f"tenant {dup} is listed twice")
        self.tenants = tuple(tenants)
        self._by_digest: dict[str, Tenant] = {}
        for t in tenants:
            if not t.key_digests:
                raise InvalidParamError(f"tenant {t.name} has no api_keys")
            for d in t.key_digests:
                if d in self._by_digest:
                    raise InvalidParamError(f"an API key of tenant {t.name} is also a key of tenant "
                                            f"{self._by_digest[d].name}")
                self._by_digest[d] = t

    @property
    def open(self) -> bool:
        """No keys configured: everyone is :data:`OPEN_TENANT`."""
        return not self._by_digest

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant of an ``Authorization`` header value (:class:`Unauthorized` if none matches)."""
        if self.open:
            return OPEN_TENANT
        if not authorization:
            raise Unauthorized("You didn't provide an API key. You need to provide your API key in an "
                               "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                               None, "invalid_api_key")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("The Authorization header must be 'Bearer <API key>'.", None, "invalid_api_key")
        digest = key_digest(key)
        found = None
        for d, t in self._by_digest.items():          # every digest compared: no early exit on a match
            if hmac.compare_digest(d, digest):
                found = t
        if found is None:
            shown = (key[:3] + "*" * 4 + key[-4:]) if len(key) > 8 else "*" * len(key)
            raise Unauthorized(f"Incorrect API key provided: {shown}.", None, "invalid_api_key")
        return found

    def get(self, name: str) -> Tenant | None:
        if self.open and name == OPEN_TENANT.name:
            return OPEN_TENANT
        return next((t for t in self.tenants if t.name == name), None)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, registry: TenantRegistry, allow_unauthenticated: bool) -> None:
    """Refuse to serve an open server (no keys) on a non-loopback address unless asked to."""
    if registry.open and not is_loopback(host) and not allow_unauthenticated:
        raise InvalidParamError(f"refusing to serve without API keys on {host} (not loopback): configure tenants "
                                f"with api_keys, or pass --allow-unauthenticated (server.allow_unauthenticated)")


# ---------------------------------------------------------------------------------------------- quotas
@dataclass
class Charge:
    """A request's tokens in its tenant's sliding window: charged at ``t`` (the quotas' clock), ``tokens``
    estimated at admission and corrected to what was used at settlement."""
    t: float
    tokens: int


@dataclass
class _Ledger:
    in_flight: int = 0
    hbm: int = 0                                          #: bytes held by its requests in flight
    unsettled: int = 0                                    #: admitted, charge not yet settled
    window: deque = field(default_factory=deque)          #: Charge, oldest first
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rate_limited: int = 0


class Ticket:
    """One admitted request: holds a concurrency slot until :meth:`release` (or :meth:`settle`) and a token
    charge until :meth:`settle`.  A request whose client went away releases its slot at once and is
    settled once the engine has said what it did for it (the work done is charged, answered or not)."""

    def __init__(self, quotas: "Quotas", tenant: Tenant, charge: Charge | None, hbm: int = 0):
        self.quotas, self.tenant = quotas, tenant
        self.hbm = hbm                       #: HBM bytes it holds in the tenant's ledger until settled
        self.charge = charge                 #: its tokens in the window (None: the tenant has no token quota)
        self.released = self.settled = False

    def release(self) -> None:
        """The client is gone: free the concurrency slot now (once); the charge stays until :meth:`settle`."""
        self.quotas.release(self)

    def settle(self, prompt_tokens: int, completion_tokens: int) -> None:
        """The request ended having used these tokens: correct its charge, count them in the tenant's usage,
        free its slot if :meth:`release` did not (once)."""
        self.quotas.settle(self, int(prompt_tokens), int(completion_tokens))


class Quotas:
    """Per-tenant quota ledgers on ``clock`` (injectable; seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S):
        self.clock = clock
        self.window_s = window_s
        self.admission = 1.0                 #: every quota scaled by this (throttle); 1 = as configured
        self._lock = threading.Condition()
        self._ledgers: dict[str, _Ledger] = {}

    def _ledger(self, name: str) -> _Ledger:
        led = self._ledgers.get(name)
        if led is None:
            led = self._ledgers[name] = _Ledger()
        return led

    def _trim(self, led: _Ledger, now: float) -> None:
        while led.window and now - led.window[0].t >= self.window_s:
            led.window.popleft()

    def set_admission(self, factor: float) -> None:
        """Scale every tenant's quotas by ``factor`` (0 < factor <= 1; rounded up, at least 1) until set
        back to 1 -- the HTTP side of a throttle."""
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
            raise InvalidParamError(f"admission factor must be in (0, 1], got {factor!r}")
        with self._lock:
            self.admission = float(factor)
            self._lock.notify_all()

    def _scaled(self, q: Quota) -> Quota:
        if self.admission >= 1.0:
            return q
        f = lambda v: None if v is None else max(1, math.ceil(v * self.admission))     # noqa: E731
        return Quota(f(q.concurrent_requests), f(q.tokens_per_minute), q.retry_after_s, q.hbm_bytes)

    def admit(self, tenant: Tenant, tokens: int, hbm: int = 0) -> Ticket:
        """Admit a request that may use ``tokens`` (prompt + max_tokens) and hold ``hbm`` bytes of device
        memory, or raise :class:`RateLimited` (:class:`HbmQuotaExceeded`)."""
        q = self._scaled(tenant.quota)
        now = self.clock()
        with self._lock:
            led = self._ledger(tenant.name)
            self._refuse_over(tenant, q, led, tokens, now)
            self._refuse_hbm(tenant, q, led, int(hbm))
            led.hbm += int(hbm)
            charge = None
            if q.tokens_per_minute is not None:
                charge = Charge(now, int(tokens))
                led.window.append(charge)
            led.in_flight += 1
            led.unsettled += 1
            led.requests += 1
            self._lock.notify_all()
        return Ticket(self, tenant, charge, int(hbm))

    def _refuse_hbm(self, tenant: Tenant, q: Quota, led: _Ledger, hbm: int) -> None:
        """Raise :class:`HbmQuotaExceeded` (counted) when ``hbm`` more bytes would break the HBM quota."""
        if q.hbm_bytes is None or led.hbm + hbm <= q.hbm_bytes:
            return
        from devices.errors import ACL_ERROR_RT_MEMORY_ALLOCATION, error_name
        led.rate_limited += 1
        self._lock.notify_all()
        never = hbm > q.hbm_bytes
        raise HbmQuotaExceeded(
            f"HBM quota reached for tenant {tenant.name}: Limit {q.hbm_bytes} B, Held {led.hbm} B, Requested "
            f"{hbm} B (the KV cache of the prompt + max_tokens); refused before the device could fail with "
            f"{ACL_ERROR_RT_MEMORY_ALLOCATION} {error_name(ACL_ERROR_RT_MEMORY_ALLOCATION)}. "
            + ("Reduce the prompt or max_tokens." if never else f"Please try again in {q.retry_after_s:g}s."),
            None if never else q.retry_after_s, "hbm",
            {"x-ratelimit-limit-hbm-bytes": str(q.hbm_bytes),
             "x-ratelimit-remaining-hbm-bytes": str(max(0, q.hbm_bytes - led.hbm))})

    def precheck(self, tenant: Tenant, min_tokens: int) -> None:
        """Before the work of sizing a request (tokenizing it): raise :class:`RateLimited` now if a request
        of at least ``min_tokens`` would be refused by :meth:`admit`; nothing is charged (a refusal is
        counted, as :meth:`admit` counts it)."""
        q = self._scaled(tenant.quota)
        now = self.clock()
        with self._lock:
            self._refuse_over(tenant, q, self._ledger(tenant.name), min_tokens, now)

    def _refuse_over(self, tenant: Tenant, q: Quota, led: _Ledger, tokens: int, now: float) -> None:
        """Raise :class:`RateLimited` (counted in ``led``) when ``tokens`` more would break a quota (lock held)."""
        self._trim(led, now)
        if q.concurrent_requests is not None and led.in_flight >= q.concurrent_requests:
            led.rate_limited += 1
            self._lock.notify_all()
            raise RateLimited(f"Rate limit reached for tenant {tenant.name} on concurrent requests: Limit "
                              f"{q.concurrent_requests}, In flight {led.in_flight}. Please try again in "
                              f"{q.retry_after_s:g}s.", q.retry_after_s, "requests",
                              {"x-ratelimit-limit-requests": str(q.concurrent_requests),
                               "x-ratelimit-remaining-requests": "0"})
        if q.tokens_per_minute is not None:
            limit = q.tokens_per_minute
            used = sum(c.tokens for c in led.window)
            hdr = {"x-ratelimit-limit-tokens": str(limit),
                   "x-ratelimit-remaining-tokens": str(max(0, limit - used))}
            if tokens > limit:
                led.rate_limited += 1
                self._lock.notify_all()
                raise RateLimited(f"Request too large for tenant {tenant.name} on tokens per min (TPM): Limit "
                                  f"{limit}, Requested {tokens}. Reduce the prompt or max_tokens.", None,
                                  "tokens", hdr)
            if used + tokens > limit:
                led.rate_limited += 1
                self._lock.notify_all()
                wait = self._wait_for(led, used + tokens - limit, now)
                raise RateLimited(f"Rate limit reached for tenant {tenant.name} on tokens per min (TPM): Limit "
                                  f"{limit}, Used {used}, Requested {tokens}. Please try again in "
                                  f"{wait:.3f}s.", wait, "tokens", hdr)

    def _wait_for(self, led: _Ledger, excess: int, now: float) -> float:
        """Seconds until charges worth ``excess`` tokens have left the window."""
        freed = 0
        for c in led.window:
            freed += c.tokens
            if freed >= excess:
                return min(RETRY_AFTER_MAX_S, max(1e-3, c.t + self.window_s - now))
        return RETRY_AFTER_MAX_S

    def release(self, ticket: Ticket) -> None:
        """:meth:`Ticket.release`: free ``ticket``'s concurrency slot (once).  Host-only (a short lock)."""
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            self._ledger(ticket.tenant.name).in_flight -= 1
            self._lock.notify_all()

    def settle(self, ticket: Ticket, prompt: int, completion: int) -> None:
        """:meth:`Ticket.settle`: correct ``ticket``'s charge to ``prompt + completion`` tokens, count them
        in the tenant's usage, free its slot if not yet (once).  Host-only (a short lock)."""
        with self._lock:
            if ticket.settled:
                return
            ticket.settled = True
            led = self._ledger(ticket.tenant.name)
            if not ticket.released:
                ticket.released = True
                led.in_flight -= 1
            led.unsettled -= 1
            led.hbm -= ticket.hbm
            led.prompt_tokens += prompt
            led.completion_tokens += completion
            if ticket.charge is not None:
                ticket.charge.tokens = prompt + completion
            self._lock.notify_all()

    def usage(self, tenant: Tenant) -> dict:
        """What ``tenant`` has used (its own numbers only)."""
        now = self.clock()
        q = tenant.quota
        with self._lock:
            led = self._ledger(tenant.name)
            self._trim(led, now)
            window = sum(c.tokens for c in led.window)
            return {"tenant": tenant.name, "priority": tenant.priority,
                    "in_flight": led.in_flight, "hbm_bytes": led.hbm, "requests": led.requests,
                    "prompt_tokens": led.prompt_tokens, "completion_tokens": led.completion_tokens,
                    "rate_limited": led.rate_limited, "tokens_this_minute": window,
                    "limits": {"concurrent_requests": q.concurrent_requests, "tokens_per_minute": q.tokens_per_minute}}

    def in_flight(self, name: str) -> int:
        with self._lock:
            return self._ledger(name).in_flight

    def wait_until(self, name: str, pred: Callable[[dict], bool], timeout: float | None = None) -> bool:
        """Block until ``pred`` holds for tenant ``name``'s counters (``in_flight``, ``unsettled``: admitted
        requests whose charge is not settled yet, ``requests``, ``rate_limited``; re-checked on every
        admission, refusal, release and settlement)."""
        def view():
            led = self._ledger(name)
            return {"in_flight": led.in_flight, "unsettled": led.unsettled, "requests": led.requests,
                    "rate_limited": led.rate_limited}
        with self._lock:
            return self._lock.wait_for(lambda: pred(view()), timeout)


def retry_headers(e: RateLimited) -> dict:
    """``Retry-After`` (whole seconds, <= 120) and ``retry-after-ms`` (what the official client reads
    first), or ``x-should-retry: false`` when waiting cannot help."""
    h = dict(e.headers)
    if e.retry_after_s is None:
        h["x-should-retry"] = "false"
    else:
        s = min(RETRY_AFTER_MAX_S, max(1e-3, e.retry_after_s))
        h["Retry-After"] = str(max(1, math.ceil(s)))
        h["retry-after-ms"] = str(max(1, math.ceil(s * 1000)))
    return h
