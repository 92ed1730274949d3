"""The head process of the detached local cluster (``vnpu up``).

``vnpu up`` starts ``python -m runtime.cluster.head`` in a session of its own.  The head starts Ray with
the public ``ray.init`` -- bound to loopback, no dashboard UI, no Ray client server (``ray start --head``
always starts one, on the node's external address) -- starts the device actors (detached, named
``npu<id>``; restartable by Ray with ``--device-restarts``), reports where they are on a pipe that ``vnpu up`` reads, and then holds the Ray session
until SIGTERM/SIGINT.  On that signal it shuts the device actors down (servers closed, arenas unlinked),
calls ``ray.shutdown()`` (which stops the Ray processes it started) and exits; ``vnpu down`` sends the
signal, waits for the head to end, and stops anything of the cluster still running (its temp dir names
it: :mod:`runtime.cluster.procs`).

What Ray starts and cannot be told not to: GCS, raylet, the dashboard's API server (minimal mode, no
UI, on 127.0.0.1), the dashboard agent and the runtime-env agent, and the worker processes.  All of them
bind loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set by :mod:`runtime` for loopback clusters,
keeps Ray's node address 127.0.0.1) and all end with ``vnpu down``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from . import rayenv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.cluster.head")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--chip", required=True)
    p.add_argument("--arena-bytes", type=int, required=True)
    p.add_argument("--cores", type=int, default=None)
    p.add_argument("--device-restarts", type=int, default=0,
                   help="Ray restarts a killed device actor this often (-1: always; 0: a killed device stays lost)")
    p.add_argument("--kernels", action="append", default=[], help="a kernel package (file or directory) to load")
    p.add_argument("--allow-pickled-kernels", action="store_true", help="the admin may upload pickled kernels")
    p.add_argument("--no-shm-fast-path", action="store_true", help="no arena is a /dev/shm segment")
    p.add_argument("--device-niceness", type=int, default=None, help="niceness of the device processes")
    p.add_argument("--ready-fd", type=int, required=True, help="write one JSON line here once the devices serve")
    a = p.parse_args(argv)
    rayenv.ensure_token()
    import ray

    from driver.host import BLAS_ENV, NAMESPACE
    from devices.segments import process_start

    from .discovery import LOOPBACK, load_token
    from driver.policy import DevicePolicy

    from . import priority
    from .local import ClusterSpec, start_devices, stop_devices

    ready = os.fdopen(a.ready_fd, "w")
    policy = DevicePolicy(kernels=tuple(a.kernels), pickled_kernels=a.allow_pickled_kernels,
                          shm_fast_path=not a.no_shm_fast_path)
    spec = ClusterSpec(devices=a.devices, chip=a.chip, arena_bytes=a.arena_bytes, cores=a.cores, bind=LOOPBACK,
                       policy=policy, device_niceness=a.device_niceness)
    # the raylet this process starts passes it on to its workers: devices at their niceness, not Ray's 15
    os.environ.update(priority.raylet_env(priority.resolve(spec.device_niceness)))
    stop = threading.Event()
    try:
        # address="local": a Ray of its own, never one that RAY_ADDRESS or /tmp/ray names
        ctx = ray.init(address="local", namespace=NAMESPACE, include_dashboard=False, _node_ip_address=LOOPBACK,
                       resources={"NPU": spec.devices}, _temp_dir=a.temp_dir, logging_level="ERROR",
                       log_to_driver=False, configure_logging=True,
                       labels={"vnpu.chip": spec.chip, "vnpu.hbm-bytes": str(spec.arena_bytes)},
                       runtime_env={"env_vars": dict(BLAS_ENV)})
        for sig in (signal.SIGTERM, signal.SIGINT):               # after ray.init: it installs its own
            signal.signal(sig, lambda *_: stop.set())
        where, _actors = start_devices(spec, load_token(), detached=True, max_restarts=a.device_restarts)
        ready.write(json.dumps({"ray_address": ctx.address_info["gcs_address"], "where": where,
                                "head_pid": os.getpid(), "head_start": process_start(os.getpid())}) + "\n")
        ready.close()
    except BaseException as e:  # noqa: BLE001 - reported to `vnpu up` through the pipe's EOF and the log
        print(f"vnpu head: start failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if ray.is_initialized():
            stop_devices(timeout=10.0)
            ray.shutdown()
        return 1
    stop.wait()
    stop_devices(timeout=10.0)            # device servers closed, arenas unlinked
    sys.stdout.flush()
    sys.stderr.flush()
    # Ray's processes end with this one: Ray started them to die with their parent (kernel fate
    # sharing), and `vnpu down` stops whatever names the cluster's temp dir after that.
    os._exit(0)

if __name__ == "__main__":
    sys.exit(main())
