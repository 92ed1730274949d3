"""``vnpu prof``: run a command with the profiler on, like ``msprof --application``.

    vnpu prof [--output DIR] -- <command> [args...]

Makes a ``PROF_*`` folder under ``--output`` (default: the current directory) and runs the command as a
child process with ``VNPU_PROF`` naming it, so that every runtime client the command starts -- itself,
``vnpu run``, ``vnpu serve`` and its engine, any process it spawns -- profiles its own work until it
exits and leaves its records there (:mod:`runtime.profiler`).  Then writes
``mindstudio_profiler_output/`` (timeline, op_summary, op_statistic, api_statistic, summary) and prints
the summary: the launch / alloc / copy / sync / compute / idle breakdown on the modeled and the wall
clock, the top ops and the verdict, and where to open the timeline (ui.perfetto.dev, chrome://tracing).  Exits
with the command's own status.  Interrupting (Ctrl-C) is passed
to the command, which then exits and writes its profile.  A bad flag is exit 2 with one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys

from runtime.cliargs import add_output_arg, fail, writable_dir
from runtime.profiler import ENV, export, new_prof_dir, read_raws


def register(sub) -> None:
    p = sub.add_parser("prof", help="run a command with the profiler on (msprof --application)",
                       description="Run COMMAND with vnpu's profiler on in every runtime client it starts; write a "
                                   "PROF_* folder in msprof's layout and print where the time went.",
                       example=("vnpu prof --output prof -- vnpu run generate --prompt 'What is an NPU?'",))
    add_output_arg(p, "where the PROF_* folder goes (made when missing; default: .)", type=writable_dir,
                   default=".", metavar="DIR")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    p.set_defaults(fn=_cmd)


def _cmd(a) -> int:
    cmd = list(a.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        fail("no command given (vnpu prof [--output DIR] -- <command> [args...])", "vnpu prof")
    try:
        os.makedirs(a.output, exist_ok=True)
        prof_dir = new_prof_dir(a.output)
    except OSError as e:
        fail(f"argument --output: cannot create a folder in {a.output!r}: {e.strerror or e}", "vnpu prof")
    if cmd[0] == "vnpu" and shutil.which("vnpu") is None:
        cmd = [sys.executable, "-m", "runtime.cli"] + cmd[1:]
    env = dict(os.environ, **{ENV: os.path.abspath(prof_dir)})
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as e:
        shutil.rmtree(prof_dir, ignore_errors=True)        # nothing ran: leave no empty PROF_* behind
        print(f"vnpu prof: error: cannot run {cmd[0]!r}: {e.strerror or e}", file=sys.stderr)
        return 2
    old = signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    try:
        status = child.wait()
    finally:
        signal.signal(signal.SIGINT, old)
    if status < 0:
        status = 128 - status
    raws = read_raws(prof_dir)
    if not raws:
        shutil.rmtree(prof_dir, ignore_errors=True)
        print(f"vnpu prof: no runtime client reported (the command made no vnpu runtime); no profile written",
              file=sys.stderr)
        return status
    res = export(prof_dir, raws)
    print(res.summary)
    print(f"profile: {prof_dir}")
    for path in (res.trace, res.op_summary, res.op_statistic, res.api_statistic, res.summary_path):
        print(f"  {os.path.relpath(path, prof_dir)}")
    print(f"timeline: open {os.path.abspath(res.trace)} in https://ui.perfetto.dev (Open trace file) or "
          "chrome://tracing (Load)")
    return status
