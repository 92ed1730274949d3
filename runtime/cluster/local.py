"""Cluster lifecycle: the detached local cluster of ``vnpu up``/``down`` and the embedded one that other
commands and tests start for their own run (state and discovery: :mod:`runtime.cluster.discovery`).

Ray runs with its temp dir under ``/tmp/vnpu-ray-*`` and binds
to 127.0.0.1, so ``down`` can remove everything it started.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from driver.host import ACTOR_PREFIX, BLAS_ENV, NAMESPACE, actor_name, remote_class
from devices.arena import SHM_DIR
from devices.errors import ACL_ERROR_RT_DEV_SETUP_ERROR, ACL_ERROR_RT_NO_DEVICE, AclError, InvalidParamError

from .discovery import (LOOPBACK, attach_ray, discover, load_token, new_token, read_state,  # noqa: F401
                        state_dir, state_file, token_file)
from .remote import RemoteBackend

# (RAY_AUTH_MODE=token is set in runtime/__init__.py, before anything imports ray.)
# Ray probes for a real `acl` module when a node declares the NPU resource and logs a traceback when
# there is none (harmless: the virtual NPUs are ours).
import logging  # noqa: E402
logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class ClusterSpec:
    """What a node type declares: its virtual NPUs and their chip."""
    devices: int = 4
    chip: str = "Ascend910B3"
    arena_bytes: int = 1 << 30
    cores: int | None = None
    #: where device servers bind: loopback for one machine; "node" = the Ray node's own address
    #: (multi-node clusters: set VNPU_BIND=node)
    bind: str = os.environ.get("VNPU_BIND", LOOPBACK)
    #: > 1: give device i the node identity ``sim-node-<i % nodes>`` so that collectives between them use
    #: the cross-node (gRPC) transport although they share this machine (tests, demos)
    nodes: int = 1
    #: where the device actors go (:data:`runtime.cluster.placement.PLACEMENTS`): "any" = ``devices``
    #: actors wherever Ray puts them; "per-node" = on every Ray node, as many as its ``NPU`` resource,
    #: pinned to it, chip and HBM from its labels (multi-node clusters)
    placement: str = "any"


@contextlib.contextmanager
def raylet_env(env: dict):
    """Environment variables for the Ray processes started inside the block (the raylet passes its
    environment on to the workers it starts); this process's environment is restored afterwards."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def spec_from_yaml(path: str | os.PathLike) -> ClusterSpec:
    """Read the head node type's virtual NPUs (``resources.NPU``) and labels from a cluster.yaml."""
    import yaml
    cfg = yaml.safe_load(Path(path).read_text())
    head = cfg["available_node_types"][cfg["head_node_type"]]
    labels = head.get("labels", {}) or {}
    n = int(head.get("resources", {}).get("NPU", 0))
    if n <= 0:
        raise InvalidParamError(f"{path}: head node type declares no NPU resource")
    return ClusterSpec(devices=n, chip=labels.get("vnpu.chip", "Ascend910B3"),
                       arena_bytes=int(labels.get("vnpu.hbm-bytes", 1 << 30)))


# ------------------------------------------------------------------------------------------ Ray plumbing
def start_devices(spec: ClusterSpec, token: str, *, detached: bool, first_id: int = 0,
                  max_restarts: int = 0, timeout_s: float = 120.0,
                  node_filter: str | None = None) -> tuple[list[dict], list]:
    """Start one device actor per virtual NPU, placed as ``spec.placement`` says (``node_filter``: on that
    Ray node only), all at once, and wait until each serves gRPC.  Returns where they are and their
    handles (a non-detached actor lives only as long as its handle)."""
    import ray

    from .placement import slots_for
    cls = remote_class(max_restarts=max_restarts)
    # no runtime_env unless a device needs its own environment (a simulated node identity): a worker with a
    # runtime_env waits for Ray's runtime-env agent and cannot be a prestarted one, which doubles the start
    # time of a few dozen actors on a small machine; the host pins BLAS to one thread itself (before numpy)
    opts = {"namespace": NAMESPACE}
    if detached:
        opts["lifetime"] = "detached"
    host = None if spec.bind == "node" else spec.bind

    def options(slot) -> dict:
        o = dict(opts, **slot.options)
        if spec.nodes > 1:
            o["runtime_env"] = {"env_vars": dict(BLAS_ENV, VNPU_NODE_ID=f"sim-node-{slot.device_id % spec.nodes}")}
        return o
    actors = [cls.options(name=actor_name(s.device_id), **options(s)).remote(s.device_id, token, s.arena_bytes,
                                                                              s.chip, host, spec.cores)
              for s in slots_for(spec, first_id, node_filter)]
    return ray.get([a.where.remote() for a in actors], timeout=timeout_s), actors


