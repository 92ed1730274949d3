"""Dynamic batching of compiled-model requests (Triton's dynamic batcher, the seed's ``min_batch`` /
``max_batch`` / ``timeout_ms``, atc's batch gears) as a pure policy the engine thread drives:

    b = DynamicBatcher.for_model(config, version.gears)
    q = b.add(Request(rows=3, priority=0, timeout_us=0, payload=job), now)    # or InvalidRequest / QueueFull
    nxt = b.next_batch(now)          # Next(batch, wake_at): run nxt.batch, or wait until wake_at / an arrival
    for q in b.expire(now): fail q with RequestTimedOut.of(q)
    x = nxt.batch.stack([...]); outs = nxt.batch.split(y)   # padded to the gear; padding reaches nobody

- :mod:`.request`: :class:`Request`, :class:`Queued`, :class:`RequestTimedOut`;
- :mod:`.queues`: priority levels and queue policies (admission, timeouts, serving order);
- :mod:`.policy`: :class:`DynamicBatcher` (when a batch runs and which requests it takes);
- :mod:`.plan`: :class:`Batch` (rows, gear, padding, each request's slice).
"""
from .plan import Batch, Slice, gear_for
from .policy import DynamicBatcher, Next
from .queues import LevelQueues
from .request import Queued, Request, RequestTimedOut

__all__ = ["Batch", "DynamicBatcher", "LevelQueues", "Next", "Queued", "Request", "RequestTimedOut", "Slice",
           "gear_for"]
