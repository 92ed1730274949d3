"""The cluster backend: devices are Ray actors; the runtime reaches them with the driver's gRPC clients.

Discovery goes through Ray (named actors ``npu<id>`` in the ``vnpu`` namespace); after that every call is
gRPC straight to the device actor (Ray is not on the data path).  The backend presents one credential to
every device (:func:`runtime.cluster.discovery.load_token`: a tenant credential when given one, else the
cluster token) and holds a lease on each (opened before the first call returns), so that everything it
creates is released if the process dies.
"""
from __future__ import annotations

import os
import uuid

from driver.host import ACTOR_PREFIX, NAMESPACE
from devices.errors import InvalidDeviceError, error_for_code
from driver.client import RemoteDevice
from driver.node import in_ray_worker, ray_node_id
from runtime.backend import register_backend

from . import rayenv
from .discovery import attach_ray, discover, load_token


#: heartbeat period of the runtime's lease watches (beats only keep the stream observably alive)
LEASE_BEAT_MS = 2000


class RemoteBackend:
    name = "cluster"

    def __init__(self, where: list[dict], token: str, *, client_id: str | None = None,
                 on_close=None, timeout_s: float = 30.0, same_node: bool | None = None):
        """``same_node``: None = each client decides by node identity (the same-node fast path for host
        copies, see driver.client); True / False force it."""
        self.client_id = client_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.token = token
        self._timeout_s, self._same_node = timeout_s, same_node
        self.where = {w["device_id"]: w for w in where}
        self._on_close = on_close
        self._devices: dict[int, RemoteDevice] = {}
        try:
            for dev_id in sorted(self.where):
                w = self.where[dev_id]
                d = self._devices[dev_id] = RemoteDevice(w["address"], token, dev_id, client_id=self.client_id,
                                                         timeout_s=timeout_s, same_node=same_node)
                # this client's lease on the device (what it leaves behind is released if it dies; nothing
                # can be created without it), and a broken stream tells blocked calls at once that the
                # device is gone
                d.open_lease(LEASE_BEAT_MS)
        except BaseException:
            self.close()                 # a refused credential: no half-open backend
            raise

    @classmethod
    def connect(cls, **kw) -> "RemoteBackend":
        """Attach to the running vnpu cluster (``vnpu up``), or to the devices of the Ray cluster this
        process already belongs to.  A driver sees every device of the cluster; a Ray task or actor sees
        the devices of its own Ray node (as a process on an Ascend server sees that server's NPUs), in
        device-id order, so that Ray's ``ASCEND_RT_VISIBLE_DEVICES`` (its numbering of the node's ``NPU``
        resource) picks among them."""
        attach_ray()
        return cls(node_view(discover()), load_token(), **kw)

    def device_ids(self) -> list[int]:
        return sorted(self._devices)

    def device(self, physical_id: int) -> RemoteDevice:
        d = self._devices.get(physical_id)
        if d is None:
            raise InvalidDeviceError(f"no device {physical_id} in the cluster")
        return d

    def restart(self, physical_id: int, timeout_s: float = 120.0) -> RemoteDevice:
        """Bring device ``physical_id`` back: wait for its actor (Ray restarts a killed one when the cluster
        was started with ``max_restarts``), connect to where it is now, take a lease, and reset it (aborting
        what hangs, dropping old allocations and faults).  UnsupportedError when Ray will not restart it."""
        rayenv.prepare()
        import ray

        from devices.errors import UnsupportedError
        from driver.host import actor_name
        if physical_id not in self._devices:
            raise InvalidDeviceError(f"no device {physical_id} in the cluster")
        import threading
        import time
        deadline = time.monotonic() + timeout_s
        while True:                                  # while Ray restarts the actor, calls are "unavailable"
            try:
                actor = ray.get_actor(actor_name(physical_id), namespace=NAMESPACE)
                w = ray.get(actor.where.remote(), timeout=max(0.1, deadline - time.monotonic()))
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() >= deadline:
                    raise UnsupportedError(f"device actor {actor_name(physical_id)} did not come back within "
                                           f"{timeout_s:g} s") from None
                threading.Event().wait(0.2)          # poll the restart (an external process), bounded
            except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                raise UnsupportedError(f"device actor {actor_name(physical_id)} is gone and Ray does not restart "
                                       f"it (start the cluster with `vnpu up --device-restarts N`): "
                                       f"{type(e).__name__}") from None
        old = self._devices[physical_id]
        try:
            old.close()
        except Exception:  # noqa: BLE001 - the old channel may point at a dead process
            pass
        d = RemoteDevice(w["address"], self.token, physical_id, client_id=self.client_id, timeout_s=self._timeout_s,
                         same_node=self._same_node)
        d.open_lease(LEASE_BEAT_MS)
        d.reset()
        self._devices[physical_id] = d
        self.where[physical_id] = w
        return d

    def close(self) -> None:
        for d in self._devices.values():
            try:
                d.close()
            except Exception:  # noqa: BLE001 - closing a dead device's channel must not stop the rest
                pass
        if self._on_close is not None:
            self._on_close()


def node_view(where: list[dict]) -> list[dict]:
    """The devices this process sees: all of them, or, inside a Ray worker, those hosted on its Ray node
    (device actors that publish no Ray node are seen everywhere)."""
    if not in_ray_worker():
        return where
    me = ray_node_id()
    return [w for w in where if not w.get("ray_node") or w["ray_node"] == me]


# VNPU_BACKEND=cluster (runtime.api.get_runtime): this module is the cluster backend's provider
register_backend("cluster", RemoteBackend.connect)

__all__ = ["RemoteBackend", "node_view", "ACTOR_PREFIX", "NAMESPACE", "error_for_code"]
