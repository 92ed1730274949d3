"""The seed's dialect of ``serve.yaml`` (issue 28 item 1): the ``runtime_config.yaml`` of the CANN runtime
article loads through the one schema, each of its settings means in vnpu's canonical form what the seed
says (asserted value by value), what vnpu has no mechanism for is kept and reported -- never ignored --
and a mistyped key in the dialect still fails with its file, line and a did-you-mean.
``vnpu serve config --print`` shows the canonical form (a real subprocess)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.serve.canonical import canonical, render
from runtime.serve.config import ConfigError, load_config, parse_config
from runtime.serve.dialect import condition, parse_bytes, parse_celsius

SEED = Path(__file__).parent / "fixtures" / "seed_runtime_config.yaml"
GiB = 1 << 30


def _section(name: str) -> str:
    """One top-level section of the seed fixture, as its own file text (the seed's fragments one by one)."""
    out, keep = [], False
    for ln in SEED.read_text().splitlines():
        if ln and not ln.startswith((" ", "#")):
            keep = ln.startswith(f"{name}:")
        if keep:
            out.append(ln)
    return "\n".join(out) + "\n"


def _not_acted_on(cfg) -> dict[str, str]:
    return {n.path: n.why for n in cfg.not_acted_on}


def test_the_seed_scheduler_fragment_is_vnpus_defaults_tags_and_fallback_trigger():
    cfg = parse_config(_section("scheduler"), "runtime_config.yaml")
    d = cfg.defaults
    assert dict(d.scheduler) == {"mode": "adaptive", "low_latency_batch": 1, "max_wait_ms": 50}
    assert dict(d.engine) == {"max_num_seqs": 16, "scheduling_policy": "priority"}   # max_batch; stream_priority
    assert dict(d.batching) == {"max_batch_size": 16, "max_wait_ms": 50}  # max_batch, timeout_ms: encoders
    assert dict(cfg.tags) == {"premium_user": 0, "batch_job": 10}         # high -> class 0, low -> class 10
    assert d.placement == "accelerator_v3" and d.fallback == ("accelerator_v2", "cpu")   # cpu_fallback -> cpu
    (trig,) = cfg.self_healing.triggers                                   # switch_threshold: a fallback trigger
    assert (trig.name, trig.metric, trig.action, trig.window_s) == ("fallback_chain", "error_rate", "fallback", 30.0)
    assert (trig.condition.op, trig.condition.threshold) == (">", 0.05)
    assert cfg.self_healing.enabled
    assert "defaults" in _not_acted_on(cfg)                               # the device names have no devices: entry


def test_the_seed_memory_fragment_is_kept_in_vnpu_units_and_acted_on():
    cfg = parse_config(_section("memory"), "runtime_config.yaml")
    m = cfg.memory
    assert (m.strategy, m.pool_bytes, m.defrag_interval_s, m.overflow_protection) == (
        "fragmentation_aware", 3 * GiB, 180.0, True)
    assert not [p for p in _not_acted_on(cfg) if p.startswith("memory")]   # runtime.serve.memory_pool applies it


def test_the_seed_self_healing_fragment_maps_metrics_actions_and_units():
    cfg = parse_config(_section("self_healing"), "runtime_config.yaml")
    sh = cfg.self_healing
    got = {t.name: (t.metric, t.condition.op, t.condition.threshold, t.window_s, t.action, t.params, t.aggregate)
           for t in sh.triggers}
    assert got == {
        "error_rate_restart_worker": ("error_rate", ">", 0.05, 60.0, "restart_engine", {"model": None}, "mean"),
        "memory_fragmentation_trigger_defrag": ("hbm_fragmentation", ">", 0.7, 300.0, "defragment", {"timeout": 60.0},
                                                "mean"),
        "device_temperature_throttle_requests": ("device_temperature_c", ">", 85.0, 30.0, "throttle",
                                                 {"by": 0.2, "for": 300.0}, "mean"),
        "qps_scale_workers": ("qps", ">", 0.4, 60.0, "scale_out", {"replicas": 2, "model": None}, "drop"),
        "device_temperature_throttle_requests_by": ("device_temperature_c", ">", 80.0, 0.0, "throttle",
                                                    {"by": 0.2, "for": 300.0}, "mean"),
        "network_latency_cache_recent_results": ("p99_latency_ms", ">", 500.0, 0.0, "cache_results",
                                                 {"ttl": 60.0, "max_entries": 1024}, "mean")}
    assert (sh.recovery.warmup_requests, sh.recovery.health_check, sh.recovery.rollback_on_failure) == (10, True, True)
    assert not [n for n in cfg.not_acted_on if n.path.startswith("self_healing")]   # every line acts


@pytest.mark.parametrize("threshold, words", [
    ("sudden_fall>40% in 1m", "expected a relative threshold"),
    ("sudden_drop>40%", "expected a relative threshold"),
    ("sudden_drop>140% in 1m", "must be in"),
    ("sudden_drop>40% in 0s", "must be > 0"),
])
def test_a_bad_relative_threshold_names_its_line(threshold, words):
    text = SEED.read_text().replace('"sudden_drop>40% in 1m"', f'"{threshold}"')
    with pytest.raises(ConfigError, match=r"runtime_config.yaml: line 30: self_healing.triggers\[3\].threshold: .*"
                                          + words):
        parse_config(text, "runtime_config.yaml")
    both = SEED.read_text().replace('"sudden_drop>40% in 1m",', '"sudden_drop>40% in 1m", window: 2m,')
    with pytest.raises(ConfigError, match=r"line 30: self_healing.triggers\[3\].window: a relative threshold gives"):
        parse_config(both, "runtime_config.yaml")


def test_the_whole_seed_loads_and_its_canonical_form_loads_again_the_same():
    cfg = load_config(SEED)
    again = parse_config(render(cfg), "canonical.yaml")
    assert canonical(again) == canonical(cfg)
    assert again == cfg


def test_defaults_reach_a_model_through_device_names():
    text = SEED.read_text() + ("slo: {target_p99_ms: 500}\ndevices: {accelerator_v3: 0, accelerator_v2: 1}\n"
                               "models: [smollm2]\n")
    (m,) = parse_config(text).models
    assert m.devices == (0,) and [str(p) for p in m.fallback] == ["npu 1", "cpu"]
    assert m.engine.max_num_seqs == 16 and m.engine.scheduling_policy == "priority"
    assert (m.engine.mode.mode, m.engine.mode.low_latency_batch, m.engine.mode.max_wait_ms) == ("adaptive", 1, 50)
    own = text.replace("models: [smollm2]", "models: [{model: smollm2, engine: {max_num_seqs: 4}}]")
    assert parse_config(own).models[0].engine.max_num_seqs == 4         # a model's own setting wins
    with pytest.raises(ConfigError, match=r"line 16: defaults.placement: 'accelerator_v3' is neither a placement"):
        parse_config(SEED.read_text() + "slo: {target_p99_ms: 500}\nmodels: [smollm2]\n")
    with pytest.raises(ConfigError, match=r"line 4: defaults.scheduler.mode: adaptive sizes batches against slo"):
        parse_config(SEED.read_text() + "devices: {accelerator_v3: 0, accelerator_v2: 1}\nmodels: [smollm2]\n")


@pytest.mark.parametrize("word", ["auto", "manual", "hybrid"])
def test_seed_modes_are_vnpu_modes_acted_on(word):
    cfg = parse_config(f"scheduler: {{mode: {word}}}\nmodels: [smollm2]\n")   # none needs an slo target
    assert dict(cfg.defaults.scheduler)["mode"] == word
    assert cfg.models[0].engine.mode.mode == word
    assert "scheduler.mode" not in _not_acted_on(cfg)


@pytest.mark.parametrize("old, new, where", [
    ("max_batch: 16", "max_bach: 16", r"line 9: unknown key scheduler.strategies\[0\].max_bach \(did you mean max_batch\?"),
    ('name: "fallback_chain"', 'name: "fallback_chian"', r"line 15: scheduler.strategies\[2\].name: unknown strategy "
                                                        r"'fallback_chian' \(did you mean fallback_chain\?"),
    ('pool_size: "3GB"', 'pool_sise: "3GB"', r"line 21: unknown key memory.pool_sise \(did you mean pool_size\?"),
    ('pool_size: "3GB"', 'pool_size: "3 gallons"', r"line 21: memory.pool_size: .*expected a size"),
    ('threshold: "70%"', 'treshold: "70%"', r"line 28: unknown key self_healing.triggers\[1\].treshold \(did you mean "
                                           r"threshold\?"),
    ('"memory_fragmentation"', '"memory_fragmentaton"', r"line 28: self_healing.triggers\[1\].metric: unknown metric "
                                                       r"'memory_fragmentaton' \(did you mean memory_fragmentation\?"),
    ('"trigger_defrag"', '"trigger_defrg"', r"line 28: self_healing.triggers\[1\].action: unknown action "
                                           r"'trigger_defrg' \(did you mean trigger_defrag\?"),
    ('"85°C"', '"85 kelvin"', r"line 29: self_healing.triggers\[2\].threshold: .*expected a temperature"),
    ('priority: "high"', 'priority: "urgent"', r"line 13: scheduler.strategies\[1\].rules\[0\].priority: unknown "
                                               r"priority 'urgent'"),
    ('"error_rate>5% for 30s"', '"errors above 5%"', r"line 18: scheduler.strategies\[2\].switch_threshold: expected"),
    ("mode: \"adaptive\"", "mode: \"turbo\"", r"line 4: scheduler.mode: unknown mode 'turbo'"),
    ('"/health?deep=true"', '"health"', r"line 35: self_healing.recovery.health_check: expected true, false or a "
                                        r"/health URL"),
])
def test_a_mistake_in_the_dialect_names_file_line_and_key(old, new, where):
    text = SEED.read_text()
    assert old in text
    with pytest.raises(ConfigError, match=r"runtime_config.yaml: " + where):
        parse_config(text.replace(old, new, 1), "runtime_config.yaml")


def test_units_are_parsed_once():
    assert parse_bytes("3GB") == parse_bytes("3GiB") == 3 * GiB and parse_bytes("512MB") == 512 << 20
    assert parse_celsius("85°C") == parse_celsius("85C") == parse_celsius(85) == 85.0
    assert condition("5%", "ratio", "t") == "> 0.05"
    assert condition("500ms", "ms", "t") == "> 500" and condition("< 2s", "ms", "t") == "< 2000"
    assert condition("85°C", "C", "t") == "> 85"


def _vnpu(*args):
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True, timeout=120)


def test_serve_config_print_shows_the_canonical_form(tmp_path):
    r = _vnpu("serve", "config", "--print", "--config", str(SEED))
    assert r.returncode == 0, r.stderr
    assert "pool_bytes: 3221225472" in r.stdout and "premium_user: 0" in r.stdout
    assert "metric: hbm_fragmentation" in r.stdout and "action: defragment" in r.stdout
    assert "# accepted, not acted on:" in r.stdout
    not_acted = r.stdout[r.stdout.index("# accepted, not acted on:"):]
    assert "defaults = accelerator_v3, accelerator_v2 (line 16)" in not_acted     # no devices: entry names them
    assert "self_healing" not in not_acted and "memory" not in not_acted and "scheduler" not in not_acted
    assert "defrag_interval_s: 180" in r.stdout and "memory.defrag_interval_s = " not in r.stdout   # acted on
    bad = tmp_path / "runtime_config.yaml"
    bad.write_text(SEED.read_text().replace("timeout_ms: 50", "timeout: 50"))
    r = _vnpu("serve", "config", "--print", str(bad))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "line 10: unknown key scheduler.strategies[0].timeout" in r.stderr
