"""The ``vnpu`` command line.  Each subcommand lives in its own small function; commands that need
devices use the running cluster (``vnpu up``) or start an embedded one for their own run."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from devices.errors import AclError


def _cmd_up(a) -> int:
    from .cluster import ClusterSpec, cluster_up, spec_from_yaml
    spec = spec_from_yaml(a.config) if a.config else ClusterSpec()
    if a.devices:
        spec = replace(spec, devices=a.devices)
    if a.hbm_mb:
        spec = replace(spec, arena_bytes=a.hbm_mb << 20)
    st, started = cluster_up(spec)
    if not started:
        print(f"vnpu cluster is already up at {st['ray_address']} ({st['devices']} devices)")
        return 0
    print(f"vnpu cluster up: Ray at {st['ray_address']}, {st['devices']} x {st['chip']}")
    for w in st["where"]:
        print(f"  npu{w['device_id']}: {w['address']}  pid {w['pid']}  arena /dev/shm/{w['arena']} "
              f"({w['arena_bytes'] >> 20} MiB)")
    return 0


def _cmd_down(a) -> int:
    from .cluster import cluster_down
    print("vnpu cluster stopped" if cluster_down() else "no vnpu cluster is up")
    return 0


def _cmd_smi(a) -> int:
    from .cluster import cluster_runtime
    from .smi import collect, render, to_json
    with cluster_runtime(devices=a.devices) as rt:
        rows = collect(rt)
    print(to_json(rows) if a.json else render(rows))
    return 0


def _cmd_demo(a) -> int:
    from .cluster import cluster_runtime
    from .demo import run_demo
    with cluster_runtime(devices=a.devices) as rt:
        print(f"vnpu: {rt.device_count()} virtual NPUs up ({rt.backend.name} backend)")
        ok = run_demo(rt, max_new_tokens=a.max_new_tokens)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vnpu", description="virtual NPU cluster (CANN-style) on Ray")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a local cluster of virtual NPUs (detached)")
    up.add_argument("--devices", type=int, default=0)
    up.add_argument("--config", help="cluster.yaml: the head node type's NPU resource and labels")
    up.add_argument("--hbm-mb", type=int, default=0, help="emulated HBM per device (MiB)")
    up.set_defaults(fn=_cmd_up)
    down = sub.add_parser("down", help="stop the local cluster and remove everything it created")
    down.set_defaults(fn=_cmd_down)
    smi = sub.add_parser("smi", help="npu-smi-like device table")
    smi.add_argument("--json", action="store_true")
    smi.add_argument("--devices", type=int, default=4, help="devices of the embedded cluster (when none is up)")
    smi.set_defaults(fn=_cmd_smi)
    demo = sub.add_parser("demo", help="the main job: multi-device inference on a local cluster, then smi")
    demo.add_argument("--devices", type=int, default=4)
    demo.add_argument("--max-new-tokens", type=int, default=24)
    demo.set_defaults(fn=_cmd_demo)
    for mod in ("runtime.bench_cli", "runtime.jobs_cli", "runtime.chaos_cli"):
        try:
            __import__(mod, fromlist=["register"]).register(sub)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a) or 0
    except AclError as e:
        print(f"vnpu: error {e.code} {e.name}: {e.detail}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
