"""``vnpu stress-test``: an open-loop load (arrivals follow the profile's rate curve) against a running
server, faults injected by ``vnpu chaos``'s injector, the request history checked by the independent
checker; reports intended vs achieved rate, lost/duplicated/failed/shed requests, latency and the capacity
at which the p99 target holds, every fault with its detection and recovery, the self-healing actions and
manual interventions the server recorded, the risks it saw, and advice (:mod:`runtime.stress.run`).

    vnpu stress-test --profile burst --duration 2m --rate 20 --faults kill,hang,overheat --every 20s
    vnpu stress-test --profile profile.yaml --duration 5m --output stress.html --json
    vnpu stress-test --profile black_friday_2024 --duration 30m --output stress_report.html  (a named preset)

A named preset (``runtime/stress/profiles.yaml``, :mod:`runtime.stress.presets`) brings its own rate shape,
peak rate, duration and fault plan; ``--rate``, ``--duration``, ``--faults``, ``--every`` override them.  Every
run is recorded in the server's history as the named event of its profile (``vnpu postmortem --event NAME``).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

from runtime.cliargs import add_output_arg, choices_list, duration, float_in, int_at_least, positive_int


def register(sub) -> None:
    from runtime.stress.faults import STRESS_FAULTS
    s = sub.add_parser("stress-test", help="open-loop load + faults against a running server; capacity, risks, "
                                           "self-healing report",
                       example=("vnpu stress-test --profile burst --duration 2m --rate 20 --faults kill,hang --every 20s",
                                "vnpu stress-test --profile steady --duration 5m --output stress.html"))
    s.add_argument("--profile", default="steady",
                   help="steady | burst | diurnal | spike | a named preset (black_friday_2024, flash_sale, "
                        "nightly_batch) | a profile .yaml")
    s.add_argument("--duration", type=duration, default=None,
                   help="length of the load (e.g. 2m, 300s; default 5m, or the preset's)")
    s.add_argument("--rate", type=float_in(0.0, lo_open=True), default=None,
                   help="peak requests/s (default 10, or the preset's)")
    s.add_argument("--faults", type=_faults, default=None,
                   help=f"comma-separated among {','.join(STRESS_FAULTS)}, or none (default: none, or the preset's)")
    s.add_argument("--every", type=duration, default=None, help="one fault every ... (default 30s, or the preset's)")
    s.add_argument("--fault-devices", type=_devices, default=None,
                   help="devices the faults hit, e.g. 0-3 (default: all of the cluster's but the last, a spare)")
    s.add_argument("--model", default=None, help="the model to load (default: the server's first)")
    s.add_argument("--max-tokens", type=positive_int, default=8, help="output tokens per request (default 8)")
    s.add_argument("--target-p99-ms", type=float_in(0.0, lo_open=True), default=None,
                   help="p99 target (default: the server's slo.target_p99_ms)")
    s.add_argument("--seed", type=int, default=0, help="seed of the arrivals, prompts and faults (default 0)")
    s.add_argument("--workers", type=int_at_least(1), default=64, help="concurrent requests in flight at most")
    s.add_argument("--timeout", type=duration, default="60s", help="per request")
    add_output_arg(s, "write a report: .html, .pdf (text, then plots) or .json")
    s.add_argument("--json", action="store_true", help="print the report as JSON (without the request history)")
    s.add_argument("--url", help="the server (default: the one in $VNPU_HOME/serve/server.json)")
    s.add_argument("--api-key", help="an admin key (default: $VNPU_API_KEY)")
    s.set_defaults(fn=_cmd)


def _faults(s: str) -> list[str]:
    from runtime.stress.faults import STRESS_FAULTS
    return [] if s.strip().lower() == "none" else choices_list(STRESS_FAULTS, "fault kind")(s)


def _devices(s: str) -> tuple[int, ...]:
    import argparse
    out: list[int] = []
    try:
        for part in s.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                out += range(int(a), int(b) + 1)
            elif part.strip():
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a device list (e.g. 0-3 or 0,2)") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"{s!r} is not a device list (e.g. 0-3 or 0,2)")
    return tuple(dict.fromkeys(out))


def _profile(a):
    """The rate profile; a named preset also sets ``a.faults`` / ``a.every`` unless given (and marks
    ``a.preset_faults``)."""
    from runtime.cliargs import fail, read_text
    from runtime.stress.presets import load
    from runtime.stress.profiles import PROFILES, ProfileError, builtin, from_doc
    a.preset_faults = False
    try:
        if a.profile in PROFILES:
            return builtin(a.profile, a.rate or 10.0, a.duration or 300.0)
        presets = load()
        if a.profile in presets:
            pre = presets[a.profile]
            if a.faults is None and pre.faults:
                a.faults, a.preset_faults = list(pre.faults), True
            a.every = a.every or pre.every_s
            return pre.profile(a.rate, a.duration)
        if a.profile.endswith((".yaml", ".yml")):
            import yaml
            try:
                doc = yaml.safe_load(read_text(a.profile))
            except yaml.YAMLError as e:
                fail(f"argument --profile: {a.profile}: {' '.join(str(e).split())}", "vnpu stress-test")
            return from_doc(doc, a.rate or 10.0, a.duration or 300.0, os.path.basename(a.profile))
        raise ProfileError(f"unknown profile {a.profile!r} (known: {', '.join([*PROFILES, *presets])}, or a "
                           f".yaml file)")
    except (ProfileError, ValueError) as e:
        fail(f"argument --profile: {e}", "vnpu stress-test")


def _cmd(a) -> int:
    from runtime.cliargs import fail
    from runtime.cluster.discovery import state_dir
    from runtime.observe import serverfile
    from runtime.observe.source import HttpSource
    from runtime.stress.run import StressConfig, StressError, run_stress, summary_lines
    prog = "vnpu stress-test"
    if a.output and not a.output.lower().endswith((".html", ".htm", ".pdf", ".json")):
        fail(f"argument --output: {a.output} is not a report file (use .html, .pdf or .json)", prog)
    profile = _profile(a)
    doc = serverfile.read(state_dir())
    url = a.url or (doc or {}).get("url")
    if not url:
        fail("no running server (no $VNPU_HOME/serve/server.json): give --url", prog)
    key = a.api_key or os.environ.get("VNPU_API_KEY") or None
    faults = tuple(a.faults or ())
    a.every = a.every or 30.0
    if faults:
        from runtime.cluster.discovery import read_state
        if os.environ.get("VNPU_BACKEND", "") == "local" or read_state() is None:
            if a.preset_faults:
                print(f"vnpu stress-test: profile {a.profile}: its fault plan ({','.join(faults)}) is skipped: the "
                      f"server runs on no vnpu cluster (load only)", file=sys.stderr)
                faults = ()
        if faults and (os.environ.get("VNPU_BACKEND", "") == "local" or read_state() is None):
            fail("--faults needs the cluster the server runs on (vnpu up, then vnpu serve); in-process devices "
                 "of another process cannot be reached", prog)
    with contextlib.ExitStack() as stack:
        inject, devs = None, ()
        if faults:
            from runtime.cluster import cluster_runtime
            from runtime.stress.faults import DeviceInjector
            rt = stack.enter_context(cluster_runtime())
            inject = DeviceInjector(rt, a.seed)
            n = rt.device_count()
            devs = a.fault_devices or tuple(range(max(1, n - 1)))
            if max(devs) >= n:
                fail(f"argument --fault-devices: the cluster has {n} devices", prog)
        cfg = StressConfig(url=url, api_key=key, profile=profile, model=a.model, faults=faults, every_s=a.every,
                           fault_devices=devs, seed=a.seed, max_tokens=a.max_tokens, timeout_s=a.timeout,
                           workers=a.workers, target_p99_ms=a.target_p99_ms)
        src = HttpSource(url, key) if key else None
        try:
            rep = run_stress(cfg, inject, src, out=(lambda s: print(s, file=sys.stderr, flush=True)))
        except StressError as e:
            fail(str(e), prog)
    lines = summary_lines(rep)
    if a.output:
        if a.output.endswith(".json"):
            with open(a.output, "w") as f:
                json.dump(rep, f, indent=1, default=str)
        else:
            from runtime.stress.report import write_stress
            write_stress(a.output, rep, lines)
    if a.json:
        print(json.dumps({k: v for k, v in rep.items() if k != "history"}, indent=1, default=str))
    else:
        print("\n".join(lines))
        if a.output:
            print(f"report: {a.output}")
    r = rep["requests"]
    return 0 if r["lost"] == 0 and r["duplicated"] == 0 else 1
