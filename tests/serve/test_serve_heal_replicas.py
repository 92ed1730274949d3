"""Sustained p99 above the target scales out from a spare device (serve + cluster tiers): a real Ray cluster
with 2 device actors, one Ray Serve replica of SmolLM2 on one of them (the other is the spare), the front in
this process, the official ``openai`` client; the sampler ticks on an injected clock.

The SLO target is set below any real request's latency, so the p99 over the window is certainly above it
(no timing luck); the ``slow`` trigger scales out by one replica, which takes the spare NPU; "recovered" on
2 cores means the new replica serves its share of the traffic (two concurrent requests land one on each
replica).  The action event carries the p99 that fired it and the detection-to-recovery time.

One Ray cluster for the module (a Ray start is the dearest thing here): 2 device actors that Ray restarts
when killed.  Each test opens its own runtime on the devices as they are then (``discover``: a device
another test had killed is the restarted actor), so the tests run in any order.
"""
from __future__ import annotations

import openai
import pytest

from runtime.api import Runtime
from runtime.observe.metrics_store import History
from runtime.serve.config import model_spec, parse_config
from runtime.serve.engine import EngineConfig
from runtime.serve.heal import SelfHealing
from runtime.serve.replicas import ReplicaOptions, ReplicaService
from runtime.serve.metrics_sampler import Sampler
from runtime.serve.server import Server
from runtime.serve.tenants import Tenant, key_digest

pytestmark = [pytest.mark.serve, pytest.mark.cluster]

ADMIN = "sk-ops-0123456789"


@pytest.fixture(scope="module")
def cluster():
    from runtime.cluster import ClusterSpec, LocalCluster
    c = LocalCluster(ClusterSpec(devices=2, arena_bytes=1 << 30), max_restarts=3)
    try:
        yield c
    finally:
        c.close()


def runtime_on(cluster) -> Runtime:
    """A runtime on the cluster's device actors where they are now (restarted ones included)."""
    from runtime.cluster.discovery import discover
    from runtime.cluster.remote import RemoteBackend
    return Runtime(RemoteBackend(discover(), cluster.token))


def test_sustained_p99_above_target_scales_out_to_the_spare(tmp_path, cluster):
    import ray
    rt = runtime_on(cluster)
    spec = model_spec("smollm2", (0,), 1, EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=48,
                                                       num_gpu_blocks_override=16))
    svc = ReplicaService((spec,), 1, (Tenant("ops", (key_digest(ADMIN),), admin=True),),
                         options=ReplicaOptions(stream_interval_ms=20))
    t = [70_000.0]
    hist = History(tmp_path / "history.sqlite", clock=lambda: t[0])
    sampler = Sampler(svc, hist, rt, clock=lambda: t[0])
    cfg = parse_config("""
slo: {target_p99_ms: 0.5}
self_healing:
  triggers:
    - {name: slow, metric: p99_latency_ms, condition: "> 2 * slo.target_p99_ms", window: 3s, action: scale_out,
       params: {replicas: +1}}
""")
    SelfHealing(svc, cfg.self_healing, hist, sampler, rt)
    srv = Server(svc).start()
    try:
        svc.load()
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key=ADMIN, max_retries=0)

        def ask():
            return cl.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=4, temperature=0)
        assert ray.available_resources().get("NPU", 0) == 1                      # one spare
        for _ in range(3):                                                       # 3 s of slow requests
            ask()
            t[0] += 1.0
            sampler.tick(t[0])
        assert svc.replica_count == 1                                            # the window is not covered yet
        ask()
        t[0] += 1.0
        server, _ = sampler.tick(t[0])
        assert svc.replica_count == 2 and ray.available_resources().get("NPU", 0) == 0
        (act,) = hist.events(kinds=["action"])
        assert act.trigger == "slow" and act.result == "ok" and act.value > 1.0
        assert act.detail["added"] and act.duration_s >= 3.0
        assert hist.samples("replicas")[-1][1] == 1.0                           # sampled before the action
        added = [e for e in hist.events(kinds=["lifecycle"]) if e.source == "replicas"]
        assert len(added) == 2 and added[-1].detail["replica"] == act.detail["added"][0]   # initial + scale-out
        before = {r["name"]: r["requests"] for r in svc.replica_views()}
        s = cl.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=0,
                                  stream=True, extra_body={"ignore_eos": True})
        it = iter(s)
        first = next(it)                                                         # one stream in flight on a replica
        assert ask().usage.completion_tokens == 4                                # -> the other replica (fewest in flight)
        rest = [ch for ch in it if ch.choices]
        assert first.choices and len(rest) >= 1
        after = {r["name"]: r["requests"] for r in svc.replica_views()}
        assert len(after) == 2 and all(after[n] > before.get(n, 0) for n in after)   # both replicas served
        t[0] += 1.0
        server, _ = sampler.tick(t[0])
        assert server["replicas"] == 2
        res = svc.restart("smollm2", "test")                 # restart_worker: each replica's engine, in place
        assert res.placement.count(": npu 0") == 2 and not res.moved      # each on its own device 0
        assert ask().usage.completion_tokens == 4
    finally:
        srv.stop()
        hist.close()
        rt.close()


def test_a_killed_cluster_device_is_restarted_by_ray_and_warmed(cluster):
    """``restart_device`` on the cluster backend: a killed device actor (its process dies) comes back
    through Ray's actor restart; the runtime reconnects, resets and warms it (checked results)."""
    from runtime.cluster.failover import wait_polled
    from runtime.serve.heal.actions import warm
    import threading
    rt = runtime_on(cluster)
    try:
        old = rt.device(1)
        pid_before = rt.backend.where[1]["pid"]
        old.handle.inject_fault("kill")
        assert wait_polled(threading.Condition(), lambda: old.is_lost, 60)
        new = rt.restart_device(1)
        assert new is not old and not new.is_lost and new.health()[0] == "OK"
        assert warm(new, 3) >= 0.0
        assert rt.backend.where[1]["pid"] != pid_before
        assert not rt.device(0).is_lost and warm(rt.device(0), 1) >= 0.0       # the other device untouched
    finally:
        rt.close()
