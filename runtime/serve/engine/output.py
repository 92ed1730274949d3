"""Output processing: a request's sampled tokens as what the routes stream (vLLM's OutputProcessor).

Per generated token, :meth:`OutputProcessor.append` detokenizes the request's output so far, decides
whether it finished (``stop``: an end-of-sequence token, unless ``ignore_eos``, or a stop string --
cut off the text; ``length``: ``max_tokens`` or the context reached), and :meth:`OutputProcessor.increment`
makes the :class:`RequestOutput` of the step: the text delta (an incomplete UTF-8 sequence, or a possible
start of a stop string, is held back until it cannot be one), the token ids and logprobs, the finish
reason and the usage counts.  Every character of the text is handed out exactly once, whatever the steps
(a re-bind or preemption replays tokens already handed out, not text).  Host-only.
"""
from __future__ import annotations

from .request import Request, RequestOutput
from .sampling import TokenLogprob


class OutputProcessor:
    """Detokenization and stop checks of one model: ``tok`` (its tokenizer), ``stop_ids`` (its
    end-of-sequence tokens), ``max_model_len`` (the context a request may fill)."""

    def __init__(self, tok, stop_ids: set[int], max_model_len: int):
        self.tok, self.stop_ids, self.max_model_len = tok, set(stop_ids), max_model_len

    def append(self, req: Request, token: int) -> str | None:
        """Add ``token`` to ``req``'s output and its text; the finish reason it gives (None: go on)."""
        p = req.params
        req.output_ids.append(token)
        finish = None
        if token in self.stop_ids and not p.ignore_eos:
            finish = "stop"
        elif len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.max_model_len:
            finish = "length"
        text = self.tok.decode(req.output_ids)
        if p.stop:
            longest = max(len(s) for s in p.stop)
            lo = max(0, len(req.text) - longest)
            hits = [i for i in (text.find(s, lo) for s in p.stop) if i >= 0]
            if hits:
                text, finish = text[:min(hits)], "stop"
        req.text = text
        return finish

    def increment(self, req: Request, tokens: list[int], logprobs: list[TokenLogprob], finish: str | None,
                  error: str | None = None) -> RequestOutput:
        """The output of one step of ``req``: the text not handed out yet (what could still be a stop string
        or half a character held back unless it finished), ``tokens`` and their ``logprobs``, ``finish``."""
        text = req.text
        end = len(text)
        if finish is None:
            end = self._holdback(req, text)
        delta = text[req.sent:end]
        req.sent = end
        return RequestOutput(req.request_id, delta, tokens, logprobs, finish, len(req.prompt_ids),
                             len(req.output_ids), error, req.prompt_computed)

    @staticmethod
    def _holdback(req: Request, text: str) -> int:
        """Where the text that may be handed out now ends."""
        end = len(text)
        if text.endswith("\ufffd"):                       # an incomplete UTF-8 sequence: wait for the rest
            end -= 1
        for s in req.params.stop:                         # a possible start of a stop string stays back
            for k in range(min(len(s) - 1, end), 0, -1):
                if text[end - k:end] == s[:k]:
                    end -= k
                    break
        return max(end, req.sent)
