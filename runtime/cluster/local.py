"""Cluster lifecycle: the detached local cluster of ``vnpu up``/``down`` and the embedded one that other
commands and tests start for their own run (state and discovery: :mod:`runtime.cluster.discovery`).

Ray runs with its temp dir under ``/tmp/vnpu-ray-*`` and binds to 127.0.0.1 (every Ray process, not only
the device servers: see :mod:`runtime.cluster.head`), starts no Ray client server and no dashboard UI;
``down`` / ``close`` stop every process that names the temp dir (:mod:`runtime.cluster.procs`) and remove
the segments, so nothing the cluster started is left.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from driver.host import ACTOR_PREFIX, BLAS_ENV, NAMESPACE, actor_name, remote_class
from driver.policy import DevicePolicy
from devices import segments
from devices.errors import ACL_ERROR_RT_DEV_SETUP_ERROR, ACL_ERROR_RT_NO_DEVICE, AclError, InvalidParamError

from . import priority, procs
from . import rayenv
from .discovery import (LOOPBACK, attach_ray, discover, kernel_dir, load_token, new_token,  # noqa: F401
                        read_state, revocations_file, state_dir, state_file, token_file)
from .remote import RemoteBackend

# (Ray's environment -- token auth, loopback -- is rayenv.prepare()'s, before every import of ray.)
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
    #: where the device actors go (:data:`runtime.cluster.actor_placement.PLACEMENTS`): "any" = ``devices``
    #: actors wherever Ray puts them; "per-node" = on every Ray node, as many as its ``NPU`` resource,
    #: pinned to it, chip and HBM from its labels (multi-node clusters)
    placement: str = "any"
    #: what the device servers allow: kernel packages, pickled kernels (the admin's), the same-node
    #: shared-memory fast path, per-tenant quotas (driver.policy); the revocation list and the kernel package
    #: directory of the cluster's state are added when devices start (node_policy)
    policy: DevicePolicy = DevicePolicy()
    #: niceness of the device processes (:mod:`runtime.cluster.priority`): None = ``$VNPU_DEVICE_NICENESS``
    #: or 0, not Ray's worker niceness 15
    device_niceness: int | None = None


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
    """Read the head node type's virtual NPUs (``resources.NPU``) and labels from a cluster.yaml, and the
    kernel packages every device loads (``metadata: {vnpu: {kernels: [FILE or DIR, ...]}}``, relative to the
    file; Ray leaves ``metadata`` to its users) and the devices' niceness (``metadata: {vnpu:
    {device_niceness: N}}``, :mod:`runtime.cluster.priority`)."""
    import yaml
    try:
        cfg = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        head = cfg["available_node_types"][cfg["head_node_type"]]
        labels = head.get("labels", {}) or {}
        n = int(head.get("resources", {}).get("NPU", 0))
        arena = int(labels.get("vnpu.hbm-bytes", 1 << 30))
        chip = str(labels.get("vnpu.chip", "Ascend910B3"))
        meta = (cfg.get("metadata") or {}).get("vnpu") or {}
        kernels = meta.get("kernels") or []
        nice = meta.get("device_niceness")
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InvalidParamError(f"{path}: cannot read a cluster.yaml: {' '.join(str(e).split())}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InvalidParamError(f"{path}: not a Ray cluster.yaml with a head node type "
                                f"(available_node_types / head_node_type): {type(e).__name__} {e}") from None
    if n <= 0:
        raise InvalidParamError(f"{path}: head node type declares no NPU resource")
    if arena <= 0:
        raise InvalidParamError(f"{path}: vnpu.hbm-bytes must be positive, got {arena}")
    if not isinstance(kernels, list) or not all(isinstance(k, str) and k for k in kernels):
        raise InvalidParamError(f"{path}: metadata.vnpu.kernels must be a list of kernel package paths")
    if nice is not None:
        nice = priority.check(nice, f"{path}: metadata.vnpu.device_niceness")
    base = Path(path).resolve().parent
    kernels = tuple(str(base / Path(k).expanduser()) for k in kernels)
    return ClusterSpec(devices=n, chip=chip, arena_bytes=arena, policy=DevicePolicy(kernels=kernels),
                       device_niceness=nice)


def node_policy(policy: DevicePolicy) -> DevicePolicy:
    """``policy`` as the devices started from this node get it: the cluster state's revocation list (unless
    it names one) and the node's kernel package directory after the packages it names."""
    if not policy.revocations:
        policy = replace(policy, revocations=str(revocations_file()))
    installed = str(kernel_dir())
    if installed not in policy.kernels:
        policy = replace(policy, kernels=tuple(policy.kernels) + (installed,))
    return policy


