"""Requests as the engine sees them: per-request state (its sampling parameters: :mod:`.sampling`), and
what the engine hands back (:class:`RequestOutput`, made by :mod:`.output`) through a
:class:`RequestHandle`."""
from __future__ import annotations

import enum
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .sampling import SamplingParams, TokenLogprob


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass
class RequestOutput:
    """One increment of a request: new text (stop strings held back until they cannot start one), new
    token ids, their logprobs, and on the last one ``finish_reason`` (``stop``/``length``/``abort``/
    ``error``) and the usage counts.  ``prompt_computed``: the prompt tokens the engine has computed for
    this request so far (each once; 0 for a request aborted before it ran) -- with ``completion_tokens``
    what the request is charged, whether its client waited for the answer or not."""
    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    prompt_computed: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


_ids = itertools.count()


class Request:
    """Engine-side state of one request (owned by the engine thread once added)."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None,
                 priority: int = 0, arrival: float | None = None, cache_salt: str = ""):
        self.request_id = request_id or f"req-{next(_ids)}"
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.priority = priority
        self.arrival = time.monotonic() if arrival is None else arrival
        self.seq = next(_ids)                       #: tie-break of equal arrivals
        self.output_ids: list[int] = []
        self.num_computed = 0                       #: tokens whose keys/values are in the KV cache
        self.prompt_computed = 0                    #: prompt tokens ever computed (not reset by a preemption)
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.rng = params.generator()
        self.text = ""                              #: detokenized output (stop string cut off)
        self.sent = 0                               #: characters of ``text`` handed out
        self.num_preemptions = 0
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.scheduled_time: float | None = None
        self.cache_salt = cache_salt                #: prefix-cache namespace (a tenant's, or shared: "")
        self.cached_tokens = 0                      #: tokens found in the prefix cache at the last admission
        self.pending = 0                            #: its next token is being sampled by a step still on the device

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def __repr__(self) -> str:
        return (f"<Request {self.request_id} {self.status.value} prompt={len(self.prompt_ids)} "
                f"out={len(self.output_ids)} computed={self.num_computed}>")


class RequestHandle:
    """The caller's side of a request: outputs as the engine produces them.  ``on_output`` (if given)
    is called on the engine thread for every output (an async server hands them to its event loop);
    :meth:`result` and :meth:`outputs` block the calling thread."""

    def __init__(self, request_id: str, prompt_tokens: int,
                 on_output: Callable[[RequestOutput], None] | None = None):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self._on_output = on_output
        self._items: list[RequestOutput] = []
        self._cv = threading.Condition()

    def put(self, out: RequestOutput) -> None:
        with self._cv:
            self._items.append(out)
            self._cv.notify_all()
        if self._on_output is not None:
            self._on_output(out)

    @property
    def done(self) -> bool:
        with self._cv:
            return bool(self._items) and self._items[-1].finished

    def outputs(self, timeout: float | None = None):
        """Yield outputs as they come until the last one (TimeoutError if none comes in ``timeout``)."""
        i = 0
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: len(self._items) > i, timeout):
                    raise TimeoutError(f"request {self.request_id}: no output within {timeout} s")
                item = self._items[i]
            i += 1
            yield item
            if item.finished:
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until the request finishes; the outputs merged into one."""
        with self._cv:
            if not self._cv.wait_for(lambda: self._items and self._items[-1].finished, timeout):
                raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
            items = list(self._items)
        return merge_outputs(items)


def merge_outputs(items: list[RequestOutput]) -> RequestOutput:
    last = items[-1]
    return RequestOutput(last.request_id, "".join(o.text for o in items), [t for o in items for t in o.token_ids],
                         [lp for o in items for lp in o.logprobs], last.finish_reason, last.prompt_tokens,
                         last.completion_tokens, last.error, last.prompt_computed)
