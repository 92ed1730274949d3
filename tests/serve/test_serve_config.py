"""serve.yaml's tenants, slo, scheduler and fallback sections (pure, no device): the shipped example parses;
keys are kept as digests only; every mistake names its key and line; placement keeps spares free."""
from __future__ import annotations

from pathlib import Path

import pytest

from runtime.serve.config import ConfigError, devices_needed, load_config, model_spec, parse_config, place
from runtime.serve.engine.placement import Placement, parse_placement
from runtime.serve.tenants import TenantRegistry, Unauthorized, key_digest

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_parses():
    cfg = load_config(ROOT / "serve.yaml")
    assert cfg.slo.target_p99_ms == 4000 and cfg.slo.availability == pytest.approx(0.995) and cfg.replicas == 1
    smol = next(m for m in cfg.models if m.name == "smollm2")
    assert smol.fallback == (Placement((2,)), Placement(cpu=True)) and smol.chain_devices == (0, 2)
    assert smol.engine.mode.mode == "adaptive" and smol.engine.mode.target_p99_ms == 4000
    assert smol.engine.scheduling_policy == "priority" and smol.engine.priority_aging_s == 10
    by = {t.name: t for t in cfg.tenants}
    assert by["batch"].priority == 10 and by["batch"].quota.tokens_per_minute == 20000
    assert by["batch"].models == ("smollm2",) and by["ops"].admin and not by["premium"].admin
    assert "sk-premium-change-me-0001" not in repr(cfg)                  # only digests are kept
    reg = cfg.registry()
    assert reg.authenticate("Bearer sk-premium-change-me-0001").name == "premium"
    with pytest.raises(Unauthorized):
        reg.authenticate("Bearer sk-premium-change-me-0002")
    mini = next(m for m in cfg.models if m.name == "minilm-l6")
    assert mini.fallback == (Placement(cpu=True),) and mini.chain_devices == (1,)
    assert devices_needed(cfg.models) == 3


def test_sha256_keys():
    d = key_digest("sk-secret-abcdefgh")
    cfg = parse_config(f"tenants:\n  - name: a\n    api_keys: ['sha256:{d}']\nmodels: [smollm2]\n")
    assert TenantRegistry(cfg.tenants).authenticate("Bearer sk-secret-abcdefgh").name == "a"


def test_prefix_cache_keys():
    cfg = parse_config("models:\n  - model: smollm2\n    engine: {enable_prefix_caching: false}\ntenants:\n"
                       "  - {name: a, api_keys: [sk-aaaaaaaaaa], share_prefix_cache: true}\n"
                       "  - {name: b, api_keys: [sk-bbbbbbbbbb]}\n")
    assert cfg.models[0].engine.enable_prefix_caching is False
    a, b = cfg.tenants
    assert (a.share_prefix_cache, a.cache_salt, b.share_prefix_cache, b.cache_salt) == (True, "", False, "tenant:b")
    assert parse_config("models: [smollm2]\n").models[0].engine.enable_prefix_caching is True


def test_quantization_key_and_flag():
    cfg = parse_config("models:\n  - model: smollm2\n    engine: {quantization: gguf}\n")
    assert cfg.models[0].engine.quantization == "gguf"
    assert parse_config("models: [smollm2]\n").models[0].engine.quantization == "none"
    from runtime.cli import build_parser
    from runtime.cli.serve import resolve
    a = build_parser().parse_args(["serve", "--model", "smollm2", "--model", "minilm-l6", "-q", "gguf"])
    by = {m.name: m for m in resolve(a).models}
    assert by["smollm2"].engine.quantization == "gguf" and by["minilm-l6"].kind == "embed"


@pytest.mark.parametrize("text,where", [
    ("models:\n  - model: smollm2\n    engine: {quantization: awq}\n", "line 3: models[0].engine.quantization"),
    ("models:\n  - model: smollm2\n    engine: {enable_prefix_caching: 2}\n",
     "line 3: models[0].engine.enable_prefix_caching"),
    ("models: [smollm2]\ntenants:\n  - {name: a, api_keys: [sk-aaaaaaaaaa], share_prefix_cache: maybe}\n",
     "line 3: tenants[0].share_prefix_cache"),
    ("models:\n  - model: smollm2\n    scheduler: {mode: adaptive}\n", "line 3: models[0].scheduler.mode"),
    ("models:\n  - model: smollm2\n    scheduler: {mode: fastest}\n", "line 3: models[0].scheduler"),
    ("models: [smollm2]\ntenants:\n  - name: a\n    api_keys: [sk-aaaaaaaaaa]\n    priority: 5\n",
     "line 3: tenants: tenants have priority classes [5] but model smollm2 schedules fcfs"),
    ("models: [smollm2]\ntenants:\n  - {name: a, api_keys: [sk-aaaaaaaaaa]}\n  - {name: b, api_keys: [sk-aaaaaaaaaa]}\n",
     "line 3: tenants: an API key of tenant b is also a key of tenant a"),
    ("models: [smollm2]\ntenants:\n  - {name: a, api_keys: [sk-aaaaaaaaaa], models: [gpt-4]}\n",
     "line 3: tenants[0].models: gpt-4 is not served here"),
    ("models: [smollm2]\ntenants:\n  - {name: a, api_keys: [short]}\n", "line 3: tenants[0].api_keys[0]"),
    ("models: [smollm2]\ntenants:\n  - {name: a, api_keys: [sk-aaaaaaaaaa], colour: red}\n",
     "line 3: unknown key tenants[0].colour"),
    ("models: [smollm2]\ntenants:\n  - {name: a, api_keys: [sk-aaaaaaaaaa], quota: {tokens_per_minute: 0}}\n",
     "line 3: tenants[0].quota.tokens_per_minute: must be >= 1"),
    ("models:\n  - model: smollm2\n    fallback: [3, cpu2]\n", "line 3: models[0].fallback[1]: bad placement 'cpu2'"),
    ("models:\n  - model: smollm2\n    fallback: [3, 3]\n", "line 3: models[0].fallback[1]: npu 3 is listed twice"),
    ("models:\n  - model: minilm-l6\n    fallback: [3, cpu, x]\n", "line 3: models[0].fallback[2]: bad placement 'x'"),
    ("models:\n  - model: minilm-l6\n    fallback: 3\n", "line 3: models[0].fallback: expected a list of placements"),
    ("slo: {target_p99_ms: 800, availability: lots}\n", "line 1: slo.availability"),
    ("slo: {target_p99_ms: -1}\n", "line 1: slo.target_p99_ms: must be > 0"),
    ("slo: {latency: 3}\n", "line 1: unknown key slo.latency"),
    ("server: {replicas: 0}\n", "line 1: server.replicas: must be >= 1"),
    ("tenants: {a: 1}\n", "line 1: tenants: expected a list"),
])
def test_mistakes_name_key_and_line(text, where):
    with pytest.raises(ConfigError) as e:
        parse_config(text, "s.yaml")
    assert f"s.yaml: {where}" in str(e.value), str(e.value)


