"""HTTP tenants' keys and quotas as pure logic (:mod:`runtime.serve.tenants`), on an injectable clock.

The serve tier drives the same code through a real server (tests/serve/test_serve_tenants.py); here each rule
is pinned to its edge -- a request of exactly the per-minute quota passes and one token more does not, a
charge leaves the window exactly 60 s after it was made, a concurrency slot is the last one at exactly the
limit -- so that an off-by-one in a comparison fails a test (scripts/mutation.py, target ``tenants``).
In-process, no server, no sleeps: time is a number the test moves.
"""
from __future__ import annotations

import hashlib
import pickle
import threading

import pytest

from devices.errors import InvalidParamError
from runtime.serve.tenants import (OPEN_TENANT, RETRY_AFTER_MAX_S, WINDOW_S, Quota, Quotas, RateLimited, Tenant,
                                   TenantRegistry, Unauthorized, check_bind, is_loopback, key_digest, parse_key,
                                   retry_headers)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def tenant(tpm=None, conc=None, retry=1.0, name="t") -> Tenant:
    return Tenant(name, (key_digest(f"sk-{name}-0123456789"),), 0, Quota(conc, tpm, retry))


def quotas(t0: float = 1000.0) -> tuple[Quotas, Clock]:
    c = Clock(t0)
    return Quotas(c), c


def refused(q: Quotas, t: Tenant, tokens: int) -> RateLimited:
    with pytest.raises(RateLimited) as e:
        q.admit(t, tokens)
    return e.value


# ---------------------------------------------------------------------------------------------- tokens per minute
def test_a_request_of_exactly_the_quota_passes_and_one_token_more_does_not():
    q, clock = quotas()
    t = tenant(tpm=64)
    q.admit(t, 64)                                        # == the quota: admitted (the limit is inclusive)
    e = refused(q, t, 1)                                  # 65 > 64
    assert e.limit == "tokens" and e.code == "rate_limit_exceeded" and e.retry_after_s == pytest.approx(60.0)
    assert e.message == ("Rate limit reached for tenant t on tokens per min (TPM): Limit 64, Used 64, "
                         "Requested 1. Please try again in 60.000s.")
    assert e.headers == {"x-ratelimit-limit-tokens": "64", "x-ratelimit-remaining-tokens": "0"}
    q2, _ = quotas()
    q2.admit(t, 63)
    q2.admit(t, 1)                                        # 63 + 1 == 64: the last token of the minute
    assert refused(q2, t, 1).retry_after_s == pytest.approx(60.0)
    assert q2.usage(t)["tokens_this_minute"] == 64 and q2.usage(t)["rate_limited"] == 1


def test_a_request_larger_than_the_whole_quota_can_never_pass():
    q, _ = quotas()
    t = tenant(tpm=64)
    q.admit(t, 10)
    e = refused(q, t, 65)
    assert e.retry_after_s is None and e.limit == "tokens"
    refused(q, t, 100)
    assert e.message == ("Request too large for tenant t on tokens per min (TPM): Limit 64, Requested 65. "
                         "Reduce the prompt or max_tokens.")
    assert e.headers == {"x-ratelimit-limit-tokens": "64", "x-ratelimit-remaining-tokens": "54"}
    assert retry_headers(e) == {**e.headers, "x-should-retry": "false"}
    assert q.usage(t)["rate_limited"] == 2 and q.usage(t)["requests"] == 1


def test_a_charge_leaves_the_window_exactly_a_minute_later():
    q, clock = quotas()
    t = tenant(tpm=100)
    t0 = clock.t
    q.admit(t, 60)
    clock.t = t0 + 20
    q.admit(t, 30)
    clock.t = t0 + 30
    e = refused(q, t, 20)                                 # 90 used: 10 over -> the first charge must go
    assert e.retry_after_s == pytest.approx(30.0)         # it leaves at t0 + 60
    assert e.headers["x-ratelimit-remaining-tokens"] == "10"
    clock.t = t0 + 60 - 1e-6
    assert refused(q, t, 20).retry_after_s == pytest.approx(1e-3)  # it leaves in 1 us: at least 1 ms
    assert q.usage(t)["tokens_this_minute"] == 90         # still inside its minute
    clock.t = t0 + 60                                     # exactly a minute after it was charged: gone
    assert q.usage(t)["tokens_this_minute"] == 30
    q.admit(t, 70)                                        # 30 + 70 == 100
    assert refused(q, t, 1).retry_after_s == pytest.approx(20.0)   # the t0+20 charge leaves at t0+80


