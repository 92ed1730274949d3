"""The CANN article's report commands as written (issue 28 item 7), over recorded histories: `diagnose
--time-range last_1h --focus latency_spike --output runtime_health.pdf`, `postmortem --event NAME --metrics
all --output x.pdf`, `monitor --live --metrics "qps,latency,mem_frag,error_rate"`, the named stress
profiles, and `share-strategy` / `strategy list|show|apply` with their bundle format; bad input exits 2 with
one line.  (The stress preset against a real server: tests/serve/test_stress.py.)"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import yaml

from cli_checks import cli
from runtime.observe.metrics_store import History, device_scope

SEED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "tests", "serve", "fixtures", "seed_runtime_config.yaml")
T0 = 1_700_000_000.0


def latency_history(path, n=900, at=600):
    """15 minutes: p99 at 40 ms, then over 1000 ms from +600 s (over the 800 ms target); queue depth rises 10 s
    before it (the cause); a named event `black_friday_2024` marks +550 s .. +700 s."""
    rng = np.random.default_rng(3)
    h = History(path)
    for i in range(n):
        h.record_samples(T0 + i, {"p99_latency_ms": 40 + rng.normal(0, 2) + (1000 if i >= at else 0),
                                  "qps": 20 + rng.normal(0, 0.5), "error_rate": 0.0,
                                  "queue_depth": 2 + rng.normal(0, 0.3) + (30 if i >= at - 10 else 0)})
        h.record_samples(T0 + i, {"hbm_fragmentation": 0.2 + rng.normal(0, 0.01)}, scope=device_scope(0))
    h.record_event("lifecycle", ts=T0 + 550, source="stress-test", diagnosis="stress-test started",
                   detail={"event": "black_friday_2024", "phase": "start"})
    h.record_event("lifecycle", ts=T0 + 700, source="stress-test", diagnosis="stress-test ended",
                   detail={"event": "black_friday_2024", "phase": "end"})
    h.close()
    return str(path)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    return latency_history(tmp_path_factory.mktemp("seedrep") / "h.sqlite")


# ---------------------------------------------------------------------------------------------- diagnose
def test_diagnose_as_the_article_writes_it_equals_vnpus_own_spelling(history, tmp_path, capsys):
    rc, seed_out, err = cli(["diagnose", "--history", history, "--time-range", "last_1h", "--focus", "latency_spike",
                             "--output", tmp_path / "runtime_health.pdf", "--json"], capsys)
    assert rc == 0, err
    rc2, own_out, _ = cli(["diagnose", "--history", history, "--since", "1h", "--focus", "latency", "--json"], capsys)
    assert rc2 == 0
    seed, own = json.loads(seed_out), json.loads(own_out)
    assert seed == own                                     # the same window, focus and findings
    assert any(s["metric"] == "p99_latency_ms" for s in seed["symptoms"]), seed
    assert (tmp_path / "runtime_health.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.parametrize("rng,secs", [("last_30m", 1800), ("last_24h", 86400), ("last_1h", 3600)])
def test_time_ranges_are_how_far_back(rng, secs):
    from runtime.cli.reader import since
    assert since(rng) == ("ago", float(secs))


@pytest.mark.parametrize("argv,msg", [
    (["--focus", "latency_spikes"], "unknown focus 'latency_spikes'"),
    (["--time-range", "last_week"], "is not a duration"),
])
def test_diagnose_bad_seed_flags_exit_2_with_one_line(history, capsys, argv, msg):
    rc, out, err = cli(["diagnose", "--history", history, *argv], capsys)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_every_focus_alias_names_a_focus():
    from runtime.observe.diagnose import FOCUS, FOCUS_ALIASES, focus_name
    assert set(FOCUS_ALIASES.values()) <= set(FOCUS)
    assert focus_name("Latency_Spike") == "latency" and focus_name("thermal") == "thermal"


# ---------------------------------------------------------------------------------------------- postmortem
def test_postmortem_of_a_named_event_with_all_metrics(history, tmp_path, capsys):
    rc, out, err = cli(["postmortem", "--history", history, "--event", "black_friday_2024", "--metrics", "all",
                        "--output", tmp_path / "x.pdf", "--json"], capsys)
    assert rc == 0, err
    pm = json.loads(out)
    assert pm["window"]["since"] == T0 + 490 and pm["window"]["until"] == T0 + 760     # the run +- 60 s
    h = History(history)
    ref = np.array([v for _, v in h.samples("p99_latency_ms", T0 + 490, T0 + 760)])
    h.close()
    got = pm["metrics"]["p99_latency_ms"]["server"]
    assert got["samples"] == ref.size and got["mean"] == pytest.approx(ref.mean())
    assert got["p99"] == pytest.approx(np.percentile(ref, 99)) and got["max"] == pytest.approx(ref.max())
    assert pm["metrics"]["device_temperature_c"] == {}                   # all: also the ones never sampled
    assert (tmp_path / "x.pdf").read_bytes().startswith(b"%PDF")


def test_postmortem_metrics_list_and_text(history, capsys):
    rc, out, err = cli(["postmortem", "--history", history, "--event", "black_friday_2024", "--metrics",
                        "qps,latency"], capsys)
    assert rc == 0, err
    assert "qps [server]: 271," in out and "p99_latency_ms [server]: 271," in out and "queue_depth" not in out


def test_postmortem_integer_event_ids_keep_working(history, capsys):
    rc, out, err = cli(["postmortem", "--history", history, "--event", "1", "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["window"]["since"] == T0 + 550 - 60


def test_event_mark_names_a_window_postmortem_finds(tmp_path, capsys):
    h = latency_history(tmp_path / "m.sqlite", n=300, at=1000)
    assert cli(["event", "mark", "cyber_monday", "--history", h], capsys)[0] == 0
    hist = History(h)
    t_start = hist.events()[-1].ts
    hist.record_samples(t_start + 120, {"qps": 50.0})
    hist.close()
    rc, out, err = cli(["event", "mark", "cyber_monday", "--end", "--note", "over", "--history", h], capsys)
    assert rc == 0 and "cyber_monday end recorded" in out
    hist = History(h)
    t_end = hist.events()[-1].ts
    marks = [(e.kind, e.manual, e.detail) for e in hist.events()[-2:]]
    hist.close()
    assert marks == [("lifecycle", False, {"event": "cyber_monday", "phase": p}) for p in ("start", "end")]
    rc, out, err = cli(["postmortem", "--history", h, "--event", "cyber_monday", "--json"], capsys)
    assert rc == 0, err
    w = json.loads(out)["window"]
    assert (w["since"], w["until"]) == (t_start - 60, t_end + 60)
    rc, out, err = cli(["event", "mark", "42", "--history", h], capsys)
    assert rc == 2 and "not an event name" in err


@pytest.mark.parametrize("argv,msg", [
    (["--event", "cyber_monday"], "no event named 'cyber_monday'"),
    (["--event", "9bad name"], "neither an event id nor an event name"),
    (["--event", "black_friday_2024", "--metrics", "qps,nope"], "unknown metric 'nope'"),
])
def test_postmortem_bad_seed_flags_exit_2_with_one_line(history, capsys, argv, msg):
    rc, out, err = cli(["postmortem", "--history", history, *argv], capsys)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------------------------------- monitor
def test_monitor_live_with_the_articles_metrics(history, capsys):
    rc, out, err = cli(["monitor", "--history", history, "--metrics", "qps,latency,mem_frag,error_rate", "--once",
                        "--json"], capsys)
    assert rc == 0, err
    names = [m["metric"] for m in json.loads(out)["metrics"]]
    assert names == ["qps", "p99_latency_ms", "hbm_fragmentation", "error_rate"], names     # latency = p99
    from runtime.cli import build_parser
    a = build_parser().parse_args(["monitor", "--live", "--metrics", "qps,latency,mem_frag,error_rate"])
    assert a.live and not a.once
    rc, out, err = cli(["monitor", "--history", history, "--live", "--once"], capsys)
    assert rc == 2 and "not allowed with argument" in err


# ---------------------------------------------------------------------------------------------- stress
def test_black_friday_preset_has_its_shape_and_takes_the_duration_override():
    from runtime.stress.presets import load
    pre = load()["black_friday_2024"]
    assert pre.duration_s == 1800 and pre.faults == ("hang", "overheat") and pre.every_s == 300
    p = pre.profile(duration_s=600.0)
    assert p.duration_s == 600 and p.peak == pre.rate
    xs = [float(q["at"].rstrip("%")) / 100 * 600 for q in pre.points]
    ys = [float(q["rate"].rstrip("%")) / 100 * pre.rate for q in pre.points]
    ts = np.linspace(0, 600, 6001)
    assert [p.rate(t) for t in ts] == pytest.approx(list(np.interp(ts, xs, ys)))
    assert p.expected() == pytest.approx(np.trapezoid(np.interp(ts, xs, ys), ts), rel=1e-3)


def test_every_shipped_preset_loads():
    from runtime.stress.presets import load
    pres = load()
    assert {"black_friday_2024", "flash_sale", "nightly_batch"} <= set(pres)
    for p in pres.values():
        assert p.profile().expected() > 0


def test_stress_test_takes_the_articles_command_up_to_the_server(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path))
    rc, out, err = cli(["stress-test", "--model", "x.om", "--profile", "black_friday_2024", "--duration", "30m",
                        "--output", tmp_path / "stress_report.html"], capsys)
    assert rc == 2 and "no running server" in err          # the profile and flags were accepted
    rc, out, err = cli(["stress-test", "--profile", "black_friday_2025", "--url", "http://127.0.0.1:9"], capsys)
    assert rc == 2 and "unknown profile 'black_friday_2025'" in err and "black_friday_2024" in err


# ---------------------------------------------------------------------------------------------- strategies
def share(tmp_path, capsys, *extra):
    ev = tmp_path / "stress_report.html"
    ev.write_text("<html>p99 held</html>")
    return cli(["share-strategy", "--name", "ecommerce_peak_guard", "--config", SEED, "--tags", "ecommerce,peak",
                "--description", "held p99 through black_friday_2024", "--license", "apache-2.0",
                "--evidence", ev, *extra], capsys)


def test_share_strategy_writes_the_documented_bundle(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path))
    rc, out, err = share(tmp_path, capsys)
    assert rc == 0, err
    d = tmp_path / "strategies" / "ecommerce_peak_guard"
    doc = yaml.safe_load((d / "strategy.yaml").read_text())
    assert doc["version"] == 1 and doc["name"] == "ecommerce_peak_guard" and doc["license"] == "apache-2.0"
    assert doc["tags"] == ["ecommerce", "peak"] and doc["description"] == "held p99 through black_friday_2024"
    # the fragment is the seed's tuning sections in vnpu's canonical names, as `serve config --print` shows them
    from runtime.serve.canonical import canonical
    from runtime.serve.config import load_config
    full = canonical(load_config(SEED))
    assert doc["config"] == {k: full[k] for k in ("defaults", "tags", "memory", "self_healing") if k in full}
    assert doc["config"]["memory"]["pool_bytes"] == 3 << 30 and "server" not in doc["config"]
    assert doc["evidence"] == [{"file": "evidence/stress_report.html",
                                "sha256": hashlib.sha256(b"<html>p99 held</html>").hexdigest()}]
    assert (d / "evidence" / "stress_report.html").read_text() == "<html>p99 held</html>"
    rc, out, err = cli(["strategy", "list"], capsys)
    assert rc == 0 and out.startswith("ecommerce_peak_guard") and "[ecommerce,peak]" in out
    rc, out, err = cli(["strategy", "show", "ecommerce_peak_guard"], capsys)
    assert rc == 0 and yaml.safe_load(out) == doc["config"]          # the comment lines are YAML comments
    (d / "evidence" / "stress_report.html").write_text("tampered")
    rc, out, err = cli(["strategy", "show", "ecommerce_peak_guard"], capsys)
    assert rc == 2 and "evidence/stress_report.html is missing or changed" in err
    rc, out, err = share(tmp_path, capsys)                  # no silent overwrite
    assert rc == 2 and "exists" in err
    assert share(tmp_path, capsys, "--force")[0] == 0


def test_strategy_apply_dry_run_prints_the_merged_config_that_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path))
    assert share(tmp_path, capsys)[0] == 0
    base = tmp_path / "serve.yaml"
    base.write_text("slo: {target_p99_ms: 500}\nmemory: {pool_size: 1GB, overflow_protection: false}\n")
    rc, out, err = cli(["strategy", "apply", "ecommerce_peak_guard", "--dry-run", "--config", base], capsys)
    assert rc == 0, err
    from runtime.serve.config import parse_config
    cfg = parse_config(out)
    assert cfg.slo.target_p99_ms == 500                      # the base's, kept
    assert cfg.memory.pool_bytes == 3 << 30                  # the strategy's, over the base
    assert cfg.memory.overflow_protection is True
    assert len(cfg.self_healing.triggers) >= 6


def test_strategy_apply_goes_through_reconfigure(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path))
    assert share(tmp_path, capsys)[0] == 0
    rc, out, err = cli(["strategy", "apply", "ecommerce_peak_guard"], capsys)
    assert rc == 2 and "no running server" in err


@pytest.mark.parametrize("argv,msg", [
    (["share-strategy", "--name", "Peak/Guard", "--config", SEED], "bad strategy name"),
    (["share-strategy", "--name", "g", "--config", SEED, "--license", "wtfpl"], "unknown license 'wtfpl'"),
    (["share-strategy", "--name", "g", "--config", "/nonexistent/x.yaml"], "cannot read"),
    (["share-strategy", "--name", "g", "--config", SEED, "--evidence", "/nonexistent/r.html"], "no such file"),
    (["share-strategy", "--name", "g", "--config", SEED, "--tags", "a b"], "bad tag"),
    (["strategy", "apply", "nope"], "no strategy nope"),
    (["strategy", "show", "../etc"], "bad strategy name"),
])
def test_strategy_bad_input_exits_2_with_one_line(tmp_path, capsys, monkeypatch, argv, msg):
    monkeypatch.setenv("VNPU_HOME", str(tmp_path))
    rc, out, err = cli(argv, capsys)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "strategies" / "g").exists()
