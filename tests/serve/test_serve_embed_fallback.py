"""The fallback chain of an embedding model over HTTP (serve tier): minilm-l6 on device 0, then device 1,
then the CPU fallback device, served on loopback and driven by the official ``openai`` client.

- ``/admin`` fallback with requests queued moves the encoder between two batches (nothing dropped, every
  request answered on the new placement), ``/admin/state`` and ``/metrics`` show the chain, restore comes
  back; a non-admin key gets 403.
- Self-healing's ``fallback`` action addresses an encoder by name; its check is a probe embedding.
- A task exception on a healthy placement fails only that batch's request (HTTP 500); the engine stays up
  and the next request is served.
- Device 0 killed while a batch runs on it (the batch is held on a hung device, then the device is
  killed): the engine re-binds to device 1 by itself and re-runs the batch there -- every request gets its
  embedding exactly once; restore is refused (the primary is lost); the CPU entry serves too.
- Config mistakes in an encoder's chain: ``vnpu serve`` exits 2 with one line.
- A Ray Serve replica's body serves embeddings down its chain (healthy while degraded, unhealthy once the
  chain is exhausted); a requested fallback with no usable entry leaves the encoder serving where it was.

Reference and tolerance: each text is embedded on its own (batch of one, so other padding and matrix
shapes than the server's batches) by a separate job on device 2, outside the chain.  Float32 rounding of a
reduction over k terms is bounded by gamma(k) relative (Higham; tests/fp32.py); every layer's longest
reduction is the FFN's (k = d_ff), and LayerNorm renormalises after each layer, so the errors add over the
layers: |got - ref| <= n_layers * gamma(d_ff) on the unit-norm embedding.  A wrong or swapped row is far
outside that (rows differ by ~1e-1): each answer must also be nearer its own reference than any other.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from devices.device import DeviceConfig
from devices.errors import DeviceLostError
from fp32 import gamma
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.models.bert import EmbedJob
from runtime.serve.config import BatchingConfig, model_spec
from runtime.serve.engine.placement import Placement
from runtime.serve.heal.actions import ACTIONS, Context, Fired
from runtime.serve.server import Server, Service
from runtime.serve.tenants import Quota, Tenant, key_digest
from serve_http import call

pytestmark = pytest.mark.serve

ADMIN, USER = "sk-ops-0123456789", "sk-app-0123456789"
MODEL = "minilm-l6"
TEXTS = [f"sentence {i}: {w}" for i, w in enumerate(
    ["a virtual NPU runs kernels", "bread smells good", "the cat sat on the mat", "HBM is fast memory",
     "rain again today", "collectives need a ring", "tea or coffee", "graphs replay launches"])]
BATCH = 4                                    # texts per batch: the 8 requests of a test run as two batches


@pytest.fixture(scope="module")
def served():
    rt = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=1 << 30)))
    spec = model_spec(MODEL, (0,), None, batching=BatchingConfig(max_batch_size=BATCH, max_wait_ms=2),
                      fallback=(Placement((1,)), Placement(cpu=True)))
    tenants = (Tenant("ops", (key_digest(ADMIN),), admin=True), Tenant("app", (key_digest(USER),), quota=Quota()))
    svc = Service(rt, (spec,), tenants)
    srv = Server(svc).start()
    try:
        svc.load()
        with EmbedJob(rt, MODEL, devices=[2], batch_size=1) as job:
            ref = np.stack([job.embed([t])[0] for t in TEXTS])
            c = job.cfg
        yield rt, srv, ref, c.n_layers * gamma(c.ff)
    finally:
        srv.stop()
        rt.close()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key=USER, max_retries=0, timeout=120)


def engine(served):
    return served[1].service.engines[MODEL]


def admin(srv, path, key=ADMIN, body=None):
    return call(srv.url, path, key, {} if body is None else body)


def state(srv) -> dict:
    st, body = call(srv.url, "/admin/state", ADMIN)
    assert st == 200
    return body["models"][MODEL]


def check(got, ref, tol, idx) -> None:
    """``got[j]`` is the embedding of ``TEXTS[idx[j]]``: within ``tol`` of its reference, nearest to it."""
    got = np.asarray(got, np.float64)
    assert got.shape == (len(idx), ref.shape[1])
    err = float(np.abs(got - ref[idx]).max())
    assert err <= tol, f"max |got - ref| = {err:.2e} > {tol:.2e}"
    dist = np.abs(got[:, None, :] - ref[None, :, :]).max(-1)         # [answers, references]
    assert list(dist.argmin(1)) == list(idx)


def embed_each(client, n=len(TEXTS)):
    """One request per text, all in flight at once; their embeddings in text order."""
    with ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(client.embeddings.create, model=MODEL, input=TEXTS[i], encoding_format="float")
                for i in range(n)]
        outs = [f.result() for f in futs]
    assert all(len(o.data) == 1 for o in outs)                       # one embedding per request
    return [o.data[0].embedding for o in outs]


def queued(eng, n):
    """Wait (on the engine's condition) until ``n`` requests are queued."""
    assert eng.wait_until(lambda e: e.waiting == n, 60), f"{eng.waiting} of {n} requests queued"


def test_admin_fallback_between_batches_and_restore(served, client):
    rt, srv, ref, tol = served
    eng = engine(served)
    check([d.embedding for d in client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float").data],
          ref, tol, list(range(len(TEXTS))))
    s = state(srv)
    assert (s["kind"], s["placement"], s["index"], s["chain"]) == ("embed", "npu 0", 0, ["npu 0", "npu 1", "cpu"])
    done0 = sum(eng.batches)
    moved = {}
    with ThreadPoolExecutor(1) as ex:
        with eng.paused(60):                        # requests queue, then a fallback waits for the boundary
            reqs = threading.Thread(target=lambda: moved.setdefault("emb", embed_each(client)))
            reqs.start()
            queued(eng, len(TEXTS))
            fb = ex.submit(admin, srv, f"/admin/models/{MODEL}/fallback")
            assert eng.wait_until(lambda e: e.pending_rebinds == 1, 60)
        st, res = fb.result(120)
        reqs.join(120)
    assert st == 200 and res["moved"] and (res["from_index"], res["to_index"], res["placement"]) == (0, 1, "npu 1")
    assert res["replayed"] == 0                     # nothing had run: the queued requests ran on npu 1
    check(moved["emb"], ref, tol, list(range(len(TEXTS))))
    assert sum(eng.batches) - done0 == len(TEXTS)   # every text embedded once
    s = state(srv)
    assert (s["placement"], s["index"], s["rebinds"]) == ("npu 1", 1, 1)
    st, metrics = call_text(srv.url + "/metrics")
    assert st == 200 and f'vnpu:engine_placement{{engine="0",model_name="{MODEL}",placement="npu 1"}} 1.0' in metrics
    st, body = admin(srv, f"/admin/models/{MODEL}/fallback", key=USER)
    assert st == 403 and body["error"]["code"] == "insufficient_permissions"
    st, rs = admin(srv, f"/admin/models/{MODEL}/restore")
    assert st == 200 and rs["moved"] and (rs["to_index"], rs["placement"]) == (0, "npu 0")
    st, again = admin(srv, f"/admin/models/{MODEL}/restore")
    assert st == 200 and not again["moved"]
    assert [e["kind"] for e in eng.events] == ["fallback", "restore"] and state(srv)["index"] == 0
    check(embed_each(client, 2), ref, tol, [0, 1])


def call_text(url: str) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read().decode()


def test_heal_fallback_action_moves_an_encoder_and_probes_it(served):
    """Self-healing's ``fallback {model: minilm-l6}``: moved, checked by a probe embedding (which fails when
    the new placement fails a task), released by restore."""
    rt, srv, ref, tol = served
    eng = engine(served)
    out = ACTIONS["fallback"].run(Context(srv.service, rt), Fired("errors", "error_rate", "server", 0.5, 0.0,
                                                                  {"model": MODEL}))
    assert out.detail["placements"] == {MODEL: "npu 1"} and eng.placement == Placement((1,))
    assert out.check() == (True, f"{MODEL} ok")
    rt.device(1).handle.inject_fault("task-fail", count=1)
    ok, why = out.check()
    assert not ok and "probe failed" in why and "ACL_ERROR_RT_AICORE_EXCEPTION" in why
    assert out.release() == f"restored {MODEL} -> npu 0" and eng.placement == Placement((0,))
    assert out.check() == (True, f"{MODEL} ok")


def test_task_exception_fails_only_its_batch(served, client):
    rt, srv, ref, tol = served
    eng = engine(served)
    assert eng.placement == Placement((0,))
    failed0 = eng.failed_batches
    rt.device(0).handle.inject_fault("task-fail", count=1)
    with pytest.raises(openai.InternalServerError) as e:
        client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert "ACL_ERROR_RT_AICORE_EXCEPTION" in str(e.value)
    assert eng.failed_batches == failed0 + 1 and eng.error is None and eng.placement == Placement((0,))
    check(embed_each(client), ref, tol, list(range(len(TEXTS))))     # the engine serves on, where it was
    assert urllib.request.urlopen(srv.url + "/health", timeout=30).status == 200
    assert state(srv)["failed_batches"] == failed0 + 1


def test_device_lost_mid_batch_reruns_it_on_the_next_entry(served, client):
    rt, srv, ref, tol = served
    eng = engine(served)
    assert eng.placement == Placement((0,))
    done0, ev0 = sum(eng.batches), len(eng.events)
    out = {}
    with eng.paused(60):
        reqs = threading.Thread(target=lambda: out.setdefault("emb", embed_each(client)))
        reqs.start()
        queued(eng, len(TEXTS))
        rt.device(0).handle.inject_fault("hang")          # the first batch will sit on device 0's cores
    assert eng.wait_until(lambda e: e.running > 0, 60)    # ... and runs there now
    try:
        rt.device(0).handle.inject_fault("kill")          # the device is lost (the call itself may say so)
    except DeviceLostError as e:
        assert "lost" in str(e)
    reqs.join(120)
    check(out["emb"], ref, tol, list(range(len(TEXTS))))  # every request its own embedding ...
    assert sum(eng.batches) - done0 == len(TEXTS)         # ... computed once (the failed attempt is not kept)
    ev = eng.events[ev0:]
    assert len(ev) == 1 and ev[0]["kind"] == "fallback" and ev[0]["reason"].startswith("automatic: device 0 is lost")
    # the batch was on the device when it was killed: it is re-run (0 only if the loss was seen first)
    assert ev[0]["replayed"] in (0, BATCH) and eng.replayed_batches == (1 if ev[0]["replayed"] else 0)
    s = state(srv)
    assert (s["placement"], s["index"]) == ("npu 1", 1) and [d.index for d in eng.devices] == [1]
    print(f"\nkill mid-batch: re-bound to {eng.placement} in {ev[0]['seconds']:.2f} s, "
          f"{ev[0]['replayed']} request(s) re-run")
    assert urllib.request.urlopen(srv.url + "/health", timeout=30).status == 200
    st, body = admin(srv, f"/admin/models/{MODEL}/restore")   # the primary is lost
    assert st == 503 and "device 0 is lost" in body["error"]["message"]
    st, fb = admin(srv, f"/admin/models/{MODEL}/fallback")    # down to the CPU device
    assert st == 200 and fb["placement"] == "cpu"
    check(embed_each(client, 3), ref, tol, [0, 1, 2])
    st, body = admin(srv, f"/admin/models/{MODEL}/fallback")  # nothing below the CPU
    assert st == 503 and "last entry" in body["error"]["message"]


@pytest.mark.parametrize("chain,message", [
    ("[0, cpu]", "device 0 is both in its first placement and in its fallback chain"),
    ("[9]", "fallback device 9 does not exist"),
])
def test_bad_encoder_chain_exits_2_with_one_line(tmp_path, chain, message):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"models:\n  - model: {MODEL}@0\n    fallback: {chain}\n")
    p = subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg), "--port", "0",
                        "--devices", "2"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "VNPU_BACKEND": "local"})
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_replica_body_serves_embeddings_down_its_chain():
    """A Ray Serve replica's body in-process (what the front's RemoteEmbedEngine calls, and what Serve
    health-checks): embeddings on device 0, still served (and healthy) once a kill moved the encoder to the
    CPU fallback, unhealthy when the CPU device is lost too; closed, no arena segment of this process left."""
    import asyncio
    import glob

    from runtime.serve.engine import Unavailable
    from runtime.serve.replicas import ReplicaBody
    mine = lambda: set(glob.glob(f"/dev/shm/vnpu_{os.getpid()}_*"))       # noqa: E731
    before = mine()
    spec = model_spec(MODEL, (0,), None, batching=BatchingConfig(max_batch_size=BATCH, max_wait_ms=0),
                      fallback=(Placement(cpu=True),))
    body = ReplicaBody((spec,), runtime_factory=lambda: Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30))))
    try:
        eng = body.svc.engines[MODEL]
        assert body.info()["models"][MODEL] == {"kind": "embed", "max_len": eng.max_len, "dim": eng.dim}
        ask = lambda: asyncio.run(body.embed(MODEL, TEXTS[:2], sum(eng.check(TEXTS[:2]))))   # noqa: E731
        first = ask()
        body.check_health()
        try:
            body.rt.device(0).handle.inject_fault("kill")
        except DeviceLostError as e:                                 # the call itself may report the loss
            assert "lost" in str(e)
        again = ask()
        assert eng.placement == Placement(cpu=True) and body.state()["models"][MODEL]["placement"] == "cpu"
        assert float(np.abs(again - first).max()) <= 2 * 6 * gamma(1536)     # two runs, each within the bound
        body.check_health()                                        # degraded, still serving
        try:
            eng.devices[0].handle.inject_fault("kill")             # the last entry goes too
        except DeviceLostError as e:
            assert "lost" in str(e)
        with pytest.raises(Unavailable, match="no fallback is left"):
            ask()
        with pytest.raises(Unavailable, match="replica unhealthy"):
            body.check_health()                                    # Ray Serve replaces such a replica
    finally:
        body.close()
    assert mine() == before


