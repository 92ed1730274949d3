"""The serving engines without HTTP (serve tier): continuous batching over a paged KV cache against
the same requests served alone, preemption and resumption, cancellation, seeded sampling, dynamic
batching of embeddings against EmbedJob, HBM back to baseline, constant graph captures; and the pure
scheduler / block-manager logic symbolically.

Float tolerance of "batched equals solo": a batched step computes the same math as a solo one with
different float32 accumulation orders (gemm over 16 rows vs gemv, attention over gathered blocks).
Rounding errors of a length-K float32 reduction grow like sqrt(K)*u (u = 2^-24) relative to the sum of
magnitudes; over the whole forward the longest chain is n_layers reductions of d_ff terms, so the
logit error is taken as tol = 8 * sqrt(n_layers * d_ff) * u * max|logit| (8: two runs, each with error
up to ~4 standard deviations).  Where the batched run picks another token than the solo run, the solo
run's top-2 logprob gap at that step must be below tol (a near tie); that request's comparison stops
there and the case is counted and reported."""
from __future__ import annotations

import numpy as np
import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.engine import EmbedEngine, EngineConfig, GenerateEngine, InvalidRequest, QueueFull, SamplingParams
from runtime.serve.engine.block_manager import BlockManager
from runtime.serve.engine.request import Request
from runtime.serve.engine.scheduler import Scheduler

pytestmark = pytest.mark.serve

U32 = 2.0 ** -24
WORDS = ("the npu runs matrix kernels on cube units while vector cores do norms and softmax quickly across "
         "many small streams of tokens in a busy serving system").split()


def prompt(i: int, n: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))


# ---------------------------------------------------------------------------------------------- pure logic
def _req(n_prompt: int, max_tokens: int, t: float) -> Request:
    return Request(list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens, temperature=0), arrival=t)


def test_scheduler_budget_chunks_and_limits():
    cfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=8, block_size=4, max_model_len=64)
    s = Scheduler(cfg, BlockManager(64, 4))
    a, b, c = _req(10, 3, 0.0), _req(3, 3, 1.0), _req(2, 3, 2.0)
    for r in (a, b, c):
        s.add(r)
    o = s.schedule()                                       # a's first chunk takes the whole budget
    assert [(x.request, x.start, x.count) for x in o.scheduled] == [(a, 0, 8)] and not o.scheduled[0].samples
    s.advance(o)
    o = s.schedule()                                       # a's rest (2) + b's prompt (3); c waits: 2 seqs max
    assert [(x.request, x.start, x.count) for x in o.scheduled] == [(a, 8, 2), (b, 0, 3)]
    assert all(x.samples for x in o.scheduled) and not o.is_decode and list(s.waiting) == [c]
    s.advance(o)
    for r in (a, b):
        r.output_ids.append(7)
    o = s.schedule()
    assert o.is_decode and [(x.request, x.count) for x in o.scheduled] == [(a, 1), (b, 1)]
    assert s.blocks.table(a.request_id) and len(s.blocks.table(a.request_id)) == 3      # 11 tokens / 4


def test_scheduler_preempts_newest_and_recomputes():
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=4, max_model_len=64)
    bm = BlockManager(5, 4)                                 # 4 usable blocks = 16 tokens
    s = Scheduler(cfg, bm)
    old, new = _req(8, 8, 0.0), _req(7, 8, 1.0)
    s.add(old), s.add(new)
    o = s.schedule()
    assert [x.request for x in o.scheduled] == [old, new] and bm.pool.num_free == 0
    s.advance(o)
    old.output_ids.append(5), new.output_ids.append(5)
    o = s.schedule()                                       # old's 9th token needs a block: new is preempted
    assert o.preempted == [new] and [x.request for x in o.scheduled] == [old]
    assert new.num_computed == 0 and list(s.waiting) == [new] and new.num_preemptions == 1
    assert s.num_preemptions == 1 and len(bm.table(new.request_id)) == 0
    s.remove(old)                                          # old finishes: new comes back with prompt + output
    o = s.schedule()
    assert [(x.request, x.start, x.count) for x in o.scheduled] == [(new, 0, 8)] and o.scheduled[0].samples