def stop_devices(timeout: float = 30.0) -> list[str]:
    """Shut every device actor down (its server and arena), then kill it.  Returns the arena names."""
    import ray
    arenas = []
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX)]
    handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
    try:
        arenas = [w["arena"] for w in ray.get([h.where.remote() for h in handles], timeout=timeout)]
        ray.get([h.shutdown.remote() for h in handles], timeout=timeout)
    except Exception:  # noqa: BLE001 - a dead actor must not stop the teardown of the others
        pass
    for h in handles:
        with contextlib.suppress(Exception):
            ray.kill(h, no_restart=True)
    return arenas


def remove_segments(names: list[str] | None = None) -> int:
    """Unlink arena segments (given names, or every ``vnpu_*`` segment of dead processes)."""
    n = 0
    paths = [os.path.join(SHM_DIR, x) for x in names] if names is not None else glob.glob(
        os.path.join(SHM_DIR, "vnpu_*"))
    for p in paths:
        if names is None:
            pid = os.path.basename(p).split("_")[1]
            if pid.isdigit() and _alive(int(pid)):
                continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
            n += 1
    return n


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# ------------------------------------------------------------------------------------------ embedded
class LocalCluster:
    """An embedded Ray cluster with ``spec.devices`` device actors, torn down on ``close``."""

    def __init__(self, spec: ClusterSpec = ClusterSpec(), *, max_restarts: int = 0):
        import ray
        self.spec = spec
        self.token = secrets.token_urlsafe(32)
        self.temp_dir = tempfile.mkdtemp(prefix="vnpu-ray-", dir="/tmp")
        self._owns_ray = not ray.is_initialized()
        self.where, self.actors = [], []
        try:
            if self._owns_ray:
                # the raylet and so every worker it starts inherit these (a job-level runtime_env would cost
                # every worker a runtime-env round trip, see start_devices)
                with raylet_env(dict(BLAS_ENV, VNPU_TOKEN=self.token)):
                    ray.init(namespace=NAMESPACE, include_dashboard=False, _node_ip_address=LOOPBACK,
                             resources={"NPU": spec.devices}, _temp_dir=self.temp_dir, logging_level="ERROR",
                             log_to_driver=False, configure_logging=True)
            self.where, self.actors = start_devices(spec, self.token, detached=False, max_restarts=max_restarts)
        except BaseException:
            self.close()             # a failed start leaves no Ray processes, segments or temp dir
            raise
        os.environ["VNPU_TOKEN"] = self.token

    def backend(self, **kw):
        return RemoteBackend(self.where, self.token, **kw)

    def close(self) -> None:
        import ray
        arenas = stop_devices() if ray.is_initialized() else []
        self.actors = []
        remove_segments(arenas + [w["arena"] for w in self.where])
        remove_segments(None)        # arenas of device processes that were killed and restarted meanwhile
        if os.environ.get("VNPU_TOKEN") == self.token:
            del os.environ["VNPU_TOKEN"]
        if self._owns_ray:
            ray.shutdown()
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------------------------ detached
def cluster_up(spec: ClusterSpec) -> tuple[dict, bool]:
    """Start the detached local cluster; returns (state, started_now)."""
    st = read_state()
    if st is not None and _ray_alive(st):
        return st, False
    if st is not None:
        cluster_down(quiet=True)
    temp_dir = tempfile.mkdtemp(prefix="vnpu-ray-", dir="/tmp")
    port = free_port()
    labels = json.dumps({"vnpu.chip": spec.chip, "vnpu.hbm-bytes": str(spec.arena_bytes)})
    cmd = [_ray_bin(), "start", "--head", f"--node-ip-address={LOOPBACK}", f"--port={port}",
           "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}",
           f"--resources={json.dumps({'NPU': spec.devices})}", f"--labels={labels}"]
    env = dict(os.environ, **BLAS_ENV)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise AclError(f"ray start failed: {r.stderr.strip()[-2000:]}", code=ACL_ERROR_RT_DEV_SETUP_ERROR)
    token = new_token()
    address = f"{LOOPBACK}:{port}"
    st = {"ray_address": address, "temp_dir": temp_dir, "devices": spec.devices, "chip": spec.chip,
          "arena_bytes": spec.arena_bytes, "started": time.time()}
    import ray
    ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False,
             _node_ip_address=LOOPBACK)
    try:
        st["where"], _ = start_devices(spec, token, detached=True)
    finally:
        ray.shutdown()
    state_file().write_text(json.dumps(st, indent=1))
    return st, True


