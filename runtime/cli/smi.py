"""``vnpu smi``: npu-smi's view of the running cluster -- a timestamp, one row per device (health, power,
temperature, AI Core use, HBM used/total and fragmentation (Frag), tasks, bus id, node) and the processes that
hold HBM on each device (tenant, pid, client, bytes: what the device reports, a tenant sees its own) --
as text that fits the terminal, or with ``--json`` as the same fields.  ``-l/--loop SECONDS`` redraws until
Ctrl-C (in place on a terminal; appended frames, or one JSON document per line, when piped).

With no cluster up (``vnpu up``) it says so at once (exit 2, one line, nothing started); ``--embedded``
starts a temporary cluster of ``--devices`` devices for the run instead (about a minute on 2 cores).

The table never runs past the terminal: columns are left out by width, least important first (node, bus
id, physical id, ...; a note names them, ``--json`` has all), as nvidia-smi does.

HBM fragmentation is the arena's (all clients together): 1 - largest free block / free bytes; an
allocation larger than the largest free block fails even when enough is free (``Device.defragment()``
compacts a client's pool memory)."""
from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass
from typing import Callable

from runtime.api import Runtime
from runtime.cliargs import duration, fail, positive_int

PROG = "vnpu smi"


def register(sub) -> None:
    smi = sub.add_parser("smi", help="npu-smi-like device table: health, power, temperature, AI Core, HBM, "
                                     "processes", example=("vnpu smi", "vnpu smi -l 2", "vnpu smi --json"))
    smi.add_argument("--json", action="store_true", help="print the table's fields as JSON (every column, "
                                                         "the processes under each device, the timestamp)")
    smi.add_argument("-l", "--loop", type=duration, default=None, metavar="SECONDS",
                     help="redraw every SECONDS (1, 500ms, 2s) until Ctrl-C, as npu-smi/nvidia-smi -l")
    smi.add_argument("--embedded", action="store_true",
                     help="with no cluster up, start a temporary one for this run (slow) instead of saying so")
    smi.add_argument("--devices", type=positive_int, default=None,
                     help="devices of the --embedded cluster (default 4)")
    smi.set_defaults(fn=_cmd_smi)


def _cmd_smi(a) -> int:
    from runtime.cluster import cluster_runtime, running_state
    if a.devices and not a.embedded:
        fail("argument --devices: sizes the --embedded cluster; add --embedded (a running cluster has its own)", PROG)
    if not a.embedded and running_state() is None:
        fail("no vnpu cluster is up: start one with `vnpu up --devices 4`, or run `vnpu smi --embedded` for a "
             "temporary one", PROG)
    from runtime.cli.console import stdout_console
    console = stdout_console()
    with cluster_runtime(devices=a.devices or 4) as rt:
        if a.loop is None:
            _show(collect(rt), a.json, console)
            return 0
        return _watch(lambda: collect(rt), a.loop, a.json, console)


def _show(rows: list[dict], as_json: bool, console) -> None:
    if as_json:
        print(to_json(rows), flush=True)
    else:
        console.print(frame(rows, console.width))


def _watch(sample: Callable[[], list[dict]], every_s: float, as_json: bool, console) -> int:
    """Sample and show every ``every_s`` until Ctrl-C (exit 0): redrawn in place on a terminal, else
    appended (JSON: one document per line).  Blocks the host for the whole watch."""
    import threading
    tick = threading.Event()                   # never set: its wait is an interruptible sleep
    try:
        if as_json or not console.is_terminal:
            while True:
                if as_json:
                    print(json.dumps(document(sample())), flush=True)
                else:
                    console.print(frame(sample(), console.width))
                    console.print()
                    console.file.flush()
                tick.wait(every_s)
        from rich.live import Live
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                live.update(frame(sample(), console.width), refresh=True)
                tick.wait(every_s)
    except KeyboardInterrupt:
        return 0


# ---------------------------------------------------------------------------------------------- data
#: a runtime client's id names its process: ``<pid>-<8 hex>`` (the cluster backend) or ``<host>-<pid>-<8 hex>``
#: (a bare driver client, :class:`driver.client.RemoteDevice`)
_CLIENT_PID = re.compile(r"(?:^|-)(\d+)-[0-9a-f]{8}$")


def client_pid(client: str) -> int | None:
    """The process id in a runtime client's id, None when it names none (a device's own HCCL buffers)."""
    m = _CLIENT_PID.search(client or "")
    return int(m.group(1)) if m else None


def collect(rt: Runtime) -> list[dict]:
    """One row per visible device: telemetry, where the device lives, and the processes that hold HBM on
    it (what the device reports: a tenant's runtime sees its own tenant's)."""
    rows = []
    for i, dev in enumerate(rt.devices()):
        t = dev.telemetry()
        info = dev.info()
        health, reasons = dev.health()
        addr = getattr(dev.handle, "address", "in-process")
        rows.append({
            "npu": i, "physical_id": dev.physical_id, "name": info.short_name, "chip": info.chip,
            "health": health, "reasons": reasons, "power_w": t["power_w"], "temperature_c": t["temperature_c"],
            "aicore_util": t["aicore_util_avg"], "hbm_used_mb": t["hbm_used"] / 2**20,
            "hbm_total_mb": t["hbm_total"] / 2**20, "hbm_largest_free_mb": t["hbm_largest_free"] / 2**20,
            "fragmentation": t["fragmentation"], "tasks_run": t["tasks_run"], "bus_id": info.bus_id,
            "address": addr,
            "processes": [{"pid": client_pid(h["client"]), "tenant": h["tenant"], "client": h["client"],
                           "hbm_mb": h["hbm_bytes"] / 2**20, "allocations": h["allocations"]}
                          for h in t.get("holders", ())],
        })
    return rows


