"""What a sanitizer session checks and where it reports: :class:`SanitizeOptions`, read from the
environment for any runtime client.

- ``VNPU_SANITIZE``: the tools, comma-separated (``memcheck,racecheck,initcheck,leakcheck``; ``all`` or
  ``1`` = every tool).  Unset, empty or ``0``: no session, and the runtime pays nothing.
- ``VNPU_SANITIZE_OPTIONS``: ``key=value`` pairs separated by ``:`` (as ``ASAN_OPTIONS``):
  ``error_exitcode=N`` (the process exits with N when anything was found), ``json=PATH`` (the report
  as JSON at exit; a directory: ``PATH/<pid>.json``), ``log_file=PATH`` (the text report; default
  stderr), ``print_limit=N`` (findings printed in full, default 100; all are counted and kept in the
  JSON), ``stack_depth=N`` (host frames kept per call site, default 8), ``summary=0`` (no summary line at
  exit: ``vnpu sanitize`` prints one for all its processes).

A bad value is :class:`~devices.errors.InvalidParamError` with what was wrong.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from devices.errors import InvalidParamError

#: the tools, in report order
TOOLS = ("memcheck", "racecheck", "initcheck", "leakcheck")
ENV_TOOLS = "VNPU_SANITIZE"
ENV_OPTIONS = "VNPU_SANITIZE_OPTIONS"


@dataclass(frozen=True)
class SanitizeOptions:
    tools: tuple[str, ...] = TOOLS
    error_exitcode: int = 0             #: 0: the process's exit status is left alone
    json: str = ""                      #: JSON report at exit (a directory: one file per process)
    log_file: str = ""                  #: text report ("" = stderr)
    print_limit: int = 100              #: findings printed in full (the rest are counted)
    stack_depth: int = 8                #: host frames kept per call site
    summary: bool = True                #: print the summary at exit

    def on(self, tool: str) -> bool:
        return tool in self.tools

    def env(self) -> dict[str, str]:
        """The environment variables that give a child process these options."""
        opts = [f"error_exitcode={self.error_exitcode}", f"print_limit={self.print_limit}",
                f"stack_depth={self.stack_depth}", f"summary={int(self.summary)}"]
        opts += [f"json={self.json}"] if self.json else []
        opts += [f"log_file={self.log_file}"] if self.log_file else []
        return {ENV_TOOLS: ",".join(self.tools), ENV_OPTIONS: ":".join(opts)}


def parse_tools(text: str) -> tuple[str, ...]:
    """``"racecheck,initcheck"`` -> the tools in report order; ``all``/``1`` = every tool."""
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if names in (["all"], ["1"]):
        return TOOLS
    bad = [n for n in names if n not in TOOLS]
    if bad or not names:
        raise InvalidParamError(f"unknown sanitizer tool {', '.join(bad) or repr(text)} (tools: {', '.join(TOOLS)}, all)")
    return tuple(t for t in TOOLS if t in names)


def _int(key: str, v: str, lo: int) -> int:
    try:
        n = int(v)
    except ValueError:
        raise InvalidParamError(f"{ENV_OPTIONS}: {key} must be an integer, got {v!r}") from None
    if n < lo:
        raise InvalidParamError(f"{ENV_OPTIONS}: {key} must be >= {lo}, got {n}")
    return n


_KEYS = {
    "error_exitcode": lambda v: ("error_exitcode", _int("error_exitcode", v, 0)),
    "json": lambda v: ("json", v),
    "log_file": lambda v: ("log_file", v),
    "print_limit": lambda v: ("print_limit", _int("print_limit", v, 0)),
    "stack_depth": lambda v: ("stack_depth", _int("stack_depth", v, 1)),
    "summary": lambda v: ("summary", v.strip().lower() not in ("0", "false", "no", "off")),
}


def parse_options(text: str, tools: tuple[str, ...] = TOOLS) -> SanitizeOptions:
    """``"error_exitcode=3:json=r.json"`` -> options (keys as in the module doc)."""
    o = SanitizeOptions(tools=tools)
    for item in (text or "").split(":"):
        if not item.strip():
            continue
        key, eq, val = item.partition("=")
        conv = _KEYS.get(key.strip())
        if conv is None or not eq:
            raise InvalidParamError(f"{ENV_OPTIONS}: unknown option {item!r} (keys: {', '.join(_KEYS)})")
        k, v = conv(val)
        o = replace(o, **{k: v})
    return o


def from_env(environ=None) -> SanitizeOptions | None:
    """The options ``VNPU_SANITIZE`` / ``VNPU_SANITIZE_OPTIONS`` ask for, or None when unset / ``0``."""
    env = os.environ if environ is None else environ
    tools = env.get(ENV_TOOLS, "").strip()
    if tools in ("", "0"):
        return None
    return parse_options(env.get(ENV_OPTIONS, ""), parse_tools(tools))
