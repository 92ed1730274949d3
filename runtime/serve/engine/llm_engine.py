"""The generation engine: requests in, token increments out, continuous batching over a paged KV cache.

``add_request`` and ``abort`` may be called from any thread: they go into an inbox that the next
:meth:`GenerateEngine.step` takes in, so a new request joins the running batch at the next step and an
aborted one leaves it (its KV blocks freed) at the next step.  ``step`` (one scheduling decision, one
forward pass, sampling, detokenization, stop checks) is either called by the caller (tests drive it
step by step) or by the engine's own thread after :meth:`start`.

Per step the scheduler mode (:mod:`.modes`) chooses the batch limits from the load the engine has seen
(on its injectable ``clock``), and the scheduling policy (:mod:`.policies`) orders the waiting requests
(``priority``: vLLM's lower-runs-first, with aging).

**Placements and the fallback chain** (:mod:`.placement`).  The engine runs on one entry of its chain at
a time.  Before every step it reads the loss flags of its devices (no call); a step that fails with a
device error while a device of the placement is lost is not counted.  Either way the engine *re-binds*:
it releases the placement (what is left of it), builds the model on the next usable entry, and replays
every unfinished request there -- its KV cache is recomputed from the prompt plus the tokens already
generated (as after a preemption), and generation continues with the next token, so a streaming client
sees every token exactly once.  :meth:`GenerateEngine.fallback` moves down the chain on request,
:meth:`GenerateEngine.restore` back to the first entry once it is healthy; both run between steps (on
the engine thread when it runs) and drop no request.  Every re-bind is an event in
:attr:`GenerateEngine.events` and goes to ``on_event`` listeners.

Blocking: ``add_request``/``abort`` never block on the device; ``step`` blocks until its logits are on
the host (a re-bind inside it blocks for the model upload and graph captures of the new placement);
``fallback``/``restore`` block until the re-bind is done; ``drain``/``wait_idle`` block until no request
is left (or the timeout); ``shutdown`` waits for the engine thread, then frees all device memory.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from concurrent.futures import Future

from devices.errors import AclError, InvalidParamError
from runtime.models.llama import DECODER_MODELS, sample_token
from runtime.models.tokenizer import gguf_tokenizer
from runtime.models.weights import LlamaConfig, load_gguf_cached

from .block_manager import BlockManager
from .config import EngineConfig
from .errors import InvalidRequest, QueueFull, Unavailable
from .modes import MODES, LoadTracker, ModeConfig, StepLimits, throttled
from .placement import DeviceBinder, Placement, RebindResult, bind_first, rebind_candidates, release
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
    placement: int = 0                   #: index of the chain entry the engine runs on
    limits: StepLimits | None = None     #: the limits of the last scheduled step (the mode's choice)
    rebinds: int = 0
    batch: int = 0                       #: requests in the last step's batch


def encode_prompt(tok, vocab: int, prompt) -> list[int]:
    """A prompt as token ids: raw text (no template) or a list of token ids in ``[0, vocab)``."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("the prompt is empty", "prompt")
        return tok.encode(prompt)
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                              for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
        return list(prompt)
    raise InvalidRequest("prompt must be a non-empty string or a non-empty list of token ids", "prompt")


