"""Argument checking for every ``vnpu`` command, in one place (the command line, :mod:`runtime.cli`, and
the benchmarks that register their own subcommands, :mod:`runtime.bench`, both use it).

Each command checks all of its arguments before it does any work, and a bad one ends the command with
exit status 2 and ONE line on stderr (``vnpu <command>: error: argument --x: ...``), never a traceback:

- :class:`Parser` is the ``argparse`` parser of every command (subparsers inherit it): its errors are
  one line, without the usage block;
- the ``type=`` functions below check a value as it is parsed (``positive_int``, ``duration``, ``size``,
  ``probability``, ``writable_file``, ``text_lines`` ...): numbers in range, durations above 0, output
  files whose directory exists and is writable, input files that are UTF-8 text (not binary);
- checks across arguments (``--min-bytes <= --max-bytes``) call :func:`fail`, which raises
  :class:`UsageError`; :func:`runtime.cli.main` prints it the same way.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys


class UsageError(Exception):
    """A bad argument found by a command (exit 2, one line)."""

    def __init__(self, message: str, prog: str = "vnpu"):
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        line = " ".join(str(message).split())
        sys.stderr.write(f"{self.prog}: error: {line}\n")
        sys.exit(2)


def fail(message: str, prog: str = "vnpu") -> None:
    """Raise a usage error (exit 2, one line) from a command's own checks."""
    raise UsageError(message, prog)


def report(e: UsageError) -> int:
    sys.stderr.write(f"{e.prog}: error: {' '.join(str(e).split())}\n")
    return 2


# ---------------------------------------------------------------------------------------------- numbers
def int_at_least(lo: int):
    """``type=``: an integer >= ``lo``."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    parse.__name__ = f"integer >= {lo}"
    return parse


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)


def int_in(lo: int, hi: int):
    """``type=``: an integer in ``[lo, hi]``."""
    def parse(s: str) -> int:
        v = int_at_least(lo)(s)
        if v > hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {v}")
        return v
    parse.__name__ = f"integer in [{lo}, {hi}]"
    return parse


def float_in(lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False):
    """``type=``: a finite float in the range (``lo_open``/``hi_open``: the bound itself excluded)."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if math.isnan(v) or (lo_open and v <= lo) or v < lo or (hi_open and v >= hi) or v > hi:
            lb, hb = "(" if lo_open else "[", ")" if hi_open or hi == math.inf else "]"
            raise argparse.ArgumentTypeError(f"must be in {lb}{lo:g}, {hi:g}{hb}, got {s}")
        return v
    parse.__name__ = "number"
    return parse


nonneg_float = float_in(0.0)
probability = float_in(0.0, 1.0, lo_open=True)          # (0, 1]


def int_list(s: str) -> list[int]:
    """``type=``: comma-separated positive integers (``1,4,16``)."""
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"takes positive integers, e.g. 1,4,16; got {s!r}")
    return vals


_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*")


def parse_duration(s: str) -> float:
    """Seconds of ``60s`` / ``500ms`` / ``2m`` / ``1.5`` (ValueError when malformed)."""
    m = _DURATION.fullmatch(str(s))
    if not m:
        raise ValueError(f"bad duration {s!r} (e.g. 60s, 500ms, 2m)")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) == "ms" else v * 60 if m.group(2) == "m" else v


def duration(s: str) -> float:
    """``type=``: a duration above 0, in seconds."""
    try:
        v = parse_duration(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {s!r}")
    return v


def parse_size(s: str | int) -> int:
    """Bytes of ``8``, ``64K``, ``1M``, ``1.5G``, ``256MiB`` (ValueError when malformed)."""
    if isinstance(s, int):
        return s
    t = str(s).strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[:-len(suffix)]
            break
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in ("K", "M", "G") else t
    try:
        v = float(num)
    except ValueError:
        raise ValueError(f"bad size {s!r} (e.g. 8, 64K, 1M, 1G)") from None
    if math.isnan(v) or math.isinf(v):
        raise ValueError(f"bad size {s!r}")
    return int(v * mult)


def size(s: str) -> int:
    """``type=``: a byte size of at least 1 (``8``, ``64K``, ``256M``)."""
    try:
        v = parse_size(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {s!r}")
    return v


def choices_list(known, what: str = "value"):
    """``type=``: a comma-separated list of names among ``known``."""
    def parse(s: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in s.split(",") if x.strip())
        bad = [v for v in vals if v not in known]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(bad)} (known: {', '.join(known)})")
        if not vals:
            raise argparse.ArgumentTypeError(f"give at least one {what} (known: {', '.join(known)})")
        return vals
    parse.__name__ = f"{what} list"
    return parse


def bind_host(s: str) -> str:
    """``type=``: an address this machine can bind: an IP literal or a name that resolves to one of this
    machine's addresses (checked by binding a throw-away socket to port 0)."""
    import socket
    try:
        infos = socket.getaddrinfo(s, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot resolve {s!r}: {e}") from None
    family, _, _, _, addr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(addr)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot bind {s!r}: {e.strerror or e}") from None
    return s


# ---------------------------------------------------------------------------------------------- files
def writable_file(s: str) -> str:
    """``type=``: a path a command will write at the end of its run: its directory must exist and be
    writable, and it must not be a directory (checked now, so that no work is lost later)."""
    path = os.path.abspath(os.path.expanduser(s))
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{s} is a directory")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"cannot write {s}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {s}: permission denied")
    return s


def read_text(path: str, what: str = "file") -> str:
    """The contents of a UTF-8 text file (``-``: stdin); ValueError for a missing/unreadable file, a
    directory, a binary file (NUL bytes) or bytes that are not UTF-8."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read()
        else:
            if os.path.isdir(path):
                raise ValueError(f"{path} is a directory")
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if b"\0" in data:
        raise ValueError(f"{path} is a binary file (it holds NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def text_file(s: str) -> str:
    """``type=``: a readable UTF-8 text file (returns the path; the file is read and checked now)."""
    try:
        read_text(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return s


def text_lines(s: str) -> list[str]:
    """``type=``: the non-empty lines of a UTF-8 text file (``-``: stdin); a file with none is an error."""
    try:
        lines = [ln for ln in read_text(s).splitlines() if ln.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not lines:
        raise argparse.ArgumentTypeError(f"{s} has no non-empty lines")
    return lines


__all__ = ["Parser", "UsageError", "fail", "report", "int_at_least", "positive_int", "nonneg_int", "int_in",
           "float_in", "nonneg_float", "probability", "int_list", "parse_duration", "duration", "parse_size", "size",
           "choices_list", "bind_host", "writable_file", "read_text", "text_file", "text_lines"]
