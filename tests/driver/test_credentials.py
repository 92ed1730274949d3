"""Tenant credentials as pure logic (:mod:`driver.credentials`): minting, verification, revocation and a
device's verifier with its cache -- each rule pinned to its edge on an injectable clock.

The security tier drives credentials over real gRPC (tests/security/test_identity.py); here the edges
are exact: a credential verifies until the second it expires and not at it, a cached verification is
dropped one tick after expiry (the cache must not outlive the credential), a tenant revocation refuses
what was issued before it and not what was issued at it.  The MAC's derivation is recomputed here from
the module's documentation (HMAC-SHA256 under a key derived from the cluster secret), so a change to the
format is a failing test (scripts/mutation.py, target ``credentials``).  In-process, no gRPC, no sleeps.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat

import pytest

from devices.errors import InvalidParamError
from driver import credentials as cr

SECRET = "credentials-test-cluster-secret-0123456789"
T0 = 1_700_000_000.25


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def mac_of(secret: str, body: str) -> str:
    """The MAC as the module documents it: HMAC-SHA256 under HMAC(secret, label), base64url, no padding."""
    key = hmac.new(secret.encode(), b"vnpu tenant credential v1", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(hmac.new(key, body.encode(), hashlib.sha256).digest()).rstrip(b"=").decode()


def signed(body: str, secret: str = SECRET) -> str:
    return f"{body}.{mac_of(secret, body)}"


# ---------------------------------------------------------------------------------------------- mint / verify
def test_a_credential_says_who_when_and_until_when_and_is_signed_as_documented():
    tok = cr.mint(SECRET, "alice", ttl_s=90.9, now=T0)
    prefix, version, tenant, issued, expires, tid, mac = tok.split(".")
    assert (prefix, version, tenant) == ("vnpu", "t1", "alice")
    assert issued == str(int(T0 * 1000)) and expires == str(int(T0 + 90.9))
    assert len(tid) == 32 and int(tid, 16) >= 0
    assert tok == signed(tok.rpartition(".")[0])
    assert "=" not in mac and len(mac) == 43
    c = cr.verify(SECRET, tok, now=T0)
    assert c == cr.Claims("alice", int(T0 * 1000), int(T0 + 90.9), tid) == cr.claims_of(tok)
    assert cr.is_credential(tok) and not cr.is_credential(SECRET) and not cr.is_credential(None)
    assert cr.mint(SECRET, "alice", now=T0) != cr.mint(SECRET, "alice", now=T0)         # fresh ids
    assert cr.claims_of(cr.mint(SECRET, "b", now=T0)).expires_s == int(T0 + cr.DEFAULT_TTL_S)


def test_a_credential_verifies_until_its_expiry_second_and_not_at_it():
    tok = cr.mint(SECRET, "alice", ttl_s=60, now=T0)
    exp = cr.claims_of(tok).expires_s
    assert cr.verify(SECRET, tok, now=exp - 1e-3).tenant == "alice"
    for now in (exp, exp + 1e-3):
        with pytest.raises(cr.CredentialError, match="credential of tenant 'alice' expired") as e:
            cr.verify(SECRET, tok, now=now)
        assert e.value.code == 207006
    assert cr.verify(SECRET, tok, now=exp + 1e6, check=False).tenant == "alice"    # naming it in a revocation


def test_the_wall_clock_is_the_default():
    old = cr.mint(SECRET, "alice", ttl_s=1, now=1000.0)
    with pytest.raises(cr.CredentialError, match="expired"):
        cr.verify(SECRET, old)
    assert cr.verify(SECRET, cr.mint(SECRET, "alice")).tenant == "alice"


def test_what_does_not_verify():
    good = cr.mint(SECRET, "alice", now=T0)
    body = good.rpartition(".")[0]
    cases = {
        "not a vnpu tenant credential": [SECRET, "", "Bearer " + good, good[1:], "vnpu.t1." + "x" * 505],
        "does not verify": [good[:-1] + ("A" if good[-1] != "A" else "B"), cr.mint("another-secret-00000000", "alice"),
                            good.replace(".alice.", ".admin."), signed(body + ".extra"),
                            signed(body.rpartition(".")[0]), good.rpartition(".")[0]],
        "malformed credential": [signed(f"vnpu.t1.alice.x{int(T0 * 1000)}.{int(T0 + 60)}.ab"),
                                 signed(f"vnpu.t1.alice.{int(T0 * 1000)}.soon.ab")],
    }
    full = {"not a vnpu tenant credential": "not a vnpu tenant credential",
            "does not verify": "credential does not verify (forged, or of another cluster)",
            "malformed credential": "malformed credential"}
    for text, toks in cases.items():
        for t in toks:
            with pytest.raises(cr.CredentialError) as e:
                cr.verify(SECRET, t, now=T0)
            assert e.value.detail == full[text], (t, e.value.detail)
    longest = signed("vnpu.t1." + "a" * 64 + f".{int(T0 * 1000)}.{int(T0 + 60)}." + "f" * 32)
    assert cr.verify(SECRET, longest, now=T0).tenant == "a" * 64
    at_cap = "vnpu.t1." + "x" * 504                                   # 512 characters: still read, not verified
    assert len(at_cap) == 512
    with pytest.raises(cr.CredentialError) as e:
        cr.verify(SECRET, at_cap, now=T0)
    assert e.value.detail == full["does not verify"]


def test_mint_checks_its_arguments():
    assert cr.claims_of(cr.mint(SECRET, "a", ttl_s=cr.MAX_TTL_S, now=T0)).expires_s == int(T0 + cr.MAX_TTL_S)
    cr.mint(SECRET, "a", ttl_s=0.001, now=T0)
    for ttl in (0, -1, cr.MAX_TTL_S + 1):
        with pytest.raises(InvalidParamError, match="a credential lives between 1 s and 366 days"):
            cr.mint(SECRET, "a", ttl_s=ttl)
    with pytest.raises(InvalidParamError) as e:
        cr.mint("", "a")
    assert e.value.detail == "minting a credential needs the cluster secret"
    with pytest.raises(InvalidParamError, match="reserved"):
        cr.mint(SECRET, "admin")


def test_tenant_names():
    for ok in ("a", "A-b_9", "x" * 64):
        assert cr.check_tenant(ok) == ok
    for bad in ("", "x" * 65, "a.b", "a b", "ä", None, 5, "a\n"):
        with pytest.raises(InvalidParamError, match="a tenant name is 1-64 characters"):
            cr.check_tenant(bad)
    with pytest.raises(InvalidParamError) as e:
        cr.check_tenant("y" * 1000)
    assert len(e.value.detail) <= 200
    with pytest.raises(InvalidParamError, match="tenant name 'admin' is reserved for the cluster token"):
        cr.check_tenant(cr.ADMIN_TENANT)


def test_claims_of_reads_without_verifying():
    forged = cr.mint("someone-else-secret-000000000", "bob", now=T0)
    assert cr.claims_of(forged).tenant == "bob"
    for bad, text in (("not-one", "not a vnpu tenant credential"), ("vnpu.t1.a.1.2.id", "malformed tenant credential"),
                      ("vnpu.t1.a.1.2.id.mac.more", "malformed tenant credential"),
                      ("vnpu.t1.a.one.2.id.mac", "malformed tenant credential")):
        with pytest.raises(InvalidParamError) as e:
            cr.claims_of(bad)
        assert e.value.detail == text


# ---------------------------------------------------------------------------------------------- revocations
def test_revocation_by_id_and_by_tenant_time():
    alice1 = cr.claims_of(cr.mint(SECRET, "alice", now=T0))
    r = cr.Revocations()
    assert not r.refuses(alice1)
    r.revoke_tokens([cr.mint(SECRET, "alice", ttl_s=60, now=T0)], SECRET)
    assert not r.refuses(alice1)                                      # another id
    tok = cr.mint(SECRET, "alice", ttl_s=60, now=T0)
    r.revoke_tokens([tok], SECRET)
    assert r.refuses(cr.claims_of(tok))
    assert r.tokens[cr.claims_of(tok).token_id] == int(T0 + 60)       # kept until it would expire
    with pytest.raises(cr.CredentialError):                           # only this cluster's credentials
        r.revoke_tokens([cr.mint("other-secret-0000000000", "bob")], SECRET)
    r.revoke_tenants(["bob"], now=T0)
    at = int(T0 * 1000)
    assert r.tenants == {"bob": at}
    bob = lambda ms: cr.Claims("bob", ms, int(T0) + 60, "id")         # noqa: E731
    assert r.refuses(bob(at - 1)) and not r.refuses(bob(at)) and not r.refuses(bob(at + 1))
    assert not r.refuses(cr.Claims("carol", 0, 0, "id"))              # no tenant entry: nothing refused
    with pytest.raises(InvalidParamError):
        r.revoke_tenants(["admin"])
    r2 = cr.Revocations().revoke_tenants(["dave"])
    assert abs(r2.tenants["dave"] / 1000 - __import__("time").time()) < 3600


def test_merging_never_undoes_a_revocation():
    r = cr.Revocations().merge({"id1": 100, "id2": 50}, {"t": 1000})
    r.merge({"id1": 10, 3: 70}, {"t": 5, "u": 7})
    assert r.tokens == {"id1": 100, "id2": 50, "3": 70} and r.tenants == {"t": 1000, "u": 7}
    r.merge({"id2": 60}, {"t": 2000})
    assert r.as_dict() == {"tokens": {"id1": 100, "id2": 60, "3": 70}, "tenants": {"t": 2000, "u": 7}}
    d = r.as_dict()
    d["tokens"].clear()
    assert r.tokens                                                    # a copy
    assert cr.Revocations().merge({}, {"z": -5}).tenants == {"z": -1}   # a tenant entry is never below -1
    assert cr.Revocations().merge({"a": 0, "b": -5}, {}).tokens == {"a": 0, "b": 0}   # nor an id's below 0


def test_prune_forgets_what_expired_anyway():
    r = cr.Revocations().merge({"old": 100, "edge": 200, "new": 300}, {"t": 1})
    r.prune(now=200)
    assert r.tokens == {"new": 300} and r.tenants == {"t": 1}
    r2 = cr.Revocations().merge({"past": 1000, "future": int(__import__("time").time()) + 3600}, {})
    assert list(r2.prune().tokens) == ["future"]


def test_the_revocation_file(tmp_path):
    p = tmp_path / "revoked.json"
    assert cr.Revocations.load(p).as_dict() == {"tokens": {}, "tenants": {}}
    future = int(__import__("time").time()) + 3600
    r = cr.Revocations().merge({"b": future, "gone": 5, "a": future + 1}, {"u": 7, "t": 42})
    r.save(p)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    want = {"tokens": {"a": future + 1, "b": future}, "tenants": {"t": 42, "u": 7}}
    assert p.read_text() == json.dumps(want, indent=1, sort_keys=True)    # sorted, one-space indent
    assert sorted(os.listdir(tmp_path)) == ["revoked.json"]           # written atomically, nothing left over
    back = cr.Revocations.load(p)
    assert back.as_dict() == want
    p.write_text("{not json")
    with pytest.raises(InvalidParamError, match="cannot read the revocation list"):
        cr.Revocations.load(p)
    for bad in ("[1, 2]", '{"tokens": [1]}', '{"tokens": {"a": "x"}}'):
        p.write_text(bad)
        with pytest.raises(InvalidParamError, match="malformed revocation list"):
            cr.Revocations.load(p)
    p.write_text('{"tenants": {"t": 9}}')
    assert cr.Revocations.load(p).as_dict() == {"tokens": {}, "tenants": {"t": 9}}
    p.write_text('{"tokens": {"x": 9}}')
    assert cr.Revocations.load(p).as_dict() == {"tokens": {"x": 9}, "tenants": {}}
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(InvalidParamError, match="cannot read"):
        cr.Revocations.load(d)


# ---------------------------------------------------------------------------------------------- the verifier
def test_a_cached_verification_ends_one_tick_after_expiry():
    clock = Clock()
    v = cr.Verifier(SECRET, clock=clock)
    tok = cr.mint(SECRET, "alice", ttl_s=60, now=T0)
    exp = cr.claims_of(tok).expires_s
    p = v.principal(f"Bearer {tok}")                          # verified, then cached
    assert p == cr.Principal("alice", admin=False, until=float(exp))
    clock.t = exp - 1e-3
    assert v.principal(f"Bearer {tok}") is p                  # from the cache, still valid
    clock.t = exp                                             # the tick it expires
    assert v.principal(f"Bearer {tok}") is None
    clock.t = exp + 1e-3
    assert v.principal(f"Bearer {tok}") is None
    clock.t = T0                                              # a clock set back: valid again (never trusted more)
    assert v.principal(f"Bearer {tok}") == p


def test_a_credential_that_expired_before_it_was_seen_is_refused():
    clock = Clock(T0 + 61)
    v = cr.Verifier(SECRET, clock=clock)
    assert v.principal(f"Bearer {cr.mint(SECRET, 'alice', ttl_s=60, now=T0)}") is None


def test_the_admin_and_what_is_no_principal():
    v = cr.Verifier(SECRET, clock=Clock())
    admin = v.principal(f"Bearer {SECRET}")
    assert admin == cr.Principal("admin", admin=True, until=None)
    assert v.principal(f"Bearer {SECRET}".encode()) == admin
    tok = cr.mint(SECRET, "alice", now=T0)
    assert v.principal(f"Bearer {tok}".encode()) == v.principal(f"Bearer {tok}")
    assert v.principal(bytearray(f"Bearer {tok}".encode())).tenant == "alice"
    for bad in (None, "", SECRET, f"bearer {tok}", f"Basic {tok}", f"Bearer  {tok}", f"Bearer {SECRET}x",
                "Bearer " + "x" * 600, b"Bearer \xff\xfe", f"Bearer {cr.mint('other-secret-0000000000', 'alice')}"):
        assert v.principal(bad) is None, bad


def test_revocation_drops_cached_verifications():
    clock = Clock()
    v = cr.Verifier(SECRET, clock=clock)
    a, b = cr.mint(SECRET, "alice", now=T0), cr.mint(SECRET, "bob", now=T0)
    assert v.principal(f"Bearer {a}").tenant == "alice" and v.principal(f"Bearer {b}").tenant == "bob"
    v.revoke({cr.claims_of(a).token_id: cr.claims_of(a).expires_s}, {})
    assert v.principal(f"Bearer {a}") is None and v.principal(f"Bearer {b}").tenant == "bob"
    v.revoke({}, {"bob": int(T0 * 1000) + 1})
    assert v.principal(f"Bearer {b}") is None
    later = cr.mint(SECRET, "bob", now=T0 + 1)
    assert v.principal(f"Bearer {later}").tenant == "bob"
    shared = cr.Revocations().merge({cr.claims_of(later).token_id: 0}, {})
    assert cr.Verifier(SECRET, shared, clock=clock).principal(f"Bearer {later}") is None   # a list given at start


def test_the_cache_is_bounded_and_a_full_cache_starts_over():
    """A verification stays cached (revocations merged behind the verifier's back are not seen) until
    the cache fills up: then it is cleared, and the next use verifies again."""
    v = cr.Verifier(SECRET, clock=Clock())
    v.MAX_CACHE = 3
    first = cr.mint(SECRET, "alice", now=T0)
    assert v.principal(f"Bearer {first}").tenant == "alice"
    v.revocations.merge({cr.claims_of(first).token_id: 2 ** 40}, {})       # not through revoke(): cache kept
    assert v.principal(f"Bearer {first}").tenant == "alice"
    for name in ("b", "c"):                                                  # 3 cached: full
        assert v.principal(f"Bearer {cr.mint(SECRET, name, now=T0)}").tenant == name
    assert v.principal(f"Bearer {first}").tenant == "alice"                  # still cached
    assert v.principal(f"Bearer {cr.mint(SECRET, 'd', now=T0)}").tenant == "d"   # clears, then caches d
    assert v.principal(f"Bearer {first}") is None                            # verified again: revoked