def document(rows: list[dict], when: _dt.datetime | None = None) -> dict:
    """What ``--json`` prints: the version, the timestamp (ISO 8601, local time with its offset), the rows."""
    from runtime.cli import version
    when = when or _dt.datetime.now().astimezone()
    return {"version": version(), "timestamp": when.isoformat(timespec="seconds"), "devices": rows}


def to_json(rows: list[dict], when: _dt.datetime | None = None) -> str:
    return json.dumps(document(rows, when), indent=1)


# ---------------------------------------------------------------------------------------------- text
@dataclass(frozen=True)
class Column:
    """One column of a table: its header, the row key it shows (``--json`` carries the same key), how the
    value is written, and how much it matters (lower: left out first when the terminal is narrow)."""
    header: str
    key: str
    text: Callable[[dict], str]
    rank: int
    right: bool = False


def _health(r: dict) -> str:
    return r["health"] if r["health"] == "OK" else f"[bold red]{r['health']}[/]"


#: the device table, in display order
DEVICE_COLUMNS = (
    Column("NPU", "npu", lambda r: str(r["npu"]), 100, True),
    Column("Name", "name", lambda r: str(r["name"]), 90),
    Column("Health", "health", _health, 95),
    Column("Power(W)", "power_w", lambda r: f"{r['power_w']:.1f}", 70, True),
    Column("Temp(C)", "temperature_c", lambda r: f"{r['temperature_c']:.0f}", 75, True),
    Column("AICore(%)", "aicore_util", lambda r: f"{r['aicore_util']:.0f}", 85, True),
    Column("HBM-Usage(MB)", "hbm_used_mb", lambda r: f"{r['hbm_used_mb']:.0f} / {r['hbm_total_mb']:.0f}", 98, True),
    Column("Frag", "fragmentation", lambda r: f"{r['fragmentation']:.2f}", 60, True),
    Column("Tasks", "tasks_run", lambda r: str(r["tasks_run"]), 50, True),
    Column("Bus-Id", "bus_id", lambda r: str(r["bus_id"]), 40),
    Column("Phy-Id", "physical_id", lambda r: str(r["physical_id"]), 20, True),
    Column("Node", "address", lambda r: str(r["address"]), 30),
)

#: the process table (one row per client holding HBM on a device)
PROCESS_COLUMNS = (
    Column("NPU", "npu", lambda p: str(p["npu"]), 100, True),
    Column("PID", "pid", lambda p: "-" if p["pid"] is None else str(p["pid"]), 90, True),
    Column("Tenant", "tenant", lambda p: p["tenant"] or "-", 80),
    Column("HBM(MB)", "hbm_mb", lambda p: f"{p['hbm_mb']:.1f}", 95, True),
    Column("Allocs", "allocations", lambda p: str(p["allocations"]), 50, True),
    Column("Client", "client", lambda p: p["client"] or "-", 40),
)


def _table(title: str, columns, rows: list[dict]):
    from rich import box
    from rich.table import Table
    t = Table(title=title, title_justify="left", box=box.ASCII2, pad_edge=True)
    for c in columns:
        t.add_column(c.header, justify="right" if c.right else "left", overflow="fold")
    for r in rows:
        t.add_row(*(c.text(r) for c in columns))
    return t


def _natural_width(renderable) -> int:
    from runtime.cli.console import to_text
    return max(len(line) for line in to_text(renderable, width=10_000).splitlines())


def _fitted(title: str, columns, rows: list[dict], width: int):
    """The table with as many columns as fit ``width`` (the least important left out first; the ones
    ranked 90 and up always stay -- rich wraps them if even they do not fit), and the headers left out."""
    shown = list(columns)
    table = _table(title, shown, rows)
    while _natural_width(table) > width:
        drop = min((c for c in shown if c.rank < 90), key=lambda c: c.rank, default=None)
        if drop is None:
            break
        shown.remove(drop)
        table = _table(title, shown, rows)
    return table, [c.header for c in columns if c not in shown]


def frame(rows: list[dict], width: int, when: _dt.datetime | None = None):
    """One screen of ``vnpu smi`` for a ``width``-column terminal: the header line (version, timestamp),
    the device table, health reasons, the process table, and what was left out for width."""
    from rich.console import Group
    from rich.text import Text

    from runtime.cli import version
    when = when or _dt.datetime.now().astimezone()
    parts: list = [Text(f"vnpu smi {version()}    {when:%a %b %d %H:%M:%S %Y}    {len(rows)} NPU(s)")]
    devices, left_out = _fitted("Devices", DEVICE_COLUMNS, rows, width)
    parts.append(devices)
    parts += [Text(f"npu{r['npu']} {r['health']}: {'; '.join(r['reasons'])}") for r in rows if r["reasons"]]
    procs = [dict(p, npu=r["npu"]) for r in rows for p in r.get("processes", ())]
    if procs:
        table, more = _fitted("Processes (holding HBM)", PROCESS_COLUMNS, procs, width)
        parts.append(table)
        left_out += [f"process {h}" for h in more]
    else:
        parts.append(Text("Processes: no process holds HBM"))
    if left_out:
        parts.append(Text(f"(left out for width: {', '.join(left_out)}; see --json)"))
    return Group(*parts)


def render(rows: list[dict], width: int = 110, when: _dt.datetime | None = None) -> str:
    """The screen as plain text, ``width`` columns wide (what ``vnpu smi`` prints when stdout is not a
    terminal, at that terminal width)."""
    from runtime.cli.console import to_text
    return to_text(frame(rows, width, when), width=width)
