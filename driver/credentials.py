"""Tenant credentials: minted from the cluster secret, verified by every device without a database.

A credential is the text ``vnpu.t1.<tenant>.<issued_ms>.<expires_s>.<id>.<mac>`` where ``mac`` is
HMAC-SHA256 (base64url, no padding) over the other fields under a key derived from the cluster secret
(the cluster token, which only the cluster's operator and its devices hold).  A device that knows the
secret checks the MAC, the expiry and its revocation list, and takes the tenant from the credential --
never from what the caller claims.  The cluster token itself authenticates the admin (tenant
:data:`ADMIN_TENANT`, which no credential can name).

Revocation (:class:`Revocations`): a credential by its id (kept until it would have expired anyway), or a
whole tenant from a point in time (every credential issued before it; later ones are valid).  The
list travels to running devices over DMS ``Revoke`` (admin only) and lives in the cluster's state
directory (``revoked.json``) for devices that start later.  Time is the machines' wall clock: credentials
carry expiry times, so clock skew between machines shortens or stretches them by that much.

Pure functions and values; no I/O except :meth:`Revocations.load` / :meth:`Revocations.save`.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from devices.errors import ACL_ERROR_RT_NO_PERMISSION, AclError, InvalidParamError

PREFIX = "vnpu.t1."
#: the admin's tenant: what the cluster token authenticates (no credential can name it)
ADMIN_TENANT = "admin"
TENANT_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")      #: the whole name (fullmatch: no trailing newline)
DEFAULT_TTL_S = 24 * 3600.0
MAX_TTL_S = 366 * 24 * 3600.0
_KEY_LABEL = b"vnpu tenant credential v1"


class CredentialError(AclError):
    """A credential that does not verify (forged, expired, revoked, of another cluster, malformed)."""
    default_code = ACL_ERROR_RT_NO_PERMISSION


@dataclass(frozen=True)
class Claims:
    """What a verified credential says."""
    tenant: str
    issued_ms: int
    expires_s: int
    token_id: str


def check_tenant(name) -> str:
    if not isinstance(name, str) or not TENANT_RE.fullmatch(name):
        raise InvalidParamError(f"a tenant name is 1-64 characters of A-Z a-z 0-9 _ -, not {name!r}"[:200])
    if name == ADMIN_TENANT:
        raise InvalidParamError(f"tenant name {ADMIN_TENANT!r} is reserved for the cluster token")
    return name


def _key(secret: str) -> bytes:
    return hmac.new(secret.encode(), _KEY_LABEL, hashlib.sha256).digest()


def _mac(secret: str, body: str) -> str:
    d = hmac.new(_key(secret), body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(d).rstrip(b"=").decode()


def mint(secret: str, tenant: str, ttl_s: float = DEFAULT_TTL_S, now: float | None = None) -> str:
    """A credential of ``tenant`` valid for ``ttl_s`` seconds from ``now`` (default: the wall clock)."""
    check_tenant(tenant)
    if not (0 < ttl_s <= MAX_TTL_S):
        raise InvalidParamError(f"a credential lives between 1 s and {MAX_TTL_S / 86400:g} days, not {ttl_s!r} s")
    if not secret:
        raise InvalidParamError("minting a credential needs the cluster secret")
    t = time.time() if now is None else now
    body = f"{PREFIX}{tenant}.{int(t * 1000)}.{int(t + ttl_s)}.{secrets.token_hex(16)}"
    return f"{body}.{_mac(secret, body)}"


def is_credential(token: str) -> bool:
    """Whether ``token`` has the form of a tenant credential (not whether it verifies)."""
    return isinstance(token, str) and token.startswith(PREFIX)


def claims_of(token: str) -> Claims:
    """What a credential *says* (no verification: for naming it in a revocation)."""
    if not is_credential(token):
        raise InvalidParamError("not a vnpu tenant credential")
    parts = token[len(PREFIX):].split(".")
    try:
        tenant, issued, expires, tid, _mac_ = parts
        return Claims(tenant, int(issued), int(expires), tid)
    except ValueError:
        raise InvalidParamError("malformed tenant credential") from None


def verify(secret: str, token: str, *, now: float | None = None, check: bool = True) -> Claims:
    """The claims of a credential of this cluster (CredentialError when it does not verify; ``check``:
    also refuse an expired one)."""
    if not is_credential(token) or len(token) > 512:
        raise CredentialError("not a vnpu tenant credential")
    body, _, mac = token.rpartition(".")
    parts = body[len(PREFIX):].split(".")
    if len(parts) != 4 or not hmac.compare_digest(mac.encode(), _mac(secret, body).encode()):
        raise CredentialError("credential does not verify (forged, or of another cluster)")
    tenant, issued, expires, tid = parts
    try:
        claims = Claims(tenant, int(issued), int(expires), tid)
    except ValueError:
        raise CredentialError("malformed credential") from None
    if check and (time.time() if now is None else now) >= claims.expires_s:
        raise CredentialError(f"credential of tenant {tenant!r} expired")
    return claims


@dataclass
class Revocations:
    """Revoked credentials (id -> its expiry, after which it is dropped) and tenants (name -> credentials
    issued before this time, ms, are revoked).  Thread-safe; merging is monotonic (a revocation is never undone)."""
    tokens: dict[str, int] = field(default_factory=dict)
    tenants: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def refuses(self, claims: Claims) -> bool:
        with self._lock:
            return claims.token_id in self.tokens or claims.issued_ms < self.tenants.get(claims.tenant, -1)

    def revoke_tokens(self, tokens: list[str], secret: str) -> "Revocations":
        """Revoke credentials (each must be one of this cluster: CredentialError otherwise)."""
        found = [verify(secret, t, check=False) for t in tokens]
        return self.merge({c.token_id: c.expires_s for c in found}, {})

    def revoke_tenants(self, tenants: list[str], now: float | None = None) -> "Revocations":
        at = int((time.time() if now is None else now) * 1000)
        return self.merge({}, {check_tenant(t): at for t in tenants})

    def merge(self, tokens: dict[str, int], tenants: dict[str, int]) -> "Revocations":
        with self._lock:
            for k, v in tokens.items():
                self.tokens[str(k)] = max(int(v), self.tokens.get(str(k), 0))
            for k, v in tenants.items():
                self.tenants[str(k)] = max(int(v), self.tenants.get(str(k), -1))
        return self

    def prune(self, now: float | None = None) -> "Revocations":
        """Forget revoked credentials that have expired anyway."""
        t = time.time() if now is None else now
        with self._lock:
            self.tokens = {k: v for k, v in self.tokens.items() if v > t}
        return self

    def as_dict(self) -> dict:
        with self._lock:
            return {"tokens": dict(self.tokens), "tenants": dict(self.tenants)}

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Revocations":
        """The list saved at ``path`` (empty when there is none; InvalidParamError when unreadable)."""
        try:
            d = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as e:
            raise InvalidParamError(f"cannot read the revocation list {path}: {e}") from None
        try:
            return cls().merge(dict(d.get("tokens", {})), dict(d.get("tenants", {})))
        except (AttributeError, TypeError, ValueError) as e:
            raise InvalidParamError(f"malformed revocation list {path}: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically, mode 0600."""
        p = Path(path)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.prune().as_dict(), f, indent=1, sort_keys=True)
        os.replace(tmp, p)


