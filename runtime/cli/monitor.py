"""``vnpu monitor``: a live dashboard of a running server (``rich.live.Live``): the chosen metrics with
sparklines, a per-device table, the next hour's forecast request rate per model, recent events; redrawn every ``--interval``.  ``--once`` draws one frame
and exits; ``--json`` prints the frame's data (one JSON document per frame; with ``--once``, one).

    vnpu monitor --metrics qps,p99,error_rate,mem_frag,temp --interval 1s
    vnpu monitor --live --metrics "qps,latency,mem_frag,error_rate"     (the article's; latency = p99)
"""
from __future__ import annotations

import json
import threading
import time

from runtime.cli.reader import add_source_args, open_from_args
from runtime.cliargs import duration


def _metrics(s: str) -> list[str]:
    import argparse
    from runtime.observe.dashboard import metric_name
    try:
        out = [metric_name(x) for x in s.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not out:
        raise argparse.ArgumentTypeError("name at least one metric")
    return list(dict.fromkeys(out))


def register(sub) -> None:
    from runtime.observe.dashboard import DEFAULT_METRICS
    m = sub.add_parser("monitor", help="live dashboard of a running server (metrics, devices, events)",
                       example=("vnpu monitor", "vnpu monitor --url http://127.0.0.1:8000 --interval 2s --window 5m"))
    m.add_argument("--metrics", type=_metrics, default=",".join(DEFAULT_METRICS),
                   help=f"comma-separated metrics or aliases (default {','.join(DEFAULT_METRICS)})")
    m.add_argument("--interval", type=duration, default="1s", help="redraw every ... (default 1s)")
    m.add_argument("--window", type=duration, default="2m", help="history shown by the sparklines (default 2m)")
    lo = m.add_mutually_exclusive_group()
    lo.add_argument("--live", action="store_true",
                    help="redraw until interrupted (the default; the CANN article's spelling)")
    lo.add_argument("--once", action="store_true", help="draw one frame and exit")
    m.add_argument("--json", action="store_true", help="print each frame's data as JSON")
    add_source_args(m)
    m.set_defaults(fn=_cmd)


def render(view):
    """A frame as a rich renderable."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from runtime.observe.dashboard import DEVICE_COLUMNS, HEALTH_WORDS
    from runtime.observe.metrics_store import METRICS
    stamp = time.strftime("%H:%M:%S", time.gmtime(view.now))
    mt = Table(title=f"vnpu monitor  {view.where}  {stamp} UTC", box=box.SIMPLE_HEAD, title_justify="left")
    for c, w in (("metric", 20), ("scope", 6), ("unit", 5), ("now", 7), ("min", 7), ("max", 7), ("trend", 24)):
        mt.add_column(c, no_wrap=True, min_width=w, justify="right" if c in ("now", "min", "max") else "left")
    for r in view.rows:
        f = (lambda v: "-" if v is None else f"{v:.4g}")
        mt.add_row(r.metric, r.scope or "server", METRICS[r.metric][0], f(r.latest), f(r.lo), f(r.hi),
                   r.spark[-24:])
    dt = Table(title="devices", box=box.SIMPLE_HEAD, title_justify="left")
    dt.add_column("NPU")
    for _, head in DEVICE_COLUMNS:
        dt.add_column(head, justify="right")
    for scope, vals in view.devices.items():
        cells = []
        for m, _ in DEVICE_COLUMNS:
            v = vals.get(m)
            if v is None:
                cells.append("-")
            elif m == "device_health":
                word = HEALTH_WORDS.get(int(v), str(v))
                cells.append(word if word == "OK" else f"[bold red]{word}[/]")
            elif m == "hbm_used_bytes":
                cells.append(f"{v / 2**20:.0f}")
            else:
                cells.append(f"{v:.3g}" if m == "hbm_fragmentation" else f"{v:.0f}")
        dt.add_row(scope, *cells)
    et = Table(title="recent events", box=box.SIMPLE_HEAD, title_justify="left")
    for c, lo, hi in (("#", 3, 5), ("time", 8, 8), ("kind", 9, 18), ("source", 11, 12), ("what", 20, 56),
                      ("result", 8, 24)):
        et.add_column(c, no_wrap=True, overflow="ellipsis", min_width=lo, max_width=hi)
    for e in view.events:
        et.add_row(str(e.id), time.strftime("%H:%M:%S", time.gmtime(e.ts)), e.kind + (" (manual)" if e.manual else ""),
                   e.source, e.diagnosis or e.trigger, e.result)
    return Group(mt, dt, forecast_table(view.forecasts), et)


def forecast_table(forecasts):
    """The next hour's forecast request rate per model (``*``: the server), :mod:`runtime.observe.forecast`."""
    from rich import box
    from rich.table import Table
    ft = Table(title="forecast requests/s (next hour)", box=box.SIMPLE_HEAD, title_justify="left")
    for c in ("model", "+15m", "+30m", "+1h", "peak", "model kind"):
        ft.add_column(c, no_wrap=True, justify="left" if c in ("model", "model kind") else "right")
    for f in forecasts:
        ft.add_row(f.model, *(f"{f.at(s):.3g}" for s in (900.0, 1800.0, 3600.0)), f"{f.peak():.3g}",
                   f"seasonal ({f.bins} bins)" if f.seasonal else f"level only ({f.bins} bins, < 1 day)")
    if not forecasts:
        ft.add_row("-", "-", "-", "-", "-", "no request-rate history yet")
    return ft


def _cmd(a) -> int:
    from runtime.cliargs import fail
    from runtime.observe.dashboard import build
    from runtime.observe.source import SourceError
    with open_from_args(a, "vnpu monitor") as src:
        def frame():
            try:
                return build(src, a.metrics, a.window)
            except SourceError as e:
                fail(str(e), "vnpu monitor")
        if a.json:
            while True:
                print(json.dumps(frame().to_dict()), flush=True)
                if a.once:
                    return 0
                time.sleep(a.interval)                 # the refresh period itself, not a synchronisation
        from runtime.cli.console import stdout_console
        con = stdout_console()
        if not con.is_terminal:
            con.width = 110                            # a pipe or a file has no width: room for the sparklines
        if a.once:
            con.print(render(frame()))
            return 0
        if not con.is_terminal:                        # a pipe or a log: one frame after another
            while True:
                con.print(render(frame()))
                time.sleep(a.interval)
        from rich.live import Live
        stop = threading.Event()
        with Live(render(frame()), console=con, refresh_per_second=4, screen=False) as live:
            try:
                while not stop.wait(a.interval):
                    live.update(render(frame()))
            except KeyboardInterrupt:
                pass
    return 0
