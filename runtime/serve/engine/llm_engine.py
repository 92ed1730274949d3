"""The generation engine: requests in, token increments out, continuous batching over a paged KV cache.

``add_request`` and ``abort`` may be called from any thread: they go into an inbox that the next
:meth:`GenerateEngine.step` takes in, so a new request joins the running batch at the next step and an
aborted one leaves it (its KV blocks freed) at the next step.  ``step`` (one scheduling decision, one
forward pass, sampling, detokenization, stop checks) is either called by the caller (tests drive it
step by step) or by the engine's own thread after :meth:`start`.

Blocking: ``add_request``/``abort`` never block on the device; ``step`` blocks until its logits are on
the host; ``drain``/``wait_idle`` block until no request is left (or the timeout); ``shutdown`` waits
for the engine thread, then frees all device memory.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from devices.errors import InvalidParamError
from runtime.models.common import pick_devices
from runtime.models.llama import DECODER_MODELS, sample_token
from runtime.models.tokenizer import gguf_tokenizer
from runtime.models.weights import LlamaConfig, load_gguf_cached

from .block_manager import BlockManager
from .config import EngineConfig
from .errors import InvalidRequest, QueueFull, Unavailable
from .request import Request, RequestHandle, RequestOutput, SamplingParams, Status, TokenLogprob
from .runner import ModelRunner, StepInputs
from .scheduler import Scheduler, SchedulerOutput
from .stats import FinishedRequest, StatLogger, StepStats

log = logging.getLogger("vnpu.serve")


@dataclass(frozen=True)
class EngineSnapshot:
    """Gauges of an engine at one moment (read by /metrics and by tests)."""
    running: int
    waiting: int
    kv_usage: float
    num_blocks: int
    free_blocks: int
    num_preemptions: int
    graphs: int
    captures: int
    steps: int


class GenerateEngine:
    """One causal LM served on ``devices`` (visible ids; tensor parallel over all of them)."""

    kind = "generate"

    def __init__(self, rt, model: str = "smollm2", devices: Sequence[int] = (0,), config: EngineConfig = EngineConfig(),
                 stat_loggers: Sequence[StatLogger] = (), gguf_path: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if model not in DECODER_MODELS:
            raise InvalidParamError(f"unknown decoder model {model!r} (known: {', '.join(DECODER_MODELS)})")
        self.model, self.config, self.clock = model, config, clock
        self.stat_loggers = list(stat_loggers)
        path = str(gguf_path or DECODER_MODELS[model]())
        self.tok = gguf_tokenizer(path)
        g = load_gguf_cached(path)
        self.model_config = cfg = LlamaConfig.from_gguf_meta(g.meta)
        if config.max_model_len > cfg.context:
            raise InvalidParamError(f"max_model_len {config.max_model_len} exceeds the model's context of {cfg.context}")
        self.devices = pick_devices(rt, list(devices))
        self.runner = ModelRunner(self.devices, g, cfg, config)
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.blocks)
        self.stop_ids = {self.tok.eos_id}
        if self.tok.tokens and self.tok.tokens[0] == "<|endoftext|>":
            self.stop_ids.add(0)
        self._lock = threading.Condition()
        self._inbox: deque = deque()
        self._handles: dict[str, RequestHandle] = {}
        self._requests: dict[str, Request] = {}
        self._unfinished = 0
        self._queued = 0                     #: added, not yet running (inbox + waiting)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self.error: str | None = None
        self.steps = 0

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt) -> list[int]:
        """A prompt as token ids: raw text (no template) or a list of token ids."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("the prompt is empty", "prompt")
            return self.tok.encode(prompt)
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                                  for t in prompt):
            bad = [t for t in prompt if not 0 <= t < self.model_config.vocab]
            if bad:
                raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary [0, {self.model_config.vocab})",
                                     "prompt")
            return list(prompt)
        raise InvalidRequest("prompt must be a non-empty string or a non-empty list of token ids", "prompt")

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Messages rendered with the model's chat template (from its GGUF), then tokenized."""
        return self.tok.encode(self.tok.render_chat(messages))

    @property
    def capacity_tokens(self) -> int:
        return min(self.config.max_model_len, self.blocks.capacity_tokens)

    def default_max_tokens(self, prompt_tokens: int) -> int:
        return max(1, self.capacity_tokens - prompt_tokens)

    def check(self, prompt_ids: list[int], params: SamplingParams, prompt_param: str = "prompt") -> None:
        """Refuse what could never run: a prompt beyond the context, prompt + max_tokens beyond it, or
        more KV blocks than the whole cache has."""
        n, ml = len(prompt_ids), self.config.max_model_len
        if n >= ml:
            raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, your prompt has "
                                 f"{n} tokens.", prompt_param, "context_length_exceeded")
        if n + params.max_tokens > ml:
            raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, you requested "
                                 f"{n + params.max_tokens} tokens ({n} in the prompt, {params.max_tokens} for the "
                                 f"completion). Please reduce the prompt or max_tokens.", "max_tokens",
                                 "context_length_exceeded")
        need, have = self.blocks.blocks_for(n + params.max_tokens), self.blocks.pool.num_blocks - 1
        if need > have:
            raise InvalidRequest(f"the request needs {need} KV blocks of {self.config.block_size} tokens ({n} prompt + "
                                 f"{params.max_tokens} max_tokens) but the whole KV cache has {have}",
                                 prompt_param if self.blocks.blocks_for(n + 1) > have else "max_tokens",
                                 "kv_cache_exceeded")

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    on_output: Callable[[RequestOutput], None] | None = None, priority: int = 0,
                    prompt_param: str = "prompt") -> RequestHandle:
        """Queue a request (checked first: :class:`InvalidRequest`; a full queue: :class:`QueueFull`;
        a draining or failed engine: :class:`Unavailable`).  Returns at once."""
        self.check(prompt_ids, params, prompt_param)
        req = Request(prompt_ids, params, request_id, priority, arrival=self.clock())
        h = RequestHandle(req.request_id, len(prompt_ids), on_output)
        with self._lock:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            if not self._accepting:
                raise Unavailable(f"the {self.model} engine is draining")
            if self._queued >= self.config.max_queued_requests:
                raise QueueFull(f"the {self.model} engine has {self._queued} requests waiting "
                                f"(max_queued_requests={self.config.max_queued_requests})")
            if req.request_id in self._handles:
                raise InvalidRequest(f"request id {req.request_id!r} is already in use", "request_id")
            self._handles[req.request_id] = h
            self._inbox.append(("add", req))
            self._unfinished += 1
            self._queued += 1
            self._lock.notify_all()
        return h

    def abort(self, request_id: str) -> None:
        """Cancel a request (it finishes with ``abort`` and frees its blocks at the next step)."""
        with self._lock:
            self._inbox.append(("abort", request_id))
            self._lock.notify_all()

    def _take_inbox(self) -> None:
        with self._lock:
            items, self._inbox = list(self._inbox), deque()
        for kind, x in items:
            if kind == "add":
                self._requests[x.request_id] = x
                self.scheduler.add(x)
            else:
                req = self._requests.get(x)
                if req is not None and req.status is not Status.FINISHED:
                    self._finish(req, "abort", None)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run the forward pass, sample, hand out increments."""
        self._take_inbox()
        out = self.scheduler.schedule()
        self._sync_queued()
        if not out.scheduled:
            return []
        stats = StepStats(num_preemptions=len(out.preempted), batch_tokens=out.num_tokens)
        t0 = self.clock()
        for s in out.scheduled:
            if s.request.scheduled_time is None:
                s.request.scheduled_time = t0
        inputs = self._inputs(out)
        try:
            logits = self.runner.execute(inputs)
        except Exception as e:  # noqa: BLE001 - a device failure fails the requests, not the server
            self._fail(e)
            raise
        self.scheduler.advance(out)
        self.steps += 1
        t = self.clock()
        outputs: list[RequestOutput] = []
        row = 0
        for s in out.scheduled:
            req = s.request
            if req.num_preemptions == 0:
                stats.prompt_tokens += max(0, min(s.start + s.count, len(req.prompt_ids)) - s.start)
            if not s.samples:
                continue
            tok, lp = self._sample(req, logits[row])
            row += 1
            stats.generation_tokens += 1
            if req.first_token_time is None:
                req.first_token_time = t
                stats.time_to_first_tokens.append(t - req.arrival)
            else:
                stats.inter_token_latencies.append(t - req.last_token_time)
            req.last_token_time = t
            o = self._append(req, tok, lp, stats)
            if o is not None:
                outputs.append(o)
        self._sync_queued()
        with self._lock:
            self._lock.notify_all()                      # wait_until() watchers see every step
        stats.num_running, stats.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        stats.kv_usage = self.blocks.pool.usage
        for lg in self.stat_loggers:
            lg.record(self.model, stats)
        return outputs

    def _sync_queued(self) -> None:
        with self._lock:
            self._queued = len(self.scheduler.waiting) + sum(1 for k, _ in self._inbox if k == "add")

    def _inputs(self, out: SchedulerOutput) -> StepInputs:
        bs, mb = self.config.block_size, -(-self.config.max_model_len // self.config.block_size)
        ids, pos, slots, tables, lens, rows = [], [], [], [], [], []
        n = 0
        for s in out.scheduled:
            req = s.request
            p = np.arange(s.start, s.start + s.count)
            table = np.zeros(mb, np.int64)
            t = self.blocks.table(req.request_id)
            table[:len(t)] = t
            ids.append(np.asarray(req.all_ids[s.start:s.start + s.count], np.int64))
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            tables.append(np.broadcast_to(table, (s.count, mb)))
            lens.append(p + 1)
            n += s.count
            if s.samples:
                rows.append(n - 1)
        return StepInputs(np.concatenate(ids), np.concatenate(pos), np.concatenate(slots), np.concatenate(tables),
                          np.concatenate(lens), np.asarray(rows, np.int64), out.is_decode)

    def _sample(self, req: Request, logits: np.ndarray) -> tuple[int, TokenLogprob | None]:
        p = req.params
        tok = sample_token(logits, req.rng, float(p.temperature), p.top_k, float(p.top_p))
        if p.logprobs is None:
            return tok, None
        z = logits.astype(np.float64)
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        top = np.argsort(-z, kind="stable")[:p.logprobs]
        return tok, TokenLogprob(tok, float(z[tok] - lse), [(int(i), float(z[i] - lse)) for i in top])

    # ------------------------------------------------------------------ outputs
    def _append(self, req: Request, tok: int, lp: TokenLogprob | None, stats: StepStats) -> RequestOutput | None:
        p = req.params
        req.output_ids.append(tok)
        finish = None
        if tok in self.stop_ids and not p.ignore_eos:
            finish = "stop"
        elif len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.config.max_model_len:
            finish = "length"
        text = self.tok.decode(req.output_ids)
        if p.stop:
            longest = max(len(s) for s in p.stop)
            lo = max(0, len(req.text) - longest)
            hits = [i for i in (text.find(s, lo) for s in p.stop) if i >= 0]
            if hits:
                text, finish = text[:min(hits)], "stop"
        req.text = text
        return self._emit(req, [tok], [lp] if lp is not None else [], finish, stats)

    def _emit(self, req: Request, toks: list[int], lps: list, finish: str | None, stats: StepStats | None,
              error: str | None = None) -> RequestOutput:
        text = req.text
        end = len(text)
        if finish is None:
            if text.endswith("\ufffd"):                       # an incomplete UTF-8 sequence: wait for the rest
                end -= 1
            for s in req.params.stop:                         # a possible start of a stop string stays back
                for k in range(min(len(s) - 1, end), 0, -1):
                    if text[end - k:end] == s[:k]:
                        end -= k
                        break
            end = max(end, req.sent)
        delta = text[req.sent:end]
        req.sent = end
        o = RequestOutput(req.request_id, delta, toks, lps, finish, len(req.prompt_ids), len(req.output_ids), error)
        h = self._handles.get(req.request_id)
        if finish is not None:
            self._retire(req, finish, stats)
        if h is not None:
            h.put(o)
        return o

    def _retire(self, req: Request, finish: str, stats: StepStats | None) -> None:
        req.status, req.finish_reason = Status.FINISHED, finish
        self.scheduler.remove(req)
        self._requests.pop(req.request_id, None)
        with self._lock:
            self._handles.pop(req.request_id, None)
            self._unfinished -= 1
            self._lock.notify_all()
        if stats is not None:
            t = self.clock()
            stats.finished.append(FinishedRequest(finish, t - req.arrival,
                                                  (req.scheduled_time or t) - req.arrival, len(req.prompt_ids),
                                                  len(req.output_ids), req.params.max_tokens))

    def _finish(self, req: Request, reason: str, error: str | None) -> None:
        st = StepStats()
        self._emit(req, [], [], reason, st, error)
        st.num_running, st.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        st.kv_usage = self.blocks.pool.usage
        for lg in self.stat_loggers:
            lg.record(self.model, st)

    def _fail(self, e: Exception) -> None:
        msg = f"{type(e).__name__}: {e}"
        log.error("engine %s failed: %s", self.model, msg)
        with self._lock:
            self.error = msg
        for req in list(self._requests.values()):
            self._finish(req, "error", msg)

    # ------------------------------------------------------------------ state
    def snapshot(self) -> EngineSnapshot:
        pool = self.blocks.pool
        return EngineSnapshot(len(self.scheduler.running), self._queued, pool.usage, pool.num_blocks, pool.num_free,
                              self.scheduler.num_preemptions, self.runner.num_graphs, self.runner.captures, self.steps)

    def has_unfinished(self) -> bool:
        with self._lock:
            return self._unfinished > 0

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        """Run steps on an engine thread whenever there is work."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"vnpu-engine-{self.model}", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._stopping or self._inbox or self._unfinished > 0)
                if self._stopping:
                    return
            try:
                if not self.step() and not self.scheduler.running and not self._inbox:
                    with self._lock:                     # nothing runnable: wait for news, not spin
                        self._lock.wait_for(lambda: self._stopping or self._inbox, timeout=0.05)
            except Exception:  # noqa: BLE001 - reported through the requests and self.error
                with self._lock:
                    self._lock.wait_for(lambda: self._stopping)
                return

    def wait_until(self, pred: Callable[[EngineSnapshot], bool], timeout: float | None = None) -> bool:
        """Block until ``pred(snapshot())`` holds (checked after every step and request change)."""
        with self._lock:
            return self._lock.wait_for(lambda: pred(self.snapshot()), timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is left (True), or ``timeout`` passes (False)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._unfinished == 0 or self.error is not None, timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Stop taking requests; block until those in flight finish."""
        with self._lock:
            self._accepting = False
        return self.wait_idle(timeout)

    @property
    def accepting(self) -> bool:
        return self._accepting and self.error is None

    def shutdown(self) -> None:
        """Abort what is left, stop the thread, free every device resource (weights, KV cache, graphs)."""
        with self._lock:
            self._accepting = False
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._take_inbox()
        for req in list(self._requests.values()):
            self._finish(req, "abort", None)
        self.runner.close()
