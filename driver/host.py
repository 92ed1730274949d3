"""The device host: the Ray actor that hosts one virtual NPU and serves its DMS/RMS gRPC services.

The actor is a thin shell: it pins itself to one BLAS thread, builds a :class:`devices.device.Device`,
and starts the driver's device-side gRPC endpoint (``driver.service``, the emulated firmware end of the
driver) on an ephemeral port of the node's own address.  The driver finds it by name in the ``vnpu``
Ray namespace (``npu<physical id>``) and from then on talks to it over gRPC only.

It lives at the driver's edge: ``devices`` is the device model as plain Python (no Ray, gRPC or driver
imports); this module builds one with this node's identity (:mod:`driver.node`), serves it, and installs
HCCL's cross-node transport (:mod:`driver.hccl_grpc`) next to the engine's built-in same-node one.

The cluster's security settings arrive as a :class:`driver.policy.DevicePolicy` (from ``ClusterSpec``):
quotas, whether user kernels are accepted, whether the arena is a shared-memory segment (the same-node
fast path), and the revocation list file to load.  The device's HCCL doorbell messages are sealed with a
key derived from the cluster token, which tenants do not hold.
"""
from __future__ import annotations

import os
import sys
import threading

from devices import procstat

NAMESPACE = "vnpu"
ACTOR_PREFIX = "npu"
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def actor_name(device_id: int) -> str:
    return f"{ACTOR_PREFIX}{device_id}"


class NpuHost:
    """Body of the Ray actor (plain class so that it can also run in-process)."""

    def __init__(self, device_id: int, token: str, arena_bytes: int, chip: str = "Ascend910B3",
                 host: str | None = None, cores: int | None = None, policy=None, niceness: int | None = None):
        """``niceness``: the priority this process runs at (None: leave it).  The cluster starts device
        workers at it already (``runtime.cluster.priority``); in a Ray it did not start, the host sets it
        here before it starts any thread of its own -- raising niceness always works, lowering it only
        with CAP_SYS_NICE (else the process stays where Ray put it; ``where()`` says what it got)."""
        if niceness is not None:
            _set_niceness(niceness)
        for k, v in BLAS_ENV.items():
            os.environ.setdefault(k, v)
        try:
            from threadpoolctl import threadpool_limits  # optional; env above already covers OpenBLAS
            threadpool_limits(1)
        except ImportError:
            pass
        from dataclasses import replace

        from .hccl_grpc import GrpcTransport
        from .node import ray_node_id, this_node
        from .policy import DevicePolicy
        from .service import serve

        from devices.chip import chip_by_name
        from devices.device import Device, DeviceConfig
        from devices.hccl_transport import CROSS_NODE, link_key
        policy = policy or DevicePolicy()
        self.host = host or _node_ip()
        self.ray_node = ray_node_id()            # the Ray node (raylet) this actor runs on ("" outside Ray)
        cfg = replace(DeviceConfig(), device_id=device_id, arena_bytes=arena_bytes, spec=chip_by_name(chip),
                      cores=cores, node=this_node(), quota=policy.quota, shm=policy.shm_fast_path,
                      link_key=link_key(token))
        self.device = Device(cfg)
        self._stopped = threading.Event()
        try:
            self.server = serve(self.device, host=self.host, token=token, on_kill=self._kill, policy=policy)
        except BaseException:
            self.device.close()
            raise
        # peers on other nodes reach this device at its gRPC endpoint
        self.device.hccl.set_transport(CROSS_NODE, GrpcTransport(self.server.address, token,
                                                                 client_id=f"hccl-npu{device_id}"))

    def _kill(self) -> None:
        """Fault ``kill``: the device process dies at once (as SIGKILL would do)."""
        threading.Timer(0.01, lambda: os._exit(137)).start()   # just after the reply leaves

    def where(self) -> dict:
        info = self.device.info()
        return {"device_id": info.device_id, "address": self.server.address, "arena": info.arena_name,
                "arena_bytes": info.hbm_total, "chip": info.chip, "pid": os.getpid(), "host": self.host,
                "node": info.node, "ray_node": self.ray_node, "niceness": procstat.niceness(os.getpid())}

    def ping(self) -> int:
        return os.getpid()

    def shutdown(self) -> bool:
        if not self._stopped.is_set():
            self._stopped.set()
            self.server.stop(0.5)
            self.device.close()                  # closes HCCL's transports too
        return True


def _set_niceness(n: int) -> None:
    """Every thread of this process at niceness ``n`` (niceness is per thread on Linux); a thread it may
    not lower is left as it is (no CAP_SYS_NICE)."""
    for tid, cur in procstat.thread_niceness(os.getpid()).items():
        if cur != n:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, n)
            except OSError:         # EPERM (lowering, unprivileged) or the thread ended meanwhile
                pass


def _node_ip() -> str:
    """The node's address as Ray gives it inside a Ray cluster, else loopback (Ray is never imported for
    this: a host made in a plain process must not be the first to import it)."""
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - a half-initialized Ray: loopback
        pass
    return "127.0.0.1"


def remote_class(max_restarts: int = 0):
    """``NpuHost`` as a Ray actor class (imported lazily so that devices/ works without Ray).  The cluster
    calls it once it has prepared and started Ray (:func:`runtime.cluster.rayenv.prepare`)."""
    import ray
    return ray.remote(num_cpus=0, max_concurrency=4, max_restarts=max_restarts)(NpuHost)