def test_retry_after_names_the_charge_that_frees_enough():
    q, clock = quotas()
    t = tenant(tpm=100)
    t0 = clock.t
    for i, n in enumerate((10, 20, 30, 40)):              # charged at t0, +1, +2, +3: 100 used
        clock.t = t0 + i
        q.admit(t, n)
    clock.t = t0 + 5
    assert refused(q, t, 10).retry_after_s == pytest.approx(55.0)  # the first (10) is enough
    assert refused(q, t, 11).retry_after_s == pytest.approx(56.0)  # 10 + 20 needed: the second
    assert refused(q, t, 30).retry_after_s == pytest.approx(56.0)  # 30 exactly: still the second
    assert refused(q, t, 31).retry_after_s == pytest.approx(57.0)  # the third
    assert refused(q, t, 100).retry_after_s == pytest.approx(58.0)  # all four
    assert q.usage(t)["rate_limited"] == 5


def test_retry_after_is_bounded():
    t = tenant(tpm=10)
    q, clock = quotas()
    q.admit(t, 10)
    clock.t += WINDOW_S - 1e-9                              # the charge leaves in a nanosecond
    assert refused(q, t, 1).retry_after_s == pytest.approx(1e-3)   # at least a millisecond
    big, clock = quotas()
    big.window_s = 1000.0                                   # a window longer than the client waits
    big.admit(t, 10)
    assert refused(big, t, 1).retry_after_s == RETRY_AFTER_MAX_S
    assert refused(big, t, 5).retry_after_s == RETRY_AFTER_MAX_S


def test_settle_corrects_the_charge_to_what_was_used():
    q, clock = quotas()
    t = tenant(tpm=100)
    tk = q.admit(t, 90)                                     # prompt + max_tokens
    assert tk.settled is False
    assert refused(q, t, 11).limit == "tokens"
    tk.settle(4, 6)                                         # it used 10
    u = q.usage(t)
    assert (u["tokens_this_minute"], u["prompt_tokens"], u["completion_tokens"], u["in_flight"]) == (10, 4, 6, 0)
    q.admit(t, 90)                                          # 10 + 90 == 100
    tk.settle(50, 50)                                       # settling twice changes nothing
    u = q.usage(t)
    assert (u["tokens_this_minute"], u["prompt_tokens"], u["completion_tokens"], u["in_flight"]) == (100, 4, 6, 1)
    assert tk.settled


def test_unlimited_tenants_are_not_charged():
    q, _ = quotas()
    t = tenant()
    tickets = [q.admit(t, 10 ** 9) for _ in range(3)]
    u = q.usage(t)
    assert (u["in_flight"], u["requests"], u["tokens_this_minute"], u["rate_limited"]) == (3, 3, 0, 0)
    assert u["limits"] == {"concurrent_requests": None, "tokens_per_minute": None}
    for tk in tickets:
        tk.settle(1, 2)
    u = q.usage(t)
    assert (u["in_flight"], u["prompt_tokens"], u["completion_tokens"], u["tokens_this_minute"]) == (0, 3, 6, 0)


