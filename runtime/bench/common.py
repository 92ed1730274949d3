"""Shared helpers of the benchmarks: medians of timed runs, sizes as text (sizes on the command line:
:func:`runtime.cliargs.size`), the ``--plot FILE`` flag and writing the plot (:mod:`runtime.plots.bench`),
the device processes' CPU time."""
from __future__ import annotations

import statistics
import sys
import time

from devices import procstat
from runtime.cliargs import suffixed_file
from runtime.plots import SUFFIXES as PLOT_SUFFIXES


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def device_pids(rt) -> list[int]:
    """Pids of the device processes when every device of ``rt`` runs in a process of this machine (cluster
    backend on this node); [] otherwise (in-process devices, or devices on other machines)."""
    where = getattr(rt.backend, "where", None)
    if not isinstance(where, dict):
        return []
    pids = [int(w.get("pid", 0)) for w in where.values()]
    return pids if all(procstat.cpu_seconds(p) is not None for p in pids) else []


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` of this machine have used so far (one read of
    ``/proc`` each)."""
    return sum(procstat.cpu_seconds(p) or 0.0 for p in pids)


def fmt_size(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n / m:g} {unit}"
    return f"{n} B"


def add_plot_arg(p, what: str) -> None:
    """``--plot FILE``: also draw the run's figures (``what``) into FILE (.png, .svg or .pdf, by the suffix;
    checked before the benchmark starts)."""
    p.add_argument("--plot", type=suffixed_file(PLOT_SUFFIXES, "plot"), default=None, metavar="FILE",
                   help=f"also draw {what} into FILE (.png, .svg or .pdf, by the suffix)")


def write_plot(a, bench: str, doc: dict) -> int:
    """Draw ``doc`` (the benchmark's ``--json`` document) into ``a.plot`` when given; 0, or 2 with one line
    on stderr when the file cannot be written after all (its folder went away during the run)."""
    if not getattr(a, "plot", None):
        return 0
    from runtime.plots.bench import write
    try:
        write(bench, doc, a.plot)
    except OSError as e:
        print(f"vnpu bench {bench}: error: cannot write the plot {a.plot}: {e.strerror or e}", file=sys.stderr)
        return 2
    if not getattr(a, "json", False):
        print(f"plot: {a.plot}")
    return 0
