"""A request-level job runner over a :class:`runtime.cluster.failover.DevicePool`.

Requests ``(id, inputs)`` go into one queue; a worker thread per logical device takes them, runs them on
the device its logical id is bound to *now*, and delivers the result.  When a request fails with a
device error (loss, HCCL error, HBM ECC, task failure ...) the failure is reported to the pool
(which re-binds the logical id if the device is gone or due for quarantine) and the request goes back
into the queue: it is replayed from its inputs, on whatever device takes it next.  After a re-binding the
workload is prepared again on the new device (its HBM is empty: weights are re-uploaded).

Results are delivered exactly once: the first completion of a request id is handed to the consumer
(``on_result(id, result)`` and :attr:`JobRunner.results`); a later one is never shown (counted in
``duplicates_suppressed``) -- but it IS recorded.  :attr:`JobRunner.history` (a :class:`History`) logs what
happened, as it happened: ``submit``, ``attempt`` (an execution begins on a device), ``attempt-failed``,
``complete`` (every execution that finished, with the sha256 of its result bytes, before any
de-duplication) and ``failed`` (gave up after ``max_attempts``); the consumer adds ``ack`` for each result
it receives (:meth:`History.record`).  The counts come from the independent checker of that log
(:mod:`runtime.cluster.history_check`), never from the runner's own bookkeeping: a request run twice, or
delivered twice, shows.
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from devices.errors import AclError

from . import history_check
from .failover import wait_polled

log = logging.getLogger("vnpu.jobrunner")


def checksum(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


class History:
    """An append-only, thread-safe log of request events (the format :mod:`runtime.cluster.history_check`
    checks).  ``clock`` gives the times (monotonic seconds by default)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._events: list[dict] = []
        self._lock = threading.Lock()

    def record(self, op: str, rid: int, **kw) -> dict:
        with self._lock:                       # the time is taken under the lock: events stay in time order
            ev = dict(op=op, id=rid, t=self._clock(), **kw)
            self._events.append(ev)
        return ev

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def __iter__(self):
        return iter(self.events())

    def __len__(self) -> int:
        return len(self._events)


# ---------------------------------------------------------------------------------------------- workloads
#: how long releasing a workload waits for the device's queued work before it leaves memory cached
RELEASE_WAIT_MS = 1000.0


