"""What the dynamic batcher queues: a :class:`Request` (its rows -- the size of its batch axis --, its
priority and its own timeout, and the engine's payload), admitted as a :class:`Queued` (its id, priority
level, arrival time and deadline on the batcher's clock), and the errors a request can get from the
batcher: refused at admission (:class:`~runtime.serve.engine.errors.InvalidRequest`,
:class:`~runtime.serve.engine.errors.QueueFull`) or timed out in the queue (:class:`RequestTimedOut`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from ..engine.errors import Unavailable


@dataclass(frozen=True)
class Request:
    """``rows``: the request's batch size (its tensors' first axis); ``priority``: Triton's request
    priority (0: the model's default level, 1: the highest); ``timeout_us``: Triton's per-request timeout
    in microseconds (0: none; used only where the level's policy allows overriding, and only to shorten);
    ``payload``: the engine's own object (tensors, a future), carried untouched; ``key``: requests share an
    execution only with requests of the same key (an image-size model's (height, width); None for others)."""
    rows: int
    priority: int = 0
    timeout_us: int = 0
    payload: object = field(default=None, compare=False, repr=False)
    key: Hashable = None


@dataclass(frozen=True, eq=False)
class Queued:
    """An admitted request: ``id`` (unique per batcher, in arrival order), ``level`` (its priority
    level), ``enqueued`` (the clock when admitted) and ``deadline`` (the clock at which it times out;
    None: never)."""
    id: int
    request: Request
    level: int
    enqueued: float
    deadline: float | None = None

    @property
    def rows(self) -> int:
        return self.request.rows

    @property
    def payload(self):
        return self.request.payload


class RequestTimedOut(Unavailable):
    """A request waited in the queue past its timeout under a REJECT policy (Triton: "Request timeout
    expired", UNAVAILABLE)."""

    @classmethod
    def of(cls, q: Queued) -> "RequestTimedOut":
        return cls(f"request timeout expired: request {q.id} waited in the queue of priority level {q.level} past "
                   "its timeout")


__all__ = ["Queued", "Request", "RequestTimedOut"]
