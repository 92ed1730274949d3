"""``vnpu smi``: an npu-smi-like device table (and its JSON form) from the devices' telemetry.

HBM fragmentation is the arena's (all clients together): 1 - largest free block / free bytes; an
allocation larger than the largest free block fails even when enough is free (``Device.defragment()``
compacts a client's pool memory)."""
from __future__ import annotations

import json

from runtime.api import Runtime
from runtime.cliargs import positive_int


def register(sub) -> None:
    smi = sub.add_parser("smi", help="npu-smi-like device table", example="vnpu smi")
    smi.add_argument("--json", action="store_true", help="print the table's fields as JSON")
    smi.add_argument("--devices", type=positive_int, default=4,
                     help="devices of the embedded cluster (when none is up)")
    smi.set_defaults(fn=_cmd_smi)


def _cmd_smi(a) -> int:
    from runtime.cluster import cluster_runtime
    with cluster_runtime(devices=a.devices) as rt:
        rows = collect(rt)
    if a.json:
        print(to_json(rows))
    else:
        from runtime.cli.console import stdout_console
        stdout_console().print(table(rows))
    return 0

def collect(rt: Runtime) -> list[dict]:
    """One row per visible device: telemetry plus where the device lives."""
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
        })
    return rows


def table(rows: list[dict], version: str = "vnpu 0.1.0"):
    """npu-smi's layout as a rich table: two lines per device (NPU/name/health/power/temp/tasks, then
    chip/node/bus/AI Core/HBM usage/HBM fragmentation)."""
    from rich import box
    from rich.table import Table
    t = Table(title=f"npu-smi ({version})", box=box.ASCII2, show_lines=True, title_justify="left")
    t.add_column("NPU   Name\nChip  Node", no_wrap=True)
    t.add_column("Health\nBus-Id", no_wrap=True)
    t.add_column("Power(W)    Temp(C)     Tasks\nAICore(%)   HBM-Usage(MB)        HBM-Frag", no_wrap=True)
    for r in rows:
        health = r["health"] if r["health"] == "OK" else f"[bold red]{r['health']}[/]"
        usage = f"{r['hbm_used_mb']:.0f} / {r['hbm_total_mb']:.0f}"
        t.add_row(f"{r['npu']:<5} {r['name']}\n{r['physical_id']:<5} {r['address']}",
                  f"{health}\n{r['bus_id']}",
                  f"{r['power_w']:<11.1f} {r['temperature_c']:<11.0f} {r['tasks_run']}\n"
                  f"{r['aicore_util']:<11.0f} {usage:<20} {r['fragmentation']:.2f}")
    return t


def render(rows: list[dict], version: str = "vnpu 0.1.0") -> str:
    """The table as plain text (what ``vnpu smi`` prints when stdout is not a terminal)."""
    from runtime.cli.console import to_text
    return to_text(table(rows, version))


def to_json(rows: list[dict]) -> str:
    return json.dumps({"devices": rows}, indent=1)
