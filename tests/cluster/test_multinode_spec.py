"""What a multi-node cluster is made of, read from ``cluster.yaml`` (no Ray started): each node type's
``NPU`` resource and labels become a :class:`NodeSpec` whose Ray resources and labels are exactly the
file's; a file that is not a cluster.yaml is a clear InvalidParamError."""
from __future__ import annotations

import os

import pytest
import yaml

from devices.errors import InvalidParamError
from runtime.cluster.multinode import MultiNodeSpec, NodeSpec, multinode_from_yaml
from runtime.cluster.actor_placement import CHIP_LABEL, HBM_LABEL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YAML = os.path.join(ROOT, "cluster.yaml")


def test_node_types_of_cluster_yaml():
    cfg = yaml.safe_load(open(YAML, encoding="utf-8"))
    types = cfg["available_node_types"]
    head_t = types[cfg["head_node_type"]]
    worker_t = next(t for k, t in types.items() if k != cfg["head_node_type"])
    spec = multinode_from_yaml(YAML, workers=3)
    assert isinstance(spec, MultiNodeSpec) and len(spec.workers) == 3
    for node, t in [(spec.head, head_t), *((w, worker_t) for w in spec.workers)]:
        assert node.npus == t["resources"]["NPU"]
        assert node.labels() == {CHIP_LABEL: t["labels"][CHIP_LABEL], HBM_LABEL: t["labels"][HBM_LABEL]}
    assert spec.npus == head_t["resources"]["NPU"] + 3 * worker_t["resources"]["NPU"]


def test_overrides_for_small_clusters():
    spec = multinode_from_yaml(YAML, workers=2, hbm_bytes=32 << 20, head_npus=0)
    assert spec.head.npus == 0 and spec.head.hbm_bytes == 32 << 20
    assert all(w.hbm_bytes == 32 << 20 and w.labels()[HBM_LABEL] == str(32 << 20) for w in spec.workers)
    assert NodeSpec(npus=2, chip="Ascend310P3").labels()[CHIP_LABEL] == "Ascend310P3"


@pytest.mark.parametrize("text", ["{", "a: 1", "available_node_types: {}\nhead_node_type: h",
                                  "available_node_types: {h: {resources: {NPU: x}}}\nhead_node_type: h",
                                  "available_node_types: {h: {labels: {vnpu.hbm-bytes: '0'}}}\nhead_node_type: h"])
def test_not_a_cluster_yaml(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(InvalidParamError) as ei:
        multinode_from_yaml(p)
    assert str(p) in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(InvalidParamError):
        multinode_from_yaml(tmp_path / "none.yaml")
