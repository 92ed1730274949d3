"""Triton's statistics of one served model version (the statistics extension, ``GET /v2/models/{m}/stats``
and the ``nv_inference_*`` metrics), summed over every instance of the version and kept across reloads.

What counts, as Triton counts it:

- a request that got its outputs: ``success`` (its time from admission to its result), ``queue`` (from
  admission until its batch formed), ``compute_input`` / ``compute_infer`` / ``compute_output`` (its
  batch's: stacking and padding the inputs, the execution, slicing the outputs), ``inference_count`` +=
  its rows;
- a request that failed -- refused at admission (queue full, the model draining), timed out in the queue,
  or its batch failed -- ``fail`` (its time until then); a request its client cancelled before its batch
  ran counts nowhere (nobody waits for it);
- an execution: ``execution_count`` += 1 and, under its batch size (the rows of the requests it served,
  without the padding to the gear), one entry of ``batch_stats``.

Thread-safe (engine threads record, the event loop reads); host-only.
"""
from __future__ import annotations

import threading
import time

from ..v2.repository import BatchStats, Duration, ModelStats

NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return max(0, int(round(seconds * NS)))


class _Acc:
    """A Duration being summed: count and nanoseconds."""
    __slots__ = ("count", "ns")

    def __init__(self):
        self.count = self.ns = 0

    def add(self, seconds: float, n: int = 1) -> None:
        self.count += n
        self.ns += _ns(seconds) * n

    def record(self) -> Duration:
        return Duration(self.count, self.ns)


class VersionStats:
    """The statistics of model ``name`` version ``version`` (see the module)."""

    def __init__(self, name: str, version: str):
        self.name, self.version = name, version
        self._lock = threading.Lock()
        self._acc = {k: _Acc() for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                                         "compute_output")}
        self._batches: dict[int, tuple[_Acc, _Acc, _Acc]] = {}
        self.inference_count = 0
        self.execution_count = 0
        self._last_ms = 0

    def batch(self, rows: int, requests: list[tuple[float, float]], input_s: float, infer_s: float,
              output_s: float) -> None:
        """One execution of ``rows`` rows that answered ``requests``: (time queued, time from admission to
        the result) of each, in seconds."""
        n = len(requests)
        with self._lock:
            a = self._acc
            for queued, total in requests:
                a["queue"].add(queued)
                a["success"].add(total)
            for key, s in (("compute_input", input_s), ("compute_infer", infer_s), ("compute_output", output_s)):
                a[key].add(s, n)
            per = self._batches.setdefault(rows, (_Acc(), _Acc(), _Acc()))
            for acc, s in zip(per, (input_s, infer_s, output_s)):
                acc.add(s)
            self.inference_count += rows
            self.execution_count += 1
            self._last_ms = int(time.time() * 1000)

    def failed(self, seconds: float = 0.0, n: int = 1) -> None:
        """``n`` requests failed after ``seconds`` each."""
        with self._lock:
            self._acc["fail"].add(seconds, n)
            self._last_ms = int(time.time() * 1000)

    def record(self) -> ModelStats:
        """The statistics now, as the protocol layer's record."""
        with self._lock:
            a = {k: v.record() for k, v in self._acc.items()}
            batches = tuple(BatchStats(rows, *(x.record() for x in per)) for rows, per in sorted(self._batches.items()))
            return ModelStats(self.name, self.version, self._last_ms, self.inference_count, self.execution_count,
                              a["success"], a["fail"], a["queue"], a["compute_input"], a["compute_infer"],
                              a["compute_output"], batches)


__all__ = ["VersionStats"]
