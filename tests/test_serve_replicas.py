"""Ray Serve replicas behind the OpenAI routes (serve + cluster tiers; the multi-node variant also
multinode): a real Ray cluster with device actors, the engines in Ray Serve replicas that claim
``{"NPU": 1}`` each, the front in this process, driven by the official ``openai`` client.

One replica serves; ``POST /admin/replicas`` scales out to two (each owns a different device, chosen by
Ray); four concurrent streams spread two per replica; a scale-in while all four are in flight drains the
removed replica (its two streams finish, none is cut), after which its NPU is free again and its HBM back
to what it was.  The devices are hung while the drain starts (``inject_fault("hang")``), so that the
streams are certainly in flight then -- not a matter of timing.

The same test body runs on two clusters:

- ``one-node``: a :class:`LocalCluster` (one raylet with both NPUs): the replicas share the node.
- ``multi-node``: a :class:`MultiNodeCluster` -- a head raylet without NPUs (where the Serve controller
  and this driver run) and two worker raylets with one NPU each.  Each replica's ``{"NPU": 1}`` can only
  be met by a different worker, so the two replicas run on different Ray nodes (their node ids, in
  ``/admin/replicas``, differ), each on the device of its own node (Ray's ``ASCEND_RT_VISIBLE_DEVICES``
  index on that node names it); the scale-in frees the removed replica's node's NPU (a task claiming
  ``{"NPU": 1}`` then runs there).
"""
from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import dataclass
from typing import Callable

import openai
import pytest

from runtime.api import Runtime
from runtime.cluster.failover import wait_polled
from runtime.serve.config import model_spec
from runtime.serve.engine import EngineConfig
from runtime.serve.replicas import ReplicaOptions, ReplicaService
from runtime.serve.server import Server
from runtime.serve.tenants import Tenant, key_digest

pytestmark = [pytest.mark.serve, pytest.mark.cluster]

ADMIN = "sk-ops-0123456789"
MAX_TOKENS = 12
HBM = 1 << 30


@dataclass(frozen=True)
class Setup:
    """A cluster under test: its runtime (this process sees every device), where each device is hosted
    (device id -> Ray node id, from the cluster's own bookkeeping) and how many nodes have NPUs."""
    rt: Runtime
    node_of: Callable[[int], str]
    npu_nodes: int


def _local():
    from runtime.cluster import ClusterSpec, LocalCluster
    c = LocalCluster(ClusterSpec(devices=2, arena_bytes=HBM))
    nodes = {w["device_id"]: w["ray_node"] for w in c.where}
    return c, nodes.__getitem__, 1


def _multinode():
    from runtime.cluster.multinode import MultiNodeCluster, MultiNodeSpec, NodeSpec
    c = MultiNodeCluster(MultiNodeSpec(head=NodeSpec(npus=0), workers=(NodeSpec(npus=1, hbm_bytes=HBM),
                                                                      NodeSpec(npus=1, hbm_bytes=HBM))))
    return c, c.node_of, 2


@pytest.fixture(scope="module", params=[pytest.param(_local, id="one-node"),
                                        pytest.param(_multinode, id="multi-node", marks=pytest.mark.multinode)])
def cluster(request):
    c, node_of, npu_nodes = request.param()
    rt = Runtime(c.backend())
    try:
        yield Setup(rt, node_of, npu_nodes)
    finally:
        rt.close()
        c.close()


def _npu_task_where() -> tuple[str, str]:
    """(Ray node id, ASCEND_RT_VISIBLE_DEVICES) of a task that claims one NPU (where Ray finds a free one)."""
    import ray

    def where() -> tuple[str, str]:      # (nested: pickled by value, as this test module is not importable there)
        import os

        import ray
        return ray.get_runtime_context().get_node_id(), os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    return ray.get(ray.remote(num_cpus=0, resources={"NPU": 1})(where).remote(), timeout=120)


def _npus_free(n: int) -> bool:
    import ray
    return ray.available_resources().get("NPU", 0) == n


