"""``vnpu sanitize``: run a command with the runtime sanitizer on, like compute-sanitizer.

    vnpu sanitize [--tool memcheck,racecheck,initcheck,leakcheck] [--error-exitcode N] [--json F]
                  [--log-file F] [--print-limit N] [--stack-depth N] -- <command> [args...]

The command runs as a child process with ``VNPU_SANITIZE`` / ``VNPU_SANITIZE_OPTIONS`` set (see
:mod:`runtime.sanitize.options`), so every runtime client it starts -- itself and any process it spawns
-- is checked.  Each prints its findings as they happen (``=========``-prefixed, to stderr or the log
file) and leaves a JSON report; this command then prints the summary over all of them ("ERROR SUMMARY:
N errors"), writes the combined JSON (``--json``), and exits with ``--error-exitcode`` when anything was
found, else with the command's own status.  A bad flag is exit 2 with one line on stderr.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from devices.errors import AclError

from runtime.cliargs import writable_file
from runtime.sanitize import TOOLS, SanitizeOptions, parse_tools, summary_lines
from runtime.sanitize.findings import FORMAT, PREFIX


def register(sub) -> None:
    p = sub.add_parser("sanitize", help="run a command under the runtime sanitizer (memcheck, racecheck, "
                                        "initcheck, leakcheck)",
                       description="Run COMMAND with the vnpu runtime sanitizer: memcheck (refused bad accesses "
                                   "with allocation history), racecheck (unordered accesses across streams and "
                                   "the host), initcheck (reads of never-written device memory), leakcheck "
                                   "(allocations, streams, events and graphs alive at exit).",
                       example=("vnpu sanitize --tool memcheck,racecheck --error-exitcode 1 -- vnpu run generate "
                                "--prompt hi",))
    p.add_argument("--tool", default="all",
                   help=f"comma-separated tools ({', '.join(TOOLS)}) or 'all' (default)")
    p.add_argument("--error-exitcode", type=int, default=0, metavar="N",
                   help="exit with N when any error was found (default: the command's own status)")
    p.add_argument("--json", type=writable_file, default=None, metavar="F",
                   help="write the combined report as JSON to F")
    p.add_argument("--log-file", type=writable_file, default=None, metavar="F",
                   help="write the text report to F instead of stderr")
    p.add_argument("--print-limit", type=int, default=100, metavar="N",
                   help="findings printed in full per process (all are counted; default 100)")
    p.add_argument("--stack-depth", type=int, default=8, metavar="N", help="host frames per call site (default 8)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    p.set_defaults(fn=lambda a: _cmd(a, p))


def _cmd(a, parser) -> int:
    cmd = list(a.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command given (vnpu sanitize [options] -- <command> [args...])")
    try:
        tools = parse_tools(a.tool)
    except AclError as e:
        parser.error(e.detail)
    for flag, v, lo in (("--error-exitcode", a.error_exitcode, 0), ("--print-limit", a.print_limit, 0),
                        ("--stack-depth", a.stack_depth, 1)):
        if v < lo:
            parser.error(f"{flag} must be >= {lo}, got {v}")
    if a.error_exitcode > 255:
        parser.error(f"--error-exitcode must be at most 255, got {a.error_exitcode}")
    if cmd[0] == "vnpu" and shutil.which("vnpu") is None:
        cmd = [sys.executable, "-m", "runtime.cli"] + cmd[1:]
    log = open(a.log_file, "a", encoding="utf-8") if a.log_file else sys.stderr
    reports = tempfile.mkdtemp(prefix="vnpu-sanitize-")
    try:
        opts = SanitizeOptions(tools=tools, json=reports + os.sep, log_file=a.log_file or "", print_limit=a.print_limit,
                               stack_depth=a.stack_depth, summary=False)
        env = dict(os.environ, **opts.env())
        log.write(f"{PREFIX}VNPU-SANITIZE ({', '.join(tools)})\n")
        log.flush()
        try:
            status = subprocess.run(cmd, env=env).returncode
        except OSError as e:
            print(f"vnpu: error: cannot run {cmd[0]!r}: {e.strerror or e}", file=sys.stderr)
            return 2
        docs = []
        for path in sorted(glob.glob(os.path.join(reports, "*.json"))):
            try:
                with open(path, encoding="utf-8") as f:
                    docs.append(json.load(f))
            except (OSError, ValueError) as e:
                log.write(f"{PREFIX}unreadable report {os.path.basename(path)}: {e}\n")
        findings = [f for d in docs for f in d.get("findings", [])]
        lines = summary_lines(findings, tools)
        if not docs:
            log.write(f"{PREFIX}no runtime client reported (the command made no vnpu runtime)\n")
        log.write("\n".join(lines) + "\n")
        log.flush()
        if status < 0:
            status = 128 - status
        if a.json:
            doc = {"format": FORMAT, "tool": "vnpu-sanitize", "command": cmd, "tools": list(tools),
                   "exit_status": status, "processes": [{"pid": d.get("pid"), "argv": d.get("argv"),
                                                         "errors": d.get("errors", 0)} for d in docs],
                   "errors": len(findings), "findings": findings,
                   "summary": [ln[len(PREFIX):] for ln in lines]}
            try:
                with open(a.json, "w", encoding="utf-8") as f:
                    json.dump(doc, f, indent=1)
            except OSError as e:
                print(f"vnpu: error: cannot write {a.json}: {e.strerror or e}", file=sys.stderr)
                return 2
        return a.error_exitcode if findings and a.error_exitcode else status
    finally:
        shutil.rmtree(reports, ignore_errors=True)
        if log is not sys.stderr:
            log.close()
