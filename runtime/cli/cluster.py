"""``vnpu up`` / ``vnpu down``: the detached local cluster.

Code reaches the devices only as kernel packages the operator installs on the node (``vnpu kernels``) or
names in the config (``metadata: {vnpu: {kernels: [...]}}`` of cluster.yaml, checked here before anything
starts); ``--allow-pickled-kernels`` lets the cluster's admin (never a tenant) upload pickled Python kernels
as well."""
from __future__ import annotations

import sys
from dataclasses import replace

from runtime.cliargs import check_output_dir, fail, int_in, positive_int, text_file


def register(sub) -> None:
    up = sub.add_parser("up", help="start a local cluster of virtual NPUs (detached)",
                        example=("vnpu up --devices 4 --hbm-mb 1024", "vnpu up --config cluster.yaml"))
    up.add_argument("--devices", type=positive_int, default=None, help="virtual NPUs (default 4, or the config's)")
    up.add_argument("--config", type=text_file, help="cluster.yaml: the head node type's NPU resource and labels")
    up.add_argument("--hbm-mb", type=positive_int, default=None, help="emulated HBM per device (MiB)")
    up.add_argument("--allow-pickled-kernels", action="store_true",
                    help="accept pickled Python kernels from the cluster's admin (never from tenants; they run "
                         "code in the device processes). Off by default: install kernel packages instead "
                         "(vnpu kernels install)")
    up.add_argument("--no-shm-fast-path", action="store_true",
                    help="no arena is a /dev/shm segment: isolates processes of one Unix user (copies and "
                         "same-node HCCL go over gRPC)")
    up.add_argument("--device-restarts", type=int_in(-1, 1_000_000), default=0, metavar="N",
                    help="Ray restarts a killed device actor up to N times (-1: always), so that a server's "
                         "self-healing restart_device can take it back (default 0: a killed device stays lost)")
    up.set_defaults(fn=_cmd_up)
    down = sub.add_parser("down", help="stop the local cluster and remove everything it created", example="vnpu down")
    down.set_defaults(fn=_cmd_down)


def _cmd_up(a) -> int:
    from devices.errors import AclError
    from runtime.cluster import ClusterSpec, cluster_up, spec_from_yaml
    from runtime.cluster.discovery import state_dir
    check_output_dir(state_dir(), "VNPU_HOME (the cluster's state and token)", "vnpu up")
    try:
        spec = spec_from_yaml(a.config) if a.config else ClusterSpec()
    except AclError as e:
        fail(f"argument --config: {e.detail}", "vnpu up")
    if a.devices:
        spec = replace(spec, devices=a.devices)
    if a.hbm_mb:
        spec = replace(spec, arena_bytes=a.hbm_mb << 20)
    if a.allow_pickled_kernels or a.no_shm_fast_path:
        spec = replace(spec, policy=replace(spec.policy, pickled_kernels=a.allow_pickled_kernels,
                                            shm_fast_path=spec.policy.shm_fast_path and not a.no_shm_fast_path))
    _check_packages(spec.policy.kernels)
    from runtime.cli.console import stderr_console
    from runtime.cli.stages import showing_stages
    from runtime.cluster import running_state
    from runtime.stages import STARTING_DEVICES, stage
    if running_state() is not None:                     # up already: nothing starts (said below)
        st, started = cluster_up(spec, device_restarts=a.device_restarts)
    else:
        with showing_stages("vnpu up", stderr_console()):
            with stage(STARTING_DEVICES, f"Ray head and {spec.devices} x {spec.chip} device actors"):
                st, started = cluster_up(spec, device_restarts=a.device_restarts)
    if not started:
        asked = {"devices": spec.devices if (a.devices or a.config) else None,            # what the flags asked
                 "arena_bytes": spec.arena_bytes if (a.hbm_mb or a.config) else None,
                 "chip": spec.chip if a.config else None,
                 "device_restarts": a.device_restarts if a.device_restarts else None,
                 "pickled_kernels": True if a.allow_pickled_kernels else None}
        if any(v is not None and st.get(k) != v for k, v in asked.items()):
            print(f"vnpu up: error: a cluster of {st['devices']} devices ({st['arena_bytes'] >> 20} MiB HBM each, "
                  f"{st['chip']}, device restarts {st.get('device_restarts', 0)}) is already up at {st['ray_address']}; run `vnpu down` first", file=sys.stderr)
            return 2
        print(f"vnpu cluster is already up at {st['ray_address']} ({st['devices']} devices)")
        return 0
    restarts = {0: "", -1: ", device actors restarted by Ray"}.get(a.device_restarts,
                                                                   f", device actors restarted up to {a.device_restarts}x")
    print(f"vnpu cluster up: Ray at {st['ray_address']}, {st['devices']} x {st['chip']}{restarts}")
    for w in st["where"]:
        print(f"  npu{w['device_id']}: {w['address']}  pid {w['pid']}  arena /dev/shm/{w['arena']} "
              f"({w['arena_bytes'] >> 20} MiB)")
    return 0


def _check_packages(paths) -> None:
    """Every kernel package the config names loads (exit 2, one line, before anything starts)."""
    from pathlib import Path

    from devices.kernel_packages import load_all
    for p in paths:
        if not Path(p).exists():
            fail(f"argument --config: kernel package {p}: no such file or directory", "vnpu up")
    _, errors = load_all(paths)
    if errors:
        fail(f"argument --config: {next(iter(errors.values()))}", "vnpu up")


def _cmd_down(a) -> int:
    import time

    from runtime.cluster import cluster_down
    t0 = time.perf_counter()
    stopped = cluster_down()
    print(f"vnpu cluster stopped in {time.perf_counter() - t0:.2f} s" if stopped else "no vnpu cluster is up")
    return 0
