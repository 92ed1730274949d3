"""Serving throughput and latency vs concurrency, drawn from ``vnpu bench serve --json``:

- output tokens/s of vnpu (continuous batching) at each client concurrency, beside its baseline (the same
  engine one request at a time, ``max_num_seqs=1``) and the bound (the same decode forward in plain numpy at
  batch = concurrency, dashed);
- TTFT p99 and inter-token latency p99 (ms) of vnpu and of the baseline.

Concurrency on a log2 axis (clients).  Host-blocking.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .figure import new_figure


def figure(doc: dict) -> Figure:
    """tok/s and p99 latencies vs concurrency (``doc``: ``vnpu bench serve --json``, the concurrency sweep)."""
    rows = doc["levels"]
    x = [r["concurrency"] for r in rows]
    fig, (tput, lat) = new_figure(2, 1, height=3.2)
    tput.plot(x, [r["output_tokens_per_s"] for r in rows], "o-", color="C0", label="vnpu serve")
    tput.plot(x, [r["baseline"]["output_tokens_per_s"] for r in rows], "s-", color="C7",
              label="baseline: max_num_seqs=1")
    tput.plot(x, [r["numpy_bound_tokens_per_s"] for r in rows], "k--", label="bound: numpy decode, batch = clients")
    tput.set_ylabel("output tokens/s")
    tput.set_title(f"vnpu bench serve: {doc.get('model', '?')}, {doc.get('max_tokens', '?')} tokens per request, "
                   f"{doc.get('backend', '?')} backend")
    lat.plot(x, [r["ttft_ms_p99"] for r in rows], "o-", color="C1", label="TTFT p99")
    lat.plot(x, [r["itl_ms_p99"] for r in rows], "s-", color="C2", label="inter-token p99")
    lat.plot(x, [r["baseline"]["ttft_ms_p99"] for r in rows], "o--", color="C1", alpha=0.55,
             label="TTFT p99, baseline")
    lat.plot(x, [r["baseline"]["itl_ms_p99"] for r in rows], "s--", color="C2", alpha=0.55,
             label="inter-token p99, baseline")
    lat.set_ylabel("latency p99 (ms)")
    lat.set_ylim(bottom=0)
    for ax in (tput, lat):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xticks(x)
        ax.set_xlabel("concurrent clients")
        ax.legend(fontsize="small")
    tput.set_ylim(bottom=0)
    return fig


__all__ = ["figure"]