# ------------------------------------------------------------------------------------------ Ray plumbing
def start_devices(spec: ClusterSpec, token: str, *, detached: bool, first_id: int = 0,
                  max_restarts: int = 0, timeout_s: float = 120.0,
                  node_filter: str | None = None) -> tuple[list[dict], list]:
    """Start one device actor per virtual NPU, placed as ``spec.placement`` says (``node_filter``: on that
    Ray node only), all at once, and wait until each serves gRPC.  Returns where they are and their
    handles (a non-detached actor lives only as long as its handle)."""
    rayenv.prepare()
    import ray

    from . import bytecode
    from .actor_placement import slots_for
    bytecode.warm()          # once here rather than in every device process (see runtime.cluster.bytecode)
    cls = remote_class(max_restarts=max_restarts)
    # no runtime_env unless a device needs its own environment (a simulated node identity): a worker with a
    # runtime_env waits for Ray's runtime-env agent and cannot be a prestarted one, which doubles the start
    # time of a few dozen actors on a small machine; the host pins BLAS to one thread itself (before numpy)
    opts = {"namespace": NAMESPACE}
    if detached:
        opts["lifetime"] = "detached"
    host = None if spec.bind == "node" else spec.bind
    policy = node_policy(spec.policy)
    nice = priority.resolve(spec.device_niceness)

    def options(slot) -> dict:
        o = dict(opts, **slot.options)
        if spec.nodes > 1:
            o["runtime_env"] = {"env_vars": dict(BLAS_ENV, VNPU_NODE_ID=f"sim-node-{slot.device_id % spec.nodes}")}
        return o
    actors = [cls.options(name=actor_name(s.device_id), **options(s)).remote(s.device_id, token, s.arena_bytes,
                                                                              s.chip, host, spec.cores, policy,
                                                                              niceness=nice)
              for s in slots_for(spec, first_id, node_filter)]
    return ray.get([a.where.remote() for a in actors], timeout=timeout_s), actors


def stop_devices(timeout: float = 30.0, actors: list | None = None) -> list[str]:
    """Shut device actors down (server and arena), then kill them; returns their arena names.  ``actors``:
    these handles only (what a :class:`LocalCluster` started); None: every device actor of the Ray this
    process is connected to (for the owner of that Ray only: ``vnpu down``'s head, a chaos campaign)."""
    rayenv.prepare()
    import ray
    arenas = []
    if actors is None:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a.get("namespace") == NAMESPACE and a["name"].startswith(ACTOR_PREFIX)]
        handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
    else:
        handles = list(actors)
    # each actor on its own: a dead one (its node killed) must not keep the live ones from closing their
    # servers and unlinking their arenas (killed at once, they would leave their segments behind)
    arenas = [w["arena"] for w in _each(ray, [h.where.remote() for h in handles], timeout) if w]
    _each(ray, [h.shutdown.remote() for h in handles], timeout)
    for h in handles:
        with contextlib.suppress(Exception):
            ray.kill(h, no_restart=True)
    return arenas


def _each(ray, refs: list, timeout: float) -> list:
    """The result of each of ``refs`` (None for one that failed or was not done within ``timeout``,
    shared by all)."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
    done = set(ready)
    out = []
    for r in refs:
        try:
            out.append(ray.get(r, timeout=0) if r in done else None)
        except Exception:  # noqa: BLE001 - a dead or failing actor: the others go on
            out.append(None)
    return out


def owned_segments(pids) -> list[str]:
    """This user's segments whose owner is one of ``pids``."""
    pids = set(pids)
    return [n for n in segments.list_segments(os.getuid()) if (segments.owner(n) or (0, None))[0] in pids]


def remove_segments(names: list[str] | None = None) -> int:
    """Unlink arena segments: the given names (anonymous arenas have none), or (None) this user's segments
    whose owner process is gone (:func:`devices.segments.sweep`: never a live process's, never another
    user's)."""
    return len(segments.unlink([x for x in names if x]) if names is not None else segments.sweep())


