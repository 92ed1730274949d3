"""The startup stages of the commands (:mod:`runtime.stages` shown by :mod:`runtime.cli.stages`) and the token
bar of ``vnpu run generate``:

- piped (not a terminal): one plain line per stage, in order, and no control codes -- the real ``vnpu run
  embed`` in a subprocess, and the sink on a non-terminal console;
- on a terminal: a live ``rich`` progress that marks every finished stage and a failed one;
- the token bar's clock starts when the bar is made (the command makes it when generation starts), on an
  injectable clock: its rate is tokens over the generation's time, not the process's.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from runtime import stages
from runtime.cli.stages import showing_stages

ROOT = Path(__file__).resolve().parents[2]


def _work() -> None:
    """What a start reports: two plain stages and one of three steps."""
    with stages.stage(stages.STARTING_DEVICES, "2 devices"):
        pass
    with stages.stage(stages.LOADING_WEIGHTS, "m"):
        pass
    with stages.stage(stages.CAPTURING, "m: batch sizes 1, 2, 4", total=3) as advance:
        for _ in range(3):
            advance()


def test_piped_stages_are_one_plain_line_each():
    buf = io.StringIO()
    with showing_stages("vnpu x", Console(file=buf, force_terminal=False)):
        _work()
    assert buf.getvalue() == ("vnpu x: starting devices: 2 devices\nvnpu x: loading weights: m\n"
                              "vnpu x: capturing graphs: m: batch sizes 1, 2, 4\n")
    with stages.stage("after", "the block"):                          # the sink is gone with the block
        pass
    assert buf.getvalue().count("\n") == 3


def test_a_terminal_gets_a_live_progress_with_every_stage_marked():
    buf = io.StringIO()
    with showing_stages("vnpu x", Console(file=buf, force_terminal=True, width=100, color_system="standard")):
        _work()
        with pytest.raises(RuntimeError):
            with stages.stage(stages.UPLOADING, "m on 1 device(s)"):
                raise RuntimeError("upload failed")
    out = buf.getvalue()
    assert "\x1b[" in out                                               # redrawn in place
    final = out.rsplit("\x1b[?25h", 1)[0]                               # the last frame before the cursor returns
    for text in ("starting devices: 2 devices", "loading weights: m", "capturing graphs: m: batch sizes 1, 2, 4"):
        assert text in final
    assert "3/3" in final and final.count("✓") >= 3
    assert "failed:" in final and "uploading to HBM: m on 1 device(s)" in final


def test_the_token_bar_clock_starts_when_the_bar_is_made(capsys):
    from runtime.cli.run import Progress
    now = [100.0]                                                       # 100 s of startup went before
    bar = Progress(10, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 0.5
        bar.step()
    bar.done()
    assert capsys.readouterr().err.splitlines()[-1] == "10/10 tokens 2.0 tok/s"      # 10 tokens in 5 s


def test_run_embed_piped_says_each_stage_once_without_control_codes(tmp_path):
    env = dict(os.environ, VNPU_BACKEND="local", VNPU_DEVICES="1", OPENBLAS_NUM_THREADS="1", VNPU_HOME=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "embed", "an NPU", "a GPU", "--json"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "\x1b" not in p.stderr + p.stdout and "\r" not in p.stderr
    assert p.stderr.splitlines() == ["vnpu run embed: starting devices: 1 in-process devices",
                                     "vnpu run embed: loading weights: minilm-l6",
                                     "vnpu run embed: uploading to HBM: minilm-l6 on 1 device(s)"]
    assert json.loads(p.stdout)["count"] == 2                           # stdout: the result only
