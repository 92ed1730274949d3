"""Bandwidth vs size, drawn from the ``--json`` documents of ``vnpu bench memcpy`` and ``vnpu bench hccl``,
each with the machine's bound measured in the same run:

- memcpy: H2D and D2H GB/s (shared-memory path, and the gRPC path where measured) against ``np.copyto`` of
  the same bytes in this process (the host's memory bandwidth: what a copy between two processes' memory
  cannot beat), per copy size;
- hccl: bus bandwidth (nccl-tests' busbw) per collective and size, beside the busbw the collective would
  have at the memory-bound limit's time (:mod:`runtime.bench.bound`: the same reductions and copies in one
  process, all cores, dashed; one thread, dotted) -- the same bytes over the bound's time, so the gap
  between the lines is the bench's "x bound" column.

Sizes on a log2 axis (bytes), bandwidth on a log axis (GB/s, 1e9 bytes per second).  Host-blocking.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .figure import new_figure


def size_label(n: float) -> str:
    """``n`` bytes as a tick label: 512 B, 4 KiB, 1 MiB ..."""
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n / m:g} {unit}"
    return f"{n:g} B"


def _size_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: size_label(v)))
    ax.set_yscale("log")


def memcpy_figure(doc: dict) -> Figure:
    """H2D / D2H GB/s vs copy size (``doc``: ``vnpu bench memcpy --json``), ``np.copyto`` as the bound."""
    rows = doc["rows"]
    fig, (ax,) = new_figure()
    x = [r["bytes"] for r in rows]
    ax.plot(x, [r["h2d_gbs"] for r in rows], "o-", color="C0", label="H2D (shared memory)")
    ax.plot(x, [r["d2h_gbs"] for r in rows], "s-", color="C1", label="D2H (shared memory)")
    grpc = [r for r in rows if "grpc_h2d_gbs" in r]
    if grpc:
        gx = [r["bytes"] for r in grpc]
        ax.plot(gx, [r["grpc_h2d_gbs"] for r in grpc], "o--", color="C0", alpha=0.6, label="H2D (gRPC)")
        ax.plot(gx, [r["grpc_d2h_gbs"] for r in grpc], "s--", color="C1", alpha=0.6, label="D2H (gRPC)")
    ax.plot(x, [r["copyto_gbs"] for r in rows], "k--", lw=1.6, label="bound: np.copyto, same run")
    _size_axis(ax)
    ax.set_xlabel("copy size (bytes)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title("vnpu bench memcpy: host <-> device bandwidth")
    ax.legend(fontsize="small")
    return fig


def hccl_bound_busbw(row: dict, key: str = "tn_us") -> float | None:
    """The busbw the row's collective would have at its bound's time (``tn_us``: all cores, ``t1_us``: one
    thread): the same bytes, so busbw x time / bound time; None without a bound."""
    b = row.get("bound") or {}
    t = b.get(key)
    return row["busbw"] * row["time_us"] / t if t else None


def hccl_figure(doc: dict) -> Figure:
    """busbw vs size per collective (``doc``: ``vnpu bench hccl --json``), with the memory-bound lines."""
    rows = doc["rows"]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, (ax,) = new_figure(width=8.5)
    for i, op in enumerate(ops):
        mine = [r for r in rows if r["op"] == op]
        x = [r["size"] for r in mine]
        ax.plot(x, [r["busbw"] for r in mine], "o-", color=f"C{i}", label=f"{op} busbw")
        bounded = [r for r in mine if hccl_bound_busbw(r) is not None]
        if bounded:
            threads = bounded[0]["bound"].get("threads")
            bx = [r["size"] for r in bounded]
            ax.plot(bx, [hccl_bound_busbw(r) for r in bounded], "--", color=f"C{i}", alpha=0.8,
                    label=f"{op} bound, {threads} threads")
            ax.plot(bx, [hccl_bound_busbw(r, "t1_us") for r in bounded], ":", color=f"C{i}", alpha=0.8,
                    label=f"{op} bound, 1 thread")
    _size_axis(ax)
    ax.set_xlabel("message size (bytes, nccl-tests' size)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    dtype = rows[0]["type"] if rows else "?"
    ax.set_title(f"vnpu bench hccl: {doc.get('devices', '?')} ranks, {dtype} ({doc.get('backend', '?')} backend)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


__all__ = ["memcpy_figure", "hccl_figure", "hccl_bound_busbw", "size_label"]
