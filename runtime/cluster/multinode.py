"""A real multi-node Ray cluster on one machine: one raylet per node, each with its own ``NPU`` resource and
node labels as ``cluster.yaml`` declares them, and the device actors placed on their nodes by Ray.

``MultiNodeCluster(MultiNodeSpec(...))`` starts a head and worker nodes with ``ray.cluster_utils.Cluster``
(separate raylets, object stores and worker pools; one GCS), connects this process to the head as the
driver, and starts the device actors with the ``per-node`` placement (:mod:`.actor_placement`): every node's
devices are pinned to it and bind to the node's own address (``VNPU_BIND=node``).  "Same node" follows
the Ray node id (:mod:`devices.node`), so HCCL between devices of different nodes goes over gRPC and host
copies to a device on another node than the driver's go over gRPC too, exactly as on several machines --
although every raylet here shares this machine's ``/dev/shm`` and boot id.

:meth:`MultiNodeCluster.kill_node` removes a worker node the hard way (its raylet and every process of the
node SIGKILLed: the device actors die with it, for good -- they are pinned to a node that no longer
exists); :meth:`MultiNodeCluster.add_node` joins a new node and starts device actors on it (a replacement
for a lost node can take over the lost devices' ids).  The head cannot be killed (it holds the GCS).

Same surface as :class:`~runtime.cluster.local.LocalCluster` (``where``, ``token``, ``backend()``,
``close()``), so failover pools, job runners and chaos campaigns run on either.  Everything blocks the
calling thread; ``close`` leaves no Ray process, actor, segment or temp dir behind.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from devices import procstat, segments
from devices.errors import InvalidParamError
from driver.host import BLAS_ENV, NAMESPACE

from . import priority, procs
from . import rayenv
from .local import raylet_env
from .actor_placement import CHIP_LABEL, HBM_LABEL
from .remote import RemoteBackend


#: tries to start one worker raylet (each has Ray's fixed 30 s to register with the GCS)
ADD_NODE_ATTEMPTS = 3


@dataclass(frozen=True)
class NodeSpec:
    """One node type: its virtual NPUs (Ray's ``NPU`` resource), their chip and HBM (node labels)."""
    npus: int = 2
    chip: str = "Ascend910B3"
    hbm_bytes: int = 1 << 30
    cpus: int = 1

    def labels(self) -> dict:
        return {CHIP_LABEL: self.chip, HBM_LABEL: str(self.hbm_bytes)}


@dataclass(frozen=True)
class MultiNodeSpec:
    """A head node and worker nodes (the head without NPUs by default: a CPU coordinator, the driver's
    node, as on many clusters)."""
    head: NodeSpec = NodeSpec(npus=0)
    workers: tuple[NodeSpec, ...] = (NodeSpec(), NodeSpec())
    #: where device servers bind: "node" = the node's own address (as on real machines), or an address
    bind: str = "node"
    cores: int | None = None
    object_store_bytes: int = 96 << 20

    @property
    def npus(self) -> int:
        return self.head.npus + sum(w.npus for w in self.workers)


def multinode_from_yaml(path: str | os.PathLike, workers: int = 1, hbm_bytes: int | None = None,
                        head_npus: int | None = None) -> MultiNodeSpec:
    """The head node type and ``workers`` nodes of the worker node type of a cluster.yaml (its
    ``resources.NPU`` and ``labels``); ``hbm_bytes`` / ``head_npus`` override the file (small tests)."""
    import yaml
    try:
        cfg = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InvalidParamError(f"{path}: cannot read a cluster.yaml: {' '.join(str(e).split())}") from None

    def node(t: dict) -> NodeSpec:
        labels = t.get("labels", {}) or {}
        res = t.get("resources", {}) or {}
        return NodeSpec(npus=int(res.get("NPU", 0)), chip=str(labels.get(CHIP_LABEL, "Ascend910B3")),
                        hbm_bytes=int(hbm_bytes or labels.get(HBM_LABEL, 1 << 30)))
    try:
        types = cfg["available_node_types"]
        head_type = cfg["head_node_type"]
        worker_type = next((k for k in types if k != head_type), head_type)
        head, worker = node(types[head_type]), node(types[worker_type])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InvalidParamError(f"{path}: not a Ray cluster.yaml with a head node type "
                                f"(available_node_types / head_node_type): {type(e).__name__} {e}") from None
    if workers < 0 or worker.npus < 0 or head.npus < 0 or worker.hbm_bytes <= 0 or head.hbm_bytes <= 0:
        raise InvalidParamError(f"{path}: NPU counts and vnpu.hbm-bytes must not be negative (HBM above 0)")
    if head_npus is not None:
        head = replace(head, npus=head_npus)
    return MultiNodeSpec(head=head, workers=tuple(worker for _ in range(workers)))


@dataclass
class ClusterNode:
    """One node of the cluster as started here."""
    node_id: str
    spec: NodeSpec
    head: bool
    devices: list[int] = field(default_factory=list)
    raylet: object = None                   #: ray._private.node.Node (the processes of the node)
    alive: bool = True


class MultiNodeCluster:
    """Head + worker raylets on this machine and their device actors (see the module doc)."""

    def __init__(self, spec: MultiNodeSpec = MultiNodeSpec(), *, max_restarts: int = 0):
        rayenv.prepare()
        import ray
        if ray.is_initialized():
            raise InvalidParamError("a multi-node cluster starts its own Ray cluster: this process is already "
                                    "connected to one (ray.shutdown() first)")
        if spec.npus < 1:
            raise InvalidParamError("a multi-node cluster needs at least one node with NPUs")
        from ray.cluster_utils import Cluster
        self.spec = spec
        self.token = secrets.token_urlsafe(32)
        self.temp_dir = tempfile.mkdtemp(prefix="vnpu-ray-", dir="/tmp")
        self.max_restarts = max_restarts
        self.nodes: dict[str, ClusterNode] = {}
        self.where: list[dict] = []
        self.actors: list = []
        #: device processes of this cluster (those of killed nodes and restarted ones too): close removes
        #: the segments they own, and no other
        self.device_pids: set[int] = set()
        self._lock = threading.Lock()
        self._cluster = None
        try:
            rayenv.ensure_token()
            with self._ray_defaults():
                self._cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                                        head_node_args=self._node_args(spec.head, head=True))
                self._register(self._cluster.head_node, spec.head, head=True)
                for w in spec.workers:
                    self._register(self._cluster.add_node(**self._node_args(w)), w, head=False)
            self._cluster.wait_for_nodes()
            ray.init(address=self._cluster.address, namespace=NAMESPACE, logging_level="ERROR",
                     log_to_driver=False, configure_logging=True)
            self._start_devices()
        except BaseException:
            self.close()
            raise
        os.environ["VNPU_TOKEN"] = self.token

    # ------------------------------------------------------------------ nodes
    def _node_args(self, n: NodeSpec, head: bool = False) -> dict:
        # every raylet passes its environment on to its workers (no runtime_env: see local.start_devices)
        args = {"num_cpus": n.cpus, "labels": n.labels(), "temp_dir": self.temp_dir,
                "object_store_memory": self.spec.object_store_bytes,
                "env_vars": dict(BLAS_ENV, VNPU_TOKEN=self.token, **priority.raylet_env(priority.resolve(None)))}
        if n.npus:
            args["resources"] = {"NPU": n.npus}
        if head:
            args["include_dashboard"] = False
            # the GCS declares a node dead after 5 missed 1 s health checks (Ray's default: 5 x 3 s), so
            # that a killed node's actors are marked dead -- and their names free -- in seconds
            args["_system_config"] = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
        return args

    def _ray_defaults(self):
        """Ray's per-machine default temp dir (``$RAY_TMPDIR/ray``, else ``/tmp/ray``) pointed into this
        cluster's temp dir while Ray's cluster helper starts or stops nodes: ``ray.cluster_utils.Cluster``
        records the head's address in ``<default>/ray_current_cluster`` -- it does not create that
        directory (FileNotFoundError on a machine where Ray never ran with its defaults), and where it
        exists it would point the machine's ``ray.init()`` at this private cluster and remove the file at
        shutdown.  The Ray processes started inside inherit the same default (it all goes with the temp
        dir)."""
        os.makedirs(os.path.join(self.temp_dir, "ray"), mode=0o700, exist_ok=True)
        return raylet_env({"RAY_TMPDIR": self.temp_dir})

    def _register(self, raylet, n: NodeSpec, head: bool) -> ClusterNode:
        node = ClusterNode(raylet.node_id, n, head, raylet=raylet)
        self.nodes[node.node_id] = node
        return node

    def _start_devices(self, first_id: int = 0, only: str | None = None) -> list[dict]:
        """Device actors on every node with NPUs that has none yet (``only``: on that node)."""
        from .local import ClusterSpec, start_devices
        spec = ClusterSpec(devices=0, bind=self.spec.bind, cores=self.spec.cores, placement="per-node",
                           arena_bytes=max(n.hbm_bytes for n in [self.spec.head, *self.spec.workers]))
        where, actors = start_devices(spec, self.token, detached=False, first_id=first_id,
                                      max_restarts=self.max_restarts, node_filter=only)
        with self._lock:
            for w in where:
                node = self.nodes.get(w.get("ray_node", ""))
                if node is not None:
                    node.devices.append(w["device_id"])
            self.where = sorted(self.where + where, key=lambda w: w["device_id"])
            self.actors += actors
            self.device_pids |= {w["pid"] for w in where}
        return where

    def node_of(self, device_id: int) -> str:
        """The Ray node id hosting device ``device_id`` (a live node's, when a replacement took the id over)."""
        for n in sorted(self.nodes.values(), key=lambda n: not n.alive):
            if device_id in n.devices:
                return n.node_id
        raise InvalidParamError(f"no device {device_id} in this cluster")

    def alive_nodes(self, with_npus: bool = True) -> list[ClusterNode]:
        with self._lock:
            return [n for n in self.nodes.values() if n.alive and (n.devices or not with_npus)]

    def kill_node(self, node_id: str) -> list[int]:
        """Kill a worker node at once (raylet and all its processes, SIGKILL; no graceful shutdown): every
        device actor on it dies.  Returns the device ids it hosted.  Host-blocking until its processes
        are gone."""
        with self._lock:
            node = self.nodes.get(node_id)
            if node is None or not node.alive:
                raise InvalidParamError(f"no live node {node_id[:12]} in this cluster")
            if node.head:
                raise InvalidParamError("the head node holds the cluster's GCS: it cannot be killed")
            node.alive = False
        # the node's processes all die together (a power loss): its raylet's worker processes -- the
        # device actors -- are SIGKILLed with the raylet, not left to notice its death on their own
        pids = procstat.descendants(_node_pids(node.raylet))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._cluster.remove_node(node.raylet, allow_graceful=False)
        procs.wait_gone(pids, 10.0)
        return list(node.devices)

    def add_node(self, n: NodeSpec, first_id: int | None = None) -> ClusterNode:
        """Join a new worker node and start its device actors (ids from ``first_id``, default: after the
        highest id so far; a replacement may reuse a lost node's ids).  Host-blocking."""
        raylet = self._add_raylet(n)
        with self._lock:
            node = self._register(raylet, n, head=False)
            if first_id is None:
                first_id = 1 + max((w["device_id"] for w in self.where), default=-1)
            # the lost ids a replacement takes over are no longer where they were
            self.where = [w for w in self.where if not first_id <= w["device_id"] < first_id + n.npus]
        _wait_names_free(range(first_id, first_id + n.npus), 90.0)
        self._start_devices(first_id, only=node.node_id)
        return node

    def _add_raylet(self, n: NodeSpec):
        """Start a worker raylet, up to :data:`ADD_NODE_ATTEMPTS` times: Ray gives a new raylet a fixed
        30 s to register with the GCS, which a heavily loaded machine can miss; the processes of an attempt
        that timed out are killed before the next one (they would register later, unknown to us)."""
        for _ in range(ADD_NODE_ATTEMPTS - 1):
            with self._lock:
                known = set().union(*(_node_pids(x.raylet) for x in self.nodes.values()))
            try:
                return self._start_raylet(n)
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
                if "timed out during startup" not in str(e):
                    raise
                mine = set(procs.cluster_processes(self.temp_dir)) & procstat.children(os.getpid())
                stray = procstat.descendants(mine - known)
                for pid in stray:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                procs.wait_gone(stray, 10.0)
        return self._start_raylet(n)

    def _start_raylet(self, n: NodeSpec):
        """One attempt (waits until the raylet is up).  Ray installs its exit hooks (signal handlers)
        only from the main thread; from another thread the node gets an atexit hook of ours instead."""
        if threading.current_thread() is threading.main_thread():
            with self._ray_defaults():
                return self._cluster.add_node(**self._node_args(n))
        with self._lock, self._ray_defaults():
            # Ray's Cluster takes shutdown_at_exit once, for every node, and add_node has no per-node
            # switch (Ray 2.x): the one private attribute we touch, flipped for this node only (the
            # layering test's allow-list names it)
            hooks, self._cluster._shutdown_at_exit = self._cluster._shutdown_at_exit, False
            try:
                raylet = self._cluster.add_node(**self._node_args(n))
            finally:
                self._cluster._shutdown_at_exit = hooks
        atexit.register(_kill_quietly, raylet)
        return raylet

    # ------------------------------------------------------------------ use
    def backend(self, **kw) -> RemoteBackend:
        """A cluster backend over the devices on live nodes (this process is the driver: it sees all)."""
        alive = {d for n in self.alive_nodes() for d in n.devices}
        return RemoteBackend([w for w in self.where if w["device_id"] in alive], self.token, **kw)

    def close(self) -> None:
        rayenv.prepare()
        import ray

        from .local import owned_segments, remove_segments, stop_devices
        arenas = [w["arena"] for w in self.where]
        if ray.is_initialized():
            with contextlib.suppress(Exception):
                arenas += stop_devices(timeout=10.0)
            ray.shutdown()
        self.actors = []
        if self._cluster is not None:
            with contextlib.suppress(Exception), self._ray_defaults():
                self._cluster.shutdown()
            self._cluster = None
        self.device_pids |= {(segments.owner(a) or (0, None))[0] for a in arenas} - {0}   # restarted ones too
        remove_segments(arenas)
        # arenas of device processes that died with their node: this cluster's only
        remove_segments(owned_segments(self.device_pids))
        procs.stop(procs.cluster_processes(self.temp_dir), grace_s=0.5)   # anything of Ray's still running
        if os.environ.get("VNPU_TOKEN") == self.token:
            del os.environ["VNPU_TOKEN"]
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _wait_names_free(ids, timeout_s: float) -> None:
    """Wait until Ray has declared the actors of these device ids dead (their names are free again: the
    GCS notices a killed node within a few health checks).  InvalidParamError after ``timeout_s``."""
    rayenv.prepare()
    import ray

    from driver.host import actor_name
    end = time.monotonic() + timeout_s
    pending = list(ids)
    tick = threading.Event()
    while pending:
        try:
            ray.get_actor(actor_name(pending[0]), namespace=NAMESPACE)
        except ValueError:               # no such (live) actor: the name is free
            pending.pop(0)
            continue
        if time.monotonic() >= end:
            raise InvalidParamError(f"device npu{pending[0]} still exists after {timeout_s:g} s: "
                                    f"its id cannot be reused")
        tick.wait(0.1)


def _kill_quietly(raylet) -> None:
    with contextlib.suppress(Exception):
        if raylet.any_processes_alive():
            raylet.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)


def _node_pids(raylet) -> set[int]:
    """Pids of the processes Ray started for one node (raylet, agents, ...)."""
    out = set()
    for infos in getattr(raylet, "all_processes", {}).values():
        for info in infos:
            proc = getattr(info, "process", None)
            if proc is not None and proc.pid:
                out.add(proc.pid)
    return out


__all__ = ["NodeSpec", "MultiNodeSpec", "MultiNodeCluster", "ClusterNode", "multinode_from_yaml"]