def test_block_manager_null_block_and_usage():
    bm = BlockManager(5, 4)
    assert bm.capacity_tokens == 16 and bm.pool.usage == 0.0
    assert bm.allocate("a", 5) and bm.table("a") == [1, 2] and bm.slot("a", 5) == 2 * 4 + 1
    assert not bm.allocate("b", 9) and "b" not in bm.tables and bm.pool.num_free == 2     # nothing taken
    assert bm.pool.usage == 0.5
    assert bm.free("a") == 2 and bm.pool.num_free == 4 and 0 not in bm.pool._free


def test_top_logprobs_are_the_first_of_a_stable_full_sort():
    """The sampler's top-k (a partition, then a sort of what is at or above the k-th value) names the
    tokens a stable descending sort of the whole row names first: ties in index order, NaN last."""
    from runtime.serve.engine.sampling import top_indices
    rng = np.random.default_rng(0)
    for t in range(200):
        n = int(rng.integers(1, 100))
        z = rng.standard_normal(n) if t % 2 else rng.integers(-4, 4, n).astype(np.float64)   # many ties
        for v in (np.nan, np.inf, -np.inf, -0.0)[:t % 5]:
            z[rng.integers(0, n, 2)] = v
        for k in (0, 1, 2, 5, 20, n, n + 1):
            assert top_indices(z, k).tolist() == np.argsort(-z, kind="stable")[:k].tolist(), (z, k)


# ---------------------------------------------------------------------------------------------- devices
@pytest.fixture(scope="module")
def rt():
    r = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=1 << 30)))
    yield r
    r.close()


@pytest.fixture(scope="module")
def engine(rt):
    e = GenerateEngine(rt, "smollm2", [0], EngineConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=160))
    yield e
    e.shutdown()


def run_until_done(engine, joins: dict[int, list] | None = None, limit: int = 500):
    """Step the engine; ``joins[step]`` = (prompt_ids, params) added before that step."""
    handles = []
    for step in range(limit):
        for ids, params in (joins or {}).get(step, []):
            handles.append(engine.add_request(ids, params))
        if not engine.has_unfinished() and step > max((joins or {0: 0}).keys()):
            return handles
        engine.step()
    raise AssertionError("engine did not finish")


def solo(engine, ids, params):
    return run_until_done(engine, {0: [(ids, params)]})[0].result(0)


def compare(solo_out, batch_out, tol):
    """Tokens equal, except from a step where the solo run's top-2 gap is under ``tol`` (excused: 1)."""
    for k, (a, b) in enumerate(zip(solo_out.token_ids, batch_out.token_ids)):
        if a != b:
            gap = solo_out.logprobs[k].top[0][1] - solo_out.logprobs[k].top[1][1]
            assert gap < tol, f"token {k}: solo {a} vs batched {b} with a top-2 gap of {gap:.2e} >= {tol:.2e}"
            return 1
    assert len(solo_out.token_ids) == len(batch_out.token_ids)
    return 0


def tolerance(engine, outs) -> float:
    c = engine.model_config
    return 8 * np.sqrt(c.n_layers * c.d_ff) * U32 * 30.0      # |logit| of SmolLM2 stays under ~30