def cluster_down(quiet: bool = False) -> bool:
    """Stop devices and the cluster; remove segments, state, token and Ray's temp dir."""
    st = read_state()
    if st is None:
        return False
    import ray
    arenas = [w["arena"] for w in st.get("where", [])]
    if _ray_alive(st):
        with contextlib.suppress(Exception):
            ray.init(address=st["ray_address"], namespace=NAMESPACE, logging_level="ERROR",
                     log_to_driver=False, _node_ip_address=LOOPBACK)
            arenas += stop_devices()
            ray.shutdown()
    _stop_ray_processes(st.get("temp_dir", ""))
    remove_segments(arenas)
    remove_segments(None)
    shutil.rmtree(st.get("temp_dir", "/nonexistent-vnpu"), ignore_errors=True)
    for f in (state_file(), token_file()):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    return True


def _stop_ray_processes(temp_dir: str, timeout_s: float = 15.0) -> None:
    """Stop the Ray processes of *this* cluster only (they all carry its temp dir on their command
    line); `ray stop` would kill every Ray cluster on the machine."""
    import signal
    if not temp_dir or not temp_dir.startswith("/tmp/vnpu-ray-"):
        return

    def pids() -> list[int]:
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) != os.getpid():
                try:
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        if temp_dir.encode() in f.read():
                            out.append(int(d))
                except OSError:
                    pass
        return out
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + timeout_s
        while pids() and time.monotonic() < deadline:
            _wait_s(0.1)
        if not pids():
            return


def _wait_s(seconds: float) -> None:
    import threading
    threading.Event().wait(seconds)


def _ray_alive(st: dict) -> bool:
    host, port = st["ray_address"].rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) == 0


def _ray_bin() -> str:
    cand = os.path.join(os.path.dirname(sys.executable), "ray")
    return cand if os.path.exists(cand) else "ray"


@contextlib.contextmanager
def cluster_runtime(devices: int | None = None, spec: ClusterSpec | None = None):
    """A runtime over the running cluster, or over an embedded one started (and stopped) for this run."""
    from runtime.api import Runtime, runtime_scope
    emb = None
    if read_state() is not None and _ray_alive(read_state()):
        backend = RemoteBackend.connect()
    else:
        spec = spec or ClusterSpec(devices=devices or 4)
        emb = LocalCluster(spec)
        backend = emb.backend()
    try:
        with runtime_scope(Runtime(backend)) as rt:
            yield rt
    finally:
        if emb is not None:
            emb.close()
        else:
            import ray
            with contextlib.suppress(Exception):
                ray.shutdown()