# ------------------------------------------------------------------------------------------ embedded
class LocalCluster:
    """An embedded Ray cluster with ``spec.devices`` device actors, torn down on ``close``.

    It never touches a cluster it did not start: it starts a Ray of its own whatever ``RAY_ADDRESS`` says
    (``address="local"``), and ``close`` stops the device actors it started, no others.  (In a process
    that is already connected to a Ray, it starts its actors there and leaves that Ray running.)"""

    def __init__(self, spec: ClusterSpec = ClusterSpec(), *, max_restarts: int = 0):
        rayenv.prepare()
        import ray
        self.spec = spec
        self.token = secrets.token_urlsafe(32)
        self.temp_dir = tempfile.mkdtemp(prefix="vnpu-ray-", dir="/tmp")
        self._owns_ray = not ray.is_initialized()
        self.where, self.actors = [], []
        #: device processes of this cluster (restarted ones added by whoever meets them): close removes
        #: the segments they own, and no other
        self.device_pids: set[int] = set()
        try:
            if self._owns_ray:
                rayenv.ensure_token()
                # the raylet and so every worker it starts inherit these (a job-level runtime_env would cost
                # every worker a runtime-env round trip, see start_devices); address="local": always a Ray
                # of its own, never one that RAY_ADDRESS names.  Its workers run at the devices' niceness,
                # not Ray's 15 (runtime.cluster.priority)
                env = dict(BLAS_ENV, VNPU_TOKEN=self.token, **priority.raylet_env(priority.resolve(spec.device_niceness)))
                with raylet_env(env):
                    ray.init(address="local", namespace=NAMESPACE, include_dashboard=False,
                             _node_ip_address=LOOPBACK, resources={"NPU": spec.devices}, _temp_dir=self.temp_dir,
                             logging_level="ERROR", log_to_driver=False, configure_logging=True)
            self.where, self.actors = start_devices(spec, self.token, detached=False, max_restarts=max_restarts)
            self.device_pids = {w["pid"] for w in self.where}
        except BaseException:
            self.close()             # a failed start leaves no Ray processes, segments or temp dir
            raise
        os.environ["VNPU_TOKEN"] = self.token

    def backend(self, **kw):
        return RemoteBackend(self.where, self.token, **kw)

    def close(self) -> None:
        rayenv.prepare()
        import ray
        arenas = stop_devices(actors=self.actors) if ray.is_initialized() and self.actors else []
        self.device_pids |= {(segments.owner(a) or (0, None))[0] for a in arenas} - {0}   # restarted ones too
        self.actors = []
        remove_segments(arenas + [w["arena"] for w in self.where])
        remove_segments(owned_segments(self.device_pids))     # of device processes killed meanwhile: this cluster's only
        if os.environ.get("VNPU_TOKEN") == self.token:
            del os.environ["VNPU_TOKEN"]
        if self._owns_ray:
            ray.shutdown()
            procs.stop(procs.cluster_processes(self.temp_dir), grace_s=0.5)   # agents Ray leaves running
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------------------------ detached
#: how long `vnpu up` waits for the head to report its devices serving
UP_TIMEOUT_S = 240.0


