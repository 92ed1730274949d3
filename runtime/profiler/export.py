"""msprof's output layout from the collected profiles.

``PROF_{num}_{timestamp}_{16 letters}/`` (msprof's folder name) holding ``host/data/`` (each profiled
process's raw records, JSON) and ``mindstudio_profiler_output/``:

- ``msprof_{ts}.json``: a Chrome trace / Perfetto timeline.  Per process: its host threads with their API
  calls (AscendCL and Runtime levels); per device it used, "Ascend Hardware" with one row per stream,
  one per AI Core (each block of each task), and rows for collectives (HCCL) and copies (MEMCPY); flow
  arrows (``s``/``f``) from each launch to its device task.  The wall clock and the modeled clock are
  separate timelines: the ``[modeled]`` processes show the replay on the reference chip
  (:mod:`~runtime.profiler.analysis`).  Times are microseconds from the start of the earliest profile.
- ``op_summary_{ts}.csv``: one row per device task with msprof's columns where they apply ("N/A"
  where they do not) plus ``Modeled Duration(us)``; ``op_statistic_{ts}.csv`` per op type;
- ``api_statistic_{ts}.csv``: per API (``Device_id`` = host): count, total, avg, min, max, variance;
- ``summary_{ts}.txt``: the breakdown on both clocks, the top ops and the verdict (also printed).

Host-synchronous file writing; raises OSError when the folder cannot be written.
"""
from __future__ import annotations

import csv
import json
import os
import random
import string
import time
from dataclasses import dataclass

from .analysis import (CATEGORIES, Breakdown, ModeledTimeline, modeled_breakdown, modeled_timeline, top_ops,
                       wall_breakdown)
from .collector import RawProfile

OUTPUT = "mindstudio_profiler_output"

#: op_summary header (msprof, A2 / CANN 8.x, up to the PMU columns) + the modeled columns
OP_SUMMARY_COLUMNS = ("Device_id", "Model Name", "Model ID", "Task ID", "Stream ID", "Infer ID", "Op Name", "OP Type",
                      "OP State", "Task Type", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
                      "Block Dim", "Mix Block Dim", "HF32 Eligible", "Input Shapes", "Input Data Types",
                      "Input Formats", "Output Shapes", "Output Data Types", "Output Formats", "Context ID",
                      "aicore_time(us)", "Modeled Start Time(us)", "Modeled Duration(us)")
API_STATISTIC_COLUMNS = ("Device_id", "Level", "API Name", "Time(us)", "Count", "Avg(us)", "Min(us)", "Max(us)",
                         "Variance")
OP_STATISTIC_COLUMNS = ("Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                        "Avg Time(us)", "Max Time(us)", "Ratio(%)")

#: numpy dtype name -> msprof data type name
_DTYPES = {"float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "DT_BF16", "float64": "DOUBLE", "int8": "INT8",
           "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "bool": "BOOL"}


def new_prof_dir(output: str, num: int = 1) -> str:
    """A fresh ``PROF_{num:06d}_{yyyymmddHHMMSSmmm}_{16 letters}`` folder under ``output`` (made)."""
    now = time.time()
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
    letters = "".join(random.choice(string.ascii_uppercase) for _ in range(16))
    path = os.path.join(output, f"PROF_{num:06d}_{stamp}_{letters}")
    os.makedirs(os.path.join(path, "host", "data"), exist_ok=True)
    return path


def write_raw(prof_dir: str, raw: RawProfile) -> str:
    """Store one process's records under ``host/data/`` (what :func:`export` reads back)."""
    path = os.path.join(prof_dir, "host", "data", f"vnpu_prof_{raw.pid}_{int(raw.t_start * 1e6)}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(raw.as_dict(), f)
    os.replace(tmp, path)
    return path


def read_raws(prof_dir: str) -> list[RawProfile]:
    d = os.path.join(prof_dir, "host", "data")
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.startswith("vnpu_prof_") and name.endswith(".json"):
            with open(os.path.join(d, name), encoding="utf-8") as f:
                out.append(RawProfile.from_dict(json.load(f)))
    return out


@dataclass
class Exported:
    """Where :func:`export` wrote, and what it found."""
    prof_dir: str
    trace: str
    op_summary: str
    op_statistic: str
    api_statistic: str
    summary_path: str
    summary: str
    wall: Breakdown
    modeled: Breakdown


def _us(t: float, origin: float) -> float:
    return round((t - origin) * 1e6, 3)


def _shapes(descs: list) -> str:
    return ";".join(",".join(str(x) for x in d[0]) for d in descs)


def _dtypes(descs: list) -> str:
    return ";".join(_DTYPES.get(d[1], d[1].upper()) for d in descs)


def _formats(descs: list) -> str:
    return ";".join("ND" for _ in descs)


def _device_pid(pid: int, device: int, modeled: bool = False) -> int:
    return pid * 1000 + 100 + device + (500 if modeled else 0)


def trace_events(raws: list[RawProfile], models: list[ModeledTimeline], origin: float) -> list[dict]:
    ev: list[dict] = []
    flow_id = 0
    for n, (raw, model) in enumerate(zip(raws, models)):
        hp = raw.pid
        _host_events(ev, raw, n, origin)
        starts: dict[tuple[int, int, int], tuple[int, float]] = {}
        for d in raw.devices:
            phys = d["device"]
            dp = _device_pid(hp, phys)
            _meta(ev, dp, f"Ascend Hardware device {phys} [wall] (pid {raw.pid})", n * 10 + 1)
            rows: set = set()
            for t in d["tasks"]:
                _task_events(ev, dp, t, rows, origin)
                starts[(phys, int(t["stream"]), t["seq"])] = (int(t["stream"]), t["start"])
        for f in raw.flows:
            phys, sid, seq, tid, t = f[1], f[2], f[3], f[4], f[5]
            hit = starts.get((phys, sid, seq)) if seq >= 0 else None
            if hit is None:
                continue
            flow_id += 1
            ev.append({"ph": "s", "id": flow_id, "name": "launch", "cat": "flow", "pid": hp, "tid": tid,
                       "ts": _us(t, origin)})
            ev.append({"ph": "f", "bp": "e", "id": flow_id, "name": "launch", "cat": "flow",
                       "pid": _device_pid(hp, phys), "tid": sid, "ts": _us(hit[1], origin)})
        _modeled_events(ev, raw, model, n, origin)
    return ev


def _meta(ev: list[dict], pid: int, name: str, sort: int, tid: int | None = None, tname: str | None = None) -> None:
    """A process's name and sort index (``tid`` None), or a thread's name."""
    if tid is None:
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": sort}})
    else:
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}})