def test_16_concurrent_requests_equal_solo_runs(engine):
    specs = [(prompt(i, 3 + 9 * (i % 8)), 3 + (i * 5) % 9) for i in range(16)]   # 3..66 words, 3..11 tokens
    reqs = [(engine.encode(p), SamplingParams(max_tokens=m, temperature=0, logprobs=2, ignore_eos=True))
            for p, m in specs]
    assert max(len(x) for x, _ in reqs) > 64                # some prompts take two prefill chunks
    solos = [solo(engine, ids, sp) for ids, sp in reqs]
    captures = engine.snapshot().captures
    joins: dict[int, list] = {}
    for i, r in enumerate(reqs):                            # joining at different steps
        joins.setdefault(i // 3, []).append(r)
    steps0 = engine.steps
    handles = run_until_done(engine, joins)
    batch = [h.result(0) for h in handles]
    tol = tolerance(engine, solos)
    excused = sum(compare(s, b, tol) for s, b in zip(solos, batch))
    diffs = [abs(s.logprobs[0].logprob - b.logprobs[0].logprob) for s, b in zip(solos, batch)]
    print(f"\n16 concurrent vs solo: {excused} request(s) excused by a top-2 gap < {tol:.3g}; max |dlogprob| of "
          f"the first token {max(diffs):.2e}; {engine.steps - steps0} steps for "
          f"{sum(len(b.token_ids) for b in batch)} tokens")
    assert all(len(b.token_ids) == sp.max_tokens for b, (_, sp) in zip(batch, reqs))
    assert excused <= 2
    assert engine.steps - steps0 < sum(sp.max_tokens for _, sp in reqs) / 2      # batched, not one by one
    s = engine.snapshot()
    assert s.captures == captures == len(engine.config.decode_buckets) == s.graphs   # no capture while serving
    assert s.free_blocks == s.num_blocks - 1 and s.running == 0


def test_seeded_sampling_is_reproducible(engine):
    def run(seeds):
        ps = [(engine.encode(prompt(i, 6)), SamplingParams(max_tokens=6, temperature=1.2, top_p=0.95, seed=s,
                                                           ignore_eos=True)) for i, s in enumerate(seeds)]
        return [h.result(0).token_ids for h in run_until_done(engine, {0: ps})]

    a, b = run([1, 2, 3]), run([1, 2, 3])
    assert a == b
    c = run([11, 12, 13])
    assert c != a


def test_abort_frees_kv_blocks(engine):
    h = engine.add_request(engine.encode(prompt(0, 30)), SamplingParams(max_tokens=100, temperature=0))
    for _ in range(3):
        engine.step()
    assert engine.snapshot().free_blocks < engine.snapshot().num_blocks - 1
    engine.abort(h.request_id)
    engine.step()
    out = h.result(0)
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 100
    s = engine.snapshot()
    assert s.free_blocks == s.num_blocks - 1 and not engine.has_unfinished()


def test_stop_strings_are_cut_and_held_back(engine):
    ids = engine.encode("1, 2, 3, 4,")
    full = solo(engine, ids, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert ", 7," in full.text
    stop = ", 7,"
    h = engine.add_request(ids, SamplingParams(max_tokens=12, temperature=0, stop=(stop,)))
    while engine.has_unfinished():
        engine.step()
    parts = [o.text for o in h.outputs(0)]
    assert "".join(parts) == full.text[:full.text.index(stop)]
    assert all(stop not in p for p in parts) and h.result(0).finish_reason == "stop"


def test_bad_requests_are_refused(engine):
    ml = engine.config.max_model_len
    with pytest.raises(InvalidRequest) as e:
        engine.add_request(list(range(1, ml + 1)), SamplingParams(max_tokens=1))
    assert e.value.param == "prompt" and e.value.code == "context_length_exceeded"
    with pytest.raises(InvalidRequest) as e:
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=ml))
    assert e.value.param == "max_tokens"
    with pytest.raises(InvalidRequest):
        engine.encode([1, 10 ** 6])
    assert not engine.has_unfinished()


