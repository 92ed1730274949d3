"""The serve benchmark's workload: prompts of the requested token lengths (``--prompt-tokens``) as a tokenizer
counts them; the CLI's range type.  The tokenizer here splits words into pieces of up to 4 characters
(a word is one or more tokens, as with BPE): loading SmolLM2's own takes its whole GGUF, ~10-30 s cold."""
from __future__ import annotations

import argparse

import pytest

from runtime.bench.serve_workload import sized_prompts
from runtime.cliargs import int_range


class Pieces:
    """Each word -> ceil(len / 4) tokens."""

    @staticmethod
    def encode(text: str) -> list[int]:
        return [0] * sum(-(-len(w) // 4) for w in text.split())


def test_sized_prompts_span_the_requested_token_range():
    tok = Pieces()
    ps = sized_prompts(tok, 64, 256, 16)
    lens = sorted(len(tok.encode(p)) for p in ps)
    assert len(set(ps)) == 16
    # each prompt at most its target and at most one word (<= 3 tokens here) short of it; the range is covered
    assert 254 <= lens[-1] <= 256 and 62 <= lens[0] <= 64
    assert all(b - a < 20 for a, b in zip(lens, lens[1:]))
    assert sized_prompts(tok, 64, 256, 16) == ps                      # the same prompts every run
    assert all(3 <= len(tok.encode(p)) <= 5 for p in sized_prompts(tok, 5, 5, 3))


def test_int_range_parses_and_refuses():
    assert int_range("64-256") == (64, 256) and int_range("7") == (7, 7)
    for bad in ("256-64", "0-4", "x", "1-2-3", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            int_range(bad)


def _tiny_model(seed: int = 0):
    """A 2-layer llama of width 16 (4 heads of 4, 2 KV heads, FFN 24, vocab 50) in GGUF's tensor names."""
    from types import SimpleNamespace

    import numpy as np
    rng = np.random.default_rng(seed)
    d, h, hkv, dh, ff, vocab = 16, 4, 2, 4, 24, 50
    cfg = SimpleNamespace(n_layers=2, n_heads=h, n_kv_heads=hkv, head_dim=dh, eps=1e-5, rope_base=10000.0,
                          vocab=vocab)
    shapes = {"attn_norm": (d,), "attn_q": (h * dh, d), "attn_k": (hkv * dh, d), "attn_v": (hkv * dh, d),
              "attn_output": (d, h * dh), "ffn_norm": (d,), "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    t = {f"blk.{i}.{k}.weight": (rng.standard_normal(s) * 0.2).astype(np.float32)
         for i in range(cfg.n_layers) for k, s in shapes.items()}
    t["token_embd.weight"] = rng.standard_normal((vocab, d)).astype(np.float32)
    t["output_norm.weight"] = np.ones(d, np.float32)
    return SimpleNamespace(tensors=t), cfg


def test_the_bound_times_wall_and_cpu_and_the_workload_adds_each_up():
    """``workload_tokens_per_s``: B prefills plus T steps at batch B, once by wall time and once by CPU time,
    from the fastest prefill and step by each clock it reports."""
    from runtime.bench.serve_workload import NumpyDecode
    g, cfg = _tiny_model()
    ref = NumpyDecode(g, cfg)
    w, c = ref.prefill_times(12, 2)
    assert w > 0 and c > 0
    B, T = 3, 8
    r = ref.workload_tokens_per_s(B, 12, T, steps=2)
    pre, step = r["prefill_ms"] / 1e3, B / r["decode_tokens_per_s"]
    assert r["tokens_per_s"] == pytest.approx(B * T / (B * pre + T * step), rel=1e-9)
    assert r["cpu_tokens_per_s"] == pytest.approx(B * T / (B * r["cpu_prefill_ms"] / 1e3 + T * r["cpu_step_ms"] / 1e3),
                                                  rel=1e-9)
    assert r["cpu_prefill_ms"] > 0 and r["cpu_step_ms"] > 0 and r["context"] == 12 + T // 2
    import time
    assert ref.tokens_per_s(B, 16, 2, clock=time.process_time) > 0      # the CPU clock still selectable


def test_cpu_figures_compare_the_device_process_with_the_bound_per_token():
    from runtime.bench.serve import cpu_figures
    bound = {"cpu_tokens_per_s": 50.0, "cpu_prefill_ms": 600.0, "cpu_step_ms": 190.0}
    row = {"output_tokens": 100, "wall_s": 4.0, "device_cpu_s": 2.5, "bench_cpu_s": 0.5}
    f = cpu_figures(row, bound)
    assert f["bound_cpu_ms_per_token"] == 20.0 and f["device_cpu_ms_per_token"] == 25.0
    assert f["of_bound_cpu"] == 0.8 and f["device_busy"] == 0.625 and f["bench_cpu_ms_per_token"] == 5.0
    local = cpu_figures({**row, "device_cpu_s": None}, bound)       # in-process devices: no device figures
    assert local["device_cpu_ms_per_token"] is local["of_bound_cpu"] is local["device_busy"] is None
    assert local["bound_cpu_ms_per_token"] == 20.0


def test_device_pids_and_their_cpu_seconds():
    """A backend's devices on this machine are counted by their processes' CPU time; in-process devices
    (no ``where``) and a device whose process is gone give no pids."""
    import os
    import time
    from types import SimpleNamespace

    from runtime.bench.common import cpu_seconds, device_pids
    me = os.getpid()
    assert device_pids(SimpleNamespace(backend=SimpleNamespace())) == []
    assert device_pids(SimpleNamespace(backend=SimpleNamespace(where={0: {"pid": me}}))) == [me]
    gone = SimpleNamespace(backend=SimpleNamespace(where={0: {"pid": me}, 1: {"pid": 2 ** 22 + 7}}))
    assert device_pids(gone) == []
    c0, t0 = cpu_seconds([me]), time.process_time()
    while time.process_time() - t0 < 0.15:                              # burn 0.15 s of this process's CPU
        sum(range(1000))
    assert cpu_seconds([me]) - c0 >= 0.1                                # /proc counts in clock ticks


def _burn(s: float) -> None:
    import time
    t0 = time.process_time()
    while time.process_time() - t0 < s:
        sum(range(1000))


def test_step_cpu_splits_a_level_into_prefill_and_full_batch_decode_steps():
    """Each step's device CPU is what the processes used since the step before; steps with prompt tokens
    are the prefill phase, decode-only steps of the level's batch the decode phase (others: neither)."""
    import os
    from types import SimpleNamespace as S

    from runtime.bench.serve_phases import StepCpu, phase_ratios
    sc = StepCpu([os.getpid()])
    sc.start()
    _burn(0.15)
    sc.record("m", S(batch_tokens=100, prompt_tokens=99, generation_tokens=1))
    sc.record("m", S(batch_tokens=0, prompt_tokens=0, generation_tokens=0))    # a request's record: no step
    _burn(0.1)
    sc.record("m", S(batch_tokens=4, prompt_tokens=0, generation_tokens=4))
    sc.record("m", S(batch_tokens=3, prompt_tokens=0, generation_tokens=3))    # the batch draining: neither
    ph = sc.phases(4)
    assert (ph["prefill_steps"], ph["prefill_prompt_tokens"], ph["decode_steps"], ph["steps"]) == (1, 99, 1, 3)
    assert ph["prefill_cpu_s"] >= 0.1 and ph["decode_cpu_s"] >= 0.05       # /proc counts in clock ticks
    r = phase_ratios({**ph, "prefill_cpu_s": 0.99, "decode_cpu_s": 0.2}, 5.0, 150.0)
    assert r == {"prefill_cpu_ms_per_token": 10.0, "prefill_of_bound": 0.5, "decode_cpu_ms_per_step": 200.0,
                 "decode_of_bound": 0.75}
    none = phase_ratios({**ph, "decode_steps": 0}, 5.0, 150.0)               # no full-batch decode step
    assert none["decode_of_bound"] is None and none["decode_cpu_ms_per_step"] is None
    sc.start()
    assert sc.phases(4)["steps"] == 0
