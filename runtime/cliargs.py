"""Argument checking for every ``vnpu`` command, in one place (the command line, :mod:`runtime.cli`, and
the benchmarks that register their own subcommands, :mod:`runtime.bench`, both use it).

Each command checks all of its arguments before it does any work, and a bad one ends the command with
exit status 2 and ONE line on stderr (``vnpu <command>: error: argument --x: ...``), never a traceback:

- :class:`Parser` is the ``argparse`` parser of every command (subparsers inherit it): its errors are
  one line, without the usage block, with a "did you mean" for a mistyped flag, command or choice; a
  command's help says what it does and ends with an example (``add_parser(..., example=...)``);
- the ``type=`` functions below check a value as it is parsed (``positive_int``, ``duration``, ``size``,
  ``probability``, ``writable_file``, ``text_lines`` ...): numbers in range, durations above 0, output
  files and folders the command can write (tried, not guessed from permission bits), input files that
  are UTF-8 text (not binary);
- checks across arguments (``--min-bytes <= --max-bytes``) call :func:`fail`, which raises
  :class:`UsageError`; :func:`runtime.cli.main` prints it the same way.
"""
from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import sys


class UsageError(Exception):
    """A bad argument found by a command (exit 2, one line)."""

    def __init__(self, message: str, prog: str = "vnpu"):
        super().__init__(message)
        self.prog = prog


#: namespace attribute: the parser of the innermost (sub)command the arguments chose (for "did you mean")
_CHOSEN = "_vnpu_chosen_parser"
#: argparse's subcommands action (what ``add_subparsers`` returns; argparse names its class privately)
_SUBCOMMANDS = type(argparse.ArgumentParser().add_subparsers())


class _Commands(_SUBCOMMANDS):  # type: ignore[misc, valid-type]
    """The subcommands of a :class:`Parser`: each one's ``help`` (the line its parent lists) is also its own
    description, and its innermost parser is remembered so that an unknown flag is matched against the flags
    of the command it was given to."""

    def add_parser(self, name, **kw):
        if kw.get("description") is None and kw.get("help"):
            kw["description"] = kw["help"]
        return super().add_parser(name, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        if not hasattr(namespace, _CHOSEN):           # a deeper subcommand already set its own
            setattr(namespace, _CHOSEN, self.choices[values[0]])


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2, with a "did you mean" for a
    mistyped flag, command or choice, and whose help ends with ``example`` (a command line, or several).

    Subparsers (``add_subparsers``) are Parsers too: pass ``example=`` to ``add_parser``."""

    def __init__(self, *args, example: str | tuple[str, ...] | list[str] | None = None, **kw):
        super().__init__(*args, **kw)
        self.example = (example,) if isinstance(example, str) else tuple(example or ())
        self.register("action", "parsers", _Commands)

    def format_help(self) -> str:
        text = super().format_help()
        if not self.example:
            return text
        head = "example:" if len(self.example) == 1 else "examples:"
        return text.rstrip("\n") + f"\n\n{head}\n" + "".join(f"  {e}\n" for e in self.example)

    def error(self, message: str):  # type: ignore[override]
        flag = self._unknown_flag() if getattr(self, "_bad_command", False) else None
        if flag:       # `serve --prot 8000`: 8000 was taken for a subcommand because --prot is unknown
            message = f"unrecognized arguments: {flag}{self.suggestion([flag])}"
        line = " ".join(str(message).split())
        sys.stderr.write(f"{self.prog}: error: {line}\n")
        sys.exit(2)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extra = self.parse_known_args(args, namespace)
        chosen = getattr(ns, _CHOSEN, self)
        if hasattr(ns, _CHOSEN):
            delattr(ns, _CHOSEN)
        if extra:
            chosen.error(f"unrecognized arguments: {' '.join(extra)}{chosen.suggestion(extra)}")
        return ns

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)
        self._bad_command = False
        return super().parse_known_args(args, namespace)

    def _unknown_flag(self) -> str | None:
        """The first ``--flag`` given to this parser before any other word (where its subcommand goes) that
        none of its flags starts with (argparse takes unique prefixes)."""
        commands = {n for a in self._actions if isinstance(a, _SUBCOMMANDS) for n in a.choices}
        flags = [s for a in self._actions for s in a.option_strings]
        for word in getattr(self, "_given", ()):
            if word in commands or not word.startswith("-"):
                return None
            name = word.split("=", 1)[0]
            if name.startswith("--") and not any(f.startswith(name) for f in flags):
                return name
        return None

    def suggestion(self, extra: list[str]) -> str:
        """`` (did you mean --devices?)`` for the first unknown flag in ``extra`` close to one of this
        parser's flags; empty when none is close."""
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        for word in extra:
            if word.startswith("--"):
                near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
                if near:
                    return f" (did you mean {near[0]}?)"
        return ""

    def _check_value(self, action, value):  # argparse's choice check, with "did you mean"
        if action.choices is not None and value not in action.choices:
            names = [str(c) for c in action.choices]
            near = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}? " if near else ""
            self._bad_command = isinstance(action, _SUBCOMMANDS)
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint}choose from "
                                                 f"{', '.join(map(repr, names))})")


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


