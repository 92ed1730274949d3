"""What ``vnpu serve`` says (serve tier): the real command in a subprocess (in-process devices), its stdout
piped, driven by a real HTTP client.

- startup: one plain line per stage (starting devices, loading weights, uploading to HBM, capturing graphs),
  no control codes; then the start summary, whose numbers are the running engine's (KV blocks as
  ``/metrics`` reports them, the graphs ``/admin/state`` counts, the config's batching limits), and the URL
  the server listens on; every line once;
- an access line per request with its method, route, status, tenant and tokens (a 200, a streamed 200, a
  401 and a 400); a scrape of ``/metrics`` only at debug level; uvicorn's own access log stays off;
- stats lines whose token counts add up to exactly what the responses' ``usage`` says, whose rates are those
  counts over the window, and an idle server says it is idle once;
- ``--no-access-log`` suppresses the access lines; ``--log-level debug`` shows what info hides;
  ``--stats-interval 0``: no stats line.
"""
from __future__ import annotations

import json
import re
import urllib.request

import pytest

from serve_cli import ServeProcess
from serve_http import call

pytestmark = pytest.mark.serve

KEY, ADMIN = "sk-alpha-0123456789", "sk-ops-0123456789"
CONFIG = f"""
models:
  - model: smollm2@0
    engine: {{max_num_seqs: 2, max_num_batched_tokens: 32, max_model_len: 128, max_queued_requests: 8}}
tenants:
  - {{name: alpha, api_keys: [{KEY}]}}
  - {{name: ops, api_keys: [{ADMIN}], admin: true}}
"""
STATS = re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
                   r"Running: (\d+) reqs, Waiting: (\d+) reqs, KV cache usage: ([\d.]+)% \(([\d.]+) s: (\d+) prompt "
                   r"\+ (\d+) generated tokens, (\d+) reqs finished\)$")
ACCESS = re.compile(r'vnpu serve access: 127\.0\.0\.1:\d+ "(\w+) (\S+)" (\d+) tenant=(\S+) tokens=(\S+) '
                    r"latency=[\d.]+ms$")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("servelog")
    cfg = tmp / "serve.yaml"
    cfg.write_text(CONFIG)
    s = ServeProcess(tmp / "home", "--config", cfg, "--port", "0", "--stats-interval", "1")
    try:
        s.wait_for("vnpu serve: ready")
        yield s
    finally:
        s.stop()


def _metric_blocks(url: str) -> int:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    m = re.search(r'vnpu:cache_config_info\{[^}]*model_name="smollm2"[^}]*num_gpu_blocks="(\d+)"', text)
    assert m, text[:2000]
    return int(m.group(1))


def test_startup_stages_and_a_summary_of_the_running_engine(served):
    lines = list(served.lines)
    assert not any("\x1b" in ln or "\r" in ln for ln in lines), "control codes in piped output"
    stages = [ln.split("vnpu serve: ", 1)[1] for ln in lines if ln.startswith("INFO ") and "vnpu serve: " in ln]
    order = ["starting devices: 1 in-process devices", "loading weights: smollm2",
             "uploading to HBM: smollm2 on 1 device(s)", "capturing graphs: smollm2: batch sizes 1, 2"]
    assert [stages.index(x) for x in order] == sorted(stages.index(x) for x in order), stages
    state = call(served.url, "/admin/state", ADMIN)[1]["models"]["smollm2"]
    blocks = _metric_blocks(served.url)
    assert state["kv_blocks"] == blocks and blocks > 2
    summary = "\n".join(stages[stages.index(order[-1]) + 1:])
    assert f"model smollm2 (generation) on {' -> '.join(state['chain'])}\n" in summary
    assert (f"  KV cache: {blocks} blocks x 16 tokens = {blocks * 16} tokens; max_model_len 128 "
            f"({blocks * 16 / 128:.1f}x concurrency)") in summary
    assert state["graphs"] == 2                                   # buckets 1 and 2 of max_num_seqs 2, one rank
    assert "  graphs: 2 decode graphs captured (batch sizes 1, 2)" in summary
    assert ("  batching: max_num_seqs 2, max_num_batched_tokens 32, max_queued_requests 8, scheduler "
            f"{state['mode']} ({state['policy']})") in summary
    assert "tenants: 2 (API key required)" in summary
    assert re.search(rf"started in [\d.]+ s; serving on {re.escape(served.url)} \(/v1/completions, "
                     r"/v1/chat/completions, /v1/models, /metrics, /health\)$", summary, re.M)  # no /v1/embeddings
    for once in ("vnpu serve: ready", "vnpu serve: listening on", "capturing graphs"):
        assert sum(once in ln for ln in lines) == 1, (once, lines)


def _counts(lines: list[str]) -> list[int]:
    """Prompt tokens, generated tokens and finished requests of every stats line of ``lines``, summed."""
    ms = [STATS.search(ln) for ln in lines if "vnpu serve stats: " in ln]
    return [sum(int(m.group(g)) for m in ms if m) for g in (7, 8, 9)]


