"""Node faults of a chaos campaign: what happens to a whole node of a multi-node cluster.

Device faults (``kill``, ``hang``, ``ecc``, ...) are the device's own table, :data:`devices.faults.FAULT_KINDS`,
injected through a device.  A node fault is done to the cluster instead, so it has its own small table,
:data:`NODE_FAULTS` (name -> :class:`NodeFault`), which ``vnpu chaos`` accepts next to the device kinds on
a multi-node cluster (:class:`~runtime.cluster.multinode.MultiNodeCluster`) and refuses elsewhere:

- ``node-kill``: a worker node that hosts devices in service dies at once (its raylet and every process
  on it SIGKILLed): all its devices are lost together.  The failover pool detects each one (its health
  stream breaks) and moves its logical id to a spare on a surviving node (or the CPU fallback).  A
  replacement node with the same devices then joins (as a cloud instance group replaces a lost machine),
  and the pool takes the new device actors back as spares.  A node running bound devices first; never
  one whose loss leaves nothing to run on (no healthy device elsewhere and no CPU fallback), never the
  head (the cluster's GCS).

:class:`NodeChaos` injects them and waits for the replacements; :func:`node_outcome` reads detection
(per device: the last of the node's devices to be detected) and recovery (the requests that failed on
any of them, completed elsewhere) from the pool's events and the runner's history.
"""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class NodeFault:
    name: str
    doc: str
    #: ``inject(chaos, pool, rng) -> record`` (None: no node may take this fault now)
    inject: Callable[["NodeChaos", object, random.Random], dict | None]


def _node_kill(chaos: "NodeChaos", pool, rng: random.Random) -> dict | None:
    cluster = chaos.cluster
    healthy = set(pool.healthy_physical())
    bound = {b.physical for b in list(pool.bindings.values()) if not b.is_cpu}
    nodes = [n for n in cluster.alive_nodes() if not n.head]
    # a node with devices in service (bound or spare), whose loss leaves the job something to run on:
    # healthy devices elsewhere, or the CPU fallback (devices the pool took out for a while, e.g. slow
    # ones, come back); nodes running bound devices first
    cands = [n for n in nodes if healthy & set(n.devices) and (healthy - set(n.devices) or pool.opts.cpu_fallback)]
    cands = [n for n in cands if bound & set(n.devices)] or cands
    if not cands:
        return None
    node = rng.choice(sorted(cands, key=lambda n: min(n.devices)))
    pids = {d: pool.phys[d].where.get("pid", 0) for d in node.devices if d in pool.phys}
    # devices in service (bound or spare) when the node dies: the pool must detect each of them (one that
    # it had already taken out, e.g. quarantined, is found gone by its recovery instead)
    in_service = sorted(d for d in node.devices if d in healthy)
    t = time.monotonic()
    lost = cluster.kill_node(node.node_id)
    rec = {"kind": "node-kill", "device": min(lost), "devices": sorted(lost), "in_service": in_service,
           "bound": sorted(bound & set(lost)), "node": node.node_id[:12], "t": t,
           "params": {"node": node.node_id, "pids": sorted(pids.values())}}
    if chaos.replace:
        chaos.replace_later(node.spec, min(lost))
    return rec


NODE_FAULTS: dict[str, NodeFault] = {f.name: f for f in (
    NodeFault("node-kill", "a worker node dies (raylet and all its processes SIGKILLed): its devices are lost "
                           "at once; a replacement node with the same devices joins", _node_kill),
)}


class NodeChaos:
    """Node faults against one multi-node cluster; ``replace``: a killed node is replaced (same devices)."""

    def __init__(self, cluster, replace: bool = True):
        self.cluster = cluster
        self.replace = replace
        self.replaced: list[dict] = []            #: {"node", "devices", "joined_after_s"} per replacement
        self._threads: list[threading.Thread] = []

    def inject(self, kind: str, pool, rng: random.Random) -> dict | None:
        return NODE_FAULTS[kind].inject(self, pool, rng)

    def replace_later(self, spec, first_id: int) -> None:
        t0 = time.monotonic()

        def join():
            try:
                node = self.cluster.add_node(spec, first_id=first_id)
                self.replaced.append({"node": node.node_id[:12], "devices": sorted(node.devices),
                                      "joined_after_s": time.monotonic() - t0})
            except Exception as e:  # noqa: BLE001 - a replacement that cannot start is reported, not raised
                self.replaced.append({"error": f"{type(e).__name__}: {e}"[:300]})
        th = threading.Thread(target=join, name="vnpu-node-replace", daemon=True)
        self._threads.append(th)
        th.start()

    def join(self, timeout_s: float = 120.0) -> bool:
        """Wait (bounded) for the replacements under way."""
        end = time.monotonic() + timeout_s
        for th in self._threads:
            th.join(max(0.0, end - time.monotonic()))
        return not any(th.is_alive() for th in self._threads)


def node_outcome(f: dict, pool, runner, t_next: float, t_hist: float = 0.0) -> dict:
    """Detection and recovery of node fault ``f``: detection per device of the node that was in service
    (``detected_per_device_s``; ``detected_after_s``: the last of them), recovery of the requests that
    failed on any of its devices (from the runner's history, whose times count from ``t_hist``)."""
    t0, lost = f["t"], set(f["devices"])
    watched = set(f.get("in_service", f["devices"]))
    events = list(pool.events)
    det = {}
    for e in events:
        if e["kind"] == "detected" and e["physical"] in lost and t0 <= e["t"] < t_next and e["physical"] not in det:
            det[e["physical"]] = e
    per_device = {d: (det[d]["t"] - t0 if d in det else None) for d in sorted(watched)}
    detected_after = max(per_device.values()) if per_device and all(v is not None for v in per_device.values()) \
        else None
    history = [dict(h, t=h["t"] + t_hist) for h in runner.history.events()]
    failed = {h["id"] for h in history if h["op"] == "attempt-failed" and h.get("physical") in lost
              and t0 <= h["t"] < t_next}
    done_t = {h["id"]: h["t"] for h in history if h["op"] == "complete" and h["id"] in failed}
    recovered_after = None
    if failed and len(done_t) == len(failed):
        recovered_after = max(done_t.values()) - t0
    elif not failed:
        rebound = [e["t"] for e in events if e["kind"] == "bound" and e.get("previous") in lost
                   and t0 <= e["t"] < t_next]
        if rebound:
            recovered_after = max(rebound) - t0
    causes = sorted({e["cause"] for e in det.values()})
    return dict(f, detected_after_s=detected_after, detected_per_device_s=per_device,
                cause=",".join(causes) or None, requests_replayed=len(failed), recovered_after_s=recovered_after)


__all__ = ["NODE_FAULTS", "NodeFault", "NodeChaos", "node_outcome"]