class MlpWorkload:
    """A small self-contained 'embedding' model: ``rmsnorm(gelu(x @ W1) @ W2) * gamma`` per request,
    with built-in kernels (matmul, gelu, rmsnorm); :meth:`reference` is the numpy result."""
    name = "mlp"
    arena_bytes = 256 << 20          #: HBM per device a campaign gives it (weights + activations: a few MiB)

    def __init__(self, d: int = 256, hidden: int = 1024, batch: int = 32, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.d, self.h, self.b = d, hidden, batch
        self.w1 = (rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(np.float32)
        self.w2 = (rng.standard_normal((hidden, d)) / np.sqrt(hidden)).astype(np.float32)
        self.gamma = (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    def make_inputs(self, n: int, seed: int = 1) -> list:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal((self.b, self.d)).astype(np.float32) for _ in range(n)]

    def prepare(self, dev):
        st = {"dev": dev, "stream": dev.stream()}
        try:
            st["w1"] = dev.from_numpy(self.w1)
            st["w2"] = dev.from_numpy(self.w2)
            st["g"] = dev.from_numpy(self.gamma)
            st["x"] = dev.empty((self.b, self.d))
            st["h"] = dev.empty((self.b, self.h))
            st["y"] = dev.empty((self.b, self.d))
            st["o"] = dev.empty((self.b, self.d))
        except BaseException:
            self.release(st)
            raise
        return st

    def run(self, st, x: np.ndarray) -> np.ndarray:
        s = st["stream"]
        s.write(st["x"].ptr, np.ascontiguousarray(x, np.float32).tobytes())
        s.launch("matmul", [st["x"], st["w1"]], [st["h"]])
        s.launch("gelu", [st["h"]], [st["h"]], {"approximate": "tanh"})
        s.launch("matmul", [st["h"], st["w2"]], [st["y"]])
        s.launch("rmsnorm", [st["y"], st["g"]], [st["o"]])
        return st["o"].numpy(s)

    def release(self, st) -> None:
        for k in ("w1", "w2", "g", "x", "h", "y", "o"):
            t = st.get(k)
            if t is not None:
                with contextlib.suppress(Exception):
                    t.free()
        s = st.get("stream")
        if s is not None:
            with contextlib.suppress(Exception):
                s.destroy()
        dev = st.get("dev")
        if dev is not None:                     # the tensors went back to the caching pool: to the driver too
            with contextlib.suppress(Exception):
                dev.empty_cache(timeout_ms=RELEASE_WAIT_MS)   # a hung device keeps them (and its worker)

    def reference(self, x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float32) @ self.w1
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        y = h @ self.w2
        return y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-6) * self.gamma


class EmbedWorkload:
    """Sentence embeddings with ``runtime.models`` (a BERT encoder per device, data parallel)."""
    name = "embed"
    arena_bytes = 256 << 20          #: MiniLM-L6: ~90 MB of float32 weights + activations

    def __init__(self, model: str = "minilm-l6", batch: int = 8):
        from runtime.models.bert import bert_tokenizer, load_encoder
        self.model = model
        self.cfg, self.w = load_encoder(model)
        self.tok = bert_tokenizer(self.cfg.max_len)
        self.b = batch

    def make_inputs(self, n: int, seed: int = 1) -> list:
        import random
        rng = random.Random(seed)
        words = ("the quick brown fox jumps over a lazy dog while virtual devices fail and recover "
                 "every request completes exactly once on some healthy npu").split()
        out = []
        for _ in range(n):
            texts = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) for _ in range(self.b)]
            out.append(self.tok.encode_batch(texts))
        return out

    def prepare(self, dev):
        from runtime.models.bert import BertRank
        return BertRank(dev, self.cfg, self.w)

    def run(self, rank, inputs) -> np.ndarray:
        ids, mask = inputs
        rank.run(ids, mask)
        return rank.result().copy()

    def release(self, rank) -> None:
        with contextlib.suppress(Exception):
            rank.close()

    def reference(self, inputs):
        return None


class GenerateWorkload:
    """Greedy generation of a few tokens per request with runtime.models' SmolLM2 (each request on one
    device; replaying a request from its prompt gives the same tokens, so results are comparable with
    the fault-free run)."""
    name = "generate"
    arena_bytes = 1 << 30            #: SmolLM2-135M: ~540 MB of float32 weights + KV cache + activations

    def __init__(self, tokens: int = 4, max_len: int = 64):
        from runtime.models.llama import DECODER_MODELS
        from runtime.models.weights import load_gguf_cached
        load_gguf_cached(str(DECODER_MODELS["smollm2"]()))      # dequantise once per process
        self.tokens, self.max_len = tokens, max_len

    def make_inputs(self, n: int, seed: int = 1) -> list:
        import random
        rng = random.Random(seed)
        topics = ["robots", "rivers", "bread", "chess", "the moon", "trains", "gardens", "clocks", "music"]
        return [f"Say one sentence about {rng.choice(topics)} and {rng.choice(topics)}." for _ in range(n)]

    def prepare(self, dev):
        from runtime.models.llama import GenerateJob
        return GenerateJob(dev.rt, "smollm2", devices=[dev.index], parallel="none", max_len=self.max_len)

    def run(self, job, prompt) -> np.ndarray:
        g = job.generate([prompt], max_new_tokens=self.tokens, stop_at_eos=False)
        return np.asarray(g[0].token_ids, dtype=np.int64)

    def release(self, job) -> None:
        with contextlib.suppress(Exception):
            job.close()

    def reference(self, inputs):
        return None


#: workload name -> class (each declares the HBM per device it needs: ``arena_bytes``)
WORKLOADS = {"mlp": MlpWorkload, "embed": EmbedWorkload, "generate": GenerateWorkload}


