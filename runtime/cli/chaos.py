"""``vnpu chaos``: a seeded fault campaign against a running job, with a live line per fault and a report."""
from __future__ import annotations

import json
import re
import sys


def _seconds(s: str) -> float:
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|m)?\s*", str(s))
    if not m:
        raise ValueError(f"bad duration {s!r} (e.g. 60s, 500ms, 2m)")
    v = float(m.group(1))
    return v / 1000.0 if m.group(2) == "ms" else v * 60 if m.group(2) == "m" else v


def register(sub) -> None:
    from runtime.cluster.chaos import FAULT_KINDS, NODE_FAULTS
    c = sub.add_parser("chaos", help="kill, hang and break devices while a job runs; report what was lost")
    c.add_argument("--workload", default="mlp", choices=("mlp", "embed", "generate"))
    c.add_argument("--devices", type=int, default=4, help="logical devices the job runs on")
    c.add_argument("--spares", type=int, default=1, help="spare devices (failover targets)")
    c.add_argument("--duration", default="60s", help="length of the fault phase (e.g. 60s)")
    c.add_argument("--baseline", default=None, help="length of the fault-free phase (default min(10s, duration/3))")
    c.add_argument("--faults", default="kill,hang,slow,ecc,link-down",
                   help=f"comma-separated kinds among {','.join(FAULT_KINDS)} (device faults) and "
                        f"{','.join(NODE_FAULTS)} (node faults: --nodes 2 or more)")
    c.add_argument("--nodes", type=int, default=1,
                   help="worker nodes of the campaign's cluster (>= 2: a multi-node Ray cluster on this machine, "
                        "devices and spares spread over the nodes)")
    c.add_argument("--every", default="5s", help="one fault every ...")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--hang-deadline", default="500ms", help="missed heartbeats for this long = hung")
    c.add_argument("--no-cpu-fallback", action="store_true")
    c.add_argument("--report", default=None, help="write the JSON report here")
    c.set_defaults(fn=_cmd_chaos)


def _cmd_chaos(a) -> int:
    from runtime.cluster.chaos import FAULT_KINDS, NODE_FAULTS, ChaosConfig, run_campaign, summary_lines
    from runtime.cluster.failover import FailoverOptions
    faults = tuple(f.strip() for f in a.faults.split(",") if f.strip())
    bad = [f for f in faults if f not in FAULT_KINDS and f not in NODE_FAULTS]
    if bad or not faults:
        print(f"vnpu chaos: unknown fault kind(s) {bad}; known: {', '.join([*FAULT_KINDS, *NODE_FAULTS])}",
              file=sys.stderr)
        return 2
    node_kinds = [f for f in faults if f in NODE_FAULTS]
    if a.nodes < 1 or (node_kinds and a.nodes < 2):
        print(f"vnpu chaos: {node_kinds[0] if node_kinds and a.nodes >= 1 else '--nodes'} needs a multi-node "
              f"cluster: pass --nodes 2 or more (this run would have {a.nodes} node{'s' if a.nodes != 1 else ''})",
              file=sys.stderr)
        return 2
    if a.devices < 1 or a.spares < 0:
        print("vnpu chaos: --devices must be >= 1 and --spares >= 0", file=sys.stderr)
        return 2
    try:
        opts = FailoverOptions(hang_deadline_s=_seconds(a.hang_deadline), cpu_fallback=not a.no_cpu_fallback)
        cfg = ChaosConfig(workload=a.workload, devices=a.devices, spares=a.spares, duration_s=_seconds(a.duration),
                          every_s=_seconds(a.every), faults=faults, seed=a.seed,
                          baseline_s=_seconds(a.baseline) if a.baseline else None, options=opts, nodes=a.nodes,
                          arena_bytes=(1 << 30) if a.workload == "generate" else 256 << 20)
    except ValueError as e:
        print(f"vnpu chaos: {e}", file=sys.stderr)
        return 2
    rep = run_campaign(cfg, out=lambda s: print(s, flush=True))
    for line in summary_lines(rep):
        print(line)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f, indent=1, default=str)
        print(f"report: {a.report}")
    ok = rep["lost"] == 0 and rep["duplicated"] == 0 and rep["correct"]
    return 0 if ok else 1
