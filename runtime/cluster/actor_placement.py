"""Where device actors go: one placement per cluster shape, looked up by name in :data:`PLACEMENTS`.

- ``any``: ``spec.devices`` actors wherever Ray puts them (a one-machine cluster: this node), all with the
  spec's chip and HBM size;
- ``per-node``: every alive Ray node that declares an ``NPU`` resource gets that many device actors, pinned
  to it (a hard node affinity: a device never moves to another node, and it does not come back when its
  node is gone), each with the chip and HBM size its node's labels declare (``vnpu.chip``,
  ``vnpu.hbm-bytes``, as ``cluster.yaml`` writes them; the spec's values where a node has none).  Devices
  are numbered node by node (the head first, then by Ray node id), so one node's devices have consecutive
  ids, and index ``i`` of a Ray task's ``ASCEND_RT_VISIBLE_DEVICES`` (Ray's numbering of the node's
  ``NPU`` resource) is the node's ``i``-th device.

Reads Ray's node table (host-blocking, one GCS call); starts nothing.

Not to be confused with a serving engine's placement (the devices a model runs on,
:mod:`runtime.serve.engine.placement`) or the arena's placement hint (where in HBM a block goes,
``devices.arena.PLACEMENT_*``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import rayenv

#: node labels that declare a node's virtual NPUs (cluster.yaml); Ray's own label of every node's id
CHIP_LABEL = "vnpu.chip"
HBM_LABEL = "vnpu.hbm-bytes"
NODE_ID_LABEL = "ray.io/node-id"
_HEAD_RESOURCE = "node:__internal_head__"


@dataclass(frozen=True)
class NpuNode:
    """One Ray node that declares virtual NPUs."""
    node_id: str
    address: str
    npus: int
    labels: dict = field(default_factory=dict)
    head: bool = False


@dataclass(frozen=True)
class Slot:
    """One device actor to start: its id, chip, HBM size and the Ray options that place it."""
    device_id: int
    chip: str
    arena_bytes: int
    node_id: str = ""                    #: the Ray node it is pinned to ("" = anywhere)
    options: dict = field(default_factory=dict)


def npu_nodes() -> list[NpuNode]:
    """Alive Ray nodes with an ``NPU`` resource: the head first, then by node id."""
    rayenv.prepare()
    import ray
    out = []
    for n in ray.nodes():
        res = n.get("Resources", {}) or {}
        npus = int(res.get("NPU", 0))
        if n.get("Alive") and npus > 0:
            out.append(NpuNode(n["NodeID"], n.get("NodeManagerAddress", ""), npus, dict(n.get("Labels") or {}),
                               _HEAD_RESOURCE in res))
    return sorted(out, key=lambda x: (not x.head, x.node_id))


def pinned(node_id: str) -> dict:
    """Ray options that keep an actor on node ``node_id`` (and nowhere else, ever)."""
    rayenv.prepare()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}


def place_any(spec, first_id: int = 0, only: str | None = None) -> list[Slot]:
    return [Slot(i, spec.chip, spec.arena_bytes) for i in range(first_id, first_id + spec.devices)]


def place_per_node(spec, first_id: int = 0, only: str | None = None) -> list[Slot]:
    """``only``: on that node alone (a node that joined later)."""
    from devices.errors import ACL_ERROR_RT_NO_DEVICE, AclError
    nodes = [n for n in npu_nodes() if only is None or n.node_id == only]
    if not nodes:
        raise AclError("placement per-node: no alive Ray node declares an NPU resource "
                       "(ray start --resources='{\"NPU\": N}')", code=ACL_ERROR_RT_NO_DEVICE)
    slots, i = [], first_id
    for node in nodes:
        chip = node.labels.get(CHIP_LABEL, spec.chip)
        hbm = int(node.labels.get(HBM_LABEL, spec.arena_bytes))
        for _ in range(node.npus):
            slots.append(Slot(i, chip, hbm, node.node_id, pinned(node.node_id)))
            i += 1
    return slots


#: placement name -> slots(spec, first_id, only)
PLACEMENTS = {"any": place_any, "per-node": place_per_node}


def slots_for(spec, first_id: int = 0, only: str | None = None) -> list[Slot]:
    from devices.errors import InvalidParamError
    fn = PLACEMENTS.get(spec.placement)
    if fn is None:
        raise InvalidParamError(f"unknown placement {spec.placement!r} (known: {', '.join(PLACEMENTS)})")
    return fn(spec, first_id, only)


__all__ = ["PLACEMENTS", "NpuNode", "Slot", "npu_nodes", "pinned", "slots_for", "CHIP_LABEL", "HBM_LABEL"]