# ---------------------------------------------------------------------------------------------- concurrency
def test_the_last_concurrency_slot_is_the_limit():
    q, _ = quotas()
    t = tenant(conc=2, retry=0.25)
    a = q.admit(t, 1)
    q.admit(t, 1)                                           # 2 in flight == the limit: admitted
    e = refused(q, t, 1)
    assert e.limit == "requests" and e.retry_after_s == 0.25
    assert e.message == ("Rate limit reached for tenant t on concurrent requests: Limit 2, In flight 2. "
                         "Please try again in 0.25s.")
    assert e.headers == {"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "0"}
    assert q.in_flight("t") == 2
    a.settle(1, 0)
    assert q.in_flight("t") == 1
    q.admit(t, 1)                                           # the freed slot
    a.settle(1, 0)                                          # once only: still full
    assert refused(q, t, 1).limit == "requests"
    u = q.usage(t)
    assert (u["requests"], u["rate_limited"], u["in_flight"]) == (3, 2, 2)


def test_a_refused_request_is_not_charged_and_holds_no_slot():
    q, _ = quotas()
    t = tenant(tpm=10, conc=1)
    tk = q.admit(t, 10)
    refused(q, t, 1)                                        # concurrency first
    tk.settle(5, 5)
    refused(q, t, 1)                                        # now tokens
    u = q.usage(t)
    assert (u["in_flight"], u["requests"], u["tokens_this_minute"], u["rate_limited"]) == (0, 1, 10, 2)


def test_tenants_have_separate_ledgers():
    q, _ = quotas()
    a, b = tenant(tpm=5, name="a"), tenant(tpm=5, name="b")
    q.admit(a, 5)
    q.admit(b, 5)                                           # b's minute is its own
    refused(q, a, 1)
    assert q.usage(a)["rate_limited"] == 1 and q.usage(b)["rate_limited"] == 0
    assert q.usage(a)["tenant"] == "a" and q.usage(b)["priority"] == 0


# ---------------------------------------------------------------------------------------------- throttle
def test_admission_factor_scales_quotas_rounding_up_to_at_least_one():
    q, _ = quotas()
    assert q.admission == 1.0                               # as configured until a throttle
    t = tenant(tpm=100, conc=3)
    q.set_admission(0.5)                                    # 50 tokens, 2 slots (ceil 1.5)
    q.admit(t, 50)
    assert refused(q, t, 1).headers["x-ratelimit-limit-tokens"] == "50"
    q2, _ = quotas()
    q2.set_admission(0.5)
    q2.admit(t, 1)
    q2.admit(t, 1)
    assert refused(q2, t, 1).headers["x-ratelimit-limit-requests"] == "2"
    slow = tenant(conc=2, retry=0.25, name="slow")
    q2.admit(slow, 1)
    assert refused(q2, slow, 1).retry_after_s == 0.25       # a throttle keeps the tenant's Retry-After
    q3, _ = quotas()
    q3.set_admission(0.001)                                 # never below 1
    q3.admit(tenant(tpm=100, conc=3, name="u"), 1)
    e = refused(q3, tenant(tpm=100, conc=3, name="u"), 1)
    assert e.headers["x-ratelimit-limit-requests"] == "1"
    q3.set_admission(1)                                     # back to the configured quotas
    q3.admit(tenant(tpm=100, conc=3, name="u"), 1)
    assert q3.admission == 1.0
    q4, _ = quotas()
    q4.set_admission(0.999)                                 # ceil(99.9) == 100, ceil(2.997) == 3
    q4.admit(t, 100)
    assert refused(q4, t, 1).headers["x-ratelimit-limit-tokens"] == "100"
    q4.set_admission(0.5)                                   # an unlimited quota stays unlimited
    q4.admit(tenant(name="free"), 10 ** 6)
    for bad in (0, -0.5, 1.5, True, "0.5", None):
        with pytest.raises(InvalidParamError) as e:
            q4.set_admission(bad)
        assert e.value.detail == f"admission factor must be in (0, 1], got {bad!r}"
    assert q4.admission == 0.5


def test_wait_until_wakes_on_settlement():
    q, _ = quotas()
    t = tenant(conc=1)
    tk = q.admit(t, 1)
    assert q.wait_until("t", lambda v: v["in_flight"] == 1, timeout=0)
    assert not q.wait_until("t", lambda v: v["in_flight"] == 0, timeout=0)
    seen = []
    th = threading.Thread(target=lambda: seen.append(q.wait_until("t", lambda v: v["in_flight"] == 0, timeout=30)))
    th.start()
    tk.settle(1, 1)
    th.join(30)
    assert seen == [True]
    refused(q, tenant(conc=1, tpm=1, name="t"), 5)
    assert q.wait_until("t", lambda v: v == {"in_flight": 0, "unsettled": 0, "requests": 1, "rate_limited": 1}, timeout=0)


# ---------------------------------------------------------------------------------------------- headers
def test_retry_headers():
    e = RateLimited("m", 2.0001, "tokens", {"x-ratelimit-limit-tokens": "7"})
    assert retry_headers(e) == {"x-ratelimit-limit-tokens": "7", "Retry-After": "3", "retry-after-ms": "2001"}
    assert retry_headers(RateLimited("m", 0.0, "requests")) == {"Retry-After": "1", "retry-after-ms": "1"}
    assert retry_headers(RateLimited("m", 1e-6, "requests")) == {"Retry-After": "1", "retry-after-ms": "1"}
    assert retry_headers(RateLimited("m", 1.0, "requests")) == {"Retry-After": "1", "retry-after-ms": "1000"}
    assert retry_headers(RateLimited("m", 500.0, "requests")) == {"Retry-After": "120", "retry-after-ms": "120000"}
    e = RateLimited("m", 1.5, "requests", {"a": "b"})
    retry_headers(e)
    assert e.headers == {"a": "b"}                          # a copy is returned
    back = pickle.loads(pickle.dumps(e))
    assert (back.message, back.retry_after_s, back.limit, back.headers, back.code) == \
        ("m", 1.5, "requests", {"a": "b"}, "rate_limit_exceeded")


# ---------------------------------------------------------------------------------------------- keys, tenants
def test_keys_are_digests_and_parse_key_checks_them():
    assert key_digest("sk-abc") == hashlib.sha256(b"sk-abc").hexdigest()
    assert parse_key("  sk-long-enough  ") == key_digest("sk-long-enough")
    assert parse_key("12345678") == key_digest("12345678")                  # 8 characters: enough
    h = key_digest("whatever")
    assert parse_key("sha256:" + h.upper()) == h
    for bad, text in (("", "an API key must be a non-empty string"), ("   ", "an API key must be a non-empty string"),
                      (None, "an API key must be a non-empty string"), (5, "an API key must be a non-empty string"),
                      ("1234567", "an API key must have at least 8 characters"),
                      ("sha256:" + h[:63], "sha256: keys take 64 hex digits"),
                      ("sha256:" + h + "0", "sha256: keys take 64 hex digits"),
                      ("sha256:" + "g" * 64, "sha256: keys take 64 hex digits")):
        with pytest.raises(InvalidParamError) as e:
            parse_key(bad)
        assert e.value.detail == text


def test_quota_and_tenant_validation():
    Quota(1, 1, RETRY_AFTER_MAX_S)
    Quota(None, None, 0.001)
    for kw in ({"concurrent_requests": 0}, {"tokens_per_minute": 0}, {"concurrent_requests": True},
               {"tokens_per_minute": 1.5}, {"retry_after_s": 0}, {"retry_after_s": RETRY_AFTER_MAX_S + 1},
               {"retry_after_s": True}, {"retry_after_s": "1"}, {"concurrent_requests": -1}):
        with pytest.raises(InvalidParamError) as e:
            Quota(**kw)
        (k, v), = kw.items()
        assert e.value.detail == (f"retry_after_s must be in (0, 120], got {v!r}" if k == "retry_after_s"
                                  else f"{k} must be a positive integer, got {v!r}")
    Tenant("a-b_c1")
    for bad in ("", "a b", "a.b", 5, None, "-", "__"):
        with pytest.raises(InvalidParamError) as e:
            Tenant(bad)
        assert e.value.detail == f"tenant name must be letters, digits, - or _, got {bad!r}"
    for bad in (True, 1.0, "1"):
        with pytest.raises(InvalidParamError) as e:
            Tenant("a", priority=bad)
        assert e.value.detail == f"priority must be an integer, got {bad!r}"
    t = Tenant("a", priority=5, models=("m1",))
    assert (t.effective_priority(None), t.effective_priority(2), t.effective_priority(9)) == (5, 5, 9)
    assert t.may_use("m1") and not t.may_use("m2") and Tenant("b").may_use("anything")


def test_registry_authenticates_by_key_and_refuses_everything_else():
    a = Tenant("a", (key_digest("sk-aaaaaaaaaa"), key_digest("sk-aaaaaaaab2")))
    b = Tenant("b", (key_digest("sk-bbbbbbbbbb"),))
    reg = TenantRegistry((a, b))
    assert not reg.open
    assert reg.authenticate("Bearer sk-aaaaaaaaaa") is a and reg.authenticate("bearer  sk-aaaaaaaab2 ") is a
    assert reg.authenticate(" Bearer sk-bbbbbbbbbb") is b
    missing = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
               "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
    scheme = "The Authorization header must be 'Bearer <API key>'."
    cases = {None: missing, "": missing, "Basic sk-aaaaaaaaaa": scheme, "Bearer": scheme, "Bearer   ": scheme,
             "Bearer sk-wrong-key-99": "Incorrect API key provided: sk-****y-99.",
             "Bearer short": "Incorrect API key provided: *****.",
             "Bearer 12345678": "Incorrect API key provided: ********.",           # 8 characters: all masked
             "Bearer 123456789": "Incorrect API key provided: 123****6789."}       # 9: the ends shown
    for header, text in cases.items():
        with pytest.raises(Unauthorized) as e:
            reg.authenticate(header)
        assert e.value.message == text and e.value.code == "invalid_api_key"
    assert reg.get("b") is b and reg.get("c") is None and reg.get("default") is None
    opened = TenantRegistry()
    assert opened.open and opened.authenticate(None) is OPEN_TENANT and opened.authenticate("x") is OPEN_TENANT
    assert opened.get("default") is OPEN_TENANT and opened.get("a") is None
    with pytest.raises(InvalidParamError, match="listed twice"):
        TenantRegistry((a, Tenant("a", (key_digest("sk-other-key"),))))
    with pytest.raises(InvalidParamError, match="no api_keys"):
        TenantRegistry((Tenant("c"),))
    with pytest.raises(InvalidParamError, match="also a key of tenant a"):
        TenantRegistry((a, Tenant("c", (key_digest("sk-aaaaaaaaaa"),))))


def test_open_servers_bind_loopback_only_unless_told():
    open_reg, keyed = TenantRegistry(), TenantRegistry((tenant(),))
    for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.9.9.9"):
        assert is_loopback(host)
        check_bind(host, open_reg, False)
    for host in ("0.0.0.0", "10.0.0.1", "example.com", "::", "X127.0.0.1"):
        assert not is_loopback(host)
        with pytest.raises(InvalidParamError, match="refusing to serve without API keys"):
            check_bind(host, open_reg, False)
        check_bind(host, open_reg, True)
        check_bind(host, keyed, False)
