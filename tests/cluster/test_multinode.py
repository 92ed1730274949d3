"""A real multi-node Ray cluster on this machine (tier ``multinode``, tier budget in tests/conftest.py).

Three raylets (``ray.cluster_utils.Cluster``): a head with 2 NPUs and two workers with 2 NPUs each, every
node with its own ``NPU`` resource and the labels cluster.yaml declares (chip, HBM size).  The device
actors are placed on their nodes by Ray (pinned by node id), bind to their node's address
(``VNPU_BIND=node``), and "same node" follows the Ray node id: HCCL between devices of different nodes goes
over gRPC although every raylet shares this machine's /dev/shm and boot id.

The last test removes a worker node (its raylet and every process on it killed): all its devices are lost
at once, the failover pool moves their logical ids to spares on a surviving node, a communicator spanning
the lost node fails with HCCL_E_REMOTE on every surviving rank (no hang), and a new one over the survivors
works.  No sleeps: everything waits on conditions with deadlines.
"""
from __future__ import annotations

import numpy as np
import pytest

from devices.errors import HCCL_E_REMOTE
from hccl_ranks import Pool, allreduce_checked, communicators, every_rank_fails
from runtime import hccl
from runtime.api import Runtime
from runtime.cluster.failover import DevicePool, FailoverOptions
from runtime.cluster.multinode import MultiNodeCluster, MultiNodeSpec, NodeSpec
from runtime.cluster.actor_placement import CHIP_LABEL, HBM_LABEL, pinned

pytestmark = pytest.mark.multinode

HBM = 48 << 20
SPEC = MultiNodeSpec(head=NodeSpec(npus=2, hbm_bytes=HBM), workers=(NodeSpec(npus=2, hbm_bytes=HBM, chip="Ascend310P3"),
                                                                  NodeSpec(npus=2, hbm_bytes=HBM)))


@pytest.fixture(scope="module")
def cluster():
    c = MultiNodeCluster(SPEC)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def rt(cluster):
    r = Runtime(cluster.backend())
    try:
        yield r
    finally:
        r.close()


def _by_node(cluster) -> dict[str, list[int]]:
    return {n.node_id: sorted(n.devices) for n in cluster.alive_nodes()}


def test_devices_placed_on_their_nodes_by_ray(cluster):
    """Every NPU node hosts exactly as many device actors as its NPU resource, with its labels' chip and
    HBM; ids are consecutive per node (head first); each device's node identity is its Ray node id."""
    import ray
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 3
    seen = []
    for node in cluster.alive_nodes():
        ray_node = nodes[node.node_id]
        assert ray_node["Resources"]["NPU"] == len(node.devices) == node.spec.npus
        assert ray_node["Labels"][CHIP_LABEL] == node.spec.chip
        for d in node.devices:
            w = next(w for w in cluster.where if w["device_id"] == d)
            assert w["ray_node"] == node.node_id == w["node"]        # "same node" = the Ray node id
            assert w["chip"] == ray_node["Labels"][CHIP_LABEL]
            assert w["arena_bytes"] == int(ray_node["Labels"][HBM_LABEL]) == HBM
        seen.append(node.devices)
    assert sorted(d for ds in seen for d in ds) == list(range(6))
    assert all(ds == list(range(ds[0], ds[0] + len(ds))) for ds in seen)
    head = next(n for n in cluster.alive_nodes() if n.head)
    assert head.devices == [0, 1]


def test_device_servers_bind_to_their_nodes_address(cluster):
    """VNPU_BIND=node: each device serves on the address Ray gives its node (one machine: the same address
    for all three raylets, distinct ports), never on all interfaces."""
    import ray
    addr = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    ports = set()
    for w in cluster.where:
        host, port = w["address"].rsplit(":", 1)
        assert host == w["host"] == addr[w["ray_node"]]
        assert host not in ("0.0.0.0", "[::]", "")
        ports.add(int(port))
    assert len(ports) == len(cluster.where)


def test_host_copies_take_the_grpc_path_off_the_drivers_node(rt, cluster):
    """The driver runs on the head: the head's devices are mapped (same node), the workers' go over gRPC."""
    head = next(n for n in cluster.alive_nodes() if n.head)
    for d in rt.devices():
        assert d.handle.fast_path == (d.physical_id in head.devices)
        x = np.arange(1000, dtype=np.float32) * (d.physical_id + 1)
        t = d.from_numpy(x)
        np.testing.assert_array_equal(t.numpy(), x)
        t.free()


@pytest.mark.parametrize("algo", ["mesh", "ring", "hd", "oneshot"])
def test_allreduce_across_real_nodes(rt, algo):
    """Six ranks on three raylets: correct against numpy, and the cross-node bytes went over gRPC (the
    HCCL engine's per-transport counters), the same-node ones through shared memory."""
    devs = rt.devices()
    moved = allreduce_checked(devs, algo, 100_003, seed=7)
    cross, same = moved["bytes_cross-node"], moved["bytes_same-node"]
    assert sum(cross) > 0 and all(x >= 0 for x in cross)
    if algo in ("mesh", "oneshot"):              # every rank reads from every peer
        assert all(x > 0 for x in cross) and all(x > 0 for x in same)
    # a communicator across nodes only pulls: a peer's HBM on another node is never written
    assert moved["bytes_pushed"] == [0] * len(devs)


