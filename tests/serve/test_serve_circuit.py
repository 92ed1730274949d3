"""Per-tenant circuit breakers (issue 28), the state machine on an injectable clock: closed -> open when a
tenant's error rate over its window reaches the threshold (with enough verdicts) -> 503 with the time left
-> half-open: one probe, the others refused -> closed by a good probe, open again by a failed one; each
tenant on its own; serve.yaml's ``circuit_breaker`` section and its errors.  (Over HTTP, on a real server:
tests/serve/test_serve_tenants.py::test_a_failing_tenants_circuit_breaker_opens_alone.)"""
from __future__ import annotations

import pytest

from runtime.serve.circuit import BreakerSpec, Breakers, CircuitOpen
from runtime.serve.config import ConfigError, parse_config
from runtime.serve.tenants import Tenant, key_digest

SPEC = BreakerSpec(error_rate=0.5, window_s=30.0, open_for_s=60.0, min_requests=4)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def tenant(name, spec=SPEC):
    return Tenant(name, (key_digest(f"sk-{name}-0123456789"),), circuit_breaker=spec)


@pytest.fixture
def env():
    clk = Clock()
    return clk, Breakers(clk), tenant("flaky"), tenant("steady")


def outcomes(br, t, *os):
    for o in os:
        br.check(t)
        br.record(t, o)


def test_opens_at_the_threshold_and_says_when_to_retry(env):
    clk, br, flaky, steady = env
    outcomes(br, flaky, "ok", "error", "ok")          # 1 of 3: under min_requests and under 50 %
    assert br.state("flaky")["state"] == "closed"
    outcomes(br, flaky, "client", "shed")             # refusals are no verdict
    assert br.state("flaky")["state"] == "closed"
    outcomes(br, flaky, "error")                      # 2 of 4 = 50 %
    assert br.state("flaky") == {"state": "open", "opened": 1, "retry_after_s": 60.0}
    clk.t += 25
    with pytest.raises(CircuitOpen) as e:
        br.check(flaky)
    assert e.value.retry_after_s == 35.0 and e.value.headers() == {"Retry-After": "35", "retry-after-ms": "35000"}
    assert e.value.code == "circuit_open"
    outcomes(br, steady, "ok", "ok")                  # another tenant: untouched
    assert br.state("steady")["state"] == "closed"


def test_the_window_slides(env):
    clk, br, flaky, _ = env
    outcomes(br, flaky, "error", "error", "ok")
    clk.t += 30                                       # those two errors leave the window
    outcomes(br, flaky, "ok", "ok", "ok", "error")
    assert br.state("flaky")["state"] == "closed"


def test_half_open_lets_one_probe_through_and_its_verdict_decides(env):
    clk, br, flaky, steady = env
    outcomes(br, flaky, *["error"] * 4)
    clk.t += 60
    assert br.state("flaky")["state"] == "half_open"
    br.check(flaky)                                   # the probe
    with pytest.raises(CircuitOpen) as e:             # the others wait for its verdict
        br.check(flaky)
    assert e.value.retry_after_s == 1.0
    br.check(steady)                                  # the other tenant passes meanwhile
    br.record(flaky, "error")                         # the probe failed: open again, for open_for
    assert br.state("flaky") == {"state": "open", "opened": 2, "retry_after_s": 60.0}
    clk.t += 60
    br.check(flaky)
    br.record(flaky, "ok")                            # a good probe closes it, with an empty window
    assert br.state("flaky")["state"] == "closed"
    outcomes(br, flaky, "error", "error", "error")    # under min_requests again
    br.check(flaky)


def test_a_probe_without_verdict_is_replaced_after_open_for(env):
    clk, br, flaky, _ = env
    outcomes(br, flaky, *["error"] * 4)
    clk.t += 60
    br.check(flaky)                                   # the probe, whose client goes away
    br.record(flaky, "client")
    clk.t += 59
    with pytest.raises(CircuitOpen):
        br.check(flaky)
    clk.t += 1
    br.check(flaky)                                   # a new probe


def test_a_tenant_without_a_breaker_always_passes(env):
    clk, br, _, _ = env
    plain = tenant("plain", None)
    outcomes(br, plain, *["error"] * 20)
    assert br.state("plain")["state"] == "closed"


def test_serve_yaml_circuit_breaker():
    cfg = parse_config("""
tenants:
  - name: flaky
    api_keys: [sk-flaky-0123456789]
    circuit_breaker: {error_rate: 50%, window: 30s, open_for: 1m}
""", "serve.yaml")
    assert cfg.tenants[0].circuit_breaker == BreakerSpec(0.5, 30.0, 60.0, 5)


@pytest.mark.parametrize("section,msg", [
    ("{error_rate: 150%}", "line 5: tenants[0].circuit_breaker.error_rate: must be in [0%, 100%]"),
    ("{error_rate: 0}", "line 5: tenants[0].circuit_breaker: error_rate must be in (0, 100%]"),
    ("{window: soon}", "tenants[0].circuit_breaker.window: expected a duration"),
    ("{open_for: 0s}", "open_for_s must be a positive duration"),
    ("{min_requests: 0}", "min_requests must be a positive integer"),
    ("{errors: 50%}", "unknown key tenants[0].circuit_breaker.errors (did you mean error_rate?"),
    ("[50%]", "tenants[0].circuit_breaker: expected a circuit breaker (a mapping)"),
])
def test_bad_circuit_breakers_are_refused_with_their_line(section, msg):
    with pytest.raises(ConfigError) as e:
        parse_config(f"""
tenants:
  - name: flaky
    api_keys: [sk-flaky-0123456789]
    circuit_breaker: {section}
""", "serve.yaml")
    assert msg in str(e.value), str(e.value)
