"""This process's node identity, as :mod:`devices.node` defines it, fed with the Ray node id when the
process belongs to a Ray cluster (a device actor, or a runtime attached to the cluster).

The device host gives its device this identity (so HCCL chooses transports by it) and the driver's client
compares a device's published identity with it (the same-node fast path).  Host-synchronous, no I/O beyond
reading the boot id.
"""
from __future__ import annotations

import sys

from devices.node import node_id, same_node


def ray_node_id() -> str:
    """The Ray node id of this process ("" outside a Ray cluster; Ray is never imported for this)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return ""
    try:
        if not ray.is_initialized():
            return ""
        return ray.get_runtime_context().get_node_id() or ""
    except Exception:  # noqa: BLE001 - a half-initialized Ray: no cluster identity
        return ""


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (runs tasks or an actor), not a driver or a plain process."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:  # noqa: BLE001 - a half-initialized Ray: not a worker
        return False


def this_node() -> str:
    """This process's node identity (``$VNPU_NODE_ID``, else the Ray node id, else the boot id)."""
    return node_id(ray_node_id())


__all__ = ["this_node", "ray_node_id", "in_ray_worker", "same_node"]