def _host_events(ev: list[dict], raw: RawProfile, n: int, origin: float) -> None:
    """The host process of profile ``n``: its threads and every API call."""
    hp = raw.pid
    _meta(ev, hp, f"CANN host (pid {raw.pid}: {' '.join(raw.argv)[:80]})", n * 10)
    for tid, tname in raw.threads.items():
        _meta(ev, hp, "", 0, tid, f"{tname} (tid {tid})")
    for a in raw.api:
        name, cat, level, tid, t0, t1, depth, info = a
        args = {"level": level, "category": cat, "depth": depth}
        if info:
            args.update(info)
        ev.append({"ph": "X", "name": name, "cat": level, "pid": hp, "tid": tid, "ts": _us(t0, origin),
                   "dur": round((t1 - t0) * 1e6, 3), "args": args})


def _task_events(ev: list[dict], dp: int, t: dict, rows: set, origin: float) -> None:
    """One device task on its stream's row (and its HCCL/MEMCPY lane), and each of its blocks on its AI
    Core's row; ``rows`` holds the rows of device process ``dp`` already named."""
    sid = int(t["stream"])
    if ("s", sid) not in rows:
        rows.add(("s", sid))
        _meta(ev, dp, "", 0, sid, f"Stream {sid}")
    args = {"Task Type": t["task_type"], "Stream Id": sid, "Task Id": t["seq"], "OP Type": t["op_type"],
            "Block Dim": t["block_dim"], "Modeled Duration(us)": round((t["model_end"] - t["model_start"]) * 1e6, 3)}
    if t["error"]:
        args["error"] = t["error"]
    e = {"ph": "X", "name": t["name"], "cat": t["task_type"], "pid": dp, "tid": sid,
         "ts": _us(t["start"], origin), "dur": round((t["end"] - t["start"]) * 1e6, 3), "args": args}
    ev.append(e)
    lane = {"HCCL": (900001, "Collectives (HCCL)"), "MEMCPY": (900002, "Copies (MEMCPY)")}.get(t["task_type"])
    if lane is not None:
        if lane[0] not in rows:
            rows.add(lane[0])
            _meta(ev, dp, "", 0, lane[0], lane[1])
        ev.append(dict(e, tid=lane[0]))
    for b, core, b0, b1 in t["blocks"]:
        ctid = 1_000_000 + int(core)
        if ctid not in rows:
            rows.add(ctid)
            _meta(ev, dp, "", 0, ctid, f"AI Core {core}")
        ev.append({"ph": "X", "name": f"{t['name']} block {b}", "cat": "block", "pid": dp, "tid": ctid,
                   "ts": _us(b0, origin), "dur": round((b1 - b0) * 1e6, 3),
                   "args": {"block": b, "core": core, "Task Id": t["seq"], "Stream Id": sid}})


