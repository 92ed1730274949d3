"""Async scheduling: the engine thread queues step n+1 on the device before it reads step n's tokens.

vLLM's ``async_scheduling``: while the device computes step n, the host schedules step n+1 and queues it
behind step n on the same stream, then waits for step n alone (an event recorded after it), samples /
detokenizes / streams step n's tokens, and goes on.  The device finds the next step queued when it
finishes one, so at steady state it never waits for the host (``vnpu prof`` shows the steps back to back).

Step n+1 needs step n's tokens as inputs: a request whose next token step n samples is *pending*
(:attr:`Request.pending`), the scheduler counts that token as its next one, and the runner feeds it on
the device (``fed`` rows: the step's ``gather`` reads the id that step n's ``argmax`` left in the input
buffer, :mod:`.runner`).  So a step can only be looked ahead of when every request it samples is greedy
(``temperature == 0``, no logprobs) and the whole vocabulary is on one rank: the device's argmax is then
exactly the host's :func:`runtime.models.llama.sample_token` (``np.argmax`` of the same float32 row,
first maximum on ties), and the host reads ``R`` int32 ids instead of ``R x vocab`` logits.  A step with
any other request is sampled on the host from its logits, as without overlap, and the next one is
scheduled after it (a seeded temperature draw uses the request's own numpy generator, which a device
kernel would not reproduce draw for draw).

What a look-ahead costs: a request that stops at step n (EOS, a stop string) computed one token more in
step n+1, thrown away (its blocks are freed after step n; the extra write lands in them before any later
step can use them, the stream orders it).  A request that step n finishes by length is never looked
ahead (known in advance).  Nothing is looked ahead while a control request (re-bind, pause) or a stop is
waiting, nor when the scheduler mode would hold the next step for more arrivals: the engine reaches a
boundary with nothing on the device first, and holds or runs the control there as without overlap.

Blocking: :meth:`OverlappedSteps._overlap_step` blocks until the step queued before it is done (not the
one it queues); everything else here is host-only.
"""
from __future__ import annotations

from dataclasses import dataclass

from devices.errors import AclError

from .request import Request, RequestOutput, Status
from .runner import Launched
from .scheduler import SchedulerOutput
from .stats import StepStats


@dataclass
class InFlight:
    """A step queued on the device and not read yet."""
    out: SchedulerOutput
    launched: Launched
    t0: float
    on_device: bool                    #: every sampled row is greedy: the host reads ids, not logits
    rows: dict[str, int]               #: request id -> its sampled row (what the next step may feed)


def samples_greedily(req: Request) -> bool:
    """The device's argmax is this request's next token."""
    return req.params.temperature == 0 and req.params.logprobs is None