def post(srv, path, body):
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def test_replicas_behind_the_routes_scale_out_and_drain_on_scale_in(cluster):
    import ray
    rt = cluster.rt
    spec = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=48,
                                                       num_gpu_blocks_override=16))
    svc = ReplicaService((spec,), 1, (Tenant("ops", (key_digest(ADMIN),), admin=True),),
                         options=ReplicaOptions(stream_interval_ms=20))
    srv = Server(svc).start()
    try:
        svc.load()
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key=ADMIN, max_retries=0)
        one = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=0,
                                   extra_body={"ignore_eos": True})
        assert one.usage.completion_tokens == MAX_TOKENS
        idle = {d: rt.device(d).mem_info() for d in (0, 1)}
        out = post(srv, "/admin/replicas", {"replicas": 2})            # scale out through the admin route
        reps = out["replicas"]
        assert len(reps) == 2 and sorted(d for r in reps for d in r["devices"]) == [0, 1]    # a device group each
        assert len({r["pid"] for r in reps}) == 2 and ray.available_resources().get("NPU", 0) == 0
        # where the replicas run: on as many Ray nodes as have NPUs (two different nodes on the multi-node
        # cluster), each on the device of its own node -- the one Ray's ASCEND_RT_VISIBLE_DEVICES names there
        assert len({r["node"] for r in reps}) == cluster.npu_nodes
        assert {r["node"] for r in reps} <= {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        for r in reps:
            (dev,) = r["devices"]
            assert cluster.node_of(dev) == r["node"]
            assert sorted(d for d in (0, 1) if cluster.node_of(d) == r["node"])[int(r["visible_devices"])] == dev
        defrag = post(srv, "/admin/defragment", {})["devices"]         # each replica compacts its own device
        assert sorted(d["replica"] for d in defrag) == sorted(r["name"] for r in reps)
        assert all(d["arena_fragmentation_after"] <= d["arena_fragmentation_before"] for d in defrag)

        texts, firsts = [None] * 4, threading.Barrier(5)

        def stream(i):
            s = c.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=0,
                                     stream=True, extra_body={"ignore_eos": True})
            it = iter(s)
            parts = [next(it).choices[0].text]
            firsts.wait(120)
            parts += [ch.choices[0].text for ch in it if ch.choices]
            texts[i] = "".join(parts)
        ths = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in ths:
            t.start()
        firsts.wait(120)                                                # all four in flight ...
        assert sorted(r["in_flight"] for r in svc.replica_views()) == [2, 2]     # ... two per replica
        for d in (0, 1):
            rt.device(d).handle.inject_fault("hang")                    # nothing finishes while the drain starts
        res: dict = {}
        drain = threading.Thread(target=lambda: res.update(svc.scale_in(1)))
        drain.start()
        assert svc.wait_replicas(lambda views: any(v["state"] == "draining" for v in views), 60)
        for d in (0, 1):
            rt.device(d).handle.clear_fault("hang")
        drain.join(300)
        for t in ths:
            t.join(120)
        gone = res["removed"][0]
        assert gone["drained"] and gone["in_flight_at_start"] == 2 and gone["abandoned"] == 0
        assert len(set(texts)) == 1 and all(texts)                      # every stream whole, the same greedy text
        # the removed replica's device is free again, on its own node: a task claiming one NPU runs there
        assert wait_polled(threading.Condition(), lambda: _npus_free(1), 30)
        (kept,) = res["replicas"]
        freed = [d for d in (0, 1) if d not in kept["devices"]][0]
        node, visible = _npu_task_where()
        assert node == cluster.node_of(freed)
        assert sorted(d for d in (0, 1) if cluster.node_of(d) == node)[int(visible)] == freed
        assert wait_polled(threading.Condition(), lambda: rt.device(freed).mem_info() == idle[freed], 30)   # HBM freed
        metrics = urllib.request.urlopen(urllib.request.Request(srv.url + "/metrics", headers={
            "Authorization": f"Bearer {ADMIN}"}), timeout=30).read().decode()
        assert 'vnpu:serve_replicas{state="ready"} 1.0' in metrics
    finally:
        srv.stop()
    assert wait_polled(threading.Condition(), lambda: _npus_free(2), 30)
