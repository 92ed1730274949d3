"""``vnpu chaos``: a seeded fault campaign against a running job, with a live line per fault and a report;
``vnpu chaos check REPORT.json`` verifies a report's history on its own (:mod:`runtime.cluster.history_check`)."""
from __future__ import annotations

import json
import sys

from runtime.cliargs import add_output_arg, choices_list, duration, nonneg_int, positive_int


def register(sub) -> None:
    from runtime.cluster.chaos import FAULT_KINDS, NODE_FAULTS, WORKLOADS
    c = sub.add_parser("chaos", help="kill, hang and break devices while a job runs; report what was lost",
                       example=("vnpu chaos --workload embed --devices 4 --duration 60s --faults kill,hang --every 5s "
                                "--seed 7 --output chaos.json", "vnpu chaos check chaos.json"))
    c.add_argument("--workload", default="mlp", choices=WORKLOADS, help="the job the faults hit (default mlp)")
    c.add_argument("--devices", type=positive_int, default=4, help="logical devices the job runs on")
    c.add_argument("--spares", type=nonneg_int, default=1, help="spare devices (failover targets)")
    c.add_argument("--duration", type=duration, default="60s", help="length of the fault phase (e.g. 60s)")
    c.add_argument("--baseline", type=duration, default=None,
                   help="length of the fault-free phase (default min(10s, duration/3))")
    c.add_argument("--faults", type=choices_list((*FAULT_KINDS, *NODE_FAULTS), "fault kind"),
                   default="kill,hang,slow,ecc,link-down",
                   help=f"comma-separated kinds among {','.join(FAULT_KINDS)} (device faults) and "
                        f"{','.join(NODE_FAULTS)} (node faults: --nodes 2 or more)")
    c.add_argument("--nodes", type=positive_int, default=1,
                   help="worker nodes of the campaign's cluster (>= 2: a multi-node Ray cluster on this machine, "
                        "devices and spares spread over the nodes)")
    c.add_argument("--every", type=duration, default="5s", help="one fault every ...")
    c.add_argument("--seed", type=int, default=0, help="seed of the fault schedule (same seed, same campaign)")
    c.add_argument("--hang-deadline", type=duration, default="500ms", help="missed heartbeats for this long = hung")
    c.add_argument("--no-cpu-fallback", action="store_true",
                   help="no CPU fallback once every device and spare is lost (requests fail instead)")
    add_output_arg(c, "write the JSON report here")
    c.set_defaults(fn=_cmd_chaos)
    cs = c.add_subparsers(dest="chaos_cmd", metavar="{check}")
    chk = cs.add_parser("check", help="verify a chaos report's history (exactly once, results, acknowledgements)",
                        example="vnpu chaos check chaos.json --json")
    chk.add_argument("report", help="a report written by vnpu chaos --output")
    chk.add_argument("--json", action="store_true", help="print the verdict as JSON")
    chk.set_defaults(fn=_cmd_check)


def _cmd_chaos(a) -> int:
    from runtime.cluster.chaos import NODE_FAULTS, ChaosConfig, failures, run_campaign, summary_lines
    from runtime.cluster.failover import FailoverOptions
    from runtime.cliargs import fail
    node_kinds = [f for f in a.faults if f in NODE_FAULTS]
    if node_kinds and a.nodes < 2:
        fail(f"argument --faults: {node_kinds[0]} needs a multi-node cluster: pass --nodes 2 or more", "vnpu chaos")
    if a.nodes > a.devices + a.spares:
        fail(f"argument --nodes: {a.nodes} nodes for {a.devices + a.spares} devices (devices + spares) would "
             f"leave a node without devices", "vnpu chaos")
    try:
        opts = FailoverOptions(hang_deadline_s=a.hang_deadline, cpu_fallback=not a.no_cpu_fallback)
    except ValueError as e:
        fail(f"argument --hang-deadline: {e}", "vnpu chaos")
    cfg = ChaosConfig(workload=a.workload, devices=a.devices, spares=a.spares, duration_s=a.duration,
                      every_s=a.every, faults=a.faults, seed=a.seed, baseline_s=a.baseline, options=opts,
                      nodes=a.nodes)
    from runtime.cluster import chaos_noise
    with chaos_noise.NoiseCapture() as noise:         # Ray's worker-death paragraphs, the driver's warnings
        rep = run_campaign(cfg, out=lambda s: print(s, flush=True))
    rep["noise"] = noise.summary(rep)
    for line in summary_lines(rep) + chaos_noise.lines(rep["noise"]):
        print(line)
    if a.output:
        try:
            with open(a.output, "w") as f:
                json.dump(rep, f, indent=1, default=str)
        except OSError as e:                     # checked up front; the disk may still fill up
            print(f"vnpu chaos: error: cannot write {a.output}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"report: {a.output}")
    failed = failures(rep)
    if failed:
        print(f"vnpu chaos: FAILED: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _cmd_check(a) -> int:
    from runtime.cliargs import fail, read_text
    from runtime.cluster.history_check import check_report, verdict_lines
    try:
        doc = json.loads(read_text(a.report))
    except ValueError as e:
        fail(f"argument report: {e}", "vnpu chaos check")
    if not isinstance(doc, dict) or not isinstance(doc.get("history"), list):
        fail(f"argument report: {a.report} is not a chaos report with a history", "vnpu chaos check")
    res = check_report(doc)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for line in verdict_lines(res):
            print(line)
    return 0 if res["ok"] else 1
