"""Correct programs report nothing under ``vnpu sanitize`` (every tool on): the MiniLM and SmolLM2 jobs
on 1 and 3 devices (data, tensor and pipeline parallel; decode steps as graph replays and as eager
launches), and the serving engine under load (concurrent requests joining a running batch, decode graphs
replayed per bucket).  The sanitizer is also transparent: the jobs produce exactly what they produce
without it.  (The 3-device jobs on device actors over gRPC: ``test_sanitize.py``, with its cluster.)

Each check also asserts that the session really watched the work (device tasks and graph replays
checked), so "nothing found" cannot come from nothing seen.
"""
from __future__ import annotations

import contextlib
import io
import threading

import numpy as np
import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.models import EmbedJob, GenerateJob
from runtime.sanitize import SanitizeOptions, Session

ARENA = 1 << 30
SENTENCES = ["an NPU runs matrix kernels on cube units", "hello world", "vector cores do norms and softmax",
             "the quick brown fox jumps over the lazy dog", "streams and events order the work"]


@contextlib.contextmanager
def sanitized_runtime(make_backend):
    s = Session(SanitizeOptions(), out=io.StringIO())
    rt = Runtime(make_backend(), sanitizer=s)
    try:
        yield rt, s
    finally:
        rt.close()
        s.finish()


def local(n):
    return lambda: LocalBackend(n, DeviceConfig(arena_bytes=ARENA))


def assert_clean(s: Session, min_tasks: int, min_replays: int = 0):
    assert [f.message for f in s.findings] == []
    c = s.counts()
    assert c["tasks"] >= min_tasks and c["replays"] >= min_replays, c


def embed(rt, n, parallel):
    job = EmbedJob(rt, "minilm-l6", devices=n, parallel=parallel, batch_size=2)
    try:
        return job.embed(SENTENCES)
    finally:
        job.close()


def generate(rt, n, parallel, graphs=True, tokens=4):
    job = GenerateJob(rt, "smollm2", devices=n, parallel=parallel, max_len=128, graphs=graphs)
    try:
        return [g.token_ids for g in job.generate(["What is an NPU?", "Name three colors."], max_new_tokens=tokens,
                                                  stop_at_eos=False)]
    finally:
        job.close()


@pytest.fixture(scope="module")
def plain():
    """What the jobs produce without a sanitizer (in-process)."""
    with contextlib.closing(Runtime(LocalBackend(3, DeviceConfig(arena_bytes=ARENA)))) as rt:
        yield {"embed": embed(rt, 1, "dp"), "generate": generate(rt, 1, "none")}


# ---------------------------------------------------------------------------------------------- jobs, in-process
def test_minilm_on_1_and_3_devices(plain):
    for n, parallel in ((1, "dp"), (3, "dp"), (3, "tp")):
        with sanitized_runtime(local(n)) as (rt, s):
            out = embed(rt, n, parallel)
        assert_clean(s, min_tasks=40 * n if parallel == "tp" else 40)
        np.testing.assert_allclose(out, plain["embed"], rtol=2e-5, atol=2e-6)   # tp reduces in another order


def test_smollm2_on_1_device_graphs_and_eager(plain):
    with sanitized_runtime(local(1)) as (rt, s):
        out = generate(rt, 1, "none")
        eager = generate(rt, 1, "none", graphs=False)
    assert_clean(s, min_tasks=600, min_replays=2)
    assert out == plain["generate"] == eager                # the sanitizer changes nothing


@pytest.mark.parametrize("parallel", ["tp", "pp"])
def test_smollm2_on_3_devices(plain, parallel):
    with sanitized_runtime(local(3)) as (rt, s):
        out = generate(rt, 3, parallel)
    assert_clean(s, min_tasks=300, min_replays=2)
    assert out == plain["generate"]


# ---------------------------------------------------------------------------------------------- serving engine
@pytest.mark.serve
def test_serving_engine_under_load_reports_nothing():
    """12 requests from 4 client threads against a running engine (continuous batching over the paged KV
    cache, decode graphs per batch bucket)."""
    from runtime.serve.engine import EngineConfig, GenerateEngine, SamplingParams
    with sanitized_runtime(local(1)) as (rt, s):
        e = GenerateEngine(rt, "smollm2", [0], EngineConfig(max_num_seqs=8, max_num_batched_tokens=64,
                                                             max_model_len=128))
        e.start()
        results, errors = [], []
        try:
            def client(k):
                try:
                    for i in range(3):
                        h = e.add_request(e.encode(f"request {k}-{i}: tell me about streams"),
                                          SamplingParams(max_tokens=4 + (k + i) % 4, temperature=0, ignore_eos=True))
                        results.append(h)
                except Exception as err:  # noqa: BLE001 - reported below
                    errors.append(err)
            ts = [threading.Thread(target=client, args=(k,)) for k in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            outs = [h.result(120) for h in results]
        finally:
            e.shutdown()
        assert not errors and len(outs) == 12 and all(len(o.token_ids) >= 4 for o in outs)
    assert_clean(s, min_tasks=100, min_replays=5)
