"""Ray Serve replicas behind the OpenAI routes on a real multi-raylet Ray cluster (serve + cluster +
multinode tiers): a :class:`MultiNodeCluster` with a head raylet without NPUs (where this driver and the
Serve controller run) and two worker raylets with one NPU each, the engines in Ray Serve replicas that
claim ``{"NPU": 1}`` each, the front in this process, driven by the official ``openai`` client.

One replica serves; ``POST /admin/replicas`` scales out to two.  Each replica's ``{"NPU": 1}`` can only be
met by a different worker, so the two run on different Ray nodes (their node ids, shown in
``/admin/replicas``, differ), each on the device of its own node (the cluster's own bookkeeping,
``node_of``, says so, and Ray's ``ASCEND_RT_VISIBLE_DEVICES`` index on that node names it).  Four
concurrent streams spread two per replica; a scale-in while all four are in flight drains the removed
replica (its two streams finish whole, none is cut), after which its node's NPU is free again (a task
claiming ``{"NPU": 1}`` then runs on that node) and its device's HBM is back to what it was.  The devices
are hung while the drain starts (``inject_fault("hang")``), so that the streams are certainly in flight
then -- not a matter of timing.

(Replicas sharing one raylet of a :class:`LocalCluster` are what tests/serve/test_serve_heal_replicas.py runs;
this module ran this test on one node before the multi-node cluster existed, and no longer does, for the
serve tier's time budget: the multi-node run makes every assertion the one-node run made.)
"""
from __future__ import annotations

import threading
import urllib.request

import openai
import pytest

from runtime.api import Runtime
from runtime.cluster.failover import wait_polled
from runtime.serve.config import model_spec
from runtime.serve.engine import EngineConfig
from runtime.serve.replicas import ReplicaOptions, ReplicaService
from runtime.serve.server import Server
from runtime.serve.tenants import Tenant, key_digest
from serve_http import call

pytestmark = [pytest.mark.serve, pytest.mark.cluster, pytest.mark.multinode]

ADMIN = "sk-ops-0123456789"
MAX_TOKENS = 12
HBM = 1 << 30


@pytest.fixture(scope="module")
def cluster():
    from runtime.cluster.multinode import MultiNodeCluster, MultiNodeSpec, NodeSpec
    c = MultiNodeCluster(MultiNodeSpec(head=NodeSpec(npus=0), workers=(NodeSpec(npus=1, hbm_bytes=HBM),
                                                                      NodeSpec(npus=1, hbm_bytes=HBM))))
    rt = Runtime(c.backend())
    try:
        yield c, rt
    finally:
        rt.close()
        c.close()


def _on_its_node(cluster, node: str, visible: str, device: int) -> bool:
    """Whether ``device`` is hosted on Ray node ``node`` and is the one that Ray's ``ASCEND_RT_VISIBLE_DEVICES``
    index ``visible`` names among that node's NPUs (the node's devices in id order)."""
    here = sorted(w["device_id"] for w in cluster.where if cluster.node_of(w["device_id"]) == node)
    return cluster.node_of(device) == node and here[int(visible)] == device


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
    st, answer = call(srv.url, path, ADMIN, body, timeout=600.0)
    assert st == 200, (path, st, answer)
    return answer


def test_replicas_behind_the_routes_scale_out_and_drain_on_scale_in(cluster):
    import ray
    mn, rt = cluster
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
        # two different Ray nodes (the two workers), each replica on the device of its own node
        workers = {n.node_id for n in mn.alive_nodes() if not n.head}
        assert len(workers) == 2 and {r["node"] for r in reps} == workers
        assert all(_on_its_node(mn, r["node"], r["visible_devices"], r["devices"][0]) for r in reps)
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
        assert node != kept["node"] and _on_its_node(mn, node, visible, freed)
        assert wait_polled(threading.Condition(), lambda: rt.device(freed).mem_info() == idle[freed], 30)   # HBM freed
        metrics = urllib.request.urlopen(urllib.request.Request(srv.url + "/metrics", headers={
            "Authorization": f"Bearer {ADMIN}"}), timeout=30).read().decode()
        assert 'vnpu:serve_replicas{state="ready"} 1.0' in metrics
    finally:
        srv.stop()
    assert wait_polled(threading.Condition(), lambda: _npus_free(2), 30)