def test_an_access_line_per_request_and_stats_that_add_up(served):
    url = served.url
    st, done = call(url, "/v1/completions", KEY, {"model": "smollm2", "prompt": "The NPU", "max_tokens": 5,
                                                   "ignore_eos": True})
    assert st == 200
    with urllib.request.urlopen(urllib.request.Request(
            url + "/v1/chat/completions", method="POST", headers={"Authorization": f"Bearer {KEY}",
                                                                  "Content-Type": "application/json"},
            data=json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                             "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()),
            timeout=120) as r:
        events = [json.loads(x[6:]) for x in r.read().decode().split("\n\n") if x.startswith("data: {")]
    streamed = events[-1]["usage"]
    assert call(url, "/v1/completions", "sk-wrong-key-000000", {"model": "smollm2", "prompt": "x"})[0] == 401
    assert call(url, "/v1/completions", KEY, {"model": "smollm2", "prompt": "x", "max_tokens": -1})[0] == 400
    _metric_blocks(url)                                                    # a scrape: debug level only
    want = {("POST", "/v1/completions", "200"): ("alpha", f"{done['usage']['prompt_tokens']}+5"),
            ("POST", "/v1/chat/completions", "200"): ("alpha", f"{streamed['prompt_tokens']}+4"),
            ("POST", "/v1/completions", "401"): ("-", "-"),
            ("POST", "/v1/completions", "400"): ("alpha", "-")}
    seen: dict = {}
    while len(seen) < len(want):
        m = ACCESS.search(served.wait_for("vnpu serve access: ", timeout=60))
        assert m, served.lines[-1]
        if m.group(2).startswith("/v1/"):                         # (the other test asked /admin/state)
            seen[m.group(1, 2, 3)] = m.group(4, 5)
    assert seen == want
    prompt = done["usage"]["prompt_tokens"] + streamed["prompt_tokens"]
    if _counts(served.lines) != [prompt, 9, 2]:                      # else: wait for the line that completes them
        served.wait_for(lambda _: _counts(served.lines) == [prompt, 9, 2], timeout=60)
    rc = served.stop()
    assert rc == 0, served.stderr
    assert "Traceback" not in served.stderr
    access = [ln for ln in served.lines if "vnpu serve access: " in ln]
    assert sum('"POST /v1/' in ln for ln in access) == 4, access   # one per request
    assert not any("/metrics" in ln for ln in access), access      # a scrape: debug level
    assert any('"GET /admin/state" 200 tenant=ops tokens=-' in ln for ln in access), access
    assert not any('HTTP/1.1"' in ln for ln in served.lines + served.stderr.splitlines())   # uvicorn's
    stats = [STATS.search(ln) for ln in served.lines if "vnpu serve stats: " in ln]
    assert all(stats) and _counts(served.lines) == [prompt, 9, 2]   # nothing counted twice
    for m in stats:                                                 # rate = count / window, to print precision
        secs = float(m.group(6))
        for rate, n in ((1, 7), (2, 8)):
            assert abs(float(m.group(rate)) - int(m.group(n)) / secs) <= 0.05 + int(m.group(n)) * 0.005 / secs ** 2
    idle = [all(int(m.group(g)) == 0 for g in (3, 4, 7, 8, 9)) for m in stats]
    assert not any(a and b for a, b in zip(idle, idle[1:])), "an idle server said so twice at info level"
    assert served.lines[-1].endswith("vnpu serve: drained, bye")


def test_no_access_log_and_debug_level(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(CONFIG)
    s = ServeProcess(tmp_path / "home", "--config", cfg, "--port", "0", "--no-access-log", "--log-level", "debug",
                     "--stats-interval", "0")
    try:
        s.wait_for("vnpu serve: ready")
        assert call(s.url, "/v1/completions", KEY, {"model": "smollm2", "prompt": "x", "max_tokens": 2})[0] == 200
        assert call(s.url, "/v1/completions", "sk-wrong-key-000000", {"model": "smollm2", "prompt": "x"})[0] == 401
        call(s.url, "/health", KEY)
    finally:
        rc = s.stop()
    assert rc == 0, s.stderr
    assert any(ln.startswith("DEBUG ") and "serving smollm2 on devices [0]" in ln for ln in s.lines), s.lines
    assert not any("vnpu serve access: " in ln or "vnpu serve stats: " in ln for ln in s.lines), s.lines
    assert s.lines[-1].endswith("vnpu serve: drained, bye")


def test_a_bad_log_level_exits_2_with_one_line(capsys):
    from runtime.cli import main
    assert main(["serve", "--log-level", "loud"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--log-level" in err and "Traceback" not in err


def test_the_stats_period_is_on_the_samplers_clock(caplog):
    """:class:`StatsLog` ticked by hand at explicit times (as the sampler's clock gives them): a line once
    the interval has passed, rates over exactly that window, an idle window after an idle one at debug."""
    import logging

    from runtime.serve.engine.stats import FinishedRequest, StepStats
    from runtime.serve.stats_log import StatsLog
    s = StatsLog(10.0, clock=lambda: 1000.0)
    gauges = {"running": 1, "queue_depth": 2, "kv_cache_usage": 0.25}
    s.record("m", StepStats(prompt_tokens=30, generation_tokens=4))
    assert s.on_tick(1009.5, gauges, {}) is None                        # 9.5 s: not yet
    s.record("m", StepStats(generation_tokens=6, finished=[FinishedRequest("stop", 1.0, 0.1, 30, 10, 10)]))
    with caplog.at_level(logging.DEBUG, logger="vnpu.serve.stats"):
        line = s.on_tick(1010.0, gauges, {})
        assert line == ("Avg prompt throughput: 3.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 "
                        "reqs, Waiting: 2 reqs, KV cache usage: 25.0% (10.00 s: 30 prompt + 10 generated tokens, "
                        "1 reqs finished)")
        idle = {"running": 0, "queue_depth": 0, "kv_cache_usage": 0.0}
        assert s.on_tick(1015.0, idle, {}) is None
        first = s.on_tick(1020.0, idle, {})                             # idle: said once at info ...
        second = s.on_tick(1030.0, idle, {})                            # ... then at debug only
    assert first is not None and second is not None and "(10.00 s: 0 prompt + 0 generated" in second
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "vnpu.serve.stats"]
    assert levels == [(logging.INFO, line), (logging.INFO, first), (logging.DEBUG, second)]
