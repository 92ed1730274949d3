"""The generation engine: requests in, token increments out, continuous batching over a paged KV cache.

``add_requests`` (n prompts of one request, admitted together or not at all), ``add_request`` and
``abort`` may be called from any thread: they go into an inbox that the next :meth:`GenerateEngine.step`
takes in, so a new request joins the running batch at the next step and an aborted one leaves it (its KV
blocks freed) at the next step.  A request is checked once, here, before any of its prompts is queued
(:mod:`.prompts`: its prompt count, priority and fit; ``max_tokens`` left unset takes the engine's
default).  ``step`` (one scheduling decision, one forward pass, sampling: :mod:`.sampling`, output
processing: :mod:`.output`) is either called by the caller (tests drive it step by step) or by the
engine's own thread after :meth:`start` (:mod:`.lifecycle`).

Per step the scheduler mode (:mod:`.modes`) chooses the batch limits from the load the engine has seen
(on its injectable ``clock``), and the scheduling policy (:mod:`.policies`) orders the waiting requests
(``priority``: vLLM's lower-runs-first, with aging).

**Placements and the fallback chain** (:mod:`.placement`, :mod:`.lifecycle`).  The engine runs on one
entry of its chain at a time.  Before every step it reads the loss flags of its devices (no call); a step
that fails with a device error while a device of the placement is lost is not counted.  Either way the
engine *re-binds*: it releases the placement (what is left of it), builds the model on the next usable
entry, and replays every unfinished request there -- its KV cache is recomputed from the prompt plus the
tokens already generated (as after a preemption), and generation continues with the next token, so a
streaming client sees every token exactly once.  ``fallback`` moves down the chain on request,
``restore`` back to the first entry once it is healthy; both run between steps and drop no request.

Blocking: ``add_requests``/``abort`` never block on the device; ``step`` blocks until its logits are on
the host (a re-bind inside it blocks for the model upload and graph captures of the new placement); the
lifecycle's calls block as :mod:`.lifecycle` says.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from devices.errors import AclError, InvalidParamError
from runtime.models.llama import DECODER_MODELS
from runtime.models.tokenizer import gguf_tokenizer
from runtime.models.weights import LlamaConfig, load_gguf_for
from runtime.stages import LOADING_WEIGHTS, stage

from .block_manager import BlockManager
from .config import EngineConfig
from .errors import InvalidRequest
from .lifecycle import EngineLifecycle
from .kv_cache import kv_bytes_per_block
from .modes import MODES, LoadTracker, ModeConfig, StepLimits, throttled
from .output import OutputProcessor
from .overlap import OverlappedSteps
from .placement import DeviceBinder, Placement
from .prompts import PromptChecks
from .request import Request, RequestHandle, RequestOutput, Status
from .runner import ModelRunner, StepInputs
from .sampling import SamplingParams, TokenLogprob, sample
from .scheduler import Scheduler, SchedulerOutput
from .stats import FinishedRequest, StatLogger, StepStats

log = logging.getLogger("vnpu.serve")

#: how long the engine thread waits for news when requests are left but none could be scheduled
IDLE_WAIT_S = 0.05


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
    prefix_cache_queries: int = 0        #: tokens of admitted requests looked up in the prefix cache
    prefix_cache_hits: int = 0           #: of those, tokens found cached (not computed)
    prefix_cached_blocks: int = 0        #: blocks the prefix cache holds now
    overlapped_steps: int = 0            #: steps queued while the step before them was still on the device


class GenerateEngine(PromptChecks, OverlappedSteps, EngineLifecycle):
    """One causal LM served on ``devices`` (visible ids; tensor parallel over all of them)."""

    kind = "generate"
    thread_name = "engine"

    def __init__(self, rt, model: str = "smollm2", devices: Sequence[int] = (0,), config: EngineConfig = EngineConfig(),
                 stat_loggers: Sequence[StatLogger] = (), gguf_path: str | None = None,
                 clock: Callable[[], float] = time.monotonic, fallback: Sequence[Placement] = (),
                 binder: DeviceBinder | None = None, on_event: Sequence[Callable[[dict], None]] = ()):
        """``devices``: the first placement (visible ids, tensor parallel over all); ``fallback``: the rest
        of the chain, in order; ``binder``: turns placements into devices (default: ``rt``'s devices and
        an in-process CPU fallback device).  Blocks for the weights upload, KV cache and graph captures."""
        if model not in DECODER_MODELS:
            raise InvalidParamError(f"unknown decoder model {model!r} (known: {', '.join(DECODER_MODELS)})")
        EngineLifecycle.__init__(self, rt, model, devices, fallback, binder, clock, stat_loggers, on_event)
        self.config = config
        self.capacity = config      #: what the runner is built with (buffers, graph buckets): live limits stay <=
        path = str(gguf_path or DECODER_MODELS[model]())
        with stage(LOADING_WEIGHTS, model):
            self.tok = gguf_tokenizer(path)
            self._gguf = g = load_gguf_for(path, config.quantization)
        self.model_config = cfg = LlamaConfig.from_gguf_meta(g.meta)
        if config.max_model_len > cfg.context:
            raise InvalidParamError(f"max_model_len {config.max_model_len} exceeds the model's context of {cfg.context}")
        self.policy = config.policy()
        self.mode = MODES[config.mode.mode]
        self.load = LoadTracker()
        self.limits: StepLimits | None = None
        self.throttle = 1.0                  #: admission factor (set_throttle): batch, step tokens, queue
        self.last_batch = 0
        self.failed_steps = 0                    #: steps that failed on a healthy placement (their requests failed)
        self._open()
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.blocks)
        stop_ids = {self.tok.eos_id}
        if self.tok.tokens and self.tok.tokens[0] == "<|endoftext|>":
            stop_ids.add(0)
        self.output = OutputProcessor(self.tok, stop_ids, config.max_model_len)
        self._inbox: deque = deque()
        self._handles: dict[str, RequestHandle] = {}
        self._requests: dict[str, Request] = {}
        self._queued = 0                     #: added, not yet running (inbox + waiting)
        self.steps = 0

    @property
    def runner(self) -> ModelRunner | None:
        """The model runner of the current placement (None while re-binding)."""
        return self.built

    # ------------------------------------------------------------------ prompts (PromptChecks)
    @property
    def kv_blocks(self) -> int:
        return self.blocks.pool.num_blocks

    # ------------------------------------------------------------------ requests
    def add_requests(self, prompts: Sequence[list[int]], params: SamplingParams, priority: int = 0,
                     prompt_param: str = "prompt", on_output: Callable[[int, RequestOutput], None] | None = None,
                     request_ids: Sequence[str | None] | None = None,
                     admit: Callable[[int], object] | None = None, cache_salt: str = "") -> list[RequestHandle]:
        """Queue one request's ``prompts`` (token ids) with the same ``params``: all of them or none.  Checked
        first, all together (:meth:`checked`: :class:`InvalidRequest`), then ``admit(tokens)`` is called
        with the tokens they may use at most (prompts + ``max_tokens`` after the defaults) -- the caller's
        admission (a tenant's quota); what it raises refuses them all -- then queued under the lock (a
        draining or failed engine: :class:`Unavailable`; a queue without room for all: :class:`QueueFull`;
        a request id in use: :class:`InvalidRequest`).  ``priority``: vLLM's (lower runs first; only under
        the ``priority`` scheduling policy -- a non-zero one is refused under ``fcfs``, as vLLM does).
        ``on_output(i, output)``: called on the engine thread with every output of prompt ``i``.  Returns
        the handles in prompt order, at once.  ``cache_salt``: the prefix-cache namespace of the requests
        (their blocks are reused only by requests of the same salt; a tenant's name, or "" for shared)."""
        params = self.checked(prompts, params, priority, prompt_param, admit)
        now = self.clock()
        ids = list(request_ids) if request_ids is not None else [None] * len(prompts)
        reqs = [Request(p, params, rid, priority, arrival=now, cache_salt=cache_salt) for p, rid in zip(prompts, ids)]
        hs = [RequestHandle(r.request_id, len(r.prompt_ids),
                            None if on_output is None else (lambda o, i=i: on_output(i, o)))
              for i, r in enumerate(reqs)]
        with self._admitting(len(reqs)):
            names = [r.request_id for r in reqs]
            taken = [n for k, n in enumerate(names) if n in self._handles or n in names[:k]]
            if taken:
                raise InvalidRequest(f"request id {taken[0]!r} is already in use", "request_id")
            for r, h in zip(reqs, hs):
                self._handles[r.request_id] = h
                self._inbox.append(("add", r))
            self._queued += len(reqs)
        return hs

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    on_output: Callable[[RequestOutput], None] | None = None, priority: int = 0,
                    prompt_param: str = "prompt", cache_salt: str = "") -> RequestHandle:
        """Queue a request of one prompt (:meth:`add_requests`).  Returns at once."""
        cb = None if on_output is None else (lambda i, o: on_output(o))
        return self.add_requests([prompt_ids], params, priority, prompt_param, cb, [request_id],
                                 cache_salt=cache_salt)[0]

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
        lost = self.binder.lost(self.placement)
        if lost is not None:
            self._auto_fallback(lost)
            return []
        planned = self._schedule_step()
        if planned is None:
            return []
        out, t0 = planned
        inputs = self._inputs(out)
        try:
            logits = self.runner.execute(inputs)
        except AclError as e:
            lost = self.binder.lost(self.placement)
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
        stats = StepStats(num_preemptions=len(out.preempted), batch_tokens=out.num_tokens)
        outputs = self._sampled(out, logits, stats, t)
        self._sync_queued()
        self._notify()                                   # wait_until() watchers see every step
        self._log_stats(stats)
        return outputs

    def _sampled(self, out: SchedulerOutput, logits: np.ndarray | None, stats: StepStats, t: float,
                 ids: np.ndarray | None = None) -> list[RequestOutput]:
        """The step's tokens (one per request whose prompt is done: sampled from ``logits``, or the
        device's greedy ``ids``), as outputs, with their timings.  A request finished since the step was
        scheduled (aborted, or stopped by the step before) takes nothing from it."""
        outputs: list[RequestOutput] = []
        row = 0
        for s in out.scheduled:
            req = s.request
            if req.status is Status.FINISHED:
                row += s.samples
                continue
            req.prompt_computed = max(req.prompt_computed, min(s.start + s.count, len(req.prompt_ids)))
            if req.num_preemptions == 0:
                stats.prompt_tokens += max(0, min(s.start + s.count, len(req.prompt_ids)) - s.start)
            if not s.samples:
                continue
            if ids is not None:
                tok, lp = int(ids[row]), None
            else:
                tok, lp = sample(req.params, req.rng, logits[row])
            row += 1
            stats.generation_tokens += 1
            if req.first_token_time is None:
                req.first_token_time = t
                stats.time_to_first_tokens.append(t - req.arrival)
            else:
                stats.inter_token_latencies.append(t - req.last_token_time)
            req.last_token_time = t
            finish = self.output.append(req, tok)
            outputs.append(self._emit(req, [tok], [lp] if lp is not None else [], finish, stats))
        return outputs

    def _step(self) -> None:
        """Engine thread: one step, held for a fuller batch when the mode asks (with async scheduling:
        :mod:`.overlap`; control requests run once no step is in flight); when requests are left but none
        could run, wait a little for news instead of spinning."""
        if self._inflight is None:
            self._hold_for_batch()
            if not self._run_controls():
                return
        outs = self._overlap_step() if self.config.async_scheduling or self._inflight is not None else self.step()
        if not outs and self._inflight is None and not self.scheduler.running:
            with self._lock:
                if not self._inbox:
                    self._lock.wait_for(lambda: self._stopping or self._inbox or self._control, IDLE_WAIT_S)

    def _has_work(self) -> bool:
        return bool(self._inbox) or self._unfinished > 0

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

        def full():
            n = len(self.scheduler.running) + len(self.scheduler.waiting) + sum(1 for k, _ in self._inbox if k == "add")
            return n >= lim.max_num_seqs
        self._hold(full, deadline)

    def kv_bytes(self, tokens: int) -> int:
        """Device memory the KV cache of ``tokens`` tokens takes on this engine's devices (whole blocks of
        ``block_size``; all ranks together) -- what a tenant's HBM quota counts per request.  Pure."""
        c, bs = self.model_config, self.config.block_size
        return -(-int(tokens) // bs) * kv_bytes_per_block(c.n_layers, bs, c.n_kv_heads, c.head_dim)

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

    def set_limits(self, config: EngineConfig) -> None:
        """Take ``config``'s live limits (:data:`.config.LIVE_FIELDS`: batch, step budget, queue bound,
        scheduling policy, async scheduling) from the next step on, its mode kept as it is.  Nothing is dropped: a narrower
        batch or budget only holds new requests back, requests already running finish; a lower queue bound
        refuses new arrivals only.  :class:`InvalidParamError` (nothing changed) for a field that needs a
        restart, or a batch / budget above what the engine was built with (its buffers and graphs).
        Host-only (a short lock)."""
        if not isinstance(config, EngineConfig):
            raise InvalidParamError(f"config must be an EngineConfig, got {config!r}")
        with self._lock:
            _, restart = self.config.live_diff(config)
            if restart:
                raise InvalidParamError(f"engine.{restart[0]} cannot change without a restart")
            cap = self.capacity
            for k in ("max_num_seqs", "max_num_batched_tokens"):
                if getattr(config, k) > getattr(cap, k):
                    raise InvalidParamError(f"engine.{k} {getattr(config, k)} is above the {getattr(cap, k)} the "
                                            f"engine was built with (its buffers and graphs); that needs a restart")
            self.config = dataclasses.replace(config, mode=self.config.mode)
            if self.scheduler is not None:
                self.scheduler.reconfigure(self.config)
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

    def _queue_state(self) -> tuple[int, int, int]:
        cap = self.config.max_queued_requests
        return self._queued, max(1, math.ceil(cap * self.throttle)), cap

    def _schedule_step(self):
        """Schedule the next step at the current limits: -> (its scheduler output, its start time), None when
        nothing is scheduled (host only: nothing is queued on the device)."""
        now = self.clock()
        self.limits = self.current_limits(now)
        out = self.scheduler.schedule(self.limits, now)
        self._sync_queued()
        self.last_batch = len(out.scheduled)
        if not out.scheduled:
            return None
        t0 = self.clock()
        for s in out.scheduled:
            if s.request.scheduled_time is None:
                s.request.scheduled_time = t0
        return out, t0

    def _inputs(self, out: SchedulerOutput, fed: dict[str, int] | None = None) -> StepInputs:
        """The step's rows.  ``fed``: request id -> sampled row of the step queued before this one, for
        requests whose newest token that step is still sampling (the device feeds it)."""
        bs, mb = self.config.block_size, -(-self.config.max_model_len // self.config.block_size)
        ids, pos, slots, tables, lens, rows = [], [], [], [], [], []
        feed = np.full(out.num_tokens, -1, np.int64) if fed else None
        n = 0
        for s in out.scheduled:
            req = s.request
            p = np.arange(s.start, s.start + s.count)
            table = np.zeros(mb, np.int64)
            t = self.blocks.table(req.request_id)
            table[:len(t)] = t
            known = req.all_ids[s.start:s.start + s.count]
            if len(known) < s.count:                     # its last token is the pending one: fed on the device
                if feed is None or req.request_id not in fed:
                    raise RuntimeError(f"request {req.request_id} has no token for position {s.start + s.count - 1}")
                feed[n + s.count - 1] = fed[req.request_id]
                known = known + [0]
            ids.append(np.asarray(known, np.int64))
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            tables.append(np.broadcast_to(table, (s.count, mb)))
            lens.append(p + 1)
            n += s.count
            if s.samples:
                rows.append(n - 1)
        return StepInputs(np.concatenate(ids), np.concatenate(pos), np.concatenate(slots), np.concatenate(tables),
                          np.concatenate(lens), np.asarray(rows, np.int64), out.is_decode, feed)

    # ------------------------------------------------------------------ outputs
    def _emit(self, req: Request, toks: list[int], lps: list[TokenLogprob], finish: str | None,
              stats: StepStats | None, error: str | None = None) -> RequestOutput:
        """Hand ``req``'s output of this step to its handle (retired first when it is the last)."""
        o = self.output.increment(req, toks, lps, finish, error)
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
        self._retired()
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
        self._log_stats(st)

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

    # ------------------------------------------------------------------ the lifecycle's hooks
    def _build(self, devs: list) -> ModelRunner:
        return ModelRunner(devs, self._gguf, self.model_config, self.capacity, self.model)

    def _detach(self) -> list[Request]:
        self._drop_inflight()
        return self.scheduler.take_all()

    def _attach(self, reqs: list[Request]) -> int:
        """A fresh KV cache and scheduler on the placement just built; ``reqs`` (unfinished) queued again
        (their caches are recomputed from prompt + tokens so far).  How many were queued."""
        old = self.scheduler
        self.blocks = BlockManager(self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        self.blocks.queries, self.blocks.hits = old.blocks.queries, old.blocks.hits
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

    def _fail_requests(self, msg: str) -> None:
        self._drop_inflight()
        self._take_inbox()
        for req in list(self._requests.values()):
            self._finish(req, "error", msg)

    def _abort_requests(self) -> None:
        self._drop_inflight()
        self._take_inbox()
        for req in list(self._requests.values()):
            self._finish(req, "abort", None)

    def _gauges(self, stats: StepStats) -> None:
        stats.num_running, stats.num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        stats.kv_usage = self.blocks.pool.usage

    def _watched(self) -> EngineSnapshot:
        return self.snapshot()

    # ------------------------------------------------------------------ state
    def snapshot(self) -> EngineSnapshot:
        pool = self.blocks.pool
        r = self.runner
        return EngineSnapshot(len(self.scheduler.running), self._queued, pool.usage, pool.num_blocks, pool.num_free,
                              self.scheduler.num_preemptions, r.num_graphs if r else 0, r.captures if r else 0,
                              self.steps, self.index, self.limits, self.rebinds, self.last_batch,
                              self.blocks.queries, self.blocks.hits, pool.num_cached, self.overlapped_steps)
