"""``vnpu serve`` as operators run it (serve tier): the real command in a subprocess (in-process devices,
``VNPU_BACKEND=local``), its state directory, ``vnpu serve reconfigure``, and a restart.

- ``server.json`` (mode 0600) names the URL, pid and History of the running server and is gone after a
  clean stop; the sampler thread fills the History in the state directory;
- ``vnpu serve reconfigure --set`` finds the server through ``server.json``, applies, exits 0; the change is
  a manual intervention; without an admin key it exits 2 with one line; a strategy bundle written by
  ``vnpu share-strategy`` is applied live by ``vnpu strategy apply`` through the same path.  The refused
  reconfigure runs as its own process (its stderr is one line); the other client commands run ``vnpu``'s
  ``main`` in the test process (tests/cli_checks.py: the same code, without an interpreter start each);
- a SIGTERM ends a history long poll in flight at once (not at its ``wait_s``);
- the History survives the restart: the second server serves the first one's samples and events;
- a bad ``self_healing`` section: exit 2, one line naming the key and its line.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from cli_checks import cli, tripwires  # noqa: F401 - a fixture
from devices import procstat
from serve_http import call

pytestmark = pytest.mark.serve

ADMIN = "sk-ops-0123456789"
CONFIG = f"""
slo: {{target_p99_ms: 2000}}
models:
  - model: smollm2@0
    engine: {{max_num_seqs: 2, max_num_batched_tokens: 32, max_model_len: 64, num_gpu_blocks_override: 16}}
tenants:
  - {{name: ops, api_keys: [{ADMIN}], admin: true}}
self_healing:
  triggers:
    - {{name: thermal, metric: device_temperature_c, condition: "> 85", window: 10s, action: throttle}}
"""


def vnpu_env(home):
    return dict(os.environ, VNPU_HOME=str(home), VNPU_BACKEND="local", VNPU_DEVICES="1", OPENBLAS_NUM_THREADS="1",
                OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


class Serve:
    """``vnpu serve`` in a subprocess; its stdout lines in a queue."""

    def __init__(self, home, cfg):
        self.p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg), "--port", "0"],
                                  env=vnpu_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.p.stdout], daemon=True).start()
        self.url = None

    def wait_for(self, word: str, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if "listening on" in line:
                self.url = line.rsplit(" ", 1)[1].strip()
            if word in line:
                return line

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(120)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()


def get(url, path):
    st, body = call(url, path, ADMIN, timeout=60.0)
    assert st == 200, (path, st, body)
    return body


def test_state_dir_reconfigure_and_a_history_that_survives_a_restart(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(CONFIG)
    s = Serve(home, cfg)
    try:
        s.wait_for("vnpu serve: ready")
        sj = home / "serve" / "server.json"
        assert stat.S_IMODE(os.stat(sj).st_mode) == 0o600
        info = json.loads(sj.read_text())
        assert info == {"url": s.url, "pid": s.p.pid, "history": str(home / "serve" / "history.sqlite"),
                        "start_time": procstat.start_time(s.p.pid)}
        assert ADMIN not in sj.read_text()                               # no credential in it
        # a long poll: answers as soon as the sampler has recorded its first server-wide sample
        assert "qps" in get(s.url, "/admin/history/latest?wait_s=20")["server"], "no sample within 20 s"
        r = subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "reconfigure", "--set",
                            "self_healing.triggers.thermal.condition='> 90'"], env=vnpu_env(home), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "admin key" in r.stderr
        with monkeypatch.context() as env:                               # the client commands' environment
            env.setenv("VNPU_HOME", str(home))
            env.setenv("VNPU_API_KEY", ADMIN)
            rc, out, err = cli(["serve", "reconfigure", "--set", "self_healing.triggers.thermal.condition='> 90'"],
                               capsys)
            assert rc == 0, err
            assert out.startswith("vnpu serve reconfigure: ok: self_healing: 1 trigger(s), enabled")
            first = get(s.url, "/admin/history/events?kinds=config")["events"]
            assert len(first) == 1 and first[0]["manual"] and first[0]["source"] == "admin ops"
            t_first = get(s.url, "/admin/history/latest")["server"]["qps"][0]
            # a shared strategy (the article's share-strategy) applied live through the same reconfigure path
            tuned = tmp_path / "tuned.yaml"
            tuned.write_text("slo: {target_p99_ms: 1500}\nself_healing:\n  triggers:\n    - {name: thermal, metric: "
                             "device_temperature_c, condition: '> 95', window: 10s, action: throttle}\n")
            rc, out, err = cli(["share-strategy", "--name", "ecommerce_peak_guard", "--config", tuned, "--tags",
                                "ecommerce,peak", "--description", "tuned", "--license", "apache-2.0"], capsys)
            assert rc == 0, err
            rc, out, err = cli(["strategy", "apply", "ecommerce_peak_guard"], capsys)
            assert rc == 0 and out.startswith("vnpu strategy apply: ok: "), (out, err)
        assert get(s.url, "/admin/state")["slo"]["target_p99_ms"] == 1500
        assert len(get(s.url, "/admin/history/events?kinds=config")["events"]) == 2
        # SIGTERM with a long poll in flight (no sample will be newer than after): the poll answers when the
        # server shuts down, not at its wait_s -- the 10 s join is only "far below the poll's 20 s"
        got: dict = {}
        poll = threading.Thread(target=lambda: got.update(r=call(s.url, "/admin/history/latest?after=1e12&wait_s=20",
                                                                 ADMIN, timeout=60.0)), daemon=True)
        poll.start()
        parked = get(s.url, "/admin/state?long_polls=1&wait_s=20")["history_long_polls"]   # waits for it
        assert parked >= 1 and poll.is_alive(), "the long poll never parked"
        s.p.send_signal(signal.SIGTERM)
        poll.join(10.0)
        assert not poll.is_alive() and got["r"][0] == 200 and got["r"][1]["server"]["qps"][0] >= t_first
    finally:
        assert s.stop() == 0
    assert not (home / "serve" / "server.json").exists()
    s2 = Serve(home, cfg)
    try:
        s2.wait_for("vnpu serve: ready")
        ev = get(s2.url, "/admin/history/events?kinds=config,lifecycle")["events"]
        assert ev[0] == first[0] or first[0] in ev                       # the first run's change is still there
        life = [e["diagnosis"] for e in ev if e["kind"] == "lifecycle"]
        assert life[0].startswith("server started on ") and life[1] == "server stopped (drained)"
        assert life[2] == f"server started on {s2.url}"
        pts = get(s2.url, f"/admin/history/samples?metric=qps&until={t_first}")["points"]
        assert pts and pts[-1][0] == t_first                             # the first run's samples
    finally:
        assert s2.stop() == 0


def test_a_bad_self_healing_section_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models: [smollm2]\nself_healing:\n  triggers:\n    - {name: t, metric: temp, condition: '> 1', "
                   "action: throttle}\n")
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg), "--port", "0"],
                       env=vnpu_env(tmp_path / "home"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "line 4: self_healing.triggers[0].metric: unknown metric 'temp'" in r.stderr


def test_a_complex_yaml_key_exits_2_with_one_line(tmp_path, monkeypatch, capsys, tripwires):
    """In this process (the real process's one line is the test above): no device may start."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models: [smollm2]\nself_healing:\n  ? [a, b]\n  : 1\n")
    monkeypatch.setenv("VNPU_HOME", str(tmp_path / "home"))
    rc, out, err = cli(["serve", "--config", cfg, "--port", "0"], capsys)
    assert rc == 2 and err.count("\n") == 1 and out == "", err
    assert "line 3: self_healing: keys must be plain names" in err