def boolean(s: str) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0), as the CANN runtime article writes flags."""
    v = str(s).strip().lower()
    if v in ("true", "yes", "on", "1"):
        return True
    if v in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def int_list(s: str) -> list[int]:
    """``type=``: comma-separated positive integers (``1,4,16``)."""
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of integers") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"takes positive integers, e.g. 1,4,16; got {s!r}")
    return vals


def int_range(s: str) -> tuple[int, int]:
    """``type=``: ``LO-HI`` (or one number ``N`` = ``N-N``) of positive integers with LO <= HI."""
    parts = s.split("-")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a range LO-HI of integers, e.g. 64-256") from None
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"takes a range LO-HI of positive integers with LO <= HI, e.g. 64-256; got {s!r}")
    return lo, hi


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


# ---------------------------------------------------------------------------------------------- outputs
# Every file or folder a command writes is checked before the command does any work, by these functions
# and no others: the ``type=`` functions for flags, :func:`check_output_dir` for other places (the state
# directory), :func:`output_problem` where a command reports errors its own way (``vnpu atc``).
def _try_write(path: str) -> str | None:
    """Why this process cannot write the file ``path`` (None: it can), found by trying -- permission bits
    are not enough: ``os.access`` says yes to root for ``/proc`` or a read-only mount.  An existing file is
    opened for appending (nothing written, not truncated); a new one is created and removed again."""
    try:
        if os.path.lexists(path):
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            try:
                os.unlink(path)
            except OSError:
                pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def output_problem(path: str) -> str | None:
    """Why a command could not write the file ``path`` at the end of its run (None: it can): a directory
    there, a missing directory above it, no permission, a file system that refuses (``/proc``, read-only)."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        return f"{path} is a directory"
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        return f"cannot write {path}: directory {parent} {what}"
    why = _try_write(full)
    return None if why is None else f"cannot write {path}: {why}"


def output_dir_problem(path: str) -> str | None:
    """Why a command could not write into the folder ``path``, which it creates when missing (None: it
    can): a file there or above it, no permission in the nearest folder that exists, a file system that
    refuses.  Creates nothing."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full) and not os.path.isdir(full):
        return f"{path} is not a directory"
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"cannot create {path}: {existing} is not a directory"
    why = _try_write(os.path.join(existing, f".vnpu-write-check-{os.getpid()}-{os.urandom(4).hex()}"))
    return None if why is None else f"cannot write in {path}: {why}"


def writable_file(s: str) -> str:
    """``type=``: a file the command writes (at the end of its run: checked now, so that no work is lost
    later; see :func:`output_problem`)."""
    problem = output_problem(s)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return s


def suffixed_file(suffixes: tuple[str, ...], what: str = "file"):
    """``type=``: a file the command writes whose suffix (case-insensitive) is one of ``suffixes`` -- the
    format is chosen by it (a plot: ``.png``, ``.svg``, ``.pdf``) -- and that it can write
    (:func:`writable_file`)."""
    def check(s: str) -> str:
        suffix = os.path.splitext(s)[1].lower()
        if suffix not in suffixes:
            raise argparse.ArgumentTypeError(f"{s}: a {what} is written as {', '.join(suffixes)} (by the suffix), "
                                             f"not {suffix or 'a file without a suffix'}")
        return writable_file(s)
    check.__name__ = f"{what.replace(' ', '_')}_file"
    return check


def writable_dir(s: str) -> str:
    """``type=``: a folder the command writes into, created when missing (:func:`output_dir_problem`)."""
    problem = output_dir_problem(s)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return s


def add_output_arg(p, help: str, *, type=writable_file, default=None, metavar: str = "FILE",
                   alias: str = "--report") -> None:
    """``--output``: what a command writes (a report, a folder), under the one name every command uses;
    ``alias`` (``--report``) is the same flag, accepted and named in the help line, not listed on its own.
    Both land in ``args.output``."""
    p.add_argument("--output", type=type, default=default, metavar=metavar, help=f"{help} ({alias} is the same flag)")
    p.add_argument(alias, dest="output", type=type, default=argparse.SUPPRESS, metavar=metavar, help=argparse.SUPPRESS)


def check_output_dir(path, what: str, prog: str = "vnpu") -> None:
    """A usage error of ``prog`` (exit 2, one line naming ``what``) unless it can write into ``path``."""
    problem = output_dir_problem(str(path))
    if problem:
        fail(f"{what}: {problem}", prog)


# ---------------------------------------------------------------------------------------------- inputs


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
           "choices_list", "bind_host", "output_problem", "output_dir_problem", "writable_file", "writable_dir",
           "add_output_arg", "check_output_dir", "read_text", "text_file", "text_lines"]
