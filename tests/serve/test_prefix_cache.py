"""Automatic prefix caching (serve tier): full KV blocks cached by content hash and reused across
requests -- the block manager's hashing, reference counts and LRU eviction symbolically; then real SmolLM2
engines (in-process device) on a shared-system-prompt workload: greedy outputs equal to an engine without
the cache, hit counts equal to an independent count of the full blocks each request shares with the tokens
computed before it, namespaces (tenants) that never hit each other, and eviction under memory pressure
that keeps the outputs right."""
from __future__ import annotations

import pytest

from devices.device import DeviceConfig
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.engine import EngineConfig, GenerateEngine, SamplingParams
from runtime.serve.engine.block_manager import BlockManager, block_hashes
from runtime.serve.engine.request import Request
from runtime.serve.engine.scheduler import Scheduler

pytestmark = pytest.mark.serve

BS = 16
SYSTEM = ("You are a careful assistant for an emulated neural processing unit. Answer in one short sentence, "
          "name the kernel that runs, and never invent numbers that the profiler did not report.")
USERS = ("What does rmsnorm do?", "Why is the decode step slow?", "Which stream runs the matmul?",
         "How big is a KV block?", "What is a graph capture?")
OTHER = ("Summarize the following log of an inference server in two bullet points and a verdict on whether "
         "the latency objective was met during the whole window that the log covers.")
THIRD = ("Translate each line into French, keeping technical words such as kernel, stream, block table and "
         "attention in English, and do not add any explanation of your own afterwards.")


# ---------------------------------------------------------------------------------------------- pure logic
def test_block_hashes_chain_parent_tokens_and_salt():
    a = list(range(1, 49))
    h = block_hashes(a, BS)
    assert len(h) == 3 and len(set(h)) == 3 and block_hashes(a[:47], BS) == h[:2]     # only full blocks
    b = [99] + a[1:]                                     # first block differs: every later hash differs too
    assert all(x != y for x, y in zip(h, block_hashes(b, BS)))
    c = a[:20] + [99] + a[21:]                           # second block differs: the first still matches
    hc = block_hashes(c, BS)
    assert hc[0] == h[0] and hc[1] != h[1] and hc[2] != h[2]
    assert all(x != y for x, y in zip(h, block_hashes(a, BS, salt="tenant:x")))
    assert block_hashes(a, BS, start=1, parent=h[0]) == h[1:]                    # resumable chain


def test_block_manager_reuses_refcounts_and_evicts_lru():
    bm = BlockManager(9, 4, enable_caching=True)         # 8 usable blocks
    p = list(range(1, 11))                               # 10 tokens: 2 full blocks + 2
    assert bm.cached_prefix(p) == [] and bm.allocate("a", 10)
    bm.cache_full_blocks("a", p, 10)
    ta = bm.table("a")
    assert bm.cached_prefix(p) == ta[:2] and bm.cached_prefix(p[:8]) == ta[:1]     # the last token is computed
    assert bm.allocate("b", 10, ta[:2]) and bm.table("b")[:2] == ta[:2]
    assert [bm.pool.refs(x) for x in ta] == [2, 2, 1] and bm.pool.num_free == 8 - 4
    bm.free("a")
    assert [bm.pool.refs(x) for x in ta] == [1, 1, 0]
    bm.free("b")
    assert bm.pool.num_free == 8 and bm.pool.usage == 0 and bm.cached_prefix(p) == ta[:2]   # freed, still cached
    # blocks nobody uses are handed out least recently freed first: a's and b's tails (uncached) went to the
    # free queue before b's prefix (freed last block first), so the prefix is evicted last, its tail first
    assert bm.allocate("c", 4 * 4) and bm.allocate("d", 4 * 2) and bm.pool.evictions == 0
    assert bm.cached_prefix(p) == ta[:2]
    assert bm.allocate("e", 4) and bm.pool.evictions == 1 and bm.cached_prefix(p) == ta[:1]
    assert bm.allocate("f", 4) and bm.pool.evictions == 2 and bm.cached_prefix(p) == []
    assert not bm.allocate("g", 4) and "g" not in bm.tables                            # nothing taken on failure


