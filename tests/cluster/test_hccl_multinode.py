"""Collectives across nodes: four device actors on two (simulated) nodes.

Each actor gets its own node identity, so ranks on the same node exchange through the shared-memory
arenas and ranks on different nodes through gRPC between the device actors (reads of peer HBM and
control messages) — the same code path as a real multi-node cluster.  Checked against numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from devices.errors import HCCL_E_PARA
from hccl_ranks import Pool, allreduce_checked, communicators, every_rank_fails
from runtime.api import Runtime
from runtime.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def rt():
    c = LocalCluster(ClusterSpec(devices=4, arena_bytes=64 << 20, nodes=2))
    r = Runtime(c.backend())
    try:
        yield r
    finally:
        r.close()
        c.close()


def test_devices_report_two_nodes(rt):
    nodes = {d.handle.hccl_info()["node"] for d in rt.devices()}
    assert nodes == {"sim-node-0", "sim-node-1"}


@pytest.mark.parametrize("algo", ["ring", "hd", "mesh", "oneshot"])
@pytest.mark.parametrize("count", [1, 1001, 300_000])
def test_allreduce_across_nodes(rt, algo, count):
    devs = rt.devices()
    moved = allreduce_checked(devs, algo, count, seed=count)
    # a communicator spanning nodes pulls only (a peer's HBM on another node is never written)
    assert moved["bytes_pushed"] == [0] * len(devs)
    assert sum(moved["bytes_cross-node"]) > 0                 # over gRPC


def test_allgather_broadcast_and_send_recv_across_nodes(rt):
    devs = rt.devices()
    n = len(devs)
    with Pool() as pool, communicators(devs, timeout_s=60) as comms:
        xs = [pool.put(d, np.full(5, r + 1, np.int32)) for r, d in enumerate(devs)]
        outs = [pool.empty(d, (5 * n,), "int32") for d in devs]
        for c, x, o in zip(comms, xs, outs):
            c.all_gather(x, o)
        expect = np.repeat(np.arange(1, n + 1, dtype=np.int32), 5)
        for o in outs:
            np.testing.assert_array_equal(o.numpy(), expect)
        for c, x in zip(comms, xs):
            c.broadcast(x, root=3)
        for x in xs:
            np.testing.assert_array_equal(x.numpy(), np.full(5, 4, np.int32))
        payload = pool.put(devs[0], np.arange(7, dtype=np.float32))
        box = pool.empty(devs[3], (7,))                     # rank 0 (node 0) -> rank 3 (node 1)
        comms[0].send(payload, 3)
        comms[3].recv(box, 0)
        np.testing.assert_array_equal(box.numpy(), np.arange(7, dtype=np.float32))


def test_mismatch_across_nodes_fails_every_rank(rt):
    devs = rt.devices()[:2]           # one rank per node
    with Pool() as pool, communicators(devs, timeout_s=30) as comms:
        comms[0].all_reduce(pool.put(devs[0], np.ones(8, np.float32)))
        comms[1].all_reduce(pool.put(devs[1], np.ones(9, np.float32)))
        every_rank_fails(devs, HCCL_E_PARA)


def test_one_definition_of_same_node(rt):
    """This process is on neither simulated node: its host copies go over gRPC (no arena mapping), exactly
    as HCCL between the two nodes does."""
    for d in rt.devices():
        assert d.handle.fast_path is False
        assert d.handle.info().node == d.handle.hccl_info()["node"]


def test_link_down_across_nodes_fails_that_pair_only(rt):
    """A down link between devices on two nodes fails their collective with HCCL_E_NETWORK on both ends
    (over the gRPC transport), while a pair on one node (shared memory) keeps working."""
    from devices.errors import HCCL_E_NETWORK
    devs = rt.devices()
    by_node: dict[str, list] = {}
    for d in devs:
        by_node.setdefault(d.handle.hccl_info()["node"], []).append(d)
    (a, b), (c, _) = by_node["sim-node-0"], by_node["sim-node-1"]
    with Pool() as pool, communicators([a, c], timeout_s=60) as cross, communicators([a, b], timeout_s=60) as local:
        c.handle.inject_fault("link-down", peer=a.physical_id, duration_ms=600_000)
        xs = [pool.put(a, np.ones(16, np.float32)), pool.put(c, np.ones(16, np.float32))]
        for comm, x in zip(cross, xs):
            comm.all_reduce(x)
        every_rank_fails((a, c), HCCL_E_NETWORK)
        ys = [pool.put(a, np.ones(16, np.float32)), pool.put(b, np.full(16, 2.0, np.float32))]
        for comm, y in zip(local, ys):
            comm.all_reduce(y)
        for y in ys:
            np.testing.assert_array_equal(y.numpy(), np.full(16, 3.0, np.float32))
        c.handle.clear_fault()
        zs = [pool.put(a, np.ones(16, np.float32)), pool.put(c, np.full(16, 4.0, np.float32))]
        for comm, z in zip(cross, zs):
            comm.all_reduce(z)
        for z in zs:
            np.testing.assert_array_equal(z.numpy(), np.full(16, 5.0, np.float32))
