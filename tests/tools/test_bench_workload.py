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
