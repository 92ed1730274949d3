"""Iteration-level scheduling (Orca / vLLM V1): which requests run in the next step and how many of
their tokens.

Every step has a token budget (``max_num_batched_tokens``).  Running requests come first: a decoding
request takes one token, a request still in its prompt takes the next chunk that fits.  Then waiting
requests join (at most ``max_num_seqs`` running) with their first chunk, in the order the scheduling
policy gives them (:mod:`.policies`: ``fcfs`` keeps the queue order, ``priority`` sorts by aged
priority).  When the KV cache has no block for a running request's tokens, the policy's victim
(``max(running, key=(priority, arrival))``) is preempted: its blocks are freed, its computed tokens reset,
and it goes back to the waiting queue to be recomputed from its prompt and the tokens it already
generated.  A request whose next token a step still on the device samples (``pending``, the engine's
async scheduling) counts that token as its next one to compute: the runner feeds it on the device.  A
request admitted with nothing computed first takes the cached blocks of its prompt's
longest cached prefix (:mod:`.block_manager`, when prefix caching is on) and computes from there.  Under ``priority``, a waiting request that is strictly more urgent than the victim also takes
its place when the batch is full (at most one displacement per step).

Per step the limits may be narrower than the config's (:class:`.modes.StepLimits`, chosen by the
scheduler mode); running requests are never dropped to honour a narrower limit -- new ones just wait
until the batch is below it.  Nothing here touches a device: :meth:`Scheduler.schedule` returns a
:class:`SchedulerOutput` that the runner turns into one forward pass.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from devices.errors import InvalidParamError

from .block_manager import BlockManager
from .config import EngineConfig
from .modes import StepLimits
from .policies import POLICIES
from .request import Request, Status


@dataclass
class Scheduled:
    request: Request
    start: int                  #: first token position computed in this step
    count: int                  #: tokens computed in this step
    #: this step reaches the request's last token (known, or pending on the device) when scheduled: its
    #: logits give the next token (fixed at scheduling: later steps change the request)
    samples: bool = field(init=False)

    def __post_init__(self):
        r = self.request
        self.samples = self.start + self.count == r.num_tokens + r.pending


@dataclass
class SchedulerOutput:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.count for s in self.scheduled)

    @property
    def is_decode(self) -> bool:
        """Every scheduled request computes exactly its one newest token (a graph-replayable step)."""
        return bool(self.scheduled) and all(s.count == 1 and s.samples for s in self.scheduled)


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: BlockManager):
        if cfg.scheduling_policy not in POLICIES:
            raise InvalidParamError(f"unknown scheduling_policy {cfg.scheduling_policy!r} "
                                    f"(known: {', '.join(POLICIES)})")
        self.cfg = cfg
        self.blocks = blocks
        self.policy = cfg.policy()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_displaced = 0                  #: preemptions for a more urgent waiting request

    def victim(self, running: list[Request], now: float = 0.0) -> Request:
        return self.policy.victim(running, now)

    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Take a request out (finished or aborted) and free its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.blocks.free(req.request_id)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.blocks.free(req.request_id)
        req.num_computed = 0
        req.status = Status.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def take_all(self) -> list[Request]:
        """Every request still held, running first (by arrival), then the waiting ones in queue order,
        with their blocks freed and their computed tokens reset (a re-bind replays them elsewhere)."""
        reqs = sorted(self.running, key=lambda r: (r.arrival, r.seq)) + list(self.waiting)
        for r in reqs:
            self.blocks.free(r.request_id)
            r.num_computed = 0
            r.status = Status.PREEMPTED
        self.running, self.waiting = [], deque()
        return reqs

    def reconfigure(self, cfg: EngineConfig) -> None:
        """Schedule under ``cfg``'s limits and policy from the next step (queued and running requests kept)."""
        self.cfg, self.policy = cfg, cfg.policy()

    def schedule(self, limits: StepLimits | None = None, now: float = 0.0) -> SchedulerOutput:
        """The next step: which requests compute how many tokens, under ``limits`` (default: the
        config's) at time ``now`` (the engine's clock; ages priorities)."""
        cfg = self.cfg
        max_seqs = cfg.max_num_seqs if limits is None else min(limits.max_num_seqs, cfg.max_num_seqs)
        out = SchedulerOutput()
        budget = cfg.max_num_batched_tokens if limits is None else min(limits.max_num_batched_tokens,
                                                                      cfg.max_num_batched_tokens)
        budget = max(budget, 1)
        self.waiting = self.policy.order(self.waiting, now)
        displaced = 0
        if self.waiting and self.running and len(self.running) >= max_seqs:
            victim = self.victim(self.running, now)
            if self.policy.displaces(self.waiting[0], victim, now):
                self._preempt(victim)
                self.num_displaced += 1
                displaced = 1
                out.preempted.append(victim)
                self.waiting = self.policy.order(self.waiting, now)
        chosen: dict[str, Scheduled] = {}
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens + req.pending - req.num_computed, budget)
            if n <= 0:                                        # nothing to compute (its next token is not due)
                i += 1
                continue
            while not self.blocks.allocate(req.request_id, req.num_computed + n):
                victim = self.victim(self.running, now)
                gone = chosen.pop(victim.request_id, None)
                if gone is not None:                          # already scheduled this step: give it back
                    budget += gone.count
                    i -= 1
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                chosen[req.request_id] = Scheduled(req, req.num_computed, n)
                budget -= n
                i += 1
                continue
            break                                             # req itself was preempted (as vLLM: stop here)
        if len(out.preempted) == displaced:                   # no block shortage this step (as vLLM)
            while self.waiting and budget > 0 and len(self.running) < max_seqs:
                req = self.waiting[0]
                if req.pending:                               # preempted with a token still on the device
                    break
                prefix = self.blocks.cached_prefix(req.all_ids, req.cache_salt) if req.num_computed == 0 else []
                hit = len(prefix) * self.blocks.block_size
                n = min(req.num_tokens - req.num_computed - hit, budget)
                if not self.blocks.allocate(req.request_id, req.num_computed + hit + n, prefix):
                    break
                if req.num_computed == 0:
                    self.blocks.counted(req.num_tokens, hit)
                    req.num_computed = hit
                    req.cached_tokens = hit
                self.waiting.popleft()
                req.status = Status.RUNNING
                self.running.append(req)
                chosen[req.request_id] = Scheduled(req, req.num_computed, n)
                budget -= n
        out.scheduled = [chosen[r.request_id] for r in self.running if r.request_id in chosen]
        return out

    def advance(self, out: SchedulerOutput) -> None:
        """The step ran: its tokens are in the cache."""
        for s in out.scheduled:
            r = s.request
            r.num_computed = s.start + s.count
            if self.blocks.has_uncached_full_block(r.request_id, r.num_computed):
                self.blocks.cache_full_blocks(r.request_id, r.all_ids, r.num_computed, r.cache_salt)
