"""Async scheduling (serve tier): the engine thread queues step n+1 behind step n on the device and samples
greedy requests there (``EngineConfig.async_scheduling``, :mod:`runtime.serve.engine.overlap`).

A real SmolLM2 engine on an in-process device serves the same workloads from its engine thread with async
scheduling on and off (switched live between the runs, as ``vnpu serve reconfigure`` does; prefix caching
off so both runs compute the same rows): the greedy (and seeded) outputs are token for token the same -- with stop strings that end a request while its next step is already queued, an abort arriving
between two steps, and host-sampled requests mixed in --, and the profiler's device trace (what ``vnpu
prof`` records) shows the difference: without async scheduling every decode step reaches the device only
after the one before it ended (the device waited for the host each time); with it, none does (each was
queued while the one before it still ran).  Orderings of recorded events, never durations."""
from __future__ import annotations

import dataclasses

import pytest

from devices.device import DeviceConfig
from runtime import profiler
from runtime.api import Runtime
from runtime.backend import LocalBackend
from runtime.serve.config import ConfigError, parse_config
from runtime.serve.engine import EngineConfig, GenerateEngine, SamplingParams
from runtime.serve.engine.block_manager import BlockManager
from runtime.serve.engine.request import Request
from runtime.serve.engine.scheduler import Scheduler

pytestmark = pytest.mark.serve

WORDS = ("the kernel runs on a stream and the device reads its block table before attention over the cache "
         "of every layer then the host samples the next token").split()


def prompt(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n))


def test_the_scheduler_counts_a_pending_token_as_the_next_one():
    """A request whose next token a step on the device still samples (``pending``) is scheduled for that
    token (fed on the device) and samples after it; one with nothing to compute is not scheduled at all;
    a waiting request with a pending token is not admitted until its token is known."""
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, block_size=4, max_model_len=64)
    s = Scheduler(cfg, BlockManager(32, 4))
    a, b = (Request(list(range(1, 6)), SamplingParams(max_tokens=8, temperature=0)) for _ in range(2))
    s.add(a)
    s.add(b)
    o = s.schedule()
    s.advance(o)                                           # both prompts computed, their first tokens pending
    a.pending = 1                                          # a continues, b stops at its token (not looked ahead)
    o = s.schedule()
    assert [(x.request, x.start, x.count, x.samples) for x in o.scheduled] == [(a, 5, 1, True)]
    assert o.is_decode and len(s.blocks.table(a.request_id)) == 2      # position 5 needs a's second block
    a.output_ids.append(9)
    a.pending = 0
    s.advance(o)
    assert a.num_computed == a.num_tokens == 6
    assert s.take_all() == [a, b]                          # (as a re-bind or preemption leaves them) queued again
    a.pending = 1
    for r in (a, b):
        s.add(r)
    assert s.schedule().scheduled == [] and list(s.waiting) == [a, b]  # a first: its token is not known yet
    a.output_ids.append(9)
    a.pending = 0
    assert [(x.request, x.start, x.count) for x in s.schedule().scheduled] == [(a, 0, 7), (b, 0, 5)]


@pytest.fixture(scope="module")
def engine():
    rt = Runtime(LocalBackend(1, DeviceConfig(arena_bytes=1 << 30)))
    e = None
    try:
        e = GenerateEngine(rt, "smollm2", [0], EngineConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=160,
                                                            enable_prefix_caching=False))
        e.start()
        yield rt, e
    finally:
        if e is not None:
            e.shutdown()
        rt.close()


def switch(engine, on: bool) -> None:
    engine.set_limits(dataclasses.replace(engine.config, async_scheduling=on))
    assert engine.wait_idle(60) and engine.config.async_scheduling is on


def serve(engine, reqs, abort_after: dict[int, int] | None = None) -> list:
    """Queue every request while the engine is held between two steps (the same first batch for both
    engines), then let its thread run them; ``abort_after[i] = k``: request i is aborted (from the engine
    thread, between two steps) once its k-th token was handed out."""
    abort_after = abort_after or {}
    handles: list = []

    def watch(i):
        def on_output(o):
            if i in abort_after and o.completion_tokens == abort_after[i] and o.token_ids:
                engine.abort(handles[i].request_id)
        return on_output
    with engine.paused(timeout=60):
        for i, (ids, sp) in enumerate(reqs):
            handles.append(engine.add_request(ids, sp, on_output=watch(i)))
    assert engine.wait_idle(300)
    return [h.result(0) for h in handles]