def test_preemption_resumes_and_matches_solo(rt):
    d = rt.device(1)
    base = d.mem_info()
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=8, max_model_len=64,
                       num_gpu_blocks_override=7, max_queued_requests=3)   # 6 usable blocks = 48 tokens
    e = GenerateEngine(rt, "smollm2", [1], cfg)
    try:
        reqs = [(e.encode(prompt(i, 8 + 3 * i)), SamplingParams(max_tokens=10, temperature=0, logprobs=2,
                                                                 ignore_eos=True)) for i in range(3)]
        solos = [solo(e, ids, sp) for ids, sp in reqs]
        with pytest.raises(InvalidRequest) as ex:               # more than the whole cache
            e.add_request(list(range(1, 40)), SamplingParams(max_tokens=24))
        assert ex.value.code == "kv_cache_exceeded"
        handles = run_until_done(e, {0: reqs})
        batch = [h.result(0) for h in handles]
        s = e.snapshot()
        assert s.num_preemptions > 0                            # 3 x ~25 tokens do not fit 48
        excused = sum(compare(a, b, tolerance(e, solos)) for a, b in zip(solos, batch))
        print(f"\npreemption: {s.num_preemptions} preemption(s), {excused} request(s) excused")
        assert excused <= 1 and s.free_blocks == s.num_blocks - 1
        for _ in range(3):                                      # admission control: a bounded queue
            e.add_request([1, 2, 3], SamplingParams(max_tokens=1))
        with pytest.raises(QueueFull):
            e.add_request([1, 2, 3], SamplingParams(max_tokens=1))
    finally:
        e.shutdown()
    assert d.mem_info() == base                                 # HBM back to baseline


def test_embeddings_dynamic_batching_equal_embed_job(rt):
    from runtime.models import EmbedJob
    texts = [prompt(i, 2 + 3 * i) for i in range(7)]
    e = EmbedEngine(rt, "minilm-l6", [2], max_batch_size=4, max_wait_ms=1000.0)
    try:
        reqs = [texts[0:1], texts[1:3], texts[3:4], texts[4:7]]
        futs = [e.submit(t, sum(e.check(t))) for t in reqs]    # queued before the loop runs
        e.start()
        got = np.concatenate([f.result(60) for f in futs])
        assert e.batches == [4, 3]                              # 1+2+1 texts, then 3: max_batch_size=4
    finally:
        e.shutdown()
    job = EmbedJob(rt, "minilm-l6", devices=[2])
    try:
        want = np.stack([job.embed([t])[0] for t in texts])
    finally:
        job.close()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    with pytest.raises(InvalidRequest):
        e.check(["ok", ""])


def test_tensor_parallel_engine_equals_one_device(engine):
    """--tp 3: heads, FFN and vocabulary over 3 devices (HCCL all-reduces inside the captured decode graphs),
    each device holding the KV cache of its KV head; greedy tokens equal the one-device engine's."""
    rt3 = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=512 << 20)))
    try:
        base = [d.mem_info() for d in rt3.devices()]
        e = GenerateEngine(rt3, "smollm2", [0, 1, 2], EngineConfig(max_num_seqs=2, max_num_batched_tokens=32,
                                                                    max_model_len=64, num_gpu_blocks_override=16))
        try:
            reqs = [(e.encode(prompt(i, 4 + 5 * i)), SamplingParams(max_tokens=5, temperature=0, logprobs=2,
                                                                    ignore_eos=True)) for i in range(2)]
            tp = [h.result(0) for h in run_until_done(e, {0: reqs})]
            assert e.snapshot().graphs == 3 * len(e.config.decode_buckets)
        finally:
            e.shutdown()
        assert [d.mem_info() for d in rt3.devices()] == base
    finally:
        rt3.close()
    one = [solo(engine, ids, sp) for ids, sp in reqs]
    assert sum(compare(a, b, tolerance(engine, one)) for a, b in zip(one, tp)) <= 1