@pytest.mark.parametrize("text,where", [
    ("? [a, b]\n: 1\n", "line 1: keys must be plain names"),
    ("server:\n  ? [a, b]\n  : 1\n", "line 2: server: keys must be plain names"),
    ("slo:\n  ? {a: 1}\n  : 1\n", "line 2: slo: keys must be plain names"),
    ("models:\n  - ? [a, b]\n    : 1\n", "line 2: models[0]: keys must be plain names"),
    ("models:\n  - model: smollm2\n    engine:\n      ? [a]\n      : 2\n", "line 4: models[0].engine: keys must"),
    ("models: [smollm2]\ntenants:\n  - ? [a, b]\n    : 1\n", "line 3: tenants[0]: keys must be plain names"),
    ("models: [smollm2]\ntenants:\n  - name: a\n    api_keys: [sk-aaaaaaaaaa]\n    quota:\n      ? [a]\n      : 1\n",
     "line 6: tenants[0].quota: keys must be plain names"),
    ("self_healing:\n  ? [a, b]\n  : 1\n", "line 2: self_healing: keys must be plain names"),
    ("self_healing:\n  recovery:\n    ? [a]\n    : 1\n", "line 3: self_healing.recovery: keys must be plain names"),
    ("self_healing:\n  triggers:\n    - ? [a]\n      : 1\n", "line 3: self_healing.triggers[0]: keys must"),
    ("self_healing:\n  triggers:\n    - {name: t, metric: qps, condition: '> 1', action: throttle,\n"
     "       params: {? [a]: 1}}\n",
     "line 4: self_healing.triggers[0].params: keys must be plain names"),
])
def test_a_complex_key_is_a_config_error_not_a_traceback(text, where):
    """A YAML key that is not a plain name (``? [a, b]``, a mapping) cannot key a dict: every mapping the
    config reads -- nested values of the self_healing section too -- says so as a ConfigError."""
    with pytest.raises(ConfigError) as e:
        parse_config(text, "s.yaml")
    assert f"s.yaml: {where}" in str(e.value), str(e.value)


def test_placement_keeps_spares_and_checks_the_chain():
    a = model_spec("smollm2", None, 1, fallback=(Placement((0,)),))          # device 0 is a spare ...
    b = model_spec("minilm-l6", None, None)
    placed = place((a, b), 4)
    assert placed[0].devices == (1,) and placed[1].devices == (2,)          # ... so first placements skip it
    with pytest.raises(ConfigError, match="both in its first placement and in its fallback chain"):
        place((model_spec("smollm2", (0, 1), None, fallback=(Placement((1,)),)),), 4)
    with pytest.raises(ConfigError, match="fallback device 7 does not exist"):
        place((model_spec("smollm2", (0,), None, fallback=(Placement((7,)),)),), 4)
    assert devices_needed((model_spec("smollm2", (0, 1, 2), None, fallback=(Placement((3,)), Placement(cpu=True))),)) == 4
    assert parse_placement("cpu") == Placement(cpu=True) and parse_placement("0-2").tp == 3
    assert str(parse_placement("0-2")) == "npu 0-2 (tp=3)"


def test_encoders_have_a_fallback_chain_too():
    """An encoder's chain: device lists (data parallel there) or the CPU; checked as a generation model's."""
    cfg = parse_config("models:\n  - model: minilm-l6@0\n    fallback: [1-2, cpu]\n", "s.yaml")
    m = cfg.models[0]
    assert m.kind == "embed" and m.fallback == (Placement((1, 2)), Placement(cpu=True)) and m.chain_devices == (0, 1, 2)
    assert devices_needed(cfg.models) == 3
    with pytest.raises(ConfigError, match="device 0 is both in its first placement and in its fallback chain"):
        place((model_spec("minilm-l6", (0,), None, fallback=(Placement((0, 1)),)),), 4)
    with pytest.raises(ConfigError, match="fallback device 9 does not exist"):
        place((model_spec("minilm-l6", (0,), None, fallback=(Placement((9,)),)),), 4)
    a = place((model_spec("minilm-l6", None, None, fallback=(Placement((0,)),)),), 2)[0]
    assert a.devices == (1,)                                          # the spare stays free