def _modeled_events(ev: list[dict], raw: RawProfile, model: ModeledTimeline, n: int, origin: float) -> None:
    """The modeled clock of profile ``n``: the replay on the reference chip, from the profile's start."""
    hp = raw.pid
    mh = _device_pid(hp, 0, modeled=True) - 1
    _meta(ev, mh, f"[modeled] host (pid {raw.pid})", n * 10 + 5)
    _meta(ev, mh, "", 0, 0, "host calls (modeled)")
    base = _us(raw.t_start, origin)
    for name, cat, s, e in model.host:
        ev.append({"ph": "X", "name": name, "cat": f"modeled.{cat}", "pid": mh, "tid": 0,
                   "ts": round(base + s * 1e6, 3), "dur": round((e - s) * 1e6, 3), "args": {"category": cat}})
    names = {(d["device"], t["stream"], t["seq"]): t for d in raw.devices for t in d["tasks"]}
    seen: set = set()
    for (phys, sid, seq), (s, e) in sorted(model.tasks.items(), key=lambda kv: kv[1][0]):
        mp = _device_pid(hp, phys, modeled=True)
        if (phys, None) not in seen:
            seen.add((phys, None))
            _meta(ev, mp, f"[modeled] Ascend Hardware device {phys} (pid {raw.pid})", n * 10 + 6)
        if (phys, sid) not in seen:
            seen.add((phys, sid))
            _meta(ev, mp, "", 0, sid, f"Stream {sid}")
        t = names[(phys, sid, seq)]
        ev.append({"ph": "X", "name": t["name"], "cat": f"modeled.{t['task_type']}", "pid": mp, "tid": sid,
                   "ts": round(base + s * 1e6, 3), "dur": round((e - s) * 1e6, 3),
                   "args": {"Task Type": t["task_type"], "Task Id": seq}})


def op_summary_rows(raws: list[RawProfile], origin: float) -> list[dict]:
    rows = []
    for raw in raws:
        for d in raw.devices:
            last_end: dict[int, float] = {}
            for t in sorted(d["tasks"], key=lambda t: (t["stream"], t["seq"])):
                sid = t["stream"]
                wait = max(0.0, t["start"] - last_end[sid]) if sid in last_end else 0.0
                last_end[sid] = t["end"]
                hccl = t["task_type"] == "HCCL"
                rows.append({
                    "Device_id": d["device"], "Model Name": "N/A", "Model ID": "N/A",
                    "Task ID": "N/A" if hccl else t["seq"], "Stream ID": "N/A" if hccl else sid, "Infer ID": "N/A",
                    "Op Name": t["name"], "OP Type": t["op_type"], "OP State": "static" if not t["error"] else "failed",
                    "Task Type": t["task_type"], "Task Start Time(us)": _us(t["start"], origin),
                    "Task Duration(us)": round((t["end"] - t["start"]) * 1e6, 3),
                    "Task Wait Time(us)": round(wait * 1e6, 3), "Block Dim": t["block_dim"], "Mix Block Dim": "N/A",
                    "HF32 Eligible": "N/A", "Input Shapes": _shapes(t["inputs"]), "Input Data Types": _dtypes(t["inputs"]),
                    "Input Formats": _formats(t["inputs"]), "Output Shapes": _shapes(t["outputs"]),
                    "Output Data Types": _dtypes(t["outputs"]), "Output Formats": _formats(t["outputs"]),
                    "Context ID": "N/A",
                    "aicore_time(us)": round(sum(b[3] - b[2] for b in t["blocks"]) * 1e6, 3)
                    if t["task_type"] in ("AI_CORE", "AI_VECTOR_CORE") else "N/A",
                    "Modeled Start Time(us)": round(t["model_start"] * 1e6, 3),
                    "Modeled Duration(us)": round((t["model_end"] - t["model_start"]) * 1e6, 3)})
    return rows


def _stats(values: list[float]) -> tuple[float, float, float, float, float]:
    n = len(values)
    total = sum(values)
    avg = total / n
    var = sum((v - avg) ** 2 for v in values) / n
    return total, avg, min(values), max(values), var


def api_statistic_rows(raws: list[RawProfile]) -> list[dict]:
    by: dict[tuple[str, str], list[float]] = {}
    for raw in raws:
        for a in raw.api:
            by.setdefault((a[2], a[0]), []).append((a[5] - a[4]) * 1e6)
    rows = []
    for (level, name), vals in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        total, avg, lo, hi, var = _stats(vals)
        rows.append({"Device_id": "host", "Level": level, "API Name": name, "Time(us)": round(total, 3),
                     "Count": len(vals), "Avg(us)": round(avg, 3), "Min(us)": round(lo, 3), "Max(us)": round(hi, 3),
                     "Variance": round(var, 3)})
    return rows