def test_allocate_with_a_cached_prefix_counts_its_idle_blocks():
    bm = BlockManager(4, 4, enable_caching=True)         # 3 usable blocks
    p = list(range(1, 10))
    assert bm.allocate("a", 9)
    bm.cache_full_blocks("a", p, 9)
    bm.free("a")
    pre = bm.cached_prefix(p)
    assert len(pre) == 2
    assert not bm.allocate("b", 16, pre)                 # 2 idle cached + 2 new > 3: refused, nothing changed
    assert bm.pool.num_free == 3 and bm.cached_prefix(p) == pre
    assert bm.allocate("b", 12, pre) and bm.pool.num_free == 0


def test_scheduler_starts_a_request_after_its_cached_prefix():
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=4, max_model_len=64)
    s = Scheduler(cfg, BlockManager(32, 4, enable_caching=True))
    sp = SamplingParams(max_tokens=2, temperature=0)
    a = Request(list(range(1, 14)), sp)
    s.add(a)
    o = s.schedule()
    s.advance(o)
    b = Request(list(range(1, 11)) + [50, 51], sp)      # shares 10 tokens = 2 full blocks of 4
    s.add(b)
    a.output_ids.append(7)
    o = s.schedule()
    assert [(x.request, x.start, x.count) for x in o.scheduled] == [(a, 13, 1), (b, 8, 4)]
    assert s.blocks.table(b.request_id)[:2] == s.blocks.table(a.request_id)[:2]
    assert (s.blocks.queries, s.blocks.hits) == (13 + 12, 8)
    off = Scheduler(cfg, BlockManager(32, 4))                # caching off: the whole prompt again
    c = Request(list(range(1, 14)), sp)
    off.add(c)
    off.advance(off.schedule())
    d = Request(list(range(1, 14)), sp)
    off.add(d)
    assert [(x.start, x.count) for x in off.schedule().scheduled if x.request is d] == [(0, 13)]
    assert off.blocks.hits == 0


# ---------------------------------------------------------------------------------------------- engines
def _engine(rt, dev: int, blocks: int, caching: bool) -> GenerateEngine:
    return GenerateEngine(rt, "smollm2", [dev], EngineConfig(max_num_seqs=4, max_num_batched_tokens=64,
                                                              max_model_len=128, num_gpu_blocks_override=blocks,
                                                              enable_prefix_caching=caching))


@pytest.fixture(scope="module")
def engines():
    rt = Runtime(LocalBackend(3, DeviceConfig(arena_bytes=1 << 30)))
    made = []
    try:
        for dev, blocks, caching in ((0, 64, True), (1, 64, False), (2, 8, True)):
            made.append(_engine(rt, dev, blocks, caching))
        yield made
    finally:
        for e in made:
            e.shutdown()
        rt.close()


def _run(e: GenerateEngine, prompts: list[list[int]], salts=None, together=False, max_tokens=3):
    """Greedy outputs of ``prompts`` (one at a time, or all queued together), driving the engine by hand."""
    salts = salts or [""] * len(prompts)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    outs: list = [None] * len(prompts)
    batches = [list(range(len(prompts)))] if together else [[i] for i in range(len(prompts))]
    for batch in batches:
        hs = {i: e.add_request(prompts[i], sp, cache_salt=salts[i]) for i in batch}
        for _ in range(2000):
            if not e.has_unfinished():
                break
            e.step()
        for i, h in hs.items():
            outs[i] = h.result(timeout=5).token_ids
    return outs


class Reference:
    """Greedy outputs of the engine without the cache (``off``), each prompt run alone: the reference the
    cached engines must equal.  A prompt's run is made once per module and kept -- a solo greedy run on one
    engine is deterministic, and its first k tokens are those of the same run asked for k -- so a prompt
    the tests share is not computed again."""

    def __init__(self, off: GenerateEngine):
        self.off = off
        self.runs: dict[tuple[int, ...], list[int]] = {}

    def __call__(self, prompts: list[list[int]], max_tokens: int = 3) -> list[list[int]]:
        todo = [p for p in prompts if len(self.runs.get(tuple(p), ())) < max_tokens]
        for p, out in zip(todo, _run(self.off, todo, max_tokens=max_tokens)):
            self.runs[tuple(p)] = out
        return [self.runs[tuple(p)][:max_tokens] for p in prompts]