# ---------------------------------------------------------------------------------------------- the caching pool
def test_engine_survives_a_live_defragmentation():
    """The engine's weights and KV region (long-lived) and activations (short-lived) come from the pool.
    While requests run on the engine thread, ``paused()`` holds it between two steps and a defragmentation
    moves all of that memory (fillers below and above freed, the upper one large enough for the
    weights), re-binds the captured decode graphs in place and the KV cache's descriptors follow: the
    requests finish with the tokens and logprobs of an undisturbed run."""
    r = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1536 << 20)))
    try:
        d = r.device(0)
        lo = d.empty((16 << 20,), "uint8")                           # free space below the activations ...
        hi = d.empty((600 << 20,), "uint8", lifetime="long")         # ... and above the weights, once freed
        e = GenerateEngine(r, "smollm2", [0], EngineConfig(max_num_seqs=2, max_num_batched_tokens=32,
                                                            max_model_len=64, num_gpu_blocks_override=16))
        try:
            reqs = [(e.encode(prompt(i, 4 + 5 * i)), SamplingParams(max_tokens=12, temperature=0, logprobs=2,
                                                                    ignore_eos=True)) for i in range(2)]
            first = [h.result(0) for h in run_until_done(e, {0: reqs})]
            graphs, captures = e.snapshot().graphs, e.snapshot().captures
            assert graphs >= 1
            s0 = e.snapshot().steps
            handles = [e.add_request(ids, sp) for ids, sp in reqs]   # both in the first step, as above:
            e.start()                                                # the same batches, bit-identical results
            assert e.wait_until(lambda s: s.steps >= s0 + 2, 120)   # prefill done, decoding
            with e.paused(60):
                running = e.snapshot().running
                live = {b["address"]: s["lifetime"] for s in d.memory_snapshot() for b in s["blocks"]
                        if b["state"] == "active_allocated"}
                lo.free()
                hi.free()
                rep = d.defragment()
            assert running == 2                                       # mid-request (10 steps of margin)
            moved = [live[old] for old, _, _ in rep.moves]
            assert moved.count("long") >= 2 and "short" in moved     # weights, KV region, activations
            assert rep.bytes_moved > (400 << 20) and rep.graphs_rebound == graphs
            assert rep.arena_fragmentation_after == 0.0
            again = [h.result(120) for h in handles]
            assert (e.snapshot().graphs, e.snapshot().captures) == (graphs, captures)   # replayed, not recaptured
            for a, b in zip(first, again):
                assert a.token_ids == b.token_ids
                assert [x.top for x in a.logprobs] == [x.top for x in b.logprobs]
        finally:
            e.shutdown()
            lo.free()                                                # no-ops when already freed
            hi.free()
        d.empty_cache()
        assert d.mem_info()[0] == d.mem_info()[1]
    finally:
        r.close()


def test_a_requested_fallback_with_nowhere_to_go_keeps_serving_where_it_was():
    """An admin (or self-healing) fallback when the rest of the chain is unusable (its device lost) is
    refused -- and the engine builds again where it was, replays the request in flight there, and keeps
    serving: that request finishes whole, with the tokens of an undisturbed run."""
    import contextlib

    from devices.errors import DeviceLostError
    from runtime.serve.engine import Unavailable
    from runtime.serve.engine.placement import Placement
    r = Runtime(LocalBackend(2, DeviceConfig(arena_bytes=1 << 30)))
    e = None
    try:
        e = GenerateEngine(r, "smollm2", [0], EngineConfig(max_num_seqs=2, max_num_batched_tokens=32, max_model_len=48,
                                                           num_gpu_blocks_override=8),
                           fallback=(Placement((1,)),))
        ids = e.encode("Once upon a time")
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
        ref = solo(e, ids, params)
        h = e.add_request(ids, params)
        e.step()
        e.step()
        assert e.has_unfinished() and not h.done                  # in flight
        with contextlib.suppress(DeviceLostError):
            r.device(1).handle.inject_fault("kill")               # the only fallback entry is gone
        with pytest.raises(Unavailable, match="no usable placement"):
            e.fallback()
        assert e.placement == Placement((0,)) and e.error is None and e.events[-1]["ok"] is False
        run_until_done(e)
        assert h.result(0).token_ids == ref.token_ids             # finished whole where it was
        assert solo(e, ids, params).token_ids == ref.token_ids    # and the engine keeps serving
    finally:
        if e is not None:
            e.shutdown()
        r.close()