def runs(e, reqs, **kw) -> dict:
    """The workload's outputs with async scheduling off and on, and the steps queued ahead in each run."""
    outs = {}
    for on in (False, True):
        switch(e, on)
        s0 = e.snapshot()
        outs[on] = serve(e, reqs, **kw)
        s1 = e.snapshot()
        outs[on, "steps"] = (s1.steps - s0.steps, s1.overlapped_steps - s0.overlapped_steps)
    return outs


def test_greedy_outputs_are_the_same_with_async_scheduling_on_and_off(engine):
    _, e = engine
    greedy = [SamplingParams(max_tokens=6 + 2 * i, temperature=0, ignore_eos=True) for i in range(5)]
    reqs = [(e.encode(prompt(i, 4 + 6 * i)), sp) for i, sp in enumerate(greedy)]
    # a stop string found in request 0's own greedy text: it stops while its next step is already queued
    switch(e, False)
    solo0 = serve(e, reqs[:1])[0]
    stop = solo0.text[len(solo0.text) // 2:][:3]
    assert stop.strip() and solo0.text.index(stop) > 0
    reqs.append((reqs[0][0], SamplingParams(max_tokens=20, temperature=0, stop=(stop,))))
    reqs.append((e.encode(prompt(9, 12)), SamplingParams(max_tokens=10, temperature=0.8, seed=7)))  # host-sampled
    reqs.append((e.encode(prompt(3, 9)), SamplingParams(max_tokens=7, temperature=0, logprobs=2)))  # host-sampled
    reqs.append((e.encode(prompt(5, 7)), SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)))  # aborted
    outs = runs(e, reqs, abort_after={8: 4})
    for k, (a, b) in enumerate(zip(outs[False], outs[True])):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason), f"request {k}"
    assert [len(o.token_ids) for o in outs[True][:5]] == [sp.max_tokens for sp in greedy]
    stopped = outs[True][5]
    assert stopped.finish_reason == "stop" and stop not in stopped.text and len(stopped.token_ids) < 20
    assert stopped.text == solo0.text[:solo0.text.index(stop)]
    assert outs[True][8].finish_reason == "abort" and 4 <= len(outs[True][8].token_ids) < 14
    assert [t.token_id for t in outs[True][7].logprobs] == outs[True][7].token_ids
    # a step is queued ahead only behind a step whose sampled requests are all greedy: some here are not
    assert outs[True, "steps"][1] > 0 and outs[False, "steps"][1] == 0
    s = e.snapshot()
    assert s.running == s.waiting == 0 and s.free_blocks == s.num_blocks - 1      # nothing leaked


def waited(raw, device: int) -> tuple[int, int]:
    """(decode steps that reached the device only after the one before them had ended, decode steps) in a
    profile: graph replays (``model_ri``) of the device in start order; a step 'waited' when its task was
    enqueued after the previous replay's end -- the device had nothing queued and waited for the host."""
    tasks = [t for d in raw.devices if d["index"] == device for t in d["tasks"] if t["name"] == "model_ri"]
    tasks.sort(key=lambda t: t["start"])
    return sum(b["enqueued"] > a["end"] for a, b in zip(tasks, tasks[1:])), len(tasks)


def test_the_device_trace_of_a_served_decode_has_no_step_waiting_for_the_host(engine):
    rt, e = engine
    counts, tokens = {}, {}
    reqs = [(e.encode(prompt(i, 10 + 4 * i)), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
            for i in range(4)]
    for on in (False, True):
        switch(e, on)
        s0 = e.snapshot()
        with profiler.recording(runtime=rt) as p:
            outs = serve(e, reqs)
        assert all(len(o.token_ids) == 8 for o in outs)
        counts[on] = waited(p.raw, 0)
        steps, over = e.snapshot().steps - s0.steps, e.snapshot().overlapped_steps - s0.overlapped_steps
        assert counts[on][1] == 7 and steps == 8           # one prefill step, 7 decode steps (graph replays)
        assert over == (steps - 1 if on else 0)            # every step after the first was queued ahead
        tokens[on] = [o.token_ids for o in outs]
    assert counts[False] == (6, 7)                         # each decode step waited for the host ...
    assert counts[True] == (0, 7)                          # ... none with async scheduling
    assert tokens[True] == tokens[False]


def test_async_scheduling_config_key():
    assert parse_config("models: [smollm2]\n").models[0].engine.async_scheduling is True
    cfg = parse_config("models:\n  - model: smollm2\n    engine: {async_scheduling: false}\n")
    assert cfg.models[0].engine.async_scheduling is False
    with pytest.raises(ConfigError, match="line 3: models\\[0\\].engine.async_scheduling"):
        parse_config("models:\n  - model: smollm2\n    engine: {async_scheduling: sometimes}\n")