@dataclass(frozen=True)
class Principal:
    """Who a call comes from: a tenant, or the admin (the cluster token).  ``until``: the wall-clock time
    its credential expires (None: never)."""
    tenant: str
    admin: bool = False
    until: float | None = None


class Verifier:
    """A device's side: bearer text -> :class:`Principal` (None when it does not authenticate).  Verified
    credentials are cached until they expire or the revocation list changes."""

    MAX_CACHE = 4096

    def __init__(self, secret: str, revocations: Revocations | None = None, clock=time.time):
        self._admin = f"Bearer {secret}".encode()
        self._secret = secret
        self.revocations = revocations or Revocations()
        self._clock = clock
        self._cache: dict[str, Principal] = {}
        self._lock = threading.Lock()

    def principal(self, authorization) -> Principal | None:
        if authorization is None:
            return None
        raw = authorization.encode() if isinstance(authorization, str) else bytes(authorization)
        if hmac.compare_digest(raw, self._admin):
            return Principal(ADMIN_TENANT, admin=True)
        if not raw.startswith(b"Bearer ") or len(raw) > 600:
            return None
        token = raw[7:].decode(errors="replace")
        hit = self._cache.get(token)
        if hit is not None:
            if hit.until is not None and self._clock() >= hit.until:
                return None
            return hit
        try:
            claims = verify(self._secret, token, now=self._clock())
        except CredentialError:
            return None
        if self.revocations.refuses(claims):
            return None
        p = Principal(claims.tenant, until=float(claims.expires_s))
        with self._lock:
            if len(self._cache) >= self.MAX_CACHE:
                self._cache.clear()
            self._cache[token] = p
        return p

    def revoke(self, tokens: dict[str, int], tenants: dict[str, int]) -> None:
        """Merge revocations (DMS Revoke); cached verifications are dropped."""
        self.revocations.merge(tokens, tenants)
        with self._lock:
            self._cache.clear()


__all__ = ["ADMIN_TENANT", "Claims", "CredentialError", "Principal", "Revocations", "Verifier", "check_tenant",
           "claims_of", "is_credential", "mint", "verify"]