def op_statistic_rows(rows: list[dict]) -> list[dict]:
    by: dict[tuple, list[float]] = {}
    for r in rows:
        by.setdefault((r["Device_id"], r["OP Type"], r["Task Type"]), []).append(r["Task Duration(us)"])
    grand = sum(sum(v) for v in by.values()) or 1.0
    out = []
    for (dev, op, core), vals in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        total, avg, lo, hi, _ = _stats(vals)
        out.append({"Device_id": dev, "OP Type": op, "Core Type": core, "Count": len(vals),
                    "Total Time(us)": round(total, 3), "Min Time(us)": round(lo, 3), "Avg Time(us)": round(avg, 3),
                    "Max Time(us)": round(hi, 3), "Ratio(%)": round(100 * total / grand, 2)})
    return out


def _write_csv(path: str, columns: tuple, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)


def breakdown_lines(wall: Breakdown, modeled: Breakdown) -> list[str]:
    lines = [f"{'':10s} {'modeled':>16s} {'wall':>16s}"]
    for c in CATEGORIES:
        lines.append(f"{c:10s} {modeled.share(c):7.1%} {modeled.seconds.get(c, 0) * 1e3:7.2f}ms "
                     f"{wall.share(c):7.1%} {wall.seconds.get(c, 0) * 1e3:7.2f}ms")
    lines.append(f"{'total':10s} {'':7s} {modeled.total * 1e3:7.2f}ms {'':7s} {wall.total * 1e3:7.2f}ms")
    return lines


def summary_text(raws: list[RawProfile], wall: Breakdown, modeled: Breakdown) -> str:
    ntasks = sum(len(d["tasks"]) for r in raws for d in r.devices)
    ncalls = sum(1 for r in raws for a in r.api if a[6] == 0)
    dropped = sum(d.get("dropped", 0) for r in raws for d in r.devices)
    out = [f"vnpu prof: {len(raws)} runtime client(s), {ncalls} API calls, {ntasks} device tasks"
           + (f" ({dropped} not kept)" if dropped else ""),
           "where the time went (share of the total; modeled = the reference chip, wall = this machine):"]
    out += ["  " + ln for ln in breakdown_lines(wall, modeled)]
    ops = top_ops(raws)
    if ops:
        out.append("top ops (device tasks by wall time):")
        out.append(f"  {'op':24s} {'count':>7s} {'wall ms':>9s} {'modeled ms':>11s}")
        for name, cnt, w, m in ops:
            out.append(f"  {name[:24]:24s} {cnt:7d} {w * 1e3:9.2f} {m * 1e3:11.3f}")
    out.append(f"verdict: {modeled.verdict()}")
    out.append(f"         (wall clock: device compute is {wall.compute_share:.0%} on this machine)")
    return "\n".join(out)


def export(prof_dir: str, raws: list[RawProfile] | None = None) -> Exported:
    """Write ``mindstudio_profiler_output/`` for the profiles in ``prof_dir/host/data`` (or ``raws``)."""
    raws = read_raws(prof_dir) if raws is None else raws
    raws = sorted(raws, key=lambda r: r.t_start)
    origin = min((r.t_start for r in raws), default=0.0)
    models = [modeled_timeline(r) for r in raws]
    out = os.path.join(prof_dir, OUTPUT)
    os.makedirs(out, exist_ok=True)
    ts = time.strftime("%Y%m%d%H%M%S")
    paths = {k: os.path.join(out, f"{k}_{ts}.{ext}") for k, ext in
             (("msprof", "json"), ("op_summary", "csv"), ("op_statistic", "csv"), ("api_statistic", "csv"),
              ("summary", "txt"))}
    with open(paths["msprof"], "w", encoding="utf-8") as f:
        json.dump({"traceEvents": trace_events(raws, models, origin), "displayTimeUnit": "ms",
                   "otherData": {"producer": "vnpu prof", "clocks": "wall (Ascend Hardware) and modeled ([modeled])"}}, f)
    rows = op_summary_rows(raws, origin)
    _write_csv(paths["op_summary"], OP_SUMMARY_COLUMNS, rows)
    _write_csv(paths["op_statistic"], OP_STATISTIC_COLUMNS, op_statistic_rows(rows))
    _write_csv(paths["api_statistic"], API_STATISTIC_COLUMNS, api_statistic_rows(raws))
    wall = wall_breakdown(raws)
    modeled = modeled_breakdown(raws)
    text = summary_text(raws, wall, modeled)
    with open(paths["summary"], "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return Exported(prof_dir, paths["msprof"], paths["op_summary"], paths["op_statistic"], paths["api_statistic"],
                    paths["summary"], text, wall, modeled)
