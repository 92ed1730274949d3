"""What a chaos campaign's own machinery prints, captured and summarised: Ray's "A worker died or was killed"
paragraphs (the driver's error listener writes them to ``sys.stdout``, with colour codes even into a pipe)
and the driver's "device N at ADDR lost: ..." warnings (one per client of the device: the pool's watch and
the job's handle each report the same fault).  A campaign kills processes on purpose, so each of these is
matched to the fault that explains it; only what no fault explains is printed, one line each.

:class:`NoiseCapture` swaps ``sys.stdout`` / ``sys.stderr`` for line filters and puts a filter on the
driver's logger for as long as it is entered; every other line passes through unchanged.  Writing blocks
only for the lock of the filter (the lines are forwarded in the writer's thread).
"""
from __future__ import annotations

import io
import logging
import re
import sys
import threading

#: ANSI escape sequences (colour codes)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: a line Ray's driver prints for the raylet (its error listener)
_RAYLET = re.compile(r"^\(raylet\)\s*")
_LOST = re.compile(r"^device (\d+) at (\S+) lost: (.*)$")
DRIVER_LOGGER = "vnpu.driver.client"


def strip_ansi(s: str) -> str:
    return _ANSI.sub("", s)


class _LineFilter(io.TextIOBase):
    """A text stream that forwards complete lines to ``target`` unless ``keep(line)`` takes them."""

    def __init__(self, target, keep):
        self.target, self.keep = target, keep
        self._buf = ""
        self._lock = threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            self._buf += s
            *lines, self._buf = self._buf.split("\n")
            out = [ln for ln in lines if not self.keep(ln)]
        if out:
            self.target.write("".join(ln + "\n" for ln in out))
        return len(s)

    def flush(self) -> None:
        self.target.flush()

    def drain(self) -> None:
        """Forward (or take) a last line without its newline."""
        with self._lock:
            rest, self._buf = self._buf, ""
        if rest and not self.keep(rest):
            self.target.write(rest)

    def isatty(self) -> bool:
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()


class _LostFilter(logging.Filter):
    def __init__(self, sink):
        super().__init__()
        self.sink = sink

    def filter(self, record: logging.LogRecord) -> bool:
        m = _LOST.match(record.getMessage())
        if m is None:
            return True
        self.sink.append({"device": int(m.group(1)), "address": m.group(2), "reason": m.group(3)})
        return False


class NoiseCapture:
    """``with NoiseCapture() as noise: run_campaign(...)``; then :meth:`summary` against the report."""

    def __init__(self):
        self.ray: list[dict] = []        #: Ray's messages: {"text", "pid", "exit_type"}
        self.lost: list[dict] = []       #: the driver's lost-device warnings: {"device", "address", "reason"}
        self._lock = threading.Lock()
        self._filters: list[_LineFilter] = []
        self._saved = None
        self._log_filter = _LostFilter(self.lost)

    def _take(self, line: str) -> bool:
        clean = strip_ansi(line).strip()
        if not _RAYLET.match(clean):
            return False
        text = _RAYLET.sub("", clean)
        pid = re.search(r"Worker PID: (\d+)", text)
        kind = re.search(r"Worker exit type: (\w+)", text)
        with self._lock:
            self.ray.append({"text": text, "pid": int(pid.group(1)) if pid else None,
                             "exit_type": kind.group(1) if kind else None})
        return True

    def __enter__(self) -> "NoiseCapture":
        self._saved = (sys.stdout, sys.stderr)
        self._filters = [_LineFilter(s, self._take) for s in self._saved]
        sys.stdout, sys.stderr = self._filters
        logging.getLogger(DRIVER_LOGGER).addFilter(self._log_filter)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(DRIVER_LOGGER).removeFilter(self._log_filter)
        for f in self._filters:
            f.drain()
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved

    def summary(self, report: dict) -> dict:
        """What the campaign's faults explain and what they do not (for the report and :func:`lines`)."""
        pids, devices = _fault_targets(report.get("faults", []))
        deaths = [m for m in self.ray if m["pid"] is not None or "worker died" in m["text"].lower()]
        other_ray = [m for m in self.ray if m not in deaths]
        return {"worker_deaths": len(deaths),
                "worker_deaths_unexplained": [m for m in deaths if m["pid"] not in pids],
                "ray_other": [m["text"] for m in other_ray],
                "lost_warnings": len(self.lost),
                "lost_unexplained": [w for w in self.lost if w["device"] not in devices],
                "faults": len(report.get("faults", []))}


def _fault_targets(faults: list[dict]) -> tuple[set[int], set[int]]:
    """(process ids, device ids) the campaign's faults hit."""
    pids: set[int] = set()
    devices: set[int] = set()
    for f in faults:
        p = f.get("params") or {}
        pids.update(x for x in [p.get("pid"), *(p.get("pids") or [])] if isinstance(x, int))
        devices.update(x for x in [f.get("device"), *(p.get("devices") or [])] if isinstance(x, int))
    return pids, devices


def lines(s: dict) -> list[str]:
    """One line for what the faults explain, one per thing they do not."""
    out = []
    if s["worker_deaths"] or s["lost_warnings"]:
        n_ray = s["worker_deaths"] - len(s["worker_deaths_unexplained"])
        n_lost = s["lost_warnings"] - len(s["lost_unexplained"])
        out.append(f"expected noise: {n_ray} worker death(s) reported by Ray and {n_lost} lost-device warning(s) "
                   f"of the driver (each client of a device warns once) came from the {s['faults']} fault(s) "
                   f"above, whose lines are the detections")
    for m in s["worker_deaths_unexplained"]:
        out.append(f"ray: worker pid {m['pid']} died ({m['exit_type'] or 'unknown exit'}) and no fault of this "
                   f"campaign killed it")
    for w in s["lost_unexplained"]:
        out.append(f"device {w['device']} lost ({w['reason']}) and no fault of this campaign hit it")
    out += [f"ray: {t[:200]}" for t in s["ray_other"]]
    return out