def cluster_up(spec: ClusterSpec, device_restarts: int = 0) -> tuple[dict, bool]:
    """Start the detached local cluster (a head process of its own, :mod:`runtime.cluster.head`); returns
    (state, started_now).  A cluster that is already up is returned as it is (started_now False).

    ``device_restarts``: Ray's ``max_restarts`` of the device actors (-1: always).  0 (the default): a
    killed device stays lost for good (failover moves work off it).  N: Ray starts a killed device actor
    again -- the same name, id, chip and HBM size, empty -- and a runtime that saw it lost takes it back
    with ``Runtime.restart_device`` (the self-healing ``restart_device`` action); until then the runtime's
    handle stays lost, so failover behaves as without restarts."""
    st = read_state()
    if st is not None and _ray_alive(st):
        return st, False
    if st is not None:
        cluster_down(quiet=True)
    temp_dir = tempfile.mkdtemp(prefix="vnpu-ray-", dir="/tmp")
    token = new_token()
    rfd, wfd = os.pipe()
    cmd = [sys.executable, "-m", "runtime.cluster.head", f"--temp-dir={temp_dir}", f"--devices={spec.devices}",
           f"--chip={spec.chip}", f"--arena-bytes={spec.arena_bytes}", f"--ready-fd={wfd}",
           f"--device-restarts={int(device_restarts)}",
           f"--device-niceness={priority.resolve(spec.device_niceness)}"]
    if spec.cores:
        cmd.append(f"--cores={spec.cores}")
    cmd += [f"--kernels={k}" for k in spec.policy.kernels]         # the policy travels to the head's devices
    if spec.policy.pickled_kernels:
        cmd.append("--allow-pickled-kernels")
    if not spec.policy.shm_fast_path:
        cmd.append("--no-shm-fast-path")
    env = dict(os.environ, **BLAS_ENV, VNPU_TOKEN=token)     # the head's devices take this cluster's token
    env.pop("RAY_ADDRESS", None)
    log_path = os.path.join(temp_dir, "vnpu-head.log")
    try:
        with open(log_path, "ab") as log:
            head = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(wfd,),
                                    env=env, start_new_session=True, cwd="/")
    finally:
        os.close(wfd)
    try:
        line = _read_line(rfd, UP_TIMEOUT_S)
    finally:
        os.close(rfd)
    if not line:
        procs.stop([head.pid] + procs.cluster_processes(temp_dir))
        head.wait()
        text = ""
        with contextlib.suppress(OSError):              # read before the temp dir (which holds it) goes
            text = Path(log_path).read_text(errors="replace").strip()
        shutil.rmtree(temp_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            token_file().unlink()
        why = [ln for ln in text.splitlines() if ln.startswith("vnpu head:")]   # the head's own line, not Ray's noise
        raise AclError(f"the cluster did not start: {why[-1] if why else text[-2000:] or 'no output'}",
                       code=ACL_ERROR_RT_DEV_SETUP_ERROR)
    ready = json.loads(line)
    st = {"ray_address": ready["ray_address"], "temp_dir": temp_dir, "devices": spec.devices, "chip": spec.chip,
          "arena_bytes": spec.arena_bytes, "device_restarts": int(device_restarts), "started": time.time(),
          "pickled_kernels": spec.policy.pickled_kernels,
          "head_pid": ready["head_pid"],
          "head_start": ready["head_start"], "where": ready["where"]}
    state_file().write_text(json.dumps(st, indent=1))
    return st, True


def _read_line(fd: int, timeout_s: float) -> str:
    """One line from pipe ``fd`` within ``timeout_s`` ("" on EOF or timeout)."""
    import select
    buf = b""
    end = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            return ""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return ""
        buf += chunk
    return buf.decode()


def cluster_down(quiet: bool = False) -> bool:
    """Stop the detached cluster: its head (which shuts the devices and Ray down), then anything of the
    cluster still running; remove its segments, state, token and Ray's temp dir."""
    st = read_state()
    if st is None:
        return False
    temp_dir = st.get("temp_dir", "")
    arenas = [w["arena"] for w in st.get("where", [])]
    head = st.get("head_pid")
    if head and segments.owner_alive(head, st.get("head_start")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(head, signal.SIGTERM)             # the head stops the devices, then Ray
        procs.wait_gone([head], 30.0)
    procs.stop(procs.cluster_processes(temp_dir), grace_s=0.5)   # workers and agents (they ignore SIGTERM)
    remove_segments(arenas)
    remove_segments(owned_segments(w["pid"] for w in st.get("where", [])))   # this cluster's only
    if temp_dir.startswith("/tmp/vnpu-ray-"):
        shutil.rmtree(temp_dir, ignore_errors=True)
    for f in (state_file(), token_file()):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    return True


def _ray_alive(st: dict) -> bool:
    host, port = st["ray_address"].rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) == 0


def running_state() -> dict | None:
    """The state (``cluster.json``) of the local cluster that is up, None when none is: no state, or its Ray
    does not answer on its address (one TCP connect, at most 1 s; nothing of Ray is imported)."""
    st = read_state()
    return st if st is not None and _ray_alive(st) else None


@contextlib.contextmanager
def cluster_runtime(devices: int | None = None, spec: ClusterSpec | None = None, device_restarts: int = 0):
    """A runtime over the running cluster, or over an embedded one started (and stopped) for this run
    (``device_restarts``: its device actors' ``max_restarts``, see :func:`cluster_up`; the running cluster
    keeps what ``vnpu up`` gave it)."""
    from runtime.api import Runtime, runtime_scope
    emb = None
    if running_state() is not None:
        backend = RemoteBackend.connect()
    else:
        spec = spec or ClusterSpec(devices=devices or 4)
        emb = LocalCluster(spec, max_restarts=device_restarts)
        backend = emb.backend()
    try:
        with runtime_scope(Runtime(backend)) as rt:
            yield rt
    finally:
        if emb is not None:
            emb.close()
        else:
            rayenv.prepare()
            import ray
            with contextlib.suppress(Exception):
                ray.shutdown()