class OverlappedSteps:
    """Mixin of :class:`runtime.serve.engine.GenerateEngine`: its engine thread's steps with async
    scheduling (``EngineConfig.async_scheduling``).  Uses the engine's scheduler, runner, inputs and
    output processing; adds only the step in flight."""

    _inflight: InFlight | None = None
    _parity = 0
    _read_at = 0.0                       #: when the host last read a step (the next one ran on from there)
    overlapped_steps = 0                 #: steps queued while the step before them was still on the device

    def _overlap_step(self) -> list[RequestOutput]:
        """Engine thread: queue the next step behind the one in flight when it can (see the module doc),
        then read and hand out the one in flight; with nothing in flight, schedule from what is known."""
        prev = self._inflight
        self._take_inbox()
        if self.error is not None:
            self._drop_inflight()
            return []
        lost = self.binder.lost(self.placement)
        if lost is not None:
            self._drop_inflight()
            self._auto_fallback(lost)
            return []
        nxt = None
        try:
            boundary = self._boundary_due() or (prev is not None and self._holds_next())
            if prev is not None and prev.on_device and not boundary:
                nxt = self._launch(prev)
            outputs = self._collect(prev) if prev is not None else []
            if nxt is not None:
                self.overlapped_steps += 1
                self._settle(nxt)
            elif not (boundary or self._boundary_due()):
                nxt = self._launch(None)
                if nxt is not None:
                    self.scheduler.advance(nxt.out)
        except AclError as e:
            self._step_failed([x for x in (prev, nxt) if x is not None], e)
            return []
        except Exception as e:  # noqa: BLE001 - a device failure fails the requests, not the server
            self._drop_inflight()
            self._fail(e)
            raise
        self._inflight = nxt
        return outputs

    def _boundary_due(self) -> bool:
        """Queue nothing more: a control request or a stop waits, or async scheduling was turned off
        (live) -- the step in flight is read and the engine is at a boundary."""
        return bool(self._control) or self._stopping or not self.config.async_scheduling

    def _holds_next(self) -> bool:
        """The scheduler mode would hold the next step for more arrivals (new requests wait and it allows a
        wait): not looked ahead -- the engine reaches a boundary and holds there, as without overlap."""
        if not any(r.scheduled_time is None for r in self.scheduler.waiting):
            return False
        return self.current_limits().max_wait_s > 0

    def _launch(self, prev: InFlight | None) -> InFlight | None:
        """Schedule and queue the next step (behind ``prev`` when given: its greedy requests' next tokens
        are fed on the device).  None when nothing is scheduled."""
        if prev is not None:
            for s in prev.out.scheduled:
                if s.samples and self._continues(s.request):
                    s.request.pending = 1
        planned = self._schedule_step()
        if planned is None:
            return None
        out, t0 = planned
        inputs = self._inputs(out, prev.rows if prev is not None else None)
        self._parity ^= 1
        launched = self.runner.launch(inputs, self._parity)
        sampled = [s.request for s in out.scheduled if s.samples]
        on_device = self.runner.samples_on_device and all(samples_greedily(r) for r in sampled)
        return InFlight(out, launched, t0, on_device, {r.request_id: i for i, r in enumerate(sampled)})

    def _continues(self, req: Request) -> bool:
        """After its next token the request still runs, unless that token stops it (not known yet)."""
        return (req.status is Status.RUNNING and len(req.output_ids) + 1 < req.params.max_tokens
                and req.num_tokens + 1 < self.config.max_model_len)

    def _collect(self, step: InFlight) -> list[RequestOutput]:
        """Wait for ``step`` (only: a step queued behind it goes on), read its tokens, hand them out."""
        if step.on_device:
            ids, logits = self.runner.ids(step.launched), None
        else:
            ids, logits = None, (self.runner.logits(step.launched) if step.launched.r else None)
        for s in step.out.scheduled:
            s.request.pending = 0
        self.steps += 1
        t = self.clock()
        if step.out.is_decode:      # the device's time for it: from its launch, or the previous step's end
            self.load.decode_step(t, len(step.out.scheduled), t - max(step.t0, self._read_at))
        self._read_at = t
        stats = StepStats(num_preemptions=len(step.out.preempted), batch_tokens=step.out.num_tokens)
        outputs = self._sampled(step.out, logits, stats, t, ids)
        self._sync_queued()
        self._notify()
        self._log_stats(stats)
        return outputs

    def _settle(self, step: InFlight) -> None:
        """The step before ``step`` was read: its tokens are known, so ``step``'s computed tokens (those of
        requests still running) count as in the cache now."""
        live = [s for s in step.out.scheduled if s.request.status is not Status.FINISHED]
        self.scheduler.advance(SchedulerOutput(live))

    def _step_failed(self, steps: list[InFlight], e: AclError) -> None:
        """A queued step failed: as :meth:`GenerateEngine.step` does for one -- a lost device re-binds (the
        steps never happened), a task error on a healthy placement fails the steps' requests."""
        self._drop_inflight()
        self.runner.clear_failure()
        lost = self.binder.lost(self.placement)
        if lost is not None:
            self._auto_fallback(f"{lost} ({type(e).__name__}: {e})")
            return
        seen: set[str] = set()
        for st in steps:
            keep = [s for s in st.out.scheduled if s.request.request_id not in seen]
            seen.update(s.request.request_id for s in keep)
            if keep:                     # the step queued behind a failed one holds its requests again: one failure
                self._fail_step(SchedulerOutput(keep), e)

    def _drop_inflight(self) -> None:
        """Forget the step in flight (a re-bind, a failure, a stop): no token of it is pending any more."""
        self._inflight = None
        for req in list(self._requests.values()):
            req.pending = 0
