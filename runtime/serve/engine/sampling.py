"""Token sampling: a request's sampling parameters, checked once, and the engine's choice of its next token.

:class:`SamplingParams` are OpenAI's sampling fields (plus vLLM's ``top_k``/``ignore_eos``), each refused
with a clear :class:`InvalidRequest` naming the field (HTTP 400) when out of range -- the one place they
are checked.  :func:`sample` turns one row of logits into the next token (through
:func:`runtime.models.llama.sample_token`: greedy, temperature, top-k, top-p, on the request's own
generator) and, when asked, its log-probability and the top alternatives.  Host-only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runtime.models.llama import sample_token

from .errors import InvalidRequest

#: stop strings one request may have (OpenAI's limit)
MAX_STOP = 4
#: top log-probabilities one generated token may report at most (OpenAI's limit)
MAX_LOGPROBS = 20


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number_in(x, lo: float, hi: float, lo_open: bool = False) -> bool:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return False
    return (lo < x if lo_open else lo <= x) and x <= hi


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples.  ``max_tokens``: tokens to generate at most (None: the engine's default,
    what the context leaves after the longest prompt of the request); ``temperature == 0`` is greedy;
    ``top_k`` 0 or -1: all tokens (vLLM); ``seed`` (any signed 64-bit integer, as OpenAI and vLLM take it)
    seeds this request's own generator (None: a fresh random one); ``stop`` strings (at most
    :data:`MAX_STOP`) end the text and are not part of it; ``logprobs``: how many top log-probabilities to
    return per generated token (None: none).  A field out of range: :class:`InvalidRequest` naming it."""
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        mt = self.max_tokens
        if mt is not None and not _is_int(mt):
            raise InvalidRequest(f"max_tokens must be an integer, got {mt!r}", "max_tokens")
        if mt is not None and mt < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {mt}", "max_tokens")
        if not _number_in(self.temperature, 0, 2):
            raise InvalidRequest(f"temperature must be in [0, 2], got {self.temperature}", "temperature")
        if not _number_in(self.top_p, 0, 1, lo_open=True):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidRequest(f"top_k must be -1 or 0 (all tokens) or at least 1, got {self.top_k}", "top_k")
        lp = self.logprobs
        if lp is not None and (not _is_int(lp) or not 0 <= lp <= MAX_LOGPROBS):
            raise InvalidRequest(f"logprobs must be in [0, {MAX_LOGPROBS}], got {lp}", "logprobs")
        if len(self.stop) > MAX_STOP:
            raise InvalidRequest(f"stop takes at most {MAX_STOP} strings, got {len(self.stop)}", "stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must not be empty", "stop")
        if self.seed is not None and (not _is_int(self.seed) or not -2 ** 63 <= self.seed < 2 ** 63):
            raise InvalidRequest(f"seed must be a 64-bit integer, got {self.seed!r}", "seed")

    def generator(self) -> np.random.Generator:
        """This request's own generator: seeded by ``seed`` (an int64, taken as its uint64 bits), else fresh."""
        return np.random.default_rng(None if self.seed is None else self.seed % 2 ** 64)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]          #: (token id, logprob), best first


def sample(params: SamplingParams, rng: np.random.Generator, logits: np.ndarray) -> tuple[int, TokenLogprob | None]:
    """The next token of a request from its row of ``logits`` (drawn from ``rng``), and its log-probability
    with the ``params.logprobs`` most likely tokens when asked (None otherwise)."""
    p = params
    tok = sample_token(logits, rng, float(p.temperature), max(0, p.top_k), float(p.top_p))
    if p.logprobs is None:
        return tok, None
    z = logits.astype(np.float64)
    lse = z.max() + np.log(np.exp(z - z.max()).sum())
    top = top_indices(z, p.logprobs)
    return tok, TokenLogprob(tok, float(z[tok] - lse), [(int(i), float(z[i] - lse)) for i in top])


def top_indices(z: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest entries of ``z``, largest first, equal values in index order:
    exactly ``np.argsort(-z, kind="stable")[:k]`` (NaN last), in O(vocab) -- a partition finds the k-th
    largest value and only the entries at or above it are sorted (a full sort of a 49k vocabulary per
    token cost more than the step's sampling otherwise)."""
    neg = -z
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    if k >= neg.size:
        return np.argsort(neg, kind="stable")[:k]
    kth = np.partition(neg, k - 1)[k - 1]
    if np.isnan(kth):                                   # fewer than k numbers: NaN among the top, sorted last
        return np.argsort(neg, kind="stable")[:k]
    cand = np.flatnonzero(neg <= kth)                   # every top-k entry and its ties, in index order
    return cand[np.argsort(neg[cand], kind="stable")][:k]