@pytest.fixture(scope="module")
def reference(engines):
    return Reference(engines[1])


def _prompts(e, system: str, users=USERS) -> list[list[int]]:
    sys_ids = e.tok.encode(system)
    return [sys_ids + e.tok.encode(" " + u) for u in users]


def _expected_hits(prompts: list[list[int]], outs: list[list[int]]) -> int:
    """Independent count (no hashing): each request, run alone after the earlier ones, reuses the full
    blocks of its longest common prefix with any earlier request's computed tokens (prompt + all outputs
    but the last, whose keys were never computed), leaving its own last prompt token to compute."""
    seen: list[list[int]] = []
    total = 0
    for p, o in zip(prompts, outs):
        best = 0
        for q in seen:
            k = 0
            while k < min(len(p), len(q)) and p[k] == q[k]:
                k += 1
            best = max(best, k)
        total += min(best, len(p) - 1) // BS * BS
        seen.append(p + o[:-1])
    return total


def test_shared_system_prompt_same_outputs_and_predicted_hits(engines, reference):
    on, off, _ = engines
    prompts = _prompts(on, SYSTEM, USERS[:4])
    assert len(on.tok.encode(SYSTEM)) >= 2 * BS
    q0, h0 = on.blocks.queries, on.blocks.hits
    got = _run(on, prompts)
    want = reference(prompts)
    assert got == want
    hits = on.blocks.hits - h0
    assert hits == _expected_hits(prompts, got) and hits >= (len(prompts) - 1) * 2 * BS
    assert on.blocks.queries - q0 == sum(len(p) for p in prompts)
    snap = on.snapshot()
    assert snap.prefix_cache_hits == on.blocks.hits and snap.prefix_cached_blocks > 0
    assert off.blocks.hits == 0 and off.blocks.queries == 0 and off.snapshot().prefix_cached_blocks == 0
    # the same workload queued all at once (a warm cache: every request reuses the system prompt)
    h1 = on.blocks.hits
    assert _run(on, prompts, together=True) == want
    assert on.blocks.hits - h1 == sum(min(len(on.tok.encode(SYSTEM)), len(p) - 1) // BS * BS for p in prompts)


def test_namespaces_never_hit_each_other(engines, reference):
    on, off, _ = engines
    p = _prompts(on, OTHER, USERS[:1])[0]
    full = (len(p) - 1) // BS * BS
    h = on.blocks.hits
    a = _run(on, [p], ["tenant:a"])
    assert on.blocks.hits == h                                           # first sight
    b = _run(on, [p], ["tenant:b"])
    assert on.blocks.hits == h                                           # another tenant: computed again
    a2 = _run(on, [p], ["tenant:a"])
    assert on.blocks.hits == h + full                                    # its own blocks: reused
    s1 = _run(on, [p], [""])
    assert on.blocks.hits == h + full                                    # the shared namespace is separate too
    s2 = _run(on, [p], [""])
    assert on.blocks.hits == h + 2 * full
    assert a == b == a2 == s1 == s2 == reference([p])


def test_lru_eviction_under_memory_pressure_keeps_outputs(engines, reference):
    _, off, small = engines                              # 7 usable blocks: a request takes 3
    a0, a1, b0, b1, c0, c1 = [q for s in (SYSTEM, OTHER, THIRD) for q in _prompts(small, s, USERS[:2])]
    order = [a0, b0, c0, a1, b1, c1]
    pool = small.blocks.pool
    ev0, h0 = pool.evictions, small.blocks.hits
    got = _run(small, order)
    assert pool.evictions > ev0                          # c0 needed a's blocks: a1 finds only what is left
    assert 0 < small.blocks.hits - h0 < 3 * 2 * BS
    assert got == reference(order)
    assert pool.num_free == pool.num_blocks - 1          # nothing leaked: every block back in the free queue
    assert _run(small, order[:2], together=True) == got[:2]