def make_workload(name: str, **kw):
    """``mlp`` | ``embed`` (runtime.models' BERT encoder) | ``generate`` (runtime.models' SmolLM2); the
    model workloads fall back to ``mlp`` when their weights are missing."""
    if name == "mlp":
        return MlpWorkload(**kw)
    model = WORKLOADS.get(name)
    if model is None:
        raise ValueError(f"unknown workload {name!r} ({' | '.join(WORKLOADS)})")
    try:
        return model(**kw)
    except Exception as e:  # noqa: BLE001 - no model files in this environment
        log.warning("%s workload unavailable (%s): using the built-in MLP", name, e)
        return MlpWorkload()


# ---------------------------------------------------------------------------------------------- runner
@dataclass
class Request:
    id: int
    inputs: object
    attempts: int = 0
    submitted_t: float = 0.0
    failures: list = field(default_factory=list)     # (t, physical, code)


class JobRunner:
    """Requests over the logical devices of ``pool``; see the module doc."""

    def __init__(self, pool, workload, *, max_attempts: int = 50, on_result=None, history: History | None = None):
        """``on_result(id, result)`` is called once per delivered result (on a worker thread): the
        consumer.  Without one, results are acknowledged as they are stored in :attr:`results`."""
        self.pool = pool
        self.workload = workload
        self.max_attempts = max_attempts
        self.on_result = on_result
        self.history = history if history is not None else History()
        self.results: dict[int, np.ndarray] = {}
        self.errors: dict[int, str] = {}
        self.requests: dict[int, Request] = {}
        self.duplicates_suppressed = 0
        self._delivered: set[int] = set()
        self.attempt_failures = 0
        self._q: collections.deque[Request] = collections.deque()
        self._cv = threading.Condition()        # guards the queue, the requests and their outcomes
        self._stop = threading.Event()
        self._states: dict[int, tuple] = {}          # logical -> (binding, workload state)
        self._workers = [threading.Thread(target=self._work, args=(lid,), name=f"vnpu-job-{lid}", daemon=True)
                         for lid in pool.logical_ids()]
        for t in self._workers:
            t.start()

    # ------------------------------------------------------------------ client side
    def _log(self, op: str, rid: int, **kw) -> None:
        self.history.record(op, rid, **kw)

    def submit(self, rid: int, inputs, **meta) -> None:
        """Queue request ``rid``; ``meta`` (e.g. ``input=k``) goes into its ``submit`` event."""
        with self._cv:
            if rid in self.requests:
                raise ValueError(f"request id {rid} submitted twice")
            r = Request(rid, inputs, submitted_t=time.monotonic())
            self.requests[rid] = r
            self._log("submit", rid, **meta)
            self._q.append(r)
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self.requests) - len(self.results) - len(self.errors)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every submitted request has a result or a final error."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while len(self.results) + len(self.errors) < len(self.requests):
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(0.1 if left is None else min(left, 0.1))
            return True

    def wait_until(self, pred, timeout: float) -> bool:
        """Wait until ``pred(runner)`` holds (re-checked on every completion and every 50 ms)."""
        return wait_polled(self._cv, lambda: pred(self), timeout)

    # ------------------------------------------------------------------ workers
    def _take(self) -> Request | None:
        with self._cv:
            while not self._q and not self._stop.is_set():
                self._cv.wait(0.05)
            if self._stop.is_set():
                return None
            return self._q.popleft()

    def _state_for(self, lid: int, b):
        cur = self._states.get(lid)
        if cur is not None and cur[0].gen == b.gen:
            return cur[1]
        if cur is not None:
            self._states.pop(lid, None)
            self._release(cur)
        st = self.workload.prepare(b.device)
        self._states[lid] = (b, st)
        return st

    def _release(self, cur) -> None:
        b, st = cur
        lost = getattr(b.handle, "lost", None)
        if lost is not None and lost.is_set():
            return                                   # its HBM went with the device
        with contextlib.suppress(Exception):
            self.workload.release(st)

    def _work(self, lid: int) -> None:
        stale_gen = 0                 # a binding whose device failed: wait for the pool to move past it
        while not self._stop.is_set():
            req = self._take()
            if req is None:
                return
            b = self.pool.binding(lid, timeout=2.0, newer_than=stale_gen)
            if b is None:
                b = self.pool.binding(lid, timeout=0)      # not re-bound (e.g. a transient error): retry there
            if b is None:
                self._requeue(req, None, None, None)
                continue
            req.attempts += 1
            attempt = req.attempts
            self._log("attempt", req.id, logical=lid, physical=b.physical, attempt=attempt)
            try:
                st = self._state_for(lid, b)
                t_run = time.monotonic()
                out = self.workload.run(st, req.inputs)
                self.pool.report_latency(b, time.monotonic() - t_run)
            except AclError as e:
                cur = self._states.pop(lid, None)
                if cur is not None:
                    self._release(cur)
                self.pool.report_error(b, e)
                lost = getattr(b.handle, "lost", None)
                stale_gen = b.gen if (lost is not None and lost.is_set()) else 0
                self._requeue(req, b, e, attempt)
                continue
            except Exception as e:  # noqa: BLE001 - a bug in the workload: final error for this request
                log.exception("request %d failed", req.id)
                self._log("attempt-failed", req.id, physical=b.physical, attempt=attempt, code=0,
                          error=f"{type(e).__name__}: {e}"[:160])
                self._finish_error(req, f"{type(e).__name__}: {e}")
                continue
            stale_gen = 0
            self._deliver(req, b, out, attempt)

    def _requeue(self, req: Request, b, e, attempt: int | None) -> None:
        with self._cv:
            code = getattr(e, "code", 0)
            if attempt is not None:                   # an execution failed (not: no device to run it on)
                self.attempt_failures += 1
                req.failures.append((time.monotonic(), b.physical, code))
                self._log("attempt-failed", req.id, physical=b.physical, attempt=attempt, code=code,
                          error=str(e)[:160])
            if req.attempts >= self.max_attempts:
                self._finish_error_locked(req, f"gave up after {req.attempts} attempts: {e}")
                return
            self._q.appendleft(req)                   # replayed from its inputs, first in line
            self._cv.notify()

    def _finish_error(self, req: Request, msg: str) -> None:
        with self._cv:
            self._finish_error_locked(req, msg)

    def _finish_error_locked(self, req: Request, msg: str) -> None:
        if req.id in self._delivered or req.id in self.errors:
            return
        self.errors[req.id] = msg
        self._log("failed", req.id, error=msg[:200])
        self._cv.notify_all()

    def _deliver(self, req: Request, b, out: np.ndarray, attempt: int) -> None:
        digest = checksum(out)
        with self._cv:
            self._log("complete", req.id, physical=b.physical, cpu=b.is_cpu, attempt=attempt, digest=digest)
            if req.id in self._delivered:
                self.duplicates_suppressed += 1         # recorded above, never shown to the consumer
                return
            self._delivered.add(req.id)
        if self.on_result is not None:
            self.on_result(req.id, out)                 # the consumer records its own ack
        with self._cv:
            self.results[req.id] = out                  # wait() returns once the consumer has it
            if self.on_result is None:
                self._log("ack", req.id, digest=digest)
            self._cv.notify_all()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the workers and free what the workload holds on each device (HBM back to baseline)."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        for t in self._workers:
            t.join(timeout=30)
        for lid in list(self._states):
            self._release(self._states.pop(lid))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ accounting
    def check(self, reference: dict | None = None) -> dict:
        """The independent checker's verdict on this runner's history (:func:`runtime.cluster.history_check.check`)."""
        return history_check.check(self.history.events(), reference)

    def counts(self) -> dict:
        """Counts recomputed from the history by the independent checker (submitted, completed, failed,
        lost, duplicated, executions, attempt failures, deliveries ...), plus ``ok`` (no violation) and
        ``replays_suppressed`` (second completions the runner did not deliver)."""
        res = self.check()
        return dict(res["counts"], ok=res["ok"], violations=res["by_kind"],
                    replays_suppressed=self.duplicates_suppressed)


__all__ = ["JobRunner", "History", "MlpWorkload", "EmbedWorkload", "GenerateWorkload", "WORKLOADS", "make_workload",
           "checksum", "Request"]
