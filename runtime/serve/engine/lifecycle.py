"""The engine lifecycle: what every serving engine does the same way, whatever its step.

An engine serves one model on one entry of its fallback chain at a time (:mod:`.placement`).  This base
owns, once for every engine (:class:`runtime.serve.engine.GenerateEngine`,
:class:`runtime.serve.engine.EmbedEngine`, and any engine to come):

- **the engine thread** (:meth:`EngineLifecycle.start`): it waits for work, runs the *control requests*
  that arrived (a ``fallback``/``restore`` re-bind, a ``paused()`` hold) between two steps, then one step
  of the subclass; :meth:`EngineLifecycle.shutdown` stops it and frees what the placement holds.
- **placements and re-binds**: the model built on the first entry at start; ``fallback`` moves down the
  chain, ``restore`` back to the first entry, a lost device re-binds by itself (:meth:`_auto_fallback`);
  a re-bind that finds nowhere to go builds again where the engine was, or fails the engine.  Every re-bind
  is an event (:attr:`events`, and the ``on_event`` listeners).
- **admission and counts**: :meth:`_admitting` refuses new requests of a failed or draining engine, or
  beyond its waiting queue's bound (:class:`QueueFull`); ``has_unfinished``, ``wait_idle``, ``drain``,
  ``wait_until`` and ``accepting`` read the count of requests admitted and not yet finished.
- **one replayable call** (:meth:`_run_on_placement`) for engines whose step is a pure function of its
  inputs (an embedding batch, a compiled model's batch): re-run down the chain after a device loss.

What a subclass gives (its step and its requests; everything here is called by the base):

=========================  =========================================================================
``_build(devices)``        the model built on a device list (weights uploaded, graphs captured): an
                           object with ``devices`` and ``close()``.  Host-blocking.
``_has_work()``            under the lock: the engine thread has requests to step.
``_step()``                engine thread: one step (or batch); it may hold for a fuller batch first
                           (:meth:`_hold`), which returns early when a control request comes.
``_queue_state()``         under the lock: (requests waiting now, the bound now, the configured bound).
``_fail_requests(msg)``    finish every request with the engine's failure (the engine failed).
``_abort_requests()``      finish every request left (shutdown).
``_detach()``/``_attach``  optional: the requests that move with a re-bind (taken before the placement
                           is released, queued again on the new one; ``_attach`` says how many).
``_gauges(stats)``         optional: fill the gauges of a :class:`StepStats` before it is recorded.
``_watched()``             optional: what a ``wait_until`` predicate is given (default: the engine).
=========================  =========================================================================

Without :meth:`start` nothing runs by itself: the caller steps the engine (tests do), a re-bind runs on
the caller's thread and ``paused()`` holds nothing (the caller is the one stepping).

Blocking: ``fallback``/``restore`` block until the re-bind is done (model upload and graph captures of the
new placement); ``paused()`` blocks until the engine thread reaches a step boundary; ``drain``/
``wait_idle``/``wait_until`` block until their condition (or the timeout); ``shutdown`` waits for the
engine thread, then frees the placement's device memory; the rest is host-only and never waits for a step.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar, Union

from devices.errors import AclError

from .errors import EngineFailure, QueueFull, Unavailable
from .placement import DeviceBinder, Placement, RebindResult, bind_first, rebind_candidates, release
from .stats import StatLogger, StepStats

log = logging.getLogger("vnpu.serve")

T = TypeVar("T")


@dataclass
class _Rebind:
    """A ``fallback`` / ``restore`` request for the engine thread (between two steps)."""
    kind: str
    reason: str
    future: Future
    away_from: int | None = None


@dataclass
class _Pause:
    """A ``paused()`` holder: the engine thread sets ``held`` at a step boundary, then waits for ``resume``."""
    held: threading.Event
    resume: threading.Event


class EngineLifecycle:
    """The thread, placements, re-binds, admission and shutdown of one serving engine (see the module doc
    for what a subclass gives).  ``devices``: the first placement (visible ids, or a :class:`Placement`);
    ``fallback``: the rest of the chain, in order; ``binder``: turns placements into devices (default:
    ``rt``'s devices and an in-process CPU fallback device, closed with the engine)."""

    kind = ""
    thread_name = "engine"                #: the engine thread is ``vnpu-<thread_name>-<model>``

    def __init__(self, rt, model: str, devices: Union[Sequence[int], Placement], fallback: Sequence[Placement] = (),
                 binder: DeviceBinder | None = None, clock: Callable[[], float] = time.monotonic,
                 stat_loggers: Sequence[StatLogger] = (), on_event: Sequence[Callable[[dict], None]] = ()):
        self.model, self.clock = model, clock
        self.stat_loggers = list(stat_loggers)
        self.on_event = list(on_event)
        first = devices if isinstance(devices, Placement) else Placement(tuple(int(d) for d in devices))
        self.chain: tuple[Placement, ...] = (first, *fallback)
        self.binder = binder or DeviceBinder(rt)
        self._own_binder = binder is None
        self.index = 0                        #: the chain entry the engine runs on
        self.built = None                     #: what ``_build`` made for that entry (None while re-binding)
        self.events: list[dict] = []          #: re-binds, in order
        self.rebinds = 0
        self.error: str | None = None         #: why the engine failed (it refuses every request then)
        self._lock = threading.Condition()    #: (re-entrant) guards what threads share; notified at every change
        self._control: deque[_Rebind | _Pause] = deque()
        self._resumes: list[threading.Event] = []      #: holders of paused() (released at shutdown)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self._unfinished = 0                  #: requests admitted and not finished

    def _open(self) -> None:
        """Build the model on the first entry of the chain (host-blocking; the subclass calls it once its
        own fields are set).  A failure closes the engine's own binder and is raised."""
        try:
            self.built = self._build(self.binder.devices(self.chain[0]))
        except BaseException:
            if self._own_binder:
                self.binder.close()
            raise

    # ------------------------------------------------------------------ what a subclass gives
    def _build(self, devices: list):
        raise NotImplementedError(f"{type(self).__name__} builds nothing")

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _queue_state(self) -> tuple[int, int, int]:
        raise NotImplementedError

    def _fail_requests(self, msg: str) -> None:
        raise NotImplementedError

    def _abort_requests(self) -> None:
        raise NotImplementedError

    def _detach(self):
        """What moves with a re-bind, taken before the placement is released (default: nothing)."""
        return None

    def _attach(self, held) -> int:
        """Queue ``held`` again on the placement just built; how many requests that is."""
        return 0

    def _gauges(self, stats: StepStats) -> None:
        """Fill the gauges (running, waiting, cache use) of ``stats`` before it is recorded."""

    def _watched(self):
        """What a :meth:`wait_until` predicate is given."""
        return self

    # ------------------------------------------------------------------ placements
    @property
    def placement(self) -> Placement:
        """The chain entry the engine runs on."""
        return self.chain[self.index]

    @property
    def devices(self) -> list:
        """The devices of the current placement (none while it is being re-bound)."""
        return list(self.built.devices) if self.built is not None else []

    def fallback(self, reason: str = "requested", timeout: float | None = None,
                 away_from: int | None = None) -> RebindResult:
        """Move to the next usable entry of the chain, taking the unfinished requests along (between two
        steps; blocks until done).  :class:`Unavailable` when no entry is left (the engine keeps running
        where it is).  ``away_from``: move only while the placement uses that device -- decided on the
        engine thread, between steps, so that a caller who saw the engine on a lost device does not move it
        a second time after the engine's own automatic re-bind (``moved`` False then)."""
        return self._request_rebind(_Rebind("fallback", reason, Future(), away_from), timeout)

    def restore(self, timeout: float | None = None) -> RebindResult:
        """Move back to the first entry of the chain when it is healthy (no device lost, none in an
        Alarm/Critical state), taking the unfinished requests along (between two steps; blocks until
        done).  ``moved`` is False when already there; :class:`Unavailable` when the first entry is not
        healthy (the engine stays where it is)."""
        return self._request_rebind(_Rebind("restore", "requested", Future()), timeout)

    def restart(self, reason: str = "requested", timeout: float | None = None) -> RebindResult:
        """Restart the engine where it is (the seed's ``restart_worker``): between two steps, free the
        placement's model and caches and build them again on the same entry, the unfinished requests
        taken along and replayed there (a generation's KV cache recomputed from its prompt and the tokens it
        already has: no token is lost or sent twice).  Blocks until rebuilt; :class:`Unavailable` (the
        engine built again where it was, or failed) when the entry no longer builds."""
        return self._request_rebind(_Rebind("restart", reason, Future()), timeout)

    @property
    def pending_rebinds(self) -> int:
        """``fallback`` / ``restore`` requests waiting for the next step boundary."""
        with self._lock:
            return sum(isinstance(c, _Rebind) for c in self._control)

    def _request_rebind(self, rq: _Rebind, timeout: float | None) -> RebindResult:
        with self._lock:
            if self._stopping:
                raise Unavailable(f"the {self.model} engine is shutting down")
            threaded = self._thread is not None
            if threaded:
                self._control.append(rq)
                self._lock.notify_all()
        if not threaded:
            self._run_rebind(rq)
        return rq.future.result(timeout)

    def _run_rebind(self, rq: _Rebind) -> None:
        try:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            plan = rebind_candidates(self.binder, self.chain, self.index, rq.kind, self.model, rq.away_from)
            res = plan if isinstance(plan, RebindResult) else self._rebind(plan, rq.kind, rq.reason)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            rq.future.set_exception(e)
        else:
            rq.future.set_result(res)

    def _rebind(self, candidates, kind: str, reason: str, rerun: int = 0) -> RebindResult:
        """Engine thread (or the stepping caller), between steps: release the placement, build on the first
        candidate entry that is usable, take the unfinished requests along (``rerun``: requests of a call
        that failed on the old placement and run again on the new one).  Raises :class:`Unavailable` when
        no candidate builds -- after building again where the engine was (its requests queued there,
        nothing dropped) when that entry is still usable; the engine fails when it is not."""
        t0, frm = time.monotonic(), self.index
        held = self._detach()
        self._release()
        try:
            self.index, self.built = bind_first(self.binder, self.chain, candidates, self._build, self.model)
        except Unavailable as e:
            self._record(dict(kind=kind, ok=False, from_index=frm, reason=reason, error=str(e)))
            try:
                self.index, self.built = bind_first(self.binder, self.chain, (frm,), self._build, self.model)
            except Unavailable as back:
                self._fail(Unavailable(f"{e}; and {back}"))
                raise e from None
            self._attach(held)
            raise
        replayed = self._attach(held) + rerun
        self.rebinds += 1
        res = RebindResult(self.index != frm, frm, self.index, str(self.placement), reason, replayed,
                           time.monotonic() - t0)
        self._record(dict(kind=kind, ok=True, from_index=frm, to_index=self.index, placement=str(self.placement),
                          previous=str(self.chain[frm]), reason=reason, replayed=replayed, seconds=res.seconds))
        log.warning("engine %s: %s %s -> %s (%s), %d request(s) replayed in %.2f s", self.model, kind,
                    self.chain[frm], self.placement, reason, replayed, res.seconds)
        return res

    def _auto_fallback(self, why: str, rerun: int = 0) -> bool:
        """A device of the placement is lost: move down the chain.  False when the engine failed instead
        (no entry left, or none builds: every request finished with the error, later ones refused)."""
        if self.index + 1 >= len(self.chain):
            self._fail(Unavailable(f"{self.placement} is unusable ({why}) and no fallback is left"))
            return False
        try:
            self._rebind(range(self.index + 1, len(self.chain)), "fallback", f"automatic: {why}", rerun)
        except Exception as e:  # noqa: BLE001 - reported through the requests and self.error
            if self.error is None:
                self._fail(e)
            return False
        return True

    def _release(self) -> None:
        """Free what the current placement holds (a lost device's share is gone with it)."""
        built, self.built = self.built, None
        release(built, self.model, self.placement)

    def _run_on_placement(self, call: Callable[[object], T], requests: int) -> tuple[T, bool]:
        """Engine thread: ``call(built)`` on the current placement, for a step that is a pure function of its
        inputs -- after a device loss the engine re-binds down the chain and calls again there (the same
        result, up to another device's rounding).  ``(result, re-run after a loss)``.  Raises
        :class:`Unavailable` when the engine failed (no entry left) and :class:`EngineFailure` when the call
        failed on a healthy placement (only its ``requests`` fail; the engine goes on).  Blocks for the
        call (and for any re-bind)."""
        attempted = False
        while True:
            lost = self.binder.lost(self.placement) if self.error is None else None
            rerun = lost is not None and self._auto_fallback(lost, requests if attempted else 0) and attempted
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            attempted = True
            try:
                built = self.built
                if built is None:                            # (a failed re-bind re-binds back or fails)
                    raise Unavailable(f"the {self.model} engine has no placement bound")
                return call(built), rerun
            except Exception as e:  # noqa: BLE001 - a loss re-runs the call; anything else fails it only
                if self.binder.lost(self.placement) is not None:
                    continue
                fail = EngineFailure(f"the batch failed on {self.placement}: {type(e).__name__}: {e}")
                raise fail from e

    def _fail(self, e: BaseException) -> None:
        """The engine failed: ``error`` is set (every later request is refused) and every request left is
        finished with it."""
        msg = f"{type(e).__name__}: {e}"
        log.error("engine %s failed: %s", self.model, msg)
        with self._lock:
            self.error = msg
            self._lock.notify_all()
        self._fail_requests(msg)

    def _record(self, ev: dict) -> None:
        ev = dict(ev, model=self.model, t=self.clock())
        self.events.append(ev)
        for fn in self.on_event:
            try:
                fn(ev)
            except Exception:  # noqa: BLE001 - a listener must not break the engine
                log.exception("engine event listener failed")

    def _log_stats(self, stats: StepStats) -> None:
        """Hand one step's (or batch's) stats, its gauges filled, to every stat logger."""
        self._gauges(stats)
        for lg in self.stat_loggers:
            lg.record(self.model, stats)

    # ------------------------------------------------------------------ admission and counts
    @contextmanager
    def _admitting(self, n: int = 1) -> Iterator[None]:
        """Hold the lock while ``n`` new requests are queued (the ``with`` body queues them): refused first,
        all of them, by a failed or draining engine (:class:`Unavailable`) or a waiting queue that cannot
        take ``n`` more (:class:`QueueFull`); they count as unfinished once the body returns."""
        with self._lock:
            if self.error is not None:
                raise Unavailable(f"the {self.model} engine failed: {self.error}")
            if not self._accepting:
                raise Unavailable(f"the {self.model} engine is draining")
            waiting, limit, cap = self._queue_state()
            if waiting + n > limit:
                raise QueueFull(f"the {self.model} engine has {waiting} requests waiting (max_queued_requests="
                                f"{cap}{f', throttled to {limit}' if limit < cap else ''})")
            yield
            self._unfinished += n
            self._lock.notify_all()

    def _retired(self, n: int = 1) -> None:
        """``n`` requests finished (their last output handed out)."""
        with self._lock:
            self._unfinished -= n
            self._lock.notify_all()

    def _notify(self) -> None:
        """Wake whoever waits on the engine (``wait_until`` watchers see every step)."""
        with self._lock:
            self._lock.notify_all()

    @property
    def accepting(self) -> bool:
        return self._accepting and self.error is None

    def has_unfinished(self) -> bool:
        with self._lock:
            return self._unfinished > 0

    def wait_until(self, pred: Callable, timeout: float | None = None) -> bool:
        """Block until ``pred(watched)`` holds (``watched``: the engine, or what the subclass gives -- the
        generation engine's snapshot), checked at every request queued, step taken and request finished."""
        with self._lock:
            return self._lock.wait_for(lambda: pred(self._watched()), timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is left or the engine failed (True), or ``timeout`` passes (False)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._unfinished == 0 or self.error is not None, timeout)

    def drain(self, timeout: float | None = None) -> bool:
        """Stop taking requests; block until those in flight finish (False after ``timeout``)."""
        with self._lock:
            self._accepting = False
            self._lock.notify_all()             # wait_until watchers see it (e.g. ``not e.accepting``)
        return self.wait_idle(timeout)

    # ------------------------------------------------------------------ the engine thread
    def start(self) -> None:
        """Run the engine on its own thread whenever there is work (or a control request)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"vnpu-{self.thread_name}-{self.model}",
                                            daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._stopping or self._control
                                    or (self.error is None and self._has_work()))
                if self._stopping:
                    return
            if not self._run_controls():
                return
            if self.error is not None:
                continue
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - a defect fails the engine, never the thread silently
                if self.error is None:
                    log.exception("engine %s: a step failed unexpectedly", self.model)
                    self._fail(e)

    def _run_controls(self) -> bool:
        """Engine thread, at a step boundary: the control requests in arrival order (also those that come
        while a ``paused()`` holder holds the engine here).  False when the engine is stopping: no step may
        start after them (a holder let go by ``shutdown``)."""
        while True:
            with self._lock:
                if not self._control:
                    return not self._stopping
                c = self._control.popleft()
            if isinstance(c, _Pause):                    # held between two steps until the holder resumes
                c.held.set()
                c.resume.wait()
            elif self._stopping:
                c.future.set_exception(Unavailable(f"the {self.model} engine is shutting down"))
            else:
                self._run_rebind(c)

    def _hold(self, ready: Callable[[], bool], deadline: float) -> None:
        """Engine thread: wait until ``ready()`` (checked under the lock at every change) or the clock reaches
        ``deadline`` -- or, at once, a control request or a stop."""
        with self._lock:
            while not (self._stopping or self._control or ready()):
                left = deadline - self.clock()
                if left <= 0:
                    return
                self._lock.wait(left)

    @contextmanager
    def paused(self, timeout: float | None = None):
        """Hold the engine between two steps for the ``with`` block: nothing of it runs on its devices
        meanwhile (requests keep queuing; none is dropped), e.g. for a live defragmentation of those
        devices.  Blocks the caller until the engine thread reaches a step boundary (:class:`Unavailable`
        after ``timeout`` seconds); without an engine thread the caller is the one stepping: no wait."""
        c = _Pause(threading.Event(), threading.Event())
        with self._lock:
            if self._stopping:
                raise Unavailable(f"the {self.model} engine is shutting down")
            threaded = self._thread is not None and self.error is None     # a failed engine runs nothing
            if threaded:
                self._resumes.append(c.resume)
                self._control.append(c)
                self._lock.notify_all()
        try:
            if threaded and not c.held.wait(timeout):
                raise Unavailable(f"the {self.model} engine did not reach a step boundary within {timeout} s")
            yield self
        finally:
            c.resume.set()
            with self._lock:
                if c.resume in self._resumes:
                    self._resumes.remove(c.resume)

    def shutdown(self) -> None:
        """Stop taking requests, stop the engine thread (a ``paused()`` holder lets it go), finish what is
        left (aborted; a pending re-bind refused), then free every device resource of the placement."""
        with self._lock:
            self._accepting = False
            self._stopping = True
            for resume in self._resumes:
                resume.set()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            left, self._control = list(self._control), deque()
        for c in left:
            if isinstance(c, _Pause):
                c.held.set()
            else:
                c.future.set_exception(Unavailable(f"the {self.model} engine is shutting down"))
        self._abort_requests()
        try:
            self._close_built()
        finally:
            if self._own_binder:
                self.binder.close()

    def _close_built(self) -> None:
        """Free the placement's share: a failure to free is raised unless a device of it is lost (its memory
        went with it: nothing is left to free there, not a failed shutdown)."""
        built, self.built = self.built, None
        if built is None:
            return
        try:
            built.close()                        # every rank and device is tried, even when one fails
        except AclError as e:
            why = self.binder.lost(self.placement)
            if why is None:
                raise
            log.info("engine %s: %s; closed what was left (%s)", self.model, why, e)