def test_a_fallback_with_no_usable_entry_stays_where_it_was():
    """A requested fallback whose entries are all unusable is refused (Unavailable, an event with ok False)
    and the encoder goes on serving where it was."""
    from runtime.serve.engine import EmbedEngine, Unavailable
    rt = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    eng = EmbedEngine(rt, MODEL, (0,), max_batch_size=BATCH, max_wait_ms=0, fallback=(Placement((1,)),))
    try:
        eng.start()
        first = eng.submit(TEXTS[:2], 8).result(60)
        try:
            rt.device(1).handle.inject_fault("kill")
        except DeviceLostError as e:
            assert "lost" in str(e)
        with pytest.raises(Unavailable, match="no usable placement .*device 1 is lost"):
            eng.fallback()
        assert eng.events[-1]["ok"] is False and eng.error is None and eng.placement == Placement((0,))
        assert np.array_equal(eng.submit(TEXTS[:2], 8).result(60), first)     # same device, same batch
    finally:
        eng.shutdown()
        rt.close()


def test_reconfigure_changes_dynamic_batching_live_with_requests_queued(served, client):
    """``batching.max_batch_size`` / ``max_wait_ms`` / ``max_queued_requests`` change while 8 requests wait
    in the queue: none is dropped, each gets its reference embedding, and they run in batches of the new
    size; a batch above what the engine was built with is refused by name, nothing changed."""
    from runtime.serve.config import ConfigError, parse_config
    from runtime.serve.reconfigure import Reconfigurer
    rt, srv, ref, tol = served
    eng = engine(served)
    text = f"""
models:
  - {{model: {MODEL}@0, fallback: [1, cpu], batching: {{max_batch_size: {BATCH}, max_wait_ms: 2}}}}
tenants:
  - {{name: ops, api_keys: [{ADMIN}], admin: true}}
  - {{name: app, api_keys: [{USER}]}}
"""
    rc = Reconfigurer(srv.service, parse_config(text), text, health_check=False)
    try:
        n0, got = len(eng.batches), {}
        with eng.paused(60):                                  # the requests are queued, none has run
            reqs = threading.Thread(target=lambda: got.setdefault("emb", embed_each(client)))
            reqs.start()
            queued(eng, len(TEXTS))
            res = rc.apply(sets=[f"models.{MODEL}.batching.max_batch_size=2", f"models.{MODEL}.batching.max_wait_ms=0",
                                 f"models.{MODEL}.batching.max_queued_requests=64"])
        reqs.join(120)
        assert res["result"] == "ok" and f"{MODEL} batching: max_batch_size 4 -> 2" in res["changes"][0], res
        check(got["emb"], ref, tol, list(range(len(TEXTS))))
        assert eng.batches[n0:] == [2] * 4                      # every text once, in batches of the new size
        assert (eng.max_batch_size, eng.max_wait_s, eng.max_queued_requests) == (2, 0.0, 64)
        with pytest.raises(ConfigError, match=f"models.{MODEL}: batching.max_batch_size 8 is above the 4 the engine "
                                              f"was built with; that needs a restart"):
            rc.apply(sets=[f"models.{MODEL}.batching.max_batch_size=8"])
        assert eng.max_batch_size == 2
        rc.rollback()
        assert (eng.max_batch_size, eng.max_wait_s) == (BATCH, 0.002)
    finally:
        srv.service.reconfigurer = None