def test_allgather_and_send_recv_between_worker_nodes(rt, cluster):
    workers = [n for n in cluster.alive_nodes() if not n.head]
    a, b = workers[0].devices[0], workers[1].devices[1]
    devs = [d for d in rt.devices() if d.physical_id in (a, b)]
    with Pool() as pool, communicators(devs, timeout_s=60) as comms:
        xs = [pool.put(d, np.full(7, r + 1, np.int32)) for r, d in enumerate(devs)]
        outs = [pool.empty(d, (14,), "int32") for d in devs]
        for c, x, o in zip(comms, xs, outs):
            c.all_gather(x, o)
        for o in outs:
            np.testing.assert_array_equal(o.numpy(), np.repeat(np.array([1, 2], np.int32), 7))
        comms[1].send(outs[1], 0)
        box = pool.empty(devs[0], (14,), "int32")
        comms[0].recv(box, 1)
        np.testing.assert_array_equal(box.numpy(), outs[1].numpy())


def test_npu_task_sees_exactly_its_nodes_devices(cluster):
    """A Ray task asking for ``resources={"NPU": k}`` gets ASCEND_RT_VISIBLE_DEVICES from Ray and, through
    runtime.api, exactly k devices of its own node (index i = the node's i-th device), usable for work."""
    import ray

    def probe():
        import os

        import numpy as np
        import ray

        from runtime.api import Runtime
        from runtime.backend import create_backend
        # what get_runtime() builds with VNPU_BACKEND=cluster (a fresh one per call: Ray reuses workers,
        # each task has its own ASCEND_RT_VISIBLE_DEVICES)
        rt = Runtime(create_backend(os.environ["VNPU_BACKEND"]))
        try:
            out = []
            for d in rt.devices():
                x = d.from_numpy(np.arange(16, dtype=np.float32) - 8)
                y = d.empty((16,))
                s = d.stream()
                s.launch("relu", [x], [y])
                out.append((d.physical_id, d.handle.info().node, float(y.numpy(stream=s).sum())))
            return os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), ray.get_runtime_context().get_node_id(), out
        finally:
            rt.close()
    env = {"runtime_env": {"env_vars": {"VNPU_BACKEND": "cluster"}}}     # the token: from the raylet's env
    task = ray.remote(num_cpus=0)(probe)
    nodes = cluster.alive_nodes()
    calls = [(n, k, task.options(resources={"NPU": k}, **pinned(n.node_id), **env).remote())
             for n in nodes for k in (1, 2)]
    for node, k, ref in calls:
        visible, ray_node, seen = ray.get(ref, timeout=120)
        ids = [int(i) for i in visible.split(",")]
        assert len(ids) == k and ray_node == node.node_id
        assert [p for p, _, _ in seen] == [node.devices[i] for i in ids]
        assert all(n == node.node_id for _, n, _ in seen)
        assert all(total == sum(range(1, 8)) for _, _, total in seen)     # relu of -8..7


def test_node_removal_loses_its_devices_fails_collectives_everywhere_and_fails_over(cluster):
    """Kill a worker node: both its devices are detected lost, the pool re-binds their logical ids to the
    spares on the other worker node; a communicator over all six ranks fails with HCCL_E_REMOTE on each of
    the four survivors (which were waiting for the lost ranks: no hang until the timeout), and a new one
    over the survivors (two nodes) gives the right sum.  Runs last: the node stays gone."""
    by_node = _by_node(cluster)
    head = next(n for n in cluster.alive_nodes() if n.head)
    # the pool binds logical 0..3 to devices 0..3 (the head's and the first worker's); 4 and 5 are spares
    victim = next(n for n in cluster.alive_nodes() if 2 in n.devices)
    other = next(n for n in cluster.alive_nodes() if 4 in n.devices)
    lost = list(victim.devices)
    pool = DevicePool(cluster.where, cluster.token, 4,
                      FailoverOptions(heartbeat_ms=50, hang_deadline_s=10.0, restart_wait_s=2.0, cpu_fallback=False))
    # (a killed node is seen by its broken health streams; the long hang deadline keeps a busy machine's
    # late heartbeats from taking devices out before)
    rt = Runtime(cluster.backend())
    try:
        assert {pool.binding(lid).physical for lid in range(4)} == set(head.devices + lost)
        devs = rt.devices()
        comms = hccl.comm_init_all(devs, hccl.CommOptions(exec_timeout_s=120))
        survivors = [i for i, d in enumerate(devs) if d.physical_id not in lost]
        xs = [devs[i].from_numpy(np.ones(4096, np.float32)) for i in survivors]
        for i, x in zip(survivors, xs):            # the survivors wait for the ranks of the doomed node ...
            comms[i].all_reduce(x)
        for i in survivors:
            devs[i].queue.flush()
        gone = cluster.kill_node(victim.node_id)     # ... which dies (raylet and processes SIGKILLed)
        assert sorted(gone) == sorted(lost)
        every_rank_fails([devs[i] for i in survivors], HCCL_E_REMOTE)    # every survivor, with HCCL_E_REMOTE
        # failover: both lost devices detected, their logical ids now on the other worker's spares
        assert pool.wait_for(lambda p: all(p.bindings[lid].physical not in lost for lid in range(4)), 30)
        detected = {e["physical"] for e in pool.events if e["kind"] == "detected"}
        assert set(lost) <= detected
        assert {pool.binding(lid).physical for lid in range(4)} == set(head.devices + other.devices)
        for lid in range(4):
            b = pool.binding(lid)
            assert b.kind == "npu" and cluster.node_of(b.physical) != victim.node_id
        # a new communicator over the survivors (head + the other worker) works
        live = [devs[i] for i in survivors]
        new = hccl.comm_init_all(live, hccl.CommOptions(exec_timeout_s=60))
        ys = [d.from_numpy(np.full(1000, r + 1.0, np.float32)) for r, d in enumerate(live)]
        for c, y in zip(new, ys):
            c.all_reduce(y)
        for y in ys:
            np.testing.assert_array_equal(y.numpy(), np.full(1000, 10.0, np.float32))
        for c in new:
            c.destroy()
        assert by_node[victim.node_id] == lost
    finally:
        pool.close()
        rt.close()
