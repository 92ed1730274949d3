"""Many devices on one machine, drawn from ``vnpu bench scale --json``:

- start time (s) vs device count: from asking Ray for every device actor until all serve gRPC, beside as
  many empty Ray actors started the same way (the baseline: what Ray itself costs);
- memory per device process (MiB: PSS and RSS medians), beside an empty actor's RSS;
- AllReduce time (us) across all devices, beside the memory-bound limit of the same operator (all cores,
  dashed; one thread, dotted).

Device counts on a log2 axis.  Host-blocking.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .figure import new_figure

_MIB = float(1 << 20)


def figure(doc: dict) -> Figure:
    """Start time, memory per device and AllReduce time vs devices (``doc``: ``vnpu bench scale --json``)."""
    rows = doc["rows"]
    x = [r["devices"] for r in rows]
    plain = [r for r in rows if r.get("plain_actors")]
    fig, (start, mem, ar) = new_figure(3, 1, height=2.7)
    start.plot(x, [r["start_s"] for r in rows], "o-", color="C0", label="vnpu devices")
    if plain:
        start.plot([r["devices"] for r in plain], [r["plain_actors"]["start_s"] for r in plain], "s--", color="C7",
                   label="baseline: empty Ray actors")
    start.set_ylabel("start time (s)")
    start.set_ylim(bottom=0)
    m = doc.get("machine") or {}
    start.set_title(f"vnpu bench scale: {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB, "
                    f"{doc.get('hbm_mb', '?')} MiB HBM per device")
    mem.plot(x, [r["memory"]["pss_median"] / _MIB for r in rows], "o-", color="C1", label="PSS per device, median")
    mem.plot(x, [r["memory"]["rss_median"] / _MIB for r in rows], "^-", color="C3", label="RSS per device, median")
    if plain:
        mem.plot([r["devices"] for r in plain], [r["plain_actors"]["rss_median"] / _MIB for r in plain], "s--",
                 color="C7", label="RSS of an empty Ray actor")
    mem.set_ylabel("memory per process (MiB)")
    mem.set_ylim(bottom=0)
    ar.plot(x, [r["allreduce"]["time_us"] for r in rows], "o-", color="C2",
            label=f"AllReduce of {doc.get('allreduce_bytes', '?')} B")
    ar.plot(x, [r["bound"]["tn_us"] for r in rows], "k--", label="bound: same work, all cores")
    ar.plot(x, [r["bound"]["t1_us"] for r in rows], "k:", label="bound: same work, 1 thread")
    ar.set_ylabel("AllReduce time (us)")
    ar.set_yscale("log")
    for ax in (start, mem, ar):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xticks(x)
        ax.set_xlabel("devices")
        ax.legend(fontsize="small")
    return fig


__all__ = ["figure"]
