"""A batch the dynamic batcher formed, as the engine runs it: the requests in row order, the rows each
occupies (:class:`Slice`), and the gear it executes at -- the smallest compiled batch size (atc's
``--dynamic_batch_size``) that holds its rows.  Rows past the last request's are padding: :meth:`Batch.stack`
fills them with zeros and :meth:`Batch.split` never hands them to a request.  Host-only."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from devices.errors import InvalidParamError

from .request import Queued


def gear_for(rows: int, gears: Sequence[int]) -> int:
    """The smallest of ``gears`` (ascending) that holds ``rows``; ``rows`` itself when there are no gears
    (a model that runs any batch size as it is).  InvalidParamError when none holds it."""
    if not gears:
        return rows
    i = bisect.bisect_left(gears, rows)
    if i == len(gears):
        raise InvalidParamError(f"{rows} rows exceed the largest batch gear {gears[-1]}")
    return gears[i]


@dataclass(frozen=True)
class Slice:
    """Rows ``start:stop`` of the batch are request ``queued``'s, in its own order."""
    queued: Queued
    start: int
    stop: int


@dataclass(frozen=True)
class Batch:
    """``slices`` in row order from row 0, contiguous; ``gear`` >= the rows; ``formed``: the clock when
    it left the queue (a request's queue time is ``formed - queued.enqueued``)."""
    slices: tuple[Slice, ...]
    gear: int
    formed: float

    @classmethod
    def of(cls, requests: Sequence[Queued], gears: Sequence[int], formed: float) -> "Batch":
        out, at = [], 0
        for q in requests:
            out.append(Slice(q, at, at + q.rows))
            at += q.rows
        return cls(tuple(out), gear_for(at, gears), formed)

    @property
    def requests(self) -> tuple[Queued, ...]:
        return tuple(s.queued for s in self.slices)

    @property
    def key(self):
        """The requests' common key (an image-size model's (height, width); None for others)."""
        return self.slices[0].queued.request.key if self.slices else None

    @property
    def rows(self) -> int:
        return self.slices[-1].stop if self.slices else 0

    @property
    def pad(self) -> int:
        """Padding rows (``rows:gear``), which belong to no request."""
        return self.gear - self.rows

    def stack(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """One input of the batch: ``parts[i]`` (request i's tensor, its rows first) stacked in row order and
        zero-padded to the gear."""
        if len(parts) != len(self.slices):
            raise InvalidParamError(f"{len(parts)} tensors for a batch of {len(self.slices)} requests")
        for s, p in zip(self.slices, parts):
            if len(p) != s.stop - s.start:
                raise InvalidParamError(f"request {s.queued.id}: {len(p)} rows, its slice has {s.stop - s.start}")
        body = np.concatenate(parts, axis=0)
        if not self.pad:
            return body
        return np.concatenate([body, np.zeros((self.pad,) + body.shape[1:], body.dtype)], axis=0)

    def split(self, output) -> list:
        """One output of the batch (``gear`` rows first) cut into each request's rows, in request order (views,
        no copy); the padding rows go to nobody."""
        if len(output) != self.gear:
            raise InvalidParamError(f"an output of {len(output)} rows for a batch executed at gear {self.gear}")
        return [output[s.start:s.stop] for s in self.slices]


__all__ = ["Batch", "Slice", "gear_for"]