def check_fits(n: int, max_tokens: int, max_model_len: int, block_size: int, num_blocks: int,
               prompt_param: str = "prompt") -> None:
    """Refuse what could never run: a prompt beyond the context, prompt + max_tokens beyond it, or more KV
    blocks than a cache of ``num_blocks`` (block 0 is the null block) has (:class:`InvalidRequest`)."""
    ml = max_model_len
    if n >= ml:
        raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, your prompt has "
                             f"{n} tokens.", prompt_param, "context_length_exceeded")
    if n + max_tokens > ml:
        raise InvalidRequest(f"This model's maximum context length is {ml} tokens. However, you requested "
                             f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the "
                             f"completion). Please reduce the prompt or max_tokens.", "max_tokens",
                             "context_length_exceeded")
    need, have = -(-(n + max_tokens) // block_size), num_blocks - 1
    if need > have:
        raise InvalidRequest(f"the request needs {need} KV blocks of {block_size} tokens ({n} prompt + "
                             f"{max_tokens} max_tokens) but the whole KV cache has {have}",
                             prompt_param if -(-(n + 1) // block_size) > have else "max_tokens",
                             "kv_cache_exceeded")


class PromptChecks:
    """The routes' side of a generation model, before a request is queued: prompts to token ids
    (``encode``; ``encode_chat`` with the chat template of the model's GGUF) and what could never run
    (``check``, ``capacity_tokens``, ``default_max_tokens``).  One template for :class:`GenerateEngine` and a
    model served by replicas (:class:`runtime.serve.replicas.RemoteGenerateEngine`): a subclass sets ``tok``,
    ``model_config`` and ``config`` (its :class:`EngineConfig`) and gives :attr:`kv_blocks`.  Host-only."""

    model: str
    tok: object
    model_config: LlamaConfig
    config: EngineConfig

    @property
    def kv_blocks(self) -> int:
        """Blocks of the whole KV cache (one of them is the null block)."""
        raise NotImplementedError(f"{type(self).__name__} gives no kv_blocks")

    def encode(self, prompt) -> list[int]:
        """A prompt as token ids: raw text (no template) or a list of token ids."""
        return encode_prompt(self.tok, self.model_config.vocab, prompt)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Messages rendered with the model's chat template (from its GGUF), then tokenized."""
        return self.tok.encode(self.tok.render_chat(messages))  # type: ignore[attr-defined]

    @property
    def capacity_tokens(self) -> int:
        """Tokens one request may hold at most: the context, or all usable KV blocks if fewer."""
        return min(self.config.max_model_len, (self.kv_blocks - 1) * self.config.block_size)

    def default_max_tokens(self, prompt_tokens: int) -> int:
        return max(1, self.capacity_tokens - prompt_tokens)

    @property
    def queue_capacity(self) -> int:
        """Requests the model can hold waiting at most (``max_queued_requests``, unthrottled)."""
        return self.config.max_queued_requests

    def check_batch(self, count: int, prompt_param: str = "prompt") -> None:
        """Refuse a request of more prompts than could ever be queued at once (:class:`InvalidRequest`: no
        retry can help -- unlike a queue that is full now, :class:`QueueFull`)."""
        cap = self.queue_capacity
        if count > cap:
            raise InvalidRequest(f"this request has {count} prompts but {self.model} queues at most {cap} requests "
                                 f"(max_queued_requests): it can never be admitted; send at most {cap} prompts "
                                 f"per request", prompt_param, "too_many_prompts")

    def check(self, prompt_ids: list[int], params: SamplingParams, prompt_param: str = "prompt") -> None:
        """Refuse what could never run: a prompt beyond the context, prompt + max_tokens beyond it, or
        more KV blocks than the whole cache has."""
        check_fits(len(prompt_ids), params.max_tokens, self.config.max_model_len, self.config.block_size,
                   self.kv_blocks, prompt_param)


class GenerateEngine(PromptChecks):
    """One causal LM served on ``devices`` (visible ids; tensor parallel over all of them)."""

    kind = "generate"

    def __init__(self, rt, model: str = "smollm2", devices: Sequence[int] = (0,), config: EngineConfig = EngineConfig(),
                 stat_loggers: Sequence[StatLogger] = (), gguf_path: str | None = None,
                 clock: Callable[[], float] = time.monotonic, fallback: Sequence[Placement] = (),
                 binder: DeviceBinder | None = None, on_event: Sequence[Callable[[dict], None]] = ()):
        """``devices``: the first placement (visible ids, tensor parallel over all); ``fallback``: the rest
        of the chain, in order; ``binder``: turns placements into devices (default: ``rt``'s devices and
        an in-process CPU fallback device)."""
        if model not in DECODER_MODELS:
            raise InvalidParamError(f"unknown decoder model {model!r} (known: {', '.join(DECODER_MODELS)})")
        self.model, self.config, self.clock = model, config, clock
        self.stat_loggers = list(stat_loggers)
        self.on_event = list(on_event)
        path = str(gguf_path or DECODER_MODELS[model]())
        self.tok = gguf_tokenizer(path)
        self._gguf = g = load_gguf_cached(path)
        self.model_config = cfg = LlamaConfig.from_gguf_meta(g.meta)
        if config.max_model_len > cfg.context:
            raise InvalidParamError(f"max_model_len {config.max_model_len} exceeds the model's context of {cfg.context}")
        first = devices if isinstance(devices, Placement) else Placement(tuple(int(d) for d in devices))
        self.chain: tuple[Placement, ...] = (first, *fallback)
        self.binder = binder or DeviceBinder(rt)
        self._own_binder = binder is None
        self.policy = config.policy()
        self.mode = MODES[config.mode.mode]
        self.load = LoadTracker()
        self.limits: StepLimits | None = None
        self.throttle = 1.0                  #: admission factor (set_throttle): batch, step tokens, queue
        self.last_batch = 0
        self.events: list[dict] = []
        self.rebinds = 0
        self.failed_steps = 0                    #: steps that failed on a healthy placement (their requests failed)
        self.index = 0
        self.runner: ModelRunner | None = None
        try:
            self._bind(0)
        except BaseException:
            if self._own_binder:
                self.binder.close()
            raise
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.blocks)
        self.stop_ids = {self.tok.eos_id}
        if self.tok.tokens and self.tok.tokens[0] == "<|endoftext|>":
            self.stop_ids.add(0)
        self._lock = threading.Condition()
        self._inbox: deque = deque()
        self._resumes: list[threading.Event] = []   #: holders of paused() (released at shutdown)
        self._handles: dict[str, RequestHandle] = {}
        self._requests: dict[str, Request] = {}
        self._unfinished = 0
        self._queued = 0                     #: added, not yet running (inbox + waiting)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self.error: str | None = None
        self.steps = 0

    # ------------------------------------------------------------------ prompts (PromptChecks)
    @property
    def kv_blocks(self) -> int:
        return self.blocks.pool.num_blocks

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    on_output: Callable[[RequestOutput], None] | None = None, priority: int = 0,
                    prompt_param: str = "prompt") -> RequestHandle:
        """Queue a request (checked first: :class:`InvalidRequest`; a full queue: :class:`QueueFull`;
        a draining or failed engine: :class:`Unavailable`).  ``priority``: vLLM's (lower runs first; only
        under the ``priority`` scheduling policy -- a non-zero one is refused under ``fcfs``, as vLLM
        does).  Returns at once."""
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InvalidRequest(f"priority must be an integer, got {priority!r}", "priority")
        if priority and not self.policy.uses_priority:
            raise InvalidRequest(f"priority={priority} needs the priority scheduling policy (this engine runs "
                                 f"{self.policy.name})", "priority")
        self.check(prompt_ids, params, prompt_param)
        req = Request(prompt_ids, params, request_id, priority, arrival=self.clock())
        h = RequestHandle(req.request_id, len(prompt_ids), on_output)
        with self._lock:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            if not self._accepting:
                raise Unavailable(f"the {self.model} engine is draining")
            limit = max(1, math.ceil(self.config.max_queued_requests * self.throttle))
            if self._queued >= limit:
                raise QueueFull(f"the {self.model} engine has {self._queued} requests waiting "
                                f"(max_queued_requests={self.config.max_queued_requests}"
                                f"{f', throttled to {limit}' if limit < self.config.max_queued_requests else ''})")
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
                self.load.arrived(x.arrival)
            elif kind == "rebind":
                if self._stopping:
                    x[2].set_exception(Unavailable(f"the {self.model} engine is shutting down"))
                else:
                    self._run_rebind(*x)
            elif kind == "pause":                        # held between two steps until the holder resumes
                held, resume = x
                held.set()
                resume.wait()
            else:
                req = self._requests.get(x)
                if req is not None and req.status is not Status.FINISHED:
                    self._finish(req, "abort", None)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, run the forward pass, sample, hand out increments.  A lost device of
        the placement re-binds the engine to the next chain entry first (see the module doc)."""
        self._take_inbox()
        if self.error is not None:
            return []
        lost = self.binder.lost(self.chain[self.index])
        if lost is not None:
            self._auto_fallback(lost)
            return []
        now = self.clock()
        self.limits = self.current_limits(now)
        out = self.scheduler.schedule(self.limits, now)
        self._sync_queued()
        self.last_batch = len(out.scheduled)
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
        except AclError as e:
            lost = self.binder.lost(self.chain[self.index])
            if lost is None:                             # a failed attempt (task exception): its requests fail
                self._fail_step(out, e)
                return []
            self._auto_fallback(f"{lost} ({type(e).__name__}: {e})")       # the step never happened
            return []
        except Exception as e:  # noqa: BLE001 - a device failure fails the requests, not the server
            self._fail(e)
            raise
        self.scheduler.advance(out)
        self.steps += 1
        t = self.clock()
        if out.is_decode:
            self.load.decode_step(t, len(out.scheduled), t - t0)
        outputs: list[RequestOutput] = []
        row = 0
        for s in out.scheduled:
            req = s.request
            req.prompt_computed = max(req.prompt_computed, min(s.start + s.count, len(req.prompt_ids)))
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

    def set_mode(self, mode: ModeConfig) -> None:
        """Switch the scheduler mode of a running engine (from the next step; nothing is dropped -- a
        narrower batch limit only holds new requests back)."""
        if not isinstance(mode, ModeConfig):
            raise InvalidParamError(f"mode must be a ModeConfig, got {mode!r}")
        fn = MODES[mode.mode]
        with self._lock:
            self.config = dataclasses.replace(self.config, mode=mode)
            self.mode = fn
            self._lock.notify_all()

    def set_throttle(self, factor: float) -> None:
        """Admit less: from the next step the batch and the step's token budget are scaled by ``factor``
        (0 < factor <= 1; 1 = not throttled), and so is the waiting queue's bound (beyond it: QueueFull).
        Running requests are not dropped.  (Self-healing's ``throttle`` action: an overheating device
        does less work per step.)"""
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
            raise InvalidParamError(f"throttle factor must be in (0, 1], got {factor!r}")
        with self._lock:
            self.throttle = float(factor)
            self._lock.notify_all()

    def current_limits(self, now: float | None = None) -> StepLimits:
        """The scheduler mode's limits for a step taken now (from the load seen so far), throttled."""
        c = self.config
        now = self.clock() if now is None else now
        obs = self.load.observe(now, len(self.scheduler.running), len(self.scheduler.waiting))
        return throttled(self.mode(obs, c.max_num_seqs, c.max_num_batched_tokens, c.mode), self.throttle)

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
        o = RequestOutput(req.request_id, delta, toks, lps, finish, len(req.prompt_ids), len(req.output_ids), error,
                          req.prompt_computed)
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
        if finish in ("stop", "length"):
            self.load.finished(len(req.output_ids))
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

    def _fail_step(self, out: SchedulerOutput, e: AclError) -> None:
        """A step failed on a healthy placement (a task exception, not a lost device): the requests of that
        step fail (HTTP 500 / an error chunk), the others keep their place, and the engine keeps serving --
        whether to move elsewhere is the self-healing policy's call (error rate over a window), not one
        failed task's."""
        msg = f"{type(e).__name__}: {e}"
        self.failed_steps += 1
        log.warning("engine %s: a step failed on %s (%s); %d request(s) failed", self.model, self.placement, msg,
                    len(out.scheduled))
        for s in out.scheduled:
            if s.request.request_id in self._requests:
                self._finish(s.request, "error", msg)

    def _fail(self, e: Exception) -> None:
        msg = f"{type(e).__name__}: {e}"
        log.error("engine %s failed: %s", self.model, msg)
        with self._lock:
            self.error = msg
        for req in list(self._requests.values()):
            self._finish(req, "error", msg)

    # ------------------------------------------------------------------ placements
    @property
    def placement(self) -> Placement:
        """The chain entry the engine runs on."""
        return self.chain[self.index]

    @property
    def devices(self) -> list:
        """The devices of the current placement."""
        return list(self.runner.devices) if self.runner is not None else []

    def _bind(self, index: int) -> None:
        """Build the model on chain entry ``index`` (weights, KV cache, decode graphs; host-blocking)."""
        devs = self.binder.devices(self.chain[index])
        self.runner = self._build(devs)
        self.index = index

    def _build(self, devs: list) -> ModelRunner:
        return ModelRunner(devs, self._gguf, self.model_config, self.config)

    def _release(self) -> None:
        """Free what the current placement holds (a lost device's share is gone with it)."""
        r, self.runner = self.runner, None
        release(r, self.model, self.placement)

    def fallback(self, reason: str = "requested", timeout: float | None = None,
                 away_from: int | None = None) -> RebindResult:
        """Move to the next usable entry of the chain and replay the unfinished requests there (between
        steps; blocks until done).  :class:`Unavailable` when no entry is left (the engine keeps running
        where it is).  ``away_from``: move only while the placement uses that device -- decided on the
        engine thread, between steps, so that a caller who saw the engine on a lost device does not move
        it a second time after the engine's own automatic re-bind (``moved`` False then)."""
        return self._request_rebind("fallback", reason, timeout, away_from)

    def restore(self, timeout: float | None = None) -> RebindResult:
        """Move back to the first entry of the chain when it is healthy (no device lost, none in an
        Alarm/Critical state), replaying the unfinished requests there (between steps; blocks until
        done).  ``moved`` is False when already there; :class:`Unavailable` when the first entry is not
        healthy (the engine stays where it is)."""
        return self._request_rebind("restore", "requested", timeout)

    def _request_rebind(self, kind: str, reason: str, timeout: float | None,
                        away_from: int | None = None) -> RebindResult:
        fut: Future = Future()
        with self._lock:
            if self._stopping:
                raise Unavailable(f"the {self.model} engine is shutting down")
            threaded = self._thread is not None
            if threaded:
                self._inbox.append(("rebind", (kind, reason, fut, away_from)))
                self._lock.notify_all()
        if not threaded:
            self._run_rebind(kind, reason, fut, away_from)
        return fut.result(timeout)

    def _run_rebind(self, kind: str, reason: str, fut: Future, away_from: int | None = None) -> None:
        try:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            plan = rebind_candidates(self.binder, self.chain, self.index, kind, self.model, away_from)
            res = plan if isinstance(plan, RebindResult) else self._rebind(plan, kind, reason)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)
        else:
            fut.set_result(res)

    @contextmanager
    def paused(self, timeout: float | None = None):
        """Hold the engine between two steps for the ``with`` block: nothing of it runs on its devices
        meanwhile (requests keep queuing; none is dropped), e.g. for a live defragmentation of those
        devices.  Blocks the caller until the engine thread reaches a step boundary (:class:`Unavailable`
        after ``timeout`` seconds); without an engine thread the caller is the one stepping: no wait."""
        held, resume = threading.Event(), threading.Event()
        with self._lock:
            if self._stopping:
                raise Unavailable(f"the {self.model} engine is shutting down")
            threaded = self._thread is not None and self.error is None     # a failed engine runs nothing
            if threaded:
                self._resumes.append(resume)
                self._inbox.append(("pause", (held, resume)))
                self._lock.notify_all()
        try:
            if threaded and not held.wait(timeout):
                raise Unavailable(f"the {self.model} engine did not reach a step boundary within {timeout} s")
            yield self
        finally:
            resume.set()
            with self._lock:
                if resume in self._resumes:
                    self._resumes.remove(resume)

    def _auto_fallback(self, why: str) -> None:
        """A device of the placement is lost: move down the chain (the engine fails when nothing is left)."""
        if self.index + 1 >= len(self.chain):
            self._fail(Unavailable(f"{self.placement} is unusable ({why}) and no fallback is left"))
            return
        try:
            self._rebind(range(self.index + 1, len(self.chain)), "fallback", f"automatic: {why}")
        except Exception as e:  # noqa: BLE001 - reported through the requests and self.error
            self._fail(e)

    def _rebind(self, candidates, kind: str, reason: str) -> RebindResult:
        """Engine thread (or the stepping caller), between steps: release the placement, build on the first
        candidate entry that is usable, replay every unfinished request there.  Raises
        :class:`Unavailable` when no candidate builds -- after building again where the engine was (its
        requests replayed there, nothing dropped) when that entry is still usable; the engine fails (every
        request finished with an error) when it is not."""
        t0, frm = time.monotonic(), self.index
        reqs = self.scheduler.take_all()
        self._release()
        try:
            self.index, self.runner = bind_first(self.binder, self.chain, candidates, self._build, self.model)
        except Unavailable as e:
            self._record(dict(kind=kind, ok=False, from_index=frm, reason=reason, error=str(e)))
            try:
                self.index, self.runner = bind_first(self.binder, self.chain, (frm,), self._build, self.model)
            except Unavailable as back:
                self._fail(Unavailable(f"{e}; and {back}"))
                raise e from None
            self._replay(reqs)
            raise
        replayed = self._replay(reqs)
        self.rebinds += 1
        res = RebindResult(self.index != frm, frm, self.index, str(self.placement), reason, replayed,
                           time.monotonic() - t0)
        self._record(dict(kind=kind, ok=True, from_index=frm, to_index=self.index, placement=str(self.placement),
                          previous=str(self.chain[frm]), reason=reason, replayed=replayed, seconds=res.seconds))
        log.warning("engine %s: %s %s -> %s (%s), %d request(s) replayed in %.2f s", self.model, kind,
                    self.chain[frm], self.placement, reason, replayed, res.seconds)
        return res

    def _replay(self, reqs) -> int:
        """A fresh KV cache and scheduler on the placement just built; ``reqs`` (unfinished) queued again
        (their caches are recomputed from prompt + tokens so far).  How many were queued."""
        old = self.scheduler
        self.blocks = BlockManager(self.runner.num_blocks, self.config.block_size)
        self.scheduler = Scheduler(self.config, self.blocks)
        self.scheduler.num_preemptions, self.scheduler.num_displaced = old.num_preemptions, old.num_displaced
        replayed = 0
        for r in reqs:
            if self.blocks.blocks_for(len(r.prompt_ids) + r.params.max_tokens) > self.blocks.pool.num_blocks - 1:
                self._finish(r, "error", f"the request does not fit the KV cache of {self.placement}")
                continue
            self.scheduler.waiting.append(r)
            replayed += 1
        self._sync_queued()
        return replayed

    def _record(self, ev: dict) -> None:
        ev = dict(ev, model=self.model, t=self.clock())
        self.events.append(ev)
        for fn in self.on_event:
            try:
                fn(ev)
            except Exception:  # noqa: BLE001 - a listener must not break the engine
                log.exception("engine event listener failed")

    # ------------------------------------------------------------------ state
    def snapshot(self) -> EngineSnapshot:
        pool = self.blocks.pool
        r = self.runner
        return EngineSnapshot(len(self.scheduler.running), self._queued, pool.usage, pool.num_blocks, pool.num_free,
                              self.scheduler.num_preemptions, r.num_graphs if r else 0, r.captures if r else 0,
                              self.steps, self.index, self.limits, self.rebinds, self.last_batch)

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
                self._hold_for_batch()
                if not self.step() and not self.scheduler.running and not self._inbox:
                    with self._lock:                     # nothing runnable: wait for news, not spin
                        self._lock.wait_for(lambda: self._stopping or self._inbox, timeout=0.05)
            except Exception:  # noqa: BLE001 - reported through the requests and self.error
                with self._lock:
                    self._lock.wait_for(lambda: self._stopping)
                return

    def _hold_for_batch(self) -> None:
        """Engine thread: when the mode asks for it (``max_wait_s``), hold a step that would admit new
        requests until the batch could be full or the oldest new request has waited that long."""
        self._take_inbox()
        if self.error is not None:
            return
        lim = self.current_limits()
        fresh = [r for r in self.scheduler.waiting if r.scheduled_time is None]
        if lim.max_wait_s <= 0 or not fresh:
            return
        deadline = min(r.arrival for r in fresh) + lim.max_wait_s

        def ready():
            n = len(self.scheduler.running) + len(self.scheduler.waiting) + sum(1 for k, _ in self._inbox if k == "add")
            return self._stopping or n >= lim.max_num_seqs or self.clock() >= deadline or any(
                k in ("rebind", "pause") for k, _ in self._inbox)
        with self._lock:
            while not ready():
                self._lock.wait(max(0.0, deadline - self.clock()))

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
            for resume in self._resumes:                 # a holder that shuts the engine down lets it go
                resume.set()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._take_inbox()
        for req in list(self._requests.values()):
            self._finish(req, "abort", None)
        try:
            if self.runner is not None:
                r, self.runner = self.runner, None
                if self.binder.lost(self.placement) is None:
                    r.close()
                else:
                    self.runner = r
                    self._release()                      # what is left of a placement with a lost device
        finally:
            if self._own_binder:
                self.binder.close()
