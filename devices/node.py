"""What "the same node" means: the one definition every layer uses.

Two endpoints are on the same node when their node identities are equal and not empty.  A node identity
is, in this order:

1. ``$VNPU_NODE_ID`` when set: a simulated node (``ClusterSpec(nodes=N)`` gives each device actor one, so
   that one machine can run "several nodes" and exercise the cross-node paths);
2. the Ray node id, for a process that belongs to a Ray cluster (the device host and the runtime pass
   it in: this module imports no Ray);
3. ``boot-<kernel boot id>`` otherwise (a process outside any cluster: the machine, seen from its kernel).

Users: the HCCL engine chooses a peer's transport with it (shared memory on one node, gRPC across nodes);
the driver's client uses it to decide whether a device's HBM arena can be mapped for host copies (the
same-node fast path); failover and the runtime go through the client.  Nothing here blocks.
"""
from __future__ import annotations

import os
import socket

NODE_ENV = "VNPU_NODE_ID"


def boot_id() -> str:
    """The kernel's boot id (same value = same kernel = same ``/dev/shm``); the hostname if unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def node_id(ray_node_id: str | None = None) -> str:
    """This process's node identity (see the module doc); ``ray_node_id``: the Ray node id of the
    process, when it runs in a Ray cluster."""
    simulated = os.environ.get(NODE_ENV)
    if simulated:
        return simulated
    if ray_node_id:
        return ray_node_id
    return f"boot-{boot_id()}"


def same_node(a: str, b: str) -> bool:
    """Whether two node identities name the same node."""
    return bool(a) and a == b


__all__ = ["NODE_ENV", "boot_id", "node_id", "same_node"]
